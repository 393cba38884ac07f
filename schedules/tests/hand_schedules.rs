//! Hand-written schedules for every op family, each checked against the direct evaluator.
//! Together they use every primitive; many splits do not divide their loop (guarded tails).

mod common;
use common::{check_state, dag};
use tensortune_schedules::ir::{LoweredFunc, PrefetchLevel, Scope, Stmt, ThreadAxis};
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::{ScheduleError, State};
use tensortune_schedules::simplify::Simplifier;
use tensortune_schedules::trace::Trace;
use tensortune_schedules::{BufId, Expr};

type Sched = fn(&mut State) -> Result<(), ScheduleError>;

fn run_all(spec: &str, schedules: &[(&str, Sched)]) {
    let d = dag(spec);
    check_state(&d, &State::new(&d), 0);
    for (i, (name, f)) in schedules.iter().enumerate() {
        let mut s = State::new(&d);
        f(&mut s).unwrap_or_else(|e| panic!("{spec} / {name}: {e}\n{s}"));
        check_state(&d, &s, i as u64 + 1);
    }
}

// Stage positions in matmul: 0 A, 1 B, 2 C.
#[test]
fn matmul_family() {
    let scheds: &[(&str, Sched)] = &[
        ("tile + vectorize", |s| {
            s.tile(2, 0, 1, 4, 4)?; // i.0 j.0 i.1 j.1 k
            s.reorder(2, &[0, 1, 4, 2, 3])?; // i.0 j.0 k i.1 j.1
            s.vectorize(2, 4)?;
            s.unroll(2, 3)
        }),
        ("cache_write register tile, non-divisible", |s| {
            let l = s.cache_write(2, Scope::Local)?; // 2 C.local, 3 C
            s.split(3, 0, &[3])?;
            s.split(3, 2, &[4])?;
            s.reorder(3, &[0, 2, 1, 3])?;
            s.parallel(3, 0)?;
            s.compute_at(l, 3, 1)?;
            s.split(l, 2, &[2])?; // C.local: i j k.0 k.1
            s.reorder(l, &[2, 3, 0, 1])?;
            s.vectorize(l, 3)?;
            s.vectorize(3, 3)
        }),
        ("fuse + parallel + nparts", |s| {
            s.fuse(2, &[0, 1])?;
            s.split_nparts(2, 0, 4)?;
            s.parallel(2, 0)?;
            s.auto_unroll(2, 1, 16)
        }),
        ("multi-level SSRSRS tiling", |s| {
            s.split(2, 0, &[2, 2])?; // i.0 i.1 i.2 j k
            s.split(2, 3, &[5, 2])?; // i.0 i.1 i.2 j.0 j.1 j.2 k
            s.split(2, 6, &[3])?; // ... k.0 k.1
                                  // S S R S R S: i.0 j.0 i.1 j.1 k.0 i.2 k.1 j.2
            s.reorder(2, &[0, 3, 1, 4, 6, 2, 7, 5])?;
            s.unroll(2, 5)?;
            s.vectorize(2, 7)
        }),
        ("cache_read shared + bind", |s| {
            let a = s.cache_read(0, Scope::Shared, &[2])?; // 0 A, 1 A.shared, 2 B, 3 C
            s.split(3, 0, &[4])?;
            s.bind(3, 0, ThreadAxis::BlockX)?;
            s.bind(3, 1, ThreadAxis::ThreadX)?;
            s.compute_at(a, 3, 1)
        }),
        ("rfactor of k", |s| {
            s.split(2, 2, &[4])?; // i j k.0 k.1
            let rf = s.rfactor(2, 3)?; // C.rf at 2: i j k.1v k.0; C at 3
            s.reorder(rf, &[0, 1, 3, 2])?;
            s.vectorize(rf, 3)?;
            s.compute_at(rf, 3, 1)
        }),
    ];
    run_all("matmul:M=10,N=13,K=11", scheds);
    let bm: &[(&str, Sched)] = &[
        ("tile batch", |s| {
            s.fuse(2, &[0, 1])?;
            s.split(2, 0, &[3])?;
            s.parallel(2, 0)?; // b@i.0 b@i.1 j k
            s.reorder(2, &[0, 1, 3, 2])?;
            s.vectorize(2, 3)
        }),
        ("cache_write", |s| {
            let l = s.cache_write(2, Scope::Local)?;
            s.split(3, 2, &[4])?;
            s.compute_at(l, 3, 2)?;
            s.vectorize(3, 3)
        }),
    ];
    run_all("batch_matmul:B=3,M=5,N=9,K=4", bm);
    // dense_bias_relu: 0 X, 1 W, 2 bias, 3 dense, 4 bias_add, 5 Y
    let dbr: &[(&str, Sched)] = &[
        ("inline epilogue", |s| {
            s.compute_inline(4)?;
            s.tile(5, 0, 1, 2, 4)?;
            s.vectorize(5, 3)
        }),
        ("fuse dense into the epilogue tile", |s| {
            s.compute_inline(4)?;
            s.split(5, 0, &[4])?;
            s.split(5, 2, &[3])?;
            s.reorder(5, &[0, 2, 1, 3])?;
            s.compute_at(3, 5, 1)?;
            s.split(3, 2, &[2])?;
            s.unroll(3, 3)
        }),
        ("compute_root after inline", |s| {
            s.compute_inline(4)?;
            s.compute_root(4)?;
            s.parallel(5, 0)
        }),
    ];
    run_all("dense_bias_relu:M=7,N=10,K=6", dbr);
}

