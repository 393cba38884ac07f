//! How an integer index expression moves across the lanes of a short loop: what a code
//! generator must know to turn the loop's accesses into one wide load or store.
//!
//! For a loop over `v` in `0..lanes`, [`lane_stride`] proves `e(v) = e(0) + s * v` for every
//! lane, and [`divisor`] gives a number that always divides `e(0)`: a contiguous access
//! (`s = 1`) whose first element is a multiple of `lanes` is one aligned vector access.
//!
//! Both see through the floor division and modulo that fusing and splitting loops leave in
//! indices. With `x` a multiple of 4 and `v < 4`, `(x + v) / 32` is `x / 32` in every lane
//! and `(x + v) % 32` is `x % 32 + v`: the lanes never cross a multiple of 32. In general,
//! for `a = base + s * v` with `s > 0` and a constant `c > 0`, let `D = gcd(divisor(base), c)`;
//! `base mod c` is a multiple of `D` below `c`, so at most `c - D`, and when
//! `s * (lanes - 1) < D` no lane reaches the next multiple of `c`: `a / c` is constant
//! and `a % c` has stride `s`. Both are floor operations, so this holds for negative
//! values as well.

use crate::expr::{BinOp, Expr};

/// Greatest common divisor, with `gcd(0, x) = x` (0 is a multiple of everything).
fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    i64::try_from(a).unwrap_or(1)
}

/// A non-negative number that divides `e` with the variable `v` taken as 0, whatever the
/// values of the other variables: 0 when `e` is then 0, 1 when nothing better is known.
pub fn divisor(e: &Expr, v: u32) -> i64 {
    if let Some(c) = e.as_int() {
        return c.checked_abs().unwrap_or(1);
    }
    match e {
        Expr::Var(x) => i64::from(x.id != v),
        Expr::Bin(BinOp::Add | BinOp::Sub, a, b) => gcd(divisor(a, v), divisor(b, v)),
        // A product's factors multiply; past i64 nothing is claimed.
        Expr::Bin(BinOp::Mul, a, b) => divisor(a, v).checked_mul(divisor(b, v)).unwrap_or(1),
        Expr::Bin(BinOp::Mod, a, b) => match b.as_int() {
            // a = q * c + r: r is a multiple of anything dividing both a and c.
            Some(c) if c > 0 => gcd(divisor(a, v), c),
            _ => 1,
        },
        Expr::Bin(BinOp::Div, a, b) => match (divisor(a, v), b.as_int()) {
            // a = k * m * c exactly: a / c = k * m.
            (d, Some(c)) if c > 0 && d % c == 0 => d / c,
            _ => 1,
        },
        // A widening cast keeps the value.
        Expr::Cast(d, a) if d.is_int() && a.dtype().is_int() && d.bytes() >= a.dtype().bytes() => {
            divisor(a, v)
        }
        _ => 1,
    }
}

