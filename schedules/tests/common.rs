//! Helpers shared by the schedule-language tests.
#![allow(dead_code)]

use tensortune_schedules::data::NdData;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::{eval, interp, lower, ComputeDag};

/// The DAG of a spec.
pub fn dag(spec: &str) -> ComputeDag {
    WorkloadSpec::parse(spec)
        .expect("spec")
        .build()
        .expect("dag")
}

/// Random inputs for a DAG.
pub fn inputs(dag: &ComputeDag, seed: u64) -> Vec<NdData> {
    dag.inputs()
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let op = dag.op(t);
            NdData::random(&op.shape, op.dtype, seed * 31 + i as u64).expect("data dtype")
        })
        .collect()
}

/// Lowers, interprets and compares with the direct evaluator; panics with the IR on mismatch.
pub fn check_state(dag: &ComputeDag, state: &State, seed: u64) {
    let f = lower::lower(state).unwrap_or_else(|e| panic!("lower failed: {e}\n{state}"));
    let ins = inputs(dag, seed);
    let want = eval::evaluate(dag, &ins).expect("evaluate");
    let got = interp::run(&f, &ins).unwrap_or_else(|e| panic!("interp failed: {e}\n{state}\n{f}"));
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        let d = g.max_rel_diff(w).expect("same shape and dtype");
        assert!(d < 1e-4, "mismatch {d}\n{}\n{state}\n{f}", state.trace());
    }
}
