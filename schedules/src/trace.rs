//! Traces: the schedule as data.
//!
//! Every primitive applied to a [`State`] is recorded as one [`Step`]. A step names stages and
//! loops by their *position* at the time it was applied (stage positions shift when
//! `cache_write`, `cache_read` or `rfactor` insert a stage; loop positions shift with `split`,
//! `fuse` and `reorder`), so a trace replays on a fresh state of the same DAG and gives the
//! same state. The random decisions of a search (tile sizes, unroll steps, locations) are the
//! steps' parameters: a mutator changes one and replays.
//!
//! ```
//! use tensortune_schedules::{ops::WorkloadSpec, schedule::State, trace::Trace};
//! let dag = WorkloadSpec::parse("matmul:M=8,N=8,K=8").unwrap().build().unwrap();
//! let mut s = State::new(&dag);
//! s.split(2, 0, &[4]).unwrap();
//! let json = s.trace().to_json();
//! let again = Trace::from_json(&json).unwrap().replay(&dag).unwrap();
//! assert_eq!(again.to_string(), s.to_string());
//! ```

use crate::dag::ComputeDag;
use crate::ir::{PrefetchLevel, Scope, ThreadAxis};
use crate::schedule::{ScheduleError, State};
use crate::text::single_line;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A loop annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Annotation {
    /// SIMD lanes.
    Vectorize,
    /// SIMD lanes if the loop, once lowered, has between 2 and this many iterations, is
    /// innermost and has nothing computed inside it; else a serial loop. For a stage computed
    /// inside another one's tile, whose loops only take their extents from bound inference
    /// (a padding copy over the 16 columns a tile reads, say, of a 58-column tensor).
    VectorizeUpTo(u32),
    /// Full unrolling.
    Unroll,
    /// Threads of the CPU pool.
    Parallel,
    /// A GPU thread axis.
    Bind(ThreadAxis),
}

/// One schedule primitive with its parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Step {
    /// Split loop `iter` into `factors.len() + 1` loops; the inner extents are `factors`
    /// (outer to inner) and the outermost covers the rest, rounded up.
    Split {
        /// Stage position.
        stage: u32,
        /// Loop position.
        iter: u32,
        /// Inner extents, each at least 1.
        factors: Vec<i64>,
    },
    /// Split loop `iter` into an outer loop of `nparts` and an inner loop of the rest.
    SplitNParts {
        /// Stage position.
        stage: u32,
        /// Loop position.
        iter: u32,
        /// Outer extent, at least 1.
        nparts: i64,
    },
    /// Fuse adjacent loops `iters` (consecutive positions, outer first) into one.
    Fuse {
        /// Stage position.
        stage: u32,
        /// Loop positions.
        iters: Vec<u32>,
    },
    /// Reorder all loops: `order[k]` is the old position of the new k-th loop.
    Reorder {
        /// Stage position.
        stage: u32,
        /// A permutation of the loop positions.
        order: Vec<u32>,
    },
    /// Compute the stage inside loop `iter` of stage `target`, only the region needed there.
    ComputeAt {
        /// Stage position.
        stage: u32,
        /// The consumer's position.
        target: u32,
        /// The consumer's loop position.
        iter: u32,
    },
    /// Substitute the stage's expression into its consumers.
    ComputeInline {
        /// Stage position.
        stage: u32,
    },
    /// Compute the stage at the root, over its whole domain.
    ComputeRoot {
        /// Stage position.
        stage: u32,
    },
    /// Compute the stage into a new stage of `scope` and copy it out.
    CacheWrite {
        /// Stage position.
        stage: u32,
        /// Scope of the new accumulator stage.
        scope: Scope,
    },
    /// Copy the stage into a new stage of `scope`, read by `readers` instead.
    CacheRead {
        /// Stage position of the tensor read.
        stage: u32,
        /// Scope of the copy.
        scope: Scope,
        /// Stage positions of the consumers that read the copy.
        readers: Vec<u32>,
    },
    /// Annotate one loop.
    Annotate {
        /// Stage position.
        stage: u32,
        /// Loop position.
        iter: u32,
        /// The annotation.
        annotation: Annotation,
    },
    /// Turn reduce loop `iter` into a spatial axis of a new stage, then reduce over it.
    Rfactor {
        /// Stage position.
        stage: u32,
        /// Loop position of a reduce loop.
        iter: u32,
    },
    /// Store the stage's buffer with its dimensions in `order` (outer to inner: storage
    /// dimension `q` is the tensor's dimension `order[q]`); its loops and its readers' indices
    /// are unchanged. Halide's `reorder_storage`.
    ReorderStorage {
        /// Stage position.
        stage: u32,
        /// A permutation of the tensor's dimensions.
        order: Vec<u32>,
    },
    /// Unroll loops at and inside `iter` whose nest has at most `max_step` iterations.
    AutoUnroll {
        /// Stage position.
        stage: u32,
        /// Loop position.
        iter: u32,
        /// The step limit (0 disables).
        max_step: u32,
    },
    /// In the stage's innermost body, prefetch the elements of tensor `tensor` that the body
    /// reads `offset` further along the stage's axis `axis` (a spatial axis, then the reduce
    /// axes, in the op's order; a property of the computation, so later splits and fuses
    /// keep it): `axis` 0 and `offset` 1 of a row-wise stage fetch the next row while this
    /// one computes. Only tensors in global memory (inputs, outputs and root stages) are
    /// fetched; a stage that does not read `tensor` fetches nothing. TVM's `prefetch`, on an
    /// axis of the computation rather than a loop, with the cache level the line goes to:
    /// a stage has at most one prefetch per tensor, axis and level (a later step replaces
    /// an earlier one), so it can fetch the next row into L1 and the one after into L2.
    Prefetch {
        /// Stage position.
        stage: u32,
        /// Stage position of the tensor fetched.
        tensor: u32,
        /// The axis moved: spatial axes first, then reduce axes.
        axis: u32,
        /// How far along it, nonzero, at most [`MAX_PREFETCH_OFFSET`] either way.
        offset: i64,
        /// The cache level the lines go to; L1 (the default) is left out of the JSON.
        #[serde(default, skip_serializing_if = "PrefetchLevel::is_l1")]
        level: PrefetchLevel,
    },
}

