//! Honest measurement of candidate schedules on the host CPU.
//!
//! [`CpuMeasurer`] implements the tuner's [`Measurer`]: for a batch of candidates of one
//! workload it
//! 1. draws random inputs from a seed and computes the reference outputs with the direct
//!    evaluator (cached per workload): every element for workloads of up to
//!    `full_check_max_flops`, sampled elements for larger ones (the evaluator is an
//!    interpreter, far too slow for whole large workloads);
//! 2. lowers and compiles every candidate, in parallel on rayon's pool;
//! 3. runs the candidates one after another, so they do not disturb each other: first one
//!    run whose outputs (pre-filled with NaN / `i32::MIN`, so unwritten elements show) are
//!    compared with the reference under [`tolerance`], which is also the first of the
//!    `warmup` runs and the first look at a hopeless candidate; then the other `warmup`
//!    runs; then `repeat`
//!    timings of `number` runs each, with `number` grown until one timing lasts at least
//!    `min_repeat_ms`, the buffers evicted from the caches before each run where
//!    [`MeasureOptions::flush_cache`] says so ([`time_kernel`]).
//!
//! **Isolation.** With [`Isolation::Fork`] (the default on Unix) each candidate runs in a
//! forked child that inherits the compiled code and the data copy-on-write and reports back
//! through a pipe. A crash (SIGSEGV, SIGILL, SIGFPE...) kills only the child and becomes a
//! `Runtime` error naming the signal; a child still running at `timeout` is killed with
//! SIGKILL and becomes a `Timeout`. Forking needs no re-compilation and no helper binary,
//! which a re-executed worker process would; the price is the usual rule for forking a
//! threaded process: the child uses only the forking thread, a fresh thread pool of its own,
//! and the allocator (which glibc makes safe across `fork`). With [`Isolation::InProcess`]
//! (for debugging, and the only mode elsewhere) a crash ends the process and a hang is not
//! interrupted.

mod inject;
mod isolate;
pub mod reference;

use inject::Fault;
pub use inject::{check_fault_plan, FAULTS_ENV};
pub use reference::{
    max_reduction_len, random_inputs, tolerance, CheckOptions, OutputView, Reference,
};

use crate::codegen::{CodegenOptions, HostTarget};
use crate::kernel::{BuildError, Kernel};
use crate::runtime::{flush_ranges, AlignedBuffer, CacheFlush, Runtime};
use rayon::prelude::*;
use std::time::{Duration, Instant};
use tensortune_schedules::schedule::State;
use tensortune_schedules::{ComputeDag, DType};
use tensortune_tuner::measure::{
    MeasureError, MeasureErrorKind, MeasureResult, MeasureStats, Measurer, Timing,
};

/// How candidates are kept from taking the measurer down with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Run in the measuring process: fastest, but a crash or hang is fatal.
    InProcess,
    /// Run each candidate in a forked child with a watchdog (Unix only).
    Fork,
}

/// Settings of [`CpuMeasurer`] and [`time_kernel`].
#[derive(Clone, Debug, PartialEq)]
pub struct MeasureOptions {
    /// Timings per candidate; the reported time is their median.
    pub repeat: usize,
    /// Runs before timing starts. In [`CpuMeasurer`] the checked first run is the first of
    /// them; [`time_kernel`] alone runs them all.
    pub warmup: usize,
    /// A timing lasts at least this long; `number` grows until it does.
    pub min_repeat_ms: f64,
    /// When the buffers are evicted from the caches before each timed run.
    pub flush_cache: CacheFlush,
    /// Threads for parallel loops (1: serial).
    pub threads: usize,
    /// A candidate running longer than this (check, warm-up and timings) is stopped.
    pub timeout: Duration,
    /// See [`Isolation`].
    pub isolation: Isolation,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Compare outputs with the reference before timing.
    pub check: bool,
    /// Workloads of up to this many flops are checked element by element against the
    /// evaluator run on the whole DAG; larger ones at `check_points` sampled elements per
    /// output (the evaluator runs at about 50 ns per flop, so 2e7 is about a second).
    pub full_check_max_flops: f64,
    /// Elements sampled per output for large workloads.
    pub check_points: usize,
    /// Code generation settings.
    pub codegen: CodegenOptions,
    /// A candidate whose first timed run takes longer than this (seconds) is reported with
    /// that single time, cut short (see `Measurer::set_cutoff`).
    pub cutoff_s: Option<f64>,
}

