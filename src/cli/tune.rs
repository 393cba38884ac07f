//! `tensortune tune`: tune workloads on the host CPU, or an NVIDIA GPU (`--target cuda`), into a
//! records database; `--target cuda --dry-run` checks GPU candidates without a GPU.

use super::run::parse_workload;
use super::{check_count, check_real, resolve_threads, CliError, MAX_SECONDS};
use crate::backend::cuda::{CudaBackend, GpuDevice, WorkerDevice};
use crate::backend::Backend;
use crate::tune::{tune_dags, TuneError};
use std::io::Write;
use std::path::PathBuf;
use tensortune_schedules::target::{CudaKey, TargetKey};
use tensortune_tuner::scheduler::Policy;
use tensortune_tuner::TuneOptions;

/// Arguments of `tensortune tune`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Examples:\n  tensortune tune --workload matmul:M=512,N=512,K=512 --trials 64 --db tuning.db\n  tensortune tune --workload dense_bias_relu:M=64,N=256,K=512@2 --workload dense_bias_relu:M=64,N=10,K=256 --trials 128 --db mlp.db --json"
)]
pub struct TuneArgs {
    /// A workload to tune, optionally with a weight (how often it runs): `SPEC[@WEIGHT]`.
    /// Repeat the flag to tune several together.
    #[arg(
        long = "workload",
        value_name = "SPEC[@WEIGHT]",
        required_unless_present = "plan",
        conflicts_with = "plan"
    )]
    pub workloads: Vec<String>,
    /// Tune the tasks of a plan file (`tensortune plan`) with its target, seed and trials,
    /// instead of `--workload`s.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["target", "trials", "seed"])]
    pub plan: Option<PathBuf>,
    /// With `--plan`: tune only shard I of N (`0/4`...). `auto/N` takes I from the job
    /// array (`SLURM_ARRAY_TASK_ID`) or the Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`).
    #[arg(long, value_name = "I/N", requires = "plan")]
    pub shard: Option<String>,
    /// Target: `llvm` (the host CPU), or `cuda` / `cuda -arch=sm_XY` (an NVIDIA GPU through
    /// the CUDA driver; see `--dry-run` for a machine without one).
    #[arg(long, default_value = "llvm")]
    pub target: String,
    /// With a `cuda` target: no GPU and no database. Draw `--trials` candidates from the GPU
    /// sketches, check them with the GPU verifier, make their PTX (assembled by `ptxas`
    /// where one is found: `PTXAS`, the PATH, or the nvidia-cuda-nvcc-cu12 wheel), and run
    /// those of small workloads in the lockstep GPU interpreter against the reference.
    #[arg(long)]
    pub dry_run: bool,
    /// Candidates to measure in all.
    #[arg(long, default_value_t = 64)]
    pub trials: usize,
    /// The records database, a SQLite file or a `postgres://user@host/dbname` URL (created
    /// if missing; a run on an existing one resumes).
    #[arg(long, value_name = "DB", default_value = "tuning.db")]
    pub db: PathBuf,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads for parallel loops (1: serial kernels; 0: every core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// When each measurement first evicts the kernel's buffers from the CPU caches:
    /// `past-llc` (when together they are larger than the last-level cache: the kernel as it
    /// runs in a loop of its own), `always` (as a weight-heavy layer runs inside a network,
    /// its weights read from memory) or `never`. Not part of the target key: keep records
    /// measured one way in a database of their own.
    #[arg(long, default_value = "past-llc", value_parser = ["never", "past-llc", "always"])]
    pub flush_cache: String,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub time_budget: Option<f64>,
    /// Stop a workload after this many trials without improvement.
    #[arg(long, value_name = "TRIALS")]
    pub early_stop: Option<usize>,
    /// Candidates measured per round.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Programs per generation of the evolutionary search.
    #[arg(long, default_value_t = TuneOptions::default().population)]
    pub population: usize,
    /// Leave out programs whose unrolled loops copy out more statements than this (0: no
    /// limit); they are slow to compile and slow to run.
    #[arg(long, value_name = "N", default_value_t = TuneOptions::default().max_unrolled_statements.unwrap_or(0))]
    pub max_unrolled_statements: i64,
    /// How rounds are given to workloads tuned together: `gradient` (the largest expected
    /// reduction of total weighted latency) or `round-robin`.
    #[arg(long, value_name = "POLICY", default_value = "gradient",
          value_parser = clap::builder::PossibleValuesParser::new(["gradient", "round-robin"]))]
    pub task_scheduler: String,
    /// Start the cost model from this file (`tensortune model train --out`) instead of from
    /// the records of other workloads in the database.
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Start the cost model untrained, even where the database holds records of other
    /// workloads on the same target (by default a model trained on those starts the search).
    #[arg(long, conflicts_with = "model")]
    pub cold: bool,
    /// End stdout with one JSON object per workload.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(long)]
    pub quiet: bool,
}

