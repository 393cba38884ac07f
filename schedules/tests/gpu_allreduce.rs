//! Cross-thread reduction (`lower::allreduce`): a reduce loop bound to `threadIdx.x` lowers to
//! per-thread partial results combined by warp shuffles (whole warps) or in shared memory
//! (other thread counts). Hand schedules with rows on `blockIdx.x` and the reduction on 1 to
//! 8 warps and on 12 and 7 threads pass the GPU verifier and agree with the evaluator in the
//! lockstep interpreter (which reports any race); a kernel with one of its barriers removed is
//! caught as a race, and one whose shuffles half a warp runs is refused by both.

mod common;
use common::{dag, inputs};
use tensortune_schedules::expr::{self, DType};
use tensortune_schedules::gpu::interp::{run_lockstep, GpuEvalError};
use tensortune_schedules::gpu::verify::verify_gpu;
use tensortune_schedules::ir::{LoweredFunc, Scope, Stmt, ThreadAxis};
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::CudaDesc;
use tensortune_schedules::te::Graph;
use tensortune_schedules::{eval, ComputeDag};

fn sm90() -> CudaDesc {
    CudaDesc::for_arch("sm_90").expect("sm_90 is known")
}

/// `Y[i] = max_k X[i, k]` over `X[m, n]`.
fn reduce_max(m: i64, n: i64) -> ComputeDag {
    let mut g = Graph::new();
    let x = g.placeholder("X", &[m, n], DType::F32);
    let k = g.reduce_axis(n, "k");
    let y = g.compute("Y", &[m], &["i"], |ax| {
        expr::max_reduce(x.at([ax[0].clone(), k.expr()]), [&k])
    });
    ComputeDag::new(&g, &[y]).expect("dag")
}

/// The last stage (a row reduction) with its rows on `blockIdx.x` and its reduce loop split
/// by `threads`, the inner part bound to `threadIdx.x`: i k.o k.i.
fn rows_on_blocks(d: &ComputeDag, threads: i64) -> State {
    let mut s = State::new(d);
    let y = s.stages().len() as u32 - 1;
    s.split(y, 1, &[threads]).expect("split k");
    s.bind(y, 0, ThreadAxis::BlockX).expect("bind i");
    s.bind(y, 2, ThreadAxis::ThreadX).expect("bind k.i");
    s
}

/// Lowers `s`, checks it with the GPU verifier and runs it in lockstep against the evaluator.
fn agrees(d: &ComputeDag, s: &State, seed: u64) -> LoweredFunc {
    let f = lower(s).unwrap_or_else(|e| panic!("lower: {e}\n{s}"));
    verify_gpu(&f, &sm90()).unwrap_or_else(|e| panic!("verify: {e}\n{f}"));
    let ins = inputs(d, seed);
    let want = eval::evaluate(d, &ins).expect("evaluate");
    let got = run_lockstep(&f, &ins).unwrap_or_else(|e| panic!("lockstep: {e}\n{f}"));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let diff = g.max_rel_diff(w).expect("same shape and dtype");
        assert!(diff < 1e-4, "differs by {diff}\n{f}");
    }
    f
}

fn syncs(s: &Stmt) -> usize {
    let mut n = 0;
    s.visit(&mut |x| n += matches!(x, Stmt::Sync) as usize);
    n
}

#[test]
fn a_row_sum_on_32_and_on_12_threads_agrees_with_the_evaluator() {
    let d = dag("reduce_sum:M=5,N=37");
    for threads in [32, 12] {
        let f = agrees(&d, &rows_on_blocks(&d, threads), threads as u64);
        let u = verify_gpu(&f, &sm90()).expect("verified above");
        assert_eq!(u.launch.grid, [5, 1, 1]);
        assert_eq!(u.launch.block, [threads as u32, 1, 1]);
        if threads == 32 {
            // One warp: its shuffles fold all 32 partials; one result in shared memory,
            // barriers before and after it only.
            assert_eq!(u.shared_bytes, 4);
            assert_eq!(syncs(&f.body), 2, "{f}");
            assert_eq!(shuffles(&f.body), 5, "{f}");
        } else {
            // One partial result per thread in shared memory; barriers before and after
            // the partials, and one per tree step (4 for 12 threads).
            assert_eq!(u.shared_bytes, 4 * threads as u64);
            assert_eq!(syncs(&f.body), 2 + 4, "{f}");
            assert_eq!(shuffles(&f.body), 0, "{f}");
        }
    }
}

