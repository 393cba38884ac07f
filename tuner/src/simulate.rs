//! A simulated measurer: a known, deterministic cost of a schedule, for testing the search
//! without compiling anything.
//!
//! The latency of a program is `base * (1 + sum of squared log2 distances)` between each tile
//! factor of its decisions and a target factor drawn from the seed among the divisors of the
//! loop's extent, plus a penalty for each location or parallel choice away from its target. The
//! optimum (every decision on target) has latency `base`, and random sampling rarely finds it,
//! so a search that learns must beat random sampling with the same budget. A target depends on
//! the hole's position, not on the sketch: sketches of one workload that share their leading
//! holes (tiling with and without packing) share the landscape there, as real programs do.

use crate::measure::{MeasureError, MeasureErrorKind, MeasureResult, Measurer, Timing};
use crate::sketch::{ChoiceKind, Hole, Sketch};
use std::collections::HashMap;
use tensortune_schedules::schedule::State;
use tensortune_schedules::ComputeDag;

/// Measures by the known cost function; counts how often it was asked.
pub struct SimulatedMeasurer {
    sketches: Vec<Sketch>,
    targets: HashMap<String, Vec<Vec<i64>>>,
    base: f64,
    /// Candidates measured so far.
    pub measured: usize,
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl SimulatedMeasurer {
    /// A measurer for programs of `sketches`, with targets drawn from `seed`.
    pub fn new(sketches: &[Sketch], seed: u64, base: f64) -> SimulatedMeasurer {
        let mut targets = HashMap::new();
        for s in sketches {
            let mut t: Vec<Vec<i64>> = s
                .holes
                .iter()
                .enumerate()
                .map(|(h, hole)| {
                    let r = |i: u64| mix(seed ^ ((h as u64) << 20) ^ i);
                    match hole {
                        Hole::Tile {
                            extent,
                            parts,
                            max_inner,
                            max_first,
                        } => {
                            let mut rest = *extent;
                            let mut f = vec![1; parts - 1];
                            for l in (0..f.len()).rev() {
                                let cap = crate::sketch::sample::level_cap(
                                    l,
                                    f.len(),
                                    *max_inner,
                                    *max_first,
                                );
                                let divs: Vec<i64> = crate::sketch::sample::divisors(rest)
                                    .into_iter()
                                    .filter(|&d| d <= cap)
                                    .collect();
                                f[l] = divs[(r(l as u64) % divs.len() as u64) as usize];
                                rest /= f[l];
                            }
                            f
                        }
                        Hole::Choice { choices, .. } => {
                            vec![choices[(r(99) % choices.len() as u64) as usize]]
                        }
                    }
                })
                .collect();
            s.clamp_to_caps(&mut t, |_| 0);
            targets.insert(s.name.clone(), t);
        }
        SimulatedMeasurer {
            sketches: sketches.to_vec(),
            targets,
            base,
            measured: 0,
        }
    }

    /// The simulated latency of a state built from one of the sketches.
    pub fn latency(&self, state: &State) -> Option<f64> {
        let r = state.trace().sketch.as_ref()?;
        let t = self.targets.get(&r.name)?;
        let sk = self.sketches.iter().find(|s| s.name == r.name)?;
        let mut cost = 0.0;
        for ((hole, d), want) in sk.holes.iter().zip(&r.decisions).zip(t) {
            match hole {
                Hole::Tile { .. } => {
                    for (a, b) in d.iter().zip(want) {
                        let x = (*a as f64).log2() - (*b as f64).log2();
                        cost += x * x;
                    }
                }
                // An unroll limit often lowers to the same program as its neighbours (every
                // nest is shorter than both), and the search measures a program once: a
                // price on it would hide optima behind measured twins.
                Hole::Choice {
                    kind: ChoiceKind::Unroll,
                    ..
                } => {}
                Hole::Choice { .. } => {
                    if d != want {
                        cost += 0.5;
                    }
                }
            }
        }
        Some(self.base * (1.0 + cost))
    }

    /// The best latency any program can have.
    pub fn optimum(&self) -> f64 {
        self.base
    }
}

impl Measurer for SimulatedMeasurer {
    fn measure(&mut self, _dag: &ComputeDag, candidates: &[State]) -> Vec<MeasureResult> {
        candidates
            .iter()
            .map(|s| {
                self.measured += 1;
                match self.latency(s) {
                    Some(l) => Timing::from_repeats(vec![l; 3], 1)
                        .ok_or_else(|| MeasureError::new(MeasureErrorKind::Internal, "no timing")),
                    None => Err(MeasureError::new(
                        MeasureErrorKind::Internal,
                        "not a program of the simulated sketches",
                    )),
                }
            })
            .collect()
    }

    fn target_key(&self) -> String {
        "simulated".to_string()
    }
}
