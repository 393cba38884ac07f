//! The tuning loop: rounds of search, measurement, records and retraining.
//!
//! One round for one task (workload): the evolutionary search proposes a batch ranked by the
//! cost model (which ranks at random until it has learned enough), the [`Measurer`]
//! measures it, the batch is written to the records database in one transaction, and the
//! model is retrained on every measured program. Rounds go to tasks as the
//! [`crate::scheduler`] decides. The run stops at the trial budget, the time budget, or when
//! every task has stopped early (no better program in `early_stop` trials) or run out of new
//! programs.
//!
//! On a database that already has records for a task and target, the run resumes: those
//! programs are never measured again, the best of them seed the search, and the model is
//! trained on them before the first round.

use crate::measure::{MeasureErrorKind, MeasureResult, Measurer};
use crate::options::TuneOptions;
use crate::scheduler::{next_task_by, TaskStatus};
use crate::search::{fingerprint, program_fingerprint, Candidate, Scorer, SearchSpace};
use crate::sketch::rules::{cpu_rules, default_target, SketchRule};
use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// Share of an uninformed round's batch drawn at random rather than by the untrained
/// model's rank: the first round also trains the model, which learns more from programs
/// of every kind than from the ones an analytic estimate likes.
const UNINFORMED_RANDOM_SHARE: f64 = 0.5;
use tensortune_cost_model::{CoreModel, CostModel, ProgramFeatures, Sample};
use tensortune_records::{
    Database, ErrorKind, NewRecord, NewRun, Outcome, RunId, Timing, Workload,
};
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::TargetDesc;
use tensortune_schedules::trace::Trace;
use tensortune_schedules::ComputeDag;

/// One workload to tune.
#[derive(Clone, Debug)]
pub struct TaskInput {
    /// The workload key (a canonical spec, or a user's name for a custom DAG).
    pub key: String,
    /// What it computes.
    pub dag: ComputeDag,
    /// Its weight in the total latency (how often it runs).
    pub weight: f64,
}

/// The best program of a task.
#[derive(Clone, Debug)]
pub struct Best {
    /// The schedule.
    pub state: State,
    /// Median seconds per run, as measured in the tuning run.
    pub latency_s: f64,
}

/// What a run did for one task.
#[derive(Clone, Debug)]
pub struct TaskReport {
    /// The workload key.
    pub key: String,
    /// Floating-point operations of one run.
    pub flops: f64,
    /// The best program measured (this run or, when resuming, before).
    pub best: Option<Best>,
    /// Trials measured in this run.
    pub trials: usize,
    /// Of those, how many failed.
    pub errors: usize,
    /// Of those, how many were hopeless and timed only once.
    pub cut_short: usize,
    /// Records that were in the database before the run.
    pub resumed: usize,
    /// `(trials so far, best latency so far)` after each of this run's rounds.
    pub curve: Vec<(usize, f64)>,
}

impl TaskReport {
    /// GFLOP/s of the best program.
    pub fn best_gflops(&self) -> Option<f64> {
        self.best.as_ref().map(|b| self.flops / b.latency_s / 1e9)
    }
}

/// Wall time by phase, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    /// Evolutionary search, including lowering and scoring candidates.
    pub search_s: f64,
    /// Inside the measurer (compiling, checking and running candidates).
    pub measure_s: f64,
    /// Of `measure_s`, compiling candidates (as the measurer reports it; 0 if it does not).
    pub compile_s: f64,
    /// Of `measure_s`, running candidates: the first (checked) run, warm-up and timings, and
    /// the checking.
    pub run_s: f64,
    /// Of `run_s`, checking: comparing each candidate's first outputs with the reference.
    pub check_s: f64,
    /// Of `run_s`, the candidates' first runs (whose outputs are checked; each is also the
    /// first warm-up run).
    pub first_run_s: f64,
    /// Retraining the cost model (features included).
    pub model_s: f64,
    /// Writing records.
    pub records_s: f64,
    /// The whole run.
    pub total_s: f64,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct TuneSummary {
    /// One report per task, in input order.
    pub tasks: Vec<TaskReport>,
    /// Where the time went.
    pub phases: PhaseTimes,
    /// The records run id, when a database was given.
    pub run: Option<RunId>,
}