impl MeasureOptions {
    /// The part of these options the shared reference check reads.
    pub fn check_options(&self) -> CheckOptions {
        CheckOptions {
            full_check_max_flops: self.full_check_max_flops,
            check_points: self.check_points,
            seed: self.seed,
        }
    }
}

impl Default for MeasureOptions {
    fn default() -> Self {
        MeasureOptions {
            repeat: 5,
            warmup: 1,
            // docs/benchmarks.md: timings of at least 100 ms swamp timer noise.
            min_repeat_ms: 100.0,
            flush_cache: CacheFlush::default(),
            threads: 1,
            timeout: Duration::from_secs(20),
            isolation: if cfg!(unix) {
                Isolation::Fork
            } else {
                Isolation::InProcess
            },
            seed: 0,
            check: true,
            full_check_max_flops: 2e7,
            check_points: 512,
            codegen: CodegenOptions::default(),
            cutoff_s: None,
        }
    }
}

/// Bytes of every tensor of `dag` (inputs, intermediates, outputs), saturating: what the
/// reference evaluator holds at once, and an upper bound on a kernel's buffers.
pub fn dag_bytes(dag: &ComputeDag) -> u64 {
    dag.ops()
        .iter()
        .map(|op| {
            op.shape
                .iter()
                .try_fold(op.dtype.bytes() as u64, |n, &d| {
                    n.checked_mul(u64::try_from(d).unwrap_or(0))
                })
                .unwrap_or(u64::MAX)
        })
        .fold(0u64, u64::saturating_add)
}

/// An error when the memory a measurement of `dag` takes (its tensors twice: the host data
/// and the kernel's buffers) does not fit in what this process can still use.
pub fn check_memory(dag: &ComputeDag) -> Result<(), crate::runtime::BufferError> {
    crate::runtime::memory::check_fits(
        dag_bytes(dag).saturating_mul(2),
        "the workload's inputs, outputs and reference",
    )
}

fn internal(m: String) -> MeasureError {
    MeasureError::new(MeasureErrorKind::Internal, m)
}

/// A workload's reference and its inputs in fenced host buffers, as the CPU runs kernels.
pub(crate) struct CpuReference {
    inputs: Vec<AlignedBuffer>,
    check: Reference,
}

/// Measures candidates on this CPU; see the module doc.
pub struct CpuMeasurer {
    opts: MeasureOptions,
    /// Best time so far and the hopeless factor, from [`Measurer::set_cutoff`].
    cutoff: Option<(Option<f64>, f64)>,
    stats: MeasureStats,
    /// Reference of the last workload measured, keyed by its printed DAG.
    cache: Option<(String, std::sync::Arc<CpuReference>)>,
}

impl CpuMeasurer {
    /// A measurer with these settings.
    pub fn new(opts: MeasureOptions) -> CpuMeasurer {
        CpuMeasurer {
            opts,
            cutoff: None,
            stats: MeasureStats::default(),
            cache: None,
        }
    }

    /// The settings.
    pub fn options(&self) -> &MeasureOptions {
        &self.opts
    }

    fn reference(
        &mut self,
        dag: &ComputeDag,
    ) -> Result<std::sync::Arc<CpuReference>, MeasureError> {
        let key = format!("{dag:?}");
        if let Some((k, r)) = &self.cache {
            if *k == key {
                return Ok(r.clone());
            }
        }
        check_memory(dag).map_err(|e| internal(e.to_string()))?;
        let inputs = random_inputs(dag, self.opts.seed)?;
        let check = Reference::new(dag, &inputs, &self.opts.check_options())?;
        let r = std::sync::Arc::new(CpuReference {
            inputs: inputs
                .iter()
                .map(AlignedBuffer::fenced_from_nd)
                .collect::<Result<_, _>>()
                .map_err(|e| internal(e.to_string()))?,
            check,
        });
        self.cache = Some((key, r.clone()));
        Ok(r)
    }
}

