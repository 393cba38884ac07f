//! `tune()`: the library's entry point for tuning, on any [`Backend`] (the host CPU is
//! [`Target`]).
//!
//! It wires the pieces: the tuner's search and loop with the backend's target description and
//! sketch rules, the backend's measurer, XGBoost's cost model, and the records database of
//! [`TuneOptions::db`]. At the end the best few programs are re-measured, interleaved (on the
//! CPU each in a fresh forked process), and the report gives the re-measured figure: a best
//! that only held up during tuning is not a best.

pub use crate::backend::cpu::tuning_measure_options;
use crate::backend::{Backend, Purpose};
pub use crate::target::{Target, UnknownTarget};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;
use tensortune_cost_model::{GbdtModel, GbdtOptions};
use tensortune_records::Database;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::trace::Trace;
use tensortune_schedules::ComputeDag;
use tensortune_tuner::tuning::{Observer, PhaseTimes, RoundInfo, Silent, TaskInput, Tuner};
use tensortune_tuner::TuneOptions;

/// Why tuning failed (failed candidates are not failures of the run).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuneError {
    /// An unknown target.
    #[error(transparent)]
    Target(#[from] UnknownTarget),
    /// A bad workload spec.
    #[error(transparent)]
    Spec(#[from] tensortune_schedules::ops::SpecError),
    /// The records database.
    #[error(transparent)]
    Records(#[from] tensortune_records::RecordsError),
    /// The tuning loop.
    #[error(transparent)]
    Tuner(#[from] tensortune_tuner::tuning::TuneError),
    /// The cost model.
    #[error("cost model: {0}")]
    Model(String),
    /// The model file to start from cannot be used (missing, unreadable, not a model, another
    /// feature layout).
    #[error("{0}")]
    ModelFile(String),
}

/// The result of tuning one workload.
#[derive(Clone, Debug, Serialize)]
pub struct TuneReport {
    /// The workload key (canonical spec).
    pub workload: String,
    /// The target key.
    pub target: String,
    /// Trials measured in this run.
    pub trials: usize,
    /// Of those, how many failed (compile, crash, timeout, wrong result).
    pub errors: usize,
    /// Of the trials, how many were hopeless and timed only once.
    pub cut_short: usize,
    /// Records of earlier runs the run resumed from.
    pub resumed: usize,
    /// Best latency, re-measured at the end when re-measurement is on (seconds).
    pub best_latency_s: Option<f64>,
    /// GFLOP/s of that latency.
    pub best_gflops: Option<f64>,
    /// The best latency as measured during tuning.
    pub tuning_latency_s: Option<f64>,
    /// The best schedule's trace as JSON.
    pub best_trace: Option<String>,
    /// Wall time of the whole run (all workloads tuned together), seconds.
    pub tuning_s: f64,
    /// Where the time went.
    #[serde(skip)]
    pub phases: PhaseTimes,
    /// The records database, if any.
    pub db: Option<PathBuf>,
    /// `(trials, best GFLOP/s)` after each round.
    pub curve: Vec<(usize, f64)>,
    /// Floating-point operations of one run.
    pub flops: f64,
    /// Bytes one run must move at the least (inputs read once, outputs written once).
    pub min_bytes: f64,
    /// The written part of `min_bytes` (every output once): with it, a bandwidth yardstick
    /// can weigh reads and writes (`ProbeReport::bandwidth_gbs_for`).
    pub min_written_bytes: f64,
    /// GB/s of the best latency, counting `min_bytes` (the figure of a memory-bound op).
    pub best_gbs: Option<f64>,
    /// The top programs re-measured at the end, in their order during tuning (empty when
    /// re-measurement is off): whether the program tuning found fastest is still the fastest.
    pub remeasured: Vec<Remeasured>,
    /// What the cost model knew before the first round (`None`: it started untrained).
    pub warm_start: Option<WarmStart>,
    /// The workload's default schedule (what it runs without a record: on a CPU
    /// [`crate::build::default_cpu_state`]), timed in the rounds that re-measure the top
    /// programs, so that the gain of tuning over it is measured side by side (`None` when
    /// re-measurement is off or the default failed).
    pub default_latency_s: Option<f64>,
}

/// Where a run's cost model came from when it did not start untrained.
#[derive(Clone, Debug, Serialize)]
pub struct WarmStart {
    /// `file` (`TuneOptions::model_file`) or `records` (other workloads of the database).
    pub source: String,
    /// The model file, for `file`.
    pub path: Option<PathBuf>,
    /// Programs the model was trained on.
    pub samples: usize,
    /// Workloads they came from.
    pub workloads: usize,
}

/// Records of each other workload a warm start trains on, at most: enough to rank a new
/// shape's tilings, few enough that retraining every round stays cheap.
pub const WARM_RECORDS_PER_WORKLOAD: usize = 256;

/// The cost model a run starts from: the model file, else (with `warm_start`) one trained on
/// the other workloads of `db` on `target`, else an untrained one.
fn starting_model(
    opts: &TuneOptions,
    db: Option<&Database>,
    target: &str,
    tuned: &[&str],
) -> Result<(GbdtModel, Option<WarmStart>), TuneError> {
    let model_err = |e: tensortune_cost_model::ModelError| TuneError::Model(e.to_string());
    let distinct = |samples: &[tensortune_cost_model::Sample]| {
        samples
            .iter()
            .map(|s| s.workload.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    if let Some(path) = &opts.model_file {
        let m = GbdtModel::load(path).map_err(|e| TuneError::ModelFile(e.to_string()))?;
        if !opts.quiet {
            log::info!(
                target: PROGRESS_LOG_TARGET,
                "tensortune: the cost model starts from {} ({} programs)",
                path.display(),
                m.samples().len()
            );
        }
        let warm = WarmStart {
            source: "file".into(),
            path: Some(path.clone()),
            samples: m.samples().len(),
            workloads: distinct(m.samples()),
        };
        return Ok((m, Some(warm)));
    }
    let options = GbdtOptions {
        warmup_samples: opts.model_warmup,
        seed: opts.seed,
        ..GbdtOptions::default()
    };
    if opts.warm_start {
        if let Some(db) = db {
            let warm = GbdtModel::warm_from_records(
                db,
                target,
                tuned,
                WARM_RECORDS_PER_WORKLOAD,
                options.clone(),
            )
            .map_err(model_err)?;
            if let Some((m, _)) = warm {
                let warm = WarmStart {
                    source: "records".into(),
                    path: None,
                    samples: m.samples().len(),
                    workloads: distinct(m.samples()),
                };
                if !opts.quiet {
                    log::info!(
                        target: PROGRESS_LOG_TARGET,
                        "tensortune: the cost model starts warm: trained on {} programs of {} other workload(s) of `{target}`",
                        warm.samples,
                        warm.workloads
                    );
                }
                return Ok((m, Some(warm)));
            }
        }
    }
    Ok((GbdtModel::new(options).map_err(model_err)?, None))
}

/// One of the top programs, re-measured at the end of tuning.
#[derive(Clone, Debug, Serialize)]
pub struct Remeasured {
    /// Its place among the records by the latency measured during tuning (1: the best).
    pub tuning_rank: usize,
    /// Its latency during tuning, seconds.
    pub tuning_latency_s: f64,
    /// The median of its re-measured latencies, seconds (`None`: every re-measure failed).
    pub latency_s: Option<f64>,
    /// The rounds of re-measurement (each timed it once): [`REMEASURE_ROUNDS`]`.0`, or more
    /// where they disagreed.
    pub rounds: usize,
}

/// The fewest and the most rounds of re-measurement at the end of tuning. A round times each
/// of the top programs and the default once (on the CPU each timing the median of five of at
/// least 100 ms), so three rounds' median already ignores one round slowed by the host; a
/// burst of other work on the host that spans two rounds of a short kernel moves that
/// median, which more rounds, taken only while the rounds disagree, outlast
/// (docs/measurements.md, "More rounds of re-measurement while they disagree").
pub const REMEASURE_ROUNDS: (usize, usize) = (3, 9);

/// How far the fastest program's median over the rounds may sit above its fastest round
/// before another round is taken: about twice the spread of one program's timings from round
/// to round on a quiet host (docs/measurements.md, "Held-out ranking with thirty-six other
/// workloads"), so a quiet host stops at the fewest.
const REMEASURE_AGREEMENT: f64 = 1.03;

/// True while the rounds so far disagree on the program they make fastest: its median over the
/// rounds (what is reported) is more than [`REMEASURE_AGREEMENT`] above its fastest round.
/// Other work on the host only ever slows a timing, so a median that far above the fastest
/// round says that at least half the rounds ran slowed. `per` holds each program's timings,
/// one a round (a failed timing is missing); no timing at all asks for no more rounds.
pub(crate) fn more_rounds_needed(per: &[Vec<f64>]) -> bool {
    let median_and_min = |v: &[f64]| -> Option<(f64, f64)> {
        let mut v: Vec<f64> = v.iter().copied().filter(|t| t.is_finite()).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        Some((*v.get(v.len() / 2)?, *v.first()?))
    };
    per.iter()
        .filter_map(|v| median_and_min(v))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .is_some_and(|(med, min)| med > min * REMEASURE_AGREEMENT)
}

/// Flops per byte below which an op is memory-bound on any CPU we know (their balance of FMA
/// peak to memory bandwidth is higher): its summary gives GB/s beside GFLOP/s.
pub const MEMORY_BOUND_INTENSITY: f64 = 8.0;

impl TuneReport {
    /// True for an op that moves more than one byte for every [`MEMORY_BOUND_INTENSITY`]
    /// flops: its speed is measured in GB/s.
    pub fn memory_bound(&self) -> bool {
        self.min_bytes > 0.0 && self.flops / self.min_bytes < MEMORY_BOUND_INTENSITY
    }

    /// The place during tuning of the program that is fastest after re-measure (1: tuning's
    /// best stayed the best); `None` without re-measurement.
    pub fn remeasured_best_rank(&self) -> Option<usize> {
        self.remeasured
            .iter()
            .filter_map(|r| Some((r.latency_s?, r.tuning_rank)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, rank)| rank)
    }

    /// The best schedule as a state of `dag`.
    pub fn best_state(&self, dag: &ComputeDag) -> Option<State> {
        Trace::from_json(self.best_trace.as_ref()?)
            .ok()?
            .replay(dag)
            .ok()
    }
}

/// The `log` target of the line per round that [`tune()`] reports where stderr is not a
/// terminal (at `info` level), so that a logger can show progress without other info lines.
pub const PROGRESS_LOG_TARGET: &str = "tensortune::progress";

/// Progress: a bar on stderr where it is a terminal, otherwise a line per round logged at
/// `info` under [`PROGRESS_LOG_TARGET`].
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    last_line: Instant,
}

impl Progress {
    fn new(total: usize) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            let style = indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} trials, {msg}, eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            b.set_style(style);
            b
        });
        Progress {
            bar,
            last_line: Instant::now(),
        }
    }
}

