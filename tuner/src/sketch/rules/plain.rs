//! [`Plain`]: the structure every stage can take: the innermost spatial loop split for vector
//! lanes, or, where the stage has one consumer, a compute location inside it.

use super::{annotate, Applies, RuleContext, RuleError, SketchBuilder, SketchRule, Variant};
use tensortune_schedules::schedule::IterKind;
use tensortune_schedules::TensorId;

/// The plain structure; applies to every stage, so every stage has at least one variant.
pub struct Plain;

impl SketchRule for Plain {
    fn name(&self) -> &str {
        "plain"
    }

    fn applies(&self, _cx: &RuleContext, _t: TensorId) -> Applies {
        Applies::Yes
    }

    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        vec![("plain".to_string(), plain(cx, b, t))]
    }
}

/// Where the stage has a single consumer, a compute location hole, and the innermost loop
/// vectorized by the extent it gets there ([`crate::sketch::SketchStep::VectorizeRegion`]);
/// otherwise the innermost spatial loop split for vector lanes.
///
/// A stage computed inside its consumer's tile (a padding copy) covers only the region the tile
/// reads: the ResNet conv2d's padding is 58 columns wide, a tile reads 16 of them. Split by the
/// factors of 58 (1 or 2 lanes), its copy stayed scalar, and the search unrolled it (480
/// copies of a select: 12 of the 54 ms the best program of a run took to compile). On one
/// AVX-512 EPYC core that unrolling bought nothing (the 16 best programs of the run, run
/// without it: geometric mean 1.01x, compiled in 0.8x the time), and the best program with
/// its copy vectorized over the region instead ran as fast and compiled in 40 ms.
pub(crate) fn plain(
    cx: &RuleContext,
    b: &SketchBuilder,
    t: TensorId,
) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    let st = b
        .state
        .stage(p as usize)
        .ok_or(RuleError::NoStage(p))?
        .clone();
    let located = locate(&mut b, t)?;
    if let Some(last) = st.leaves.last() {
        if !located && st.iter(*last).kind == IterKind::Spatial && st.iter(*last).extent > 1 {
            b.split(p, st.leaves.len() as u32 - 1, 2, Some(cx.lanes(t)))?;
        }
    }
    annotate(cx, &mut b, p, cx.lanes(t), located)?;
    Ok(b)
}

/// A compute location hole for a stage with a single consumer (true if it got one): the
/// root, or after one of the consumer's first (up to three) spatial loops, innermost first.
pub(crate) fn locate(b: &mut SketchBuilder, t: TensorId) -> Result<bool, RuleError> {
    let consumers = b.state.effective_consumers(t);
    let [c] = consumers.as_slice() else {
        return Ok(false);
    };
    let cp = b.pos(*c)?;
    let cst = b.state.stage(cp as usize).ok_or(RuleError::NoStage(cp))?;
    let spatial = cst
        .leaves
        .iter()
        .take_while(|&&l| cst.iter(l).kind == IterKind::Spatial)
        .count();
    if spatial == 0 {
        return Ok(false);
    }
    let mut choices = vec![-1];
    choices.extend((0..spatial.min(3) as i64).rev());
    let p = b.pos(t)?;
    b.compute_at(p, cp, choices)?;
    Ok(true)
}
