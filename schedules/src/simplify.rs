//! The simplifier: constant folding and canonical affine index forms, aware of loop ranges.
//!
//! Index (i64) expressions are brought to a sum of `coefficient * atom` plus a constant, where
//! an atom is a variable or a sub-expression that is not affine (a floor division or modulo
//! that cannot be resolved, a min or max). Terms keep the order in which they first appear, so
//! the printed form is stable for a given input. With the ranges of the enclosing loop
//! variables it also:
//! - resolves `(c*q + r) / c` to `q` and `(c*q + r) % c` to `r` when `0 <= r < c`;
//! - decides comparisons whose two sides have disjoint ranges (guards removed where provably
//!   true, branches removed where provably false);
//! - removes loops of extent 1 (their variable is 0).
//!
//! Float expressions are only constant-folded: no reassociation, so results do not change.

use crate::expr::{BinOp, CmpOp, Const, DType, Expr};
use crate::ir::{ForKind, Stmt};
use rustc_hash::{FxHashMap as HashMap, FxHashSet};

/// Inclusive integer ranges of variables, by id.
#[derive(Clone, Debug, Default)]
pub struct Ranges {
    map: HashMap<u32, (i64, i64)>,
}

impl Ranges {
    /// No known ranges.
    pub fn new() -> Ranges {
        Ranges::default()
    }
    /// Declares `lo <= var <= hi`.
    pub fn set(&mut self, var: u32, lo: i64, hi: i64) {
        self.map.insert(var, (lo, hi));
    }
    /// Forgets a variable.
    pub fn remove(&mut self, var: u32) {
        self.map.remove(&var);
    }
    /// The declared range of a variable.
    pub fn get(&self, var: u32) -> Option<(i64, i64)> {
        self.map.get(&var).copied()
    }
}

/// `sum(coef * atom) + constant`.
#[derive(Clone, Debug, PartialEq)]
struct Lin {
    terms: Vec<(Expr, i64)>,
    c: i64,
}

impl Lin {
    fn constant(c: i64) -> Lin {
        Lin {
            terms: Vec::new(),
            c,
        }
    }
    fn atom(e: Expr) -> Lin {
        Lin {
            terms: vec![(e, 1)],
            c: 0,
        }
    }
    fn add(mut self, other: Lin, sign: i64) -> Lin {
        self.c = self.c.wrapping_add(other.c.wrapping_mul(sign));
        for (a, k) in other.terms {
            match self.terms.iter_mut().find(|(b, _)| *b == a) {
                Some(t) => t.1 = t.1.wrapping_add(k.wrapping_mul(sign)),
                None => self.terms.push((a, k.wrapping_mul(sign))),
            }
        }
        self.terms.retain(|(_, k)| *k != 0);
        self
    }
    fn scale(mut self, f: i64) -> Lin {
        if f == 0 {
            return Lin::constant(0);
        }
        self.c = self.c.wrapping_mul(f);
        for t in &mut self.terms {
            t.1 = t.1.wrapping_mul(f);
        }
        self
    }
    fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.c)
    }
    fn to_expr(&self) -> Expr {
        let mut out: Option<Expr> = None;
        for (a, k) in &self.terms {
            let mag = k.abs();
            let term = if mag == 1 { a.clone() } else { a.clone() * mag };
            out = Some(match out {
                None if *k < 0 => Expr::bin(BinOp::Sub, Expr::int(0), term),
                None => term,
                Some(acc) if *k < 0 => acc - term,
                Some(acc) => acc + term,
            });
        }
        match out {
            None => Expr::int(self.c),
            Some(e) if self.c > 0 => e + self.c,
            Some(e) if self.c < 0 => e - (-self.c),
            Some(e) => e,
        }
    }
}

/// The simplifier, with the ranges of variables in scope.
pub struct Simplifier {
    /// Ranges of the variables in scope.
    pub ranges: Ranges,
    /// Variables of removed unit loops, each standing for 0 (substituted as the expressions
    /// are rebuilt, rather than by copying the loop's body first).
    zeros: FxHashSet<u32>,
}

impl Default for Simplifier {
    fn default() -> Self {
        Simplifier::new(Ranges::new())
    }
}

