//! Run a workload from an existing records database, without tuning: the best record for this
//! CPU, or the default schedule when there is none. Run `quickstart` first to make one.

#[path = "common/args.rs"]
mod common_args;

use tensortune::measure::{CpuMeasurer, MeasureOptions};
use tensortune::records::Database;
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::schedule::State;
use tensortune::schedules::trace::Trace;
use tensortune::{Kernel, Target};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db_path: String = common_args::arg("--db", "quickstart.db".to_string());
    let spec = WorkloadSpec::parse(&common_args::arg(
        "--workload",
        "matmul:M=256,N=256,K=256".to_string(),
    ))?;
    let dag = spec.build()?;
    let target = Target::host(1).key();
    let state = match Database::open_existing(&db_path)
        .ok()
        .and_then(|db| db.best(&spec.canonical(), &target).ok().flatten())
    {
        Some(r) => {
            println!(
                "using the best record of {db_path} ({:.1} GFLOP/s when measured)",
                r.gflops().unwrap_or(0.0)
            );
            Trace::from_json(&r.trace_json)?.replay(&dag)?
        }
        None => {
            println!(
                "no record for {} on this CPU in {db_path}: default schedule",
                spec.canonical()
            );
            State::new(&dag)
        }
    };
    let kernel = Kernel::from_state(&state, &Default::default())?;
    let t = CpuMeasurer::new(MeasureOptions::default())
        .measure_kernels(&dag, &[kernel])
        .pop()
        .ok_or("no result")??;
    println!(
        "{}: {:.3} ms, {:.1} GFLOP/s",
        spec.canonical(),
        t.median_s * 1e3,
        spec.flops() / t.median_s / 1e9
    );
    Ok(())
}
