//! Schedule state: *how* each stage of a DAG is computed.
//!
//! A [`State`] holds one [`Stage`] per tensor (placeholders included, in topological order).
//! A stage's loops are iterators in an arena: the *roots* are its axes (spatial axes, then
//! reduce axes), and `split`/`fuse` add derived iterators through [`Relation`]s; the *leaves*,
//! in order, are the loop nest lowering emits. Primitives only validate and record; lowering
//! applies them:
//! - extents are nominal here (from the full domain); lowering recomputes them from the region
//!   a `compute_at` stage must produce, so a stage tiled before being attached shrinks to its
//!   tile;
//! - a split inner extent is `min(factor, parent)`, the outer `ceil(parent / inner)`; when that
//!   over-covers the parent, lowering guards the body (a tail), so results are never wrong.
//!
//! Every primitive returns `Result<_, ScheduleError>` and leaves the state unchanged on error.
//! Stages and loops are named by position, as in [`crate::trace::Step`].

mod apply;

pub use apply::{
    derive_extents, root_values, split_extents, MAX_NEST_GROWTH, MAX_STAGE_LOOPS, MAX_VECTOR_LANES,
};

use crate::dag::ComputeDag;
use crate::expr::{DType, Expr, IterVar, TensorId};
use crate::ir::{PrefetchLevel, Scope};
use crate::te::OpKind;
use crate::trace::{Annotation, Step, Trace};
use std::fmt;
use std::sync::Arc;

/// Id of an iterator in a stage's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IterId(pub u32);

/// Spatial or reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IterKind {
    /// Indexes the output.
    Spatial,
    /// Indexes a reduction.
    Reduce,
}

/// One iterator (loop) of a stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Iter {
    /// Display name, e.g. `i.1`.
    pub name: String,
    /// Nominal extent (see the module doc).
    pub extent: i64,
    /// Spatial or reduce.
    pub kind: IterKind,
    /// Loop annotation, if any.
    pub annotation: Option<Annotation>,
}

/// How a split divides its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitBy {
    /// The inner loop has this extent.
    Factor(i64),
    /// The outer loop has this extent.
    NParts(i64),
}

/// How derived iterators relate to their parents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// `parent = outer * extent(inner) + inner`.
    Split {
        /// The loop split.
        parent: IterId,
        /// New outer loop.
        outer: IterId,
        /// New inner loop.
        inner: IterId,
        /// Factor or parts.
        by: SplitBy,
    },
    /// `fused = outer * extent(inner) + inner`.
    Fuse {
        /// Outer loop fused.
        outer: IterId,
        /// Inner loop fused.
        inner: IterId,
        /// The new loop.
        fused: IterId,
    },
}

/// Where a stage is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// At the top level, over its whole domain.
    Root,
    /// Substituted into its consumers; no loops of its own.
    Inlined,
    /// Inside a loop of a consumer, over the region needed there.
    At {
        /// The consumer.
        tensor: TensorId,
        /// Its loop.
        iter: IterId,
    },
}

/// The definition a stage computes (after cache and rfactor rewrites).
#[derive(Clone, Debug, PartialEq)]
pub struct StageOp {
    /// Name of the tensor.
    pub name: String,
    /// Shape of the tensor.
    pub shape: Vec<i64>,
    /// Element type.
    pub dtype: DType,
    /// Placeholder or compute; loads name stable tensor ids.
    pub kind: OpKind,
}

impl StageOp {
    /// The spatial axes and body of a compute.
    pub fn compute(&self) -> Option<(&[IterVar], &Expr)> {
        match &self.kind {
            OpKind::Compute { axes, body } => Some((axes, body)),
            OpKind::Placeholder => None,
        }
    }
    /// The reduce axes (empty unless the body is a reduction).
    pub fn reduce_axes(&self) -> &[IterVar] {
        match &self.kind {
            OpKind::Compute {
                body: Expr::Reduce { axes, .. },
                ..
            } => axes,
            _ => &[],
        }
    }
}

