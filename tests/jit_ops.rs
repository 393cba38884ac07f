//! The JIT against the direct evaluator: every op of the library at small and odd shapes
//! (default schedules and a vectorized/parallel/unrolled one), and random valid traces.

use tensortune::measure::{max_reduction_len, random_inputs, tolerance};
use tensortune::runtime::Runtime;
use tensortune::Kernel;
use tensortune_schedules::ir::{ForKind, LoweredFunc, Stmt};
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::random::random_state;
use tensortune_schedules::schedule::State;
use tensortune_schedules::{eval, ComputeDag};

const SPECS: &[&str] = &[
    "matmul:M=6,N=10,K=7",
    "matmul:M=13,N=17,K=19",
    "matmul:M=32,N=48,K=16",
    "batch_matmul:B=2,M=5,N=7,K=3",
    "dense_bias_relu:M=5,N=19,K=11",
    "conv2d:N=1,C=3,H=7,W=7,K=5,R=3,S=3,stride=1,pad=1",
    "conv2d:N=2,C=2,H=9,W=8,K=3,R=3,S=2,stride=2,pad=0",
    "conv2d_hwio:N=1,C=3,H=7,W=7,K=20,R=3,S=2,stride=2,pad=1",
    "depthwise_conv2d:N=1,C=3,H=11,W=7,R=3,S=3,stride=2,pad=1",
    "softmax:M=5,N=23",
    "reduce_sum:M=3,N=37",
    "matmul:M=5,N=9,K=3,dtype=f64",
    "reduce_sum:M=4,N=13,dtype=i32",
    "matmul:M=13,N=17,K=18,dtype=bf16",
    "matmul:M=8,N=48,K=34,dtype=bf16",
    "batch_matmul:B=2,M=5,N=7,K=6,dtype=bf16",
    "dense_bias_relu:M=5,N=19,K=12,dtype=bf16",
];

