//! [`RowWise`]: a row-wise output on the CPU (softmax: an injective output that reads, through
//! elementwise stages, reductions over its last axis) computed one row at a time.
//!
//! The other CPU rules leave softmax's row maximum at the root (it has two readers), inline
//! its `exp` into both readers (computed twice) or leave it at the root as a whole
//! `M × N` intermediate, so the input streams through memory two or three times and the
//! intermediate once more: at most a third of the bandwidth (docs/measurements.md, "Softmax
//! one row at a time"). Here every stage before the output is computed at
//! the output's row loop: per row, the maximum (vector partial results, as [`super::Rfactor`]
//! makes them), `exp` into a row-sized temporary (on the stack, in L1), its sum likewise,
//! then the output row; the input is read from memory once and the output written once.
//!
//! The stages are visited from the output back, so each is attached after every stage that
//! reads it is already at the row loop, as `compute_at` requires of a stage with several
//! readers.
//!
//! An elementwise stage that reads an input (softmax's `exp`) may also prefetch the input's
//! next row (a hole: [`ChoiceKind::Prefetch`]: nothing, the next row into L1, or that and
//! the row after into L2). Its row is the longest computation per row, with the input's row
//! already in L1, so the memory system would idle through it; fetching the next row
//! meanwhile overlaps the two (docs/measurements.md, "Softmax's next row prefetched"), and
//! the row after into L2 keeps memory busy while the next row's first lines are awaited
//! ("The row after next into L2").

use super::gpu_reduce::row_wise;
use super::rfactor::{partial_results, MAX_CHAINS};
use super::{annotate, Applies, RuleContext, RuleError, SketchBuilder, SketchRule, Variant};
use crate::sketch::{ChoiceKind, SketchStep};
use tensortune_schedules::te::OpKind;
use tensortune_schedules::trace::Step;
use tensortune_schedules::{ComputeDag, TensorId};

/// Row-at-a-time structure for a row-wise DAG's stages before its output (see the module
/// doc). The output itself keeps [`super::Plain`]'s structure, whose first loop is the row.
pub struct RowWise;

/// The output of a row-wise DAG and every computed stage it depends on.
fn row_stages(dag: &ComputeDag) -> Option<(TensorId, Vec<TensorId>)> {
    let (out, _) = row_wise(dag)?;
    let mut stages = Vec::new();
    let mut work = dag.info(out).producers.clone();
    while let Some(p) = work.pop() {
        if matches!(dag.op(p).kind, OpKind::Placeholder) || stages.contains(&p) {
            continue;
        }
        stages.push(p);
        work.extend(dag.info(p).producers.iter().copied());
    }
    Some((out, stages))
}

impl SketchRule for RowWise {
    fn name(&self) -> &str {
        "row-wise"
    }

    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        match row_stages(cx.dag) {
            // Beside the other rules' variants: for short rows the whole-array structures
            // can win, and every stage keeps a variant that does not depend on the others.
            Some((_, stages)) if stages.contains(&t) => Applies::Yes,
            _ => Applies::No,
        }
    }

    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        let r = row_stages(cx.dag)
            .ok_or(RuleError::NoStage(0))
            .and_then(|(out, _)| at_row(cx, b, t, out));
        vec![("row".to_string(), r)]
    }
}

/// The stage of `t` computed at the first loop (the row) of `out`'s stage: a reduction as
/// vector partial results and their sum, an elementwise stage over its row, vectorized.
fn at_row(
    cx: &RuleContext,
    b: &SketchBuilder,
    t: TensorId,
    out: TensorId,
) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    let lanes = cx.lanes(t);
    if cx.dag.info(t).combiner.is_none() {
        // The row's elements split for vector lanes, as `Plain` splits a root stage; into
        // whole registers where they divide the row: narrower vectors only multiply the
        // instructions of a stage that computes (`exp`), and in a search that also chooses
        // the prefetch they hid its gain (docs/measurements.md, "Softmax's next row
        // prefetched").
        let n = b.stage_leaves(p)? as u32;
        if n > 1 {
            let row = b.loop_extent(p, n - 1)?;
            if lanes > 1 && row % lanes == 0 {
                b.fixed(Step::Split {
                    stage: p,
                    iter: n - 1,
                    factors: vec![lanes],
                })?;
            } else {
                b.split(p, n - 1, 2, Some(lanes))?;
            }
        }
        let target = b.pos(out)?;
        b.fixed(Step::ComputeAt {
            stage: p,
            target,
            iter: 0,
        })?;
        annotate(cx, &mut b, p, lanes, false)?;
        // The row's axis is the one before the last (row-wise outputs have two or more): one
        // further along it is the next row in memory, across the outer axes' bounds too.
        let axis = cx.dag.op(t).shape.len().saturating_sub(2) as u32;
        for &input in &cx.dag.info(t).producers {
            if matches!(cx.dag.op(input).kind, OpKind::Placeholder) {
                let hole = b.choice(vec![0, 1, 2], ChoiceKind::Prefetch);
                b.defer(SketchStep::Prefetch {
                    tensor: t,
                    input,
                    axis,
                    hole,
                });
            }
        }
        return Ok(b);
    }
    // Up to `MAX_CHAINS` vectors of partial results, as `Rfactor` makes them (for the add
    // latency): at p, their combination at p + 1.
    partial_results(&mut b, p, lanes)?;
    // The sum first (the partial results' reader), then the partial results, both at the row.
    let target = b.pos(out)?;
    b.fixed(Step::ComputeAt {
        stage: p + 1,
        target,
        iter: 0,
    })?;
    b.fixed(Step::ComputeAt {
        stage: p,
        target,
        iter: 0,
    })?;
    // The partial results are up to `MAX_CHAINS` vectors: one wide vector loop, which code
    // generation splits into that many independent registers.
    annotate(cx, &mut b, p, lanes * MAX_CHAINS, false)?;
    annotate(cx, &mut b, p + 1, lanes, false)?;
    Ok(b)
}
