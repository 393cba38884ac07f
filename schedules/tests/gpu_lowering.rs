//! GPU schedules lowered: shared-memory stages attached inside thread loops are sized for
//! the whole block and fenced by barriers; binding one axis twice in a nest is refused.

mod common;
use common::dag;
use tensortune_schedules::data::NdData;
use tensortune_schedules::ir::{LoweredFunc, Scope, Stmt, ThreadAxis};
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::{ScheduleError, State};
use tensortune_schedules::{eval, interp, ComputeDag};

/// matmul MxNxK the way GPU sketches do it: the output tile of a block, `ti` x `tj` threads
/// each computing `ri` x `rj` outputs in a local accumulator, the reduction in steps of
/// `kt` whose slices of A and B are fetched into shared memory by all threads together.
fn gpu_matmul(spec: &str, ti: i64, tj: i64, ri: i64, rj: i64, kt: i64) -> (ComputeDag, State) {
    let d = dag(spec);
    let mut s = State::new(&d);
    // 0 A, 1 B, 2 C -> 0 A, 1 B, 2 C.local, 3 C.
    s.cache_write(2, Scope::Local).expect("cache_write");
    // -> 0 A, 1 A.shared, 2 B, 3 C.local, 4 C; then B.shared at 3.
    s.cache_read(0, Scope::Shared, &[2]).expect("cache_read A");
    s.cache_read(2, Scope::Shared, &[3]).expect("cache_read B");
    let (a_sh, b_sh, local, out) = (1, 3, 4, 5);
    // C: i j -> i0 i1 i2 j0 j1 j2 -> i0 j0 i1 j1 i2 j2 -> bx tx i2 j2.
    s.split(out, 0, &[ti, ri]).expect("split i");
    s.split(out, 3, &[tj, rj]).expect("split j");
    s.reorder(out, &[0, 3, 1, 4, 2, 5]).expect("reorder");
    s.fuse(out, &[0, 1]).expect("fuse blocks");
    s.fuse(out, &[1, 2]).expect("fuse threads");
    s.bind(out, 0, ThreadAxis::BlockX).expect("bind bx");
    s.bind(out, 1, ThreadAxis::ThreadX).expect("bind tx");
    s.compute_at(local, out, 1).expect("local at tx");
    // C.local: i j k -> i j ko ki -> ko ki i j.
    s.split(local, 2, &[kt]).expect("split k");
    s.reorder(local, &[2, 3, 0, 1]).expect("reorder local");
    let threads = ti * tj;
    for st in [a_sh, b_sh] {
        s.compute_at(st, local, 0).expect("shared at ko");
        // Cooperative fetch: the copy's loops fused, split by the thread count.
        s.fuse(st, &[0, 1]).expect("fuse copy");
        s.split(st, 0, &[threads]).expect("split copy");
        s.bind(st, 1, ThreadAxis::ThreadX).expect("bind copy");
    }
    (d, s)
}

fn shared_buffers(f: &LoweredFunc) -> Vec<(String, i64)> {
    f.buffers
        .iter()
        .filter(|b| b.scope == Scope::Shared)
        .map(|b| (b.name.clone(), b.size()))
        .collect()
}

fn count_syncs(s: &Stmt) -> usize {
    let mut n = 0;
    s.visit(&mut |x| n += matches!(x, Stmt::Sync) as usize);
    n
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
