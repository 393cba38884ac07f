//! [`CrossThreadReduction`]: reductions without data reuse on the GPU, each reduced by the
//! threads of one block together (`tensortune_schedules::lower` lowers a reduce loop bound
//! to `threadIdx.x` to per-thread partial results combined in shared memory).
//!
//! Two shapes of DAG:
//! - an output reduction (`reduce_sum`): its spatial loops fused and bound to `blockIdx.x`
//!   (one block per output element), its reduce loop split by a thread count (a tile hole)
//!   and the inner part bound to `threadIdx.x`. [`AutoBind`](super::AutoBind), after it,
//!   adds its variant (one thread per output element), which wins where the rows are many
//!   and short;
//! - a row-wise output (`softmax`): an injective output of rank at least 2 that reads,
//!   through inlined stages, reductions over its last axis (the row maximum and row sum). The
//!   output's leading loops fused and bound to `blockIdx.x` (one row per block), its last loop
//!   split by a thread count and bound to `threadIdx.x`; each reduction computed at the row
//!   loop as a cross-thread reduction of its own thread count (lowering keeps it in shared
//!   memory for the block's threads). The rule takes these stages alone: the other rules'
//!   variants of them leave a reduction read by several stages at the root, where other
//!   blocks would read what it writes.

use super::gpu::{GPU_UNROLL_STEPS, MAX_THREADS};
use super::{Applies, RuleContext, RuleError, SketchBuilder, SketchRule, Variant};
use crate::sketch::{ChoiceKind, SketchStep};
use tensortune_schedules::ir::ThreadAxis;
use tensortune_schedules::schedule::IterKind;
use tensortune_schedules::te::OpKind;
use tensortune_schedules::trace::{Annotation, Step};
use tensortune_schedules::{ComputeDag, TensorId};

/// Cross-thread reductions (see the module doc).
pub struct CrossThreadReduction;

impl SketchRule for CrossThreadReduction {
    fn name(&self) -> &str {
        "cross-thread-reduction"
    }

    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        if row_wise(cx.dag).is_some_and(|(out, reds)| out == t || reds.contains(&t)) {
            Applies::AndSkipRest
        } else if cx.dag.outputs().contains(&t) && plain_reduction(cx.dag, t) {
            Applies::Yes
        } else {
            Applies::No
        }
    }

    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        let r = match row_wise(cx.dag) {
            Some((out, _)) if out == t => rows_on_blocks(b, t),
            Some((out, _)) => reduce_at_row(b, t, out),
            None => output_reduction(b, t),
        };
        vec![("cross-thread".to_string(), r)]
    }
}

/// A reduction over one axis that reads no input independently of its spatial axes (no
/// reuse a tiling would exploit).
fn plain_reduction(dag: &ComputeDag, t: TensorId) -> bool {
    let info = dag.info(t);
    info.combiner.is_some() && info.reduce_axes.len() == 1 && !super::has_data_reuse(dag, t)
}

/// The output and the reductions it reads through inlinable stages, where the DAG is a
/// row-wise one (see the module doc): one output, injective, of rank at least 2, every
/// reduction it depends on a [`plain_reduction`] whose shape is the output's without the
/// last axis; at least one reduction.
pub(super) fn row_wise(dag: &ComputeDag) -> Option<(TensorId, Vec<TensorId>)> {
    let [out] = dag.outputs() else { return None };
    let shape = &dag.op(*out).shape;
    if !dag.info(*out).injective || shape.len() < 2 {
        return None;
    }
    let mut reds = Vec::new();
    let mut work = dag.info(*out).producers.clone();
    while let Some(p) = work.pop() {
        let info = dag.info(p);
        if matches!(dag.op(p).kind, OpKind::Placeholder) {
            continue;
        }
        if info.combiner.is_some() {
            if !plain_reduction(dag, p) || dag.op(p).shape[..] != shape[..shape.len() - 1] {
                return None;
            }
            if !reds.contains(&p) {
                reds.push(p);
            }
        } else if !super::inlinable(dag, p) {
            return None;
        }
        work.extend(info.producers.iter().copied());
    }
    (!reds.is_empty()).then_some((*out, reds))
}