impl Observer for Progress {
    fn round(&mut self, r: &RoundInfo) {
        let best = r
            .best_gflops
            .map(|g| format!("{g:.1} GFLOP/s"))
            .unwrap_or_else(|| "no valid program yet".into());
        match &self.bar {
            Some(b) => {
                b.set_position(r.trials_done as u64);
                b.set_message(format!("{}: best {best}", r.key));
            }
            None => {
                self.last_line = Instant::now();
                let left = if r.trials_done > 0 {
                    r.elapsed_s / r.trials_done as f64
                        * (r.trials_total - r.trials_done.min(r.trials_total)) as f64
                } else {
                    0.0
                };
                log::info!(
                    target: PROGRESS_LOG_TARGET,
                    "tune: {}/{} trials, {}: best {best}, {} errors this round, {:.0} s elapsed, ~{:.0} s left",
                    r.trials_done, r.trials_total, r.key, r.errors, r.elapsed_s, left
                );
            }
        }
    }
}

/// Tunes one workload of the op library on `backend` (`&Target::host(1)` for one core of this
/// CPU).
pub fn tune<B: Backend>(
    workload: &WorkloadSpec,
    backend: &B,
    opts: &TuneOptions,
) -> Result<TuneReport, TuneError> {
    let dag = workload.build()?;
    let mut r = tune_dags(vec![(workload.canonical(), dag, 1.0)], backend, opts)?;
    r.pop().ok_or(TuneError::Tuner(
        tensortune_tuner::tuning::TuneError::NoTasks,
    ))
}

