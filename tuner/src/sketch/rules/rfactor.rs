//! [`Rfactor`]: a reduction with little spatial parallelism (softmax's row reductions,
//! reduce_sum) gets its innermost reduce loop as vector lanes of partial results.

use super::plain::locate;
use super::{annotate, Applies, RuleContext, RuleError, SketchBuilder, SketchRule, Variant};
use tensortune_schedules::trace::Step;
use tensortune_schedules::TensorId;

/// rfactor of the innermost reduce axis: partial results over vector lanes (up to
/// `MAX_CHAINS` vectors of them), then a final sum.
/// An alternative to [`super::Plain`] for reductions over at least 8 elements (fewer do not
/// fill a vector).
pub struct Rfactor;

impl SketchRule for Rfactor {
    fn name(&self) -> &str {
        "rfactor"
    }

    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        let info = cx.dag.info(t);
        let elements: i64 = info.reduce_axes.iter().map(|a| a.extent).product();
        if info.combiner.is_some() && elements >= 8 {
            Applies::Yes
        } else {
            Applies::No
        }
    }

    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        vec![("rfactor".to_string(), rfactor(cx, b, t))]
    }
}

/// Vectors of partial results the rfactored lanes may span. One vector makes each output one
/// chain of dependent FMAs, bound by their latency rather than by memory: the GEMV of
/// `dense_bias_relu:M=1,N=4096,K=4096` ran at 20 GB/s that way, a third of what two cores'
/// streams reach (docs/measurements.md, "GEMV"). The FMA latency (4 cycles) times two ports
/// needs 8 chains to keep the units busy.
pub(super) const MAX_CHAINS: i64 = 8;

/// The innermost reduce loop of stage `p` split for up to `MAX_CHAINS` vectors of `lanes`
/// and rfactored: the partial results at `p` (spatial..., k.0, then the lanes innermost), their
/// combination at `p + 1`.
pub(super) fn partial_results(b: &mut SketchBuilder, p: u32, lanes: i64) -> Result<(), RuleError> {
    let n = b.stage_leaves(p)? as u32;
    if n == 0 {
        return Err(RuleError::NoLoop { stage: p, iter: 0 });
    }
    b.split(p, n - 1, 2, Some(lanes * MAX_CHAINS))?; // ..., k.0, k.1
    b.fixed(Step::Rfactor { stage: p, iter: n })?; // rf at p: spatial..., k.1v, k.0
    let m = b.stage_leaves(p)? as u32;
    if m < 2 {
        return Err(RuleError::NoLoop { stage: p, iter: 1 });
    }
    let mut order: Vec<u32> = (0..m - 2).collect();
    order.extend([m - 1, m - 2]);
    b.fixed(Step::Reorder { stage: p, order })
}

fn rfactor(cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    partial_results(&mut b, p, cx.lanes(t))?;
    let rf = b.tensor(p)?;
    locate(&mut b, rf)?;
    annotate(cx, &mut b, p, cx.lanes(t), false)?;
    let fin = p + 1;
    locate(&mut b, t)?;
    annotate(cx, &mut b, fin, cx.lanes(t), false)?;
    Ok(b)
}