/// One stage of a state.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    /// Stable id of the tensor this stage computes (loads refer to it).
    pub tensor: TensorId,
    /// What it computes.
    pub op: Arc<StageOp>,
    /// Iterator arena: roots first (spatial axes, then reduce axes).
    pub iters: Vec<Iter>,
    /// Derivations of non-root iterators, in the order applied.
    pub relations: Vec<Relation>,
    /// The loop nest, outer to inner.
    pub leaves: Vec<IterId>,
    /// Where it is computed.
    pub location: Location,
    /// Memory scope of its buffer when it is not a parameter.
    pub scope: Scope,
    /// `auto_unroll_max_step` pragma: the loop it starts at and the limit.
    pub auto_unroll: Option<(IterId, u32)>,
    /// Storage order of its buffer's dimensions, outer to inner (`None`: the tensor's own).
    pub storage_order: Option<Vec<usize>>,
    /// Prefetches in its innermost body ([`Step::Prefetch`]), at most one per tensor, axis
    /// and cache level.
    pub prefetch: Vec<PrefetchHint>,
}

/// One [`Step::Prefetch`] of a stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefetchHint {
    /// The tensor fetched.
    pub tensor: TensorId,
    /// The stage's axis moved: spatial axes first, then reduce axes.
    pub axis: usize,
    /// How far along it.
    pub offset: i64,
    /// The cache level its lines go to.
    pub level: PrefetchLevel,
}

impl Stage {
    /// How many of `iters` are roots (the op's spatial axes, then its reduce axes): they come
    /// first.
    pub fn root_count(&self) -> usize {
        let n = self.op.compute().map_or(0, |(axes, _)| axes.len()) + self.op.reduce_axes().len();
        n.min(self.iters.len())
    }

    fn new(tensor: TensorId, op: Arc<StageOp>) -> Stage {
        let mut iters = Vec::new();
        if let Some((axes, _)) = op.compute() {
            for a in axes {
                iters.push(Iter {
                    name: a.var.name.to_string(),
                    extent: a.extent,
                    kind: IterKind::Spatial,
                    annotation: None,
                });
            }
            for a in op.reduce_axes() {
                iters.push(Iter {
                    name: a.var.name.to_string(),
                    extent: a.extent,
                    kind: IterKind::Reduce,
                    annotation: None,
                });
            }
        }
        let leaves = (0..iters.len() as u32).map(IterId).collect();
        Stage {
            tensor,
            op,
            iters,
            relations: Vec::new(),
            leaves,
            location: Location::Root,
            scope: Scope::Global,
            auto_unroll: None,
            storage_order: None,
            prefetch: Vec::new(),
        }
    }

    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.op.name
    }
    /// One iterator.
    pub fn iter(&self, id: IterId) -> &Iter {
        &self.iters[id.0 as usize]
    }
    /// The leaf at loop position `pos`.
    pub fn leaf(&self, pos: usize) -> Option<&Iter> {
        self.leaves.get(pos).map(|&id| self.iter(id))
    }
    /// Number of root iterators (spatial axes plus reduce axes).
    pub fn num_roots(&self) -> usize {
        self.op.compute().map(|(a, _)| a.len()).unwrap_or(0) + self.op.reduce_axes().len()
    }
    /// True for a compute whose body is a reduction.
    pub fn is_reduction(&self) -> bool {
        !self.op.reduce_axes().is_empty()
    }
    /// True for a placeholder.
    pub fn is_placeholder(&self) -> bool {
        self.op.compute().is_none()
    }
}

