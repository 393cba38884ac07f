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
