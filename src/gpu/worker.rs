//! The worker process (`tensortune cuda-worker`) and the supervisor that starts and watches
//! it; see the parent module's doc.
//!
//! # Test hooks
//!
//! The worker reads two variables so that tests can make it fail the ways a GPU worker
//! fails, without a GPU; nothing else should set them:
//! - `TENSORTUNE_GPU_WORKER_FAULT=KIND[:N]` makes the worker's `N`-th run request (counted
//!   from 1 in each worker process; 1 if not given) fail as `KIND`: `abort` (the process
//!   aborts: a crash signal), `exit` (exits with status 3 without replying), `hang` (never
//!   replies), `garbage` (writes bytes that are not a frame, then carries on).
//! - `TENSORTUNE_GPU_WORKER_FAULT_ONCE=PATH`: the fault fires only in the worker that creates
//!   `PATH` (which must not exist yet), so that the worker restarted after it runs normally.
//!
//! A malformed fault variable ends the worker at its start with status 2.

use super::driver::Device;
use super::wire::{self, BufMeta, ErrorKind, Frame, FrameError, Reply, Request, WireDesc};
use super::{check_inputs, check_outputs, DeviceInfo, GpuProgram, GpuRunError, GpuRunResult};
use super::{sim, RunOptions};
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tensortune_schedules::data::NdData;

/// The variable naming the `tensortune` binary to run as the worker.
pub const WORKER_ENV: &str = "TENSORTUNE_CUDA_WORKER";

/// The fault-injection test hook (see the module doc).
pub const FAULT_ENV: &str = "TENSORTUNE_GPU_WORKER_FAULT";

/// The fire-once file of the fault-injection test hook (see the module doc).
pub const FAULT_ONCE_ENV: &str = "TENSORTUNE_GPU_WORKER_FAULT_ONCE";

/// A failure the worker reports in a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WorkerError {
    pub kind: ErrorKind,
    pub message: String,
    /// The device is unusable: the worker exits after replying.
    pub sticky: bool,
}

impl WorkerError {
    pub(crate) fn unavailable(message: String) -> WorkerError {
        WorkerError {
            kind: ErrorKind::Unavailable,
            message,
            sticky: false,
        }
    }

    fn invalid(message: String) -> WorkerError {
        WorkerError {
            kind: ErrorKind::Invalid,
            message,
            sticky: false,
        }
    }
}

/// How a fault-injected worker fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    Abort,
    Exit,
    Hang,
    Garbage,
}

/// The test hook's plan: which run fails how, and the fire-once file.
struct FaultPlan {
    kind: FaultKind,
    run: u64,
    once: Option<PathBuf>,
}

impl FaultPlan {
    fn from_env() -> Result<Option<FaultPlan>, String> {
        let Some(v) = std::env::var_os(FAULT_ENV) else {
            return Ok(None);
        };
        let v = v
            .into_string()
            .map_err(|_| format!("{FAULT_ENV} is not UTF-8"))?;
        let (kind, run) = match v.split_once(':') {
            Some((k, n)) => (
                k,
                n.parse::<u64>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("{FAULT_ENV}: `{n}` is not a run number (1, 2, ...)"))?,
            ),
            None => (v.as_str(), 1),
        };
        let kind = match kind {
            "abort" => FaultKind::Abort,
            "exit" => FaultKind::Exit,
            "hang" => FaultKind::Hang,
            "garbage" => FaultKind::Garbage,
            other => {
                return Err(format!(
                    "{FAULT_ENV}: unknown fault `{other}` (abort, exit, hang, garbage)"
                ))
            }
        };
        Ok(Some(FaultPlan {
            kind,
            run,
            once: std::env::var_os(FAULT_ONCE_ENV).map(PathBuf::from),
        }))
    }

    /// The fault for run `n`, if it fires there.
    fn fires(&self, n: u64) -> Option<FaultKind> {
        if n != self.run {
            return None;
        }
        match &self.once {
            // Creating the file is the claim: exactly one worker succeeds.
            Some(p) => std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .ok()
                .map(|_| self.kind),
            None => Some(self.kind),
        }
    }
}

