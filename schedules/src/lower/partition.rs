//! Loop partitioning: the guarded tail of an imperfect split gets a loop of its own.
//!
//! A split whose factors do not divide the loop's extent guards the stage's body with a
//! condition like `i.0 * 96 + i.2 * 6 + i.3 < 1000`, which holds in every iteration of the
//! outer loop but the last. Left in place, the guard sits in the innermost loop of the
//! register tile, where it costs a compare and a branch per element and keeps LLVM from
//! keeping the accumulators in registers (a 6 x 16 matmul tile on 1024 rows ran at 23 GFLOP/s
//! guarded, 47 partitioned, on an AVX2 EPYC).
//!
//! A serial loop over `v` whose body holds such guards (a conjunct `a*v + rest < c`, with
//! `a > 0` and `rest` bounded over the enclosing and inner loops) is split where the first
//! of them may fail: a *main* loop over the iterations in which every such guard holds,
//! which the simplifier then frees of them, and a *tail* loop over the rest: a copy of the
//! body with fresh loop variables and temporaries, which keeps its guards. Inside a tail, the
//! loops are partitioned once more (the last rows of a matrix hold the guard of the last
//! register tile), inside a tail's tail not at all, so the code of a nest grows by a small
//! factor, bounded per loop.
//!
//! The pass runs only when `LowerOptions::partition_tails` asks (see there for why it is off
//! by default).

use crate::expr::{BufId, CmpOp, Expr, Var};
use crate::ir::{BufferDecl, ForKind, Stmt};
use crate::simplify::{substitute_stmt, Simplifier};

/// Partitions the loops of `body` (see the module doc); new variables are numbered from
/// `num_vars` and new temporaries appended to `buffers`. Returns the new body, or `None`
/// when no loop was partitioned.
pub fn partition(body: &Stmt, buffers: &mut Vec<BufferDecl>, num_vars: &mut u32) -> Option<Stmt> {
    if !has_guard(body) {
        return None;
    }
    let mut p = Partitioner {
        simp: Simplifier::default(),
        tail_depth: 0,
        buffers,
        num_vars,
        changed: false,
    };
    let out = p.stmt(body);
    p.changed.then_some(out)
}

/// Tails inside tails that are partitioned again: a tail of the outer loop of a split
/// (the last rows of a matrix) holds the guard of the next loop in (the rows of the last
/// tile), and partitioning that too leaves the guard only in the last register tile.
const MAX_TAIL_DEPTH: usize = 2;

struct Partitioner<'a> {
    simp: Simplifier,
    /// How many tails enclose the statement being partitioned.
    tail_depth: usize,
    buffers: &'a mut Vec<BufferDecl>,
    num_vars: &'a mut u32,
    changed: bool,
}

impl Partitioner<'_> {
    fn fresh(&mut self, like: &Var) -> Var {
        let v = Var::new(*self.num_vars, like.name);
        *self.num_vars += 1;
        v
    }

    fn stmt(&mut self, s: &Stmt) -> Stmt {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                if *kind == ForKind::Serial && *extent > 1 {
                    if let Some(cut) = self.split_point(var.id, *extent, body) {
                        self.changed = true;
                        self.simp.ranges.set(var.id, 0, cut - 1);
                        let main = self.stmt(body);
                        self.simp.ranges.remove(var.id);
                        let t = self.fresh(var);
                        let shifted =
                            substitute_stmt(body, var.id, &(Expr::Var(t) + Expr::int(cut)));
                        let tail = Stmt::For {
                            var: t,
                            extent: extent - cut,
                            kind: *kind,
                            body: Box::new(self.renamed(&shifted)),
                        };
                        let tail = if self.tail_depth + 1 < MAX_TAIL_DEPTH {
                            self.tail_depth += 1;
                            let t = self.stmt(&tail);
                            self.tail_depth -= 1;
                            t
                        } else {
                            tail
                        };
                        return Stmt::Seq(vec![
                            Stmt::For {
                                var: *var,
                                extent: cut,
                                kind: *kind,
                                body: Box::new(main),
                            },
                            tail,
                        ]);
                    }
                }
                self.simp.ranges.set(var.id, 0, extent - 1);
                let b = self.stmt(body);
                self.simp.ranges.remove(var.id);
                Stmt::For {
                    var: *var,
                    extent: *extent,
                    kind: *kind,
                    body: Box::new(b),
                }
            }
            _ => s.map_children(&mut |c| self.stmt(c)),
        }
    }

    /// The number of leading iterations of the loop over `var` in which every guard of `body`
    /// that grows with `var` holds, when that is between 1 and `extent - 1`.
    fn split_point(&mut self, var: u32, extent: i64, body: &Stmt) -> Option<i64> {
        let mut cut: Option<i64> = None;
        self.guards(body, &mut |simp, cond| {
            if let Some(c) = prefix_where_true(simp, var, extent, cond) {
                if c >= 1 && c < extent {
                    cut = Some(cut.map_or(c, |k: i64| k.min(c)));
                }
            }
        });
        cut
    }

    /// Calls `f` on every conjunct of every guard in `s`, with the ranges of the loops
    /// around it declared.
    fn guards(&mut self, s: &Stmt, f: &mut dyn FnMut(&mut Simplifier, &Expr)) {
        match s {
            Stmt::For {
                var, extent, body, ..
            } => {
                self.simp.ranges.set(var.id, 0, extent - 1);
                self.guards(body, f);
                self.simp.ranges.remove(var.id);
            }
            Stmt::Allocate { body, .. } => self.guards(body, f),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let mut conjuncts = Vec::new();
                split_and(cond, &mut conjuncts);
                for c in conjuncts {
                    f(&mut self.simp, c);
                }
                self.guards(then, f);
                if let Some(o) = otherwise {
                    self.guards(o, f);
                }
            }
            Stmt::Seq(v) => v.iter().for_each(|x| self.guards(x, f)),
            Stmt::Store { .. } | Stmt::Shuffle { .. } | Stmt::Sync | Stmt::Prefetch { .. } => {}
        }
    }

    /// A copy of `s` with fresh variables for its loops and fresh temporaries for its
    /// allocations (each variable is bound once and each temporary allocated once).
    fn renamed(&mut self, s: &Stmt) -> Stmt {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let v = self.fresh(var);
                let b = substitute_stmt(body, var.id, &Expr::Var(v));
                Stmt::For {
                    var: v,
                    extent: *extent,
                    kind: *kind,
                    body: Box::new(self.renamed(&b)),
                }
            }
            Stmt::Allocate { buf, body } => {
                let nb = BufId(self.buffers.len() as u32);
                let decl = self.buffers.get(buf.0 as usize).cloned();
                match decl {
                    Some(d) => self.buffers.push(d),
                    // An allocation of an undeclared buffer is left for the verifier to name.
                    None => return s.clone(),
                }
                let b = replace_buf(body, *buf, nb);
                Stmt::Allocate {
                    buf: nb,
                    body: Box::new(self.renamed(&b)),
                }
            }
            _ => s.map_children(&mut |c| self.renamed(c)),
        }
    }
}

