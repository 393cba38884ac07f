//! An NVIDIA GPU as a [`Backend`]: candidates are checked by the GPU verifier, compiled to PTX
//! through LLVM's NVPTX back end ([`crate::codegen::nvptx`]), and run by a [`GpuDevice`]:
//! the real GPU through the CUDA worker process ([`crate::gpu`]), or, without one, the
//! lockstep interpreter ([`LockstepDevice`]), which checks outputs and races but whose times
//! mean nothing.
//!
//! Tuning measures a batch with [`CudaMeasurer`]: candidates are lowered and compiled on the
//! CPU's threads while the device runs those already compiled, so the GPU does not wait for
//! the slowest compile of the batch before its first run. (The CPU backend does not do
//! this: a compile beside a timed CPU kernel would change its time.)
//!
//! The search reads the device's own description where there is a device, else the row of
//! the key's architecture in [`CudaDesc::for_arch`]; an architecture outside that table is
//! refused ([`CudaTargetError::UnknownArch`]) rather than guessed.

use super::{Backend, Purpose};
use crate::codegen::nvptx::emit_ptx;
use crate::measure::reference::{random_inputs, OutputView, Reference};
use crate::measure::MeasureOptions;
use rayon::prelude::*;
use std::sync::Mutex;
use std::time::Instant;
use tensortune_schedules::data::NdData;
use tensortune_schedules::gpu::verify::{verify_gpu, GpuUsage};
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::{CudaDesc, CudaKey, TargetDesc, TargetKey};
use tensortune_schedules::ComputeDag;
use tensortune_tuner::measure::{
    MeasureError, MeasureErrorKind, MeasureResult, MeasureStats, Measurer, Timing,
};
use tensortune_tuner::sketch::rules::{default_for_target, gpu_rules, SketchRule};

/// A `cuda` target that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaTargetError {
    /// The key names an architecture this build has no description of.
    #[error("unknown GPU architecture `{arch}`: known are {}", .known.join(", "))]
    UnknownArch {
        /// The architecture asked for.
        arch: String,
        /// The architectures of [`CudaDesc::known_archs`].
        known: Vec<String>,
    },
    /// The key is not a `cuda` key.
    #[error("`{0}` is not a cuda target key (expected e.g. `cuda -arch=sm_90`)")]
    NotCuda(String),
    /// No CUDA driver could be loaded, so nothing can run on a GPU.
    #[error("{0}")]
    NoDriver(String),
    /// The device's architecture is not the one the key names.
    #[error("the key names {key}, the GPU is {device}")]
    ArchMismatch {
        /// The key's architecture.
        key: String,
        /// The device's.
        device: String,
    },
}

/// A candidate compiled for the GPU: its loop IR (the launch and the parameters' shapes are
/// read from it, and the lockstep interpreter runs it), its PTX, and what the verifier
/// computed of its resources.
#[derive(Clone, Debug)]
pub struct CudaArtifact {
    /// The lowered program.
    pub func: LoweredFunc,
    /// Its PTX, one `.entry` named `func.name`.
    pub ptx: String,
    /// Launch, shared and local memory, as the verifier computed them.
    pub usage: GpuUsage,
}

/// How a [`GpuDevice`] times a program.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuTimingOptions {
    /// Timings (each of one or more launches); the record keeps their median.
    pub repeat: usize,
    /// Each timing runs the kernel back to back until it lasts this long.
    pub min_repeat_ms: f64,
    /// Bytes written between timings so that none starts with its inputs in the L2 (more
    /// than the L2 of the device).
    pub l2_flush_bytes: u64,
    /// A program still running after this many seconds is stopped.
    pub timeout_s: f64,
}

impl GpuTimingOptions {
    /// The settings of `purpose` on a GPU with `desc`'s L2.
    pub fn for_purpose(purpose: Purpose, desc: &CudaDesc) -> GpuTimingOptions {
        let (repeat, min_repeat_ms) = match purpose {
            Purpose::Tuning => (3, 10.0),
            Purpose::Final => (7, 50.0),
        };
        GpuTimingOptions {
            repeat,
            min_repeat_ms,
            // Twice the L2: a write of exactly its size can leave lines of the inputs behind
            // where the replacement is not strict LRU.
            l2_flush_bytes: desc.l2_bytes.saturating_mul(2).max(1 << 20),
            timeout_s: 10.0,
        }
    }
}

