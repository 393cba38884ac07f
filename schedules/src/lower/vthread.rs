//! Virtual threads: a loop bound to `vthread` pushed down to the statements that read its
//! variable, so that what its iterations share runs once.
//!
//! A GPU sketch splits an output axis `block, vthread, thread, inner`: each thread computes
//! `V` tiles of outputs spaced `threads x inner` apart (so that the threads of a warp read
//! neighbouring words of shared memory, and store neighbouring words of the output), and
//! all `V` of them from the same shared-memory copies. As emitted, the virtual-thread loop
//! encloses the whole computation of a thread: its accumulator, the reduction loop with the
//! block's cooperative copies and barriers, and the write-back; run as an ordinary loop it
//! would copy and synchronize `V` times over.
//!
//! `V` virtual threads are meant like `V` threads of which each real thread runs all:
//! - each has its own copy of what it computes for itself: a temporary allocated inside the
//!   loop and written with values of one virtual thread (a store that reads the loop's
//!   variable or another such temporary, or accumulates into it) gets `V` times the
//!   elements (a leading dimension of `V`), virtual thread `v` using the `v`-th block;
//! - a statement that reads neither the loop's variable nor such a temporary is the same in
//!   every virtual thread (a copy into shared memory, a barrier) and runs once;
//! - any other statement runs once per virtual thread, in a loop of `V` iterations still
//!   bound to `vthread` (the code generator unrolls it) placed as deep as possible: the
//!   loop moves inside sequences, allocations, ordinary and thread loops, and conditions
//!   that do not read its variable. A vectorized loop takes the virtual-thread loop around
//!   it (the loop IR has no loop inside a vectorized one).
//!
//! Moving a loop inward reorders what different virtual threads do; like the iterations of a
//! thread loop, they write disjoint elements between two barriers (their own local blocks,
//! their own outputs), so the order does not matter. One exception keeps the serial meaning:
//! a store that reads the element it writes (an accumulation) and does not read the
//! variable accumulates `V` times, as the ordinary loop would.

use crate::expr::{BufId, Expr, Var};
use crate::ir::{BufferDecl, ForKind, Stmt, ThreadAxis};

/// `body` with every virtual-thread loop pushed down (see the module doc); `buffers` grows
/// the `Local` temporaries allocated inside such loops, and the loops it leaves take fresh
/// variables from `num_vars` on (each variable is bound by one loop).
pub(super) fn inject(body: Stmt, buffers: &mut [BufferDecl], num_vars: &mut u32) -> Stmt {
    if has_vthread(&body) {
        push_all(&body, buffers, num_vars)
    } else {
        // Every CPU program and most GPU ones: nothing to rebuild (lowering runs for every
        // candidate the cost model scores).
        body
    }
}

/// [`inject`] of a body that holds a virtual-thread loop.
fn push_all(body: &Stmt, buffers: &mut [BufferDecl], num_vars: &mut u32) -> Stmt {
    match body {
        Stmt::For {
            var,
            extent,
            kind: ForKind::ThreadBound(ThreadAxis::VThread),
            body: inner,
        } => {
            // Inner virtual-thread loops first: their statements then read both variables.
            let inner = push_all(inner, buffers, num_vars);
            push_down(*var, *extent, &inner, buffers, num_vars)
        }
        _ => body.map_children(&mut |c| push_all(c, buffers, num_vars)),
    }
}

/// True if `s` holds a loop bound to a virtual thread.
fn has_vthread(s: &Stmt) -> bool {
    let mut found = false;
    s.visit(&mut |x| {
        found |= matches!(
            x,
            Stmt::For {
                kind: ForKind::ThreadBound(ThreadAxis::VThread),
                ..
            }
        )
    });
    found
}

/// The loop `for var in 0..extent` bound to `vthread` around `body`, pushed down.
fn push_down(
    var: Var,
    extent: i64,
    body: &Stmt,
    buffers: &mut [BufferDecl],
    num_vars: &mut u32,
) -> Stmt {
    // Each virtual thread's own block of every temporary allocated inside that holds its
    // own values (see `private`).
    let local: Vec<(BufId, i64)> = private(var.id, body)
        .into_iter()
        .filter_map(|b| Some((b, buffers.get(b.0 as usize)?.size())))
        .collect();
    for &(b, _) in &local {
        if let Some(d) = buffers.get_mut(b.0 as usize) {
            d.shape.insert(0, extent);
        }
    }
    let offset = |buf: BufId, index: &Expr| -> Option<Expr> {
        local
            .iter()
            .find(|(b, _)| *b == buf)
            .map(|&(_, size)| index.clone() + Expr::var(&var) * size)
    };
    let body = relocate(body, &offset);
    let mut first = true;
    spread(var, &body, &mut |s| {
        // The first loop keeps the variable; the others get fresh ones.
        let v = if std::mem::take(&mut first) {
            var
        } else {
            let v = Var::new(*num_vars, var.name);
            *num_vars += 1;
            v
        };
        Stmt::For {
            var: v,
            extent,
            kind: ForKind::ThreadBound(ThreadAxis::VThread),
            body: Box::new(crate::simplify::substitute_stmt(s, var.id, &Expr::var(&v))),
        }
    })
}