fn has_guard(s: &Stmt) -> bool {
    match s {
        Stmt::If { .. } => true,
        Stmt::For { body, .. } | Stmt::Allocate { body, .. } => has_guard(body),
        Stmt::Seq(v) => v.iter().any(has_guard),
        Stmt::Store { .. } | Stmt::Shuffle { .. } | Stmt::Sync | Stmt::Prefetch { .. } => false,
    }
}

fn split_and<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::And(a, b) => {
            split_and(a, out);
            split_and(b, out);
        }
        _ => out.push(e),
    }
}

/// For a condition `lhs < rhs` (or `<=`, `>`, `>=`) affine in `var` with a positive
/// coefficient: how many leading iterations of `var` (from 0) it holds in for every value of
/// the other variables in their ranges. `None` when it does not depend on `var` that way or a
/// range is unknown.
fn prefix_where_true(simp: &mut Simplifier, var: u32, extent: i64, cond: &Expr) -> Option<i64> {
    let Expr::Cmp(op, a, b) = cond else {
        return None;
    };
    if !cond.uses_var(var) || !a.dtype().is_int() {
        return None;
    }
    // The condition as `e <= k`.
    let (e, k): (Expr, i64) = match op {
        CmpOp::Lt => ((**a).clone() - (**b).clone(), -1),
        CmpOp::Le => ((**a).clone() - (**b).clone(), 0),
        CmpOp::Gt => ((**b).clone() - (**a).clone(), -1),
        CmpOp::Ge => ((**b).clone() - (**a).clone(), 0),
        _ => return None,
    };
    let saved = simp.ranges.get(var);
    let mut hi_at = |v: i64| {
        simp.ranges.set(var, v, v);
        simp.range(&e).map(|(_, hi)| hi)
    };
    let (h0, h1) = (hi_at(0), hi_at(1));
    let h2 = if extent > 2 { hi_at(2) } else { None };
    match saved {
        Some((lo, hi)) => simp.ranges.set(var, lo, hi),
        None => simp.ranges.remove(var),
    }
    let (h0, h1) = (h0?, h1?);
    let slope = h1.checked_sub(h0)?;
    if slope <= 0 || (extent > 2 && h2?.checked_sub(h1)? != slope) {
        return None;
    }
    // Holds while h0 + slope * v <= k.
    let room = k.checked_sub(h0)?;
    (room >= 0).then(|| room.div_euclid(slope) + 1)
}

/// `s` with every access to buffer `from` made to `to`.
fn replace_buf(s: &Stmt, from: BufId, to: BufId) -> Stmt {
    s.map_exprs(&|e| replace_in_expr(e, from, to), &|b| {
        if b == from {
            to
        } else {
            b
        }
    })
}

/// `e` with every load from buffer `from` made from `to` (an index may itself load from it).
fn replace_in_expr(e: &Expr, from: BufId, to: BufId) -> Expr {
    e.rewrite(&mut |x| match x {
        Expr::BufLoad { buf, dtype, index } if *buf == from => Some(Expr::BufLoad {
            buf: to,
            dtype: *dtype,
            index: Box::new(replace_in_expr(index, from, to)),
        }),
        _ => None,
    })
}
