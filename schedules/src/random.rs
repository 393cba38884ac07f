//! Seeded random schedules, for property tests of every layer below the search.
//!
//! [`random_state`] applies random primitives with random parameters, drawn from the current
//! state (stage and loop positions in range, factors that divide or do not), and keeps those
//! that apply. Invalid draws are part of the test: they must fail with an error, never panic.
//! The same seed gives the same state.

use crate::dag::ComputeDag;
use crate::data::SplitMix64;
use crate::ir::{PrefetchLevel, Scope, ThreadAxis};
use crate::schedule::{IterKind, Location, State};
use crate::trace::{Annotation, Step};

/// A small deterministic generator with the helpers the random schedules need.
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64(
            seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x1234_5678,
        ))
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.next_u64() % n
        }
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    /// One element of a non-empty slice.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> Option<T> {
        if xs.is_empty() {
            None
        } else {
            Some(xs[self.below(xs.len() as u64) as usize])
        }
    }
}

/// A factor for a loop of extent `ext`: usually a divisor, sometimes any value up to `ext`.
pub fn random_factor(rng: &mut Rng, ext: i64) -> i64 {
    if ext <= 1 {
        return 1;
    }
    if rng.chance(0.7) {
        let divs: Vec<i64> = (1..=ext).filter(|d| ext % d == 0).collect();
        rng.pick(&divs).unwrap_or(1)
    } else {
        1 + rng.below(ext as u64) as i64
    }
}

