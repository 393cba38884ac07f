//! Tune one ResNet-50 layer (3x3 conv, 64 channels, 56x56) and compare with its default
//! schedule. `-- --trials 256` for a real budget.

#[path = "common/args.rs"]
mod common_args;

use tensortune::measure::{CpuMeasurer, MeasureOptions};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::{tune, Kernel, Target, TuneOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials = common_args::arg("--trials", 24usize);
    let spec_text: String = common_args::arg(
        "--workload",
        "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1".to_string(),
    );
    let spec = WorkloadSpec::parse(&spec_text)?;
    let opts = TuneOptions {
        trials,
        batch_size: 12,
        population: 256,
        db: Some(common_args::arg("--db", "conv2d.db".to_string()).into()),
        ..TuneOptions::default()
    };
    let report = tune(&spec, &Target::host(1), &opts)?;
    let dag = spec.build()?;
    // The untuned program, measured the same way.
    let mut m = CpuMeasurer::new(MeasureOptions::default());
    let default = Kernel::from_state(
        &tensortune::build::default_cpu_state(&dag, 1),
        &Default::default(),
    )?;
    let d = m
        .measure_kernels(&dag, &[default])
        .pop()
        .ok_or("no result")??;
    let flops = spec.flops();
    let tuned = report.best_gflops.unwrap_or(0.0);
    let untuned = flops / d.median_s / 1e9;
    println!(
        "{}: tuned {tuned:.1} GFLOP/s, default schedule {untuned:.2} GFLOP/s ({:.1}x), {} trials",
        report.workload,
        tuned / untuned,
        report.trials
    );
    Ok(())
}