/// Why a primitive does not apply. Names the stage (and loop) involved.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// Stage position out of range.
    #[error("no stage at position {index} (the state has {count})")]
    NoSuchStage {
        /// The position.
        index: u32,
        /// Stages present.
        count: usize,
    },
    /// Loop position out of range.
    #[error("stage `{stage}` has no loop at position {index} (it has {count})")]
    NoSuchLoop {
        /// The stage.
        stage: String,
        /// The position.
        index: u32,
        /// Loops present.
        count: usize,
    },
    /// A primitive applied to a placeholder.
    #[error("`{stage}` is an input placeholder; it cannot be {what}")]
    Placeholder {
        /// The stage.
        stage: String,
        /// What was attempted.
        what: &'static str,
    },
    /// A split factor or part count below 1, or too large.
    #[error("stage `{stage}`, loop `{iter}`: bad split {what}")]
    BadSplit {
        /// The stage.
        stage: String,
        /// The loop.
        iter: String,
        /// What is wrong.
        what: String,
    },
    /// Fuse of loops that are not adjacent, or of mixed kinds.
    #[error("stage `{stage}`: cannot fuse {iters}: {why}")]
    BadFuse {
        /// The stage.
        stage: String,
        /// The loops.
        iters: String,
        /// Why.
        why: &'static str,
    },
    /// A reorder that is not a permutation.
    #[error("stage `{stage}`: reorder {order:?} is not a permutation of its {count} loops")]
    BadReorder {
        /// The stage.
        stage: String,
        /// The order given.
        order: Vec<u32>,
        /// Loops present.
        count: usize,
    },
    /// A second loop of one nest bound to a block or thread axis: both would be the one
    /// index.
    #[error("stage `{stage}`: cannot bind {loops}: both to {axis}")]
    AxisBoundTwice {
        /// The stage.
        stage: String,
        /// The two loops, e.g. "`j` (bound already) and `i`".
        loops: String,
        /// The CUDA name of the axis.
        axis: &'static str,
    },
    /// A loop that cannot take an annotation.
    #[error("stage `{stage}`, loop `{iter}`: cannot {what}: {why}")]
    BadAnnotation {
        /// The stage.
        stage: String,
        /// The loop.
        iter: String,
        /// The annotation.
        what: String,
        /// Why.
        why: &'static str,
    },
    /// compute_at into a stage that does not (solely) use the stage.
    #[error("cannot compute `{stage}` at `{target}`: {why}")]
    BadComputeAt {
        /// The stage moved.
        stage: String,
        /// The target.
        target: String,
        /// Why.
        why: String,
    },
    /// compute_inline of something not inlinable.
    #[error("cannot inline `{stage}`: {why}")]
    BadInline {
        /// The stage.
        stage: String,
        /// Why.
        why: &'static str,
    },
    /// A cache stage that cannot be made.
    #[error("cannot cache `{stage}`: {why}")]
    BadCache {
        /// The stage.
        stage: String,
        /// Why.
        why: String,
    },
    /// An rfactor that does not apply.
    #[error("cannot rfactor `{stage}`: {why}")]
    BadRfactor {
        /// The stage.
        stage: String,
        /// Why.
        why: String,
    },
    /// A storage order that does not apply.
    #[error("cannot reorder the storage of `{stage}`: {why}")]
    BadStorageOrder {
        /// The stage.
        stage: String,
        /// Why.
        why: String,
    },
    /// A prefetch that does not apply.
    #[error("cannot prefetch in `{stage}`: {why}")]
    BadPrefetch {
        /// The stage.
        stage: String,
        /// Why.
        why: String,
    },
}

/// A schedule of a DAG: its stages and the trace that built them.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub(crate) stages: Vec<Stage>,
    pub(crate) inputs: Vec<TensorId>,
    pub(crate) outputs: Vec<TensorId>,
    pub(crate) trace: Trace,
    /// Next fresh tensor id (for stages the primitives add).
    pub(crate) next_tensor: u32,
    /// Next fresh variable id (for axes the primitives add).
    pub(crate) next_var: u32,
}

impl State {
    /// The default schedule of `dag`: every stage at the root, loops in axis order.
    pub fn new(dag: &ComputeDag) -> State {
        let mut next_var = 0;
        let stages: Vec<Stage> = dag
            .ops()
            .iter()
            .enumerate()
            .map(|(i, op)| {
                if let OpKind::Compute { axes, body } = &op.kind {
                    for a in axes {
                        next_var = next_var.max(a.var.id + 1);
                    }
                    if let Expr::Reduce { axes, .. } = body {
                        for a in axes {
                            next_var = next_var.max(a.var.id + 1);
                        }
                    }
                }
                let sop = StageOp {
                    name: op.name.clone(),
                    shape: op.shape.clone(),
                    dtype: op.dtype,
                    kind: op.kind.clone(),
                };
                Stage::new(TensorId(i as u32), Arc::new(sop))
            })
            .collect();
        State {
            next_tensor: stages.len() as u32,
            stages,
            inputs: dag.inputs().to_vec(),
            outputs: dag.outputs().to_vec(),
            trace: Trace::default(),
            next_var,
        }
    }

