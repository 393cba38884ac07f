//! The loop-IR verifier. It checks, for a [`LoweredFunc`]:
//! 1. every loop extent is at least 1;
//! 2. every variable used is bound by an enclosing `For`, and each variable is bound once;
//! 3. every buffer used is a parameter or inside the `Allocate` that introduces it, and each
//!    temporary is allocated exactly once;
//! 4. a `Vectorized` loop holds no `For`, `Allocate` or `Sync`;
//! 5. stored values have the buffer's dtype, indices are integers, conditions are bools, and
//!    every expression type-checks; no tensor-level `Load` or `Reduce` remains.

use crate::expr::{BufId, DType, Expr};
use crate::ir::{BufKind, ForKind, LoweredFunc, Stmt};
use rustc_hash::FxHashSet as HashSet;

/// Checks the invariants above; the error says which failed and where.
pub fn verify(f: &LoweredFunc) -> Result<(), String> {
    let mut v = Verifier {
        f,
        bound: HashSet::default(),
        ever_bound: HashSet::default(),
        live: f.params.iter().copied().collect(),
        allocated: HashSet::default(),
    };
    for (i, b) in f.buffers.iter().enumerate() {
        let is_param = f.params.contains(&BufId(i as u32));
        if is_param == matches!(b.kind, BufKind::Temp) {
            return Err(format!("buffer `{}`: parameter kind mismatch", b.name));
        }
        if b.shape.iter().any(|&d| d < 1) {
            return Err(format!("buffer `{}` has an empty dimension", b.name));
        }
    }
    v.stmt(&f.body, false)
}

struct Verifier<'a> {
    f: &'a LoweredFunc,
    bound: HashSet<u32>,
    ever_bound: HashSet<u32>,
    live: HashSet<BufId>,
    allocated: HashSet<BufId>,
}

impl Verifier<'_> {
    fn expr(&self, e: &Expr) -> Result<DType, String> {
        let mut err = None;
        e.visit(&mut |x| match x {
            Expr::Var(v) if !self.bound.contains(&v.id) => {
                err.get_or_insert(format!(
                    "variable `{}` used outside its loop in `{e}`",
                    v.name
                ));
            }
            Expr::Load { .. } | Expr::Reduce { .. } => {
                err.get_or_insert(format!("tensor-level expression left in `{e}`"));
            }
            Expr::BufLoad { buf, .. } if !self.live.contains(buf) => {
                err.get_or_insert(format!("buffer #{} read outside its allocation", buf.0));
            }
            _ => {}
        });
        if let Some(e) = err {
            return Err(e);
        }
        e.check().map_err(|t| t.to_string())
    }

    fn stmt(&mut self, s: &Stmt, in_vector: bool) -> Result<(), String> {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                if in_vector {
                    return Err(format!("loop `{}` inside a vectorized loop", var.name));
                }
                if *extent < 1 {
                    return Err(format!("loop `{}` has extent {extent}", var.name));
                }
                if var.id >= self.f.num_vars || !self.ever_bound.insert(var.id) {
                    return Err(format!(
                        "variable `{}` bound twice or out of range",
                        var.name
                    ));
                }
                self.bound.insert(var.id);
                self.stmt(body, *kind == ForKind::Vectorized)?;
                self.bound.remove(&var.id);
                Ok(())
            }
            Stmt::Store { buf, index, value } => {
                let decl = self
                    .f
                    .buffers
                    .get(buf.0 as usize)
                    .ok_or_else(|| format!("store to unknown buffer #{}", buf.0))?;
                if !self.live.contains(buf) {
                    return Err(format!("store to `{}` outside its allocation", decl.name));
                }
                if !self.expr(index)?.is_int() {
                    return Err(format!("non-integer index into `{}`", decl.name));
                }
                let t = self.expr(value)?;
                if t != decl.dtype {
                    return Err(format!(
                        "storing {t} into `{}` of {}",
                        decl.name, decl.dtype
                    ));
                }
                Ok(())
            }
            Stmt::Allocate { buf, body } => {
                if in_vector {
                    return Err("allocation inside a vectorized loop".into());
                }
                if self.f.params.contains(buf) || !self.allocated.insert(*buf) {
                    return Err(format!(
                        "buffer #{} allocated twice or is a parameter",
                        buf.0
                    ));
                }
                self.live.insert(*buf);
                self.stmt(body, in_vector)?;
                self.live.remove(buf);
                Ok(())
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                if self.expr(cond)? != DType::Bool {
                    return Err(format!("condition `{cond}` is not bool"));
                }
                self.stmt(then, in_vector)?;
                if let Some(o) = otherwise {
                    self.stmt(o, in_vector)?;
                }
                Ok(())
            }
            Stmt::Seq(v) => v.iter().try_for_each(|x| self.stmt(x, in_vector)),
            // Its index may lie outside the buffer (it accesses nothing), but the buffer
            // must be one the function can name there.
            Stmt::Prefetch { buf, index, .. } => {
                let decl = self
                    .f
                    .buffers
                    .get(buf.0 as usize)
                    .ok_or_else(|| format!("prefetch of unknown buffer #{}", buf.0))?;
                if !self.live.contains(buf) {
                    return Err(format!(
                        "prefetch of `{}` outside its allocation",
                        decl.name
                    ));
                }
                if !self.expr(index)?.is_int() {
                    return Err(format!("non-integer prefetch index into `{}`", decl.name));
                }
                Ok(())
            }
            Stmt::Shuffle {
                buf,
                index,
                value,
                lane_xor,
            } => {
                if in_vector {
                    return Err("warp shuffle inside a vectorized loop".into());
                }
                if *lane_xor >= 32 {
                    return Err(format!(
                        "warp shuffle with lane mask {lane_xor}, past the 32 lanes of a warp"
                    ));
                }
                // The same checks as a store's.
                self.stmt(
                    &Stmt::Store {
                        buf: *buf,
                        index: index.clone(),
                        value: value.clone(),
                    },
                    false,
                )
            }
            Stmt::Sync if in_vector => Err("barrier inside a vectorized loop".into()),
            Stmt::Sync => Ok(()),
        }
    }
}