#[test]
fn whole_warps_reduce_by_shuffles_then_one_value_per_warp() {
    // 2, 3 (a non-power of two of warps), 4 and 8 warps; sums, maxima and integer sums;
    // rows of several block widths, and one (130 on 128 threads) whose last pass is ragged.
    let sum = dag("reduce_sum:M=3,N=700");
    let ragged = dag("reduce_sum:M=2,N=130");
    let max = reduce_max(3, 300);
    let int = dag("reduce_sum:M=3,N=200,dtype=i32");
    for (d, threads) in [
        (&sum, 64),
        (&sum, 96),
        (&sum, 256),
        (&ragged, 128),
        (&max, 96),
        (&int, 64),
    ] {
        let f = agrees(d, &rows_on_blocks(d, threads), threads as u64);
        let u = verify_gpu(&f, &sm90()).expect("verified above");
        let warps = threads / 32;
        assert_eq!(u.shared_bytes, 4 * warps as u64, "{f}");
        // Before the partials, after them, after the first warp's fold.
        assert_eq!(syncs(&f.body), 3, "{f}");
        // Five exchanges in each warp, then log2 of the warps rounded up in the first.
        let second = (warps as u64).next_power_of_two().trailing_zeros() as usize;
        assert_eq!(shuffles(&f.body), 5 + second, "{f}");
    }
}

fn shuffles(s: &Stmt) -> usize {
    let mut n = 0;
    s.visit(&mut |x| n += matches!(x, Stmt::Shuffle { .. }) as usize);
    n
}

/// `s` with its shuffles run only by the threads whose `threadIdx.x` variable `tx` is
/// below 16: half of each warp.
fn half_warp_shuffles(s: &Stmt, tx: &expr::Var) -> Stmt {
    match s {
        Stmt::Shuffle { .. } => Stmt::If {
            cond: expr::Expr::var(tx).lt(16i64),
            then: Box::new(s.clone()),
            otherwise: None,
        },
        Stmt::For {
            var,
            kind: tensortune_schedules::ir::ForKind::ThreadBound(ThreadAxis::ThreadX),
            ..
        } if var != tx => s.clone(),
        other => other.map_children(&mut |c| half_warp_shuffles(c, tx)),
    }
}

#[test]
fn a_shuffle_that_half_a_warp_runs_is_refused_by_the_verifier_and_the_interpreter() {
    let d = dag("reduce_sum:M=2,N=64");
    let f = lower(&rows_on_blocks(&d, 32)).expect("lower");
    let mut tx = None;
    f.body.visit(&mut |s| {
        if let Stmt::For {
            var,
            kind: tensortune_schedules::ir::ForKind::ThreadBound(ThreadAxis::ThreadX),
            ..
        } = s
        {
            tx.get_or_insert(*var);
        }
    });
    let tx = tx.expect("a threadIdx.x loop");
    let mut g = f.clone();
    g.body = half_warp_shuffles(&f.body, &tx);
    assert_eq!(shuffles(&g.body), 5);
    match verify_gpu(&g, &sm90()) {
        Err(e) => assert!(e.to_string().contains("condition on thread index"), "{e}"),
        Ok(_) => panic!("verified a half-warp shuffle\n{g}"),
    }
    match run_lockstep(&g, &inputs(&d, 4)) {
        Err(GpuEvalError::PartialWarpShuffle { lane, .. }) => assert_eq!(lane, 16),
        r => panic!("ran a half-warp shuffle: {r:?}\n{g}"),
    }
}

#[test]
fn a_row_max_on_32_and_on_12_threads_agrees_with_the_evaluator() {
    let d = reduce_max(5, 37);
    for threads in [32, 12, 7] {
        agrees(&d, &rows_on_blocks(&d, threads), 3 + threads as u64);
    }
}

