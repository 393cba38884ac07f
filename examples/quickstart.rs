//! Tune a matmul on this CPU, run the best kernel, and check it against ndarray.
//!
//! `cargo run --release --example quickstart -- --trials 256` for a real budget.

#[path = "common/args.rs"]
mod common_args;

use ndarray::Array2;
use tensortune::runtime::Runtime;
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::{tune, Kernel, Target, TuneOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials = common_args::arg("--trials", 32usize);
    let db: String = common_args::arg("--db", "quickstart.db".to_string());
    let spec = WorkloadSpec::parse("matmul:M=256,N=256,K=256")?;
    let opts = TuneOptions {
        trials,
        batch_size: 16,
        population: 512,
        db: Some(db.clone().into()),
        ..TuneOptions::default()
    };
    let report = tune(&spec, &Target::host(1), &opts)?;
    println!(
        "{}: {:.1} GFLOP/s after {} trials ({} failed); records in {db}",
        report.workload,
        report.best_gflops.unwrap_or(0.0),
        report.trials,
        report.errors
    );

    // Run the best schedule on our own data and compare with ndarray.
    let dag = spec.build()?;
    let state = report
        .best_state(&dag)
        .ok_or("no valid program was found")?;
    let kernel = Kernel::from_state(&state, &Default::default())?;
    let rt = Runtime::new(1)?;
    let a = Array2::from_shape_vec((256, 256), common_args::values(256 * 256, 1))?;
    let b = Array2::from_shape_vec((256, 256), common_args::values(256 * 256, 2))?;
    let out = kernel.run_arrays(&rt, &[a.view().into_dyn(), b.view().into_dyn()])?;
    let want = a.dot(&b);
    let diff = out[0]
        .iter()
        .zip(want.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    println!("largest difference to ndarray: {diff:.2e}");
    if diff > 1e-2 {
        return Err(format!("tuned kernel disagrees with ndarray by {diff}").into());
    }
    Ok(())
}
