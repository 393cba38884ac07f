//! CpuMeasurer: good candidates get timings, bad ones get the right error kind, and a crash or
//! a hang does not end the run. Timings are never asserted on, only their shape.

use std::time::Duration;
use tensortune::measure::{CpuMeasurer, Isolation, MeasureOptions};
use tensortune::runtime::CacheFlush;
use tensortune::Kernel;
use tensortune_schedules::ir::{BufKind, BufferDecl, ForKind, LoweredFunc, Scope, Stmt};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::random::random_state;
use tensortune_schedules::schedule::State;
use tensortune_schedules::{BufId, DType, Expr, Var};
use tensortune_tuner::measure::{MeasureErrorKind, Measurer};

fn quick(isolation: Isolation) -> MeasureOptions {
    MeasureOptions {
        repeat: 3,
        min_repeat_ms: 1.0,
        timeout: Duration::from_secs(2),
        isolation,
        flush_cache: CacheFlush::Always,
        ..MeasureOptions::default()
    }
}

#[test]
fn measures_good_candidates() {
    let dag = WorkloadSpec::parse("matmul:M=16,N=24,K=9")
        .expect("spec")
        .build()
        .expect("dag");
    let states = vec![
        State::new(&dag),
        random_state(&dag, 1, 10, false),
        random_state(&dag, 2, 10, false),
    ];
    for iso in [Isolation::Fork, Isolation::InProcess] {
        let mut m = CpuMeasurer::new(quick(iso));
        let results = m.measure(&dag, &states);
        assert_eq!(results.len(), states.len());
        for r in results {
            let t = r.expect("a valid schedule measures");
            assert_eq!(t.repeats.len(), 3);
            assert!(t.median_s > 0.0 && t.number >= 1);
        }
        assert!(m.target_key().starts_with("llvm -mcpu="));
    }
}

/// A function with the matmul's parameters (A[4,4], B[4,4] -> C[4,4]) and a given body.
fn with_body(body: impl FnOnce(BufId, BufId, BufId, &Var) -> Stmt) -> LoweredFunc {
    let decl = |name: &str, kind| BufferDecl {
        name: name.into(),
        dtype: DType::F32,
        shape: vec![4, 4],
        scope: Scope::Global,
        kind,
        row_pad: 0,
    };
    let (a, b, c) = (BufId(0), BufId(1), BufId(2));
    let i = Var::new(0, "i");
    LoweredFunc {
        name: "bad".into(),
        buffers: vec![
            decl("A", BufKind::Input(0)),
            decl("B", BufKind::Input(1)),
            decl("C", BufKind::Output(0)),
        ],
        params: vec![a, b, c],
        body: body(a, b, c, &i),
        num_vars: 1,
    }
}

fn store_loop(i: &Var, extent: i64, c: BufId, index: Expr, value: Expr) -> Stmt {
    Stmt::For {
        var: *i,
        extent,
        kind: ForKind::Serial,
        body: Box::new(Stmt::Store {
            buf: c,
            index,
            value,
        }),
    }
}

#[test]
fn crash_hang_and_wrong_result_are_errors() {
    let dag = WorkloadSpec::parse("matmul:M=4,N=4,K=4")
        .expect("spec")
        .build()
        .expect("dag");
    // Writes zeros: wrong.
    let wrong = with_body(|_, _, c, i| store_loop(i, 16, c, Expr::var(i), Expr::f32(0.0)));
    // Writes far outside C: the IR promises in-bounds indices, so this faults.
    let crash = with_body(|_, _, c, i| {
        store_loop(
            i,
            16,
            c,
            Expr::bin(
                tensortune_schedules::expr::BinOp::Mul,
                Expr::var(i),
                Expr::int(1 << 40),
            ),
            Expr::f32(1.0),
        )
    });
    // A loop-carried float recurrence of 2^40 steps: runs for hours.
    let hang = with_body(|a, _, c, i| {
        let c0 = Expr::BufLoad {
            buf: c,
            dtype: DType::F32,
            index: Box::new(Expr::int(0)),
        };
        let a0 = Expr::BufLoad {
            buf: a,
            dtype: DType::F32,
            index: Box::new(Expr::int(0)),
        };
        let mul = tensortune_schedules::expr::BinOp::Mul;
        let add = tensortune_schedules::expr::BinOp::Add;
        store_loop(
            i,
            1 << 40,
            c,
            Expr::int(0),
            Expr::bin(add, Expr::bin(mul, c0, Expr::f32(0.5)), a0),
        )
    });
    // The crashing function is refused by the checked compile, as it should be.
    assert!(Kernel::compile(&crash).is_err());
    let kernels: Vec<Kernel> = [wrong, crash, hang]
        .iter()
        // SAFETY: not met by `crash`, deliberately: what this test checks is that the forked
        // child running it dies alone and the fault comes back as an error record.
        .map(|f| unsafe { Kernel::compile_unchecked(f, &Default::default()) }.expect("compiles"))
        .collect();
    let mut m = CpuMeasurer::new(MeasureOptions {
        timeout: Duration::from_millis(1500),
        ..quick(Isolation::Fork)
    });
    let r = m.measure_kernels(&dag, &kernels);
    let kinds: Vec<_> = r.iter().map(|r| r.as_ref().err().map(|e| e.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            Some(MeasureErrorKind::WrongResult),
            Some(MeasureErrorKind::Runtime),
            Some(MeasureErrorKind::Timeout)
        ],
        "{r:?}"
    );
    // The measurer still works after all that.
    let ok = m.measure(&dag, &[State::new(&dag)]);
    assert!(ok[0].is_ok(), "{ok:?}");
}

