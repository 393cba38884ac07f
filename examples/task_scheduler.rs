//! The task scheduler against round-robin, on the three dense+bias+relu layers of an MLP.
//!
//! Each policy tunes the three layers together with the same trial budget and seed, into a
//! database of its own. Then the example prints, per run:
//! - the trials each layer received;
//! - the total latency of the MLP (the sum of the layers' best latencies, each layer run once)
//!   as tuning saw it after a quarter, half, three quarters and all of the budget;
//! - that total re-measured at the end, every run's best programs side by side, interleaved
//!   over three rounds (the figure to compare: tuning-time minima favour lucky timings).
//!
//! `taskset -c 1 cargo run --release --example task_scheduler -- --trials 192 --seeds 2`
//! (about 40 s per run and policy on one core; `--out DIR` keeps the databases, by default
//! in a temporary folder).

#[path = "common/args.rs"]
mod common_args;

use std::collections::HashMap;
use std::path::PathBuf;
use tensortune::measure::{CpuMeasurer, MeasureOptions};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::{tune_dags, Kernel, Target, TuneOptions};
use tensortune_records::Database;
use tensortune_tuner::scheduler::Policy;

const LAYERS: [&str; 3] = [
    "dense_bias_relu:M=64,N=512,K=784",
    "dense_bias_relu:M=64,N=256,K=512",
    "dense_bias_relu:M=64,N=16,K=256",
];

/// One tuning run of the three layers.
struct Run {
    policy: Policy,
    seed: u64,
    db: PathBuf,
}

/// Total latency (seconds) of the MLP after each trial of a run, in the order measured:
/// `None` until every layer has a measured program.
fn curve(db: &Database, keys: &[String], target: &str) -> Result<Vec<Option<f64>>, String> {
    let mut all = Vec::new();
    for k in keys {
        for r in db.records(k, target).map_err(|e| e.to_string())? {
            all.push((r.id.0, k.clone(), r.outcome.timing().map(|t| t.median_s)));
        }
    }
    all.sort_by_key(|r| r.0);
    let mut best: HashMap<String, f64> = HashMap::new();
    Ok(all
        .into_iter()
        .map(|(_, k, t)| {
            if let Some(t) = t {
                let b = best.entry(k).or_insert(f64::INFINITY);
                *b = b.min(t);
            }
            (best.len() == keys.len()).then(|| best.values().sum())
        })
        .collect())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials = common_args::arg("--trials", 192usize);
    let seeds = common_args::arg("--seeds", 2u64);
    let out = common_args::arg("--out", String::new());
    let dir = if out.is_empty() {
        std::env::temp_dir().join(format!("tensortune-scheduler-{}", std::process::id()))
    } else {
        PathBuf::from(out)
    };
    std::fs::create_dir_all(&dir)?;
    let target = Target::host(1);
    let mut specs = Vec::new();
    let mut keys = Vec::new();
    for l in LAYERS {
        let w = WorkloadSpec::parse(l)?;
        keys.push(w.canonical());
        specs.push(w);
    }

    let mut runs = Vec::new();
    for seed in 0..seeds {
        for policy in Policy::ALL {
            let db = dir.join(format!("{}-{seed}.db", policy.name()));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
            }
            let tasks = specs
                .iter()
                .map(|w| Ok((w.canonical(), w.build()?, 1.0)))
                .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
            let opts = TuneOptions {
                trials,
                batch_size: 16,
                population: 256,
                seed,
                quiet: true,
                remeasure_top: 0,
                task_scheduler: policy,
                db: Some(db.clone()),
                ..TuneOptions::default()
            };
            eprintln!("tuning: {} seed {seed}", policy.name());
            tune_dags(tasks, &target, &opts)?;
            runs.push(Run { policy, seed, db });
        }
    }

    // Every run's best program per layer, compiled once, then timed in interleaved rounds.
    let mut kernels: Vec<Vec<Kernel>> = Vec::new();
    for r in &runs {
        let db = Database::open_read_only(&r.db)?;
        let mut ks = Vec::new();
        for w in &specs {
            ks.push(Kernel::from_records(&db, w, &target)?);
        }
        kernels.push(ks);
    }
    let dags = specs
        .iter()
        .map(|w| w.build())
        .collect::<Result<Vec<_>, _>>()?;
    let mut measurer = CpuMeasurer::new(MeasureOptions::default());
    let mut times: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); specs.len()]; runs.len()];
    for _round in 0..3 {
        for (ri, ks) in kernels.iter().enumerate() {
            for (li, k) in ks.iter().enumerate() {
                let r = measurer.measure_kernels(&dags[li], std::slice::from_ref(k));
                if let Some(Ok(t)) = r.into_iter().next() {
                    times[ri][li].push(t.median_s);
                }
            }
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };

    let marks = [trials / 4, trials / 2, 3 * trials / 4, trials];
    println!(
        "MLP of {} layers, {trials} trials per run; total latency in ms (the layers' best, summed)",
        LAYERS.len()
    );
    println!(
        "{:<12} {:>4} {:>14} {:>8} {:>8} {:>8} {:>8} {:>12}",
        "policy", "seed", "trials/layer", "@25%", "@50%", "@75%", "@100%", "re-measured"
    );
    let target_key = target.key();
    for (ri, r) in runs.iter().enumerate() {
        let db = Database::open_read_only(&r.db)?;
        let c = curve(&db, &keys, &target_key)?;
        let per_layer: Vec<String> = keys
            .iter()
            .map(|k| db.records(k, &target_key).map(|v| v.len().to_string()))
            .collect::<Result<_, _>>()?;
        let at = |m: usize| {
            c.get(m.saturating_sub(1))
                .copied()
                .flatten()
                .map(|s| format!("{:.3}", s * 1e3))
                .unwrap_or_else(|| "-".into())
        };
        let remeasured: f64 = times[ri].iter().map(|v| median(v)).sum();
        println!(
            "{:<12} {:>4} {:>14} {:>8} {:>8} {:>8} {:>8} {:>12.3}",
            r.policy.name(),
            r.seed,
            per_layer.join("/"),
            at(marks[0]),
            at(marks[1]),
            at(marks[2]),
            at(marks[3]),
            remeasured * 1e3
        );
    }
    println!("databases: {}", dir.display());
    Ok(())
}
