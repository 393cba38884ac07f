//! The [`CostModel`] interface the search ranks candidates with, and what it learns from.
//!
//! A model maps the [`ProgramFeatures`] of a program to a score, higher meaning faster. It is
//! trained on [`Sample`]s: features plus the measured throughput and the workload they belong
//! to. Throughputs of different workloads are not comparable (a 1024³ matmul runs at many
//! more flop/s than a 16³ one), so models normalize them per workload before learning and
//! their scores rank programs *within* one workload.
//!
//! Implementations, one file each: [`gbdt`] (gradient-boosted trees with XGBoost, the model
//! the search uses once it has records), [`analytic`] (the feature extractor's own cost
//! estimate: what the search uses before it has enough records) and [`random`] (uniform
//! scores: the baseline).

pub mod analytic;
mod booster_check;
pub mod gbdt;
pub mod random;
mod xgboost;

use crate::error::ModelError;
use crate::features::ProgramFeatures;

/// One measured program.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// The program's features.
    pub features: ProgramFeatures,
    /// The workload key (canonical spec) the program computes; samples are normalized per
    /// workload.
    pub workload: String,
    /// Measured floating-point operations per second; 0.0 for a program that failed to build,
    /// run or check. Must be finite and non-negative.
    pub throughput: f64,
}

/// Scores programs so that the search can measure the promising ones first.
pub trait CostModel: Send {
    /// Learns from measured samples. What happens to earlier samples is the implementation's
    /// choice and documented there ([`gbdt::GbdtModel`] keeps them and retrains on all).
    /// Invalid throughputs (NaN, infinite, negative) reject the whole call with
    /// [`ModelError::InvalidThroughput`] and leave the model unchanged.
    fn update(&mut self, samples: &[Sample]) -> Result<(), ModelError>;

    /// One score per program, in order; higher is better. Scores are only comparable among
    /// programs of one workload.
    fn predict(&self, programs: &[ProgramFeatures]) -> Result<Vec<f64>, ModelError>;

    /// Whether the scores carry information: false for a model that has learnt nothing yet
    /// (a GBDT model before its warm-up) or never will (the random model), whose ranking is
    /// no better than random sampling, so a search need not spend time ranking with it.
    fn is_informed(&self) -> bool {
        true
    }

    /// Whether the scores rank programs better than chance even while the model is not
    /// [informed](CostModel::is_informed): true for the analytic estimate (and a GBDT model
    /// before its warm-up, which scores with it), false for the random model. A search may
    /// evolve a population by such scores; by a random model's it would only spend time.
    fn has_prior(&self) -> bool {
        self.is_informed()
    }
}

/// Checks that every throughput is finite and non-negative.
pub(crate) fn validate(samples: &[Sample]) -> Result<(), ModelError> {
    match samples
        .iter()
        .enumerate()
        .find(|(_, s)| !(s.throughput.is_finite() && s.throughput >= 0.0))
    {
        Some((index, s)) => Err(ModelError::InvalidThroughput {
            index,
            value: s.throughput,
        }),
        None => Ok(()),
    }
}
