//! GPU schedules lowered: shared-memory stages attached inside thread loops are sized for
//! the whole block and fenced by barriers; virtual threads share them and keep their own
//! accumulators; binding one axis twice in a nest is refused.

mod common;
use common::dag;
use tensortune_schedules::data::NdData;
use tensortune_schedules::ir::{ForKind, LoweredFunc, Scope, Stmt, ThreadAxis};
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::{ScheduleError, State};
use tensortune_schedules::{eval, interp, ComputeDag};

/// matmul MxNxK the way GPU sketches do it: the output tile of a block, `ti` x `tj` threads
/// each computing `ri` x `rj` outputs in a local accumulator, the reduction in steps of
/// `kt` whose slices of A and B are fetched into shared memory by all threads together.
fn gpu_matmul(spec: &str, ti: i64, tj: i64, ri: i64, rj: i64, kt: i64) -> (ComputeDag, State) {
    gpu_matmul_vthread(spec, ti, tj, 1, ri, rj, kt)
}

fn shared_buffers(f: &LoweredFunc) -> Vec<(String, i64)> {
    f.buffers
        .iter()
        .filter(|b| b.scope == Scope::Shared)
        .map(|b| (b.name.clone(), b.size()))
        .collect()
}

/// How many statements of `s` satisfy `pred`.
fn count(s: &Stmt, pred: impl Fn(&Stmt) -> bool) -> usize {
    let mut n = 0;
    s.visit(&mut |x| n += usize::from(pred(x)));
    n
}

fn count_syncs(s: &Stmt) -> usize {
    count(s, |x| matches!(x, Stmt::Sync))
}

fn inputs(d: &ComputeDag) -> Vec<NdData> {
    d.inputs()
        .iter()
        .enumerate()
        .map(|(i, &t)| NdData::random(&d.op(t).shape, d.op(t).dtype, 11 + i as u64).expect("data"))
        .collect()
}

