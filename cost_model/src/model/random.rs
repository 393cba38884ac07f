//! The random model: uniform scores from a seeded generator.
//!
//! It is the baseline every model must beat: its expected pairwise accuracy is 0.5.

use std::cell::RefCell;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::{validate, CostModel, Sample};
use crate::error::ModelError;
use crate::features::ProgramFeatures;

/// Scores every program uniformly in `[0, 1)`, ignoring its features. One seed gives one
/// sequence of scores across calls.
#[derive(Debug)]
pub struct RandomModel {
    rng: RefCell<ChaCha8Rng>,
}

impl RandomModel {
    /// A model whose scores are fixed by `seed`.
    pub fn new(seed: u64) -> RandomModel {
        RandomModel {
            rng: RefCell::new(ChaCha8Rng::seed_from_u64(seed)),
        }
    }
}

impl CostModel for RandomModel {
    /// Validates the samples and otherwise ignores them.
    fn update(&mut self, samples: &[Sample]) -> Result<(), ModelError> {
        validate(samples)
    }

    fn is_informed(&self) -> bool {
        false
    }

    fn predict(&self, programs: &[ProgramFeatures]) -> Result<Vec<f64>, ModelError> {
        let mut rng = self.rng.borrow_mut();
        Ok(programs.iter().map(|_| rng.random::<f64>()).collect())
    }
}
