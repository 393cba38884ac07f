//! The lockstep GPU interpreter (`gpu::interp::run_lockstep`): lowered schedules agree with
//! the serial interpreter and the evaluator; hand-built kernels show what it rejects (data
//! races within a block and across blocks, barriers not every thread reaches, launches too
//! large) and how it keeps memory (shared per block, local per thread).

mod common;
use common::{dag, inputs};
use tensortune_schedules::data::{Data, NdData};
use tensortune_schedules::expr::BufId;
use tensortune_schedules::gpu::interp::{
    run_lockstep, Access, AccessKind, GpuEvalError, MAX_LAUNCH_THREADS, MAX_WORK,
};
use tensortune_schedules::ir::{
    BufKind, BufferDecl, ForKind, LoweredFunc, Scope, Stmt, ThreadAxis,
};
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::OPS;
use tensortune_schedules::scalar::EvalError;
use tensortune_schedules::schedule::State;
use tensortune_schedules::{eval, interp, ComputeDag, DType, Expr, Var};

/// Lowers `s`, runs it in lockstep and checks it against the evaluator.
fn agrees_with_evaluator(d: &ComputeDag, s: &State, seed: u64) -> LoweredFunc {
    let f = lower(s).unwrap_or_else(|e| panic!("lower: {e}\n{s}"));
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

#[test]
fn every_op_default_schedule_agrees_with_interp_and_evaluator() {
    let specs = [
        "matmul:M=5,N=7,K=3",
        "matmul:M=3,N=5,K=7,dtype=f64",
        "batch_matmul:B=2,M=3,N=5,K=7",
        "dense_bias_relu:M=5,N=7,K=3",
        "conv2d:N=1,C=3,H=7,W=5,K=3,R=3,S=3,stride=1,pad=1",
        "conv2d_hwio:N=1,C=3,H=7,W=5,K=3,R=3,S=3,stride=1,pad=1",
        "depthwise_conv2d:N=1,C=3,H=7,W=5,R=3,S=3,stride=2,pad=1",
        "softmax:M=3,N=7",
        "reduce_sum:M=3,N=7,dtype=i32",
    ];
    for op in OPS {
        assert!(
            specs.iter().any(|s| s.split(':').next() == Some(op.name)),
            "no spec for `{}`",
            op.name
        );
    }
    for (seed, spec) in specs.into_iter().enumerate() {
        let d = dag(spec);
        let s = State::new(&d);
        let f = agrees_with_evaluator(&d, &s, seed as u64);
        // One thread runs the body as the serial interpreter does: bit for bit the same.
        let ins = inputs(&d, seed as u64);
        let serial = interp::run(&f, &ins).expect("interp");
        assert_eq!(run_lockstep(&f, &ins).expect("lockstep"), serial, "{spec}");
    }
}

/// matmul with i and j split by `t`, reordered to io jo ii ji k, and bound to blockIdx.x/y
/// and threadIdx.x/y: a grid of `t` x `t` blocks, one output element per thread.
fn bound_matmul(spec: &str, t: i64) -> (ComputeDag, State) {
    let d = dag(spec);
    let mut s = State::new(&d);
    let c = s.stages().len() as u32 - 1;
    s.split(c, 0, &[t]).expect("split i");
    s.split(c, 2, &[t]).expect("split j");
    s.reorder(c, &[0, 2, 1, 3, 4]).expect("reorder");
    let axes = [
        ThreadAxis::BlockX,
        ThreadAxis::BlockY,
        ThreadAxis::ThreadX,
        ThreadAxis::ThreadY,
    ];
    for (pos, axis) in axes.into_iter().enumerate() {
        s.bind(c, pos as u32, axis).expect("bind");
    }
    (d, s)
}

#[test]
fn bound_matmul_agrees_with_the_evaluator_with_and_without_guards() {
    // 37 = 4 * 8 + 5 and 29 = 3 * 8 + 5: the last blocks' threads past the edge are guarded.
    for spec in ["matmul:M=37,N=29,K=11", "matmul:M=32,N=16,K=5"] {
        let (d, s) = bound_matmul(spec, 8);
        let f = agrees_with_evaluator(&d, &s, 3);
        assert!(f.to_string().contains("blockIdx.y"), "{f}");
    }
}

/// A stage left unbound in a launch of many threads is run by every thread: they all write
/// its elements, a race the serial interpreter cannot see.
/// The buffer, element and two accesses of the race `r` reports; a panic showing `f` if it
/// reports anything else.
fn race(r: Result<Vec<NdData>, GpuEvalError>, f: &LoweredFunc) -> (String, i64, Access, Access) {
    match r {
        Err(GpuEvalError::Race {
            buffer,
            index,
            first,
            second,
        }) => (buffer, index, first, second),
        r => panic!("not a race: {r:?}\n{f}"),
    }
}

#[test]
fn an_unbound_stage_in_a_bound_kernel_races() {
    let d = dag("dense_bias_relu:M=5,N=7,K=3");
    let mut s = State::new(&d);
    let last = s.stages().len() as u32 - 1;
    s.bind(last, 0, ThreadAxis::ThreadX).expect("bind i");
    let f = lower(&s).expect("lowers");
    let ins = inputs(&d, 1);
    // Serially it is correct.
    let want = eval::evaluate(&d, &ins).expect("evaluate");
    let serial = interp::run(&f, &ins).expect("interp");
    assert!(serial[0].max_rel_diff(&want[0]).is_some_and(|x| x < 1e-4));
    let (_, _, first, second) = race(run_lockstep(&f, &ins), &f);
    assert_ne!(first.thread, second.thread);
    assert_eq!(second.kind, AccessKind::Write, "{f}");
}

/// matmul whose A is staged in shared memory per step `kt` of k, fetched by the block's
/// threads together (the fetch fused, split by the thread count and bound to threadIdx.x):
/// lowering fences the fetch with barriers.
fn shared_a_matmul() -> (ComputeDag, State) {
    let d = dag("matmul:M=12,N=10,K=9");
    let mut s = State::new(&d);
    // 0 A, 1 A.shared, 2 B, 3 C.
    let a = s.cache_read(0, Scope::Shared, &[2]).expect("cache_read");
    let c = 3;
    s.split(c, 0, &[4]).expect("split i"); // io ii j k
    s.split(c, 2, &[5]).expect("split j"); // io ii jo ji k
    s.split(c, 4, &[3]).expect("split k"); // io ii jo ji ko ki
    s.reorder(c, &[0, 2, 1, 3, 4, 5]).expect("reorder"); // io jo ii ji ko ki
    s.fuse(c, &[0, 1]).expect("fuse blocks"); // b ii ji ko ki
    s.fuse(c, &[1, 2]).expect("fuse threads"); // b t ko ki
    s.bind(c, 0, ThreadAxis::BlockX).expect("bind b");
    s.bind(c, 1, ThreadAxis::ThreadX).expect("bind t");
    s.compute_at(a, c, 2).expect("A.shared at ko");
    s.fuse(a, &[0, 1]).expect("fuse fetch");
    s.split(a, 0, &[20]).expect("split fetch by the 20 threads");
    s.bind(a, 1, ThreadAxis::ThreadX).expect("bind fetch");
    (d, s)
}

/// `s` without its `Sync`s at the positions `drop` (in visiting order).
fn without_syncs(s: &Stmt, drop: &[usize], seen: &mut usize) -> Stmt {
    match s {
        Stmt::Seq(items) => {
            let mut kept = Vec::new();
            for x in items {
                if matches!(x, Stmt::Sync) {
                    *seen += 1;
                    if drop.contains(&(*seen - 1)) {
                        continue;
                    }
                }
                kept.push(without_syncs(x, drop, seen));
            }
            Stmt::Seq(kept)
        }
        _ => s.map_children(&mut |c| without_syncs(c, drop, seen)),
    }
}

#[test]
fn a_cooperative_shared_fetch_needs_both_its_barriers() {
    let (d, s) = shared_a_matmul();
    let f = agrees_with_evaluator(&d, &s, 5);
    let mut syncs = 0;
    f.body
        .visit(&mut |x| syncs += matches!(x, Stmt::Sync) as usize);
    assert_eq!(syncs, 2, "{f}");
    let ins = inputs(&d, 5);
    // Without the barrier after the fetch, threads read elements others are writing; without
    // the one before it, the next step's fetch overwrites elements others read in this one.
    for drop in [1, 0] {
        let mut g = f.clone();
        g.body = without_syncs(&f.body, &[drop], &mut 0);
        let (buffer, _, first, second) = race(run_lockstep(&g, &ins), &g);
        assert_eq!(buffer, "A.shared", "barrier {drop} dropped\n{g}");
        assert_eq!(first.block, second.block);
        assert_ne!(first.thread, second.thread);
    }
}

/// A temporary of the kernels below: name, elements, scope.
type Temp = (&'static str, i64, Scope);

/// A kernel of 1-D f32 buffers: an input `A` of `a_len` and an output `B` of `b_len`
/// elements (buffers 0 and 1), then the temporaries `temps` (buffers 2...), over the
/// variables 0..4.
fn kernel(a_len: i64, b_len: i64, temps: &[Temp], body: Stmt) -> LoweredFunc {
    let params = [
        ("A", a_len, BufKind::Input(0)),
        ("B", b_len, BufKind::Output(0)),
    ];
    let all = params
        .into_iter()
        .map(|(name, len, kind)| (name, len, kind, Scope::Global))
        .chain(
            temps
                .iter()
                .map(|&(name, len, scope)| (name, len, BufKind::Temp, scope)),
        );
    LoweredFunc {
        name: "k".into(),
        buffers: all
            .map(|(name, len, kind, scope)| BufferDecl {
                kind,
                scope,
                shape: vec![len],
                dtype: DType::F32,
                row_pad: 0,
                name: name.into(),
            })
            .collect(),
        params: vec![BufId(0), BufId(1)],
        body,
        num_vars: 4,
    }
}

/// `buf[index]`, f32.
fn ld(buf: u32, index: Expr) -> Expr {
    Expr::BufLoad {
        buf: BufId(buf),
        dtype: DType::F32,
        index: Box::new(index),
    }
}

fn st(buf: u32, index: Expr, value: Expr) -> Stmt {
    Stmt::Store {
        buf: BufId(buf),
        index,
        value,
    }
}

/// `for var in 0..extent`, bound to `axis` or (for `None`) serial.
fn lp(axis: Option<ThreadAxis>, var: Var, extent: i64, body: Stmt) -> Stmt {
    let kind = axis.map_or(ForKind::Serial, ForKind::ThreadBound);
    Stmt::For {
        var,
        extent,
        kind,
        body: Box::new(body),
    }
}

fn tx(var: Var, extent: i64, body: Stmt) -> Stmt {
    lp(Some(ThreadAxis::ThreadX), var, extent, body)
}

fn alloc(buf: u32, body: Stmt) -> Stmt {
    Stmt::Allocate {
        buf: BufId(buf),
        body: Box::new(body),
    }
}

fn iff(cond: Expr, then: Stmt) -> Stmt {
    Stmt::If {
        cond,
        then: Box::new(then),
        otherwise: None,
    }
}

/// `0, 1, 2, ...` as f32 data of `n` elements.
fn iota(n: usize) -> NdData {
    NdData::new(
        vec![n as i64],
        Data::F32((0..n).map(|x| x as f32).collect()),
    )
    .expect("shape")
}

fn values(d: &NdData) -> Vec<f32> {
    match &d.data {
        Data::F32(v) => v.clone(),
        other => panic!("not f32: {other:?}"),
    }
}

const T: i64 = 32;

/// One block of `T` threads: thread t writes `S[t] = A[t]`, then (after `barrier`) every
/// thread reads its neighbour's element: `B[t] = S[(t + 1) % T]`. `barrier` is where the
/// `Sync` goes: between the two loops, absent, or inside the first under `if t < T - 1`.
fn neighbours(barrier: Option<bool>) -> LoweredFunc {
    let (i, j) = (Var::new(0, "i"), Var::new(1, "j"));
    let fill = st(2, Expr::var(&i), ld(0, Expr::var(&i)));
    let fill = match barrier {
        Some(false) => tx(
            i,
            T,
            Stmt::Seq(vec![fill, iff(Expr::var(&i).lt(T - 1), Stmt::Sync)]),
        ),
        _ => tx(i, T, fill),
    };
    let next = (Expr::var(&j) + 1i64).floormod(T);
    let read = tx(j, T, st(1, Expr::var(&j), ld(2, next)));
    let mut items = vec![fill];
    if barrier == Some(true) {
        items.push(Stmt::Sync);
    }
    items.push(read);
    kernel(T, T, &[("S", T, Scope::Shared)], alloc(2, Stmt::Seq(items)))
}

#[test]
fn shared_memory_filled_together_is_read_after_the_barrier() {
    let a = iota(T as usize);
    let got = run_lockstep(&neighbours(Some(true)), std::slice::from_ref(&a)).expect("runs");
    let want: Vec<f32> = (0..T).map(|t| ((t + 1) % T) as f32).collect();
    assert_eq!(values(&got[0]), want);
}

#[test]
fn shared_memory_read_without_the_barrier_races() {
    let f = neighbours(None);
    // Serially every element is written before it is read: no error there.
    assert!(interp::run(&f, &[iota(T as usize)]).is_ok());
    let e = run_lockstep(&f, &[iota(T as usize)]).expect_err("a race");
    let write = |t| Access {
        block: [0; 3],
        thread: [t, 0, 0],
        kind: AccessKind::Write,
    };
    let read = Access {
        kind: AccessKind::Read,
        ..write(0)
    };
    // Thread 0 reads S[1], which thread 1 wrote in the same phase.
    assert_eq!(
        e,
        GpuEvalError::Race {
            buffer: "S".into(),
            index: 1,
            first: write(1),
            second: read,
        }
    );
    let m = e.to_string();
    for want in [
        "element 1 of `S`",
        "thread (1, 0, 0) of block (0, 0, 0) wrote",
        "thread (0, 0, 0) of block (0, 0, 0) read",
        "no barrier",
    ] {
        assert!(m.contains(want), "`{want}` not in: {m}");
    }
}

#[test]
fn a_barrier_only_some_threads_reach_is_divergent() {
    let e = run_lockstep(&neighbours(Some(false)), &[iota(T as usize)]).expect_err("divergent");
    assert_eq!(
        e,
        GpuEvalError::DivergentBarrier {
            block: [0; 3],
            reached: T as u64 - 1,
            threads: T as u64,
            missing: [T as u32 - 1, 0, 0],
        }
    );
    assert!(e.to_string().contains("31 of the 32 threads"), "{e}");
    // So is one inside a thread loop narrower than the block: 8 threads, a barrier in 4.
    let (i, j) = (Var::new(0, "i"), Var::new(1, "j"));
    let f = kernel(
        8,
        8,
        &[],
        Stmt::Seq(vec![
            tx(i, 8, st(1, Expr::var(&i), ld(0, Expr::var(&i)))),
            tx(j, 4, Stmt::Sync),
        ]),
    );
    match run_lockstep(&f, &[iota(8)]) {
        Err(GpuEvalError::DivergentBarrier {
            reached, missing, ..
        }) => assert_eq!((reached, missing), (4, [4, 0, 0])),
        r => panic!("{r:?}"),
    }
}

#[test]
fn two_blocks_writing_one_output_element_race() {
    let (b, t) = (Var::new(0, "b"), Var::new(1, "t"));
    let body = lp(
        Some(ThreadAxis::BlockX),
        b,
        2,
        tx(t, 4, st(1, Expr::var(&t), ld(0, Expr::var(&t)))),
    );
    let e = run_lockstep(&kernel(4, 4, &[], body), &[iota(4)]).expect_err("race");
    let at = |block| Access {
        block: [block, 0, 0],
        thread: [0; 3],
        kind: AccessKind::Write,
    };
    assert_eq!(
        e,
        GpuEvalError::Race {
            buffer: "B".into(),
            index: 0,
            first: at(0),
            second: at(1),
        }
    );
    assert!(e.to_string().contains("different blocks"), "{e}");
}

#[test]
fn a_barrier_does_not_order_blocks() {
    // Block b writes B[4b + t], meets its barrier, then adds B[t], which block 0 wrote: fine
    // in block 0 (its own thread wrote it), a race in block 1.
    let (b, t, u) = (Var::new(0, "b"), Var::new(1, "t"), Var::new(2, "u"));
    let own = |v: &Var| Expr::var(&b) * 4i64 + Expr::var(v);
    let body = lp(
        Some(ThreadAxis::BlockX),
        b,
        2,
        Stmt::Seq(vec![
            tx(t, 4, st(1, own(&t), ld(0, own(&t)))),
            Stmt::Sync,
            tx(u, 4, st(1, own(&u), ld(1, own(&u)) + ld(1, Expr::var(&u)))),
        ]),
    );
    let f = kernel(8, 8, &[], body);
    let (buffer, index, first, second) = race(run_lockstep(&f, &[iota(8)]), &f);
    assert_eq!((buffer.as_str(), index), ("B", 0));
    assert_eq!((first.block, first.kind), ([0, 0, 0], AccessKind::Write));
    assert_eq!((second.block, second.kind), ([1, 0, 0], AccessKind::Read));
}

#[test]
fn two_threads_writing_one_shared_element_race() {
    let (i, j) = (Var::new(0, "i"), Var::new(1, "j"));
    let body = alloc(
        2,
        Stmt::Seq(vec![
            tx(i, 8, st(2, Expr::int(0), ld(0, Expr::var(&i)))),
            Stmt::Sync,
            tx(j, 8, st(1, Expr::var(&j), ld(2, Expr::int(0)))),
        ]),
    );
    let f = kernel(8, 8, &[("S", 1, Scope::Shared)], body);
    let (buffer, index, first, second) = race(run_lockstep(&f, &[iota(8)]), &f);
    assert_eq!((buffer.as_str(), index), ("S", 0));
    assert_eq!((first.thread, second.thread), ([0, 0, 0], [1, 0, 0]));
    let kinds = (first.kind, second.kind);
    assert_eq!(kinds, (AccessKind::Write, AccessKind::Write));
}

/// Thread t of 8 sums `A[8t..8t + 8]` in its accumulator `L[0]` (buffer 2, of `scope`) and
/// stores it to `B[t]`; `inside` puts the accumulator's `Allocate` inside the thread loop.
fn row_sums(scope: Scope, inside: bool) -> LoweredFunc {
    let (t, k) = (Var::new(0, "t"), Var::new(1, "k"));
    let acc = || ld(2, Expr::int(0));
    let add = st(
        2,
        Expr::int(0),
        acc() + ld(0, Expr::var(&t) * 8i64 + Expr::var(&k)),
    );
    let sum = Stmt::Seq(vec![
        st(2, Expr::int(0), Expr::f32(0.0)),
        lp(None, k, 8, add),
        st(1, Expr::var(&t), acc()),
    ]);
    let body = if inside {
        tx(t, 8, alloc(2, sum))
    } else {
        alloc(2, tx(t, 8, sum))
    };
    kernel(64, 8, &[("L", 1, scope)], body)
}

#[test]
fn a_local_buffer_is_one_per_thread() {
    let want: Vec<f32> = (0..8)
        .map(|t| (0..8).map(|k| (8 * t + k) as f32).sum())
        .collect();
    for inside in [true, false] {
        let got = run_lockstep(&row_sums(Scope::Local, inside), &[iota(64)]).expect("runs");
        assert_eq!(
            values(&got[0]),
            want,
            "allocated inside the thread loop: {inside}"
        );
    }
    // As one shared accumulator for the block the threads race on it.
    let f = row_sums(Scope::Shared, true);
    assert_eq!(race(run_lockstep(&f, &[iota(64)]), &f).0, "L");
}

#[test]
fn evaluation_errors_are_reported() {
    // Thread 7 stores past the end.
    let t = Var::new(0, "t");
    let f = kernel(
        8,
        8,
        &[],
        tx(t, 8, st(1, Expr::var(&t) + 1i64, Expr::f32(1.0))),
    );
    match run_lockstep(&f, &[iota(8)]) {
        Err(GpuEvalError::Eval(EvalError::OutOfBounds { name, index, size })) => {
            assert_eq!((name.as_str(), index, size), ("B", 8, 8));
        }
        r => panic!("{r:?}"),
    }
    // B[0] is never written.
    let f = kernel(
        8,
        8,
        &[],
        tx(t, 7, st(1, Expr::var(&t) + 1i64, Expr::f32(1.0))),
    );
    assert!(matches!(
        run_lockstep(&f, &[iota(8)]),
        Err(GpuEvalError::Eval(EvalError::Uninitialized {
            index: 0,
            ..
        }))
    ));
    // A wrong number of inputs.
    assert!(matches!(
        run_lockstep(&f, &[]),
        Err(GpuEvalError::Eval(EvalError::BadInput(_)))
    ));
}

#[test]
fn launches_past_the_caps_are_too_large() {
    let (b, k) = (Var::new(0, "b"), Var::new(1, "k"));
    // More blocks than the launch cap: refused before running.
    let blocks = MAX_LAUNCH_THREADS as i64 * 2;
    let f = kernel(
        1,
        1,
        &[],
        lp(Some(ThreadAxis::BlockX), b, blocks, Stmt::Seq(vec![])),
    );
    match run_lockstep(&f, &[iota(1)]) {
        Err(GpuEvalError::TooLarge { size, limit, .. }) => {
            assert_eq!((size, limit), (blocks as u64, MAX_LAUNCH_THREADS));
        }
        r => panic!("{r:?}"),
    }
    // One thread looping past the work cap (each pass of the empty body counts).
    let body = lp(None, k, MAX_WORK as i64 * 2, Stmt::Seq(vec![]));
    match run_lockstep(&kernel(1, 1, &[], body), &[iota(1)]) {
        Err(e @ GpuEvalError::TooLarge { .. }) => {
            assert!(e.to_string().contains("too large"), "{e}");
        }
        r => panic!("{r:?}"),
    }
    // A temporary past the cap is refused before it is made.
    let huge = ("L", MAX_WORK as i64 + 1, Scope::Local);
    let f = kernel(1, 1, &[huge], alloc(2, Stmt::Seq(vec![])));
    assert!(matches!(
        run_lockstep(&f, &[iota(1)]),
        Err(GpuEvalError::TooLarge { .. })
    ));
}

#[test]
fn launch_errors_are_reported() {
    // A loop bound to threadIdx.x inside a narrower one bound to it.
    let (i, j) = (Var::new(0, "i"), Var::new(1, "j"));
    let f = kernel(8, 8, &[], tx(i, 4, tx(j, 8, Stmt::Seq(vec![]))));
    assert!(matches!(
        run_lockstep(&f, &[iota(8)]),
        Err(GpuEvalError::Launch(_))
    ));
}