/// One program's run on a device.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRun {
    /// The outputs of the first run (the program's output parameters, in order).
    pub outputs: Vec<NdData>,
    /// Seconds per launch of each timing.
    pub times_s: Vec<f64>,
    /// Launches per timing.
    pub number: u64,
    /// Registers per thread of the loaded kernel, where the device reports them.
    pub registers: Option<u32>,
}

/// What runs compiled GPU programs.
pub trait GpuDevice: Send {
    /// The device's description (the search's limits).
    fn desc(&self) -> CudaDesc;

    /// True if [`GpuRun::times_s`] are times of the hardware (false for an interpreter:
    /// such a backend's records must not be filed as measurements).
    fn times_are_real(&self) -> bool;

    /// Runs `artifact` on `inputs` (the DAG's inputs, in order): its outputs, then timings.
    fn run(
        &mut self,
        artifact: &CudaArtifact,
        inputs: &[NdData],
        opts: &GpuTimingOptions,
    ) -> Result<GpuRun, MeasureError>;
}

/// The loop-IR GPU interpreter ([`tensortune_schedules::gpu::interp::run_lockstep`]) as a
/// device: it runs blocks in turn and a block's threads in lockstep, so it checks a
/// candidate's outputs, races and barriers on a machine without a GPU. Its "times" are the
/// interpreter's wall time, one timing: good for tests of the pipeline, worthless for ranking.
#[derive(Clone, Debug)]
pub struct LockstepDevice {
    desc: CudaDesc,
}

impl LockstepDevice {
    /// An interpreter standing for a GPU described by `desc`.
    pub fn new(desc: CudaDesc) -> LockstepDevice {
        LockstepDevice { desc }
    }
}

impl GpuDevice for LockstepDevice {
    fn desc(&self) -> CudaDesc {
        self.desc.clone()
    }

    fn times_are_real(&self) -> bool {
        false
    }

    fn run(
        &mut self,
        artifact: &CudaArtifact,
        inputs: &[NdData],
        _opts: &GpuTimingOptions,
    ) -> Result<GpuRun, MeasureError> {
        let t = Instant::now();
        let outputs = tensortune_schedules::gpu::interp::run_lockstep(&artifact.func, inputs)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Runtime, e.to_string()))?;
        Ok(GpuRun {
            outputs,
            times_s: vec![t.elapsed().as_secs_f64()],
            number: 1,
            registers: None,
        })
    }
}

/// The GPU of a CUDA worker process ([`crate::gpu::GpuSupervisor`]): each program is loaded
/// from its PTX, run once for the check and timed with CUDA events in the worker, so a
/// kernel that faults or hangs costs the worker (restarted for the next candidate), never
/// this process.
pub struct WorkerDevice {
    supervisor: crate::gpu::GpuSupervisor,
    info: crate::gpu::DeviceInfo,
}

impl WorkerDevice {
    /// Starts a worker from `cmd` and asks for its device. Fails with a one-line error where
    /// the worker cannot start or finds no GPU.
    pub fn start(cmd: crate::gpu::WorkerCommand) -> Result<WorkerDevice, crate::gpu::GpuRunError> {
        let mut supervisor = crate::gpu::GpuSupervisor::new(cmd);
        let info = supervisor.device_info()?;
        Ok(WorkerDevice { supervisor, info })
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.info.name
    }
}

impl GpuDevice for WorkerDevice {
    fn desc(&self) -> CudaDesc {
        self.info.desc.clone()
    }

    fn times_are_real(&self) -> bool {
        !self.info.simulated
    }

