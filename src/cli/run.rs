//! `tensortune run`: compile a workload (its best record with `--db`, else its default
//! schedule), run it, report latency.
//!
//! With `--inputs a.npy,b.npy` the inputs are read from `.npy` files in the op's input order
//! (their dtype and shape must match the op's); otherwise they are random from a fixed seed.
//! With `--output out.npy` the (first) output is written as `.npy`.

use super::{check_count, check_real, resolve_threads, CliError, MAX_SECONDS};
use crate::codegen::HostTarget;
use crate::measure::{random_inputs, time_kernel, MeasureOptions};
use crate::runtime::{AlignedBuffer, CacheFlush, Runtime};
use crate::Kernel;
use ndarray::{ArrayD, IxDyn};
use std::io::Write;
use std::path::{Path, PathBuf};
use tensortune_schedules::data::{Data, NdData};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::{CudaKey, TargetKey};
use tensortune_schedules::{ComputeDag, DType};

/// Arguments of `tensortune run`.
#[derive(Clone, Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tensortune run --workload matmul:M=512,N=512,K=512\n  tensortune run --workload matmul:M=512,N=512,K=512 --db tuning.db --threads 0 --json\n  tensortune run --workload matmul:M=2,N=2,K=2 --inputs a.npy,b.npy --output c.npy"
)]
pub struct RunArgs {
    /// The workload, e.g. `matmul:M=512,N=512,K=512`.
    #[arg(long, value_name = "SPEC")]
    pub workload: String,
    /// Input `.npy` files, comma-separated, in the op's input order.
    #[arg(long, value_name = "A.npy,B.npy", value_delimiter = ',')]
    pub inputs: Vec<PathBuf>,
    /// Write the output to this `.npy` file.
    #[arg(long, value_name = "OUT.npy")]
    pub output: Option<PathBuf>,
    /// Threads for parallel loops (0: every core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Target: `llvm` (the host CPU with `--threads`) or `cuda` / `cuda -arch=sm_XY` (an
    /// NVIDIA GPU through the CUDA driver: the best record of the cuda key with `--db`, else
    /// the default GPU schedule; its output is checked against the reference before it is
    /// timed).
    #[arg(long, default_value = "llvm")]
    pub target: String,
    /// Timings to take the median of.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Minimum length of one timing, in milliseconds.
    #[arg(long, default_value_t = 100.0)]
    pub min_repeat_ms: f64,
    /// When the buffers are evicted from the CPU caches before each timed run: `past-llc`
    /// (when together they are larger than the last-level cache, at most 32 MiB of it, so
    /// later runs cannot find part of them still cached), `never` or `always`.
    #[arg(long, default_value = "past-llc", value_parser = ["never", "past-llc", "always"])]
    pub flush_cache: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Run the best record of this records database for the workload and this CPU, when it
    /// has one (else the default schedule).
    #[arg(long, value_name = "DB")]
    pub db: Option<PathBuf>,
    /// Give up (exit 2) when compiling, checking and timing the kernel takes longer than
    /// this many seconds: a schedule that hangs ends instead of blocking the shell.
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    pub timeout: f64,
}

/// What one `run` measured, for printing.
struct RunResult {
    canonical: String,
    target: String,
    threads: usize,
    source: &'static str,
    timing: tensortune_tuner::measure::Timing,
    gflops: f64,
}

/// The best recorded schedule of `spec` for `target` in `db`, if any replays; else the default.
fn schedule_from(
    db: Option<&Path>,
    spec: &WorkloadSpec,
    dag: &ComputeDag,
    target: &str,
    default: impl FnOnce() -> State,
) -> Result<(State, &'static str), CliError> {
    if let Some(path) = db {
        let db = tensortune_records::Database::open_read_only(path)?;
        let on_cpu = target
            .parse::<tensortune_schedules::target::TargetKey>()
            .is_ok_and(|k| k.kind() == tensortune_schedules::target::TargetKind::Cpu);
        // Every record, fastest first, as `codegen` and `Kernel::from_records` choose.
        for r in db.best_k(&spec.canonical(), target, usize::MAX)? {
            match tensortune_schedules::trace::Trace::from_json(&r.trace_json)
                .and_then(|t| t.replay(dag))
            {
                Ok(s) => {
                    let gpu_only = on_cpu
                        .then(|| tensortune_schedules::lower::lower(&s).ok())
                        .flatten()
                        .and_then(|f| crate::build::gpu_only(&f.body));
                    match gpu_only {
                        Some(what) => log::warn!(
                            "skipping a record whose program holds {what}, which cannot run on the CPU"
                        ),
                        None => return Ok((s, "best record")),
                    }
                }
                Err(e) => log::warn!("skipping a record that does not replay: {e}"),
            }
        }
    }
    Ok((default(), "default schedule"))
}