// conv2d with pad: 0 data, 1 weight, 2 pad, 3 out
#[test]
fn conv_family() {
    let scheds: &[(&str, Sched)] = &[
        ("inline padding, tile output", |s| {
            s.compute_inline(2)?;
            s.split(3, 3, &[4])?; // n k y x.0 x.1 rc ry rx
            s.reorder(3, &[0, 1, 2, 3, 5, 6, 7, 4])?;
            s.vectorize(3, 7)
        }),
        ("padding at the output tile", |s| {
            s.split(3, 2, &[2])?; // n k y.0 y.1 x rc ry rx
            s.reorder(3, &[0, 2, 1, 3, 4, 5, 6, 7])?; // n y.0 k y.1 ...
            s.compute_at(2, 3, 1)
        }),
        ("cache_write + padding inside the accumulator", |s| {
            let l = s.cache_write(3, Scope::Local)?; // 3 out.local, 4 out
            s.split(4, 1, &[2])?; // n k.0 k.1 y x
            s.split(4, 4, &[3])?; // n k.0 k.1 y x.0 x.1
            s.reorder(4, &[0, 1, 3, 4, 2, 5])?; // n k.0 y x.0 k.1 x.1
            s.compute_at(l, 4, 3)?;
            s.compute_at(2, l, 4)?; // pad inside out.local's rc loop
            s.vectorize(4, 5)
        }),
        ("fuse and parallel", |s| {
            s.compute_inline(2)?;
            s.fuse(3, &[0, 1, 2])?;
            s.parallel(3, 0)?;
            s.auto_unroll(3, 1, 64)
        }),
        ("rfactor over channels", |s| {
            s.compute_inline(2)?;
            let rf = s.rfactor(3, 4)?; // out: n k y x rc ry rx, rfactor rc
            s.compute_at(rf, 4, 3)
        }),
    ];
    run_all("conv2d:N=1,C=3,H=7,W=6,K=5,R=3,S=3,stride=1,pad=1", scheds);
    run_all("conv2d:N=2,C=2,H=9,W=8,K=3,R=3,S=3,stride=2,pad=1", scheds);
    // depthwise: 0 data, 1 weight, 2 pad, 3 out (n c y x ry rx)
    let dw: &[(&str, Sched)] = &[
        ("inline + vectorize", |s| {
            s.compute_inline(2)?;
            s.split(3, 3, &[3])?;
            s.reorder(3, &[0, 1, 2, 3, 5, 6, 4])?;
            s.vectorize(3, 6)
        }),
        ("pad at rows", |s| {
            s.split(3, 2, &[2])?;
            s.compute_at(2, 3, 3)
        }),
        ("cache read weights", |s| {
            let w = s.cache_read(1, Scope::Local, &[3])?; // 0 data,1 weight,2 weight.local,3 pad,4 out
            s.compute_at(w, 4, 1)?;
            s.unroll(4, 4)
        }),
    ];
    run_all(
        "depthwise_conv2d:N=1,C=4,H=9,W=7,R=3,S=3,stride=2,pad=1",
        dw,
    );
}

/// Softmax one row at a time (softmax: 0 X, 1 row_max, 2 exp, 3 row_sum, 4 Y), `exp`
/// vectorized.
fn row_at_a_time(s: &mut State) -> Result<(), ScheduleError> {
    s.compute_at(3, 4, 0)?;
    s.split(2, 1, &[4])?;
    s.compute_at(2, 4, 0)?;
    s.compute_at(1, 4, 0)?;
    s.vectorize(2, 2)
}

