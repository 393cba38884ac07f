//! Fuzzing of workload specs, the text every command takes with `--workload`: mutations of
//! valid specs parse to a spec or to a one-line error, never a panic. A spec that parses has a
//! canonical form that parses back to the same spec, and it builds a DAG (or fails by name)
//! whose FLOPs are a finite count.

use std::cell::Cell;

use tensortune_fuzzkit::{one_line, Campaign};
use tensortune_schedules::ops::{WorkloadSpec, OPS};

const SEEDS: &[&str] = &[
    "matmul:M=64,N=64,K=64",
    "matmul:N=8, M=4 ,K=2,dtype=f64",
    "batch_matmul:B=2,M=16,N=8,K=4,dtype=i32",
    "dense_bias_relu:M=5,N=8,K=6",
    "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1",
    "conv2d:N=2,C=2,H=7,W=7,K=3,R=3,S=2,stride=2,pad=0",
    "depthwise_conv2d:N=1,C=3,H=7,W=6,R=3,S=3,stride=2,pad=1",
    "conv2d_hwio:N=1,C=2,H=5,W=5,K=3,R=3,S=3,stride=1,pad=1",
    "softmax:M=4,N=9",
    "reduce_sum:M=3,N=12,dtype=f32",
    "  matmul : M=1,N=1,K=1,  ",
];

const TOKENS: &[&str] = &[
    "matmul",
    "conv2d",
    "depthwise_conv2d",
    "conv2d_hwio",
    "softmax",
    "dtype",
    "=f64",
    "=i32",
    "=f16",
    "=bf16",
    "=i8",
    "stride",
    "pad",
    "M=",
    "N=",
    "K=",
    "B=",
    "C=",
    "H=",
    "W=",
    "R=",
    "S=",
    ",pad=0",
    ",stride=0",
    ",dtype=f32",
    ":",
];

/// One input: a spec or a one-line error; a parsed spec round-trips through its canonical
/// form and builds, or fails by name. `accepted` counts the specs that parsed.
fn check(bytes: &[u8], accepted: &Cell<usize>) -> Result<(), String> {
    let text = String::from_utf8_lossy(bytes);
    let spec = match WorkloadSpec::parse(&text) {
        Ok(spec) => spec,
        Err(e) => return one_line(&e),
    };
    accepted.set(accepted.get() + 1);
    let canonical = spec.canonical();
    match WorkloadSpec::parse(&canonical) {
        Ok(again) if again == spec && again.canonical() == canonical => {}
        Ok(again) => {
            return Err(format!(
                "{text:?} parsed to {canonical:?}, which re-parses to {:?}",
                again.canonical()
            ))
        }
        Err(e) => return Err(format!("canonical form {canonical:?} does not parse: {e}")),
    }
    if !OPS.iter().any(|op| op.name == spec.op_name()) {
        return Err(format!("{canonical:?} names an op outside the library"));
    }
    match spec.build() {
        Ok(dag) => {
            let flops = dag.flops();
            if !(flops.is_finite() && flops >= 0.0) {
                return Err(format!("{canonical:?} has {flops} FLOPs"));
            }
            Ok(())
        }
        Err(e) => one_line(&e),
    }
}

#[test]
fn mutated_specs_parse_or_fail_with_one_line() {
    let seeds: Vec<&[u8]> = SEEDS.iter().map(|s| s.as_bytes()).collect();
    let accepted = Cell::new(0);
    Campaign::new("workload specs", &seeds)
        .tokens(TOKENS)
        .run(|bytes| check(bytes, &accepted));
    // Both ways out are exercised: the round-trip checks ran on many specs.
    let accepted = accepted.get();
    assert!(
        (300..9_000).contains(&accepted),
        "{accepted} of 10,000 mutated specs parsed"
    );
}
