//! Measurement on an NVIDIA GPU: a worker process that owns the CUDA context, and the
//! supervisor that talks to it.
//!
//! A kernel that faults on a GPU poisons its CUDA context (every later call in the process
//! fails), and a kernel that never ends cannot be stopped from the host thread that launched
//! it. So, like the CPU measurer's forked children (`measure::isolate`), programs run in
//! another process: a worker (`tensortune cuda-worker`, [`worker::worker_main`]) started and
//! watched by a [`worker::GpuSupervisor`]. The supervisor sends one request at a time over the
//! worker's stdin and reads the reply from its stdout, as length-prefixed frames (a JSON
//! header, then tensor data as raw little-endian bytes); a worker that dies or
//! stops answering is reaped or killed, the request fails with a typed [`GpuRunError`], and
//! the next request starts a fresh worker.
//!
//! The worker runs a [`GpuProgram`] (PTX text, its entry, the launch and the parameters) on
//! the device ([`driver`]), or, started with `--simulate`, rebuilds the program from its
//! workload and trace ([`SimProgram`]) and runs it in the loop-IR lockstep interpreter
//! ([`sim`]): the protocol, the checks and the restarts are then testable on a machine
//! without a GPU.
//!
//! Without the `cuda` feature everything here but the real device is built: a worker asked
//! for the device answers [`GpuRunError::Unavailable`].

pub mod device;
pub mod driver;
pub mod sim;
mod wire;
pub mod worker;

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tensortune_schedules::data::NdData;
use tensortune_schedules::gpu::{launch_dims, LaunchError};
use tensortune_schedules::ir::{BufKind, LoweredFunc};
use tensortune_schedules::target::CudaDesc;
use tensortune_schedules::DType;
use tensortune_tuner::measure::{MeasureError, MeasureErrorKind};

pub use sim::SimProgram;
pub use worker::{worker_main, GpuSupervisor, WorkerCommand};

/// One kernel parameter: a global-memory buffer of `shape` elements of `dtype`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamSpec {
    /// The buffer's name (what errors name).
    pub name: String,
    /// Row-major extents; the buffer holds their product of elements.
    pub shape: Vec<i64>,
    /// Element type: f32, f64 or i32.
    pub dtype: DType,
    /// An output (filled by the kernel and returned) rather than an input (uploaded).
    pub output: bool,
}

impl ParamSpec {
    /// Elements of the buffer; `None` for a negative extent or an overflowing product.
    pub fn elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| {
            usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
        })
    }
}

/// A program for the worker: PTX, the kernel to launch and how, and its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuProgram {
    /// PTX assembly text (from [`crate::codegen::nvptx::emit_ptx`]).
    pub ptx: String,
    /// The kernel's name in the PTX.
    pub entry: String,
    /// Blocks along x, y, z.
    pub grid: [u32; 3],
    /// Threads of a block along x, y, z.
    pub block: [u32; 3],
    /// The kernel's parameters in order: one global pointer each, as the PTX generator
    /// declares them (inputs in the op's order, then outputs).
    pub params: Vec<ParamSpec>,
    /// The program as a workload and a trace, for the simulated device; a real device
    /// ignores it.
    pub sim: Option<SimProgram>,
}

/// Why a [`GpuProgram`] could not be made from a lowered function.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuProgramError {
    /// The function has no valid launch.
    #[error("no valid launch: {0}")]
    Launch(#[from] LaunchError),
    /// A parameter names a buffer the function does not declare (a bug in lowering).
    #[error("parameter {0} names no buffer of the function")]
    BadParam(u32),
    /// A parameter is a temporary, not an input or output (a bug in lowering).
    #[error("parameter `{0}` is neither an input nor an output")]
    NotParam(String),
}

