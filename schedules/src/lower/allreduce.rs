//! Cross-thread reduction: a reduction whose reduce loop is bound to `threadIdx.x`.
//!
//! The threads of a block share one reduction: thread `t` folds the iterations with the
//! bound loop's variable equal to `t` (the other reduce loops run serially in it) into a
//! `Local` accumulator, writes that partial result to element `t` of a `Shared` array of
//! one element per thread, and the partials are combined in a tree in shared memory:
//!
//! ```text
//! Sync                       // nobody still reads the array from a previous use
//! tx for t in 0..T: acc = identity; <t's share>; red[t] = acc
//! Sync
//! for s = P/2, P/4, .., 1:   // P: T rounded up to a power of two
//!   tx for t in 0..T: if t < min(s, T - s): red[t] = red[t] (op) red[t + s]
//!   Sync
//! tx for t in 0..T: if t == 0: out[..] = red[0]     // (every thread when out is Local)
//! ```
//!
//! Rounding `T` up to a power of two is free: the first step folds only the `T - P/2`
//! elements past `P/2`, as if the missing ones held the identity. Every barrier is outside
//! the thread loops, so every thread of the block reaches it (the GPU verifier's rule), and
//! each step reads only elements no thread writes in it (`t + s >= s`).

use crate::expr::{BufId, Combiner, DType, Expr, Var};
use crate::ir::{ForKind, Scope, Stmt, ThreadAxis};

/// What a cross-thread reduction computes and where its result goes.
pub(super) struct CrossThread {
    /// The reduction's combiner.
    pub combiner: Combiner,
    /// The element type.
    pub dtype: DType,
    /// The value folded in per iteration, already reading buffers.
    pub source: Expr,
    /// Every predicate of the stage (guards of imperfect splits and of a region's tile).
    pub preds: Vec<Expr>,
    /// The predicates that read no reduce loop: whether this output element exists.
    pub spatial_preds: Vec<Expr>,
    /// The stage's buffer.
    pub out: BufId,
    /// Its scope: a `Local` result is per thread, so every thread stores it.
    pub out_scope: Scope,
    /// The element stored.
    pub out_index: Expr,
    /// The `Shared` array of partial results, one per thread.
    pub red: BufId,
    /// The `Local` accumulator of one element.
    pub acc: BufId,
}

/// The statement of a cross-thread reduction over `loops` (the stage's reduce loops from the
/// first one in: variable, extent, kind), of which `loops[bound]` is bound to `threadIdx.x`;
/// `fresh` makes the variables of the combining loops.
pub(super) fn emit(
    x: CrossThread,
    loops: &[(Var, i64, ForKind)],
    bound: usize,
    fresh: &mut dyn FnMut(&str) -> Var,
) -> Stmt {
    let op = x.combiner.bin_op();
    let load = |buf: BufId, index: Expr| Expr::BufLoad {
        buf,
        dtype: x.dtype,
        index: Box::new(index),
    };
    let store = |buf: BufId, index: Expr, value: Expr| Stmt::Store { buf, index, value };
    let guard = |ps: Vec<Expr>, s: Stmt| match ps.into_iter().reduce(Expr::and) {
        Some(cond) => Stmt::If {
            cond,
            then: Box::new(s),
            otherwise: None,
        },
        None => s,
    };
    let tx = |var: Var, extent: i64, body: Stmt| Stmt::For {
        var,
        extent,
        kind: ForKind::ThreadBound(ThreadAxis::ThreadX),
        body: Box::new(body),
    };
    let (tvar, threads, _) = loops[bound];

    // The thread's share: the other reduce loops, serial, around the guarded update.
    let mut share = guard(
        x.preds,
        store(
            x.acc,
            Expr::int(0),
            Expr::bin(op, load(x.acc, Expr::int(0)), x.source),
        ),
    );
    for (q, &(var, extent, kind)) in loops.iter().enumerate().rev() {
        if q == bound {
            continue;
        }
        share = Stmt::For {
            var,
            extent,
            kind,
            body: Box::new(share),
        };
    }
    let partial = tx(
        tvar,
        threads,
        Stmt::seq(vec![
            store(
                x.acc,
                Expr::int(0),
                Expr::Const(x.combiner.identity(x.dtype)),
            ),
            share,
            store(x.red, Expr::var(&tvar), load(x.acc, Expr::int(0))),
        ]),
    );
    let mut body = vec![Stmt::Sync, partial, Stmt::Sync];

    let mut s = (threads.max(1) as u64).next_power_of_two() as i64 / 2;
    while s >= 1 {
        let active = s.min(threads - s);
        let t = fresh("tid");
        let combined = Expr::bin(
            op,
            load(x.red, Expr::var(&t)),
            load(x.red, Expr::var(&t) + s),
        );
        body.push(tx(
            t,
            threads,
            guard(
                vec![Expr::var(&t).lt(active)],
                store(x.red, Expr::var(&t), combined),
            ),
        ));
        body.push(Stmt::Sync);
        s /= 2;
    }

    let result = store(x.out, x.out_index, load(x.red, Expr::int(0)));
    body.push(if x.out_scope == Scope::Local {
        // Each thread's own copy: all of them take the block's result.
        guard(x.spatial_preds, result)
    } else {
        // One element for the block (shared) or the launch (global): one thread stores it.
        let t = fresh("tid");
        let mut preds = vec![Expr::var(&t).eq_(0i64)];
        preds.extend(x.spatial_preds);
        tx(t, threads, guard(preds, result))
    });
    Stmt::Allocate {
        buf: x.red,
        body: Box::new(Stmt::Allocate {
            buf: x.acc,
            body: Box::new(Stmt::seq(body)),
        }),
    }
}
