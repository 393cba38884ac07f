//! `tensortune workloads` (the op library) and `tensortune show` (a best schedule as a trace
//! and as its lowered loop nest; for a CUDA target also its launch and what the GPU verifier
//! counts of it).

use super::run::parse_workload;
use super::CliError;
use crate::tune::Target;
use std::io::Write;
use std::path::PathBuf;
use tensortune_records::Database;
use tensortune_schedules::gpu::launch_dims;
use tensortune_schedules::gpu::verify::verify_gpu;
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::OPS;
use tensortune_schedules::target::{CudaDesc, TargetKey};
use tensortune_schedules::trace::Trace;
use tensortune_schedules::ComputeDag;
use tensortune_tuner::sketch::rules::{default_schedule, DefaultGpuSchedule};

/// Arguments of `tensortune workloads`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  tensortune workloads")]
pub struct WorkloadsArgs {}

/// Arguments of `tensortune show`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tensortune show --db tuning.db --workload matmul:M=512,N=512,K=512\n  \
                  tensortune show --target cuda --workload matmul:M=512,N=512,K=512   \
                  (the default GPU schedule, its launch and resources)"
)]
pub struct ShowArgs {
    /// The records database (without it: the target's default schedule).
    #[arg(long, value_name = "DB")]
    pub db: Option<PathBuf>,
    /// The workload spec.
    #[arg(long, value_name = "SPEC")]
    pub workload: String,
    /// The target key (default: this CPU, one thread; `cuda` or `"cuda -arch=sm_86"` for an
    /// NVIDIA GPU).
    #[arg(long, value_name = "T")]
    pub target: Option<String>,
}

/// Lists the op library: name, keys with defaults, input order.
pub fn workloads(_args: &WorkloadsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let mut text = String::new();
    for op in OPS {
        let mut keys: Vec<String> = op.required.iter().map(|k| k.to_string()).collect();
        keys.extend(op.optional.iter().map(|(k, d)| format!("{k}={d}")));
        keys.push("dtype=f32".into());
        text.push_str(&format!(
            "{:<17} {:<40} {}\n",
            op.name,
            keys.join(","),
            op.signature
        ));
        text.push_str(&format!("{:<17} {}\n", "", op.about));
    }
    text.push_str(
        "\nspec: NAME:KEY=VALUE,...  e.g. conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1\n\
         dtype: f32 (default), f64 or i32 (softmax: floats); bf16 inputs for matmul, batch_matmul, dense_bias_relu (f32 out)\n",
    );
    out.write_all(text.as_bytes())
        .map_err(|e| CliError::Internal(e.to_string()))
}

