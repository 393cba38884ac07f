//! tensortune-tuner: search space and search (to be built: issue 6).
//!
//! - [`measure`]: the [`Measurer`] trait through which the search measures candidates.

pub mod measure;

pub use measure::{MeasureError, MeasureErrorKind, MeasureResult, Measurer, Timing};