pub(super) fn parse_weighted(s: &str) -> Result<(String, f64), CliError> {
    match s.rsplit_once('@') {
        Some((spec, w)) => {
            let w: f64 = w
                .parse()
                .ok()
                .filter(|w: &f64| w.is_finite() && *w > 0.0)
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "bad weight `{w}` in `{s}`: expected a positive number"
                    ))
                })?;
            Ok((spec.to_string(), w))
        }
        None => Ok((s.to_string(), 1.0)),
    }
}

/// Per task, the trials its target already has in the database at `db` and the best latency
/// among them: what the run resumes from (none when the file, or the server's tables, do not
/// exist yet).
fn resume_points(
    db: &std::path::Path,
    tasks: &[(String, tensortune_schedules::ComputeDag, f64)],
    target: &str,
) -> Result<Vec<(usize, Option<f64>)>, CliError> {
    let fresh = Ok(vec![(0, None); tasks.len()]);
    if !tensortune_records::is_server(db) && !db.exists() {
        return fresh;
    }
    let db = match tensortune_records::Database::open_read_only(db) {
        // An empty file is one another worker has just created (it sets the tables up a
        // moment later) or one a failed creation left: tuning sets it up as a new database.
        Err(
            tensortune_records::RecordsError::Missing { .. }
            | tensortune_records::RecordsError::Empty { .. },
        ) => return fresh,
        r => r?,
    };
    tasks
        .iter()
        .map(|(key, _, _)| {
            let trials = db.records(key, target)?.len();
            let best = db
                .best(key, target)?
                .and_then(|r| r.outcome.timing().map(|t| t.median_s));
            Ok((trials, best))
        })
        .collect()
}

/// The failed records of `workload` on `target` in the database at `db` (this run's and
/// earlier ones), counted by error kind (`compile`, `runtime`, `timeout`, `wrong_result`,
/// `other`); `None` where the database cannot be read. A `wrong_result` of a program the
/// verifier passed is what a code generation bug looks like, so scripts look at it.
fn failed_records(
    db: &std::path::Path,
    workload: &str,
    target: &str,
) -> Option<std::collections::BTreeMap<&'static str, usize>> {
    let db = tensortune_records::Database::open_read_only(db).ok()?;
    let mut counts = std::collections::BTreeMap::new();
    for r in db.records(workload, target).ok()? {
        if let tensortune_records::Outcome::Failed { kind, .. } = r.outcome {
            *counts.entry(kind.as_str()).or_insert(0) += 1;
        }
    }
    Some(counts)
}

/// Runs `tensortune tune`.
pub fn tune(args: &TuneArgs, out: &mut dyn Write) -> Result<(), CliError> {
    match &args.plan {
        Some(file) => super::plan::tune_plan(args, file, out),
        None => tune_with(args, None, out),
    }
}

/// Tunes the `--workload`s of `args`; `plan` is the plan and shard the run is part of.
pub(super) fn tune_with(
    args: &TuneArgs,
    plan: Option<tensortune_records::RunPlan>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mut tasks = Vec::new();
    for w in &args.workloads {
        let (spec, weight) = parse_weighted(w)?;
        let (ws, dag) = parse_workload(&spec)?;
        tasks.push((ws.canonical(), dag, weight));
    }
    tune_tasks(args, tasks, plan, out)
}

