//! [`AlwaysInline`]: an injective stage that is not an output is computed inside its readers.

use super::{
    inlinable, plain, Applies, RuleContext, RuleError, SketchBuilder, SketchRule, Variant,
};
use tensortune_schedules::expr::PairOp;
use tensortune_schedules::te::OpKind;
use tensortune_schedules::trace::Step;
use tensortune_schedules::{ComputeDag, Expr, TensorId};

/// Inlines elementwise stages (bias, relu, exp); a stage that selects (zero padding) or
/// packs bf16 pairs gets a second variant computed at the root (see [`AlwaysInline::apply`]).
pub struct AlwaysInline;

impl SketchRule for AlwaysInline {
    fn name(&self) -> &str {
        "always-inline"
    }

    fn applies(&self, cx: &RuleContext, t: TensorId) -> Applies {
        if inlinable(cx.dag, t) {
            Applies::AndSkipRest
        } else {
            Applies::No
        }
    }

    /// Padding inlined makes every read of it a bounds check in the consumer's innermost
    /// loop; computed once at the root, the reads are plain loads. Which is faster depends on
    /// the tile, so both are searched, unless the consumer's variant asked for a buffer
    /// ([`SketchBuilder::must_materialize`]). The same holds for interleaving bf16 pairs
    /// (a bf16 matmul's `B_pairs`): inlined, each vector of pairs the product reads costs two
    /// half-width loads, two widenings, a shift and an or, once per row of the register tile's
    /// vector column; at the root, one load, after one pass over B.
    fn apply(&self, cx: &RuleContext, b: &SketchBuilder, t: TensorId) -> Vec<Variant> {
        if b.must_materialize(t) {
            return vec![("root".to_string(), plain::plain(cx, b, t))];
        }
        let mut v = vec![("inline".to_string(), inline(b, t))];
        if has_select_or_pack(cx.dag, t) {
            v.push(("root".to_string(), plain::plain(cx, b, t)));
        }
        v
    }
}

fn inline(b: &SketchBuilder, t: TensorId) -> Result<SketchBuilder, RuleError> {
    let mut b = b.clone();
    let p = b.pos(t)?;
    b.fixed(Step::ComputeInline { stage: p })?;
    Ok(b)
}

/// True if the stage's body chooses between values (zero padding does) or packs bf16 pairs.
fn has_select_or_pack(dag: &ComputeDag, t: TensorId) -> bool {
    let mut found = false;
    if let OpKind::Compute { body, .. } = &dag.op(t).kind {
        body.visit(&mut |e| found |= matches!(e, Expr::Select(..) | Expr::Pair(PairOp::Pack, ..)));
    }
    found
}