    fn run(
        &mut self,
        artifact: &CudaArtifact,
        inputs: &[NdData],
        opts: &GpuTimingOptions,
    ) -> Result<GpuRun, MeasureError> {
        let program = crate::gpu::GpuProgram::from_lowered(&artifact.func, artifact.ptx.clone())
            .map_err(|e| MeasureError::new(MeasureErrorKind::Compile, e.to_string()))?;
        let run_opts = crate::gpu::RunOptions {
            repeat: u32::try_from(opts.repeat).unwrap_or(u32::MAX).max(1),
            min_repeat_ms: opts.min_repeat_ms,
            l2_flush_bytes: opts.l2_flush_bytes,
            poison_outputs: true,
            timeout: std::time::Duration::try_from_secs_f64(opts.timeout_s)
                .unwrap_or(std::time::Duration::from_secs(10)),
            ..crate::gpu::RunOptions::default()
        };
        let r = self.supervisor.run(&program, inputs, &run_opts)?;
        if let (Some(regs), Some(smem)) = (r.registers, r.shared_bytes) {
            log::debug!(
                "{}: {regs} registers/thread, {smem} B shared (verifier: {} B)",
                artifact.func.name,
                artifact.usage.shared_bytes
            );
        }
        Ok(GpuRun {
            outputs: r.outputs,
            // One launch per timed sample: CUDA events time each launch on its own.
            times_s: r.times_s,
            number: 1,
            registers: r.registers,
        })
    }
}

/// An NVIDIA GPU to tune for; see the module doc.
pub struct CudaBackend {
    key: CudaKey,
    desc: CudaDesc,
    device: Option<Mutex<Box<dyn GpuDevice>>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("key", &self.key)
            .field("desc", &self.desc)
            .field("device", &self.device.is_some())
            .finish()
    }
}

/// The key's architecture and its description from the table.
fn offline_desc(key: &CudaKey) -> Result<CudaDesc, CudaTargetError> {
    let arch = key.arch_or_default();
    CudaDesc::for_arch(arch).ok_or_else(|| CudaTargetError::UnknownArch {
        arch: arch.to_string(),
        known: CudaDesc::known_archs()
            .iter()
            .map(|a| a.to_string())
            .collect(),
    })
}

/// Parses a `cuda` key.
pub fn parse_cuda_key(text: &str) -> Result<CudaKey, CudaTargetError> {
    match text.parse::<TargetKey>() {
        Ok(TargetKey::Cuda(k)) => Ok(k),
        _ => Err(CudaTargetError::NotCuda(
            tensortune_schedules::text::single_line(text).to_string(),
        )),
    }
}

impl CudaBackend {
    /// A backend without a device: candidates compile (verifier, PTX) from the table's
    /// description of the key's architecture, and running one is an `internal` error
    /// record. What `--dry-run` and code generation use.
    pub fn offline(key: &CudaKey) -> Result<CudaBackend, CudaTargetError> {
        let desc = offline_desc(key)?;
        Ok(CudaBackend {
            key: CudaKey {
                arch: Some(desc.arch.clone()),
            },
            desc,
            device: None,
        })
    }

    /// A backend running on `device`. The key's architecture, where it names one, must be
    /// the device's; where it names none, the key takes the device's.
    pub fn with_device(
        key: &CudaKey,
        device: Box<dyn GpuDevice>,
    ) -> Result<CudaBackend, CudaTargetError> {
        let desc = device.desc();
        if let Some(arch) = &key.arch {
            if *arch != desc.arch {
                return Err(CudaTargetError::ArchMismatch {
                    key: arch.clone(),
                    device: desc.arch.clone(),
                });
            }
        }
        Ok(CudaBackend {
            key: CudaKey {
                arch: Some(desc.arch.clone()),
            },
            desc,
            device: Some(Mutex::new(device)),
        })
    }

    /// The description the search reads.
    pub fn desc(&self) -> &CudaDesc {
        &self.desc
    }

    /// The architecture code is generated for.
    pub fn arch(&self) -> &str {
        &self.desc.arch
    }

    /// True if this backend has a device whose times are the hardware's.
    pub fn measures_real_times(&self) -> bool {
        self.device
            .as_ref()
            .and_then(|d| d.lock().ok().map(|d| d.times_are_real()))
            .unwrap_or(false)
    }
}