/// The worker's device: the real one, opened at the first request that needs it, or the
/// simulated one.
enum WorkerDevice {
    Sim,
    Real {
        ordinal: u32,
        device: Option<Device>,
    },
}

impl WorkerDevice {
    fn hello(&mut self) -> Reply {
        match self {
            WorkerDevice::Sim => Reply::Hello {
                name: "simulated".into(),
                desc: WireDesc::from(&sim::sim_desc()),
                simulated: true,
            },
            WorkerDevice::Real { ordinal, .. } => {
                let info = super::driver::device_desc(*ordinal)
                    .and_then(|d| Ok((d, super::driver::device_name(*ordinal)?)));
                match info {
                    Ok((desc, name)) => Reply::Hello {
                        name,
                        desc: WireDesc::from(&desc),
                        simulated: false,
                    },
                    Err(e) => error_reply(&WorkerError::unavailable(e.to_string())),
                }
            }
        }
    }

    fn run(
        &mut self,
        program: &GpuProgram,
        inputs: &[NdData],
        opts: &RunOptions,
    ) -> Result<GpuRunResult, WorkerError> {
        check_inputs(program, inputs).map_err(WorkerError::invalid)?;
        match self {
            WorkerDevice::Sim => sim::run(program, inputs),
            WorkerDevice::Real { ordinal, device } => {
                if device.is_none() {
                    *device = Some(
                        Device::open(*ordinal)
                            .map_err(|e| WorkerError::unavailable(e.to_string()))?,
                    );
                }
                match device {
                    Some(d) => d.run(program, inputs, opts),
                    None => Err(WorkerError::unavailable("no device".into())),
                }
            }
        }
    }
}

fn error_reply(e: &WorkerError) -> Reply {
    Reply::Error {
        kind: e.kind,
        message: tensortune_schedules::text::single_line(&e.message).into_owned(),
        sticky: e.sticky,
    }
}

