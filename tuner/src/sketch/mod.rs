//! Sketches: traces with holes.
//!
//! A [`Sketch`] is the search space of one program structure: a list of [`SketchStep`]s, some
//! fixed ([`Step`]s), some reading one of its [`Hole`]s (tile factors, a compute location, an
//! unroll limit, how many loops to parallelize). Filling every hole with a value (the
//! *decisions*) and instantiating gives a concrete [`State`] whose trace records the sketch's
//! name and the decisions, so a mutator can change one decision of a measured record and
//! instantiate again.
//!
//! Sketches are made by the rules of [`rules`]; decisions are drawn by [`sample`] and changed
//! by [`crate::mutate`].

pub mod rules;
pub mod sample;

use tensortune_schedules::ir::PrefetchLevel;
use tensortune_schedules::schedule::{IterKind, ScheduleError, State, MAX_VECTOR_LANES};
use tensortune_schedules::trace::{Annotation, SketchRef, Step};
use tensortune_schedules::{ComputeDag, TensorId};

/// One hole of a sketch.
#[derive(Clone, Debug, PartialEq)]
pub enum Hole {
    /// Tile factors of a loop of `extent` split into `parts` loops: the decision holds the
    /// `parts - 1` inner extents, outer to inner; the outermost loop covers the rest.
    Tile {
        /// Extent of the loop split.
        extent: i64,
        /// Number of loops it becomes.
        parts: usize,
        /// Largest innermost extent (the vector lanes of a vectorized loop), if limited.
        max_inner: Option<i64>,
        /// Largest first factor, the level just inside the outermost (a virtual-thread
        /// level), if limited.
        max_first: Option<i64>,
    },
    /// One value of `choices`.
    Choice {
        /// The values allowed.
        choices: Vec<i64>,
        /// What the value means (for the mutators' weights).
        kind: ChoiceKind,
    },
}

/// What a choice hole decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChoiceKind {
    /// An `auto_unroll_max_step` value.
    Unroll,
    /// A compute location: -1 for the root, else a loop position of the consumer.
    Location,
    /// The number of outer loops fused into one parallel loop.
    Parallel,
    /// The vector lanes of each thread's share of a cooperative fetch (1: scalar).
    Lanes,
    /// How far ahead a [`SketchStep::Prefetch`] fetches: 0 nothing, 1 the next row into L1,
    /// 2 that and the row after it into L2.
    Prefetch,
}

/// One instruction of a sketch.
#[derive(Clone, Debug, PartialEq)]
pub enum SketchStep {
    /// A step with no hole.
    Fixed(Step),
    /// Split with the factors of a tile hole.
    Split {
        /// Stage position.
        stage: u32,
        /// Loop position.
        iter: u32,
        /// The tile hole.
        hole: usize,
    },
    /// Split following another stage's tile: factor `k` is the product of the hole's factors
    /// in `ranges[k]` (index ranges into the decision).
    FollowSplit {
        /// Stage position.
        stage: u32,
        /// Loop position.
        iter: u32,
        /// The tile hole followed.
        hole: usize,
        /// Which factors each new inner loop takes.
        ranges: Vec<(usize, usize)>,
    },
    /// `compute_at(stage, target, loop)` with the loop chosen by a location hole (-1: stay at
    /// the root).
    ComputeAt {
        /// Stage position.
        stage: u32,
        /// Consumer position.
        target: u32,
        /// The location hole.
        hole: usize,
    },
    /// Vectorize the innermost loop if it is spatial and has 2 to `max_lanes` iterations.
    /// Annotations name the stage by tensor: they come last, after stages were inserted.
    VectorizeInnermost {
        /// The stage's tensor.
        tensor: TensorId,
        /// Most lanes.
        max_lanes: i64,
    },
    /// Mark the innermost loop, if it is spatial, `vectorize_up_to(max_lanes)`: lowering
    /// vectorizes it when its extent after bound inference is 2 to `max_lanes`. For a stage
    /// whose compute location is a hole, and so whose loop extents are only known once lowered.
    VectorizeRegion {
        /// The stage's tensor.
        tensor: TensorId,
        /// Most lanes.
        max_lanes: i64,
    },
    /// Fuse the first `k` loops (a parallel hole; only spatial ones are taken) and run them in
    /// parallel.
    ParallelOuter {
        /// The stage's tensor.
        tensor: TensorId,
        /// The parallel hole.
        hole: usize,
    },
    /// The block's threads fetch the stage (a shared-memory copy) together: its loops fused
    /// and split by the thread count, the product of the named factor of each of
    /// `thread_holes` (the thread level of the consumer's tiles), and by the lanes of
    /// `lanes_hole`: the middle loop bound to `threadIdx.x`, the inner one (where more than
    /// one lane) vectorized, so that each thread moves consecutive elements with one wide
    /// load and store.
    CooperativeFetch {
        /// The copy's tensor.
        tensor: TensorId,
        /// The tile holes and the factor of each (its index in the decision) that multiply
        /// to the block's threads.
        thread_holes: Vec<(usize, usize)>,
        /// A [`ChoiceKind::Lanes`] hole: the lanes of each thread's vector, if any.
        lanes_hole: Option<usize>,
    },
    /// `auto_unroll_max_step` on the stage's outermost loop, from an unroll hole.
    AutoUnroll {
        /// The stage's tensor.
        tensor: TensorId,
        /// The unroll hole.
        hole: usize,
    },
    /// [`Step::Prefetch`]es of `input` in the stage along its `axis`, as far ahead as a
    /// [`ChoiceKind::Prefetch`] hole says (0: none; 1: one further into L1; 2: that, and
    /// two further into L2).
    Prefetch {
        /// The stage's tensor.
        tensor: TensorId,
        /// The tensor fetched.
        input: TensorId,
        /// The stage's axis.
        axis: u32,
        /// The prefetch hole.
        hole: usize,
    },
}