impl GpuProgram {
    /// The program of `func` compiled to `ptx`: the launch of [`launch_dims`], and one
    /// parameter per buffer of `func.params` in order, which is how
    /// [`crate::codegen::nvptx::emit_ptx`] declares the kernel's parameters. No simulation
    /// form; add one with [`GpuProgram::with_sim`].
    pub fn from_lowered(func: &LoweredFunc, ptx: String) -> Result<GpuProgram, GpuProgramError> {
        let dims = launch_dims(func)?;
        let params = func
            .params
            .iter()
            .map(|id| {
                let decl = func
                    .buffers
                    .get(id.0 as usize)
                    .ok_or(GpuProgramError::BadParam(id.0))?;
                let output = match decl.kind {
                    BufKind::Input(_) => false,
                    BufKind::Output(_) => true,
                    BufKind::Temp => return Err(GpuProgramError::NotParam(decl.name.clone())),
                };
                Ok(ParamSpec {
                    name: decl.name.clone(),
                    shape: decl.shape.clone(),
                    dtype: decl.dtype,
                    output,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GpuProgram {
            ptx,
            entry: func.name.clone(),
            grid: dims.grid,
            block: dims.block,
            params,
            sim: None,
        })
    }

    /// The same program with the simulated device's form of it.
    pub fn with_sim(mut self, sim: SimProgram) -> GpuProgram {
        self.sim = Some(sim);
        self
    }

    /// The input parameters, in order: what [`GpuSupervisor::run`] takes data for.
    pub fn inputs(&self) -> impl Iterator<Item = &ParamSpec> {
        self.params.iter().filter(|p| !p.output)
    }

    /// The output parameters, in order: what [`GpuRunResult::outputs`] holds.
    pub fn outputs(&self) -> impl Iterator<Item = &ParamSpec> {
        self.params.iter().filter(|p| p.output)
    }
}

/// How a program is run and timed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    /// Timed launches at least (after the checked first run).
    pub repeat: u32,
    /// More timed launches, up to [`RunOptions::max_samples`], until they add up to this
    /// many milliseconds: a kernel of microseconds is timed often enough that its median is
    /// stable.
    pub min_repeat_ms: f64,
    /// The most timed launches, whatever `min_repeat_ms` asks.
    pub max_samples: u32,
    /// Before each timed launch, write a device buffer of this many bytes (0: none), larger
    /// than the L2 cache, so that every launch starts with its inputs out of the L2 as the
    /// first launch in a real program would. Ignored by the simulated device.
    pub l2_flush_bytes: u64,
    /// Fill outputs with all-ones bytes (NaN for floats, -1 for i32) before the checked
    /// run, so that elements a kernel never writes fail the check
    /// ([`crate::measure::reference::Reference::check`] looks for NaN); else zero them.
    pub poison_outputs: bool,
    /// How long the supervisor waits for the reply before killing the worker.
    #[serde(with = "duration_secs")]
    pub timeout: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            repeat: 10,
            min_repeat_ms: 0.0,
            max_samples: 10_000,
            l2_flush_bytes: 0,
            poison_outputs: true,
            timeout: Duration::from_secs(10),
        }
    }
}

impl RunOptions {
    /// Flush bytes that cover `desc`'s L2 cache twice over (what a caller should put in
    /// [`RunOptions::l2_flush_bytes`] to time cold-cache launches).
    pub fn l2_flush_for(desc: &CudaDesc) -> u64 {
        desc.l2_bytes.saturating_mul(2)
    }
}

/// A duration on the wire as seconds (f64); a negative, NaN or huge value reads as zero or
/// the largest duration instead of failing.
mod duration_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Ok(Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX))
    }
}

/// What one run of a program gave.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRunResult {
    /// The outputs of the first (checked) launch, in parameter order.
    pub outputs: Vec<NdData>,
    /// Seconds of each timed launch, in order (the simulated device: the interpreter's wall
    /// time, meaningless for performance).
    pub times_s: Vec<f64>,
    /// Registers per thread the loaded kernel uses, where the device reports it.
    pub registers: Option<u32>,
    /// Static shared memory per block, in bytes, where the device reports it.
    pub shared_bytes: Option<u32>,
    /// Local memory (spills, per-thread arrays) per thread, in bytes, where reported.
    pub local_bytes: Option<u32>,
}

impl GpuRunResult {
    /// The median of [`GpuRunResult::times_s`] (the mean of the middle two for an even
    /// count); `None` without timings.
    pub fn median_s(&self) -> Option<f64> {
        let mut t: Vec<f64> = self
            .times_s
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .collect();
        if t.is_empty() {
            return None;
        }
        t.sort_by(f64::total_cmp);
        let n = t.len();
        Some(if n % 2 == 1 {
            t[n / 2]
        } else {
            (t[n / 2 - 1] + t[n / 2]) / 2.0
        })
    }
}

