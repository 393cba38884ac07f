//! Prints a random schedule of a workload, lowered, and the non-zero features of each store:
//! what the cost model sees of it.
//!
//! `cargo run -p tensortune-cost-model --example show_features -- "matmul:M=64,N=64,K=64" 3`

use tensortune_cost_model::{ProgramFeatures, FEATURE_NAMES};
use tensortune_schedules::{lower::lower, ops::WorkloadSpec, random::random_state};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("matmul:M=64,N=64,K=64");
    let seed: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(0);
    let dag = WorkloadSpec::parse(spec)?.build()?;
    let func = lower(&random_state(&dag, seed, 16, false))?;
    println!("{func}");
    let f = ProgramFeatures::extract(&func);
    for r in 0..f.num_rows() {
        println!("store {r}:");
        for (name, v) in FEATURE_NAMES.iter().zip(f.row(r).unwrap_or(&[])) {
            if *v != 0.0 {
                println!("  {name:<28} {v:8.3}");
            }
        }
    }
    Ok(())
}