/// Prints the best record of a workload (or, without `--db`, the target's default schedule)
/// as its trace and its lowered loop nest; for a CUDA target also the launch and the GPU
/// verifier's count of threads and memory.
pub fn show(args: &ShowArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (w, dag) = parse_workload(&args.workload)?;
    let mut target = args.target.clone().unwrap_or_else(|| Target::host(1).key());
    // A key that does not parse is still looked up as given (records are filed by text).
    let cuda = match target.parse::<TargetKey>() {
        Ok(TargetKey::Cuda(k)) => {
            target = super::codegen::cuda_record_key(&k);
            Some(super::codegen::cuda_desc(&k)?)
        }
        _ => None,
    };
    let key = w.canonical();
    let (headline, trace, func) = match &args.db {
        Some(path) => {
            let db = Database::open_read_only(path)?;
            // The fastest record that still replays, as `run` and `codegen` take it: one
            // from an older version that no longer does is skipped (said once, with the
            // first reason; where none replays the error says it instead).
            let mut shown = None;
            let mut skipped: Vec<(i64, CliError)> = Vec::new();
            for r in db.best_k(&key, &target, usize::MAX)? {
                match replay_and_lower(&dag, &r.trace_json) {
                    Ok(tf) => {
                        shown = Some((r, tf));
                        break;
                    }
                    Err(e) => skipped.push((r.id.0, e)),
                }
            }
            let first_skip = skipped.first().map(|(id, e)| {
                format!(
                    "{} faster record(s) do not replay (record {id}: {e})",
                    skipped.len()
                )
            });
            let Some((r, (trace, func))) = shown else {
                let have = db.targets_of(&key)?;
                return Err(CliError::Usage(format!(
                    "{}: no successful record of {key} for target `{target}` that replays{}{}",
                    path.display(),
                    first_skip.map_or(String::new(), |s| format!(": {s}")),
                    if have.is_empty() {
                        String::new()
                    } else {
                        format!("; it has records for: {}", have.join(" | "))
                    }
                )));
            };
            if let Some(s) = first_skip {
                log::warn!("{s}");
            }
            let t = r.outcome.timing().map(|t| t.median_s).unwrap_or(f64::NAN);
            let headline = format!(
                "{}, {:.1} GFLOP/s",
                super::records::format_seconds(t),
                r.gflops().unwrap_or(0.0)
            );
            (headline, trace, func)
        }
        None => {
            let (state, what) = match &cuda {
                Some(desc) => {
                    let (state, how) = default_schedule(&dag, desc);
                    let what = match how {
                        DefaultGpuSchedule::Sketch(name) => {
                            format!("the default GPU schedule (a draw of the sketch `{name}`)")
                        }
                        DefaultGpuSchedule::OneThread => {
                            "the default GPU schedule (one thread: no GPU sketch verified)".into()
                        }
                    };
                    (state, what)
                }
                None => {
                    let state = crate::build::default_cpu_state(
                        &dag,
                        target.parse::<TargetKey>().map_or(1, |k| k.threads()),
                    );
                    let what = if state.trace().steps.is_empty() {
                        "the default schedule (untuned: the op's loops as written)"
                    } else {
                        "the default schedule (untuned: the sketch draw the analytic estimate \
                         ranks best)"
                    };
                    (state, what.to_string())
                }
            };
            let func = lower(&state).map_err(|e| CliError::Internal(e.to_string()))?;
            (what, state.trace().clone(), func)
        }
    };
    let mut text = format!("{key} on {target}\n{headline}\n\ntrace:\n{trace}\nloop nest:\n{func}");
    if let Some(desc) = &cuda {
        text.push_str(&gpu_summary(&func, desc));
    }
    out.write_all(text.as_bytes())
        .map_err(|e| CliError::Internal(e.to_string()))
}

/// The launch of a GPU loop nest and what the GPU verifier counts of it on `desc`, as the
/// lines `show` ends with. A nest that does not verify says why instead of failing: `show`
/// is how one looks at such a record.
pub(crate) fn gpu_summary(func: &LoweredFunc, desc: &CudaDesc) -> String {
    let mut text = String::from("\nGPU:\n");
    match launch_dims(func) {
        Ok(l) => text.push_str(&format!(
            "launch: grid ({}, {}, {}) x block ({}, {}, {}): {} blocks of {} threads\n",
            l.grid[0],
            l.grid[1],
            l.grid[2],
            l.block[0],
            l.block[1],
            l.block[2],
            l.grid.iter().map(|&d| d as u64).product::<u64>(),
            l.threads_per_block()
        )),
        Err(e) => text.push_str(&format!("launch: none ({e})\n")),
    }
    match verify_gpu(func, desc) {
        Ok(u) => text.push_str(&format!(
            "{}: {} threads/block{}, {} bytes shared/block (limit {}), {} bytes local/thread\n",
            desc.arch,
            u.launch.threads_per_block(),
            if u.whole_warps {
                String::new()
            } else {
                format!(" (not a whole number of {}-thread warps)", desc.warp_size)
            },
            u.shared_bytes,
            desc.shared_memory_per_block,
            u.local_bytes
        )),
        Err(e) => text.push_str(&format!("{}: does not verify: {e}\n", desc.arch)),
    }
    text
}

/// A stored trace replayed on a workload's DAG, and the loop nest it lowers to: what `show`
/// prints and `report` shows for each best record.
pub(crate) fn replay_and_lower(
    dag: &ComputeDag,
    trace_json: &str,
) -> Result<(Trace, LoweredFunc), CliError> {
    let trace =
        Trace::from_json(trace_json).map_err(|e| CliError::Usage(format!("stored trace: {e}")))?;
    let state = trace
        .replay(dag)
        .map_err(|e| CliError::Usage(format!("stored trace does not replay: {e}")))?;
    let func = lower(&state).map_err(|e| CliError::Internal(e.to_string()))?;
    Ok((trace, func))
}