    /// Stages in topological order.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }
    /// The stage at a position.
    pub fn stage(&self, pos: usize) -> Option<&Stage> {
        self.stages.get(pos)
    }
    /// Position of the stage computing `tensor`.
    pub fn position_of(&self, tensor: TensorId) -> Option<usize> {
        self.stages.iter().position(|s| s.tensor == tensor)
    }
    /// The steps applied so far.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }
    /// Records which sketch and decisions produced this state (kept in its trace).
    pub fn set_sketch(&mut self, sketch: Option<crate::trace::SketchRef>) {
        self.trace.sketch = sketch;
    }
    /// Input tensors in the op's order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }
    /// Output tensors.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }
    /// True if `tensor` is an output.
    pub fn is_output(&self, tensor: TensorId) -> bool {
        self.outputs.contains(&tensor)
    }

    /// Tensors whose stage body loads `tensor` directly (inlining not looked through).
    pub fn direct_consumers(&self, tensor: TensorId) -> Vec<TensorId> {
        self.stages
            .iter()
            .filter(|s| loads(&s.op).contains(&tensor))
            .map(|s| s.tensor)
            .collect()
    }

    /// Tensors that read `tensor` once inlined stages are substituted: the stages whose
    /// lowered code will load it.
    pub fn effective_consumers(&self, tensor: TensorId) -> Vec<TensorId> {
        let mut out = Vec::new();
        let mut work = self.direct_consumers(tensor);
        while let Some(c) = work.pop() {
            let inlined = self
                .position_of(c)
                .map(|p| self.stages[p].location == Location::Inlined)
                .unwrap_or(false);
            if inlined {
                work.extend(self.direct_consumers(c));
            } else if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }

    /// Applies one step, leaving the state unchanged if it fails.
    pub fn apply(&mut self, step: &Step) -> Result<(), ScheduleError> {
        let mut next = self.clone();
        next.apply_in_place(step)?;
        *self = next;
        Ok(())
    }

    /// Split loop `iter` of `stage` into `factors.len() + 1` loops with inner extents `factors`.
    pub fn split(&mut self, stage: u32, iter: u32, factors: &[i64]) -> Result<(), ScheduleError> {
        self.apply(&Step::Split {
            stage,
            iter,
            factors: factors.to_vec(),
        })
    }
    /// Split loop `iter` into `nparts` outer iterations.
    pub fn split_nparts(
        &mut self,
        stage: u32,
        iter: u32,
        nparts: i64,
    ) -> Result<(), ScheduleError> {
        self.apply(&Step::SplitNParts {
            stage,
            iter,
            nparts,
        })
    }
    /// 2-D tiling: split loops `x` and `y` (x outer of y, adjacent or not) by `fx`, `fy` and
    /// order them `x.0, y.0, x.1, y.1` in place of the two.
    pub fn tile(
        &mut self,
        stage: u32,
        x: u32,
        y: u32,
        fx: i64,
        fy: i64,
    ) -> Result<(), ScheduleError> {
        let mut next = self.clone();
        if x >= y {
            return Err(ScheduleError::BadReorder {
                stage: next.stage_name(stage),
                order: vec![x, y],
                count: 0,
            });
        }
        next.apply_in_place(&Step::Split {
            stage,
            iter: y,
            factors: vec![fy],
        })?;
        next.apply_in_place(&Step::Split {
            stage,
            iter: x,
            factors: vec![fx],
        })?;
        // Loops now: ..., x.0, x.1, ..., y.0 (at y+1), y.1 (at y+2), ...
        let n = next.stages[stage as usize].leaves.len() as u32;
        let (x0, x1, y0, y1) = (x, x + 1, y + 1, y + 2);
        let mut order: Vec<u32> = Vec::with_capacity(n as usize);
        for p in 0..n {
            if p == x0 {
                order.extend([x0, y0, x1, y1]);
            } else if p == x1 || p == y0 || p == y1 {
                continue;
            } else {
                order.push(p);
            }
        }
        next.apply_in_place(&Step::Reorder { stage, order })?;
        *self = next;
        Ok(())
    }
    /// Fuse consecutive loops into one.
    pub fn fuse(&mut self, stage: u32, iters: &[u32]) -> Result<(), ScheduleError> {
        self.apply(&Step::Fuse {
            stage,
            iters: iters.to_vec(),
        })
    }
    /// Reorder all loops of a stage.
    pub fn reorder(&mut self, stage: u32, order: &[u32]) -> Result<(), ScheduleError> {
        self.apply(&Step::Reorder {
            stage,
            order: order.to_vec(),
        })
    }
    /// Compute `stage` inside loop `iter` of its consumer `target`.
    pub fn compute_at(&mut self, stage: u32, target: u32, iter: u32) -> Result<(), ScheduleError> {
        self.apply(&Step::ComputeAt {
            stage,
            target,
            iter,
        })
    }
    /// Inline an injective stage into its consumers.
    pub fn compute_inline(&mut self, stage: u32) -> Result<(), ScheduleError> {
        self.apply(&Step::ComputeInline { stage })
    }
    /// Move a stage back to the root.
    pub fn compute_root(&mut self, stage: u32) -> Result<(), ScheduleError> {
        self.apply(&Step::ComputeRoot { stage })
    }
    /// Add an accumulator stage of `scope` before `stage`; returns its position (`stage`, the
    /// original moves to `stage + 1` and becomes the copy-out).
    pub fn cache_write(&mut self, stage: u32, scope: Scope) -> Result<u32, ScheduleError> {
        self.apply(&Step::CacheWrite { stage, scope })?;
        Ok(stage)
    }
    /// Add a copy of `stage` in `scope` read by `readers`; returns its position (`stage + 1`).
    pub fn cache_read(
        &mut self,
        stage: u32,
        scope: Scope,
        readers: &[u32],
    ) -> Result<u32, ScheduleError> {
        self.apply(&Step::CacheRead {
            stage,
            scope,
            readers: readers.to_vec(),
        })?;
        Ok(stage + 1)
    }
    /// Vectorize a loop.
    pub fn vectorize(&mut self, stage: u32, iter: u32) -> Result<(), ScheduleError> {
        self.annotate(stage, iter, Annotation::Vectorize)
    }
    /// Vectorize a loop if, lowered, it has at most `max_lanes` iterations (see
    /// [`Annotation::VectorizeUpTo`]).
    pub fn vectorize_up_to(
        &mut self,
        stage: u32,
        iter: u32,
        max_lanes: u32,
    ) -> Result<(), ScheduleError> {
        self.annotate(stage, iter, Annotation::VectorizeUpTo(max_lanes))
    }
    /// Store the stage's buffer with its dimensions in `order` (see
    /// [`Step::ReorderStorage`]).
    pub fn reorder_storage(&mut self, stage: u32, order: &[u32]) -> Result<(), ScheduleError> {
        self.apply(&Step::ReorderStorage {
            stage,
            order: order.to_vec(),
        })
    }
    /// Unroll a loop.
    pub fn unroll(&mut self, stage: u32, iter: u32) -> Result<(), ScheduleError> {
        self.annotate(stage, iter, Annotation::Unroll)
    }
    /// Run a loop's iterations in parallel.
    pub fn parallel(&mut self, stage: u32, iter: u32) -> Result<(), ScheduleError> {
        self.annotate(stage, iter, Annotation::Parallel)
    }
    /// Bind a loop to a GPU thread axis.
    pub fn bind(
        &mut self,
        stage: u32,
        iter: u32,
        axis: crate::ir::ThreadAxis,
    ) -> Result<(), ScheduleError> {
        self.annotate(stage, iter, Annotation::Bind(axis))
    }
    fn annotate(
        &mut self,
        stage: u32,
        iter: u32,
        annotation: Annotation,
    ) -> Result<(), ScheduleError> {
        self.apply(&Step::Annotate {
            stage,
            iter,
            annotation,
        })
    }
    /// Factor reduce loop `iter` out into a new stage (returned position, `stage`; the original
    /// moves to `stage + 1` and reduces the partial results).
    pub fn rfactor(&mut self, stage: u32, iter: u32) -> Result<u32, ScheduleError> {
        self.apply(&Step::Rfactor { stage, iter })?;
        Ok(stage)
    }
    /// The `auto_unroll_max_step` pragma on loop `iter` of `stage`.
    pub fn auto_unroll(
        &mut self,
        stage: u32,
        iter: u32,
        max_step: u32,
    ) -> Result<(), ScheduleError> {
        self.apply(&Step::AutoUnroll {
            stage,
            iter,
            max_step,
        })
    }

    /// Prefetch what `stage` reads of `tensor` `offset` further along its `axis` into the L1
    /// cache (see [`Step::Prefetch`]).
    pub fn prefetch(
        &mut self,
        stage: u32,
        tensor: u32,
        axis: u32,
        offset: i64,
    ) -> Result<(), ScheduleError> {
        self.prefetch_to(stage, tensor, axis, offset, PrefetchLevel::L1)
    }

    /// [`State::prefetch`] into the cache `level`.
    pub fn prefetch_to(
        &mut self,
        stage: u32,
        tensor: u32,
        axis: u32,
        offset: i64,
        level: PrefetchLevel,
    ) -> Result<(), ScheduleError> {
        self.apply(&Step::Prefetch {
            stage,
            tensor,
            axis,
            offset,
            level,
        })
    }

    pub(crate) fn stage_name(&self, stage: u32) -> String {
        self.stages
            .get(stage as usize)
            .map(|s| s.name().to_string())
            .unwrap_or_else(|| format!("#{stage}"))
    }
}

/// Tensors loaded by a stage's body.
pub(crate) fn loads(op: &StageOp) -> Vec<TensorId> {
    let mut v = Vec::new();
    if let Some((_, body)) = op.compute() {
        body.visit(&mut |e| {
            if let Expr::Load { tensor, .. } = e {
                if !v.contains(tensor) {
                    v.push(*tensor);
                }
            }
        });
    }
    v
}

impl fmt::Display for State {
    /// One block per stage: its location, then its loops outer to inner with extents and
    /// annotations.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (pos, s) in self.stages.iter().enumerate() {
            if s.is_placeholder() {
                writeln!(f, "{pos}: placeholder {}{:?}", s.name(), s.op.shape)?;
                continue;
            }
            let loc = match s.location {
                Location::Root => "root".to_string(),
                Location::Inlined => "inlined".to_string(),
                Location::At { tensor, iter } => {
                    let t = self.position_of(tensor).map(|p| &self.stages[p]);
                    match t {
                        Some(t) => format!("at {}.{}", t.name(), t.iter(iter).name),
                        None => "at ?".to_string(),
                    }
                }
            };
            writeln!(f, "{pos}: {} ({loc}, {})", s.name(), s.scope.name())?;
            if s.location == Location::Inlined {
                continue;
            }
            for &l in &s.leaves {
                let it = s.iter(l);
                let kind = if it.kind == IterKind::Reduce {
                    " reduce"
                } else {
                    ""
                };
                let ann = match it.annotation {
                    None => String::new(),
                    Some(Annotation::Vectorize) => " vectorized".into(),
                    Some(Annotation::VectorizeUpTo(n)) => format!(" vectorized up to {n}"),
                    Some(Annotation::Unroll) => " unrolled".into(),
                    Some(Annotation::Parallel) => " parallel".into(),
                    Some(Annotation::Bind(t)) => format!(" {}", t.name()),
                };
                let pragma = match s.auto_unroll {
                    Some((id, n)) if id == l => format!(" auto_unroll_max_step={n}"),
                    _ => String::new(),
                };
                writeln!(f, "  {} {}{kind}{ann}{pragma}", it.name, it.extent)?;
            }
        }
        Ok(())
    }
}