/// The replies' stream: the process's original stdout, which fd 1 no longer is (see
/// [`reply_stream`]).
fn reply_stream() -> io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup of the process's stdout, a descriptor it owns.
    let fd = unsafe { libc::dup(1) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // Anything else that prints to stdout (a library, a stray debug line) would corrupt the
    // frames, so fd 1 becomes stderr and only the replies use the duplicate.
    // SAFETY: dup2 between descriptors this process owns.
    if unsafe { libc::dup2(2, 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor from dup, owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// The worker: answers requests on stdin with replies on stdout until stdin ends. Runs the
/// simulated device if `simulate`, else CUDA device `ordinal`. Exits 0 at the end of its
/// input, 2 on a broken stream or a malformed fault variable, 3 after a sticky device error
/// (reported first) or an injected `exit` fault.
pub fn worker_main(simulate: bool, ordinal: u32) -> ExitCode {
    let plan = match FaultPlan::from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tensortune cuda-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = match reply_stream() {
        Ok(f) => io::BufWriter::new(f),
        Err(e) => {
            eprintln!("tensortune cuda-worker: cannot set up the reply stream: {e}");
            return ExitCode::from(2);
        }
    };
    let mut input = io::stdin().lock();
    let mut device = if simulate {
        WorkerDevice::Sim
    } else {
        WorkerDevice::Real {
            ordinal,
            device: None,
        }
    };
    let mut runs = 0u64;
    loop {
        let frame = match wire::read_frame(&mut input) {
            Ok(Some(f)) => f,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tensortune cuda-worker: bad request stream: {e}");
                return ExitCode::from(2);
            }
        };
        let (reply, outputs, sticky) = match serde_json::from_slice::<Request>(&frame.header) {
            Err(e) => (
                error_reply(&WorkerError::invalid(format!("not a request: {e}"))),
                Vec::new(),
                false,
            ),
            Ok(Request::Hello) => (device.hello(), Vec::new(), false),
            Ok(Request::Run {
                program,
                opts,
                inputs,
            }) => {
                runs += 1;
                if let Some(f) = plan.as_ref().and_then(|p| p.fires(runs)) {
                    inject(f, &mut out);
                }
                let r = wire::split(&frame.payload, &inputs)
                    .map_err(WorkerError::invalid)
                    .and_then(|inputs| device.run(&program, &inputs, &opts));
                match r {
                    Ok(res) => (
                        Reply::Ran {
                            outputs: res.outputs.iter().map(wire::meta).collect(),
                            times_s: res.times_s,
                            registers: res.registers,
                            shared_bytes: res.shared_bytes,
                            local_bytes: res.local_bytes,
                        },
                        res.outputs,
                        false,
                    ),
                    Err(e) => (error_reply(&e), Vec::new(), e.sticky),
                }
            }
        };
        let refs: Vec<&NdData> = outputs.iter().collect();
        let frame = match wire::encode(&reply, &refs) {
            Ok(f) => f,
            Err(e) => match wire::encode(
                &error_reply(&WorkerError {
                    kind: ErrorKind::Device,
                    message: e,
                    sticky: false,
                }),
                &[],
            ) {
                Ok(f) => f,
                Err(_) => return ExitCode::from(2),
            },
        };
        if wire::write_frame(&mut out, &frame).is_err() {
            // The supervisor is gone.
            return ExitCode::from(2);
        }
        if sticky {
            return ExitCode::from(3);
        }
    }
}

/// Fails as the test hook asks (see the module doc); returns only for `garbage`.
fn inject(kind: FaultKind, out: &mut impl Write) {
    match kind {
        FaultKind::Abort => std::process::abort(),
        FaultKind::Exit => std::process::exit(3),
        FaultKind::Hang => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        FaultKind::Garbage => {
            let _ = out.write_all(b"this is not a frame\n\x00\x01\x02");
            let _ = out.flush();
        }
    }
}

/// How to start a worker: the `tensortune` binary, the device, and extra environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerCommand {
    program: PathBuf,
    simulate: bool,
    ordinal: u32,
    env: Vec<(OsString, OsString)>,
}

impl WorkerCommand {
    /// Runs `program` (a `tensortune` binary) as `program cuda-worker`, on device 0.
    pub fn new(program: impl Into<PathBuf>) -> WorkerCommand {
        WorkerCommand {
            program: program.into(),
            simulate: false,
            ordinal: 0,
            env: Vec::new(),
        }
    }

    /// The default worker binary: `$TENSORTUNE_CUDA_WORKER` if set, else this process's
    /// executable if it is `tensortune`, else a `tensortune` next to it; an error naming the
    /// variable if none is found (a library user's own binary is not a worker).
    pub fn resolve() -> Result<WorkerCommand, GpuRunError> {
        if let Some(p) = std::env::var_os(WORKER_ENV).filter(|p| !p.is_empty()) {
            return Ok(WorkerCommand::new(p));
        }
        let exe = std::env::current_exe().map_err(|e| {
            GpuRunError::Unavailable(format!(
                "cannot find the worker binary ({e}); set {WORKER_ENV} to a tensortune binary"
            ))
        })?;
        if exe.file_stem().is_some_and(|s| s == "tensortune") {
            return Ok(WorkerCommand::new(exe));
        }
        let sibling = exe.with_file_name(format!("tensortune{}", std::env::consts::EXE_SUFFIX));
        if sibling.is_file() {
            return Ok(WorkerCommand::new(sibling));
        }
        Err(GpuRunError::Unavailable(format!(
            "no tensortune binary to run the GPU worker ({} is not one and has none beside \
             it); set {WORKER_ENV} to a tensortune binary",
            exe.display()
        )))
    }

    /// Runs the simulated device (`--simulate`) instead of a GPU.
    pub fn simulate(mut self, on: bool) -> WorkerCommand {
        self.simulate = on;
        self
    }

    /// Runs on CUDA device `ordinal` (`--device`).
    pub fn device(mut self, ordinal: u32) -> WorkerCommand {
        self.ordinal = ordinal;
        self
    }

    /// Sets a variable in the worker's environment (the test hooks of the module doc).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> WorkerCommand {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The binary run.
    pub fn program(&self) -> &Path {
        &self.program
    }

    fn spawn(&self) -> io::Result<Child> {
        let mut c = Command::new(&self.program);
        c.arg("cuda-worker");
        if self.simulate {
            c.arg("--simulate");
        }
        c.arg("--device").arg(self.ordinal.to_string());
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
    }
}

/// What the reader thread hands over: a frame, or why the stream broke.
type Incoming = Result<Frame, String>;

/// A running worker: the child, a writer thread feeding its stdin and a reader thread
/// reading its stdout, so that the supervisor can wait for a reply with a timeout.
struct Worker {
    child: Child,
    to_worker: Option<mpsc::Sender<Vec<u8>>>,
    from_worker: mpsc::Receiver<Incoming>,
}

/// Blocks SIGPIPE on the calling thread: a write to a dead worker's stdin then fails with
/// EPIPE instead of killing the process (the `tensortune` binary restores SIGPIPE's default
/// action). The signal is thread-directed, so blocking it here leaves other threads alone.
fn block_sigpipe() {
    // SAFETY: a sigset on the stack, initialized by sigemptyset before use; pthread_sigmask
    // changes only this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

impl Worker {
    fn start(cmd: &WorkerCommand) -> Result<Worker, GpuRunError> {
        let mut child = cmd.spawn().map_err(|e| {
            GpuRunError::Unavailable(format!(
                "cannot start the GPU worker {}: {e}",
                cmd.program.display()
            ))
        })?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(GpuRunError::Unavailable(
                    "the GPU worker has no pipes".into(),
                ));
            }
        };
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let spawn_writer = std::thread::Builder::new()
            .name("gpu-worker-writer".into())
            .spawn(move || {
                block_sigpipe();
                let mut stdin: ChildStdin = stdin;
                for frame in rx {
                    if wire::write_frame(&mut stdin, &frame).is_err() {
                        break;
                    }
                }
            });
        let (in_tx, in_rx) = mpsc::channel::<Incoming>();
        let spawn_reader = std::thread::Builder::new()
            .name("gpu-worker-reader".into())
            .spawn(move || {
                let mut r = io::BufReader::new(stdout);
                loop {
                    match wire::read_frame(&mut r) {
                        Ok(Some(f)) => {
                            if in_tx.send(Ok(f)).is_err() {
                                break;
                            }
                        }
                        // The end of the stream, or its end inside a frame: the worker died
                        // (dropping the sender says so).
                        Ok(None) | Err(FrameError::Truncated) => break,
                        Err(e) => {
                            let _ = in_tx.send(Err(e.to_string()));
                            break;
                        }
                    }
                }
            });
        if let Err(e) = spawn_writer.and(spawn_reader) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(GpuRunError::Unavailable(format!(
                "cannot start the GPU worker's threads: {e}"
            )));
        }
        Ok(Worker {
            child,
            to_worker: Some(tx),
            from_worker: in_rx,
        })
    }

    /// Sends a frame and waits at most `timeout` for the reply frame.
    fn request(&mut self, frame: Vec<u8>, timeout: Duration) -> Result<Frame, Lost> {
        let sent = self
            .to_worker
            .as_ref()
            .is_some_and(|tx| tx.send(frame).is_ok());
        if !sent {
            return Err(Lost::Died);
        }
        match self.from_worker.recv_timeout(timeout) {
            Ok(Ok(f)) => Ok(f),
            Ok(Err(m)) => Err(Lost::Garbled(m)),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(Lost::Timeout),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(Lost::Died),
        }
    }

    /// Kills the worker (if still running) and reaps it.
    fn kill(mut self) -> Option<ExitStatus> {
        self.to_worker = None;
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// Reaps a worker whose stdout ended: it is exiting, so it is given a moment before
    /// being killed.
    fn reap(mut self) -> Option<ExitStatus> {
        self.to_worker = None;
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => break,
            }
        }
        self.kill()
    }

    /// Ends a healthy worker: its stdin closes, so it exits; killed if it does not.
    fn close(self) {
        let _ = self.reap();
    }
}