#[test]
fn shared_stages_span_the_block_and_are_fenced_by_barriers() {
    // 8 x 8 threads of 2 x 2 outputs: a block computes 16 x 16 of C; k in steps of 8.
    let (d, s) = gpu_matmul("matmul:M=64,N=32,K=24", 8, 8, 2, 2, 8);
    let f = lower(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
    let mut sh = shared_buffers(&f);
    sh.sort();
    // A.shared: 16 rows of the block x 8 of k; B.shared: 8 of k x 16 columns.
    assert_eq!(
        sh.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        vec![16 * 8, 8 * 16],
        "{sh:?}\n{f}"
    );
    assert_eq!(
        count_syncs(&f.body),
        2,
        "a barrier before and after the fetch\n{f}"
    );
    // Serially (one thread after another, each fetching everything) it computes matmul.
    let ins = inputs(&d);
    let want = eval::evaluate(&d, &ins).expect("evaluate");
    let got = interp::run(&f, &ins).expect("interpret");
    let diff = got[0].max_rel_diff(&want[0]).expect("same shape");
    assert!(diff < 1e-4, "differs by {diff}\n{f}");
}

#[test]
fn a_local_stage_is_sized_per_thread() {
    let (_, s) = gpu_matmul("matmul:M=64,N=32,K=24", 8, 8, 2, 2, 8);
    let f = lower(&s).expect("lowers");
    let local: Vec<i64> = f
        .buffers
        .iter()
        .filter(|b| b.scope == Scope::Local)
        .map(|b| b.size())
        .collect();
    assert_eq!(local, vec![4], "one 2 x 2 accumulator per thread\n{f}");
}

#[test]
fn binding_two_loops_of_one_nest_to_one_axis_is_refused() {
    let d = dag("matmul:M=8,N=8,K=4");
    let mut s = State::new(&d);
    s.bind(2, 0, ThreadAxis::ThreadX).expect("first bind");
    let before = s.clone();
    let e = s.bind(2, 1, ThreadAxis::ThreadX).expect_err("second bind");
    assert!(matches!(e, ScheduleError::AxisBoundTwice { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("loop `i` (bound already) and loop `j`: both to threadIdx.x"),
        "{e}"
    );
    assert_eq!(s, before);
    // Virtual threads are loops: more than one may be bound.
    s.bind(2, 1, ThreadAxis::VThread).expect("vthread");
}

/// [`gpu_matmul`] with `v` virtual threads on j: j splits j0 (blocks), j1 (`v` virtual
/// threads), j2 (`tj` threads), j3 (`rj` outputs), so that a thread's `v` tiles of `ri` x `rj`
/// outputs lie `tj * rj` columns apart. (A loop of one virtual thread is no loop at all.)
fn gpu_matmul_vthread(
    spec: &str,
    ti: i64,
    tj: i64,
    v: i64,
    ri: i64,
    rj: i64,
    kt: i64,
) -> (ComputeDag, State) {
    let d = dag(spec);
    let mut s = State::new(&d);
    // 0 A, 1 B, 2 C -> 0 A, 1 B, 2 C.local, 3 C.
    s.cache_write(2, Scope::Local).expect("cache_write");
    // -> 0 A, 1 A.shared, 2 B, 3 C.local, 4 C; then B.shared at 3.
    s.cache_read(0, Scope::Shared, &[2]).expect("cache_read A");
    s.cache_read(2, Scope::Shared, &[3]).expect("cache_read B");
    let (a_sh, b_sh, local, out) = (1, 3, 4, 5);
    // i j -> i0 i1 i2 j0 j1 j2 j3 -> i0 j0 j1 i1 j2 i2 j3 -> bx vt tx i2 j3.
    s.split(out, 0, &[ti, ri]).expect("split i");
    s.split(out, 3, &[v, tj, rj]).expect("split j");
    s.reorder(out, &[0, 3, 4, 1, 5, 2, 6]).expect("reorder");
    s.fuse(out, &[0, 1]).expect("fuse blocks");
    s.fuse(out, &[2, 3]).expect("fuse threads");
    s.bind(out, 0, ThreadAxis::BlockX).expect("bind bx");
    s.bind(out, 1, ThreadAxis::VThread).expect("bind vthread");
    s.bind(out, 2, ThreadAxis::ThreadX).expect("bind tx");
    s.compute_at(local, out, 2).expect("local at tx");
    s.split(local, 2, &[kt]).expect("split k");
    s.reorder(local, &[2, 3, 0, 1]).expect("reorder local");
    for st in [a_sh, b_sh] {
        s.compute_at(st, local, 0).expect("shared at ko");
        s.fuse(st, &[0, 1]).expect("fuse copy");
        s.split(st, 0, &[ti * tj]).expect("split copy");
        s.bind(st, 1, ThreadAxis::ThreadX).expect("bind copy");
    }
    (d, s)
}

/// The statements inside loops bound to `vthread`: (barriers, thread loops, shared
/// allocations) among them.
fn under_vthreads(s: &Stmt) -> (usize, usize, usize) {
    let mut n = (0, 0, 0);
    s.visit(&mut |x| {
        if let Stmt::For {
            kind: ForKind::ThreadBound(ThreadAxis::VThread),
            body,
            ..
        } = x
        {
            body.visit(&mut |y| match y {
                Stmt::Sync => n.0 += 1,
                Stmt::For {
                    kind: ForKind::ThreadBound(ThreadAxis::ThreadX),
                    ..
                } => n.1 += 1,
                Stmt::Allocate { .. } => n.2 += 1,
                _ => {}
            });
        }
    });
    n
}

#[test]
fn virtual_threads_share_the_fetch_and_keep_their_own_accumulators() {
    use tensortune_schedules::gpu::interp::run_lockstep;
    use tensortune_schedules::gpu::verify::verify_gpu;
    use tensortune_schedules::target::CudaDesc;
    // 4 x 8 threads, 2 virtual threads on j, 2 x 2 outputs each: a block computes 8 x 32.
    // Odd-sized tails (M = 40, N = 96, K = 20) keep the guards in play.
    for (spec, v) in [("matmul:M=64,N=64,K=24", 2), ("matmul:M=40,N=96,K=20", 3)] {
        let (d, s) = gpu_matmul_vthread(spec, 4, 8, v, 2, 2, 8);
        let f = lower(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
        // Each virtual thread has its 2 x 2 accumulator; the block's copies cover all of
        // them, once.
        let local: Vec<i64> = f
            .buffers
            .iter()
            .filter(|b| b.scope == Scope::Local)
            .map(|b| b.size())
            .collect();
        assert_eq!(local, vec![v * 4], "{f}");
        let mut sh = shared_buffers(&f);
        sh.sort();
        assert_eq!(
            sh.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
            vec![8 * 8, 8 * (v * 8 * 2)],
            "{f}"
        );
        assert_eq!(count_syncs(&f.body), 2, "{f}");
        // No barrier, copy or allocation is repeated per virtual thread.
        assert_eq!(under_vthreads(&f.body), (0, 0, 0), "{f}");
        let vloops = count(&f.body, |x| {
            matches!(
                x,
                Stmt::For {
                    kind: ForKind::ThreadBound(ThreadAxis::VThread),
                    ..
                }
            )
        });
        assert!(
            vloops >= 3,
            "init, update and write-back each per virtual thread\n{f}"
        );
        // It verifies for the GPU, runs race-free in lockstep, and computes matmul, as it
        // does run one thread after another.
        verify_gpu(&f, &CudaDesc::for_arch("sm_90").expect("sm_90"))
            .unwrap_or_else(|e| panic!("{e}\n{f}"));
        let ins = inputs(&d);
        let want = eval::evaluate(&d, &ins).expect("evaluate");
        for got in [
            run_lockstep(&f, &ins).unwrap_or_else(|e| panic!("{e}\n{f}")),
            interp::run(&f, &ins).expect("interpret"),
        ] {
            let diff = got[0].max_rel_diff(&want[0]).expect("same shape");
            assert!(diff < 1e-4, "{spec}: differs by {diff}\n{f}");
        }
    }
}
