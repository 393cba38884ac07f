//! tensortune-cost-model: what the search believes about programs it has not measured.
//!
//! The search measures a few dozen programs per round and ranks thousands with a cost model,
//! so the model's ranking quality decides how fast tuning converges. This crate owns:
//! - [`features`]: per-store features of lowered loop IR ([`ProgramFeatures`], documented
//!   column by column in [`features::names`]);
//! - [`model`]: the [`CostModel`] trait, the XGBoost model [`GbdtModel`] (with save and
//!   load), the untrained [`AnalyticModel`] it ranks with until it has trained, and the
//!   baseline [`RandomModel`];
//! - [`dataset`]: training samples from a records database;
//! - [`metrics`] and [`eval`]: ranking accuracy, Spearman correlation, top-k recall, and the
//!   held-out evaluation behind `tensortune model eval`.
//!
//! ```
//! use tensortune_cost_model::{CostModel, GbdtModel, GbdtOptions, ProgramFeatures, Sample};
//! use tensortune_schedules::{lower::lower, ops::WorkloadSpec, random::random_state};
//!
//! let dag = WorkloadSpec::parse("matmul:M=32,N=32,K=32")?.build()?;
//! let programs: Vec<ProgramFeatures> = (0..4)
//!     .map(|seed| Ok(ProgramFeatures::extract(&lower(&random_state(&dag, seed, 8, false))?)))
//!     .collect::<Result<_, Box<dyn std::error::Error>>>()?;
//! let mut model = GbdtModel::new(GbdtOptions { warmup_samples: 0, rounds: 5, ..Default::default() })?;
//! let samples: Vec<Sample> = programs.iter().enumerate().map(|(i, f)| Sample {
//!     features: f.clone(),
//!     workload: "matmul:K=32,M=32,N=32,dtype=f32".into(),
//!     throughput: 1e9 * (i + 1) as f64,
//! }).collect();
//! model.update(&samples)?;
//! let scores = model.predict(&programs)?;
//! assert_eq!(scores.len(), 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod dataset;
mod error;
pub mod eval;
pub mod features;
pub mod metrics;
pub mod model;

pub use error::ModelError;
pub use features::{CoreModel, ProgramFeatures, FEATURE_NAMES, N_FEATURES, N_PROGRAM_FEATURES};
pub use model::analytic::AnalyticModel;
pub use model::gbdt::{GbdtModel, GbdtOptions, Objective};
pub use model::random::RandomModel;
pub use model::{CostModel, Sample};