fn dag(spec: &str) -> ComputeDag {
    WorkloadSpec::parse(spec)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .build()
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Compiles and runs `state` and compares with the evaluator; returns the lowered function.
fn check(spec: &str, dag: &ComputeDag, state: &State, seed: u64, threads: usize) -> LoweredFunc {
    let f = lower(state).unwrap_or_else(|e| panic!("{spec}: lower: {e}\n{state}"));
    let k = Kernel::compile(&f).unwrap_or_else(|e| panic!("{spec}: compile: {e}\n{f}"));
    let ins = random_inputs(dag, seed).expect("inputs");
    let want = eval::evaluate(dag, &ins).expect("evaluate");
    let rt = Runtime::new(threads).expect("runtime");
    let got = k
        .run_nd(&rt, &ins)
        .unwrap_or_else(|e| panic!("{spec}: run: {e}"));
    let tol = tolerance(want[0].data.dtype(), max_reduction_len(dag));
    for (w, g) in want.iter().zip(&got) {
        let d = g.max_rel_diff(w).expect("same shape and dtype");
        assert!(
            d <= tol,
            "{spec} seed {seed}: differs by {d} > {tol}\n{}\n{f}",
            state.trace()
        );
    }
    f
}

#[test]
fn every_op_naive_schedule() {
    for (i, spec) in SPECS.iter().enumerate() {
        let d = dag(spec);
        check(spec, &d, &State::new(&d), i as u64, 1);
    }
}

/// The schedule an untuned workload runs on (the sketch draw the analytic estimate ranks
/// best, `default_cpu_state`), on one and two threads: every op computes what the evaluator
/// does, the choice is the same on every call, and where the op's loops as written would
/// read across rows innermost (matmul), it is a tiled program, not those loops.
#[test]
fn every_op_cpu_default_schedule() {
    for (i, spec) in SPECS.iter().enumerate() {
        let d = dag(spec);
        for threads in [1, 2] {
            let s = tensortune::build::default_cpu_state(&d, threads);
            let again = tensortune::build::default_cpu_state(&d, threads);
            assert_eq!(s.trace(), again.trace(), "{spec}: not deterministic");
            check(spec, &d, &s, i as u64, threads);
        }
    }
    let d = dag("matmul:M=64,N=64,K=64");
    let s = tensortune::build::default_cpu_state(&d, 1);
    assert!(
        s.trace()
            .steps
            .iter()
            .any(|st| matches!(st, tensortune_schedules::trace::Step::Split { .. })),
        "{}",
        s.trace()
    );
}

/// Innermost loop of the last stage vectorized, outermost parallel, the one before the
/// innermost unrolled (where those apply).
#[test]
fn every_op_annotated() {
    let mut seen = Seen::default();
    for (i, spec) in SPECS.iter().enumerate() {
        let d = dag(spec);
        let mut s = State::new(&d);
        let last = s.stages().len() as u32 - 1;
        let n = s.stages()[last as usize].leaves.len() as u32;
        // Split the innermost loop so that the vector loop has a tail to guard.
        let _ = s.split(last, n - 1, &[8]);
        let n = s.stages()[last as usize].leaves.len() as u32;
        let _ = s.vectorize(last, n - 1);
        if n > 2 {
            let _ = s.unroll(last, n - 2);
        }
        let _ = s.parallel(last, 0);
        if lower(&s).is_err() {
            s = State::new(&d);
        }
        let f = check(spec, &d, &s, 100 + i as u64, 2);
        census(&f.body, false, &mut seen);
    }
    // Odd extents split by 8 leave tails: the vector loops must have met guards.
    assert!(
        seen.guarded_vector > 0 && seen.vectorized > 0 && seen.parallel > 0,
        "{seen:?}"
    );
}

#[derive(Default, Debug)]
struct Seen {
    vectorized: usize,
    parallel: usize,
    unrolled: usize,
    guarded_vector: usize,
}

fn census(s: &Stmt, in_vector: bool, seen: &mut Seen) {
    match s {
        Stmt::For { kind, body, .. } => {
            match kind {
                ForKind::Vectorized => seen.vectorized += 1,
                ForKind::Parallel => seen.parallel += 1,
                ForKind::Unrolled => seen.unrolled += 1,
                _ => {}
            }
            census(body, in_vector || *kind == ForKind::Vectorized, seen);
        }
        Stmt::If {
            then, otherwise, ..
        } => {
            seen.guarded_vector += in_vector as usize;
            census(then, in_vector, seen);
            if let Some(o) = otherwise {
                census(o, in_vector, seen);
            }
        }
        Stmt::Allocate { body, .. } => census(body, in_vector, seen),
        Stmt::Seq(v) => v.iter().for_each(|x| census(x, in_vector, seen)),
        Stmt::Store { .. } | Stmt::Shuffle { .. } | Stmt::Sync | Stmt::Prefetch { .. } => {}
    }
}

#[test]
fn random_traces_match_the_evaluator() {
    let per_spec = 10;
    let mut seen = Seen::default();
    let mut checked = 0;
    for (si, spec) in SPECS.iter().enumerate() {
        let d = dag(spec);
        for case in 0..per_spec {
            let seed = (si * 1000 + case) as u64;
            let state = random_state(&d, seed, 12, false);
            let f = check(spec, &d, &state, seed, 1 + (case % 2));
            census(&f.body, false, &mut seen);
            checked += 1;
        }
    }
    eprintln!("{checked} random traces; loops seen: {seen:?}");
    assert!(checked >= 100);
    assert!(
        seen.vectorized > 0 && seen.parallel > 0 && seen.unrolled > 0,
        "{seen:?}"
    );
}

#[path = "../benches/hand/mod.rs"]
mod hand;

/// The benchmark's hand-written matmul schedule, at shapes that divide its tile and not.
#[test]
fn hand_matmul_schedule_is_correct() {
    for spec in ["matmul:M=16,N=64,K=19", "matmul:M=21,N=45,K=8"] {
        let d = dag(spec);
        let s = hand::matmul_register_tiled(&d, 8, 32).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let f = check(spec, &d, &s, 7, 1);
        let mut seen = Seen::default();
        census(&f.body, false, &mut seen);
        assert!(
            seen.vectorized >= 2 && seen.unrolled >= 1,
            "{spec}: {seen:?}\n{f}"
        );
    }
}

/// Softmax (0 X, 1 row_max, 2 exp, 3 row_sum, 4 Y) a row at a time, as the row-wise sketch
/// makes it: every stage at the output's row, `exp` in vectors of `lanes`, prefetching the
/// input's next row into L1 and, with `l2`, the row after into L2.
fn softmax_rows_prefetched(
    s: &mut State,
    lanes: i64,
    l2: bool,
) -> Result<(), tensortune_schedules::schedule::ScheduleError> {
    s.compute_at(3, 4, 0)?;
    s.split(2, 1, &[lanes])?;
    s.compute_at(2, 4, 0)?;
    s.compute_at(1, 4, 0)?;
    s.vectorize(2, 2)?;
    s.prefetch(2, 0, 0, 1)?;
    if l2 {
        s.prefetch_to(2, 0, 0, 2, tensortune_schedules::ir::PrefetchLevel::L2)?;
    }
    Ok(())
}

/// A softmax computed a row at a time whose `exp` prefetches the input's next row (the
/// search's row-wise sketch with its prefetch hole at 1): the output matches the evaluator,
/// the last row's prefetch past the end of the input faults nothing, and the assembly has
/// the instruction (x86's `prefetcht0`, from `llvm.prefetch` with the highest locality):
/// once per 16 floats, so four for a vector of 64 (one vector, four cache lines).
#[test]
fn next_row_prefetch_runs_and_matches() {
    for (spec, lanes) in [
        ("softmax:M=5,N=37", 16),
        ("softmax:M=3,N=64", 16),
        ("softmax:M=4,N=128", 64),
    ] {
        let d = dag(spec);
        let mut s = State::new(&d);
        softmax_rows_prefetched(&mut s, lanes, false).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let f = check(spec, &d, &s, 11, 1);
        let vectors = (d.op(d.outputs()[0]).shape[1] + lanes - 1) / lanes;
        let opts = tensortune::codegen::CodegenOptions::default();
        let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &opts).expect("ir");
        assert!(
            ir.contains("@llvm.prefetch"),
            "{spec}: no prefetch in\n{ir}"
        );
        if cfg!(target_arch = "x86_64") {
            let asm = tensortune::codegen::llvm::emit_asm(&f, &opts).expect("asm");
            let n = asm.matches("prefetcht0").count() as i64;
            // At least one per line of a vector (the loop over vectors may be unrolled).
            assert!(n >= lanes / 16, "{spec}: {n} prefetcht0 in\n{asm}");
            assert!(
                n <= vectors * lanes / 16,
                "{spec}: {n} prefetcht0 in\n{asm}"
            );
        }
    }
}

