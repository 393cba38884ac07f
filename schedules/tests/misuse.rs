//! Programs that must fail, each with its specific error; and malformed traces that must not
//! panic.

mod common;
use common::dag;
use tensortune_schedules::expr::{max, min, select, sum, Expr};
use tensortune_schedules::ir::PrefetchLevel;
use tensortune_schedules::ops::{SpecError, WorkloadSpec};
use tensortune_schedules::random::Rng;
use tensortune_schedules::schedule::{ScheduleError as E, State};
use tensortune_schedules::te::Graph;
use tensortune_schedules::trace::{Trace, TraceError};
use tensortune_schedules::{ComputeDag, DType, DagError};

fn matmul() -> (ComputeDag, State) {
    let d = dag("matmul:M=8,N=8,K=8");
    let s = State::new(&d);
    (d, s)
}

/// A record is replayed step by step: a split into thousands of loops (lowering recurses once
/// per loop, and overflowed the stack) or a chain of rounded-up splits (each doubling the
/// nominal iterations, until step counts overflow) is refused by the step itself.
#[test]
fn splits_that_nest_too_deep_or_round_up_too_often() {
    use tensortune_schedules::schedule::{MAX_NEST_GROWTH, MAX_STAGE_LOOPS};
    let (_, mut s) = matmul();
    let before = s.clone();
    let bad = |r: Result<(), E>| matches!(r, Err(E::BadSplit { .. }));
    // C has three loops (i, j, k): a split of one into MAX_STAGE_LOOPS - 1 more is one too many.
    assert!(bad(s.split(2, 0, &vec![1; MAX_STAGE_LOOPS - 1])));
    assert_eq!(s, before, "a failed split leaves the state unchanged");
    s.split(2, 0, &vec![1; MAX_STAGE_LOOPS - 3])
        .expect("exactly MAX_STAGE_LOOPS loops");
    assert_eq!(s.stages()[2].leaves.len(), MAX_STAGE_LOOPS);
    assert!(bad(s.split(2, 1, &[1])));

    // i of 64 split by 63 (loops of 2 and 63), that inner loop by 62, and so on: after k + 1
    // splits the loops over i run 2^(k+1) (63 - k) times for a domain of 64.
    let d = dag("matmul:M=64,N=8,K=8");
    let mut s = State::new(&d);
    let mut refused = None;
    for k in 0..20u32 {
        let growth = (1i64 << (k + 1)) * (63 - k as i64) / 64;
        let before = s.clone();
        match s.split(2, k, &[63 - k as i64]) {
            Ok(()) => assert!(growth <= MAX_NEST_GROWTH, "split {k}: {growth}x allowed"),
            Err(e) => {
                assert!(matches!(e, E::BadSplit { .. }), "{e}");
                assert!(e.to_string().contains("rounded-up"), "{e}");
                assert_eq!(s, before);
                refused = Some(k);
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some(12),
        "the first split past {MAX_NEST_GROWTH}x is refused"
    );
}

#[test]
fn prefetches_that_do_not_apply() {
    // matmul: 0 A, 1 B, 2 C; axes of C: i, j, then k.
    let (_, mut s) = matmul();
    let before = s.clone();
    let bad = |r: Result<(), E>| matches!(r, Err(E::BadPrefetch { .. }));
    assert!(bad(s.prefetch(2, 0, 0, 0)), "offset 0");
    assert!(bad(s.prefetch(2, 0, 0, (1 << 16) + 1)), "too far ahead");
    assert!(bad(s.prefetch(2, 0, 0, i64::MIN)), "too far back");
    assert!(bad(s.prefetch(2, 0, 3, 1)), "no axis 3");
    assert!(bad(s.prefetch(2, 2, 0, 1)), "its own output");
    assert!(matches!(s.prefetch(0, 1, 0, 1), Err(E::Placeholder { .. })));
    assert!(matches!(s.prefetch(2, 7, 0, 1), Err(E::NoSuchStage { .. })));
    assert_eq!(s, before, "a failed primitive leaves the state unchanged");
    // The reduce axis counts; a second prefetch of the same tensor and axis replaces the first.
    s.prefetch(2, 0, 2, 1).expect("k is axis 2");
    s.prefetch(2, 0, 2, 4).expect("replaced");
    s.prefetch(2, 1, 2, 1).expect("another tensor");
    let hints = &s.stages()[2].prefetch;
    assert_eq!(hints.len(), 2, "{hints:?}");
    assert_eq!((hints[0].axis, hints[0].offset), (2, 4));
    // Another cache level is another hint; the same level again replaces it.
    s.prefetch_to(2, 0, 2, 8, PrefetchLevel::L2)
        .expect("into L2");
    s.prefetch_to(2, 0, 2, 9, PrefetchLevel::L2)
        .expect("replaced");
    let hints = &s.stages()[2].prefetch;
    let got: Vec<_> = hints.iter().map(|h| (h.offset, h.level)).collect();
    assert_eq!(
        got,
        [
            (4, PrefetchLevel::L1),
            (1, PrefetchLevel::L1),
            (9, PrefetchLevel::L2)
        ]
    );
    let before = s.clone();
    assert!(
        bad(s.prefetch_to(2, 0, 2, 0, PrefetchLevel::L3)),
        "offset 0"
    );
    assert_eq!(s, before);
}

#[test]
fn fuse_of_non_adjacent_loops() {
    let (_, mut s) = matmul();
    let before = s.clone();
    assert!(matches!(s.fuse(2, &[0, 2]), Err(E::BadFuse { .. })));
    assert!(matches!(s.fuse(2, &[1, 0]), Err(E::BadFuse { .. })));
    // j (spatial) and k (reduce) are adjacent but of different kinds.
    assert!(matches!(s.fuse(2, &[1, 2]), Err(E::BadFuse { .. })));
    assert_eq!(s, before, "a failed primitive leaves the state unchanged");
}

#[test]
fn compute_at_into_a_loop_that_does_not_enclose_the_use() {
    // softmax: exp is read by row_sum and by Y; attaching it to one does not enclose the other.
    let d = dag("softmax:M=4,N=8");
    let mut s = State::new(&d);
    let e = s.compute_at(2, 3, 0).unwrap_err();
    assert!(matches!(e, E::BadComputeAt { .. }), "{e}");
    assert!(e.to_string().contains("does not enclose"), "{e}");
    // A stage that does not read it at all.
    let (_, mut m) = matmul();
    assert!(matches!(m.compute_at(2, 2, 0), Err(E::BadComputeAt { .. })));
    // An output has no consumer.
    let d = dag("dense_bias_relu:M=4,N=4,K=4");
    let mut s = State::new(&d);
    assert!(matches!(s.compute_at(5, 4, 0), Err(E::BadComputeAt { .. })));
    // Not the consumer: dense is read by bias_add, not by Y.
    assert!(matches!(s.compute_at(3, 5, 0), Err(E::BadComputeAt { .. })));
}

#[test]
fn vectorize_of_a_reduce_loop() {
    let (_, mut s) = matmul();
    let e = s.vectorize(2, 2).unwrap_err();
    assert!(matches!(e, E::BadAnnotation { .. }));
    assert!(e.to_string().contains("reduce loop"), "{e}");
    assert!(matches!(s.parallel(2, 2), Err(E::BadAnnotation { .. })));
    // Unrolling a reduce loop is fine.
    s.unroll(2, 2).unwrap();
}

#[test]
fn split_factor_zero_and_out_of_range_indices() {
    let (_, mut s) = matmul();
    let e = s.split(2, 0, &[0]).unwrap_err();
    assert!(matches!(e, E::BadSplit { .. }), "{e}");
    assert!(
        e.to_string().contains("`C`") && e.to_string().contains("`i`"),
        "names stage and loop: {e}"
    );
    assert!(matches!(s.split(2, 0, &[-3]), Err(E::BadSplit { .. })));
    assert!(matches!(s.split(2, 0, &[]), Err(E::BadSplit { .. })));
    assert!(matches!(
        s.split(2, 0, &[1 << 30, 1 << 30]),
        Err(E::BadSplit { .. })
    ));
    assert!(matches!(s.split_nparts(2, 0, 0), Err(E::BadSplit { .. })));
    assert!(matches!(
        s.split(9, 0, &[2]),
        Err(E::NoSuchStage { index: 9, .. })
    ));
    assert!(matches!(
        s.split(2, 3, &[2]),
        Err(E::NoSuchLoop { index: 3, .. })
    ));
    assert!(matches!(s.split(0, 0, &[2]), Err(E::Placeholder { .. })));
    assert!(matches!(s.vectorize(2, 7), Err(E::NoSuchLoop { .. })));
}

#[test]
fn inline_of_a_reduction_or_output() {
    let (_, mut s) = matmul();
    assert!(matches!(s.compute_inline(2), Err(E::BadInline { .. })));
    let d = dag("softmax:M=4,N=8");
    let mut s = State::new(&d);
    let e = s.compute_inline(1).unwrap_err();
    assert!(e.to_string().contains("reduction"), "{e}");
    assert!(
        matches!(s.compute_inline(4), Err(E::BadInline { .. })),
        "output"
    );
    s.compute_inline(2).unwrap();
}

#[test]
fn reorder_with_a_duplicate_or_missing_loop() {
    let (_, mut s) = matmul();
    assert!(matches!(
        s.reorder(2, &[0, 0, 1]),
        Err(E::BadReorder { .. })
    ));
    assert!(matches!(s.reorder(2, &[0, 1]), Err(E::BadReorder { .. })));
    assert!(matches!(
        s.reorder(2, &[0, 1, 3]),
        Err(E::BadReorder { .. })
    ));
    s.reorder(2, &[2, 0, 1]).unwrap();
}

#[test]
fn other_misuse() {
    let (_, mut s) = matmul();
    s.vectorize(2, 1).unwrap_err(); // j is not innermost (k is)
    s.reorder(2, &[0, 2, 1]).unwrap();
    for limit in [0, 1, 65] {
        // j is innermost and spatial now: only the limit is wrong.
        let e = s.vectorize_up_to(2, 2, limit).unwrap_err();
        assert!(e.to_string().contains("2 to 64"), "limit {limit}: {e}");
    }
    s.vectorize(2, 2).unwrap();
    assert!(
        matches!(s.vectorize(2, 2), Err(E::BadAnnotation { .. })),
        "twice"
    );
    assert!(
        matches!(s.split(2, 2, &[2]), Err(E::BadSplit { .. })),
        "annotated"
    );
    assert!(matches!(
        s.cache_write(2, tensortune_schedules::ir::Scope::Local),
        Err(E::BadCache { .. })
    ));
    assert!(matches!(s.rfactor(2, 0), Err(E::BadRfactor { .. })));
    let (_, mut s) = matmul();
    assert!(
        matches!(s.rfactor(2, 0), Err(E::BadRfactor { .. })),
        "spatial loop"
    );
    assert!(matches!(
        s.cache_read(0, tensortune_schedules::ir::Scope::Shared, &[1]),
        Err(E::Placeholder { .. }) | Err(E::BadCache { .. })
    ));
}

#[test]
fn storage_orders_that_do_not_apply() {
    let (_, mut s) = matmul(); // 0 A, 1 B, 2 C
    let e = s.reorder_storage(2, &[1, 0]).unwrap_err();
    assert!(e.to_string().contains("output"), "{e}");
    assert!(matches!(
        s.reorder_storage(0, &[1, 0]),
        Err(E::Placeholder { .. })
    ));
    let b = s
        .cache_read(1, tensortune_schedules::ir::Scope::Local, &[2])
        .unwrap();
    for order in [&[0, 0][..], &[1][..], &[0, 1, 2][..], &[2, 0][..]] {
        assert!(
            matches!(s.reorder_storage(b, order), Err(E::BadStorageOrder { .. })),
            "{order:?}"
        );
    }
    s.reorder_storage(b, &[1, 0]).unwrap();
    // A stage with a storage order can no longer be cache-written (it is not untouched).
    assert!(matches!(
        s.cache_write(b, tensortune_schedules::ir::Scope::Local),
        Err(E::BadCache { .. })
    ));
}

#[test]
fn dag_validation() {
    let mut g = Graph::new();
    let a = g.placeholder("A", &[4, 4], DType::F32);
    let k = g.reduce_axis(4, "k");
    // Rank mismatch.
    let bad = g.compute("bad", &[4], &["i"], |ax| a.at([ax[0].clone()]));
    assert!(matches!(
        ComputeDag::new(&g, &[bad]),
        Err(DagError::RankMismatch { .. })
    ));
    // A reduce axis outside its reduction.
    let bad = g.compute("bad2", &[4], &["i"], |ax| a.at([ax[0].clone(), k.expr()]));
    assert!(matches!(
        ComputeDag::new(&g, &[bad]),
        Err(DagError::UnboundVar { .. })
    ));
    // A reduction nested in a reduction, and one nested in arithmetic.
    let k2 = g.reduce_axis(4, "k2");
    let bad = g.compute("bad3", &[4], &["i"], |ax| {
        sum(sum(a.at([ax[0].clone(), k.expr()]), [&k]), [&k2])
    });
    assert!(matches!(
        ComputeDag::new(&g, &[bad]),
        Err(DagError::BadReduction { .. })
    ));
    let bad = g.compute("bad4", &[4], &["i"], |ax| {
        sum(a.at([ax[0].clone(), k.expr()]), [&k]) * 2.0f32
    });
    assert!(matches!(
        ComputeDag::new(&g, &[bad]),
        Err(DagError::BadReduction { .. })
    ));
    // Mixing dtypes without a cast.
    let b = g.placeholder("B", &[4, 4], DType::F64);
    let bad = g.compute("bad5", &[4, 4], &["i", "j"], |ax| {
        a.at(ax.to_vec()) + b.at(ax.to_vec())
    });
    let e = ComputeDag::new(&g, &[bad]).unwrap_err();
    assert!(matches!(e, DagError::Type { .. }), "{e}");
    let ok = g.compute("ok", &[4, 4], &["i", "j"], |ax| {
        a.at(ax.to_vec()).cast(DType::F64) + b.at(ax.to_vec())
    });
    ComputeDag::new(&g, &[ok]).unwrap();
    // A tensor of another graph (or a later one): the cycle check.
    let mut other = Graph::new();
    let x = other.placeholder("X", &[2], DType::F32);
    let y = other.placeholder("Y", &[2], DType::F32);
    let z = other.compute("Z", &[2], &["i"], |ax| y.at([ax[0].clone()]));
    let mut g2 = Graph::new();
    let c = g2.compute("C", &[2], &["i"], |ax| {
        z.at([ax[0].clone()]) + x.at([ax[0].clone()])
    });
    assert!(matches!(
        ComputeDag::new(&g2, &[c]),
        Err(DagError::UnknownTensor { .. }) | Err(DagError::Cycle { .. })
    ));
    // Bad extents.
    let mut g3 = Graph::new();
    let p = g3.placeholder("P", &[0, 3], DType::F32);
    let q = g3.compute("Q", &[0, 3], &[], |ax| p.at(ax.to_vec()));
    assert!(matches!(
        ComputeDag::new(&g3, &[q]),
        Err(DagError::BadExtent { .. })
    ));
    // Loads that can leave their tensor: refused, so that no compiled program reads or
    // writes memory it does not own.
    let mut g4 = Graph::new();
    let a4 = g4.placeholder("A", &[8], DType::F32);
    let idx = g4.placeholder("I", &[8], DType::I32);
    let far = g4.compute("far", &[4], &["i"], |ax| {
        a4.at([ax[0].clone() + 1_000_000i64])
    });
    let e = ComputeDag::new(&g4, &[far]).unwrap_err();
    assert!(matches!(e, DagError::IndexOutOfBounds { .. }), "{e}");
    assert!(e.to_string().contains("1000000..=1000003"), "{e}");
    let off_by_one = g4.compute("next", &[8], &["i"], |ax| a4.at([ax[0].clone() + 1i64]));
    assert!(matches!(
        ComputeDag::new(&g4, &[off_by_one]),
        Err(DagError::IndexOutOfBounds { .. })
    ));
    // The same read guarded by a select is fine: only the chosen branch is evaluated.
    let guarded = g4.compute("next_or_zero", &[8], &["i"], |ax| {
        select(
            ax[0].clone().lt(7i64),
            a4.at([ax[0].clone() + 1i64]),
            0.0f32,
        )
    });
    ComputeDag::new(&g4, &[guarded]).unwrap();
    // ... and so is a strided window guarded on its compound index (a padded convolution's).
    let r = g4.reduce_axis(3, "r");
    let window = g4.compute("window", &[4], &["i"], |ax| {
        let at = ax[0].clone() * 2i64 + r.expr();
        sum(
            select(
                at.clone().ge(1i64).and(at.clone().lt(9i64)),
                a4.at([at - 1i64]),
                0.0f32,
            ),
            [&r],
        )
    });
    ComputeDag::new(&g4, &[window]).unwrap();
    // An index read from a tensor cannot be bounded unless it is clamped.
    let gathered = g4.compute("gather", &[8], &["i"], |ax| {
        a4.at([idx.at([ax[0].clone()]).cast(DType::I64)])
    });
    let e = ComputeDag::new(&g4, &[gathered]).unwrap_err();
    assert!(matches!(e, DagError::IndexOutOfBounds { .. }), "{e}");
    let clamped = g4.compute("clamped", &[8], &["i"], |ax| {
        a4.at([max(
            0i64,
            min(7i64, idx.at([ax[0].clone()]).cast(DType::I64)),
        )])
    });
    ComputeDag::new(&g4, &[clamped]).unwrap();
    // A tensor too large to address, even where its products wrap an i64.
    let mut g5 = Graph::new();
    let huge = g5.placeholder("H", &[1 << 62, 4], DType::F32);
    let one = g5.compute("one", &[1], &["i"], |ax| {
        huge.at([ax[0].clone(), ax[0].clone()])
    });
    let e = ComputeDag::new(&g5, &[one]).unwrap_err();
    assert!(matches!(e, DagError::TooLarge { .. }), "{e}");
    let wide = g5.placeholder("W", &[1 << 20, 1 << 20], DType::F32);
    let k1 = g5.reduce_axis(1 << 40, "k1");
    let k2 = g5.reduce_axis(1 << 40, "k2");
    let deep = g5.compute("deep", &[1], &["i"], |ax| {
        sum(
            wide.at([ax[0].clone(), ax[0].clone()]) * k1.expr().cast(DType::F32)
                + k2.expr().cast(DType::F32),
            [&k1, &k2],
        )
    });
    let e = ComputeDag::new(&g5, &[deep]).unwrap_err();
    assert!(matches!(e, DagError::TooLarge { .. }), "{e}");
    // Softmax is four computed stages.
    let d = dag("softmax:M=2,N=3");
    assert_eq!(d.num_ops(), 5);
    assert!(!d.info(tensortune_schedules::TensorId(2)).elementwise);
    assert!(d.info(tensortune_schedules::TensorId(2)).injective);
    let _ = Expr::int(0);
}

#[test]
fn workload_specs() {
    let w = WorkloadSpec::parse(" conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1 ").unwrap();
    assert_eq!(
        w.canonical(),
        "conv2d:C=64,H=56,K=64,N=1,R=3,S=3,W=56,dtype=f32,pad=1,stride=1"
    );
    assert_eq!(
        w.key(),
        WorkloadSpec::parse(&w.canonical()).unwrap().key(),
        "canonical is a fixed point"
    );
    assert_eq!(w.flops(), 2.0 * 64.0 * 56.0 * 56.0 * 64.0 * 9.0);
    // conv2d reads the input (1·64·56·56) and the weights (64·64·3·3) and writes the output
    // (1·64·56·56), 4 bytes each; the padded copy between them is not counted.
    assert_eq!(
        w.build().unwrap().min_bytes(),
        4.0 * (2.0 * 64.0 * 56.0 * 56.0 + 64.0 * 64.0 * 9.0)
    );
    let softmax = WorkloadSpec::parse("softmax:M=3,N=5")
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(softmax.min_bytes(), 4.0 * 2.0 * 15.0);
    let e = |s: &str| WorkloadSpec::parse(s).unwrap_err();
    assert!(matches!(e("nosuchop:M=1"), SpecError::UnknownOp { .. }));
    assert!(matches!(e("matmul"), SpecError::Malformed { .. }));
    assert!(matches!(e(":M=1"), SpecError::Malformed { .. }));
    assert!(matches!(e("matmul:M=1,N=2"), SpecError::MissingKey { .. }));
    assert!(matches!(
        e("matmul:M=1,N=2,K=3,Q=4"),
        SpecError::UnknownKey { .. }
    ));
    assert!(matches!(
        e("matmul:M=1,N=2,K=3,M=4"),
        SpecError::DuplicateKey { .. }
    ));
    assert!(matches!(
        e("matmul:M=0,N=2,K=3"),
        SpecError::BadValue { .. }
    ));
    assert!(matches!(
        e("matmul:M=-4,N=2,K=3"),
        SpecError::BadValue { .. }
    ));
    assert!(matches!(
        e("matmul:M=99999999999999999999999,N=2,K=3"),
        SpecError::BadValue { .. }
    ));
    assert!(matches!(
        e("matmul:M=x,N=2,K=3"),
        SpecError::BadValue { .. }
    ));
    assert!(matches!(e("matmul:M=1,N=2,K"), SpecError::BadItem { .. }));
    assert!(matches!(
        e("matmul:M=1,N=2,K=3,dtype=f16"),
        SpecError::BadValue { .. }
    ));
    assert!(matches!(
        e("matmul:M=16777216,N=16777216,K=3"),
        SpecError::BadShape { .. }
    ));
    assert!(matches!(
        e("conv2d:N=1,C=1,H=3,W=3,K=1,R=5,S=5"),
        SpecError::BadShape { .. }
    ));
    WorkloadSpec::parse("conv2d:N=1,C=1,H=3,W=3,K=1,R=5,S=5,pad=1").unwrap();
    assert!(matches!(
        e("softmax:M=2,N=2,dtype=i32"),
        SpecError::BadValue { .. }
    ));
    let i = WorkloadSpec::parse("matmul:M=4,N=4,K=4,dtype=i32").unwrap();
    assert_eq!(
        i.build().unwrap().op(i.build().unwrap().outputs()[0]).dtype,
        DType::I32
    );
    for op in tensortune_schedules::ops::OPS {
        assert!(!op.signature.is_empty());
    }
}

/// Found by `fuzz_specs`: a spec with a line break (or another control character) rendered
/// its error over two lines.
#[test]
fn spec_errors_stay_on_one_line() {
    for spec in [
        "l\nB",
        "b\rc",
        "matmul:M=4,N=4\n4,K=4",
        "matmul:M=4,N=4,K=4,Q\0=1",
        "matmul:M=4\u{2028}4,N=4,K=4",
        "nosuch\u{1b}[2J:M=1",
        "matmul:M=4,N=4,K=4,K\nQ",
        "matmul:M=4,N=4,K=4,dtype=f\n32",
    ] {
        let e = WorkloadSpec::parse(spec).unwrap_err().to_string();
        assert!(
            !e.contains(['\n', '\r', '\0', '\u{1b}', '\u{2028}']),
            "{e:?}"
        );
    }
    // A control character anywhere is refused outright (it was trimmed away inside values,
    // so `M=2\n,N=2` meant `M=2,N=2`), and quoted escaped.
    assert_eq!(
        WorkloadSpec::parse("ma\ntmul:M=1").unwrap_err().to_string(),
        "malformed workload spec `ma\\ntmul:M=1`: expected NAME:KEY=VALUE,... \
         (e.g. matmul:M=64,N=64,K=64)"
    );
    assert!(WorkloadSpec::parse("matmul:M=2\n,N=2,K=2").is_err());
    assert!(
        WorkloadSpec::parse("  matmul:M=2, N=2,K=2\n").is_ok(),
        "edges are trimmed"
    );
}

/// Found by `fuzz_traces`: serde quotes an unknown step or annotation name as written, so a
/// name with a line break made a two-line error.
#[test]
fn trace_errors_stay_on_one_line() {
    for json in [
        r#"{"steps":[{"op":"sp\nlit","stage":0,"iter":0,"factors":[2]}]}"#,
        r#"{"steps":[{"op":"annotate","stage":0,"iter":0,"annotation":"un\r\nroll"}]}"#,
        r#"{"steps":[{"op":"cache_write","stage":0,"scope":"\u001b[2J"}]}"#,
    ] {
        let e = Trace::from_json(json).unwrap_err();
        assert!(matches!(e, TraceError::Json(_)), "{e}");
        let e = e.to_string();
        assert!(!e.contains(['\n', '\r', '\u{1b}']), "{e:?}");
    }
}

#[test]
fn malformed_traces_never_panic() {
    let d = dag("conv2d:N=1,C=2,H=5,W=5,K=2,R=3,S=3,pad=1");
    let mut rng = Rng::new(99);
    // Random bytes.
    for _ in 0..300 {
        let n = rng.below(64) as usize;
        let bytes: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
        let text = String::from_utf8_lossy(&bytes);
        let _ = Trace::from_json(&text).map(|t| t.replay(&d));
    }
    // Structurally valid JSON with random numbers: every step kind, wild parameters.
    let kinds = [
        r#"{"op":"split","stage":S,"iter":I,"factors":[F,G]}"#,
        r#"{"op":"split_nparts","stage":S,"iter":I,"nparts":F}"#,
        r#"{"op":"fuse","stage":S,"iters":[I,G]}"#,
        r#"{"op":"reorder","stage":S,"order":[I,G,F]}"#,
        r#"{"op":"compute_at","stage":S,"target":G,"iter":I}"#,
        r#"{"op":"compute_inline","stage":S}"#,
        r#"{"op":"compute_root","stage":S}"#,
        r#"{"op":"cache_write","stage":S,"scope":"Local"}"#,
        r#"{"op":"cache_read","stage":S,"scope":"Shared","readers":[G]}"#,
        r#"{"op":"annotate","stage":S,"iter":I,"annotation":"vectorize"}"#,
        r#"{"op":"annotate","stage":S,"iter":I,"annotation":{"bind":"ThreadX"}}"#,
        r#"{"op":"rfactor","stage":S,"iter":I}"#,
        r#"{"op":"auto_unroll","stage":S,"iter":I,"max_step":F}"#,
        r#"{"op":"prefetch","stage":S,"tensor":G,"axis":I,"offset":F}"#,
    ];
    let mut replayed = 0;
    let mut failed_with_error = 0;
    for _ in 0..2000 {
        let steps: Vec<String> = (0..1 + rng.below(6))
            .map(|_| {
                let k = kinds[rng.below(kinds.len() as u64) as usize];
                let num = |r: &mut Rng| -> String {
                    match r.below(6) {
                        0 => "0".into(),
                        1 => "4294967295".into(),
                        2 => (r.below(9) as i64 - 2).to_string(),
                        _ => r.below(6).to_string(),
                    }
                };
                k.replace('S', &num(&mut rng))
                    .replace('I', &num(&mut rng))
                    .replace('F', &num(&mut rng))
                    .replace('G', &num(&mut rng))
            })
            .collect();
        let json = format!(r#"{{"steps":[{}]}}"#, steps.join(","));
        match Trace::from_json(&json) {
            Ok(t) => match t.replay(&d) {
                Ok(state) => {
                    replayed += 1;
                    let _ = tensortune_schedules::lower::lower(&state);
                }
                Err(TraceError::Step { .. }) => failed_with_error += 1,
                Err(e) => panic!("unexpected error kind {e}"),
            },
            Err(TraceError::Json(_)) => {}
            Err(e) => panic!("unexpected error kind {e}"),
        }
    }
    assert!(
        replayed > 10 && failed_with_error > 100,
        "{replayed} {failed_with_error}"
    );
}

/// `NdData`'s fields are public: a value whose data is not as long as its shape says is an
/// error wherever it is read by the shape, and `NdData::new` refuses shapes whose element
/// count overflows or is negative.
#[test]
fn host_arrays_that_do_not_hold_their_shape_are_errors() {
    use tensortune_schedules::data::{Data, NdData};
    assert!(NdData::new(vec![1 << 62, 4], Data::F32(vec![])).is_none());
    assert!(NdData::new(vec![-1, -1], Data::F32(vec![0.0])).is_none());
    assert!(NdData::new(vec![2, 3], Data::F32(vec![0.0; 6])).is_some());
    let short = NdData {
        shape: vec![4, 4],
        data: Data::F32(vec![0.0; 3]),
    };
    assert!(!short.is_consistent());
    assert_eq!(short.max_rel_diff(&short.clone()), None);
    let d = dag("matmul:M=4,N=4,K=4");
    let b = NdData::random(&[4, 4], DType::F32, 1).expect("random");
    let e = tensortune_schedules::eval::evaluate(&d, &[short.clone(), b.clone()]).unwrap_err();
    assert!(e.to_string().contains("3 values"), "{e}");
    let f = tensortune_schedules::lower::lower(&State::new(&d)).expect("lowers");
    assert!(tensortune_schedules::interp::run(&f, &[short, b]).is_err());
}