/// The constant `s` with `e(v) = e(0) + s * v` for every `v` in `0..lanes`, if there is one
/// that this analysis proves (see the module doc); 0 when `e` does not read `v`.
pub fn lane_stride(e: &Expr, v: u32, lanes: i64) -> Option<i64> {
    if !e.uses_var(v) {
        return Some(0);
    }
    match e {
        Expr::Var(x) => Some(i64::from(x.id == v)),
        Expr::Bin(BinOp::Add, a, b) => {
            lane_stride(a, v, lanes)?.checked_add(lane_stride(b, v, lanes)?)
        }
        Expr::Bin(BinOp::Sub, a, b) => {
            lane_stride(a, v, lanes)?.checked_sub(lane_stride(b, v, lanes)?)
        }
        Expr::Bin(BinOp::Mul, a, b) => match (a.as_int(), b.as_int()) {
            (Some(c), _) => lane_stride(b, v, lanes)?.checked_mul(c),
            (_, Some(c)) => lane_stride(a, v, lanes)?.checked_mul(c),
            _ => None,
        },
        Expr::Bin(op @ (BinOp::Div | BinOp::Mod), a, b) => {
            let c = b.as_int().filter(|&c| c > 0)?;
            let s = lane_stride(a, v, lanes)?;
            if s == 0 {
                return Some(0);
            }
            let room = gcd(divisor(a, v), c);
            let reach = s.checked_mul(lanes.max(1) - 1)?;
            if s < 0 || reach >= room {
                return None;
            }
            Some(if *op == BinOp::Div { 0 } else { s })
        }
        Expr::Cast(d, a) if d.is_int() && a.dtype().is_int() && d.bytes() >= a.dtype().bytes() => {
            lane_stride(a, v, lanes)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::Var;

    fn var(id: u32) -> Expr {
        Expr::var(&Var::new(id, "x"))
    }

    #[test]
    fn a_fused_split_index_is_contiguous_and_aligned_in_its_lanes() {
        // f = o * 4 + l over lanes l of 4, as a fused copy split by 4 lanes leaves it:
        // (f / 32) * 32 + f % 32, and a global index k * 256 + (f / 32) * 128 + f % 32.
        let (o, l, k) = (var(0), var(1), var(2));
        let f = o * 4i64 + l;
        let shared = f.clone().floordiv(32i64) * 32i64 + f.clone().floormod(32i64);
        let global = k * 256i64 + f.clone().floordiv(32i64) * 128i64 + f.floormod(32i64);
        for e in [&shared, &global] {
            assert_eq!(lane_stride(e, 1, 4), Some(1), "{e}");
            assert_eq!(divisor(e, 1) % 4, 0, "{e}");
        }
        // Eight lanes would cross a multiple of 32 from an o * 4 that is not a multiple of 8.
        assert_eq!(lane_stride(&shared, 1, 8), None);
        assert_eq!(divisor(&shared, 1) % 8, 4);
    }

    #[test]
    fn the_claims_hold_on_every_value() {
        // Brute force over small values of the other variable: whenever a stride or a
        // divisor is claimed, it is true.
        let (o, l) = (var(0), var(1));
        let exprs = [
            (o.clone() * 6i64 + l.clone()).floormod(12i64),
            (o.clone() * 6i64 + l.clone()).floordiv(12i64),
            (o.clone() * 4i64 + l.clone() * 2i64).floormod(16i64) + o.clone() * 3i64,
            (o.clone() * 8i64 + l.clone()).floordiv(4i64),
            (o.clone() * 12i64 - l.clone()).floormod(6i64),
            (o.clone() + l.clone()).floormod(5i64),
            (o * 10i64).floordiv(5i64) * 3i64 + l,
        ];
        for e in &exprs {
            for lanes in [2, 3, 4] {
                let at = |ov: i64, lv: i64| {
                    let s = e.substitute(&|x| match x.id {
                        0 => Some(Expr::int(ov)),
                        1 => Some(Expr::int(lv)),
                        _ => None,
                    });
                    crate::simplify::Simplifier::default()
                        .expr(&s)
                        .as_int()
                        .expect("constant")
                };
                for ov in -20..20 {
                    if let Some(s) = lane_stride(e, 1, lanes) {
                        for lv in 0..lanes {
                            assert_eq!(at(ov, lv), at(ov, 0) + s * lv, "{e} at {ov}, {lv}");
                        }
                    }
                    let d = divisor(e, 1);
                    let first = at(ov, 0);
                    assert!(
                        if d == 0 { first == 0 } else { first % d == 0 },
                        "{e}: {d} does not divide {first} at {ov}"
                    );
                }
            }
        }
        // The first three are proved contiguous or constant for two lanes.
        assert_eq!(lane_stride(&exprs[0], 1, 2), Some(1));
        assert_eq!(lane_stride(&exprs[1], 1, 2), Some(0));
        assert_eq!(lane_stride(&exprs[2], 1, 2), Some(2));
        assert_eq!(lane_stride(&exprs[5], 1, 2), None);
    }
}