/// Tunes `tasks` (key, DAG, weight) with the options of `args` (its workloads aside).
pub(super) fn tune_tasks(
    args: &TuneArgs,
    tasks: Vec<(String, tensortune_schedules::ComputeDag, f64)>,
    plan: Option<tensortune_records::RunPlan>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    check_count("--trials", args.trials, 1, 100_000_000)?;
    let threads = resolve_threads("--threads", args.threads)?;
    check_count("--batch-size", args.batch_size, 1, 1_000_000)?;
    check_count("--population", args.population, 1, 10_000_000)?;
    if let Some(t) = args.time_budget {
        check_real("--time-budget", t, 0.0, MAX_SECONDS)?;
    }
    let cuda = match args.target.parse::<TargetKey>() {
        Ok(TargetKey::Cuda(k)) => Some(k),
        // A cuda key that does not parse: the key parser's own message names the bad option.
        Err(e) if args.target.trim_start().starts_with("cuda") => {
            return Err(CliError::Usage(e.to_string()))
        }
        _ => None,
    };
    if args.dry_run && cuda.is_none() {
        return Err(CliError::Usage(format!(
            "--dry-run is for cuda targets, not `{}`",
            tensortune_schedules::text::single_line(&args.target)
        )));
    }
    if args.max_unrolled_statements < 0 {
        return Err(CliError::Usage(format!(
            "--max-unrolled-statements must be 0 (no limit) or positive, not {}",
            args.max_unrolled_statements
        )));
    }
    let task_scheduler = Policy::parse(&args.task_scheduler).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown --task-scheduler `{}`: gradient or round-robin",
            args.task_scheduler
        ))
    })?;
    let opts = TuneOptions {
        trials: args.trials,
        batch_size: args.batch_size.max(1),
        population: args.population.max(1),
        max_unrolled_statements: (args.max_unrolled_statements > 0)
            .then_some(args.max_unrolled_statements),
        seed: args.seed,
        threads,
        time_budget_s: args.time_budget,
        early_stop: args.early_stop,
        quiet: args.quiet,
        db: Some(args.db.clone()),
        task_scheduler,
        model_file: args.model.clone(),
        warm_start: !args.cold,
        plan,
        ..TuneOptions::default()
    };
    match cuda {
        Some(key) if args.dry_run => super::gpu_dry_run::dry_run(args, &key, &tasks, &opts, out),
        Some(key) => {
            let backend = cuda_backend(
                &key,
                "tune for",
                " (`--dry-run` makes and checks the PTX without a GPU)",
            )?;
            tune_on(args, tasks, &opts, &backend, out)
        }
        None => {
            let flush = crate::runtime::CacheFlush::parse(&args.flush_cache).unwrap_or_default();
            let target = super::parse_cpu_target(&args.target, threads)?.with_cache_flush(flush);
            tune_on(args, tasks, &opts, &target, out)
        }
    }
}

/// The CUDA backend of `key` on this machine's GPU, through a worker process; a usage error
/// (exit 2, one line, "cannot `doing` KEY: why (hint)") where there is no CUDA driver or
/// no GPU.
pub(crate) fn cuda_backend(
    key: &CudaKey,
    doing: &str,
    hint: &str,
) -> Result<CudaBackend, CliError> {
    let shown = TargetKey::Cuda(key.clone()).to_string();
    let usage = |why: String| CliError::Usage(format!("cannot {doing} `{shown}`: {why}{hint}"));
    crate::gpu::driver::driver_available().map_err(|e| usage(e.to_string()))?;
    let cmd = crate::gpu::WorkerCommand::resolve().map_err(|e| usage(e.to_string()))?;
    let device = WorkerDevice::start(cmd).map_err(|e| usage(e.to_string()))?;
    log::info!(
        target: crate::tune::PROGRESS_LOG_TARGET,
        "tensortune: tuning on {} ({})",
        device.name(),
        device.desc().arch
    );
    CudaBackend::with_device(key, Box::new(device)).map_err(|e| usage(e.to_string()))
}

