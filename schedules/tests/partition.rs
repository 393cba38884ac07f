//! Loop partitioning of imperfect splits (`LowerOptions::partition_tails`): the main loop runs
//! unguarded, the tail keeps its guards, and the result is what the direct evaluator computes.

mod common;
use common::{check_state, dag, inputs};
use tensortune_schedules::ir::Stmt;
use tensortune_schedules::lower::{lower_with, LowerOptions};
use tensortune_schedules::schedule::State;
use tensortune_schedules::{eval, interp};

/// (stores outside any `If`, stores inside one).
fn stores(s: &Stmt, guarded: bool, n: &mut (usize, usize)) {
    match s {
        Stmt::For { body, .. } | Stmt::Allocate { body, .. } => stores(body, guarded, n),
        Stmt::If {
            then, otherwise, ..
        } => {
            stores(then, true, n);
            if let Some(o) = otherwise {
                stores(o, true, n);
            }
        }
        Stmt::Seq(v) => v.iter().for_each(|x| stores(x, guarded, n)),
        Stmt::Store { .. } | Stmt::Shuffle { .. } => {
            if guarded {
                n.1 += 1
            } else {
                n.0 += 1
            }
        }
        Stmt::Sync | Stmt::Prefetch { .. } => {}
    }
}

fn partitioned() -> LowerOptions {
    LowerOptions {
        partition_tails: true,
        ..LowerOptions::default()
    }
}

/// The partitioned program interpreted against the direct evaluator.
fn check_partitioned(d: &tensortune_schedules::ComputeDag, state: &State, seed: u64) {
    let f = lower_with(state, &partitioned()).unwrap_or_else(|e| panic!("{e}\n{state}"));
    let ins = inputs(d, seed);
    let want = eval::evaluate(d, &ins).unwrap();
    let got = interp::run(&f, &ins).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let diff = got[0].max_rel_diff(&want[0]).unwrap();
    assert!(diff < 1e-4, "mismatch {diff}\n{f}");
}

fn count(state: &State, partition_tails: bool) -> (usize, usize) {
    let f = lower_with(
        state,
        &LowerOptions {
            partition_tails,
            ..LowerOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{state}"));
    let mut n = (0, 0);
    stores(&f.body, false, &mut n);
    n
}

#[test]
fn imperfect_register_tile_gets_an_unguarded_main_loop() {
    // M = 30 split by 6 x 4: i.0 has 2 iterations, the second one partly outside.
    let d = dag("matmul:M=30,N=16,K=5");
    let mut s = State::new(&d);
    s.cache_write(2, tensortune_schedules::ir::Scope::Local)
        .unwrap();
    s.split(2, 0, &[6, 4]).unwrap(); // C.local: i.0 i.1 i.2 j k
    s.reorder(2, &[0, 1, 4, 2, 3]).unwrap(); // i.0 i.1 k i.2 j
    s.split(3, 0, &[24]).unwrap(); // C: i.0 i.1 j
    s.compute_at(2, 3, 0).unwrap();
    s.unroll(2, 3).unwrap();
    s.vectorize(2, 4).unwrap();
    let (free_kept, guarded_kept) = count(&s, false);
    let (free, guarded) = count(&s, true);
    assert_eq!(free_kept, 0, "without partitioning every store is guarded");
    assert!(guarded_kept > 0);
    assert!(free > 0, "the main loop's stores run unguarded");
    assert!(guarded > 0, "the tail keeps its guards");
    check_partitioned(&d, &s, 1);
    check_state(&d, &s, 2);
}

#[test]
fn loops_that_divide_are_left_alone() {
    let d = dag("matmul:M=24,N=16,K=5");
    let mut s = State::new(&d);
    s.split(2, 0, &[6, 4]).unwrap();
    let a = lower_with(&s, &LowerOptions::default()).unwrap();
    let b = lower_with(&s, &partitioned()).unwrap();
    assert_eq!(a.to_string(), b.to_string());
    check_partitioned(&d, &s, 3);
}

#[test]
fn guards_on_two_axes_and_a_reduction() {
    // Every split imperfect: i (M = 13 by 4), j (N = 10 by 4), k (K = 7 by 3).
    let d = dag("matmul:M=13,N=10,K=7");
    let mut s = State::new(&d);
    s.split(2, 2, &[3]).unwrap(); // i j k.0 k.1
    s.split(2, 1, &[4]).unwrap(); // i j.0 j.1 k.0 k.1
    s.split(2, 0, &[4]).unwrap(); // i.0 i.1 j.0 j.1 k.0 k.1
    s.reorder(2, &[0, 2, 4, 1, 5, 3]).unwrap(); // i.0 j.0 k.0 i.1 k.1 j.1
    s.vectorize(2, 5).unwrap();
    let (free, guarded) = count(&s, true);
    assert!(free > 0 && guarded > 0, "{free} {guarded}");
    check_partitioned(&d, &s, 4);
    // And in a parallel outer loop, which is not partitioned itself.
    let mut p = s.clone();
    p.parallel(2, 0).unwrap();
    check_partitioned(&d, &p, 5);
}