impl CpuMeasurer {
    /// Checks and times already compiled kernels of `dag` (hand-written IR, say), with the
    /// same reference, isolation and timing as [`Measurer::measure`].
    pub fn measure_kernels(&mut self, dag: &ComputeDag, kernels: &[Kernel]) -> Vec<MeasureResult> {
        match self.reference(dag) {
            Ok(r) => kernels.iter().map(|k| self.run_one(k, &r)).collect(),
            Err(e) => kernels.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    fn run_one(&self, k: &Kernel, reference: &CpuReference) -> MeasureResult {
        match self.opts.isolation {
            Isolation::Fork => isolate::run_forked(k, reference, &self.opts),
            Isolation::InProcess => {
                let rt = Runtime::new(self.opts.threads).map_err(|e| internal(e.to_string()))?;
                measure_one(k, reference, &self.opts, &rt, &mut || {}, None)
            }
        }
    }
}

impl Measurer for CpuMeasurer {
    fn measure(&mut self, dag: &ComputeDag, candidates: &[State]) -> Vec<MeasureResult> {
        let reference = match self.reference(dag) {
            Ok(r) => r,
            Err(e) => return candidates.iter().map(|_| Err(e.clone())).collect(),
        };
        let codegen = self.opts.codegen.clone();
        let t_compile = Instant::now();
        let kernels: Vec<Result<Kernel, MeasureError>> = candidates
            .par_iter()
            .map(|s| {
                Kernel::from_state(s, &codegen).map_err(|e| match e {
                    BuildError::Lower(e) => {
                        MeasureError::new(MeasureErrorKind::Lower, e.to_string())
                    }
                    BuildError::Codegen(e) => {
                        MeasureError::new(MeasureErrorKind::Compile, e.to_string())
                    }
                })
            })
            .collect();
        self.stats.compile_s += t_compile.elapsed().as_secs_f64();
        let t_run = Instant::now();
        // The cutoff follows the best time so far, including this batch's; a best time that
        // could not have been measured (a damaged or forged record) sets none.
        let key = self.target_key();
        let mut best = self
            .cutoff
            .and_then(|(b, _)| b)
            .filter(|&b| crate::plausible::possible(dag.flops(), b, &key));
        let mut results = Vec::with_capacity(kernels.len());
        for k in kernels {
            if let Some((_, factor)) = self.cutoff {
                self.opts.cutoff_s = best.map(|b| b * factor);
            }
            let r = k.and_then(|k| self.run_one(&k, &reference));
            if let Ok(t) = &r {
                self.stats.check_s += t.check_s;
                self.stats.first_run_s += t.first_s;
                if !t.cut_short && best.map(|b| t.median_s < b).unwrap_or(true) {
                    best = Some(t.median_s);
                }
            }
            results.push(r);
        }
        self.opts.cutoff_s = None;
        self.stats.run_s += t_run.elapsed().as_secs_f64();
        results
    }

    fn stats(&self) -> MeasureStats {
        self.stats
    }

    fn target_key(&self) -> String {
        HostTarget::host().key(self.opts.threads)
    }

    fn set_cutoff(&mut self, best_s: Option<f64>, factor: f64) {
        self.cutoff = (factor > 0.0).then_some((best_s, factor));
    }
}

/// Output buffers pre-filled with a value no correct kernel leaves behind, between fence
/// pages ([`AlignedBuffer::fenced`]) so that writes outside them are caught.
fn poisoned_outputs(k: &Kernel) -> Result<Vec<AlignedBuffer>, MeasureError> {
    k.outputs()
        .map(|p| {
            let mut b =
                AlignedBuffer::fenced(&p.shape, p.dtype).map_err(|e| internal(e.to_string()))?;
            match p.dtype {
                DType::F32 => b.as_mut_slice::<f32>().map(|s| s.fill(f32::NAN)),
                DType::F64 => b.as_mut_slice::<f64>().map(|s| s.fill(f64::NAN)),
                DType::I32 => b.as_mut_slice::<i32>().map(|s| s.fill(i32::MIN)),
                _ => Ok(()),
            }
            .map_err(|e| internal(e.to_string()))?;
            Ok(b)
        })
        .collect()
}

/// Check, warm up and time one kernel (what a forked child does).
///
/// The first run does three jobs: its outputs are checked, it is the first warm-up run, and
/// its time is the first look at a hopeless candidate. One past the cutoff is timed once more
/// warm before it is cut short (a first run also pays for cold caches and page tables), so a
/// hopeless candidate runs twice, and any other one run fewer times than a separate checked
/// run would cost.
///
/// `checked` is called once the first run's outputs passed the check, before any timing: a
/// forked child tells its parent then, so that a child stopped later (hopeless, hung) is known
/// to be correct, and one stopped before is not.
pub(crate) fn measure_one(
    k: &Kernel,
    reference: &CpuReference,
    opts: &MeasureOptions,
    rt: &Runtime,
    checked: &mut dyn FnMut(),
    fault: Option<Fault>,
) -> MeasureResult {
    let preparing = Instant::now();
    let mut outs = poisoned_outputs(k)?;
    let ins: Vec<&AlignedBuffer> = reference.inputs.iter().collect();
    let mut check_s = preparing.elapsed().as_secs_f64();
    let first = Instant::now();
    {
        let mut out_refs: Vec<&mut AlignedBuffer> = outs.iter_mut().collect();
        let ran = match fault {
            Some(Fault::Hang) => inject::hang(),
            Some(Fault::Alloc) => k.status(inject::exhaust_allocator(rt)),
            _ => k.run(rt, &ins, &mut out_refs),
        };
        ran.map_err(|e| MeasureError::new(MeasureErrorKind::Runtime, e.to_string()))?;
        if let (Some(f), Some(out)) = (fault, out_refs.first_mut()) {
            inject::write_outside(f, out);
        }
    }
    let first_s = first.elapsed().as_secs_f64();
    check_fences(&outs, &ins)?;
    let checking = Instant::now();
    if opts.check {
        let views = outs.iter().map(view).collect::<Result<Vec<_>, _>>()?;
        reference.check.check(&views)?;
    }
    check_s += checking.elapsed().as_secs_f64();
    checked();
    let hopeless = opts.cutoff_s.is_some_and(|c| first_s > c);
    let rest = MeasureOptions {
        warmup: opts.warmup.saturating_sub(1).max(hopeless as usize),
        cutoff_s: opts.cutoff_s.filter(|_| hopeless),
        ..opts.clone()
    };
    let mut out_refs: Vec<&mut AlignedBuffer> = outs.iter_mut().collect();
    let mut t = time_kernel(k, rt, &ins, &mut out_refs, &rest)?;
    check_fences(&outs, &ins)?;
    t.check_s = check_s;
    t.first_s = first_s;
    Ok(t)
}

/// A `Runtime` error when a kernel wrote just outside one of its buffers (a write far outside
/// faults on the fence instead).
fn check_fences(outs: &[AlignedBuffer], ins: &[&AlignedBuffer]) -> Result<(), MeasureError> {
    let broken = |what: &str, i: usize| {
        MeasureError::new(
            MeasureErrorKind::Runtime,
            format!("wrote outside its {what} buffer {i} (the bytes next to it changed)"),
        )
    };
    if let Some(i) = outs.iter().position(|b| !b.fences_intact()) {
        return Err(broken("output", i));
    }
    if let Some(i) = ins.iter().position(|b| !b.fences_intact()) {
        return Err(broken("input", i));
    }
    Ok(())
}

/// The elements of an output buffer, for the check.
fn view(b: &AlignedBuffer) -> Result<OutputView<'_>, MeasureError> {
    let e = |e: crate::runtime::BufferError| internal(e.to_string());
    Ok(match b.dtype() {
        DType::F32 => OutputView::F32(b.as_slice().map_err(e)?),
        DType::F64 => OutputView::F64(b.as_slice().map_err(e)?),
        DType::I32 => OutputView::I32(b.as_slice().map_err(e)?),
        DType::BF16 => OutputView::BF16(b.as_slice().map_err(e)?),
        d => return Err(internal(format!("cannot check outputs of dtype {d:?}"))),
    })
}

/// Times `k` on the given arguments: `warmup` runs, then `repeat` timings of `number` runs
/// each, `number` grown (by at least 1.6x, like TVM's runner) until a timing lasts
/// `min_repeat_ms`. Where [`MeasureOptions::flush_cache`] applies to the buffers' bytes,
/// every timed run starts with them evicted from the caches, and a timing is the sum of its
/// runs without the evictions; `number` is then grown until a timing lasts `min_repeat_ms`
/// evictions included, so that a measurement takes the wall time the isolating parent
/// allows a fast candidate (evicting 128 MiB can take longer than the kernel that reads it,
/// and a deadline that ignored it cut good candidates short as hopeless).
pub fn time_kernel(
    k: &Kernel,
    rt: &Runtime,
    inputs: &[&AlignedBuffer],
    outputs: &mut [&mut AlignedBuffer],
    opts: &MeasureOptions,
) -> MeasureResult {
    let ptrs = k
        .prepare(inputs, outputs)
        .map_err(|e| MeasureError::new(MeasureErrorKind::Runtime, e.to_string()))?;
    let sizes: Vec<usize> = inputs
        .iter()
        .map(|b| b.byte_len())
        .chain(outputs.iter().map(|b| b.byte_len()))
        .collect();
    let ranges: Vec<(*const u8, usize)> = ptrs.iter().map(|p| *p as *const u8).zip(sizes).collect();
    let flush = opts
        .flush_cache
        .applies(ranges.iter().map(|&(_, n)| n).sum());
    let call = || -> Result<(), MeasureError> {
        // SAFETY: `prepare` checked every argument; the buffers outlive this closure.
        let code = unsafe { k.call_raw(&ptrs, rt) };
        k.status(code)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Runtime, e.to_string()))
    };
    // The runs' time, and the wall time they took (the evictions included).
    let run = |n: u64| -> Result<(f64, f64), MeasureError> {
        if flush {
            let wall = Instant::now();
            let mut total = 0.0;
            for _ in 0..n {
                flush_ranges(&ranges);
                let t0 = Instant::now();
                call()?;
                total += t0.elapsed().as_secs_f64();
            }
            return Ok((total, wall.elapsed().as_secs_f64()));
        }
        let t0 = Instant::now();
        for _ in 0..n {
            call()?;
        }
        let t = t0.elapsed().as_secs_f64();
        Ok((t, t))
    };
    // The first warm-up run is timed: a hopeless candidate stops there.
    for w in 0..opts.warmup.max(opts.cutoff_s.is_some() as usize) {
        let (t, _) = run(1)?;
        if w == 0 && opts.cutoff_s.is_some_and(|c| t > c) {
            let mut timing =
                Timing::from_repeats(vec![t], 1).ok_or_else(|| internal("no timings".into()))?;
            timing.cut_short = true;
            return Ok(timing);
        }
    }
    let min_s = opts.min_repeat_ms / 1e3;
    let mut number: u64 = 1;
    loop {
        let (_, wall) = run(number)?;
        if wall >= min_s || number >= 1 << 30 {
            break;
        }
        let per_run = (wall / number as f64).max(1e-9);
        let need = (min_s / per_run * 1.05).ceil() as u64;
        number = need.max(number + number * 3 / 5 + 1).min(1 << 30);
    }
    // At most 10^6 timings: a `repeat` near `usize::MAX` would not fit in memory (and would
    // not finish); the CLI allows far fewer.
    let repeat = opts.repeat.clamp(1, 1_000_000);
    let mut repeats = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        repeats.push(run(number)?.0 / number as f64);
    }
    Timing::from_repeats(repeats, number).ok_or_else(|| internal("no timings".into()))
}