/// Progress of a run, for a progress bar or log lines.
#[derive(Clone, Debug)]
pub struct RoundInfo {
    /// The task of the round.
    pub key: String,
    /// Trials measured so far (all tasks).
    pub trials_done: usize,
    /// The trial budget.
    pub trials_total: usize,
    /// Best GFLOP/s of this task so far.
    pub best_gflops: Option<f64>,
    /// Failures in this round.
    pub errors: usize,
    /// Seconds since the run started.
    pub elapsed_s: f64,
}

/// Receives progress; every method has a no-op default.
pub trait Observer {
    /// After each round.
    fn round(&mut self, _info: &RoundInfo) {}
}

/// An observer that ignores everything.
pub struct Silent;
impl Observer for Silent {}

/// One measured batch, as a [`MeasureCallback`] sees it.
pub struct MeasuredBatch<'a> {
    /// The task's workload key.
    pub key: &'a str,
    /// The target key the results are filed under.
    pub target: &'a str,
    /// The programs measured, in order.
    pub candidates: &'a [Candidate],
    /// One result per program.
    pub results: &'a [MeasureResult],
}

/// A hook run after every measured batch, once the run has recorded it and before the model
/// learns from it (like MetaSchedule's `MeasureCallback`): logging, extra bookkeeping, a
/// second database. It cannot change the run.
pub trait MeasureCallback {
    /// Called with each batch.
    fn measured(&mut self, batch: &MeasuredBatch<'_>);
}

/// A measured program as the records database takes it: what [`NewRecord`]'s `From` reads.
pub struct Measured<'a> {
    /// The workload.
    pub workload: &'a Workload,
    /// The target key.
    pub target: &'a str,
    /// The program.
    pub state: &'a State,
    /// Its result.
    pub result: &'a MeasureResult,
}

impl From<Measured<'_>> for NewRecord {
    fn from(m: Measured<'_>) -> NewRecord {
        let json = m.state.trace().to_json();
        match m.result {
            Ok(tm) => {
                // The extremes include the median: a cut-short timing has one repeat.
                let min = tm.repeats.iter().copied().fold(tm.median_s, f64::min);
                let max = tm.repeats.iter().copied().fold(tm.median_s, f64::max);
                let timing = Timing {
                    median_s: tm.median_s,
                    min_s: min,
                    max_s: max,
                    repeats: tm.repeats.len().max(1) as u32,
                };
                NewRecord::measured(m.workload.clone(), m.target, json, timing)
            }
            Err(e) => NewRecord::failed(
                m.workload.clone(),
                m.target,
                json,
                e.kind.into(),
                e.message.clone(),
            ),
        }
    }
}

impl From<MeasureErrorKind> for ErrorKind {
    fn from(k: MeasureErrorKind) -> ErrorKind {
        match k {
            MeasureErrorKind::Lower | MeasureErrorKind::Compile => ErrorKind::Compile,
            MeasureErrorKind::Runtime => ErrorKind::Runtime,
            MeasureErrorKind::Timeout => ErrorKind::Timeout,
            MeasureErrorKind::WrongResult => ErrorKind::WrongResult,
            MeasureErrorKind::Internal => ErrorKind::Other,
        }
    }
}

/// Why a run failed (a failed candidate is not a run failure).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuneError {
    /// The records database failed.
    #[error("records database: {0}")]
    Records(#[from] tensortune_records::RecordsError),
    /// Nothing to tune.
    #[error("no workload given")]
    NoTasks,
    /// The measurer failed for every candidate of a batch (see `Tuner::run`): what it said.
    #[error("measurement failed for a whole batch, so the host cannot measure: {0}")]
    Measurer(String),
    /// A [`TuneOptions`] knob out of its range ([`TuneOptions::validate`]).
    #[error("tuning options: {0}")]
    Options(String),
    /// A workload has no sketch (should not happen: every DAG has a plain one).
    #[error("workload `{0}` has no search space")]
    NoSketch(String),
}

struct Task {
    input: TaskInput,
    space: SearchSpace,
    flops: f64,
    measured: HashSet<u64>,
    good: Vec<(f64, Candidate)>,
    report: TaskReport,
    status: TaskStatus,
    since_improvement: usize,
    /// Whether the default schedule has been put in a batch (or found measured) this run.
    default_offered: bool,
}