impl CudaBackend {
    /// Runs one compiled program on the backend's device with `inputs` (the DAG's, in
    /// order): its outputs, unchecked, and its timings. An `internal` error without a device.
    pub fn run_artifact(
        &self,
        artifact: &CudaArtifact,
        inputs: &[NdData],
        opts: &GpuTimingOptions,
    ) -> Result<GpuRun, MeasureError> {
        let internal = |m: &str| MeasureError::new(MeasureErrorKind::Internal, m);
        let device = self
            .device
            .as_ref()
            .ok_or_else(|| internal("no GPU device: this cuda backend only compiles"))?;
        let mut device = device
            .lock()
            .map_err(|_| internal("the GPU device's lock was poisoned by an earlier panic"))?;
        device.run(artifact, inputs, opts)
    }
}

/// A GPU program chosen from records (or the default GPU schedule) and compiled, ready to
/// run on a [`CudaBackend`]'s device: the GPU counterpart of [`crate::Kernel::from_records`].
#[derive(Clone, Debug)]
pub struct CudaKernel {
    /// The compiled program.
    pub artifact: CudaArtifact,
    /// Where its schedule came from: a record (`record #ID ...`) or `default GPU schedule`.
    pub source: String,
}

/// Why no [`CudaKernel`] could be made or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaKernelError {
    /// Choosing the record failed (no record, a database error, a bad workload).
    #[error(transparent)]
    Reuse(#[from] crate::build::ReuseError),
    /// The chosen schedule does not lower, verify or compile for this GPU (a record from
    /// another GPU, or from a damaged database).
    #[error("`{workload}` from {origin}: {error}")]
    Compile {
        /// The workload's canonical spec.
        workload: String,
        /// Where the schedule came from.
        origin: String,
        /// What failed.
        error: MeasureError,
    },
    /// The kernel did not run (no device, a fault, a timeout).
    #[error("running the kernel: {0}")]
    Run(MeasureError),
}