/// Tunes several workloads together on `backend`, each `(key, dag, weight)`: trials go where
/// they reduce the weighted total latency most. A user's own DAG is tuned the same way under
/// a key the user chooses (records are filed under it).
pub fn tune_dags<B: Backend>(
    tasks: Vec<(String, ComputeDag, f64)>,
    backend: &B,
    opts: &TuneOptions,
) -> Result<Vec<TuneReport>, TuneError> {
    let target = backend.target();
    let opts = TuneOptions {
        threads: target.threads(),
        ..opts.clone()
    };
    let mut measurer = backend.measurer(Purpose::Tuning, opts.seed);
    let mut db = match &opts.db {
        Some(p) => Some(Database::open(p)?),
        None => None,
    };
    let target_key = backend.target_key().to_string();
    let keys: Vec<&str> = tasks.iter().map(|(k, _, _)| k.as_str()).collect();
    let (model, warm_start) = starting_model(&opts, db.as_ref(), &target_key, &keys)?;
    let inputs: Vec<TaskInput> = tasks
        .iter()
        .map(|(key, dag, weight)| TaskInput {
            key: key.clone(),
            dag: dag.clone(),
            weight: *weight,
        })
        .collect();
    let start = Instant::now();
    let summary = {
        // The options go into the run's row: a server URL without its password.
        let recorded = TuneOptions {
            db: opts
                .db
                .as_ref()
                .map(|db| std::path::PathBuf::from(tensortune_records::redacted(db))),
            ..opts.clone()
        };
        let mut tuner =
            Tuner::new(recorded, measurer.as_mut(), db.as_mut(), Box::new(model))
                .for_target(target, backend.rules())
                .with_default_schedules(tasks.iter().filter_map(|(key, dag, _)| {
                    Some((key.clone(), backend.default_schedule(dag)?))
                }));
        if opts.quiet {
            tuner.run(inputs, &mut Silent)?
        } else {
            let mut p = Progress::new(opts.trials);
            let s = tuner.run(inputs, &mut p)?;
            if let Some(b) = p.bar {
                b.finish_and_clear();
            }
            s
        }
    };
    drop(measurer);
    let mut reports = Vec::new();
    for ((_, dag, _), t) in tasks.iter().zip(&summary.tasks) {
        let tuning_latency = t.best.as_ref().map(|b| b.latency_s);
        let mut best_latency = tuning_latency;
        let mut best_trace = t.best.as_ref().map(|b| b.state.trace().to_json());
        let mut remeasured = Vec::new();
        let mut default_latency = None;
        if opts.remeasure_top > 0 {
            let r = remeasure(backend, dag, t, &opts, db.as_ref(), &target_key);
            if let Some((l, trace)) = r.best {
                best_latency = Some(l);
                best_trace = Some(trace);
            }
            remeasured = r.programs;
            default_latency = r.default;
        }
        let min_bytes = dag.min_bytes();
        let min_written_bytes = dag.min_written_bytes();
        reports.push(TuneReport {
            workload: t.key.clone(),
            target: target_key.clone(),
            trials: t.trials,
            errors: t.errors,
            cut_short: t.cut_short,
            resumed: t.resumed,
            best_gflops: best_latency.map(|l| t.flops / l / 1e9),
            best_latency_s: best_latency,
            tuning_latency_s: tuning_latency,
            best_trace,
            tuning_s: start.elapsed().as_secs_f64(),
            phases: summary.phases.clone(),
            db: opts.db.clone(),
            curve: t
                .curve
                .iter()
                .map(|&(n, l)| (n, t.flops / l / 1e9))
                .collect(),
            flops: t.flops,
            min_bytes,
            min_written_bytes,
            best_gbs: best_latency
                .filter(|l| *l > 0.0)
                .map(|l| min_bytes / l / 1e9),
            remeasured,
            warm_start: warm_start.clone(),
            default_latency_s: default_latency,
        });
    }
    Ok(reports)
}