/// The device a worker runs programs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's name as the driver reports it (`simulated` for the simulated device).
    pub name: String,
    /// What the search reads about it.
    pub desc: CudaDesc,
    /// The lockstep interpreter, not a GPU.
    pub simulated: bool,
}

/// Why a program did not run to a result.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuRunError {
    /// No device to run on: no CUDA driver, no GPU, the worker could not be started or
    /// the crate was built without the `cuda` feature.
    #[error("no GPU available: {0}")]
    Unavailable(String),
    /// The request itself is wrong: inputs that do not match the parameters, a simulated
    /// program without its simulation form.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The PTX did not load (the driver's JIT rejected it) or has no such entry.
    #[error("the kernel did not load: {0}")]
    Load(String),
    /// The driver refused the launch (too many resources for the launch, bad dimensions).
    #[error("the launch failed: {0}")]
    Launch(String),
    /// The kernel failed while running (an illegal address, a trap). The worker's context
    /// is gone; the next request starts a fresh worker.
    #[error("the kernel failed: {0}")]
    Kernel(String),
    /// The simulated device's interpreter rejected the program (a data race, a divergent
    /// barrier, an out-of-bounds access).
    #[error("simulation failed: {0}")]
    Simulation(String),
    /// The worker died without replying (a crash signal, an exit); it is restarted on the
    /// next request.
    #[error("the GPU worker died: {0}")]
    Fault(String),
    /// No reply within the timeout; the worker was killed and is restarted on the next
    /// request.
    #[error("no reply from the GPU worker within {:.1} s; killed", .0.as_secs_f64())]
    Timeout(Duration),
    /// The worker's reply was not a well-formed frame; the worker was killed.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A failure of the device or driver outside the kernel (allocation, copies).
    #[error("device error: {0}")]
    Device(String),
}

impl GpuRunError {
    /// The measurement error this is recorded as: load failures are compile errors, a
    /// timeout is a timeout, the worker's own failures are internal, the rest (the kernel
    /// failing or being refused) are runtime errors.
    pub fn to_measure_error(&self) -> MeasureError {
        let kind = match self {
            GpuRunError::Load(_) => MeasureErrorKind::Compile,
            GpuRunError::Timeout(_) => MeasureErrorKind::Timeout,
            GpuRunError::Launch(_)
            | GpuRunError::Kernel(_)
            | GpuRunError::Simulation(_)
            | GpuRunError::Fault(_) => MeasureErrorKind::Runtime,
            GpuRunError::Unavailable(_)
            | GpuRunError::Invalid(_)
            | GpuRunError::Protocol(_)
            | GpuRunError::Device(_) => MeasureErrorKind::Internal,
        };
        MeasureError::new(
            kind,
            tensortune_schedules::text::single_line(&self.to_string()),
        )
    }
}

impl From<GpuRunError> for MeasureError {
    fn from(e: GpuRunError) -> Self {
        e.to_measure_error()
    }
}

/// Whether `inputs` are data for `program`'s input parameters: one each, in order, of the
/// parameter's shape and dtype. Checked by the supervisor before sending and by the worker
/// before uploading.
pub(crate) fn check_inputs(program: &GpuProgram, inputs: &[NdData]) -> Result<(), String> {
    let want: Vec<&ParamSpec> = program.inputs().collect();
    if want.len() != inputs.len() {
        return Err(format!(
            "{} inputs for a program of {} input parameters",
            inputs.len(),
            want.len()
        ));
    }
    for (p, x) in want.iter().zip(inputs) {
        if p.shape != x.shape || p.dtype != x.data.dtype() {
            return Err(format!(
                "input `{}` is {:?} {}, the parameter {:?} {}",
                p.name,
                x.shape,
                x.data.dtype(),
                p.shape,
                p.dtype
            ));
        }
    }
    Ok(())
}

/// Whether `outputs` are what `program`'s output parameters hold.
pub(crate) fn check_outputs(program: &GpuProgram, outputs: &[NdData]) -> Result<(), String> {
    let want: Vec<&ParamSpec> = program.outputs().collect();
    if want.len() != outputs.len()
        || want
            .iter()
            .zip(outputs)
            .any(|(p, x)| p.shape != x.shape || p.dtype != x.data.dtype())
    {
        return Err(format!(
            "{} outputs that do not match the program's {} output parameters",
            outputs.len(),
            want.len()
        ));
    }
    Ok(())
}