/// A trace with holes.
#[derive(Clone, Debug, PartialEq)]
pub struct Sketch {
    /// Unique among the sketches of one workload (e.g. `C:tile`).
    pub name: String,
    /// Instructions, in order.
    pub steps: Vec<SketchStep>,
    /// Holes, indexed by the steps.
    pub holes: Vec<Hole>,
    /// Bounds on products of tile factors of different holes.
    pub caps: Vec<ProductCap>,
}

/// A bound on the product of tile factors of several holes: levels of different loops that
/// a sketch fuses into one loop of limited extent (a GPU tile's virtual threads, one level
/// of every output axis, fused into one `vthread` loop of at most 8). Per-hole caps cannot
/// say this without fixing each loop's share of the bound in advance.
#[derive(Clone, Debug, PartialEq)]
pub struct ProductCap {
    /// The factors bounded together: a tile hole and an index into its decision.
    pub factors: Vec<(usize, usize)>,
    /// The largest product allowed.
    pub max: i64,
}

/// Why decisions do not instantiate a sketch.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SketchError {
    /// Wrong number or shape of decisions.
    #[error("decisions do not fit sketch `{0}`")]
    Decisions(String),
    /// A step did not apply.
    #[error("sketch `{sketch}`: {source}")]
    Step {
        /// The sketch.
        sketch: String,
        /// The step's error.
        source: ScheduleError,
    },
}

impl Sketch {
    /// True if `decisions` has one well-formed value per hole.
    pub fn fits(&self, decisions: &[Vec<i64>]) -> bool {
        decisions.len() == self.holes.len()
            && self.holes.iter().zip(decisions).all(|(h, d)| match h {
                Hole::Tile { parts, .. } => d.len() + 1 == *parts && d.iter().all(|&f| f >= 1),
                Hole::Choice { choices, .. } => d.len() == 1 && choices.contains(&d[0]),
            })
    }

    /// True if `decisions` keep every [`ProductCap`] of the sketch (a factor a decision does
    /// not have counts as 1).
    pub fn within_caps(&self, decisions: &[Vec<i64>]) -> bool {
        self.caps
            .iter()
            .all(|c| product_of(decisions, &c.factors) <= c.max)
    }

    /// Brings `decisions` within every [`ProductCap`]: while a product is over its bound, one
    /// of its factors above 1 (the `pick(n)`-th of the `n` such, in the cap's order) gives
    /// up its smallest prime factor to the outermost level of its loop (implicit in the
    /// decision), which keeps a perfect tiling perfect.
    pub fn clamp_to_caps(&self, decisions: &mut [Vec<i64>], mut pick: impl FnMut(usize) -> usize) {
        for c in &self.caps {
            while product_of(decisions, &c.factors) > c.max.max(1) {
                let over: Vec<(usize, usize)> = c
                    .factors
                    .iter()
                    .copied()
                    .filter(|&(h, i)| {
                        decisions
                            .get(h)
                            .and_then(|d| d.get(i))
                            .is_some_and(|&f| f > 1)
                    })
                    .collect();
                if over.is_empty() {
                    break;
                }
                let (h, i) = over[pick(over.len()).min(over.len() - 1)];
                let f = decisions[h][i];
                let p = (2..=f).find(|p| f % p == 0).unwrap_or(f);
                decisions[h][i] = f / p;
            }
        }
    }

