//! Measure candidate schedules of a workload on this CPU, as the tuner does: the default
//! schedule, a hand-written register-tiled one (for matmul), and a few random ones.
//!
//! `cargo run --release --example measure_candidates -- matmul:M=512,N=512,K=512`

#[path = "../benches/hand/mod.rs"]
mod hand;

use tensortune::measure::{CpuMeasurer, MeasureOptions};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::random::random_state;
use tensortune_schedules::schedule::State;
use tensortune_tuner::measure::Measurer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "matmul:M=512,N=512,K=512".into());
    let w = WorkloadSpec::parse(&spec)?;
    let dag = w.build()?;
    let mut names = vec!["default".to_string()];
    let mut states = vec![State::new(&dag)];
    if w.op_name() == "matmul" {
        if let Ok(s) = hand::matmul_register_tiled(&dag, 8, 32) {
            names.push("hand 8x32".into());
            states.push(s);
        }
    }
    for seed in 0..4 {
        names.push(format!("random #{seed}"));
        states.push(random_state(&dag, seed, 12, false));
    }
    let mut m = CpuMeasurer::new(MeasureOptions {
        repeat: 3,
        min_repeat_ms: 50.0,
        ..MeasureOptions::default()
    });
    let t0 = std::time::Instant::now();
    let results = m.measure(&dag, &states);
    println!(
        "{} on {} ({:.1} s)",
        w.canonical(),
        m.target_key(),
        t0.elapsed().as_secs_f64()
    );
    for (name, r) in names.iter().zip(results) {
        match r {
            Ok(t) => println!(
                "  {name:<12} {:>10.3} ms  {:>7.1} GFLOP/s  (spread {:.1}%, {} runs per timing)",
                t.median_s * 1e3,
                w.flops() / t.median_s / 1e9,
                100.0 * t.spread_s / t.median_s,
                t.number
            ),
            Err(e) => println!("  {name:<12} {e}"),
        }
    }
    Ok(())
}