impl Simplifier {
    /// A simplifier with known ranges.
    pub fn new(ranges: Ranges) -> Simplifier {
        Simplifier {
            ranges,
            zeros: Default::default(),
        }
    }

    /// Simplifies an expression.
    pub fn expr(&self, e: &Expr) -> Expr {
        if e.dtype() == DType::I64 {
            return self.lin(e).to_expr();
        }
        match e {
            Expr::Cmp(op, a, b) => self.cmp(*op, a, b),
            Expr::And(a, b) => match (self.expr(a), self.expr(b)) {
                (Expr::Const(Const::Bool(false)), _) | (_, Expr::Const(Const::Bool(false))) => {
                    Expr::Const(Const::Bool(false))
                }
                (Expr::Const(Const::Bool(true)), x) | (x, Expr::Const(Const::Bool(true))) => x,
                (x, y) => x.and(y),
            },
            Expr::Or(a, b) => match (self.expr(a), self.expr(b)) {
                (Expr::Const(Const::Bool(true)), _) | (_, Expr::Const(Const::Bool(true))) => {
                    Expr::Const(Const::Bool(true))
                }
                (Expr::Const(Const::Bool(false)), x) | (x, Expr::Const(Const::Bool(false))) => x,
                (x, y) => x.or(y),
            },
            Expr::Not(a) => match self.expr(a) {
                Expr::Const(Const::Bool(b)) => Expr::Const(Const::Bool(!b)),
                x => Expr::Not(Box::new(x)),
            },
            Expr::Select(c, t, f) => match self.expr(c) {
                Expr::Const(Const::Bool(true)) => self.expr(t),
                Expr::Const(Const::Bool(false)) => self.expr(f),
                c => crate::expr::select(c, self.expr(t), self.expr(f)),
            },
            Expr::Bin(op, a, b) => {
                let (x, y) = (self.expr(a), self.expr(b));
                if let (Expr::Const(p), Expr::Const(q)) = (&x, &y) {
                    if let Some(v) = fold(*op, *p, *q) {
                        return Expr::Const(v);
                    }
                }
                Expr::bin(*op, x, y)
            }
            Expr::Cast(d, a) => {
                let x = self.expr(a);
                match (&x, d) {
                    (Expr::Const(Const::I64(v)), DType::I32) if i32::try_from(*v).is_ok() => {
                        Expr::Const(Const::I32(*v as i32))
                    }
                    (Expr::Const(Const::I64(v)), DType::F32) => Expr::Const(Const::F32(*v as f32)),
                    (Expr::Const(Const::I64(v)), DType::F64) => Expr::Const(Const::F64(*v as f64)),
                    _ if x.dtype() == *d => x,
                    _ => x.cast(*d),
                }
            }
            Expr::Call(f, a) => Expr::Call(*f, Box::new(self.expr(a))),
            Expr::Pair(op, a, b) => Expr::Pair(*op, Box::new(self.expr(a)), Box::new(self.expr(b))),
            Expr::Load { .. } | Expr::BufLoad { .. } => self.load(e),
            Expr::Reduce { .. } | Expr::Var(_) => self.zeroed(e),
            Expr::Const(_) => e.clone(),
        }
    }

    fn cmp(&self, op: CmpOp, a: &Expr, b: &Expr) -> Expr {
        if a.dtype() != DType::I64 {
            let (x, y) = (self.expr(a), self.expr(b));
            if let (Expr::Const(p), Expr::Const(q)) = (&x, &y) {
                let r = crate::scalar::compare(
                    op,
                    crate::scalar::Value::from_const(*p),
                    crate::scalar::Value::from_const(*q),
                    a,
                );
                if let Ok(crate::scalar::Value::B(v)) = r {
                    return Expr::Const(Const::Bool(v));
                }
            }
            return Expr::cmp(op, x, y);
        }
        // d = a - b, compared with 0.
        let d = self.lin(a).add(self.lin(b), -1);
        if let Some((lo, hi)) = self.range_lin(&d) {
            let decided = match op {
                CmpOp::Lt if hi < 0 => Some(true),
                CmpOp::Lt if lo >= 0 => Some(false),
                CmpOp::Le if hi <= 0 => Some(true),
                CmpOp::Le if lo > 0 => Some(false),
                CmpOp::Gt if lo > 0 => Some(true),
                CmpOp::Gt if hi <= 0 => Some(false),
                CmpOp::Ge if lo >= 0 => Some(true),
                CmpOp::Ge if hi < 0 => Some(false),
                CmpOp::Eq if lo == 0 && hi == 0 => Some(true),
                CmpOp::Eq if lo > 0 || hi < 0 => Some(false),
                CmpOp::Ne if lo > 0 || hi < 0 => Some(true),
                CmpOp::Ne if lo == 0 && hi == 0 => Some(false),
                _ => None,
            };
            if let Some(v) = decided {
                return Expr::Const(Const::Bool(v));
            }
        }
        // Canonical: terms on the left, the constant on the right.
        let rhs = -d.c;
        let lhs = Lin {
            terms: d.terms,
            c: 0,
        };
        Expr::cmp(op, lhs.to_expr(), Expr::int(rhs))
    }