/// [`row_at_a_time`], `exp` prefetching the input's next row.
fn row_at_a_time_prefetched(s: &mut State) -> Result<(), ScheduleError> {
    row_at_a_time(s)?;
    s.prefetch(2, 0, 0, 1)
}

/// The prefetches of a lowered function, and the indices of `exp`'s loads of the input.
fn prefetches_and_reads(f: &LoweredFunc) -> (Vec<(BufId, Expr)>, Vec<Expr>) {
    let x = f.params[0];
    let (mut fetched, mut read) = (Vec::new(), Vec::new());
    f.body.visit(&mut |st| match st {
        Stmt::Prefetch { buf, index, .. } => fetched.push((*buf, index.clone())),
        Stmt::Store { buf, value, .. } if f.buffer(*buf).name == "exp" => value.visit(&mut |e| {
            if let Expr::BufLoad { buf, index, .. } = e {
                if *buf == x {
                    read.push((**index).clone());
                }
            }
        }),
        _ => {}
    });
    (fetched, read)
}

/// The prefetch reads the element the body reads, one row (`N` elements) further: the last
/// row's lies past the input, which lowering and the verifier accept.
#[test]
fn prefetch_fetches_the_next_row() {
    let d = dag("softmax:M=5,N=11");
    let mut s = State::new(&d);
    row_at_a_time_prefetched(&mut s).unwrap();
    let f = lower(&s).unwrap();
    let (fetched, read) = prefetches_and_reads(&f);
    assert_eq!(fetched.len(), 1, "{f}");
    assert_eq!(read.len(), 1, "{f}");
    assert_eq!(fetched[0].0, f.params[0], "{f}");
    let gap = Simplifier::default().expr(&(fetched[0].1.clone() - read[0].clone()));
    assert_eq!(
        gap.as_int(),
        Some(11),
        "{} against {}\n{f}",
        fetched[0].1,
        read[0]
    );
    assert!(f.to_string().contains("prefetch X["), "{f}");
    // The same program without the step has none; with it, the trace says so.
    let mut plain = State::new(&d);
    row_at_a_time(&mut plain).unwrap();
    let (none, _) = prefetches_and_reads(&lower(&plain).unwrap());
    assert!(none.is_empty());
    assert!(s
        .trace()
        .to_string()
        .contains("prefetch(s2, s0, axis 0, +1)"));
    // A trace with the step survives JSON and replays to the same program; an L1 step's
    // JSON is what it was before steps had a level (stored records keep their hashes).
    let json = serde_json::to_string(s.trace()).unwrap();
    assert!(!json.contains("level"), "{json}");
    let again = Trace::from_json(&json).unwrap().replay(&d).unwrap();
    assert_eq!(lower(&again).unwrap().to_string(), f.to_string());
}