impl Task {
    fn new(input: TaskInput, space: SearchSpace) -> Task {
        let flops = input.dag.flops();
        Task {
            report: TaskReport {
                key: input.key.clone(),
                flops,
                best: None,
                trials: 0,
                errors: 0,
                cut_short: 0,
                resumed: 0,
                curve: Vec::new(),
            },
            status: TaskStatus {
                weight: input.weight,
                history: Vec::new(),
                trials: 0,
                last_round: 0,
                done: false,
            },
            space,
            flops,
            measured: HashSet::new(),
            good: Vec::new(),
            since_improvement: 0,
            default_offered: false,
            input,
        }
    }

    /// Marks a program measured, so the search never proposes it again.
    fn mark_measured(&mut self, state: &State) {
        self.measured.insert(fingerprint(state));
        self.measured.extend(program_fingerprint(state));
    }

    /// Takes a measured latency into the best; true if it is the new best.
    fn offer_best(&mut self, state: &State, latency_s: f64) -> bool {
        let better = self
            .report
            .best
            .as_ref()
            .is_none_or(|b| latency_s < b.latency_s);
        if better {
            self.report.best = Some(Best {
                state: state.clone(),
                latency_s,
            });
        }
        better
    }
}

/// Scores states with a cost model: lowered and featurized in parallel, then predicted.
struct ModelScorer<'a> {
    model: &'a dyn CostModel,
    core: CoreModel,
}

impl Scorer for ModelScorer<'_> {
    fn score(&mut self, states: &[State]) -> Vec<f64> {
        let feats: Vec<Option<ProgramFeatures>> = states
            .par_iter()
            .map(|s| {
                lower(s)
                    .ok()
                    .map(|f| ProgramFeatures::extract_for(&f, &self.core))
            })
            .collect();
        let ok: Vec<ProgramFeatures> = feats.iter().flatten().cloned().collect();
        let pred = self
            .model
            .predict(&ok)
            .unwrap_or_else(|_| vec![0.0; ok.len()]);
        let mut it = pred.into_iter();
        feats
            .iter()
            .map(|f| match f {
                Some(_) => it.next().unwrap_or(f64::NEG_INFINITY),
                None => f64::NEG_INFINITY,
            })
            .collect()
    }
}

/// A tuning run.
pub struct Tuner<'a> {
    /// The options.
    pub opts: TuneOptions,
    measurer: &'a mut dyn Measurer,
    db: Option<&'a mut Database>,
    model: Box<dyn CostModel>,
    /// The machine the sketches are made for.
    target: TargetDesc,
    /// The sketch rules of that machine.
    rules: Vec<Box<dyn SketchRule>>,
    callbacks: Vec<Box<dyn MeasureCallback>>,
    /// By workload key, the schedule it runs without a record, measured in its first batch
    /// ([`Tuner::with_default_schedules`]).
    default_schedules: HashMap<String, State>,
    /// Samples of resumed records, given to the model before the first round.
    resumed: Vec<Sample>,
    trained_on: usize,
}

/// What a run keeps across its rounds besides the tasks.
struct RunState {
    start: Instant,
    phases: PhaseTimes,
    run: Option<RunId>,
    target: String,
    rng: ChaCha8Rng,
    done_trials: usize,
}