/// The temporaries allocated in `body` that hold values of one virtual thread (of `var`):
/// those written by a store that reads `var`, that reads such a temporary, or that reads
/// the temporary it writes (an accumulation, which each virtual thread makes for itself).
/// The others are filled the same way by every virtual thread (a copy into shared memory)
/// and are kept once.
fn private(var: u32, body: &Stmt) -> Vec<BufId> {
    let mut inside: Vec<BufId> = Vec::new();
    let mut stores: Vec<(BufId, Expr, Expr)> = Vec::new();
    body.visit(&mut |s| match s {
        Stmt::Allocate { buf, .. } if !inside.contains(buf) => inside.push(*buf),
        Stmt::Store { buf, index, value }
        | Stmt::Shuffle {
            buf, index, value, ..
        } => stores.push((*buf, index.clone(), value.clone())),
        _ => {}
    });
    let reads_buf = |e: &Expr, set: &[BufId]| {
        let mut found = false;
        e.visit(&mut |x| {
            found |= matches!(x, Expr::BufLoad { buf, .. } if set.contains(buf));
        });
        found
    };
    let mut out: Vec<BufId> = Vec::new();
    loop {
        let before = out.len();
        for (buf, index, value) in &stores {
            let buf = *buf;
            if !inside.contains(&buf) || out.contains(&buf) {
                continue;
            }
            let own = index.uses_var(var)
                || value.uses_var(var)
                || reads_buf(index, &out)
                || reads_buf(value, &out)
                || reads_buf(value, &[buf]);
            if own {
                out.push(buf);
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

/// `s` with every access to a temporary that `offset` moves at its new index: loads in every
/// expression, then the index of every store into such a temporary.
fn relocate(s: &Stmt, offset: &dyn Fn(BufId, &Expr) -> Option<Expr>) -> Stmt {
    fn loads(e: &Expr, offset: &dyn Fn(BufId, &Expr) -> Option<Expr>) -> Expr {
        e.rewrite(&mut |x| match x {
            Expr::BufLoad { buf, dtype, index } => {
                let index = loads(index, offset);
                Some(Expr::BufLoad {
                    buf: *buf,
                    dtype: *dtype,
                    index: Box::new(offset(*buf, &index).unwrap_or(index)),
                })
            }
            _ => None,
        })
    }
    fn stores(s: &Stmt, offset: &dyn Fn(BufId, &Expr) -> Option<Expr>) -> Stmt {
        let moved = |buf: BufId, index: &Expr| offset(buf, index).unwrap_or_else(|| index.clone());
        match s {
            Stmt::Store { buf, index, value } => Stmt::Store {
                buf: *buf,
                index: moved(*buf, index),
                value: value.clone(),
            },
            Stmt::Shuffle {
                buf,
                index,
                value,
                lane_xor,
            } => Stmt::Shuffle {
                buf: *buf,
                index: moved(*buf, index),
                value: value.clone(),
                lane_xor: *lane_xor,
            },
            _ => s.map_children(&mut |c| stores(c, offset)),
        }
    }
    stores(&s.map_exprs(&|e| loads(e, offset), &|b| b), offset)
}

/// True if some expression of `s` reads `var`.
fn reads(s: &Stmt, var: u32) -> bool {
    let mut found = false;
    s.visit(&mut |x| {
        found |= match x {
            Stmt::Store { index, value, .. } | Stmt::Shuffle { index, value, .. } => {
                index.uses_var(var) || value.uses_var(var)
            }
            Stmt::If { cond, .. } => cond.uses_var(var),
            // A prefetch's address follows the loads it runs ahead of (a random trace can
            // bind an axis of a stage that prefetches to a virtual thread).
            Stmt::Prefetch { index, .. } => index.uses_var(var),
            _ => false,
        }
    });
    found
}

/// True if `s` stores into an element it reads (`b[i] = b[i] + ...`).
fn accumulates(s: &Stmt) -> bool {
    let mut found = false;
    s.visit(&mut |x| {
        if let Stmt::Store { buf, value, .. } = x {
            value.visit(&mut |e| {
                found |= matches!(e, Expr::BufLoad { buf: b, .. } if b == buf);
            });
        }
    });
    found
}

/// The virtual-thread loop over `var` around `s`, as deep as it goes; `around` makes one
/// such loop around a statement.
fn spread(var: Var, s: &Stmt, around: &mut dyn FnMut(&Stmt) -> Stmt) -> Stmt {
    if !reads(s, var.id) && !accumulates(s) {
        return s.clone();
    }
    match s {
        Stmt::Seq(items) => Stmt::Seq(items.iter().map(|x| spread(var, x, around)).collect()),
        Stmt::Allocate { buf, body } => Stmt::Allocate {
            buf: *buf,
            body: Box::new(spread(var, body, around)),
        },
        Stmt::For {
            var: v,
            extent: n,
            kind,
            body,
        } if *kind != ForKind::Vectorized => Stmt::For {
            var: *v,
            extent: *n,
            kind: *kind,
            body: Box::new(spread(var, body, around)),
        },
        Stmt::If {
            cond,
            then,
            otherwise,
        } if !cond.uses_var(var.id) => {
            let then = Box::new(spread(var, then, around));
            Stmt::If {
                cond: cond.clone(),
                then,
                otherwise: otherwise.as_ref().map(|o| Box::new(spread(var, o, around))),
            }
        }
        _ => around(s),
    }
}
