//! Three dense+bias+relu layers of an MLP tuned together: the task scheduler spends the trials
//! where they cut the total latency most. `-- --trials 512` for a real budget.

#[path = "common/args.rs"]
mod common_args;

use tensortune::schedules::ops::WorkloadSpec;
use tensortune::{tune_dags, Target, TuneOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials = common_args::arg("--trials", 48usize);
    let layers = [
        "dense_bias_relu:M=64,N=512,K=784",
        "dense_bias_relu:M=64,N=256,K=512",
        "dense_bias_relu:M=64,N=16,K=256",
    ];
    let mut tasks = Vec::new();
    for l in layers {
        let w = WorkloadSpec::parse(l)?;
        tasks.push((w.canonical(), w.build()?, 1.0));
    }
    let opts = TuneOptions {
        trials,
        batch_size: 8,
        population: 256,
        db: Some(common_args::arg("--db", "mlp.db".to_string()).into()),
        ..TuneOptions::default()
    };
    let reports = tune_dags(tasks, &Target::host(1), &opts)?;
    let mut total = 0.0;
    for r in &reports {
        let l = r.best_latency_s.unwrap_or(f64::NAN);
        total += l;
        println!(
            "{}: {} trials, {:.3} ms, {:.1} GFLOP/s",
            r.workload,
            r.trials,
            l * 1e3,
            r.best_gflops.unwrap_or(0.0)
        );
    }
    println!("whole MLP: {:.3} ms per batch of 64", total * 1e3);
    Ok(())
}