    fn lin(&self, e: &Expr) -> Lin {
        match e {
            Expr::Const(Const::I64(v)) => Lin::constant(*v),
            Expr::Var(v) if self.zeros.contains(&v.id) => Lin::constant(0),
            Expr::Var(_) => Lin::atom(e.clone()),
            Expr::Bin(BinOp::Add, a, b) => self.fold_div_mod(self.lin(a).add(self.lin(b), 1)),
            Expr::Bin(BinOp::Sub, a, b) => self.fold_div_mod(self.lin(a).add(self.lin(b), -1)),
            Expr::Bin(BinOp::Mul, a, b) => {
                let (x, y) = (self.lin(a), self.lin(b));
                match (x.as_const(), y.as_const()) {
                    (Some(k), _) => y.scale(k),
                    (_, Some(k)) => x.scale(k),
                    _ => Lin::atom(x.to_expr() * y.to_expr()),
                }
            }
            Expr::Bin(op @ (BinOp::Div | BinOp::Mod), a, b) => {
                let (x, y) = (self.lin(a), self.lin(b));
                match y.as_const() {
                    Some(c) if c > 0 => self.divmod(*op, x, c),
                    _ => Lin::atom(Expr::bin(*op, x.to_expr(), y.to_expr())),
                }
            }
            Expr::Bin(op @ (BinOp::Min | BinOp::Max), a, b) => {
                let (x, y) = (self.lin(a), self.lin(b));
                if let (Some(p), Some(q)) = (x.as_const(), y.as_const()) {
                    return Lin::constant(if *op == BinOp::Min {
                        p.min(q)
                    } else {
                        p.max(q)
                    });
                }
                let d = x.clone().add(y.clone(), -1);
                if let Some((lo, hi)) = self.range_lin(&d) {
                    let x_small = hi <= 0;
                    let y_small = lo >= 0;
                    match op {
                        BinOp::Min if x_small => return x,
                        BinOp::Min if y_small => return y,
                        BinOp::Max if x_small => return y,
                        BinOp::Max if y_small => return x,
                        _ => {}
                    }
                }
                Lin::atom(Expr::bin(*op, x.to_expr(), y.to_expr()))
            }
            Expr::Select(c, t, f) => match self.expr(c) {
                Expr::Const(Const::Bool(true)) => self.lin(t),
                Expr::Const(Const::Bool(false)) => self.lin(f),
                c => Lin::atom(crate::expr::select(c, self.expr(t), self.expr(f))),
            },
            _ => Lin::atom(self.expr_non_index(e)),
        }
    }

    fn expr_non_index(&self, e: &Expr) -> Expr {
        match e {
            Expr::Cast(d, a) => {
                let x = self.expr(a);
                match x {
                    Expr::Const(Const::I32(v)) if *d == DType::I64 => Expr::int(v as i64),
                    x => x.cast(*d),
                }
            }
            Expr::Load { .. } | Expr::BufLoad { .. } => self.load(e),
            _ => self.zeroed(e),
        }
    }

    /// `e` with the variables of removed unit loops replaced by 0 (for the nodes the
    /// simplifier does not rebuild itself).
    fn zeroed(&self, e: &Expr) -> Expr {
        if self.zeros.is_empty() {
            return e.clone();
        }
        e.substitute(&|v| self.zeros.contains(&v.id).then(|| Expr::int(0)))
    }

