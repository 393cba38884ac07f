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
}

impl TuneReport {
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
    let model = GbdtModel::new(GbdtOptions {
        warmup_samples: opts.model_warmup,
        seed: opts.seed,
        ..GbdtOptions::default()
    })
    .map_err(|e| TuneError::Model(e.to_string()))?;
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
        let mut tuner = Tuner::new(
            opts.clone(),
            measurer.as_mut(),
            db.as_mut(),
            Box::new(model),
        )
        .for_target(target, backend.rules());
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
    let target_key = backend.target_key().to_string();
    let mut reports = Vec::new();
    for ((_, dag, _), t) in tasks.iter().zip(&summary.tasks) {
        let tuning_latency = t.best.as_ref().map(|b| b.latency_s);
        let mut best_latency = tuning_latency;
        let mut best_trace = t.best.as_ref().map(|b| b.state.trace().to_json());
        if opts.remeasure_top > 0 {
            if let Some((l, trace)) = remeasure(backend, dag, t, &opts, db.as_ref(), &target_key) {
                best_latency = Some(l);
                best_trace = Some(trace);
            }
        }
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
        });
    }
    Ok(reports)
}

/// Re-measures the best few programs of a task (from the database when there is one, so
/// resumed records count), interleaved over three rounds (on the CPU, each candidate in a
/// fresh forked child); returns the best re-measured median and its trace.
fn remeasure<B: Backend>(
    backend: &B,
    dag: &ComputeDag,
    t: &tensortune_tuner::tuning::TaskReport,
    opts: &TuneOptions,
    db: Option<&Database>,
    target: &str,
) -> Option<(f64, String)> {
    let mut states: Vec<State> = Vec::new();
    if let Some(db) = db {
        for r in db.best_k(&t.key, target, opts.remeasure_top).ok()? {
            if let Ok(s) = Trace::from_json(&r.trace_json).and_then(|tr| tr.replay(dag)) {
                states.push(s);
            }
        }
    }
    if states.is_empty() {
        states.push(t.best.as_ref()?.state.clone());
    }
    let mut m = backend.measurer(Purpose::Final, opts.seed);
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); states.len()];
    for _round in 0..3 {
        for (i, s) in states.iter().enumerate() {
            if let Some(Ok(tm)) = m.measure(dag, std::slice::from_ref(s)).pop() {
                per[i].push(tm.median_s);
            }
        }
    }
    let mut best: Option<(f64, usize)> = None;
    for (i, v) in per.iter_mut().enumerate() {
        if v.is_empty() {
            continue;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let med = v[v.len() / 2];
        if best.map(|(b, _)| med < b).unwrap_or(true) {
            best = Some((med, i));
        }
    }
    let (l, i) = best?;
    Some((l, states.get(i)?.trace().to_json()))
}