impl CudaBackend {
    /// The best record of `workload` for this backend's key in `db`, compiled; where there
    /// is none, the default GPU schedule ([`tensortune_tuner::sketch::rules::default_schedule`])
    /// with a warning if `missing` is [`crate::Missing::Fallback`], else the error.
    pub fn kernel_from_records(
        &self,
        db: &tensortune_records::Database,
        workload: &tensortune_schedules::ops::WorkloadSpec,
        missing: crate::Missing,
    ) -> Result<CudaKernel, CudaKernelError> {
        use crate::build::ReuseError;
        let key = self.target_key().to_string();
        // `Missing::Error` always: the generic fallback is the CPU's default schedule (one
        // thread), not the GPU's.
        match crate::build::choose(db, workload, &key, crate::Missing::Error) {
            Ok(choice) => {
                for w in &choice.warnings {
                    log::warn!("{w}");
                }
                self.kernel_of(workload, &choice.func, choice.source.to_string())
            }
            Err(e @ (ReuseError::NoRecord { .. } | ReuseError::NoTarget { .. }))
                if missing == crate::Missing::Fallback =>
            {
                log::warn!("{e}; using the default GPU schedule");
                self.default_kernel(workload)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The default GPU schedule of `workload`, compiled.
    pub fn default_kernel(
        &self,
        workload: &tensortune_schedules::ops::WorkloadSpec,
    ) -> Result<CudaKernel, CudaKernelError> {
        let dag = workload
            .build()
            .map_err(|source| crate::build::ReuseError::Spec {
                spec: workload.canonical(),
                source,
            })?;
        let (state, _) = tensortune_tuner::sketch::rules::default_schedule(&dag, &self.desc);
        let func =
            tensortune_schedules::lower::lower(&state).map_err(|e| CudaKernelError::Compile {
                workload: workload.canonical(),
                origin: "default GPU schedule".into(),
                error: MeasureError::new(MeasureErrorKind::Lower, e.to_string()),
            })?;
        self.kernel_of(workload, &func, "default GPU schedule".into())
    }

    fn kernel_of(
        &self,
        workload: &tensortune_schedules::ops::WorkloadSpec,
        func: &LoweredFunc,
        source: String,
    ) -> Result<CudaKernel, CudaKernelError> {
        match self.compile(func) {
            Ok(artifact) => Ok(CudaKernel { artifact, source }),
            Err(error) => Err(CudaKernelError::Compile {
                workload: workload.canonical(),
                origin: source,
                error,
            }),
        }
    }

    /// Runs `kernel` once on host arrays `inputs` (the workload's inputs, in order) and
    /// returns its outputs.
    pub fn run_kernel(
        &self,
        kernel: &CudaKernel,
        inputs: &[NdData],
    ) -> Result<Vec<NdData>, CudaKernelError> {
        let once = GpuTimingOptions {
            repeat: 1,
            min_repeat_ms: 0.0,
            l2_flush_bytes: 0,
            ..GpuTimingOptions::for_purpose(Purpose::Tuning, &self.desc)
        };
        self.run_artifact(&kernel.artifact, inputs, &once)
            .map(|r| r.outputs)
            .map_err(CudaKernelError::Run)
    }
}

impl Backend for CudaBackend {
    type Artifact = CudaArtifact;

    fn target_key(&self) -> TargetKey {
        TargetKey::Cuda(self.key.clone())
    }

    fn target(&self) -> TargetDesc {
        TargetDesc::Cuda(self.desc.clone())
    }

    fn rules(&self) -> Vec<Box<dyn SketchRule>> {
        gpu_rules()
    }

    fn default_schedule(&self, dag: &ComputeDag) -> Option<State> {
        Some(default_for_target(dag, &self.target()))
    }

    fn compile(&self, func: &LoweredFunc) -> Result<CudaArtifact, MeasureError> {
        // The verifier first: a candidate over a limit is a cheap error record, no LLVM.
        let usage = verify_gpu(func, &self.desc)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Compile, e.to_string()))?;
        let ptx = emit_ptx(func, &self.desc.arch)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Compile, e.to_string()))?;
        Ok(CudaArtifact {
            func: func.clone(),
            ptx,
            usage,
        })
    }

    fn run(
        &self,
        dag: &ComputeDag,
        artifacts: &[CudaArtifact],
        purpose: Purpose,
        seed: u64,
    ) -> Vec<MeasureResult> {
        let fail = |kind, msg: String| -> Vec<MeasureResult> {
            artifacts
                .iter()
                .map(|_| Err(MeasureError::new(kind, msg.clone())))
                .collect()
        };
        let batch = match self.batch(dag, purpose, seed) {
            Ok(b) => b,
            Err(e) => return fail(e.kind, e.message),
        };
        let mut device = match self.device() {
            Ok(d) => d,
            Err(e) => return fail(e.kind, e.message),
        };
        artifacts
            .iter()
            .map(|a| batch.run(device.as_mut(), a))
            .collect()
    }

    fn measurer<'a>(&'a self, purpose: Purpose, seed: u64) -> Box<dyn Measurer + 'a> {
        Box::new(CudaMeasurer {
            backend: self,
            purpose,
            seed,
            stats: MeasureStats::default(),
        })
    }
}

/// What the runs of one batch share: the inputs, the reference their outputs are checked
/// against, and the timing options.
struct Batch {
    inputs: Vec<NdData>,
    reference: Reference,
    opts: GpuTimingOptions,
}

impl Batch {
    /// Runs `artifact` on `device`, checks its outputs, and times it.
    fn run(&self, device: &mut dyn GpuDevice, artifact: &CudaArtifact) -> MeasureResult {
        let run = device.run(artifact, &self.inputs, &self.opts)?;
        let t = Instant::now();
        let views: Vec<OutputView<'_>> = run.outputs.iter().map(OutputView::of_nd).collect();
        self.reference.check(&views)?;
        let check_s = t.elapsed().as_secs_f64();
        timing(&run, check_s)
    }
}

impl CudaBackend {
    /// The inputs (from `seed`), reference and timing options of a batch of `dag`.
    fn batch(&self, dag: &ComputeDag, purpose: Purpose, seed: u64) -> Result<Batch, MeasureError> {
        let inputs = random_inputs(dag, seed)?;
        let check = MeasureOptions {
            seed,
            ..MeasureOptions::default()
        }
        .check_options();
        let reference = Reference::new(dag, &inputs, &check)?;
        let opts = GpuTimingOptions::for_purpose(purpose, &self.desc);
        Ok(Batch {
            inputs,
            reference,
            opts,
        })
    }