/// The next row into L1 and the row after into L2 (the row-wise sketch's prefetch hole at
/// 2): the output matches the evaluator, the prefetches past the input's end fault nothing,
/// and on x86 the second is `prefetcht1` (`llvm.prefetch` with locality 2), one per line.
#[test]
fn row_after_next_into_l2_runs_and_matches() {
    for spec in ["softmax:M=5,N=37", "softmax:M=4,N=128"] {
        let d = dag(spec);
        let mut s = State::new(&d);
        softmax_rows_prefetched(&mut s, 16, true).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let f = check(spec, &d, &s, 12, 1);
        let opts = tensortune::codegen::CodegenOptions::default();
        let ir = tensortune::codegen::llvm::emit_llvm_ir(&f, &opts).expect("ir");
        assert!(
            ir.contains("i32 0, i32 2, i32 1)"),
            "{spec}: no locality 2 in\n{ir}"
        );
        if cfg!(target_arch = "x86_64") {
            let asm = tensortune::codegen::llvm::emit_asm(&f, &opts).expect("asm");
            let (t0, t1) = (
                asm.matches("prefetcht0").count(),
                asm.matches("prefetcht1").count(),
            );
            assert!(
                t0 >= 1 && t1 == t0,
                "{spec}: {t0} prefetcht0, {t1} prefetcht1 in\n{asm}"
            );
        }
    }
}

/// Kernels of the same name live side by side in the one JIT (their symbols are renamed
/// apart), each keeps its own code after others are dropped, and kernels calling the C
/// library (softmax's `expf`) link against the symbols the JIT defines.
#[test]
fn same_named_kernels_coexist_and_drop_independently() {
    let specs = [
        "softmax:M=3,N=9",
        "matmul:M=4,N=5,K=6",
        "reduce_sum:M=2,N=7",
    ];
    let dags: Vec<ComputeDag> = specs.iter().map(|s| dag(s)).collect();
    let funcs: Vec<LoweredFunc> = dags
        .iter()
        .map(|d| lower(&State::new(d)).expect("lowers"))
        .collect();
    assert!(funcs.iter().all(|f| f.name == funcs[0].name), "one name");
    let rt = Runtime::new(1).expect("runtime");
    let run = |k: &Kernel, i: usize| {
        let ins = random_inputs(&dags[i], 5).expect("inputs");
        let want = eval::evaluate(&dags[i], &ins).expect("evaluate");
        let got = k.run_nd(&rt, &ins).expect("runs");
        let tol = tolerance(want[0].data.dtype(), max_reduction_len(&dags[i]));
        let d = got[0].max_rel_diff(&want[0]).expect("same shape");
        assert!(d <= tol, "{}: differs by {d}", specs[i]);
    };
    let mut kernels: Vec<Option<Kernel>> = funcs
        .iter()
        .map(|f| Some(Kernel::compile(f).expect("compiles")))
        .collect();
    for round in 0..3 {
        for (i, k) in kernels.iter().enumerate() {
            if let Some(k) = k {
                run(k, i);
            }
        }
        // Drop one kernel per round; the others still run, and a new one of the same name
        // compiled afterwards too.
        kernels[round] = None;
        let again = Kernel::compile(&funcs[round]).expect("compiles again");
        run(&again, round);
    }
    // Many compile-and-drop cycles: the JIT frees each kernel's code.
    for _ in 0..50 {
        let k = Kernel::compile(&funcs[0]).expect("compiles");
        run(&k, 0);
    }
}