impl<'a> Tuner<'a> {
    /// A run measuring through `measurer`, ranking with `model`, recording into `db` when
    /// given. The model receives each batch's samples once (it keeps what it learned; a
    /// learned model ranks at random until it has enough samples: see its warm-up option).
    /// Sketches are made by the CPU rules for the CPU [`default_target`] describes, unless
    /// [`Tuner::for_target`] says otherwise.
    pub fn new(
        opts: TuneOptions,
        measurer: &'a mut dyn Measurer,
        db: Option<&'a mut Database>,
        model: Box<dyn CostModel>,
    ) -> Tuner<'a> {
        Tuner {
            target: default_target(&opts),
            rules: cpu_rules(),
            opts,
            measurer,
            db,
            model,
            callbacks: Vec::new(),
            default_schedules: HashMap::new(),
            resumed: Vec::new(),
            trained_on: 0,
        }
    }

    /// Makes sketches for `target` with `rules` (a backend's).
    pub fn for_target(mut self, target: TargetDesc, rules: Vec<Box<dyn SketchRule>>) -> Tuner<'a> {
        self.target = target;
        self.rules = rules;
        self
    }

    /// For each `(workload key, schedule)`, measures the schedule (the one the workload runs
    /// without a record on this machine) first in the workload's first batch of the run,
    /// unless measured before, so that the records always hold it and a run never ends
    /// slower than no tuning, measured alike. A backend gives its own
    /// (`tensortune::backend::Backend::default_schedule`); by default there are none.
    pub fn with_default_schedules(
        mut self,
        defaults: impl IntoIterator<Item = (String, State)>,
    ) -> Tuner<'a> {
        self.default_schedules.extend(defaults);
        self
    }

    /// Adds a hook run after every measured batch.
    pub fn with_callback(mut self, callback: Box<dyn MeasureCallback>) -> Tuner<'a> {
        self.callbacks.push(callback);
        self
    }

    fn sample_of(
        core: &CoreModel,
        key: &str,
        flops: f64,
        state: &State,
        latency: Option<f64>,
    ) -> Option<Sample> {
        let f = lower(state).ok()?;
        Some(Sample {
            features: ProgramFeatures::extract_for(&f, core),
            workload: key.to_string(),
            throughput: latency
                .filter(|l| *l > 0.0)
                .map(|l| flops / l)
                .unwrap_or(0.0),
        })
    }

    fn new_task(&mut self, input: TaskInput, target: &str) -> Result<Task, TuneError> {
        let space =
            SearchSpace::for_target(input.dag.clone(), &self.opts, &self.target, &self.rules);
        if space.sketches.is_empty() {
            return Err(TuneError::NoSketch(input.key.clone()));
        }
        let mut task = Task::new(input, space);
        if let Some(db) = self.db.as_deref() {
            let records = db.records(&task.input.key, target)?;
            self.resume(&mut task, &records);
        }
        Ok(task)
    }

    /// Resumes from the records of this workload and target: they are never measured again,
    /// the successful ones seed the search, and all are trained on before the first round.
    fn resume(&mut self, task: &mut Task, records: &[tensortune_records::Record]) {
        let core = CoreModel::for_target(&self.target);
        for r in records {
            // A failure of kind `other` (out of memory, the measurer itself, a stored time out
            // of range) says nothing about the program: a resumed run may try it again.
            if matches!(
                r.outcome,
                tensortune_records::Outcome::Failed {
                    kind: ErrorKind::Other,
                    ..
                }
            ) {
                continue;
            }
            let Ok(trace) = Trace::from_json(&r.trace_json) else {
                continue;
            };
            let Ok(state) = trace.replay(&task.input.dag) else {
                continue;
            };
            task.mark_measured(&state);
            task.report.resumed += 1;
            let latency = r.outcome.timing().map(|t| t.median_s);
            // Cut-short records (timed once) are trained on too (see the retraining).
            if let Some(s) = Self::sample_of(&core, &task.input.key, task.flops, &state, latency) {
                self.resumed.push(s);
            }
            if let Some(l) = latency {
                if let Some(c) = task.space.from_state(&state) {
                    task.good.push((l, c));
                }
                task.offer_best(&state, l);
            }
        }
        if let Some(b) = &task.report.best {
            task.status.history.push(b.latency_s);
            task.status.trials = task.report.resumed;
            task.status.last_round = task.report.resumed;
        }
    }

    /// Tunes the tasks; see the module doc. Each round is the phases propose (`Tuner::propose`),
    /// measure, record, learn and report.
    pub fn run(
        &mut self,
        inputs: Vec<TaskInput>,
        observer: &mut dyn Observer,
    ) -> Result<TuneSummary, TuneError> {
        if inputs.is_empty() {
            return Err(TuneError::NoTasks);
        }
        self.opts.validate().map_err(TuneError::Options)?;
        let stats0 = self.measurer.stats();
        let mut rs = self.begin();
        let mut tasks = Vec::new();
        for i in inputs {
            tasks.push(self.new_task(i, &rs.target)?);
        }
        rs.run = self.begin_run(&rs.target)?;
        self.learn_resumed(&mut rs.phases);
        while rs.done_trials < self.opts.trials {
            if self
                .opts
                .time_budget_s
                .is_some_and(|b| rs.start.elapsed().as_secs_f64() >= b)
            {
                break;
            }
            let statuses: Vec<TaskStatus> = tasks.iter().map(|t| t.status.clone()).collect();
            let Some(ti) = next_task_by(&statuses, self.opts.task_scheduler) else {
                break;
            };
            self.round(&mut tasks[ti], &mut rs, observer)?;
        }
        self.finish(tasks, rs, stats0)
    }

    /// The run's clock, seed and target key.
    fn begin(&self) -> RunState {
        RunState {
            start: Instant::now(),
            phases: PhaseTimes::default(),
            run: None,
            target: self.measurer.target_key(),
            rng: ChaCha8Rng::seed_from_u64(self.opts.seed),
            done_trials: 0,
        }
    }

    /// Opens the records run, when there is a database.
    fn begin_run(&mut self, target: &str) -> Result<Option<RunId>, TuneError> {
        let Some(db) = self.db.as_deref_mut() else {
            return Ok(None);
        };
        Ok(Some(db.begin_run(&NewRun {
            tool_version: format!("tensortune {}", env!("CARGO_PKG_VERSION")),
            target: target.to_string(),
            seed: Some(self.opts.seed),
            options: serde_json::to_string(&self.opts).unwrap_or_default(),
            plan: self.opts.plan.clone(),
        })?))
    }

    /// Trains the model on the resumed records before the first round.
    fn learn_resumed(&mut self, phases: &mut PhaseTimes) {
        if self.resumed.is_empty() {
            return;
        }
        let t = Instant::now();
        let resumed = std::mem::take(&mut self.resumed);
        if self.model.update(&resumed).is_ok() {
            self.trained_on += resumed.len();
        }
        phases.model_s += t.elapsed().as_secs_f64();
    }

    /// One round of one task: propose, measure, record, learn, report.
    fn round(
        &mut self,
        task: &mut Task,
        rs: &mut RunState,
        observer: &mut dyn Observer,
    ) -> Result<(), TuneError> {
        let n = self
            .opts
            .batch_size
            .min(self.opts.trials - rs.done_trials)
            .max(1);
        let t = Instant::now();
        let mut batch = self.propose(task, n, &mut rs.rng);
        self.offer_default(task, &mut batch, n);
        rs.phases.search_s += t.elapsed().as_secs_f64();
        if batch.is_empty() {
            task.status.done = true;
            return Ok(());
        }
        let t = Instant::now();
        let results = self.measure(task, &batch);
        rs.phases.measure_s += t.elapsed().as_secs_f64();
        // Where the measurer itself failed for every candidate (no process could be started,
        // no descriptor opened, no reference computed), the environment is broken, not the
        // programs: stop, storing nothing of the batch, rather than file the whole budget as
        // failed programs.
        let internal = |r: &MeasureResult| match r {
            Err(e) if e.kind == MeasureErrorKind::Internal => Some(e.message.clone()),
            _ => None,
        };
        if !results.is_empty() && results.iter().all(|r| internal(r).is_some()) {
            let why = results.iter().find_map(internal).unwrap_or_default();
            return Err(TuneError::Measurer(why));
        }
        let t = Instant::now();
        let (errors, improved) = self.record(task, rs, &batch, &results)?;
        rs.phases.records_s += t.elapsed().as_secs_f64();
        for c in &mut self.callbacks {
            c.measured(&MeasuredBatch {
                key: &task.input.key,
                target: &rs.target,
                candidates: &batch,
                results: &results,
            });
        }
        let t = Instant::now();
        self.learn(task, rs.done_trials, &batch, &results);
        rs.phases.model_s += t.elapsed().as_secs_f64();
        rs.done_trials += batch.len();
        self.report(task, rs, batch.len(), errors, improved, observer);
        Ok(())
    }

    /// Puts the task's default schedule ([`Tuner::with_default_schedules`]) first in its
    /// first batch of the run, unless it was measured before: so a run's records always
    /// include it, and its best is never slower than no tuning at all as measured in the
    /// same conditions (a short run of a row sum, whose loops as written fold on registers,
    /// can otherwise end below them). It takes the place of the batch's last proposal. The
    /// loops as written are no sketch's instance: they are measured and recorded, never
    /// mutated ([`Tuner::record`]).
    fn offer_default(&self, task: &mut Task, batch: &mut Vec<Candidate>, n: usize) {
        if task.default_offered {
            return;
        }
        task.default_offered = true;
        let Some(state) = self.default_schedules.get(&task.input.key).cloned() else {
            return;
        };
        let (fp, program) = (fingerprint(&state), program_fingerprint(&state));
        if task.measured.contains(&fp) || program.is_some_and(|p| task.measured.contains(&p)) {
            return;
        }
        // Proposed already (a sketch with nothing to decide is the loops as written): moved
        // first, not measured twice.
        if let Some(i) = batch.iter().position(|c| {
            fingerprint(&c.state) == fp
                || program.is_some() && program_fingerprint(&c.state) == program
        }) {
            let c = batch.remove(i);
            batch.insert(0, c);
            return;
        }
        let c = task.space.from_state(&state).unwrap_or(Candidate {
            sketch: usize::MAX,
            decisions: Vec::new(),
            state,
        });
        batch.insert(0, c);
        batch.truncate(n.max(1));
    }

    /// Propose: up to `n` new programs of the task, ranked by the model and seeded with the
    /// best measured ones.
    fn propose(&mut self, task: &mut Task, n: usize, rng: &mut ChaCha8Rng) -> Vec<Candidate> {
        task.good.sort_by(|a, b| a.0.total_cmp(&b.0));
        let seeds: Vec<Candidate> = task
            .good
            .iter()
            .take(self.opts.population / 5 + 1)
            .map(|(_, c)| c.clone())
            .collect();
        let mut scorer = ModelScorer {
            model: self.model.as_ref(),
            core: CoreModel::for_target(&self.target),
        };
        // A model that has learnt nothing yet ranks with an untrained estimate at best.
        // Half the batch is drawn at random (the first round trains the model, which learns
        // more from programs of every kind). The other half: where the scores are an
        // estimate (`AnalyticModel`, or a GBDT model before its warm-up), the best of a
        // population evolved by it as in an informed round, which reached better programs
        // than ranking a random sample (on depthwise conv2d the estimate's best are few and
        // far apart among random draws; docs/measurements.md, "The first round evolved by
        // the estimate"); where they are random, the first of a random sample of 4n
        // programs (so that repeats and measured ones still leave n), since evolving by
        // random scores would only cost time.
        let uninformed;
        let search_opts = if self.model.is_informed() {
            &self.opts
        } else if self.model.has_prior() {
            uninformed = TuneOptions {
                eps_greedy: UNINFORMED_RANDOM_SHARE,
                ..self.opts.clone()
            };
            &uninformed
        } else {
            uninformed = TuneOptions {
                population: (4 * n).min(self.opts.population.max(n)),
                generations: 1,
                eps_greedy: UNINFORMED_RANDOM_SHARE,
                ..self.opts.clone()
            };
            &uninformed
        };
        task.space
            .propose(&mut scorer, &task.measured, &seeds, n, search_opts, rng)
    }

    /// Measure: the batch, with the hopeless cutoff at the task's best so far.
    fn measure(&mut self, task: &Task, batch: &[Candidate]) -> Vec<MeasureResult> {
        let states: Vec<State> = batch.iter().map(|c| c.state.clone()).collect();
        let best = task.report.best.as_ref().map(|b| b.latency_s);
        self.measurer.set_cutoff(best, self.opts.hopeless_factor);
        self.measurer.measure(&task.input.dag, &states)
    }

    /// Record: the batch into the task's bookkeeping and, in one transaction, the database.
    /// Returns the failures and whether the best improved.
    fn record(
        &mut self,
        task: &mut Task,
        rs: &RunState,
        batch: &[Candidate],
        results: &[MeasureResult],
    ) -> Result<(usize, bool), TuneError> {
        let workload = Workload::new(task.input.key.clone(), task.flops);
        let mut rows = Vec::with_capacity(batch.len());
        let (mut errors, mut improved) = (0, false);
        for (c, r) in batch.iter().zip(results) {
            // The measurer's own failure says nothing of the program: not stored, and the
            // program may be proposed again.
            if matches!(r, Err(e) if e.kind == MeasureErrorKind::Internal) {
                errors += 1;
                continue;
            }
            task.mark_measured(&c.state);
            rows.push(NewRecord::from(Measured {
                workload: &workload,
                target: &rs.target,
                state: &c.state,
                result: r,
            }));
            match r {
                Ok(tm) => {
                    task.report.cut_short += tm.cut_short as usize;
                    // Only a sketch's instance seeds the search (mutation works on
                    // its decisions): not the loops as written of `offer_default`.
                    if c.sketch < task.space.sketches.len() {
                        task.good.push((tm.median_s, c.clone()));
                    }
                    improved |= task.offer_best(&c.state, tm.median_s);
                }
                Err(_) => errors += 1,
            }
        }
        if let Some(db) = self.db.as_deref_mut() {
            db.insert_batch(rs.run, &rows)?;
        }
        Ok((errors, improved))
    }

    /// Learn: retrain on the batch, unless it is the budget's last (no search would use the
    /// model; at 256 trials, the last training is the longest of four).
    ///
    /// Cut-short programs are trained on too, with their one (or cut-off) time: that time is
    /// only rough, but it is several times the best, which is what the model must learn of
    /// them. Left out, a workload where most random programs are hopeless (matmul 1024^3: 217
    /// of 256) never gives the model its warm-up samples, and the search stays random.
    fn learn(
        &mut self,
        task: &Task,
        done_before: usize,
        batch: &[Candidate],
        results: &[MeasureResult],
    ) {
        if done_before + batch.len() >= self.opts.trials {
            return;
        }
        let core = CoreModel::for_target(&self.target);
        let new: Vec<Sample> = batch
            .par_iter()
            .zip(results)
            .filter_map(|(c, r)| {
                Self::sample_of(
                    &core,
                    &task.input.key,
                    task.flops,
                    &c.state,
                    r.as_ref().ok().map(|t| t.median_s),
                )
            })
            .collect();
        // A model that cannot learn from a batch (all failed, say) keeps ranking as before.
        if self.model.update(&new).is_ok() {
            self.trained_on += new.len();
        }
    }

    /// Report: the task's counts, curve, early stop, and the observer.
    fn report(
        &self,
        task: &mut Task,
        rs: &RunState,
        measured: usize,
        errors: usize,
        improved: bool,
        observer: &mut dyn Observer,
    ) {
        task.report.trials += measured;
        task.report.errors += errors;
        task.status.trials += measured;
        task.status.last_round = measured;
        let best = task
            .report
            .best
            .as_ref()
            .map(|b| b.latency_s)
            .unwrap_or(f64::INFINITY);
        task.status.history.push(best);
        task.report.curve.push((task.report.trials, best));
        task.since_improvement = if improved {
            0
        } else {
            task.since_improvement + measured
        };
        if self
            .opts
            .early_stop
            .is_some_and(|e| task.since_improvement >= e)
        {
            task.status.done = true;
        }
        observer.round(&RoundInfo {
            key: task.input.key.clone(),
            trials_done: rs.done_trials,
            trials_total: self.opts.trials,
            best_gflops: task.report.best_gflops(),
            errors,
            elapsed_s: rs.start.elapsed().as_secs_f64(),
        });
    }

    /// Closes the records run and sums up.
    fn finish(
        &mut self,
        tasks: Vec<Task>,
        mut rs: RunState,
        stats0: crate::measure::MeasureStats,
    ) -> Result<TuneSummary, TuneError> {
        if let (Some(db), Some(r)) = (self.db.as_deref_mut(), rs.run) {
            db.finish_run(r)?;
        }
        rs.phases.total_s = rs.start.elapsed().as_secs_f64();
        let stats = self.measurer.stats();
        rs.phases.compile_s = stats.compile_s - stats0.compile_s;
        rs.phases.run_s = stats.run_s - stats0.run_s;
        rs.phases.check_s = stats.check_s - stats0.check_s;
        rs.phases.first_run_s = stats.first_run_s - stats0.first_run_s;
        Ok(TuneSummary {
            tasks: tasks.into_iter().map(|t| t.report).collect(),
            phases: rs.phases,
            run: rs.run,
        })
    }

    /// How many samples the model has learned from in this run (the budget's last batch is
    /// not trained on: no search follows it).
    pub fn trained_on(&self) -> usize {
        self.trained_on
    }
}

/// Outcome of a record as a latency, for callers reading records back.
pub fn latency_of(o: &Outcome) -> Option<f64> {
    o.timing().map(|t| t.median_s)
}