/// A second prefetch into L2 two rows ahead lowers beside the first, two rows (`2 N`
/// elements) past what the body reads, and says its level in the loop nest, the trace and
/// the trace's JSON, through which it replays.
#[test]
fn prefetch_into_l2_two_rows_ahead() {
    let d = dag("softmax:M=5,N=11");
    let mut s = State::new(&d);
    row_at_a_time_prefetched(&mut s).unwrap();
    s.prefetch_to(2, 0, 0, 2, PrefetchLevel::L2).unwrap();
    let f = lower(&s).unwrap();
    let mut levels = Vec::new();
    f.body.visit(&mut |st| {
        if let Stmt::Prefetch { level, .. } = st {
            levels.push(*level)
        }
    });
    assert_eq!(levels, [PrefetchLevel::L1, PrefetchLevel::L2], "{f}");
    let (fetched, read) = prefetches_and_reads(&f);
    let gaps: Vec<_> = fetched
        .iter()
        .map(|(_, i)| {
            Simplifier::default()
                .expr(&(i.clone() - read[0].clone()))
                .as_int()
        })
        .collect();
    assert_eq!(gaps, [Some(11), Some(22)], "{f}");
    assert!(f.to_string().contains("prefetch to l2 X["), "{f}");
    let text = s.trace().to_string();
    assert!(
        text.contains("prefetch(s2, s0, axis 0, +2, to l2)"),
        "{text}"
    );
    let json = serde_json::to_string(s.trace()).unwrap();
    assert!(json.contains(r#""level":"l2""#), "{json}");
    let again = Trace::from_json(&json).unwrap().replay(&d).unwrap();
    assert_eq!(lower(&again).unwrap().to_string(), f.to_string());
    check_state(&d, &s, 3);
}

// softmax: 0 X, 1 row_max, 2 exp, 3 row_sum, 4 Y
#[test]
fn reduction_family() {
    let sm: &[(&str, Sched)] = &[
        ("exp inlined", |s| {
            s.compute_inline(2)?;
            s.vectorize(4, 1).map(|_| ()).or(Ok(()))
        }),
        ("reductions at rows", |s| {
            s.compute_at(3, 4, 0)?;
            s.compute_at(1, 2, 0)
        }),
        ("rfactor the max", |s| {
            s.split(1, 1, &[4])?;
            let rf = s.rfactor(1, 2)?; // 1 row_max.rf, 2 row_max
            s.vectorize(rf, 1).map(|_| ()).or_else(|_| s.unroll(rf, 1))
        }),
        ("split rows, parallel", |s| {
            s.split(4, 0, &[2])?;
            s.parallel(4, 0)?;
            s.split(4, 2, &[4])?;
            s.vectorize(4, 3)
        }),
        ("cache_write the sum", |s| {
            let l = s.cache_write(3, Scope::Local)?; // 3 row_sum.local, 4 row_sum
            s.compute_at(l, 4, 0)
        }),
        ("rows, the next one prefetched", row_at_a_time_prefetched),
        ("prefetches of every kind", |s| {
            // Back along the row, ahead along the reduce axis, and of a computed stage (left
            // out: it is not in global memory once attached).
            s.prefetch(2, 0, 1, -3)?;
            s.prefetch(1, 0, 1, 2)?;
            s.compute_at(1, 2, 0)?;
            s.prefetch(2, 1, 0, 1)
        }),
    ];
    run_all("softmax:M=5,N=11", sm);
    let rs: &[(&str, Sched)] = &[
        ("rfactor inner", |s| {
            s.split(1, 1, &[5])?;
            let rf = s.rfactor(1, 2)?;
            s.parallel(rf, 0)
        }),
        ("rfactor outer", |s| {
            s.split(1, 1, &[4])?;
            s.rfactor(1, 1).map(|_| ())
        }),
        ("rfactor whole axis", |s| s.rfactor(1, 1).map(|_| ())),
        ("unroll reduce", |s| {
            s.split(1, 1, &[3])?;
            s.unroll(1, 2)?;
            s.auto_unroll(1, 0, 512)
        }),
        ("nparts", |s| s.split_nparts(1, 1, 4)),
    ];
    run_all("reduce_sum:M=3,N=17", rs);
}

#[test]
fn point_evaluation_matches_full_evaluation() {
    use tensortune_schedules::eval;
    for spec in [
        "softmax:M=3,N=7",
        "conv2d:N=1,C=2,H=5,W=5,K=3,R=3,S=3,pad=1,stride=2",
        "dense_bias_relu:M=4,N=5,K=3",
    ] {
        let d = dag(spec);
        let ins = common::inputs(&d, 4);
        let full = eval::evaluate(&d, &ins).unwrap();
        let n = full[0].data.len() as i64;
        let points: Vec<i64> = (0..n).step_by(3).collect();
        let got = eval::evaluate_points(&d, &ins, 0, &points).unwrap();
        for (p, g) in points.iter().zip(got) {
            assert_eq!(g, full[0].data.get_f64(*p as usize), "{spec} at {p}");
        }
    }
}

/// A prefetch in a stage with an axis bound to a virtual thread: the prefetch's address
/// reads the virtual thread's variable, so it moves into the virtual-thread loops with the
/// loads it runs ahead of (it was once left outside them, and the verifier refused the IR:
/// "variable `i` used outside its loop"). 26 of 20000 random traces of five workloads were
/// such programs.
#[test]
fn prefetch_under_a_virtual_thread() {
    // matmul: 0 A, 1 B, 2 C; C's loops i, j, k.
    for (axis, offset, level) in [(2, 1, PrefetchLevel::L1), (1, 2, PrefetchLevel::L2)] {
        let d = dag("matmul:M=6,N=10,K=7");
        let mut s = State::new(&d);
        s.bind(2, 0, ThreadAxis::VThread).unwrap();
        s.prefetch_to(2, 0, axis, offset, level).unwrap();
        let f = lower(&s).unwrap_or_else(|e| panic!("{e}\n{s}"));
        let mut fetched = 0;
        f.body
            .visit(&mut |st| fetched += matches!(st, Stmt::Prefetch { .. }) as usize);
        assert!(fetched >= 1, "{f}");
        check_state(&d, &s, 5);
    }
}
