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

pub use names::{FEATURE_NAMES, MAX_BUFFERS, N_FEATURES, N_PROGRAM_FEATURES};

use serde::{Deserialize, Serialize};
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::target::{TargetDesc, TargetKey};

/// The vector widths the micro-kernel features (the `kernel` group of [`names`]) cost a
/// program's innermost loops with: what the target says of its registers and FMA pipes. The
/// rest of that model core (ports, latencies, caches) is fixed: the trees learn their own
/// thresholds per target, and features of the records of one target key must come out the
/// same in every process, which the key alone guarantees (it names the CPU, not its caches).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CoreModel {
    /// Bytes of a vector register.
    pub vector_bytes: f64,
    /// Bytes one FMA pipe, load port or store port takes a cycle (half a register on Zen 4).
    pub unit_bytes: f64,
    /// Ways of each of the L1's 64 sets: more lines 4 KiB apart than this evict each other.
    pub l1_ways: u32,
}

impl Default for CoreModel {
    /// AVX-512 registers on 256-bit pipes (AMD Zen 4), the core the group was first built
    /// for; what [`ProgramFeatures::extract`] assumes.
    fn default() -> CoreModel {
        CoreModel {
            vector_bytes: 64.0,
            unit_bytes: 32.0,
            l1_ways: 8,
        }
    }
}

impl CoreModel {
    /// The widths of a CPU target ([`TargetDesc::Cpu`]'s `vector_bits` and
    /// `vector_unit_bits`); the default for a GPU.
    pub fn for_target(target: &TargetDesc) -> CoreModel {
        match target {
            TargetDesc::Cpu(c) => {
                let vector_bytes = f64::from(c.vector_bits.max(8) / 8);
                let unit = f64::from(c.vector_unit_bits.max(8) / 8);
                CoreModel {
                    vector_bytes,
                    unit_bytes: unit.min(vector_bytes),
                    l1_ways: c.l1_ways.max(1),
                }
            }
            TargetDesc::Cuda(_) => CoreModel::default(),
        }
    }

    /// The widths of the CPU a target key names (records carry their key); the default for a
    /// GPU key or text that is not a key.
    pub fn for_key(key: &str) -> CoreModel {
        key.parse::<TargetKey>()
            .ok()
            .and_then(|k| k.cpu_desc())
            .map(|d| CoreModel::for_target(&d))
            .unwrap_or_default()
    }
}

/// The features of one program: `num_rows()` rows of [`N_FEATURES`] values, one per store.
///
/// Invariant: `values.len() == num_rows * N_FEATURES`, and every value is finite. Reading
/// (serde) checks it too: a model file is outside input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "FlatFeatures")]
pub struct ProgramFeatures {
    values: Vec<f32>,
    /// The analytic estimate of the whole program's cycles, where it was extracted here
    /// ([`ProgramFeatures::estimated_cycles`]); not a feature, not serialized.
    #[serde(skip)]
    cycles: Option<f64>,
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

/// The analytic estimate of the cycles `func` takes on `core`, summed over its stores (the
/// micro-kernel group's estimate, before `program_cycles_per_flop` divides it by the
/// program's float operations, so that computing a value many times over counts every
/// time). What ranks programs where nothing has been measured: the CPU's default schedule.
pub fn estimated_cycles(func: &LoweredFunc, core: &CoreModel) -> f64 {
    extract::estimated_cycles(func, core)
}

impl ProgramFeatures {
    /// Extracts the features of a lowered program (microseconds for a typical kernel), its
    /// micro-kernel costed on the default [`CoreModel`].
    pub fn extract(func: &LoweredFunc) -> ProgramFeatures {
        ProgramFeatures::extract_for(func, &CoreModel::default())
    }

    /// [`ProgramFeatures::extract`] with the micro-kernel costed on `core` (a tuner passes
    /// its target's, [`CoreModel::for_target`]).
    pub fn extract_for(func: &LoweredFunc, core: &CoreModel) -> ProgramFeatures {
        let (mut values, cycles) = extract::extract_rows(func, core);
        // Products of extents are finite for any real program; keep the invariant anyway.
        for v in &mut values {
            if !v.is_finite() {
                *v = 0.0;
            }
        }
        ProgramFeatures {
            values,
            cycles: cycles.is_finite().then_some(cycles),
        }
    }

    /// Builds features from rows given directly (tests, synthetic data). Returns `None`
    /// unless the length is a multiple of [`N_FEATURES`] and every value is finite.
    pub fn from_flat(values: Vec<f32>) -> Option<ProgramFeatures> {
        (values.len().is_multiple_of(N_FEATURES) && values.iter().all(|v| v.is_finite())).then_some(
            ProgramFeatures {
                values,
                cycles: None,
            },
        )
    }

    /// The analytic estimate of the program's cycles ([`estimated_cycles`]) where these
    /// features were extracted from the program here; `None` for features built from values
    /// ([`ProgramFeatures::from_flat`], a file). Unlike `program_cycles_per_flop` it charges
    /// a program that computes a value many times over for every time.
    pub fn estimated_cycles(&self) -> Option<f64> {
        self.cycles
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

    /// The program as one row of [`N_PROGRAM_FEATURES`] values, what the ranking model
    /// (`rank:pairwise`) scores: the row of its costliest store (the largest
    /// `row_cycles_per_flop`, the analytic estimate's share of that store), then the sum of all
    /// its rows (each column summed as the count it stands for, `2^|v| - 1` with its sign,
    /// and stored as the rows are, `slog`), then `slog` of its number of rows. All zeros for a
    /// program without stores.
    ///
    /// A model of rows summed per program has to learn from every store what only the
    /// program's time says; one row per program with its main store and its totals ranked
    /// programs of held-out shapes better (docs/measurements.md, "One row per program, its
    /// main store and its totals").
    pub fn program_row(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; N_PROGRAM_FEATURES];
        let n = self.num_rows();
        if n == 0 {
            return out;
        }
        let cost = names::ROW_CYCLES_PER_FLOP;
        let main = (0..n)
            .filter_map(|i| self.row(i))
            .fold(None::<&[f32]>, |best, r| match best {
                Some(b) if b[cost] >= r[cost] => Some(b),
                _ => Some(r),
            });
        if let Some(main) = main {
            out[..N_FEATURES].copy_from_slice(main);
        }
        let mut sums = vec![0.0f64; N_FEATURES];
        for r in (0..n).filter_map(|i| self.row(i)) {
            for (s, &v) in sums.iter_mut().zip(r) {
                *s += unslog(v);
            }
        }
        for (o, &s) in out[N_FEATURES..2 * N_FEATURES].iter_mut().zip(&sums) {
            // Values from a file may stand for more than an f64 holds: keep the row finite.
            let s = if s.is_nan() {
                0.0
            } else {
                s.clamp(-f64::MAX, f64::MAX)
            };
            *o = extract::slog(s);
        }
        out[2 * N_FEATURES] = extract::slog(n as f64);
        out
    }

    /// The value of the feature called `name` in row `i` (for tests and inspection).
    pub fn get(&self, i: usize, name: &str) -> Option<f32> {
        let col = FEATURE_NAMES.iter().position(|n| *n == name)?;
        self.row(i).map(|r| r[col])
    }
}

/// The inverse of the `slog` every feature is stored as: the count or size a value stands
/// for.
fn unslog(v: f32) -> f64 {
    let v = f64::from(v);
    v.signum() * (v.abs().exp2() - 1.0)
}
