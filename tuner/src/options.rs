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

impl TuneOptions {
    /// Checks every knob against the range it works in: probabilities in `[0, 1]`, sizes that
    /// neither overflow the search's arithmetic (it multiplies the population and the batch by
    /// small factors) nor ask for more than a machine holds, an unroll list with at least one
    /// value and no repeats. Counts that are only compared (`trials`, `model_warmup`,
    /// `early_stop`) may be as large as they like: `usize::MAX` trials under a time budget,
    /// or a model that never warms up. [`crate::tuning::Tuner::run`] refuses options that fail, with
    /// this message, before anything is measured or stored.
    pub fn validate(&self) -> Result<(), String> {
        let count = |name: &str, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be between {lo} and {hi}, not {v}"))
            }
        };
        let prob = |name: &str, p: f64| {
            if (0.0..=1.0).contains(&p) {
                Ok(())
            } else {
                Err(format!("{name} must be a probability in [0, 1], not {p}"))
            }
        };
        count("batch_size", self.batch_size, 1, 1 << 16)?;
        count("population", self.population, 1, 1 << 20)?;
        count("generations", self.generations, 0, 1 << 16)?;
        count("threads", self.threads, 0, 1 << 16)?;
        count("remeasure_top", self.remeasure_top, 0, 1 << 16)?;
        prob("mutation_prob", self.mutation_prob)?;
        prob("init_from_records", self.init_from_records)?;
        prob("eps_greedy", self.eps_greedy)?;
        prob("imperfect_tile_prob", self.imperfect_tile_prob)?;
        let w = &self.mutation_weights;
        let weights = [w.tile_size, w.compute_location, w.unroll, w.parallel];
        if weights.iter().any(|x| !x.is_finite() || *x < 0.0) || weights.iter().sum::<f64>() <= 0.0
        {
            return Err(format!(
                "mutation_weights must be finite, non-negative and not all zero, not {weights:?}"
            ));
        }
        if let Some(t) = self.time_budget_s {
            if !(t.is_finite() && t >= 0.0) {
                return Err(format!(
                    "time_budget_s must be a finite number of seconds, not {t}"
                ));
            }
        }
        if !(self.hopeless_factor.is_finite() && self.hopeless_factor > 0.0) {
            return Err(format!(
                "hopeless_factor must be finite and positive, not {}",
                self.hopeless_factor
            ));
        }
        if let Some(m) = self.max_unrolled_statements {
            if m < 0 {
                return Err(format!(
                    "max_unrolled_statements must be at least 0, not {m}"
                ));
            }
        }
        let steps = &self.unroll_steps;
        if steps.is_empty() {
            return Err("unroll_steps needs at least one value (0: no unrolling)".to_string());
        }
        if steps
            .iter()
            .enumerate()
            .any(|(i, s)| steps[..i].contains(s))
        {
            return Err(format!("unroll_steps repeats a value: {steps:?}"));
        }
        if let Some(&s) = steps.iter().find(|&&s| s > 1 << 16) {
            return Err(format!(
                "unroll_steps: {s} is past the largest unroll step, {}",
                1 << 16
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_knobs_out_of_range_do_not() {
        TuneOptions::default().validate().expect("defaults");
        let bad: Vec<(&str, TuneOptions)> = vec![
            (
                "mutation_prob",
                TuneOptions {
                    mutation_prob: f64::NAN,
                    ..Default::default()
                },
            ),
            (
                "imperfect_tile_prob",
                TuneOptions {
                    imperfect_tile_prob: 1.5,
                    ..Default::default()
                },
            ),
            (
                "unroll_steps",
                TuneOptions {
                    unroll_steps: vec![],
                    ..Default::default()
                },
            ),
            (
                "unroll_steps",
                TuneOptions {
                    unroll_steps: vec![16, 16],
                    ..Default::default()
                },
            ),
            (
                "population",
                TuneOptions {
                    population: usize::MAX,
                    ..Default::default()
                },
            ),
            (
                "batch_size",
                TuneOptions {
                    batch_size: 0,
                    ..Default::default()
                },
            ),
            (
                "time_budget_s",
                TuneOptions {
                    time_budget_s: Some(f64::INFINITY),
                    ..Default::default()
                },
            ),
            (
                "hopeless_factor",
                TuneOptions {
                    hopeless_factor: -1.0,
                    ..Default::default()
                },
            ),
            (
                "mutation_weights",
                TuneOptions {
                    mutation_weights: MutationWeights {
                        tile_size: 0.0,
                        compute_location: 0.0,
                        unroll: 0.0,
                        parallel: 0.0,
                    },
                    ..Default::default()
                },
            ),
        ];
        for (name, o) in bad {
            let e = o.validate().expect_err(name);
            assert!(e.starts_with(name), "{name}: {e}");
        }
    }
}