#[test]
fn sampled_check_for_large_workloads() {
    let dag = WorkloadSpec::parse("matmul:M=4,N=4,K=4")
        .expect("spec")
        .build()
        .expect("dag");
    let opts = MeasureOptions {
        full_check_max_flops: 0.0,
        check_points: 5,
        ..quick(Isolation::Fork)
    };
    let mut m = CpuMeasurer::new(opts);
    assert!(m.measure(&dag, &[State::new(&dag)])[0].is_ok());
    // Writes only the first half of C: the sampled points may miss it, the NaN scan does not.
    let half = with_body(|_, _, c, i| store_loop(i, 8, c, Expr::var(i), Expr::f32(0.0)));
    let k = Kernel::compile(&half).expect("compiles");
    let r = m.measure_kernels(&dag, &[k]);
    assert_eq!(
        r[0].as_ref().err().map(|e| e.kind),
        Some(MeasureErrorKind::WrongResult),
        "{r:?}"
    );
    // Writes every element of C, all zero: no NaN is left, the sampled points catch it.
    let zeros = with_body(|_, _, c, i| store_loop(i, 16, c, Expr::var(i), Expr::f32(0.0)));
    let k = Kernel::compile(&zeros).expect("compiles");
    let r = m.measure_kernels(&dag, &[k]);
    let e = r[0].as_ref().err();
    assert_eq!(
        e.map(|e| e.kind),
        Some(MeasureErrorKind::WrongResult),
        "{r:?}"
    );
    assert!(
        e.is_some_and(|e| e.message.contains("differs from the reference")),
        "{r:?}"
    );
}

#[test]
fn the_checked_first_run_is_the_first_warm_up_and_the_hopeless_probe() {
    let dag = WorkloadSpec::parse("matmul:M=16,N=24,K=9")
        .expect("spec")
        .build()
        .expect("dag");
    let states = vec![State::new(&dag), random_state(&dag, 1, 10, false)];
    let mut m = CpuMeasurer::new(quick(Isolation::Fork));
    for r in m.measure(&dag, &states) {
        let t = r.expect("a valid schedule measures");
        assert!(!t.cut_short && t.repeats.len() == 3, "{t:?}");
        assert!(t.first_s > 0.0 && t.check_s >= 0.0, "{t:?}");
    }
    let s = m.stats();
    assert!(
        s.first_run_s > 0.0 && s.first_run_s + s.check_s <= s.run_s,
        "{s:?}"
    );
    // With a cutoff no program can meet, each is cut short with its one warm timed run. (A
    // nanosecond: 7 TFLOP/s for this workload, unmet but still a possible time, which the
    // measurer requires of a best before it cuts anything; see `plausible`.)
    m.set_cutoff(Some(1e-9), 4.0);
    for r in m.measure(&dag, &states) {
        let t = r.expect("a valid schedule measures");
        assert!(t.cut_short && t.repeats.len() == 1, "{t:?}");
        assert!(t.first_s > 0.0, "{t:?}");
    }
    // A cutoff no program misses times it in full (one program: the cutoff follows the best
    // time so far, this batch's included).
    m.set_cutoff(Some(1e6), 4.0);
    for r in m.measure(&dag, &states[..1]) {
        let t = r.expect("a valid schedule measures");
        assert!(!t.cut_short && t.repeats.len() == 3, "{t:?}");
    }
}

/// Where evicting the buffers takes far longer than a run (a kernel reading 16 elements of a
/// 32 MiB input), a timing is grown until it lasts `min_repeat_ms` with the evictions
/// counted: a few runs, not the hundreds of thousands that would make the runs alone last
/// that long (hours of evictions; in tuning, the isolating parent's deadline cut such good
/// candidates short as hopeless).
#[test]
fn evictions_count_toward_a_timings_length() {
    let n: i64 = 8 << 20;
    let decl = |name: &str, shape: i64, kind| BufferDecl {
        name: name.into(),
        dtype: DType::F32,
        shape: vec![shape],
        scope: Scope::Global,
        kind,
        row_pad: 0,
    };
    let i = Var::new(0, "i");
    let body = Stmt::For {
        var: i,
        extent: 16,
        kind: ForKind::Serial,
        body: Box::new(Stmt::Store {
            buf: BufId(1),
            index: Expr::var(&i),
            value: Expr::BufLoad {
                buf: BufId(0),
                dtype: DType::F32,
                index: Box::new(Expr::var(&i)),
            },
        }),
    };
    let f = LoweredFunc {
        name: "head".into(),
        buffers: vec![
            decl("A", n, BufKind::Input(0)),
            decl("C", 16, BufKind::Output(0)),
        ],
        params: vec![BufId(0), BufId(1)],
        body,
        num_vars: 1,
    };
    let k = Kernel::compile(&f).expect("compile");
    let rt = tensortune::runtime::Runtime::new(1).expect("runtime");
    let a = tensortune::runtime::AlignedBuffer::zeros(&[n], DType::F32).expect("A");
    let mut c = tensortune::runtime::AlignedBuffer::zeros(&[16], DType::F32).expect("C");
    let opts = MeasureOptions {
        repeat: 2,
        warmup: 1,
        min_repeat_ms: 20.0,
        flush_cache: CacheFlush::Always,
        ..MeasureOptions::default()
    };
    let t = tensortune::measure::time_kernel(&k, &rt, &[&a], &mut [&mut c], &opts)
        .expect("a valid kernel times");
    assert_eq!(t.repeats.len(), 2);
    // Evicting 32 MiB takes milliseconds (one `clflush` per line), a run of 16 loads well
    // under one: runs alone would take about 20 ms / 100 ns = 200,000 per timing.
    assert!(t.number <= 1000, "{t:?}");
}