#[test]
fn integer_sums_and_more_threads_than_elements() {
    let d = dag("reduce_sum:M=3,N=5,dtype=i32");
    agrees(&d, &rows_on_blocks(&d, 8), 1);
    agrees(&d, &rows_on_blocks(&d, 5), 2);
}

/// Softmax with the rows on `blockIdx.x`: the exponential inlined, the row maximum and the
/// row sum computed at the row loop of `Y` as cross-thread reductions of `threads` threads,
/// and `Y`'s columns split by `threads` and bound to `threadIdx.x`.
fn softmax_rows(d: &ComputeDag, threads: i64) -> State {
    let mut s = State::new(d);
    // X row_max exp row_sum Y
    s.compute_inline(2).expect("inline exp");
    s.split(4, 1, &[threads]).expect("split j");
    s.bind(4, 0, ThreadAxis::BlockX).expect("bind i");
    s.bind(4, 2, ThreadAxis::ThreadX).expect("bind j.i");
    // The row sum first: the row maximum is read by it and by Y, so it goes beside it.
    for r in [3, 1] {
        s.compute_at(r, 4, 0).expect("compute_at");
        // Its region's row, then the reduce loop.
        s.split(r, 1, &[threads]).expect("split k");
        s.bind(r, 2, ThreadAxis::ThreadX).expect("bind k.i");
    }
    s
}

#[test]
fn softmax_reductions_shared_by_the_block_agree_with_the_evaluator() {
    let d = dag("softmax:M=33,N=40");
    for threads in [32, 12] {
        let f = agrees(&d, &softmax_rows(&d, threads), threads as u64);
        let scopes: Vec<(String, Scope)> = f
            .buffers
            .iter()
            .map(|b| (b.name.clone(), b.scope))
            .collect();
        for name in ["row_max", "row_sum"] {
            assert!(
                scopes.contains(&(name.to_string(), Scope::Shared)),
                "{name}: {scopes:?}"
            );
        }
    }
}

/// Removes the `n`-th `Sync` (in visiting order) of `s`.
fn drop_sync(s: &Stmt, n: &mut usize) -> Stmt {
    match s {
        Stmt::Seq(items) => {
            let mut out = Vec::new();
            for x in items {
                if matches!(x, Stmt::Sync) {
                    if *n == 0 {
                        *n = usize::MAX;
                        continue;
                    }
                    *n = n.saturating_sub(1);
                    out.push(Stmt::Sync);
                } else {
                    out.push(drop_sync(x, n));
                }
            }
            Stmt::Seq(out)
        }
        other => other.map_children(&mut |c| drop_sync(c, n)),
    }
}

#[test]
fn a_missing_barrier_is_a_race() {
    let d = dag("reduce_sum:M=5,N=37");
    // The shared-memory tree (12 threads: steps 8, 4, 2, 1 with 4, 4, 2, 1 threads): barriers
    // 1, 3 and 4 (after the partials, before the steps 2 and 1) each order one thread's write
    // before another's read. (Barrier 0 fences a previous use of the array, barrier 2 the
    // step of 8, whose threads 0..4 read only what they wrote and what the partials did, and
    // the last one the result: none is a race in this kernel.)
    // By shuffles (64 threads, two warps): barrier 1 orders the second warp's partial
    // before the first warp's read of it.
    for (threads, racy) in [(12, vec![1, 3, 4]), (64, vec![1])] {
        let f = lower(&rows_on_blocks(&d, threads)).expect("lower");
        let ins = inputs(&d, 9);
        assert!(run_lockstep(&f, &ins).is_ok());
        for drop in racy {
            let mut g = f.clone();
            let mut n = drop;
            g.body = drop_sync(&f.body, &mut n);
            assert_eq!(syncs(&g.body), syncs(&f.body) - 1);
            match run_lockstep(&g, &ins) {
                Err(GpuEvalError::Race { buffer, .. }) => assert_eq!(buffer, "Y.red", "{g}"),
                r => panic!("{threads} threads, barrier {drop} removed: {r:?}\n{g}"),
            }
        }
    }
}