    /// The concrete schedule for `decisions`.
    pub fn instantiate(
        &self,
        dag: &ComputeDag,
        decisions: &[Vec<i64>],
    ) -> Result<State, SketchError> {
        if !self.fits(decisions) {
            return Err(SketchError::Decisions(self.name.clone()));
        }
        let mut s = State::new(dag);
        for step in &self.steps {
            apply_step(&mut s, step, decisions).map_err(|source| SketchError::Step {
                sketch: self.name.clone(),
                source,
            })?;
        }
        s.set_sketch(Some(SketchRef {
            name: self.name.clone(),
            decisions: decisions.to_vec(),
        }));
        Ok(s)
    }
}

/// The product of tile factors of `decisions`, each a hole and an index into its decision
/// (saturating; a factor missing or below 1 counts as 1).
fn product_of(decisions: &[Vec<i64>], factors: &[(usize, usize)]) -> i64 {
    factors
        .iter()
        .map(|&(h, i)| {
            decisions
                .get(h)
                .and_then(|d| d.get(i))
                .copied()
                .unwrap_or(1)
        })
        .fold(1i64, |a, f| a.saturating_mul(f.max(1)))
}

/// Applies one sketch step with its holes filled from `decisions` (which fit the sketch).
fn apply_step(
    s: &mut State,
    step: &SketchStep,
    decisions: &[Vec<i64>],
) -> Result<(), ScheduleError> {
    match step {
        SketchStep::Fixed(st) => s.apply_in_place(st),
        SketchStep::Split { stage, iter, hole } => s.apply_in_place(&Step::Split {
            stage: *stage,
            iter: *iter,
            factors: decisions[*hole].clone(),
        }),
        SketchStep::FollowSplit {
            stage,
            iter,
            hole,
            ranges,
        } => {
            let d = &decisions[*hole];
            let factors: Vec<i64> = ranges
                .iter()
                .map(|&(a, b)| d.get(a..b).map(|x| x.iter().product()).unwrap_or(1))
                .collect();
            s.apply_in_place(&Step::Split {
                stage: *stage,
                iter: *iter,
                factors,
            })
        }
        SketchStep::ComputeAt {
            stage,
            target,
            hole,
        } => {
            let at = decisions[*hole][0];
            if at < 0 {
                return Ok(());
            }
            s.apply_in_place(&Step::ComputeAt {
                stage: *stage,
                target: *target,
                iter: at as u32,
            })
        }
        SketchStep::VectorizeInnermost { tensor, max_lanes } => {
            vectorize_innermost(s, *tensor, *max_lanes);
            Ok(())
        }
        SketchStep::VectorizeRegion { tensor, max_lanes } => {
            vectorize_region(s, *tensor, *max_lanes);
            Ok(())
        }
        SketchStep::ParallelOuter { tensor, hole } => {
            parallel_outer(s, *tensor, decisions[*hole][0].max(0) as usize)
        }
        SketchStep::CooperativeFetch {
            tensor,
            thread_holes,
            lanes_hole,
        } => {
            let threads = product_of(decisions, thread_holes);
            let lanes = lanes_hole
                .and_then(|h| decisions.get(h)?.first().copied())
                .unwrap_or(1);
            cooperative_fetch(s, *tensor, threads, lanes)
        }
        SketchStep::AutoUnroll { tensor, hole } => {
            let m = decisions[*hole][0].max(0) as u32;
            match s.position_of(*tensor) {
                Some(p) if m > 0 => s.apply_in_place(&Step::AutoUnroll {
                    stage: p as u32,
                    iter: 0,
                    max_step: m,
                }),
                _ => Ok(()),
            }
        }
        SketchStep::Prefetch {
            tensor,
            input,
            axis,
            hole,
        } => {
            let ahead = decisions[*hole][0];
            let (Some(p), Some(q)) = (s.position_of(*tensor), s.position_of(*input)) else {
                return Ok(());
            };
            // The next row into L1, and with 2 the one after into L2: one row ahead into L1
            // alone leaves the memory system idle while each row's first lines arrive; the
            // row after, already in L2, comes to L1 in a fraction of the time
            // (docs/measurements.md, "The row after next into L2").
            let levels = [(1, PrefetchLevel::L1), (2, PrefetchLevel::L2)];
            for (offset, level) in levels.into_iter().take(ahead.clamp(0, 2) as usize) {
                s.apply_in_place(&Step::Prefetch {
                    stage: p as u32,
                    tensor: q as u32,
                    axis: *axis,
                    offset,
                    level,
                })?;
            }
            Ok(())
        }
    }
}