/// Tunes `tasks` on `backend` and reports: the part of `tensortune tune` every target shares.
fn tune_on<B: Backend>(
    args: &TuneArgs,
    tasks: Vec<(String, tensortune_schedules::ComputeDag, f64)>,
    opts: &TuneOptions,
    backend: &B,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let key = backend.target_key().to_string();
    let earlier = resume_points(&args.db, &tasks, &key)?;
    if !args.quiet {
        for (key, (trials, best)) in tasks.iter().map(|t| &t.0).zip(&earlier) {
            if *trials > 0 {
                let best = best.map_or("no valid program".to_string(), |b| {
                    format!("best stored {}", super::records::format_seconds(b))
                });
                // A progress line: shown unless `-q` (or RUST_LOG) silences progress.
                log::info!(
                    target: crate::tune::PROGRESS_LOG_TARGET,
                    "tensortune: resuming {key}: {trials} trial(s) already in {}, {best}",
                    tensortune_records::redacted(&args.db)
                );
            }
        }
    }
    let reports = tune_dags(tasks, backend, opts).map_err(|e| match e {
        TuneError::Records(r) if r.is_user_error() => CliError::Usage(r.to_string()),
        // Met while the run was under way (a disk that filled, a lock held too long): the
        // same user's error as at the start.
        TuneError::Tuner(tensortune_tuner::tuning::TuneError::Records(r)) if r.is_user_error() => {
            CliError::Usage(r.to_string())
        }
        // The host could not measure at all (no process or descriptor to be had): the
        // environment's failure, said as it is.
        TuneError::Tuner(e @ tensortune_tuner::tuning::TuneError::Measurer(_)) => {
            CliError::Usage(e.to_string())
        }
        TuneError::Spec(s) => CliError::Usage(s.to_string()),
        TuneError::ModelFile(m) => CliError::Usage(format!("--model: {m}")),
        TuneError::Target(t) => CliError::Usage(t.to_string()),
        e => CliError::Internal(e.to_string()),
    })?;
    let io = |e: std::io::Error| CliError::Internal(e.to_string());
    if !args.json {
        for r in &reports {
            match (r.best_latency_s, r.best_gflops) {
                (Some(l), Some(g)) => {
                    // A memory-bound op is judged by the bytes it moves, not its flops.
                    let gbs = match r.best_gbs {
                        Some(b) if r.memory_bound() => format!(", {b:.1} GB/s"),
                        _ => String::new(),
                    };
                    writeln!(
                        out,
                        "{}: best {} ({:.1} GFLOP/s{gbs}), {} trials ({} failed, {} cut short), re-measured; during tuning {}",
                        r.workload,
                        super::records::format_seconds(l),
                        g,
                        r.trials,
                        r.errors,
                        r.cut_short,
                        super::records::format_seconds(r.tuning_latency_s.unwrap_or(l))
                    )
                    .map_err(io)?;
                    if let Some(line) = remeasure_line(r) {
                        writeln!(out, "  {line}").map_err(io)?;
                    }
                    if let Some(d) = r.default_latency_s.filter(|d| *d > 0.0) {
                        let verdict = if d >= l {
                            format!("{:.2}x faster after tuning", d / l)
                        } else {
                            format!(
                                "faster than tuning's best by {:.2}x: more trials, or keep the \
                                 default (no record)",
                                l / d
                            )
                        };
                        writeln!(
                            out,
                            "  the default schedule (no record) re-measured {}: {verdict}",
                            super::records::format_seconds(d)
                        )
                        .map_err(io)?;
                    }
                }
                _ => writeln!(
                    out,
                    "{}: no valid program in {} trials ({} failed)",
                    r.workload, r.trials, r.errors
                )
                .map_err(io)?,
            }
        }
        if let Some(r) = reports.first() {
            let p = &r.phases;
            // Outside running candidates: search, model, compiling, checking and records. The
            // first runs, whose outputs are checked, are the first warm-up runs: running.
            let running = p.run_s - p.check_s;
            let outside = p.total_s - running;
            writeln!(
                out,
                "tuning took {:.1} s ({:.2} s per trial): running candidates {:.1} s (first runs {:.1} s), checking them {:.1} s, compiling {:.1} s, search {:.1} s, model {:.1} s, records {:.2} s; {:.0}% outside running candidates",
                p.total_s,
                p.total_s / r.trials.max(1) as f64,
                running,
                p.first_run_s,
                p.check_s,
                p.compile_s,
                p.search_s,
                p.model_s,
                p.records_s,
                100.0 * outside / p.total_s.max(1e-9)
            )
            .map_err(io)?;
            writeln!(
                out,
                "records: {} (target `{}`)",
                tensortune_records::redacted(&args.db),
                r.target
            )
            .map_err(io)?;
        }
    } else {
        for (r, (trials, best)) in reports.iter().zip(&earlier) {
            let failed = failed_records(&args.db, &r.workload, &r.target);
            let j = serde_json::json!({
                "workload": r.workload,
                "resumed": {"trials": trials, "best_latency_s": best},
                "target": r.target,
                "trials": r.trials,
                "errors": r.errors,
                "cut_short": r.cut_short,
                "failed_records": failed,
                "best_latency_s": r.best_latency_s,
                "best_gflops": r.best_gflops,
                "best_gbs": r.best_gbs,
                "memory_bound": r.memory_bound(),
                "tuning_latency_s": r.tuning_latency_s,
                "remeasured": r.remeasured,
                "remeasured_best_rank": r.remeasured_best_rank(),
                "default_latency_s": r.default_latency_s,
                "warm_start": r.warm_start,
                "tuning_s": r.tuning_s,
                "db": tensortune_records::redacted(&args.db),
            });
            writeln!(out, "{j}").map_err(io)?;
        }
    }
    Ok(())
}