    /// A load with its indices simplified (any other node is returned as it is).
    fn load(&self, e: &Expr) -> Expr {
        match e {
            Expr::Load {
                tensor,
                dtype,
                indices,
            } => Expr::Load {
                tensor: *tensor,
                dtype: *dtype,
                indices: indices.iter().map(|i| self.expr(i)).collect(),
            },
            Expr::BufLoad { buf, dtype, index } => Expr::BufLoad {
                buf: *buf,
                dtype: *dtype,
                index: Box::new(self.expr(index)),
            },
            _ => e.clone(),
        }
    }

    /// `x / c` or `x % c` for a positive constant `c`.
    fn divmod(&self, op: BinOp, x: Lin, c: i64) -> Lin {
        if c == 1 {
            return if op == BinOp::Div {
                x
            } else {
                Lin::constant(0)
            };
        }
        // Split x into a multiple of c (q*c) and a remainder r.
        let mut q = Lin::constant(x.c.div_euclid(c));
        let mut r = Lin::constant(x.c.rem_euclid(c));
        for (a, k) in &x.terms {
            if k % c == 0 {
                q.terms.push((a.clone(), k / c));
            } else {
                r.terms.push((a.clone(), *k));
            }
        }
        match self.range_lin(&r) {
            Some((lo, hi)) if lo >= 0 && hi < c => {
                if op == BinOp::Div {
                    q
                } else {
                    r
                }
            }
            _ if r.terms.is_empty() => {
                // r is a constant in [0, c).
                if op == BinOp::Div {
                    q
                } else {
                    r
                }
            }
            _ => {
                // (q*c + r) % c == r % c, and, division being floor division,
                // (q*c + r) / c == q + r / c: both keep the same remainder expression, so
                // that `fold_div_mod` can recognise the pair a fused loop leaves.
                let r = r.to_expr();
                if op == BinOp::Mod {
                    Lin::atom(Expr::bin(BinOp::Mod, r, Expr::int(c)))
                } else {
                    q.add(Lin::atom(Expr::bin(BinOp::Div, r, Expr::int(c))), 1)
                }
            }
        }
    }

    /// `k*c*(x / c) + k*(x % c)` folded to `k*x` (floor division: `x == c*(x/c) + x%c` for
    /// every integer `x`). A fused loop `p` over axes of extents `(h, w)` indexes them as `p /
    /// w` and `p % w`; the row-major address `w * (p / w) + p % w` is then `p` again, linear
    /// in the loop, so the fused loop vectorizes into whole-vector accesses instead of
    /// per-lane gathers.
    fn fold_div_mod(&self, mut l: Lin) -> Lin {
        loop {
            let pair = l.terms.iter().enumerate().find_map(|(i, (m, k))| {
                let Expr::Bin(BinOp::Mod, x, c) = m else {
                    return None;
                };
                let cv = c.as_int().filter(|&c| c > 0)?;
                let want = k.checked_mul(cv)?;
                let j = l.terms.iter().position(|(d, kd)| {
                    *kd == want
                        && matches!(d, Expr::Bin(BinOp::Div, y, e) if y == x && e.as_int() == Some(cv))
                })?;
                Some((i, j, (**x).clone(), *k))
            });
            let Some((i, j, x, k)) = pair else {
                return l;
            };
            let (hi, lo) = (i.max(j), i.min(j));
            l.terms.remove(hi);
            l.terms.remove(lo);
            l = l.add(self.lin(&x).scale(k), 1);
        }
    }

    /// Inclusive range of an index expression, if known.
    pub fn range(&self, e: &Expr) -> Option<(i64, i64)> {
        self.range_lin(&self.lin(e))
    }