/// One random step for `state` (it may not apply).
pub fn random_step(state: &State, rng: &mut Rng) -> Option<Step> {
    let stages: Vec<u32> = state
        .stages()
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_placeholder())
        .map(|(i, _)| i as u32)
        .collect();
    let stage = rng.pick(&stages)?;
    let s = state.stage(stage as usize)?;
    let n = s.leaves.len() as u64;
    let iter = rng.below(n.max(1)) as u32;
    let ext = s.leaf(iter as usize).map(|l| l.extent).unwrap_or(1);
    Some(match rng.below(17) {
        0..=3 => {
            let k = 1 + rng.below(2) as usize;
            let mut factors = Vec::new();
            let mut rest = ext;
            for _ in 0..k {
                let f = random_factor(rng, rest);
                factors.push(f);
                rest = (rest + f - 1) / f.max(1);
            }
            factors.reverse();
            Step::Split {
                stage,
                iter,
                factors,
            }
        }
        4 => Step::SplitNParts {
            stage,
            iter,
            nparts: random_factor(rng, ext),
        },
        5 => Step::Fuse {
            stage,
            iters: vec![iter, iter + 1],
        },
        6 | 7 => {
            let mut order: Vec<u32> = (0..n as u32).collect();
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
            Step::Reorder { stage, order }
        }
        8 | 15 => {
            // Mostly into the stage's consumer (the only target that can work).
            let consumers: Vec<u32> = state
                .effective_consumers(s.tensor)
                .into_iter()
                .filter_map(|t| state.position_of(t).map(|p| p as u32))
                .collect();
            let target = match rng.pick(&consumers) {
                Some(c) if rng.chance(0.9) => c,
                _ => rng.pick(&stages)?,
            };
            let tn = state.stage(target as usize)?.leaves.len() as u64;
            Step::ComputeAt {
                stage,
                target,
                iter: rng.below(tn.max(1)) as u32,
            }
        }
        9 => Step::ComputeInline { stage },
        10 => Step::ComputeRoot { stage },
        11 => {
            // Vectorize the innermost loop most of the time, else anything.
            let it = if rng.chance(0.8) {
                n.saturating_sub(1) as u32
            } else {
                iter
            };
            let annotation = match rng.below(5) {
                0 | 1 => Annotation::Vectorize,
                2 => Annotation::VectorizeUpTo(1 << (1 + rng.below(5))),
                3 => Annotation::Unroll,
                _ => Annotation::Parallel,
            };
            Step::Annotate {
                stage,
                iter: it,
                annotation,
            }
        }
        12 => Step::CacheWrite {
            stage,
            scope: Scope::Local,
        },
        13 => {
            let s = state.stage(stage as usize)?;
            let readers: Vec<u32> = state
                .direct_consumers(s.tensor)
                .into_iter()
                .filter_map(|t| state.position_of(t).map(|p| p as u32))
                .collect();
            let placeholder_or_stage = if rng.chance(0.5) {
                // Read an input through a cache.
                let inputs: Vec<u32> = state
                    .inputs()
                    .iter()
                    .filter_map(|t| state.position_of(*t).map(|p| p as u32))
                    .collect();
                rng.pick(&inputs)?
            } else {
                stage
            };
            let readers = if placeholder_or_stage == stage {
                readers
            } else {
                let t = state.stage(placeholder_or_stage as usize)?.tensor;
                state
                    .direct_consumers(t)
                    .into_iter()
                    .filter_map(|c| state.position_of(c).map(|p| p as u32))
                    .take(1)
                    .collect()
            };
            Step::CacheRead {
                stage: placeholder_or_stage,
                scope: if rng.chance(0.5) {
                    Scope::Shared
                } else {
                    Scope::Local
                },
                readers,
            }
        }
        14 => {
            let reduce: Vec<u32> = (0..n as u32)
                .filter(|&p| {
                    s.leaf(p as usize)
                        .map(|l| l.kind == IterKind::Reduce)
                        .unwrap_or(false)
                })
                .collect();
            Step::Rfactor {
                stage,
                iter: rng.pick(&reduce).unwrap_or(iter),
            }
        }
        _ => {
            if rng.chance(0.25) {
                // Any permutation of the tensor's dimensions (refused for outputs).
                let mut order: Vec<u32> = (0..s.op.shape.len() as u32).collect();
                for i in (1..order.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    order.swap(i, j);
                }
                Step::ReorderStorage { stage, order }
            } else if rng.chance(0.5) {
                Step::AutoUnroll {
                    stage,
                    iter: 0,
                    max_step: rng.pick(&[0, 16, 64, 512])?,
                }
            } else if rng.chance(0.4) {
                // Mostly an input (the tensors a prefetch fetches), sometimes any stage.
                let inputs: Vec<u32> = state
                    .inputs()
                    .iter()
                    .filter_map(|t| state.position_of(*t).map(|p| p as u32))
                    .collect();
                let tensor = match rng.pick(&inputs) {
                    Some(t) if rng.chance(0.8) => t,
                    _ => rng.below(state.stages().len() as u64) as u32,
                };
                let axes = s.op.shape.len() + s.op.reduce_axes().len();
                let axis = rng.below(axes.max(1) as u64) as u32;
                let offset = rng.pick(&[1, 1, 2, -1, 64])?;
                // Two ahead into L2, as the row-wise sketch fetches it. The level takes no
                // draw of its own: the seeded traces of the tests stay the traces they were.
                let level = if offset == 2 {
                    PrefetchLevel::L2
                } else {
                    PrefetchLevel::L1
                };
                Step::Prefetch {
                    stage,
                    tensor,
                    axis,
                    offset,
                    level,
                }
            } else {
                Step::Annotate {
                    stage,
                    iter,
                    annotation: Annotation::Bind(rng.pick(&[
                        ThreadAxis::BlockX,
                        ThreadAxis::ThreadX,
                        ThreadAxis::VThread,
                    ])?),
                }
            }
        }
    })
}

/// A random valid schedule of `dag`: `attempts` random steps, keeping those that apply.
/// Steps that would make a state that does not lower are kept too when `allow_unlowerable`;
/// otherwise each kept step is checked by lowering (slower, but every result lowers).
pub fn random_state(
    dag: &ComputeDag,
    seed: u64,
    attempts: usize,
    allow_unlowerable: bool,
) -> State {
    let mut rng = Rng::new(seed);
    let mut state = State::new(dag);
    for _ in 0..attempts {
        let Some(step) = random_step(&state, &mut rng) else {
            continue;
        };
        let mut next = state.clone();
        if next.apply(&step).is_err() {
            continue;
        }
        if !allow_unlowerable && crate::lower::lower(&next).is_err() {
            continue;
        }
        state = next;
    }
    state
}

/// True if any stage of the state is attached somewhere (for test statistics).
pub fn has_compute_at(state: &State) -> bool {
    state
        .stages()
        .iter()
        .any(|s| matches!(s.location, Location::At { .. }))
}