/// How the re-measured ranking compares with the tuning ranking, in one line: whether the
/// program tuning found fastest is still the fastest, and by how much the figures moved.
fn remeasure_line(r: &crate::tune::TuneReport) -> Option<String> {
    let rank = r.remeasured_best_rank()?;
    let n = r.remeasured.len();
    let ms = super::records::format_seconds;
    let first = r.remeasured.first()?;
    let first_now = first.latency_s.map_or("failed".to_string(), ms);
    // More rounds than the fewest were taken because the first ones disagreed: the host was
    // busy with other work for part of the re-measurement, which a user should know.
    let rounds = r.remeasured.iter().map(|p| p.rounds).max().unwrap_or(0);
    let extra = if rounds > crate::tune::REMEASURE_ROUNDS.0 {
        format!(
            " over {rounds} rounds (the first {} disagreed by more than 3%: other work on the host)",
            crate::tune::REMEASURE_ROUNDS.0
        )
    } else {
        String::new()
    };
    let line = if rank == 1 {
        format!(
            "re-measured the top {n}: tuning's best is still the best ({} during tuning, {first_now} re-measured)",
            ms(first.tuning_latency_s)
        )
    } else {
        let winner = r.remeasured.iter().find(|p| p.tuning_rank == rank)?;
        format!(
            "re-measured the top {n}: tuning's #{rank} is the best ({} during tuning, {} re-measured); tuning's best re-measured {first_now} ({} during tuning)",
            ms(winner.tuning_latency_s),
            winner.latency_s.map_or("failed".to_string(), ms),
            ms(first.tuning_latency_s)
        )
    };
    Some(line + &extra)
}

#[cfg(test)]
mod tests {
    use super::failed_records;
    use tensortune_records::{Database, ErrorKind, NewRecord, Workload};

    #[test]
    fn failed_records_are_counted_by_kind_for_the_workload_and_target() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f.db");
        assert_eq!(failed_records(&path, "w", "t"), None, "no database yet");
        let mut db = Database::open(&path).expect("open");
        let w = Workload::new("matmul:K=2,M=2,N=2,dtype=f32", 16.0);
        let failed = |target: &str, i: u32, kind| {
            NewRecord::failed(w.clone(), target, format!("[{i}]"), kind, "x")
        };
        let batch = [
            failed("cuda -arch=sm_90", 1, ErrorKind::WrongResult),
            failed("cuda -arch=sm_90", 2, ErrorKind::WrongResult),
            failed("cuda -arch=sm_90", 3, ErrorKind::Compile),
            failed("llvm", 4, ErrorKind::Timeout),
        ];
        db.insert_batch(None, &batch).expect("insert");
        drop(db);
        let got = failed_records(&path, &w.key, "cuda -arch=sm_90").expect("readable");
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            vec![("compile", 1), ("wrong_result", 2)]
        );
    }
}
