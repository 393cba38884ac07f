//! Bound inference: the region of a producer that a consumer's inner loops read.
//!
//! A stage computed at loop `L` of its consumer produces, per iteration of the loops at and
//! outside `L`, only the elements the loops inside `L` will read. For each dimension the
//! region is `[base, base + extent)`, where `base` is an expression of the outer loop
//! variables and `extent` a constant. Index expressions are bounded by interval arithmetic
//! with the inner variables over their ranges and the outer ones symbolic; where the extent
//! does not come out constant (a non-affine index), the region is the whole dimension, which
//! is always correct.

use crate::expr::{BinOp, Expr};
use crate::simplify::Simplifier;
use rustc_hash::FxHashMap as HashMap;

/// The region of one dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct DimRegion {
    /// First element, an expression of the loops outside the attach point.
    pub base: Expr,
    /// Number of elements.
    pub extent: i64,
    /// True when the region is the whole dimension (base 0).
    pub full: bool,
}

/// Symbolic `(lo, hi)` of `e` when the variables of `inner` range over `[0, extent)`.
fn bound(e: &Expr, inner: &HashMap<u32, i64>) -> Option<(Expr, Expr)> {
    let uses_inner = |x: &Expr| {
        let mut found = false;
        x.visit(&mut |n| {
            if let Expr::Var(v) = n {
                found |= inner.contains_key(&v.id);
            }
        });
        found
    };
    match e {
        Expr::Var(v) => match inner.get(&v.id) {
            Some(&ext) => Some((Expr::int(0), Expr::int(ext - 1))),
            None => Some((e.clone(), e.clone())),
        },
        Expr::Const(_) => Some((e.clone(), e.clone())),
        _ if !uses_inner(e) => Some((e.clone(), e.clone())),
        Expr::Bin(BinOp::Add, a, b) => {
            let ((l1, h1), (l2, h2)) = (bound(a, inner)?, bound(b, inner)?);
            Some((l1 + l2, h1 + h2))
        }
        Expr::Bin(BinOp::Sub, a, b) => {
            let ((l1, h1), (l2, h2)) = (bound(a, inner)?, bound(b, inner)?);
            Some((l1 - h2, h1 - l2))
        }
        Expr::Bin(BinOp::Mul, a, b) => {
            let (x, k) = match (a.as_int(), b.as_int()) {
                (Some(k), _) => (b, k),
                (_, Some(k)) => (a, k),
                _ => return None,
            };
            let (l, h) = bound(x, inner)?;
            if k >= 0 {
                Some((l * k, h * k))
            } else {
                Some((h * k, l * k))
            }
        }
        Expr::Bin(BinOp::Div, a, b) => {
            let c = b.as_int().filter(|&c| c > 0)?;
            let (l, h) = bound(a, inner)?;
            Some((l.floordiv(c), h.floordiv(c)))
        }
        Expr::Bin(BinOp::Mod, _, b) => {
            let c = b.as_int().filter(|&c| c > 0)?;
            Some((Expr::int(0), Expr::int(c - 1)))
        }
        Expr::Bin(op @ (BinOp::Min | BinOp::Max), a, b) => {
            let ((l1, h1), (l2, h2)) = (bound(a, inner)?, bound(b, inner)?);
            Some((Expr::bin(*op, l1, l2), Expr::bin(*op, h1, h2)))
        }
        _ => None,
    }
}

/// The region of a tensor of shape `shape` read at `accesses` (index lists of the loads),
/// with `inner` the variables of the loops inside the attach point and their extents.
pub fn infer_region(
    shape: &[i64],
    accesses: &[Vec<Expr>],
    inner: &HashMap<u32, i64>,
) -> Vec<DimRegion> {
    let simp = Simplifier::default();
    let full = |d: usize| DimRegion {
        base: Expr::int(0),
        extent: shape[d],
        full: true,
    };
    (0..shape.len())
        .map(|d| {
            let mut acc: Option<(Expr, Expr)> = None;
            for idx in accesses {
                let Some(i) = idx.get(d) else { return full(d) };
                let Some((lo, hi)) = bound(i, inner) else {
                    return full(d);
                };
                let (lo, hi) = (simp.expr(&lo), simp.expr(&hi));
                acc = Some(match acc {
                    None => (lo, hi),
                    Some((l0, h0)) => {
                        let dl = simp.expr(&(lo.clone() - l0.clone())).as_int();
                        let dh = simp.expr(&(hi.clone() - h0.clone())).as_int();
                        match (dl, dh) {
                            (Some(dl), Some(dh)) => {
                                (if dl < 0 { lo } else { l0 }, if dh > 0 { hi } else { h0 })
                            }
                            _ => return full(d),
                        }
                    }
                });
            }
            let Some((lo, hi)) = acc else { return full(d) };
            match simp.expr(&(hi - lo.clone() + 1)).as_int() {
                Some(ext) if ext >= 1 && ext < shape[d] => DimRegion {
                    base: lo,
                    extent: ext,
                    full: false,
                },
                _ => full(d),
            }
        })
        .collect()
}
