//! Program features: what the cost model sees of a lowered program.
//!
//! [`ProgramFeatures::extract`] turns a [`LoweredFunc`] into one row of [`N_FEATURES`] `f32`
//! per `Store` statement, in program order (so the init and the update of a reduction are two
//! rows). The meaning of every column is documented in [`names`] and spelled by
//! [`FEATURE_NAMES`]. Extraction is deterministic (a pure function of the IR) and never
//! fails: a malformed index only makes its access features a neutral guess.
//!
//! ```
//! use tensortune_cost_model::{ProgramFeatures, FEATURE_NAMES, N_FEATURES};
//! use tensortune_schedules::{lower::lower, ops::WorkloadSpec, schedule::State};
//!
//! let dag = WorkloadSpec::parse("matmul:M=64,N=64,K=64")?.build()?;
//! let func = lower(&State::new(&dag))?;
//! let f = ProgramFeatures::extract(&func);
//! assert_eq!(f.num_rows(), 2); // C = 0, then C += A * B
//! let outer = FEATURE_NAMES.iter().position(|n| *n == "outer_prod").unwrap();
//! assert_eq!(f.row(1).unwrap()[outer], (1.0f32 + 64.0 * 64.0 * 64.0).log2());
//! assert_eq!(f.row(0).unwrap().len(), N_FEATURES);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod extract;
mod index;
pub mod names;

pub use names::{FEATURE_NAMES, MAX_BUFFERS, N_FEATURES};

use serde::{Deserialize, Serialize};
use tensortune_schedules::ir::LoweredFunc;

/// The features of one program: `num_rows()` rows of [`N_FEATURES`] values, one per store.
///
/// Invariant: `values.len() == num_rows * N_FEATURES`, and every value is finite. Reading
/// (serde) checks it too: a model file is outside input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "FlatFeatures")]
pub struct ProgramFeatures {
    values: Vec<f32>,
}

/// The serialized form of [`ProgramFeatures`], before its invariant is checked.
#[derive(Deserialize)]
struct FlatFeatures {
    values: Vec<f32>,
}

impl TryFrom<FlatFeatures> for ProgramFeatures {
    type Error = String;

    fn try_from(flat: FlatFeatures) -> Result<ProgramFeatures, String> {
        let n = flat.values.len();
        ProgramFeatures::from_flat(flat.values).ok_or_else(|| {
            format!("{n} feature values are not whole rows of {N_FEATURES} finite numbers")
        })
    }
}

impl ProgramFeatures {
    /// Extracts the features of a lowered program (microseconds for a typical kernel).
    pub fn extract(func: &LoweredFunc) -> ProgramFeatures {
        let (mut values, _) = extract::extract_rows(func);
        // Products of extents are finite for any real program; keep the invariant anyway.
        for v in &mut values {
            if !v.is_finite() {
                *v = 0.0;
            }
        }
        ProgramFeatures { values }
    }

    /// Builds features from rows given directly (tests, synthetic data). Returns `None`
    /// unless the length is a multiple of [`N_FEATURES`] and every value is finite.
    pub fn from_flat(values: Vec<f32>) -> Option<ProgramFeatures> {
        (values.len().is_multiple_of(N_FEATURES) && values.iter().all(|v| v.is_finite()))
            .then_some(ProgramFeatures { values })
    }

    /// Number of rows (stores).
    pub fn num_rows(&self) -> usize {
        self.values.len() / N_FEATURES
    }

    /// Row `i`, if it exists.
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        self.values.get(i * N_FEATURES..(i + 1) * N_FEATURES)
    }

    /// The rows, one after the other (row-major, `num_rows() * N_FEATURES` values).
    pub fn as_flat(&self) -> &[f32] {
        &self.values
    }

    /// The value of the feature called `name` in row `i` (for tests and inspection).
    pub fn get(&self, i: usize, name: &str) -> Option<f32> {
        let col = FEATURE_NAMES.iter().position(|n| *n == name)?;
        self.row(i).map(|r| r[col])
    }
}
