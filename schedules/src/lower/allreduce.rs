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
//!
//! When `T` is a whole number of warps (a multiple of [`WARP`]), the tree's first five
//! levels run in registers instead: each warp folds its 32 partials by butterfly shuffles
//! ([`Stmt::Shuffle`], five exchanges after which every lane holds the warp's result), one
//! lane per warp writes it to shared memory, and the first warp folds those `W = T / 32`
//! values the same way:
//!
//! ```text
//! Sync
//! tx for t in 0..T: acc = identity; <t's share>
//!                   for m = 16, 8, 4, 2, 1: lane = shuffle_xor(acc, m); acc = acc (op) lane
//!                   if t % 32 == 0: red[t / 32] = acc
//! Sync
//! if W > 1:
//!   tx for t in 0..32: acc = t < W ? red[t] : identity
//!                      for m = Q/2, .., 1: lane = shuffle_xor(acc, m); acc = acc (op) lane
//!                      if t == 0: red[0] = acc        // Q: W rounded up to a power of two
//!   Sync
//! <the result from red[0], as above>
//! ```
//!
//! Two or three barriers instead of `log2 T + 2` (ten for 256 threads), and shared memory
//! of `W` elements instead of `T`. Lanes at or past `W` in the second step hold the
//! identity, and a butterfly over `Q` lanes never reaches past lane `Q - 1`, so the
//! rounding is free here too. Each shuffle lies directly in a thread loop of a whole number
//! of warps, outside every condition, so all 32 lanes of each warp run it together.

use crate::expr::{BufId, Combiner, DType, Expr, Var};

/// Threads of a warp, the unit a shuffle exchanges among (32 on every NVIDIA GPU).
pub(super) const WARP: i64 = 32;
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
    /// Where the thread count is a whole number of warps: the `Local` element a shuffle
    /// brings another lane's accumulator into; `red` then holds one partial per warp.
    pub lane: Option<BufId>,
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
    let op_store = |v: Expr| {
        store(
            x.acc,
            Expr::int(0),
            Expr::bin(op, load(x.acc, Expr::int(0)), v),
        )
    };
    // Lanes 0..span of each warp fold their accumulators: after it each holds the fold of
    // its group of `span` (a power of two).
    let butterfly = |lane: BufId, span: i64| -> Vec<Stmt> {
        let mut out = Vec::new();
        let mut m = span / 2;
        while m >= 1 {
            out.push(Stmt::Shuffle {
                buf: lane,
                index: Expr::int(0),
                value: load(x.acc, Expr::int(0)),
                lane_xor: m as u32,
            });
            out.push(op_store(load(lane, Expr::int(0))));
            m /= 2;
        }
        out
    };

    // The thread's share: the other reduce loops, serial, around the guarded update.
    let mut share = guard(x.preds, op_store(x.source));
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
    let identity = Expr::Const(x.combiner.identity(x.dtype));
    let mut body = vec![Stmt::Sync];
    let mut s = match x.lane.filter(|_| threads % WARP == 0) {
        Some(lane) => {
            let warps = threads / WARP;
            let mut first = vec![store(x.acc, Expr::int(0), identity.clone()), share];
            first.extend(butterfly(lane, WARP));
            first.push(guard(
                vec![Expr::var(&tvar).floormod(WARP).eq_(0i64)],
                store(
                    x.red,
                    Expr::var(&tvar).floordiv(WARP),
                    load(x.acc, Expr::int(0)),
                ),
            ));
            body.push(tx(tvar, threads, Stmt::seq(first)));
            body.push(Stmt::Sync);
            if warps > 1 {
                let t = fresh("lane");
                let mut second = vec![Stmt::If {
                    cond: Expr::var(&t).lt(warps),
                    then: Box::new(store(x.acc, Expr::int(0), load(x.red, Expr::var(&t)))),
                    otherwise: Some(Box::new(store(x.acc, Expr::int(0), identity))),
                }];
                second.extend(butterfly(lane, (warps as u64).next_power_of_two() as i64));
                second.push(guard(
                    vec![Expr::var(&t).eq_(0i64)],
                    store(x.red, Expr::int(0), load(x.acc, Expr::int(0))),
                ));
                body.push(tx(t, WARP, Stmt::seq(second)));
                body.push(Stmt::Sync);
            }
            // No tree steps left.
            0
        }
        None => {
            body.push(tx(
                tvar,
                threads,
                Stmt::seq(vec![
                    store(x.acc, Expr::int(0), identity),
                    share,
                    store(x.red, Expr::var(&tvar), load(x.acc, Expr::int(0))),
                ]),
            ));
            body.push(Stmt::Sync);
            (threads.max(1) as u64).next_power_of_two() as i64 / 2
        }
    };
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
    let mut body = Stmt::seq(body);
    if let Some(lane) = x.lane {
        body = Stmt::Allocate {
            buf: lane,
            body: Box::new(body),
        };
    }
    Stmt::Allocate {
        buf: x.red,
        body: Box::new(Stmt::Allocate {
            buf: x.acc,
            body: Box::new(body),
        }),
    }
}
