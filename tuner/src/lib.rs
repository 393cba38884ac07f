//! tensortune-tuner: the search. It owns the search space and how it is explored, and never
//! compiles or runs code itself (that is the [`Measurer`]'s job, implemented by the root
//! crate), so everything here is tested with a simulated measurer.
//!
//! - [`sketch`]: sketch rules on the DAG (traces with holes) and random annotation;
//! - [`mutate`]: the mutators of decisions;
//! - [`search`]: the evolutionary search ranked by a cost model;
//! - `tuning`: the tuning loop (search, measure, record, retrain) and resume, with the
//!   cost model (feature `model`, on by default);
//! - [`scheduler`]: the task scheduler for several workloads;
//! - [`measure`]: the [`Measurer`] trait; [`simulate`]: a measurer with a known optimum;
//! - [`options`]: [`TuneOptions`], every knob in one place.
//!
//! Tuning a matmul against the simulated measurer (a latency model with a known optimum), so
//! nothing is compiled; the root crate's `tune()` runs the same loop with a real measurer:
//!
//! ```
//! # #[cfg(feature = "model")] {
//! use tensortune_cost_model::RandomModel;
//! use tensortune_schedules::ops::WorkloadSpec;
//! use tensortune_tuner::search::SearchSpace;
//! use tensortune_tuner::simulate::SimulatedMeasurer;
//! use tensortune_tuner::tuning::{Silent, TaskInput, Tuner};
//! use tensortune_tuner::TuneOptions;
//!
//! let spec = WorkloadSpec::parse("matmul:M=64,N=64,K=64")?;
//! let dag = spec.build()?;
//! let opts = TuneOptions {
//!     trials: 32,
//!     batch_size: 16,
//!     population: 64,
//!     generations: 2,
//!     quiet: true,
//!     ..TuneOptions::default()
//! };
//! let space = SearchSpace::new(dag.clone(), &opts);
//! let mut measurer = SimulatedMeasurer::new(&space.sketches, 0, 1e-3);
//! let optimum = measurer.optimum();
//! let model = Box::new(RandomModel::new(0));
//! let mut tuner = Tuner::new(opts, &mut measurer, None, model);
//! let task = TaskInput { key: spec.canonical(), dag, weight: 1.0 };
//! let summary = tuner.run(vec![task], &mut Silent)?;
//! let best = summary.tasks[0].best.as_ref().ok_or("no program measured")?;
//! assert!(best.latency_s >= optimum);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod measure;
pub mod mutate;
pub mod options;
pub mod scheduler;
pub mod search;
pub mod simulate;
pub mod sketch;
#[cfg(feature = "model")]
pub mod tuning;

pub use measure::{MeasureError, MeasureErrorKind, MeasureResult, MeasureStats, Measurer, Timing};
pub use options::TuneOptions;