    fn range_lin(&self, l: &Lin) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (l.c, l.c);
        for (a, k) in &l.terms {
            let (alo, ahi) = self.range_atom(a)?;
            let (p, q) = (alo.checked_mul(*k)?, ahi.checked_mul(*k)?);
            lo = lo.checked_add(p.min(q))?;
            hi = hi.checked_add(p.max(q))?;
        }
        Some((lo, hi))
    }

    fn range_atom(&self, a: &Expr) -> Option<(i64, i64)> {
        match a {
            Expr::Var(v) => self.ranges.get(v.id),
            Expr::Const(Const::I64(v)) => Some((*v, *v)),
            Expr::Bin(BinOp::Div, x, y) => {
                let c = y.as_int().filter(|&c| c > 0)?;
                let (lo, hi) = self.range(x)?;
                Some((lo.div_euclid(c), hi.div_euclid(c)))
            }
            Expr::Bin(BinOp::Mod, x, y) => {
                let c = y.as_int().filter(|&c| c > 0)?;
                match self.range(x) {
                    Some((lo, hi)) if lo >= 0 && hi < c => Some((lo, hi)),
                    _ => Some((0, c - 1)),
                }
            }
            Expr::Bin(op @ (BinOp::Min | BinOp::Max), x, y) => {
                let (a, b) = (self.range(x)?, self.range(y)?);
                Some(if *op == BinOp::Min {
                    (a.0.min(b.0), a.1.min(b.1))
                } else {
                    (a.0.max(b.0), a.1.max(b.1))
                })
            }
            Expr::Bin(BinOp::Mul, x, y) => {
                let (a, b) = (self.range(x)?, self.range(y)?);
                let c = [
                    a.0.checked_mul(b.0)?,
                    a.0.checked_mul(b.1)?,
                    a.1.checked_mul(b.0)?,
                    a.1.checked_mul(b.1)?,
                ];
                Some((*c.iter().min()?, *c.iter().max()?))
            }
            _ => None,
        }
    }

    /// Simplifies a statement; loop variables get the ranges of their loops.
    pub fn stmt(&mut self, s: &Stmt) -> Stmt {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                // A loop bound to a block or thread axis stays, even of one iteration: on a
                // GPU it means "only index 0 of a launch that may be wider", while its body
                // alone would run in every thread (a shared-memory copy every thread makes at
                // once is a race).
                let launch_axis =
                    matches!(kind, ForKind::ThreadBound(a) if crate::gpu::slot(*a).is_some());
                if *extent == 1 && !launch_axis {
                    let fresh = self.zeros.insert(var.id);
                    let b = self.stmt(body);
                    if fresh {
                        self.zeros.remove(&var.id);
                    }
                    return b;
                }
                self.ranges.set(var.id, 0, extent - 1);
                let b = self.stmt(body);
                self.ranges.remove(var.id);
                if is_empty(&b) {
                    return Stmt::Seq(Vec::new());
                }
                Stmt::For {
                    var: *var,
                    extent: *extent,
                    kind: *kind,
                    body: Box::new(b),
                }
            }
            Stmt::Store { buf, index, value } => Stmt::Store {
                buf: *buf,
                index: self.expr(index),
                value: self.expr(value),
            },
            Stmt::Prefetch { buf, index, level } => Stmt::Prefetch {
                buf: *buf,
                index: self.expr(index),
                level: *level,
            },
            Stmt::Allocate { buf, body } => Stmt::Allocate {
                buf: *buf,
                body: Box::new(self.stmt(body)),
            },
            Stmt::If {
                cond,
                then,
                otherwise,
            } => match self.expr(cond) {
                Expr::Const(Const::Bool(true)) => self.stmt(then),
                Expr::Const(Const::Bool(false)) => match otherwise {
                    Some(o) => self.stmt(o),
                    None => Stmt::Seq(Vec::new()),
                },
                c => {
                    let t = self.stmt(then);
                    let o = otherwise
                        .as_ref()
                        .map(|o| self.stmt(o))
                        .filter(|o| !is_empty(o));
                    if is_empty(&t) && o.is_none() {
                        return Stmt::Seq(Vec::new());
                    }
                    Stmt::If {
                        cond: c,
                        then: Box::new(t),
                        otherwise: o.map(Box::new),
                    }
                }
            },
            Stmt::Seq(v) => {
                let items: Vec<Stmt> = v
                    .iter()
                    .map(|x| self.stmt(x))
                    .filter(|x| !is_empty(x))
                    .collect();
                Stmt::seq(items)
            }
            Stmt::Shuffle {
                buf,
                index,
                value,
                lane_xor,
            } => Stmt::Shuffle {
                buf: *buf,
                index: self.expr(index),
                value: self.expr(value),
                lane_xor: *lane_xor,
            },
            Stmt::Sync => Stmt::Sync,
        }
    }
}

