//! The analytic model: the kernel group's own estimate of a program's cycles, no training.
//!
//! It scores a program by minus its estimated cycles (the cost of its micro-kernels and
//! cache misses on a model core, see [`crate::features::names`]): the whole program's where
//! the features were extracted from it ([`ProgramFeatures::estimated_cycles`]: a search's
//! candidates, programs of one workload, so a program that recomputes pays for it), else
//! its `program_cycles_per_flop` feature. On the tuning records of one AVX-512 EPYC it
//! alone ranks pairs of programs better than random
//! scores, though worse than the trained trees (docs/measurements.md, "A micro-kernel
//! feature group"). The search ranks with it until
//! the learned model has samples enough to train on, so that its first round measures fewer
//! hopeless programs.

use super::random::RandomModel;
use super::{validate, CostModel, Sample};
use crate::error::ModelError;
use crate::features::{ProgramFeatures, FEATURE_NAMES};

/// Scores programs by their estimated cycles, or cycles per flop (fewer is better); ties,
/// and programs without stores, are broken by a seeded random draw. GPU programs (a
/// thread-bound loop) get the random draw alone: the estimate models a CPU core.
#[derive(Debug)]
pub struct AnalyticModel {
    column: Option<usize>,
    gpu: Option<usize>,
    ties: RandomModel,
}

impl AnalyticModel {
    /// A model whose tie-breaking draws are fixed by `seed`.
    pub fn new(seed: u64) -> AnalyticModel {
        AnalyticModel {
            column: FEATURE_NAMES
                .iter()
                .position(|n| *n == "program_cycles_per_flop"),
            gpu: FEATURE_NAMES.iter().position(|n| *n == "is_gpu"),
            ties: RandomModel::new(seed),
        }
    }
}

impl CostModel for AnalyticModel {
    /// Validates the samples and otherwise ignores them: nothing is learnt.
    fn update(&mut self, samples: &[Sample]) -> Result<(), ModelError> {
        validate(samples)
    }

    /// Never informed (it learns nothing), but an estimate: see [`CostModel::has_prior`].
    fn is_informed(&self) -> bool {
        false
    }

    fn has_prior(&self) -> bool {
        true
    }

    fn predict(&self, programs: &[ProgramFeatures]) -> Result<Vec<f64>, ModelError> {
        let noise = self.ties.predict(programs)?;
        Ok(programs
            .iter()
            .zip(noise)
            .map(|(p, u)| {
                // The feature is stored as log2(1 + x); a millionth of a doubling apart
                // counts as a tie.
                let row = p.row(0);
                // The model core is a CPU's: a GPU program gets its random draw alone.
                let gpu = self.gpu.is_some_and(|g| row.is_some_and(|r| r[g] > 0.0));
                // The whole program's cycles where the features came with them (a search's
                // candidates: programs of one workload, where recomputing a value costs),
                // else the per-flop feature (records read back), both as log2(1 + x).
                let whole = p.estimated_cycles().map(|c| c.max(0.0).ln_1p() / 2f64.ln());
                match whole.or_else(|| self.column.and_then(|c| row.map(|r| f64::from(r[c])))) {
                    Some(_) if gpu => u,
                    Some(v) if row.is_some() => -v + 1e-6 * u,
                    _ => -1e9 + u,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_schedules::{lower::lower, ops::WorkloadSpec, schedule::State};

    fn matmul(tile: Option<(i64, i64)>) -> ProgramFeatures {
        let dag = WorkloadSpec::parse("matmul:M=64,N=64,K=64")
            .unwrap()
            .build()
            .unwrap();
        let mut s = State::new(&dag);
        if let Some((ti, tj)) = tile {
            s.tile(2, 0, 1, ti, tj).unwrap();
            s.reorder(2, &[0, 1, 4, 2, 3]).unwrap();
            s.unroll(2, 3).unwrap();
            s.vectorize(2, 4).unwrap();
        }
        ProgramFeatures::extract(&lower(&s).unwrap())
    }

    #[test]
    fn a_register_tile_ranks_above_the_naive_loop_nest() {
        let m = AnalyticModel::new(3);
        let programs = [
            matmul(None),
            matmul(Some((8, 16))),
            matmul(Some((1, 16))),
            ProgramFeatures::from_flat(vec![]).unwrap(),
        ];
        let s = m.predict(&programs).unwrap();
        // Naive < one accumulator chain < an 8x16 tile; no stores at all last.
        assert!(s[1] > s[2] && s[2] > s[0] && s[0] > s[3], "{s:?}");
        // It learns nothing, but its ranking is worth a search's generations; a random
        // model's is not.
        assert!(!m.is_informed() && m.has_prior());
        let random = crate::RandomModel::new(3);
        assert!(!random.is_informed() && !random.has_prior());
        // The same seed, the same scores.
        assert_eq!(AnalyticModel::new(3).predict(&programs).unwrap(), s);
    }

    #[test]
    fn a_program_that_recomputes_pays_for_it() {
        // softmax with each row's sum computed inside the loop over the row's outputs sums
        // the row once per output: per float operation it looks no worse than the program
        // that sums once (the sums are float operations too), in all it is.
        let dag = WorkloadSpec::parse("softmax:M=64,N=256")
            .unwrap()
            .build()
            .unwrap();
        let stored = State::new(&dag);
        let mut again = stored.clone();
        again.compute_at(3, 4, 1).unwrap();
        let f = |s: &State| ProgramFeatures::extract(&lower(s).unwrap());
        let (a, b) = (f(&stored), f(&again));
        assert!(b.estimated_cycles().unwrap() > a.estimated_cycles().unwrap());
        let s = AnalyticModel::new(1)
            .predict(&[a.clone(), b.clone()])
            .unwrap();
        assert!(s[0] > s[1], "{s:?}");
        // Read back from values (a model file, a test set built by hand) the features have no
        // whole-program estimate: the per-flop feature ranks.
        let flat = |p: &ProgramFeatures| ProgramFeatures::from_flat(p.as_flat().to_vec()).unwrap();
        assert_eq!(flat(&a).estimated_cycles(), None);
        let per_flop = AnalyticModel::new(1)
            .predict(&[flat(&a), flat(&b)])
            .unwrap();
        let col = FEATURE_NAMES
            .iter()
            .position(|n| *n == "program_cycles_per_flop")
            .unwrap();
        let pf = |p: &ProgramFeatures| p.row(0).unwrap()[col];
        assert_eq!(per_flop[0] > per_flop[1], pf(&a) < pf(&b), "{per_flop:?}");
    }

    #[test]
    fn gpu_programs_get_random_scores() {
        let col = |name: &str| FEATURE_NAMES.iter().position(|n| *n == name).unwrap();
        let program = |gpu: f32, per_flop: f32| {
            let mut row = vec![0.0f32; crate::features::N_FEATURES];
            row[col("is_gpu")] = gpu;
            row[col("program_cycles_per_flop")] = per_flop;
            ProgramFeatures::from_flat(row).unwrap()
        };
        let gpu = [program(1.0, 0.1), program(1.0, 5.0)];
        let random = RandomModel::new(9).predict(&gpu).unwrap();
        assert_eq!(AnalyticModel::new(9).predict(&gpu).unwrap(), random);
        let cpu = [program(0.0, 0.1), program(0.0, 5.0)];
        let s = AnalyticModel::new(9).predict(&cpu).unwrap();
        assert!(s[0] > s[1]);
    }
}