    /// The device, locked for a batch.
    fn device(&self) -> Result<std::sync::MutexGuard<'_, Box<dyn GpuDevice>>, MeasureError> {
        let Some(device) = &self.device else {
            return Err(MeasureError::new(
                MeasureErrorKind::Internal,
                "no GPU device: this cuda backend only compiles",
            ));
        };
        device.lock().map_err(|_| {
            MeasureError::new(
                MeasureErrorKind::Internal,
                "the GPU device's lock was poisoned by an earlier panic",
            )
        })
    }
}

/// The tuner's [`Measurer`] for a [`CudaBackend`] (see the module doc): a batch is lowered and
/// compiled on the CPU's threads in parallel, and each candidate runs on the device as soon as
/// it is compiled, in the order compiles finish; results come back in the candidates' order.
pub struct CudaMeasurer<'a> {
    backend: &'a CudaBackend,
    purpose: Purpose,
    seed: u64,
    stats: MeasureStats,
}

impl Measurer for CudaMeasurer<'_> {
    fn measure(&mut self, dag: &ComputeDag, candidates: &[State]) -> Vec<MeasureResult> {
        let start = Instant::now();
        let fail = |e: MeasureError| -> Vec<MeasureResult> {
            candidates.iter().map(|_| Err(e.clone())).collect()
        };
        let batch = match self.backend.batch(dag, self.purpose, self.seed) {
            Ok(b) => b,
            Err(e) => return fail(e),
        };
        let mut device = match self.backend.device() {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        let backend = self.backend;
        let compile = move |s: &State| {
            lower(s)
                .map_err(|e| MeasureError::new(MeasureErrorKind::Lower, e.to_string()))
                .and_then(|f| backend.compile(&f))
        };
        let mut results: Vec<Option<MeasureResult>> = candidates.iter().map(|_| None).collect();
        let mut run_s = 0.0;
        let mut run = |i: usize, compiled: Result<CudaArtifact, MeasureError>| {
            let r = compiled.and_then(|a| {
                let t = Instant::now();
                let r = batch.run(device.as_mut(), &a);
                run_s += t.elapsed().as_secs_f64();
                r
            });
            if let Some(slot) = results.get_mut(i) {
                *slot = Some(r);
            }
        };
        if rayon::current_thread_index().is_some() {
            // Called from a rayon worker: waiting here for compiles queued on the same pool
            // could wait for ever (a pool of one thread), so compile first, then run.
            let compiled: Vec<_> = candidates.par_iter().map(compile).collect();
            for (i, c) in compiled.into_iter().enumerate() {
                run(i, c);
            }
        } else {
            std::thread::scope(|scope| {
                let (tx, rx) = std::sync::mpsc::channel();
                scope.spawn(move || {
                    candidates
                        .par_iter()
                        .enumerate()
                        .for_each_with(tx, |tx, (i, s)| {
                            // The receiver lives until every sender is gone.
                            let _ = tx.send((i, compile(s)));
                        });
                });
                for (i, compiled) in rx {
                    run(i, compiled);
                }
            });
        }
        // Compiling is what the device waited for: the batch's wall time less its runs.
        self.stats.run_s += run_s;
        self.stats.compile_s += (start.elapsed().as_secs_f64() - run_s).max(0.0);
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(MeasureError::new(
                        MeasureErrorKind::Internal,
                        "a candidate was neither compiled nor run",
                    ))
                })
            })
            .collect()
    }

    fn target_key(&self) -> String {
        self.backend.target_key().to_string()
    }

    fn stats(&self) -> MeasureStats {
        self.stats
    }
}

/// The record of a checked run: median and spread of its timings.
fn timing(run: &GpuRun, check_s: f64) -> MeasureResult {
    let usable = run.times_s.iter().all(|t| t.is_finite() && *t >= 0.0);
    let t = usable
        .then(|| Timing::from_repeats(run.times_s.clone(), run.number.max(1)))
        .flatten()
        .ok_or_else(|| {
            MeasureError::new(
                MeasureErrorKind::Internal,
                format!("the device reported unusable times {:?}", run.times_s),
            )
        })?;
    Ok(Timing { check_s, ..t })
}
