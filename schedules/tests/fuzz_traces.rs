//! Fuzzing of trace JSON, the schedule text the records database stores and imports: mutated
//! traces parse to a trace or to a one-line error, never a panic. A trace that parses
//! serializes back to itself and replays onto its workload's DAG deterministically, to a state
//! or a one-line error; a replayed state lowers to loop IR that passes the verifier, or fails
//! by name.

use std::cell::Cell;

use tensortune_fuzzkit::{one_line, Campaign};
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::random::random_state;
use tensortune_schedules::trace::Trace;
use tensortune_schedules::verify::verify;
use tensortune_schedules::ComputeDag;

/// Workloads whose random schedules seed the campaigns, one campaign each: every step kind
/// occurs on some of them (rfactor on reductions, cache_read on convolutions' inputs).
const SPECS: &[&str] = &[
    "matmul:M=6,N=10,K=7",
    "batch_matmul:B=2,M=4,N=6,K=5",
    "dense_bias_relu:M=5,N=8,K=6",
    "conv2d:N=1,C=3,H=6,W=7,K=4,R=3,S=3,stride=1,pad=1",
    "conv2d_hwio:N=1,C=3,H=6,W=7,K=4,R=3,S=3,stride=2,pad=1",
    "depthwise_conv2d:N=1,C=3,H=7,W=6,R=3,S=3,stride=2,pad=1",
    "softmax:M=4,N=9",
    "reduce_sum:M=3,N=12",
    "matmul:M=16,N=16,K=16",
];

/// Inputs per workload: eight campaigns make 20,000, twice the floor of 10,000 per parser,
/// because few mutated traces still replay and the replays are the deeper half of the test.
const INPUTS_PER_SPEC: usize = 2_500;

/// Random schedules per workload, as seeds.
const SEEDS_PER_SPEC: u64 = 12;

/// A hand-written trace with every field the format has (the sketch too), so mutations reach
/// the step kinds random schedules rarely draw.
const FULL_TRACE: &str = r#"{"steps":[{"op":"split","stage":0,"iter":0,"factors":[2,3]},{"op":"split_n_parts","stage":0,"iter":1,"nparts":2},{"op":"fuse","stage":0,"iters":[0,1]},{"op":"reorder","stage":0,"order":[1,0]},{"op":"compute_at","stage":0,"target":1,"iter":0},{"op":"compute_inline","stage":0},{"op":"compute_root","stage":0},{"op":"cache_write","stage":0,"scope":"Local"},{"op":"cache_read","stage":0,"scope":"Shared","readers":[1]},{"op":"annotate","stage":0,"iter":0,"annotation":"parallel"},{"op":"annotate","stage":0,"iter":1,"annotation":{"vectorize_up_to":16}},{"op":"annotate","stage":0,"iter":0,"annotation":{"bind":"ThreadX"}},{"op":"rfactor","stage":0,"iter":2},{"op":"reorder_storage","stage":0,"order":[1,0]},{"op":"auto_unroll","stage":0,"iter":0,"max_step":16}],"sketch":{"name":"SSRSRS","decisions":[[2,4],[1]]}}"#;

const TOKENS: &[&str] = &[
    "\"op\":",
    "\"stage\":",
    "\"iter\":",
    "\"factors\":",
    "\"order\":",
    "\"steps\":",
    "\"split\"",
    "\"fuse\"",
    "\"rfactor\"",
    "\"cache_read\"",
    "\"compute_at\"",
    "\"local\"",
    "\"shared\"",
    "\"global\"",
    "\"vectorize\"",
    "\"unroll\"",
    "\"parallel\"",
    "\"sketch\":",
    "{\"op\":\"compute_inline\",\"stage\":1},",
    "{\"op\":\"split\",\"stage\":0,\"iter\":0,\"factors\":[0]},",
];

/// How far the inputs got: parsed, replayed, lowered.
#[derive(Default)]
struct Reached {
    parsed: Cell<usize>,
    replayed: Cell<usize>,
    lowered: Cell<usize>,
}

fn bump(counter: &Cell<usize>) {
    counter.set(counter.get() + 1);
}

/// One input on `dag`: see the module doc.
fn check(dag: &ComputeDag, bytes: &[u8], reached: &Reached) -> Result<(), String> {
    let text = String::from_utf8_lossy(bytes);
    let trace = match Trace::from_json(&text) {
        Ok(trace) => trace,
        Err(e) => return one_line(&e),
    };
    bump(&reached.parsed);
    let json = trace.to_json();
    match Trace::from_json(&json) {
        Ok(again) if again == trace => {}
        Ok(_) => return Err(format!("{json} re-parses to another trace")),
        Err(e) => return Err(format!("{json} does not re-parse: {e}")),
    }
    let state = match trace.replay(dag) {
        Ok(state) => state,
        Err(e) => return one_line(&e),
    };
    bump(&reached.replayed);
    let again = trace
        .replay(dag)
        .map_err(|e| format!("the second replay failed: {e}"))?;
    if again.to_string() != state.to_string() {
        return Err("two replays gave different states".into());
    }
    match lower(&state) {
        Ok(f) => {
            bump(&reached.lowered);
            verify(&f).map_err(|e| format!("lowered IR fails the verifier: {e}"))
        }
        Err(e) => one_line(&e),
    }
}

#[test]
fn mutated_traces_parse_replay_and_lower_or_fail_with_one_line() {
    let reached = Reached::default();
    for (i, spec) in SPECS.iter().enumerate() {
        let dag = WorkloadSpec::parse(spec)
            .and_then(|w| w.build())
            .expect("a library spec builds");
        let mut seeds: Vec<String> = (0..SEEDS_PER_SPEC)
            .map(|seed| random_state(&dag, seed, 12, false).trace().to_json())
            .collect();
        seeds.push(FULL_TRACE.to_string());
        seeds.push("{\"steps\":[]}".to_string());
        let seeds: Vec<&[u8]> = seeds.iter().map(|s| s.as_bytes()).collect();
        Campaign::new(&format!("traces on {spec}"), &seeds)
            .json()
            .tokens(TOKENS)
            .inputs(INPUTS_PER_SPEC)
            .seed(i as u64)
            .run(|bytes| check(&dag, bytes, &reached));
    }
    // The checks behind the syntax ran on many inputs, not only on the seeds.
    let (parsed, replayed, lowered) = (
        reached.parsed.get(),
        reached.replayed.get(),
        reached.lowered.get(),
    );
    eprintln!("{parsed} traces parsed, {replayed} replayed, {lowered} lowered");
    assert!(
        parsed > 2_000 && replayed > 1_000 && lowered > 500,
        "{parsed} traces parsed, {replayed} replayed, {lowered} lowered"
    );
}
