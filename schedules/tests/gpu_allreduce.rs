//! Cross-thread reduction (`lower::allreduce`): a reduce loop bound to `threadIdx.x` lowers to
//! per-thread partial results combined in shared memory. Hand schedules with rows on
//! `blockIdx.x` and the reduction on 32 and on 12 threads (a non-power of two) pass the GPU
//! verifier and agree with the evaluator in the lockstep interpreter (which reports any race);
//! a kernel with one of its barriers removed is caught as a race.

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
        // One partial result per thread in shared memory.
        assert_eq!(u.shared_bytes, 4 * threads as u64);
        // Before and after the partials, and one per tree step: 5 steps for 32, 4 for 12.
        let steps = if threads == 32 { 5 } else { 4 };
        assert_eq!(syncs(&f.body), 2 + steps, "{f}");
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
    let f = lower(&rows_on_blocks(&d, 32)).expect("lower");
    let ins = inputs(&d, 9);
    assert!(run_lockstep(&f, &ins).is_ok());
    // Barriers 1 to 5 (after the partials, between the tree steps 16, 8, 4, 2, 1) each order
    // one thread's write before another's read. (Barrier 0 fences a previous use of the
    // array and the last one the result: neither is a race in this kernel, where thread 0
    // reads only what it wrote.)
    for drop in 1..=5 {
        let mut g = f.clone();
        let mut n = drop;
        g.body = drop_sync(&f.body, &mut n);
        assert_eq!(syncs(&g.body), syncs(&f.body) - 1);
        match run_lockstep(&g, &ins) {
            Err(GpuEvalError::Race { buffer, .. }) => assert_eq!(buffer, "Y.red", "{g}"),
            r => panic!("barrier {drop} removed: {r:?}\n{g}"),
        }
    }
}