/// Fuses the stage's loops, splits the fused loop by `threads` (and `lanes`, where above 1)
/// and binds the thread part to `threadIdx.x`; the lanes loop is vectorized.
fn cooperative_fetch(
    s: &mut State,
    tensor: TensorId,
    threads: i64,
    lanes: i64,
) -> Result<(), ScheduleError> {
    let Some(p) = s.position_of(tensor) else {
        return Ok(());
    };
    let n = s.stage(p).map_or(0, |st| st.leaves.len());
    let stage = p as u32;
    if n == 0 {
        return Ok(());
    }
    if n > 1 {
        s.apply_in_place(&Step::Fuse {
            stage,
            iters: (0..n as u32).collect(),
        })?;
    }
    let vector = lanes > 1;
    s.apply_in_place(&Step::Split {
        stage,
        iter: 0,
        factors: if vector {
            vec![threads, lanes]
        } else {
            vec![threads]
        },
    })?;
    s.apply_in_place(&Step::Annotate {
        stage,
        iter: 1,
        annotation: Annotation::Bind(tensortune_schedules::ir::ThreadAxis::ThreadX),
    })?;
    if vector {
        s.apply_in_place(&Step::Annotate {
            stage,
            iter: 2,
            annotation: Annotation::Vectorize,
        })?;
    }
    Ok(())
}

/// Vectorizes the stage's innermost loop if it is spatial with 2 to `max_lanes` iterations.
fn vectorize_innermost(s: &mut State, tensor: TensorId, max_lanes: i64) {
    let Some(p) = s.position_of(tensor) else {
        return;
    };
    let Some(st) = s.stage(p) else { return };
    let n = st.leaves.len();
    let fits = st
        .leaf(n.wrapping_sub(1))
        .map(|l| l.kind == IterKind::Spatial && l.extent >= 2 && l.extent <= max_lanes)
        .unwrap_or(false);
    if fits {
        // A stage attached at the innermost loop refuses; that is not an error of the sketch,
        // the loop just stays scalar.
        let _ = s.apply(&Step::Annotate {
            stage: p as u32,
            iter: n as u32 - 1,
            annotation: Annotation::Vectorize,
        });
    }
}

/// Marks the stage's innermost loop, if spatial, `vectorize_up_to(max_lanes)`.
fn vectorize_region(s: &mut State, tensor: TensorId, max_lanes: i64) {
    let Some(p) = s.position_of(tensor) else {
        return;
    };
    let Some(st) = s.stage(p) else { return };
    let n = st.leaves.len();
    let spatial = st
        .leaf(n.wrapping_sub(1))
        .is_some_and(|l| l.kind == IterKind::Spatial && l.extent >= 2);
    if spatial {
        // As for `VectorizeInnermost`, a refusal leaves the loop scalar.
        let _ = s.apply(&Step::Annotate {
            stage: p as u32,
            iter: n as u32 - 1,
            annotation: Annotation::VectorizeUpTo(max_lanes.clamp(2, MAX_VECTOR_LANES) as u32),
        });
    }
}

/// Fuses the stage's first `k` unannotated spatial loops (as many as there are) and runs
/// the fused loop in parallel.
fn parallel_outer(s: &mut State, tensor: TensorId, k: usize) -> Result<(), ScheduleError> {
    let Some(p) = s.position_of(tensor) else {
        return Ok(());
    };
    let Some(st) = s.stage(p) else {
        return Ok(());
    };
    let spatial = st
        .leaves
        .iter()
        .take_while(|&&l| {
            let it = st.iter(l);
            it.kind == IterKind::Spatial && it.annotation.is_none()
        })
        .count();
    let k = k.min(spatial);
    if k == 0 {
        return Ok(());
    }
    let stage = p as u32;
    if k >= 2 {
        s.apply_in_place(&Step::Fuse {
            stage,
            iters: (0..k as u32).collect(),
        })?;
    }
    s.apply_in_place(&Step::Annotate {
        stage,
        iter: 0,
        annotation: Annotation::Parallel,
    })
}