/// What [`remeasure`] found.
struct RemeasureResult {
    /// The best re-measured median and its trace.
    best: Option<(f64, String)>,
    /// Every re-measured program in its tuning order.
    programs: Vec<Remeasured>,
    /// The default schedule's median, timed in the same rounds.
    default: Option<f64>,
}

/// Re-measures the best few programs of a task (from the database when there is one, so
/// resumed records count), interleaved over [`REMEASURE_ROUNDS`] rounds at the least and
/// more while they disagree ([`more_rounds_needed`]; on the CPU, each candidate in a fresh
/// forked child); returns the best re-measured median and its trace, and each program's
/// re-measured median beside its tuning latency.
fn remeasure<B: Backend>(
    backend: &B,
    dag: &ComputeDag,
    t: &tensortune_tuner::tuning::TaskReport,
    opts: &TuneOptions,
    db: Option<&Database>,
    target: &str,
) -> RemeasureResult {
    let none = RemeasureResult {
        best: None,
        programs: Vec::new(),
        default: None,
    };
    // (state, latency during tuning), best first.
    let mut states: Vec<(State, f64)> = Vec::new();
    if let Some(db) = db {
        let Ok(best) = db.best_k(&t.key, target, opts.remeasure_top) else {
            return none;
        };
        for r in best {
            let (Ok(s), Some(tm)) = (
                Trace::from_json(&r.trace_json).and_then(|tr| tr.replay(dag)),
                r.outcome.timing(),
            ) else {
                continue;
            };
            states.push((s, tm.median_s));
        }
    }
    if states.is_empty() {
        let Some(b) = t.best.as_ref() else {
            return none;
        };
        states.push((b.state.clone(), b.latency_s));
    }
    let mut m = backend.measurer(Purpose::Final, opts.seed);
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); states.len()];
    // The default schedule, last in every round (its median is reported apart).
    let default = backend.default_schedule(dag);
    let mut default_times = Vec::new();
    let mut rounds = 0;
    while rounds < REMEASURE_ROUNDS.0 || (rounds < REMEASURE_ROUNDS.1 && more_rounds_needed(&per)) {
        rounds += 1;
        for (i, (s, _)) in states.iter().enumerate() {
            if let Some(Ok(tm)) = m.measure(dag, std::slice::from_ref(s)).pop() {
                per[i].push(tm.median_s);
            }
        }
        if let Some(Ok(tm)) = default
            .as_ref()
            .and_then(|d| m.measure(dag, std::slice::from_ref(d)).pop())
        {
            default_times.push(tm.median_s);
        }
    }
    default_times.sort_by(|a, b| a.total_cmp(b));
    let mut best: Option<(f64, usize)> = None;
    let mut programs = Vec::with_capacity(states.len());
    for (i, v) in per.iter_mut().enumerate() {
        v.sort_by(|a, b| a.total_cmp(b));
        let med = v.get(v.len() / 2).copied();
        programs.push(Remeasured {
            tuning_rank: i + 1,
            tuning_latency_s: states[i].1,
            latency_s: med,
            rounds,
        });
        let Some(med) = med else {
            continue;
        };
        if best.map(|(b, _)| med < b).unwrap_or(true) {
            best = Some((med, i));
        }
    }
    RemeasureResult {
        best: best.and_then(|(l, i)| Some((l, states.get(i)?.0.trace().to_json()))),
        programs,
        default: default_times.get(default_times.len() / 2).copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::more_rounds_needed;

    #[test]
    fn rounds_that_agree_need_no_more() {
        // A quiet host: 1% between rounds.
        let per = vec![vec![1.00, 1.01, 1.005], vec![1.20, 1.22, 1.21]];
        assert!(!more_rounds_needed(&per));
        // One slowed round of three: the median already ignores it.
        let per = vec![vec![1.00, 1.60, 1.01], vec![1.20, 1.90, 1.21]];
        assert!(!more_rounds_needed(&per));
    }

    #[test]
    fn two_slowed_rounds_of_three_ask_for_more_until_the_median_is_clean() {
        // A burst over the first two rounds: the fastest program's median is 1.5x its best.
        let mut per = vec![vec![1.50, 1.45, 1.00], vec![1.80, 1.75, 1.20]];
        assert!(more_rounds_needed(&per));
        // One clean round more: four timings, the upper median still slowed.
        per[0].push(1.01);
        per[1].push(1.21);
        assert!(more_rounds_needed(&per));
        // Two: the median of five is a clean round's.
        per[0].push(1.02);
        per[1].push(1.22);
        assert!(!more_rounds_needed(&per));
    }

    #[test]
    fn the_rule_follows_the_fastest_program_and_ignores_failures() {
        // The slower program's rounds disagree, the fastest's agree: no more rounds, since
        // only the fastest is reported as the best.
        let per = vec![vec![1.00, 1.01, 1.02], vec![2.0, 3.0, 3.1]];
        assert!(!more_rounds_needed(&per));
        // A program whose every timing failed, or a NaN timing, is left out.
        let per = vec![vec![], vec![f64::NAN, 1.0, 1.01, 1.02]];
        assert!(!more_rounds_needed(&per));
        assert!(!more_rounds_needed(&[]));
    }
}