pub(crate) fn parse_workload(spec: &str) -> Result<(WorkloadSpec, ComputeDag), CliError> {
    // The error quotes the spec: a line break in it must not break the one-line message.
    let usage = |e: String| CliError::Usage(e.replace('\n', "\\n").replace('\r', "\\r"));
    let w = WorkloadSpec::parse(spec).map_err(|e| usage(e.to_string()))?;
    let dag = w.build().map_err(|e| usage(e.to_string()))?;
    Ok((w, dag))
}

/// Runs `tensortune run`.
///
/// The kernel runs on a thread of its own and the caller waits at most `--timeout`: a hung
/// kernel cannot be stopped from inside the process, so on a timeout this returns the error
/// and the thread is left to end with the process (the binary exits right after).
pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<(), CliError> {
    parse_workload(&args.workload)?;
    let threads = resolve_threads("--threads", args.threads)?;
    check_count("--repeat", args.repeat, 1, 100_000)?;
    // A minute per timing is far past any use; `inf` would time forever.
    check_real("--min-repeat-ms", args.min_repeat_ms, 0.0, 60_000.0)?;
    let timeout = check_real("--timeout", args.timeout, 0.001, MAX_SECONDS)?;
    if let Some(o) = &args.output {
        let inputs: Vec<(&str, &Path)> = args
            .inputs
            .iter()
            .map(|p| ("--inputs", p.as_path()))
            .chain(args.db.iter().map(|p| ("--db", p.as_path())))
            .collect();
        super::output::refuse_clobbering(&inputs, &[("--output", o)])?;
    }
    let cuda = match args.target.parse::<TargetKey>() {
        Ok(TargetKey::Cuda(k)) => Some(k),
        Err(e) if args.target.trim_start().starts_with("cuda") => {
            return Err(CliError::Usage(e.to_string()))
        }
        _ => None,
    };
    // A CPU key may state its threads (`llvm -threads=4`); else `--threads` counts.
    let threads = match &cuda {
        Some(_) => threads,
        None => super::parse_cpu_target(&args.target, threads)?.threads(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let job = args.clone();
    std::thread::Builder::new()
        .name("tensortune-run".into())
        // Lowering and code generation recurse once per loop and expression level: the
        // stack of the main thread that every other command lowers on (8 MiB), not a spawned
        // thread's default 2 MiB.
        .stack_size(8 << 20)
        .spawn(move || {
            // The receiver is gone only after a timeout, when nobody waits for the result.
            let _ = tx.send(match &cuda {
                Some(key) => measure_cuda(&job, key),
                None => measure(&job, threads),
            });
        })
        .map_err(|e| CliError::Internal(format!("cannot start the run's thread: {e}")))?;
    let result = match rx.recv_timeout(std::time::Duration::from_secs_f64(timeout)) {
        Ok(result) => result?,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            return Err(CliError::Usage(format!(
                "the kernel did not finish within --timeout {timeout} s"
            )))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            return Err(CliError::Internal(
                "the run's thread ended without a result".into(),
            ))
        }
    };
    print_result(&result, args.json, out)
}

/// Compiles, checks the memory, makes the inputs, times the kernel, writes `--output`.
fn measure(args: &RunArgs, threads: usize) -> Result<RunResult, CliError> {
    let (spec, dag) = parse_workload(&args.workload)?;
    let target = HostTarget::host().key(threads);
    let (state, source) = schedule_from(args.db.as_deref(), &spec, &dag, &target, || {
        crate::build::default_cpu_state(&dag, threads)
    })?;
    let kernel = Kernel::from_state(&state, &Default::default())
        .map_err(|e| CliError::Internal(e.to_string()))?;
    crate::measure::check_memory(&dag).map_err(|e| CliError::Usage(e.to_string()))?;
    let inputs = if args.inputs.is_empty() {
        random_inputs(&dag, 0).map_err(|e| CliError::Usage(e.message))?
    } else {
        read_inputs(&kernel.inputs().collect::<Vec<_>>(), &args.inputs)?
    };
    // Out of memory is the workload's size, which the user chose: a usage error.
    let ins = inputs
        .iter()
        .map(AlignedBuffer::from_nd)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let mut outs = kernel
        .outputs()
        .map(|p| AlignedBuffer::zeros(&p.shape, p.dtype))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let rt = Runtime::new(threads).map_err(|e| CliError::Internal(e.to_string()))?;
    let opts = MeasureOptions {
        repeat: args.repeat.max(1),
        min_repeat_ms: args.min_repeat_ms.max(0.0),
        threads,
        flush_cache: CacheFlush::parse(&args.flush_cache).unwrap_or_default(),
        ..MeasureOptions::default()
    };
    let in_refs: Vec<&AlignedBuffer> = ins.iter().collect();
    let timing = {
        let mut out_refs: Vec<&mut AlignedBuffer> = outs.iter_mut().collect();
        time_kernel(&kernel, &rt, &in_refs, &mut out_refs, &opts)
            .map_err(|e| CliError::Internal(e.to_string()))?
    };
    if let Some(path) = &args.output {
        let first = outs
            .first()
            .ok_or_else(|| CliError::Internal("the workload has no output".into()))?;
        write_output(first, path)?;
    }
    Ok(RunResult {
        canonical: spec.canonical(),
        target,
        threads,
        source,
        gflops: spec.flops() / timing.median_s / 1e9,
        timing,
    })
}

/// [`measure`] on a GPU: the program compiled to PTX and run by the CUDA worker, its first
/// run's outputs checked against the reference, then timed with CUDA events.
fn measure_cuda(args: &RunArgs, key: &CudaKey) -> Result<RunResult, CliError> {
    use crate::backend::cuda::GpuTimingOptions;
    use crate::backend::Backend;
    use crate::measure::reference::{OutputView, Reference};
    let (spec, dag) = parse_workload(&args.workload)?;
    let backend = super::tune::cuda_backend(
        key,
        "run on",
        " (`codegen --target cuda` makes the PTX without a GPU)",
    )?;
    let target = backend.target_key().to_string();
    let (state, source) = schedule_from(args.db.as_deref(), &spec, &dag, &target, || {
        tensortune_tuner::sketch::rules::default_schedule(&dag, backend.desc()).0
    })?;
    let func = tensortune_schedules::lower::lower(&state)
        .map_err(|e| CliError::Internal(e.to_string()))?;
    let artifact = backend
        .compile(&func)
        .map_err(|e| CliError::Internal(e.to_string()))?;
    crate::measure::check_memory(&dag).map_err(|e| CliError::Usage(e.to_string()))?;
    let program = crate::gpu::GpuProgram::from_lowered(&func, String::new())
        .map_err(|e| CliError::Internal(e.to_string()))?;
    let inputs = if args.inputs.is_empty() {
        random_inputs(&dag, 0).map_err(|e| CliError::Usage(e.message))?
    } else {
        let params: Vec<crate::ParamSpec> = program
            .inputs()
            .map(|p| crate::ParamSpec {
                name: p.name.clone(),
                shape: p.shape.clone(),
                dtype: p.dtype,
                output: false,
            })
            .collect();
        read_inputs(&params.iter().collect::<Vec<_>>(), &args.inputs)?
    };
    let opts = GpuTimingOptions {
        repeat: args.repeat.max(1),
        min_repeat_ms: args.min_repeat_ms.max(0.0),
        ..GpuTimingOptions::for_purpose(crate::backend::Purpose::Final, backend.desc())
    };
    let run = backend
        .run_artifact(&artifact, &inputs, &opts)
        .map_err(|e| CliError::Internal(e.to_string()))?;
    let check = MeasureOptions::default().check_options();
    let reference =
        Reference::new(&dag, &inputs, &check).map_err(|e| CliError::Internal(e.to_string()))?;
    let views: Vec<OutputView<'_>> = run.outputs.iter().map(OutputView::of_nd).collect();
    reference
        .check(&views)
        .map_err(|e| CliError::Internal(format!("the GPU kernel's output is wrong: {e}")))?;
    let timing = tensortune_tuner::measure::Timing::from_repeats(run.times_s.clone(), run.number)
        .ok_or_else(|| CliError::Internal("the GPU run reported no timings".into()))?;
    if let Some(path) = &args.output {
        let first = run
            .outputs
            .first()
            .ok_or_else(|| CliError::Internal("the workload has no output".into()))?;
        let b = AlignedBuffer::from_nd(first).map_err(|e| CliError::Usage(e.to_string()))?;
        write_output(&b, path)?;
    }
    Ok(RunResult {
        canonical: spec.canonical(),
        target,
        threads: 1,
        source,
        gflops: spec.flops() / timing.median_s / 1e9,
        timing,
    })
}

fn print_result(r: &RunResult, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    let timing = &r.timing;
    if json {
        let v = serde_json::json!({
            "workload": r.canonical,
            "target": r.target,
            "threads": r.threads,
            "median_s": timing.median_s,
            "spread_s": timing.spread_s,
            "repeats": timing.repeats,
            "number": timing.number,
            "gflops": r.gflops,
            "schedule": r.source,
        });
        writeln!(out, "{v}").map_err(io)?;
    } else {
        writeln!(out, "workload  {}", r.canonical).map_err(io)?;
        writeln!(out, "target    {}", r.target).map_err(io)?;
        writeln!(out, "schedule  {}", r.source).map_err(io)?;
        writeln!(
            out,
            "latency   {:.4} ms (median of {} timings of {} runs, spread {:.4} ms)",
            timing.median_s * 1e3,
            timing.repeats.len(),
            timing.number,
            timing.spread_s * 1e3
        )
        .map_err(io)?;
        writeln!(out, "GFLOP/s   {:.2}", r.gflops).map_err(io)?;
    }
    Ok(())
}

fn read_inputs(params: &[&crate::ParamSpec], paths: &[PathBuf]) -> Result<Vec<NdData>, CliError> {
    if params.len() != paths.len() {
        return Err(CliError::Usage(format!(
            "the workload takes {} inputs ({}), got {} files",
            params.len(),
            params
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            paths.len()
        )));
    }
    let mut out = Vec::with_capacity(paths.len());
    for (p, path) in params.iter().zip(paths) {
        let bad = |e: String| CliError::Usage(format!("{}: {e}", path.display()));
        // An I/O error names the file itself; a format error gets the file's name here.
        let npy_err = |e: crate::npy::NpyError| match e {
            crate::npy::NpyError::Io { .. } => CliError::Usage(e.to_string()),
            e => bad(e.to_string()),
        };
        let (shape, data) = match p.dtype {
            DType::F32 => {
                let a: ArrayD<f32> = crate::npy::read(path).map_err(npy_err)?;
                (a.shape().to_vec(), Data::F32(a.iter().copied().collect()))
            }
            DType::F64 => {
                let a: ArrayD<f64> = crate::npy::read(path).map_err(npy_err)?;
                (a.shape().to_vec(), Data::F64(a.iter().copied().collect()))
            }
            DType::I32 => {
                let a: ArrayD<i32> = crate::npy::read(path).map_err(npy_err)?;
                (a.shape().to_vec(), Data::I32(a.iter().copied().collect()))
            }
            DType::BF16 => {
                // numpy has no bf16: a bf16 input is given as f32 and rounded to nearest.
                let a: ArrayD<f32> = crate::npy::read(path).map_err(npy_err)?;
                let bits = a
                    .iter()
                    .map(|&x| tensortune_schedules::data::f32_to_bf16(x));
                (a.shape().to_vec(), Data::BF16(bits.collect()))
            }
            d => {
                return Err(CliError::Internal(format!(
                    "input `{}` of dtype {d}",
                    p.name
                )))
            }
        };
        let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        if shape != p.shape {
            return Err(bad(format!(
                "input `{}` must have shape {:?}, the file has {:?}",
                p.name, p.shape, shape
            )));
        }
        out.push(NdData::new(shape, data).ok_or_else(|| bad("element count".into()))?);
    }
    Ok(out)
}

/// `.npy` through a temporary file renamed into place.
pub(crate) fn write_npy_atomic<T: ndarray_npy::WritableElement>(
    path: &Path,
    a: &ArrayD<T>,
) -> Result<(), CliError> {
    use ndarray_npy::WriteNpyExt;
    tensortune_records::write_atomic(path, |w| a.write_npy(w).map_err(std::io::Error::other))
        .map_err(|e| super::output::io_error(path, &e))
}

fn write_output(b: &AlignedBuffer, path: &Path) -> Result<(), CliError> {
    let shape: Vec<usize> = b.shape().iter().map(|&d| d as usize).collect();
    let internal = |e: String| CliError::Internal(e);
    match b.dtype() {
        DType::F32 => {
            let v = b
                .as_slice::<f32>()
                .map_err(|e| internal(e.to_string()))?
                .to_vec();
            let a =
                ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| internal(e.to_string()))?;
            write_npy_atomic(path, &a)
        }
        DType::F64 => {
            let v = b
                .as_slice::<f64>()
                .map_err(|e| internal(e.to_string()))?
                .to_vec();
            let a =
                ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| internal(e.to_string()))?;
            write_npy_atomic(path, &a)
        }
        DType::I32 => {
            let v = b
                .as_slice::<i32>()
                .map_err(|e| internal(e.to_string()))?
                .to_vec();
            let a =
                ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| internal(e.to_string()))?;
            write_npy_atomic(path, &a)
        }
        d => Err(internal(format!("output of dtype {d}"))),
    }
}