/// How a request lost its worker.
enum Lost {
    Died,
    Timeout,
    Garbled(String),
}

/// How a worker ended, in words.
fn describe_exit(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "its exit status is unknown".into(),
        Some(s) => match (s.signal(), s.code()) {
            (Some(sig), _) => format!("killed by signal {sig} ({})", signal_name(sig)),
            (None, Some(c)) => format!("exited with status {c}"),
            (None, None) => format!("ended ({s})"),
        },
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        _ => "a signal",
    }
}

/// The parent's side: starts a worker when a request needs one, sends it one request at a
/// time, and replaces it when it dies, hangs or garbles its reply.
///
/// Not `Sync`: one request at a time per worker (a device runs one timed kernel at a time
/// anyway). Dropping it ends the worker.
pub struct GpuSupervisor {
    cmd: WorkerCommand,
    worker: Option<Worker>,
    info: Option<DeviceInfo>,
    start_timeout: Duration,
    started: u32,
}

impl GpuSupervisor {
    /// A supervisor of workers started as `cmd`; none is started until the first request.
    pub fn new(cmd: WorkerCommand) -> GpuSupervisor {
        GpuSupervisor {
            cmd,
            worker: None,
            info: None,
            start_timeout: Duration::from_secs(60),
            started: 0,
        }
    }