/// The farthest a [`Step::Prefetch`] looks ahead (or back) along its axis.
pub const MAX_PREFETCH_OFFSET: i64 = 1 << 16;

/// A sequence of steps, and where a search produced it, the sketch and decisions behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Trace {
    /// Steps in the order applied.
    pub steps: Vec<Step>,
    /// The search's sketch and its decisions, so the search can mutate a stored record.
    /// Replay ignores it: the steps alone define the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<SketchRef>,
}

/// A sketch (a trace with holes) by name, and the values that filled its holes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SketchRef {
    /// The sketch's name, unique among the sketches of one workload.
    pub name: String,
    /// One entry per hole: tile factors, or a single value for a choice.
    pub decisions: Vec<Vec<i64>>,
}

/// The most steps a trace may have. Schedules the search makes take well under a hundred;
/// replaying tens of thousands takes minutes.
pub const MAX_STEPS: usize = 1024;

/// A trace that cannot be read or does not fit its DAG.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Not a JSON trace.
    #[error("malformed trace JSON: {0}")]
    Json(String),
    /// More steps than any schedule needs ([`MAX_STEPS`]): a hostile or damaged record, whose
    /// replay would take minutes.
    #[error("a trace of {steps} steps (at most {MAX_STEPS})")]
    TooLong {
        /// Steps in the trace.
        steps: usize,
    },
    /// Step `index` failed on replay.
    #[error("step {index} ({step}) does not apply: {source}")]
    Step {
        /// Position in the trace.
        index: usize,
        /// The step, printed.
        step: String,
        /// Why.
        source: ScheduleError,
    },
}

impl Trace {
    /// JSON text (stable field order).
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
    /// Parses JSON text.
    pub fn from_json(s: &str) -> Result<Trace, TraceError> {
        // serde's messages quote the text they reject (`unknown variant ...`) as it was.
        let t: Trace = serde_json::from_str(s)
            .map_err(|e| TraceError::Json(single_line(&e.to_string()).into()))?;
        t.check_length()?;
        Ok(t)
    }

