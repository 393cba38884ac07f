//! Integer evaluation of flat buffer indices, and what follows from it for one access: the
//! stride and span of each enclosing loop and the footprint of the loops from a level inward.
//!
//! Indices are i64 expressions of the loop variables with floor division and modulo (see
//! `tensortune_schedules::expr`). Evaluation here never fails loudly: an index that cannot be
//! evaluated (a load inside an index, a division by zero) makes [`eval`] return `None` and the
//! caller falls back to a neutral guess. Arithmetic wraps, so no input can overflow-panic.

use tensortune_schedules::expr::{BinOp, CmpOp, Const, Expr};

/// Values of the loop variables, indexed by variable id; unbound variables read as 0.
pub(crate) struct Env {
    values: Vec<i64>,
}

impl Env {
    /// An environment for variable ids `0..num_vars`, all zero.
    pub(crate) fn new(num_vars: u32) -> Env {
        Env {
            values: vec![0; num_vars as usize],
        }
    }

    /// Sets a variable (ids outside the table are ignored: they read as 0 anyway).
    pub(crate) fn set(&mut self, id: u32, value: i64) {
        if let Some(slot) = self.values.get_mut(id as usize) {
            *slot = value;
        }
    }

    fn get(&self, id: u32) -> i64 {
        self.values.get(id as usize).copied().unwrap_or(0)
    }
}

/// Evaluates an integer (or boolean, as 0/1) expression; `None` when it is not integer
/// arithmetic of the loop variables.
pub(crate) fn eval(e: &Expr, env: &Env) -> Option<i64> {
    Some(match e {
        Expr::Const(c) => match *c {
            Const::I64(v) => v,
            Const::I32(v) => v as i64,
            Const::Bool(b) => b as i64,
            Const::F32(_) | Const::F64(_) => return None,
        },
        Expr::Var(v) => env.get(v.id),
        Expr::Bin(op, a, b) => {
            let (a, b) = (eval(a, env)?, eval(b, env)?);
            match op {
                BinOp::Add => a.wrapping_add(b),
                BinOp::Sub => a.wrapping_sub(b),
                BinOp::Mul => a.wrapping_mul(b),
                BinOp::Div => floor_div(a, b)?,
                BinOp::Mod => a.wrapping_sub(floor_div(a, b)?.wrapping_mul(b)),
                BinOp::Min => a.min(b),
                BinOp::Max => a.max(b),
            }
        }
        Expr::Cmp(op, a, b) => {
            let (a, b) = (eval(a, env)?, eval(b, env)?);
            (match op {
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
                CmpOp::Lt => a < b,
                CmpOp::Le => a <= b,
                CmpOp::Gt => a > b,
                CmpOp::Ge => a >= b,
            }) as i64
        }
        Expr::And(a, b) => (eval(a, env)? != 0 && eval(b, env)? != 0) as i64,
        Expr::Or(a, b) => (eval(a, env)? != 0 || eval(b, env)? != 0) as i64,
        Expr::Not(a) => (eval(a, env)? == 0) as i64,
        Expr::Select(c, t, f) => {
            if eval(c, env)? != 0 {
                eval(t, env)?
            } else {
                eval(f, env)?
            }
        }
        Expr::Cast(_, a) => eval(a, env)?,
        Expr::Call(..)
        | Expr::Pair(..)
        | Expr::Load { .. }
        | Expr::BufLoad { .. }
        | Expr::Reduce { .. } => return None,
    })
}

fn floor_div(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    let q = a.wrapping_div(b);
    Some(if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    })
}

/// A loop around a store: its variable and extent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoopDim {
    pub(crate) var: u32,
    pub(crate) extent: i64,
}

/// How one access moves with each enclosing loop, outermost first.
#[derive(Clone, Debug, Default)]
pub(crate) struct AccessPattern {
    /// `index(v = 1) - index(v = 0)` per loop (elements; 0 for a loop the index ignores).
    pub(crate) stride: Vec<i64>,
    /// `|index(v = extent - 1) - index(v = 0)|` per loop (elements).
    pub(crate) span: Vec<i64>,
}

impl AccessPattern {
    /// Analyzes `index` under `loops` (outermost first). An index that does not evaluate is
    /// taken as contiguous in every loop: the guess that neither rewards nor punishes it.
    pub(crate) fn of(index: &Expr, loops: &[LoopDim], env: &mut Env) -> AccessPattern {
        let mut stride = Vec::with_capacity(loops.len());
        let mut span = Vec::with_capacity(loops.len());
        let base = eval(index, env);
        for l in loops {
            let (s, sp) = match base {
                Some(b) => {
                    env.set(l.var, 1.min(l.extent - 1));
                    let one = eval(index, env);
                    env.set(l.var, l.extent - 1);
                    let last = eval(index, env);
                    env.set(l.var, 0);
                    match (one, last) {
                        (Some(o), Some(z)) => (o.wrapping_sub(b), z.wrapping_sub(b).wrapping_abs()),
                        _ => (1, l.extent - 1),
                    }
                }
                None => (1, l.extent - 1),
            };
            stride.push(s);
            span.push(sp);
        }
        AccessPattern { stride, span }
    }

    /// True when the loop at `level` moves the index.
    pub(crate) fn moves(&self, level: usize) -> bool {
        self.stride.get(level).is_some_and(|s| *s != 0)
            || self.span.get(level).is_some_and(|s| *s != 0)
    }

    /// Distinct elements touched by one run of the loops `level..` (outer loops fixed), in
    /// elements, at least 1, as f64 (products of extents can exceed i64 in principle).
    pub(crate) fn footprint(&self, loops: &[LoopDim], level: usize) -> f64 {
        let mut count = 1.0f64;
        let mut span = 1.0f64;
        for (j, l) in loops.iter().enumerate().skip(level) {
            if self.moves(j) {
                count *= l.extent as f64;
                span += self.span.get(j).copied().unwrap_or(0) as f64;
            }
        }
        count.min(span).max(1.0)
    }

    /// The innermost loop that moves the index, if any.
    pub(crate) fn innermost_moving(&self) -> Option<usize> {
        (0..self.stride.len()).rev().find(|&j| self.moves(j))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_schedules::expr::Var;

    fn v(id: u32) -> Expr {
        Expr::Var(Var::new(id, "v"))
    }

    #[test]
    fn floor_semantics() {
        let env = Env::new(0);
        let e = Expr::int(-7).floordiv(2);
        assert_eq!(eval(&e, &env), Some(-4));
        let e = Expr::int(-7).floormod(2);
        assert_eq!(eval(&e, &env), Some(1));
        assert_eq!(eval(&Expr::int(1).floordiv(0), &env), None);
    }

    #[test]
    fn strides_and_footprint_of_a_matmul_read() {
        // A[i * 64 + k] under loops i (16), j (8), k (64).
        let idx = Expr::bin(BinOp::Add, Expr::bin(BinOp::Mul, v(0), Expr::int(64)), v(2));
        let loops = [
            LoopDim { var: 0, extent: 16 },
            LoopDim { var: 1, extent: 8 },
            LoopDim { var: 2, extent: 64 },
        ];
        let mut env = Env::new(3);
        let p = AccessPattern::of(&idx, &loops, &mut env);
        assert_eq!(p.stride, vec![64, 0, 1]);
        assert_eq!(p.span, vec![960, 0, 63]);
        assert_eq!(p.footprint(&loops, 2), 64.0);
        assert_eq!(p.footprint(&loops, 1), 64.0);
        assert_eq!(p.footprint(&loops, 0), 1024.0);
        assert_eq!(p.innermost_moving(), Some(2));
    }
}