    /// How long a fresh worker may take to describe its device (creating a CUDA context
    /// takes a few seconds on some machines); 60 s unless set.
    pub fn with_start_timeout(mut self, timeout: Duration) -> GpuSupervisor {
        self.start_timeout = timeout;
        self
    }

    /// Workers started so far (the first, and one per restart).
    pub fn workers_started(&self) -> u32 {
        self.started
    }

    /// The worker's device, starting a worker if none runs.
    pub fn device_info(&mut self) -> Result<DeviceInfo, GpuRunError> {
        self.ensure_worker()?;
        self.info
            .clone()
            .ok_or_else(|| GpuRunError::Unavailable("no device description".into()))
    }

    /// A running worker, started (and asked for its device) if none runs.
    fn ensure_worker(&mut self) -> Result<&mut Worker, GpuRunError> {
        if self.worker.is_none() {
            let mut w = Worker::start(&self.cmd)?;
            self.started += 1;
            let frame = wire::encode(&Request::Hello, &[]).map_err(GpuRunError::Protocol)?;
            let reply = match w.request(frame, self.start_timeout) {
                Ok(f) => f,
                Err(lost) => return Err(Self::lost(w, lost, self.start_timeout)),
            };
            match serde_json::from_slice::<Reply>(&reply.header) {
                Ok(Reply::Hello {
                    name,
                    desc,
                    simulated,
                }) => {
                    self.info = Some(DeviceInfo {
                        name,
                        desc: desc.into(),
                        simulated,
                    });
                }
                Ok(Reply::Error { kind, message, .. }) => {
                    w.close();
                    return Err(to_error(kind, message));
                }
                Ok(Reply::Ran { .. }) => {
                    w.kill();
                    return Err(GpuRunError::Protocol(
                        "the worker answered its greeting with a result".into(),
                    ));
                }
                Err(e) => {
                    w.kill();
                    return Err(GpuRunError::Protocol(format!("not a reply: {e}")));
                }
            }
            self.worker = Some(w);
        }
        self.worker
            .as_mut()
            .ok_or_else(|| GpuRunError::Unavailable("no worker".into()))
    }