    fn check_length(&self) -> Result<(), TraceError> {
        if self.steps.len() > MAX_STEPS {
            return Err(TraceError::TooLong {
                steps: self.steps.len(),
            });
        }
        Ok(())
    }
    /// JSON of the steps alone: equal for equal programs, whatever produced them.
    pub fn steps_json(&self) -> String {
        serde_json::to_string(&self.steps).unwrap_or_default()
    }
    /// Applies the steps to a fresh state of `dag`.
    pub fn replay(&self, dag: &ComputeDag) -> Result<State, TraceError> {
        self.check_length()?;
        let mut s = State::new(dag);
        for (index, step) in self.steps.iter().enumerate() {
            s.apply_in_place(step).map_err(|source| TraceError::Step {
                index,
                step: step.to_string(),
                source,
            })?;
        }
        Ok(s)
    }
}

/// A list as `[a, b, c]`, cut short after [`Brief::MAX`] entries: a step's lists come from
/// records, and a damaged or hostile one's can be thousands long, which an error message
/// quoting the step should not repeat.
struct Brief<'a, T>(&'a [T]);

impl<T> Brief<'_, T> {
    /// Entries shown; a schedule's lists are far shorter.
    const MAX: usize = 64;
}

impl<T: fmt::Debug> fmt::Display for Brief<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() <= Self::MAX {
            return write!(f, "{:?}", self.0);
        }
        let shown: Vec<String> = self.0[..Self::MAX]
            .iter()
            .map(|v| format!("{v:?}"))
            .collect();
        write!(f, "[{}, ... ({} in all)]", shown.join(", "), self.0.len())
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Split {
                stage,
                iter,
                factors,
            } => write!(f, "split(s{stage}, l{iter}, {})", Brief(factors)),
            Step::SplitNParts {
                stage,
                iter,
                nparts,
            } => write!(f, "split_nparts(s{stage}, l{iter}, {nparts})"),
            Step::Fuse { stage, iters } => write!(f, "fuse(s{stage}, {})", Brief(iters)),
            Step::Reorder { stage, order } => write!(f, "reorder(s{stage}, {})", Brief(order)),
            Step::ComputeAt {
                stage,
                target,
                iter,
            } => write!(f, "compute_at(s{stage}, s{target}, l{iter})"),
            Step::ComputeInline { stage } => write!(f, "compute_inline(s{stage})"),
            Step::ComputeRoot { stage } => write!(f, "compute_root(s{stage})"),
            Step::CacheWrite { stage, scope } => {
                write!(f, "cache_write(s{stage}, {})", scope.name())
            }
            Step::CacheRead {
                stage,
                scope,
                readers,
            } => write!(
                f,
                "cache_read(s{stage}, {}, {})",
                scope.name(),
                Brief(readers)
            ),
            Step::Annotate {
                stage,
                iter,
                annotation,
            } => {
                let a = match annotation {
                    Annotation::Vectorize => "vectorize".to_string(),
                    Annotation::VectorizeUpTo(n) => format!("vectorize_up_to_{n}"),
                    Annotation::Unroll => "unroll".to_string(),
                    Annotation::Parallel => "parallel".to_string(),
                    Annotation::Bind(t) => format!("bind {}", t.name()),
                };
                write!(f, "{a}(s{stage}, l{iter})")
            }
            Step::Rfactor { stage, iter } => write!(f, "rfactor(s{stage}, l{iter})"),
            Step::ReorderStorage { stage, order } => {
                write!(f, "reorder_storage(s{stage}, {})", Brief(order))
            }
            Step::AutoUnroll {
                stage,
                iter,
                max_step,
            } => write!(f, "auto_unroll_max_step(s{stage}, l{iter}, {max_step})"),
            Step::Prefetch {
                stage,
                tensor,
                axis,
                offset,
                level,
            } => {
                write!(f, "prefetch(s{stage}, s{tensor}, axis {axis}, {offset:+}")?;
                if !level.is_l1() {
                    write!(f, ", to {}", level.name())?;
                }
                write!(f, ")")
            }
        }
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.steps {
            writeln!(f, "{s}")?;
        }
        Ok(())
    }
}