fn is_empty(s: &Stmt) -> bool {
    matches!(s, Stmt::Seq(v) if v.is_empty())
}

/// Replaces a variable in every expression of a statement.
pub fn substitute_stmt(s: &Stmt, var: u32, with: &Expr) -> Stmt {
    s.map_exprs(
        &|e: &Expr| e.substitute(&|v| (v.id == var).then(|| with.clone())),
        &|b| b,
    )
}

fn fold(op: BinOp, a: Const, b: Const) -> Option<Const> {
    use crate::scalar::{binary, Value};
    let e = Expr::Const(a);
    match binary(op, Value::from_const(a), Value::from_const(b), &e).ok()? {
        Value::F32(v) => Some(Const::F32(v)),
        Value::F64(v) => Some(Const::F64(v)),
        Value::I32(v) => Some(Const::I32(v)),
        Value::I64(v) => Some(Const::I64(v)),
        Value::B(v) => Some(Const::Bool(v)),
        Value::BF16(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::Var;

    fn md(x: Expr, c: i64) -> Expr {
        Expr::bin(BinOp::Mod, x, Expr::int(c))
    }

    fn v(id: u32) -> Expr {
        Expr::var(&Var::new(id, &format!("v{id}")))
    }

    /// Evaluates an index expression of variables 0 and 1 (floor division, as generated code).
    fn at(e: &Expr, a: i64, b: i64) -> i64 {
        match e {
            Expr::Const(Const::I64(c)) => *c,
            Expr::Var(x) => [a, b][x.id as usize],
            Expr::Bin(op, x, y) => {
                let (x, y) = (at(x, a, b), at(y, a, b));
                match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x.div_euclid(y),
                    BinOp::Mod => x.rem_euclid(y),
                    _ => panic!("{e}"),
                }
            }
            _ => panic!("{e}"),
        }
    }

    #[test]
    fn a_fused_loops_row_and_column_fold_back_into_the_loop() {
        let s = Simplifier::default();
        // p over (h, 56): p / 56 * 56 + p % 56 == p.
        let p = v(0);
        let e = (p.clone() / 56) * 56 + md(p.clone(), 56);
        assert_eq!(s.expr(&e), p);
        // The fused loop split (p = 64 * p1 + p3) and an outer row offset of 448 (8 rows)
        // that is a multiple of the width, plus a constant.
        let (p1, p3) = (v(0), v(1));
        let q = p1.clone() * 64 + p3.clone();
        let e = (q.clone() + 448) / 56 * 56 + md(q.clone() + 448, 56) + 3;
        let got = s.expr(&e);
        assert_eq!(got, s.expr(&(q.clone() + 451)), "{got}");
        // Scaled (a row of a 2-D tensor of width 56 inside a larger one) and subtracted.
        let e = ((q.clone() / 56) * 56 + md(q.clone(), 56)) * 3136 - q.clone() * 3136;
        assert_eq!(s.expr(&e), Expr::int(0));
        // Not a pair: a different divisor, or a coefficient that is not the divisor.
        for e in [
            (q.clone() / 56) * 56 + md(q.clone(), 28),
            (q.clone() / 56) * 58 + md(q.clone(), 56),
        ] {
            let got = s.expr(&e);
            assert!(got.to_string().contains('/'), "{e} became {got}");
            for (a, b) in [(0, 0), (1, 5), (3, 63), (7, 17)] {
                assert_eq!(at(&got, a, b), at(&e, a, b), "{e} became {got} at {a}, {b}");
            }
        }
    }

    #[test]
    fn division_keeps_the_multiple_of_its_divisor_outside() {
        // Floor division: (64*a + b + 448) / 56 == 8 + (64*a + b) / 56, for negative values
        // too.
        let s = Simplifier::default();
        let e = (v(0) * 64 + v(1) + 448) / 56;
        let got = s.expr(&e);
        for a in -3..4 {
            for b in -70..70 {
                assert_eq!(at(&got, a, b), at(&e, a, b), "{got} at {a}, {b}");
            }
        }
        assert!(got.to_string().contains("+ 8"), "{got}");
    }
}
