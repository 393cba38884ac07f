//! Property test: random valid traces lower to loop IR that the interpreter runs to the same
//! results as the direct evaluator, and replay from JSON gives the same IR.

mod common;
use tensortune_schedules::lower::{lower, LowerError};
use tensortune_schedules::random::{has_compute_at, random_state};
use tensortune_schedules::trace::Trace;

const SPECS: &[&str] = &[
    "matmul:M=6,N=10,K=7",
    "batch_matmul:B=2,M=4,N=6,K=5",
    "dense_bias_relu:M=5,N=8,K=6",
    "conv2d:N=1,C=3,H=6,W=7,K=4,R=3,S=3,stride=1,pad=1",
    "conv2d:N=2,C=2,H=7,W=7,K=3,R=3,S=2,stride=2,pad=0",
    "conv2d_hwio:N=1,C=3,H=6,W=7,K=16,R=3,S=2,stride=1,pad=1",
    "depthwise_conv2d:N=1,C=3,H=7,W=6,R=3,S=3,stride=2,pad=1",
    "softmax:M=4,N=9",
    "reduce_sum:M=3,N=12",
];

#[test]
fn random_traces_match_the_evaluator() {
    let cases_per_spec = 60;
    let (mut lowered, mut attached, mut refused) = (0, 0, 0);
    for (si, spec) in SPECS.iter().enumerate() {
        let dag = common::dag(spec);
        for case in 0..cases_per_spec {
            let seed = (si * 1000 + case) as u64;
            let state = random_state(&dag, seed, 16, true);
            match lower(&state) {
                Ok(f) => {
                    lowered += 1;
                    attached += has_compute_at(&state) as usize;
                    common::check_state(&dag, &state, seed);
                    // The trace round-trips through JSON to the same program.
                    let json = state.trace().to_json();
                    let again = Trace::from_json(&json)
                        .expect("json")
                        .replay(&dag)
                        .expect("replay");
                    let g = lower(&again).expect("replayed state lowers");
                    assert_eq!(f.to_string(), g.to_string(), "{spec} seed {seed}");
                }
                Err(LowerError::Verify(e)) => {
                    panic!("{spec} seed {seed}: invalid IR: {e}\n{state}")
                }
                Err(e) => {
                    eprintln!("refused: {e}");
                    refused += 1
                }
            }
        }
    }
    let total = SPECS.len() * cases_per_spec;
    eprintln!("{lowered} of {total} lowered ({attached} with compute_at), {refused} refused");
    assert!(total >= 200);
    assert!(
        lowered * 10 >= total * 8,
        "too few random states lower: {lowered} of {total}"
    );
    assert!(
        attached * 10 >= lowered,
        "too few random states use compute_at: {attached}"
    );
}