/// Loop `iter` of `stage` bound to `axis`.
fn bind(b: &mut SketchBuilder, stage: u32, iter: u32, axis: ThreadAxis) -> Result<(), RuleError> {
    b.fixed(Step::Annotate {
        stage,
        iter,
        annotation: Annotation::Bind(axis),
    })
}

/// An unroll hole over [`GPU_UNROLL_STEPS`] on the stage of `tensor`.
fn unroll(b: &mut SketchBuilder, tensor: TensorId) {
    let hole = b.choice(GPU_UNROLL_STEPS.to_vec(), ChoiceKind::Unroll);
    b.defer(SketchStep::AutoUnroll { tensor, hole });
}

/// The first `n` loops of stage `p` (spatial ones) fused into one.
fn fuse_leading(b: &mut SketchBuilder, p: u32, n: usize) -> Result<(), RuleError> {
    if n > 1 {
        b.fixed(Step::Fuse {
            stage: p,
            iters: (0..n as u32).collect(),
        })?;
    }
    Ok(())
}

/// An output reduction: one block per output element, the reduction on its threads.
fn output_reduction(b: &SketchBuilder, t: TensorId) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    let st = b.state.stage(p as usize).ok_or(RuleError::NoStage(p))?;
    let spatial = st
        .leaves
        .iter()
        .take_while(|&&l| st.iter(l).kind == IterKind::Spatial)
        .count();
    if spatial == 0 || spatial + 1 != st.leaves.len() {
        // A reduction to one value would be one block; not this rule's.
        return Err(RuleError::NoLoop { stage: p, iter: 0 });
    }
    fuse_leading(&mut b, p, spatial)?;
    bind(&mut b, p, 0, ThreadAxis::BlockX)?;
    // i k -> i k.o k.i, k.i on the threads.
    b.split(p, 1, 2, Some(MAX_THREADS))?;
    bind(&mut b, p, 2, ThreadAxis::ThreadX)?;
    unroll(&mut b, t);
    Ok(b)
}

/// The row-wise output: its rows on blocks, its last axis split over the block's threads.
fn rows_on_blocks(b: &SketchBuilder, t: TensorId) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    let n = b.stage_leaves(p)?;
    fuse_leading(&mut b, p, n - 1)?;
    bind(&mut b, p, 0, ThreadAxis::BlockX)?;
    // row j -> row j.o j.i, j.i on the threads.
    b.split(p, 1, 2, Some(MAX_THREADS))?;
    bind(&mut b, p, 2, ThreadAxis::ThreadX)?;
    unroll(&mut b, t);
    Ok(b)
}

/// A reduction of the row-wise DAG: computed at the output's row loop, its reduce loop split
/// over the block's threads. The output was taken first (the rules run from the outputs
/// back), so its row loop is bound already; the reductions come consumers first, so each is
/// placed beside (before) the ones that read it.
fn reduce_at_row(
    b: &SketchBuilder,
    t: TensorId,
    out: TensorId,
) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    let op = b.pos(out)?;
    let ost = b.state.stage(op as usize).ok_or(RuleError::NoStage(op))?;
    let row_bound = ost
        .leaves
        .first()
        .is_some_and(|&l| ost.iter(l).annotation == Some(Annotation::Bind(ThreadAxis::BlockX)));
    if !row_bound {
        return Err(RuleError::NoLoop { stage: op, iter: 0 });
    }
    b.fixed(Step::ComputeAt {
        stage: p,
        target: op,
        iter: 0,
    })?;
    // Its region's spatial loops (one row), then the reduce loop: split it, inner on threads.
    let n = b.stage_leaves(p)?;
    b.split(p, (n - 1) as u32, 2, Some(MAX_THREADS))?;
    bind(&mut b, p, n as u32, ThreadAxis::ThreadX)?;
    unroll(&mut b, t);
    Ok(b)
}