    /// The error of a request whose worker was lost, the worker killed or reaped.
    fn lost(w: Worker, lost: Lost, timeout: Duration) -> GpuRunError {
        match lost {
            Lost::Died => GpuRunError::Fault(describe_exit(w.reap())),
            Lost::Timeout => {
                w.kill();
                GpuRunError::Timeout(timeout)
            }
            Lost::Garbled(m) => {
                w.kill();
                GpuRunError::Protocol(m)
            }
        }
    }

    /// Runs `program` on `inputs` (data for its input parameters, in order): the outputs of
    /// its first launch and the times of the timed ones. A worker that dies, hangs past
    /// `opts.timeout` or garbles its reply is gone after this returns the error; the next
    /// call starts a fresh one.
    pub fn run(
        &mut self,
        program: &GpuProgram,
        inputs: &[NdData],
        opts: &RunOptions,
    ) -> Result<GpuRunResult, GpuRunError> {
        check_inputs(program, inputs).map_err(GpuRunError::Invalid)?;
        let metas: Vec<BufMeta> = inputs.iter().map(wire::meta).collect();
        let refs: Vec<&NdData> = inputs.iter().collect();
        let frame = wire::encode(
            &Request::Run {
                program: Box::new(program.clone()),
                opts: opts.clone(),
                inputs: metas,
            },
            &refs,
        )
        .map_err(GpuRunError::Invalid)?;
        let timeout = opts.timeout;
        let reply = {
            let w = self.ensure_worker()?;
            w.request(frame, timeout)
        };
        let reply = match reply {
            Ok(f) => f,
            Err(lost) => {
                let w = self.worker.take();
                return Err(match w {
                    Some(w) => Self::lost(w, lost, timeout),
                    None => GpuRunError::Fault("the worker is gone".into()),
                });
            }
        };
        let parsed = serde_json::from_slice::<Reply>(&reply.header);
        match parsed {
            Ok(Reply::Ran {
                outputs,
                times_s,
                registers,
                shared_bytes,
                local_bytes,
            }) => {
                let outs = wire::split(&reply.payload, &outputs)
                    .and_then(|o| check_outputs(program, &o).map(|()| o));
                match outs {
                    Ok(outputs) => Ok(GpuRunResult {
                        outputs,
                        times_s,
                        registers,
                        shared_bytes,
                        local_bytes,
                    }),
                    Err(m) => {
                        self.discard();
                        Err(GpuRunError::Protocol(format!("a bad result: {m}")))
                    }
                }
            }
            Ok(Reply::Error {
                kind,
                message,
                sticky,
            }) => {
                if sticky {
                    // The worker exits after a sticky error; reap it.
                    if let Some(w) = self.worker.take() {
                        let _ = w.reap();
                    }
                }
                Err(to_error(kind, message))
            }
            Ok(Reply::Hello { .. }) => {
                self.discard();
                Err(GpuRunError::Protocol(
                    "the worker answered a run with a greeting".into(),
                ))
            }
            Err(e) => {
                self.discard();
                Err(GpuRunError::Protocol(format!("not a reply: {e}")))
            }
        }
    }

    /// Kills the worker (its stream can no longer be trusted); the next request starts one.
    fn discard(&mut self) {
        if let Some(w) = self.worker.take() {
            w.kill();
        }
    }

    /// Ends the worker, if one runs.
    pub fn shutdown(&mut self) {
        if let Some(w) = self.worker.take() {
            w.close();
        }
    }
}

impl Drop for GpuSupervisor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The supervisor's error for a worker's reported failure.
fn to_error(kind: ErrorKind, message: String) -> GpuRunError {
    match kind {
        ErrorKind::Unavailable => GpuRunError::Unavailable(message),
        ErrorKind::Invalid => GpuRunError::Invalid(message),
        ErrorKind::Load => GpuRunError::Load(message),
        ErrorKind::Launch => GpuRunError::Launch(message),
        ErrorKind::Kernel => GpuRunError::Kernel(message),
        ErrorKind::Simulation => GpuRunError::Simulation(message),
        ErrorKind::Device => GpuRunError::Device(message),
    }
}
