//! Every knob of a tuning run, in one serde struct.
//!
//! Defaults are Ansor's where Ansor has one (the source is noted per field); the rest are
//! ours and say why.

use serde::{Deserialize, Serialize};

/// Options of a tuning run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TuneOptions {
    /// Total candidates to measure (per workload when tuning one, in all with several).
    pub trials: usize,
    /// Candidates measured per round (Ansor: 64).
    pub batch_size: usize,
    /// Stop after this many seconds of wall time, if set.
    pub time_budget_s: Option<f64>,
    /// Stop a workload after this many trials without a better result, if set.
    pub early_stop: Option<usize>,
    /// Seed of every random choice of the run.
    pub seed: u64,
    /// Worker threads the kernels may use (1: serial; no parallel loops are generated).
    pub threads: usize,
    /// Programs per generation of the evolutionary search (Ansor: 2048; TVM's MetaSchedule:
    /// 512). 512: scoring a generation (lowering and featurizing every program) is the
    /// search's whole cost, and larger populations found no faster programs in side-by-side
    /// runs (docs/measurements.md, "Population").
    pub population: usize,
    /// Generations per round (Ansor: 4).
    pub generations: usize,
    /// Probability that a child is a mutation of a parent rather than a copy (Ansor: 0.85).
    pub mutation_prob: f64,
    /// Relative weights of the mutations (Ansor: 0.90 / 0.05 / 0.04 / 0.01).
    pub mutation_weights: MutationWeights,
    /// Largest fraction of the initial population taken from the best measured records
    /// (Ansor: 0.2).
    pub init_from_records: f64,
    /// Fraction of each measured batch picked at random rather than by the model (Ansor: 0.05).
    pub eps_greedy: f64,
    /// Values the `auto_unroll_max_step` pragma takes (Ansor's CPU set).
    pub unroll_steps: Vec<u32>,
    /// Records measured before the learned model takes over from the untrained first round
    /// (half the batch by the analytic estimate, half random; Ansor waits for ~100 random
    /// ones; one batch is enough to rank away the worst tilings, which cost the most time).
    pub model_warmup: usize,
    /// Probability of a non-perfect tile size (with a guarded tail) when sampling.
    pub imperfect_tile_prob: f64,
    /// Programs whose loop IR, with unrolled loops copied out, holds more statements than
    /// this are not proposed (`None`: no limit; see `Stmt::unrolled_copies`). Compile time
    /// grows with that count and such programs were slow where measured, while the best
    /// programs held far fewer statements (docs/measurements.md, "Unrolled statements").
    pub max_unrolled_statements: Option<i64>,
    /// A candidate whose first run is this many times slower than the best so far is timed
    /// once and recorded as cut short (TVM spent minutes timing hopeless candidates fully).
    pub hopeless_factor: f64,
    /// Print nothing on stderr.
    pub quiet: bool,
    /// The records database to resume from and write to (none: records are not kept).
    pub db: Option<std::path::PathBuf>,
    /// Re-measure this many of the best programs at the end, interleaved, and report the
    /// re-measured best (0 disables).
    pub remeasure_top: usize,
    /// Which task gets each round when several are tuned together.
    pub task_scheduler: crate::scheduler::Policy,
    /// A cost model file (`tensortune model train --out`) the run starts from, instead of an
    /// untrained model.
    pub model_file: Option<std::path::PathBuf>,
    /// Without `model_file`: start from a model trained on the records that `db` holds of
    /// other workloads on the same target (a new shape starts warm), where there are any.
    pub warm_start: bool,
    /// The plan and shard this run tunes (`tensortune tune --plan`), recorded with its run.
    pub plan: Option<tensortune_records::RunPlan>,
}

/// Relative weights of the mutation kinds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MutationWeights {
    /// Move a factor between two levels of one tile.
    pub tile_size: f64,
    /// Change where a stage is computed.
    pub compute_location: f64,
    /// Change an `auto_unroll_max_step` value.
    pub unroll: f64,
    /// Change how many outer loops are fused into the parallel loop.
    pub parallel: f64,
}

impl Default for MutationWeights {
    fn default() -> Self {
        MutationWeights {
            tile_size: 0.90,
            compute_location: 0.05,
            unroll: 0.04,
            parallel: 0.01,
        }
    }
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            trials: 256,
            batch_size: 64,
            time_budget_s: None,
            early_stop: None,
            seed: 0,
            threads: 1,
            population: 512,
            generations: 4,
            mutation_prob: 0.85,
            mutation_weights: MutationWeights::default(),
            init_from_records: 0.2,
            eps_greedy: 0.05,
            unroll_steps: vec![0, 16, 64, 512],
            model_warmup: 64,
            imperfect_tile_prob: 0.1,
            max_unrolled_statements: Some(128),
            hopeless_factor: 4.0,
            quiet: false,
            db: None,
            remeasure_top: 3,
            task_scheduler: crate::scheduler::Policy::Gradient,
            model_file: None,
            warm_start: true,
            plan: None,
        }
    }
}
