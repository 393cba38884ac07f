//! Feature extraction and prediction over a search round's worth of programs.
//!
//! A search round ranks thousands of candidates: lowering them, extracting their features
//! and predicting must stay small beside measuring a few dozen of them (milliseconds each).
//! `cargo bench -p tensortune-cost-model --bench cost_model_features`; the per-program time
//! is the reported time divided by the number of programs (printed first).

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use tensortune_cost_model::{CostModel, GbdtModel, GbdtOptions, ProgramFeatures, Sample};
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::{lower::lower, ops::WorkloadSpec, random::random_state};

const PROGRAMS: u64 = 1000;

fn programs() -> Vec<LoweredFunc> {
    let mut out = Vec::new();
    for spec in [
        "matmul:M=512,N=512,K=512",
        "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1",
    ] {
        let dag = WorkloadSpec::parse(spec)
            .and_then(|s| s.build())
            .expect("the op library builds its own workloads");
        for seed in 0..PROGRAMS / 2 {
            if let Ok(f) = lower(&random_state(&dag, seed, 16, false)) {
                out.push(f);
            }
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let funcs = programs();
    let stores: usize = funcs
        .iter()
        .map(|f| ProgramFeatures::extract(f).num_rows())
        .sum();
    println!("{} programs, {stores} stores", funcs.len());
    c.bench_function("extract features of 1000 programs", |b| {
        b.iter(|| {
            for f in &funcs {
                black_box(ProgramFeatures::extract(black_box(f)));
            }
        })
    });
    let features: Vec<ProgramFeatures> = funcs.iter().map(ProgramFeatures::extract).collect();
    // A model trained on the programs with made-up throughputs: prediction cost does not
    // depend on what the trees learned, only on their number and depth.
    let samples: Vec<Sample> = features
        .iter()
        .enumerate()
        .map(|(i, f)| Sample {
            features: f.clone(),
            workload: if i < funcs.len() / 2 { "a" } else { "b" }.into(),
            throughput: 1e9 * ((i * 7919) % 1000) as f64,
        })
        .collect();
    let mut model = GbdtModel::new(GbdtOptions::default()).expect("default options are valid");
    model.update(&samples).expect("valid samples");
    c.bench_function("predict 1000 programs", |b| {
        b.iter(|| black_box(model.predict(black_box(&features)).expect("trained model")))
    });
    c.bench_function("train on 1000 programs", |b| {
        b.iter(|| {
            let mut m = GbdtModel::new(GbdtOptions::default()).expect("valid options");
            m.update(black_box(&samples)).expect("valid samples");
            black_box(m.is_trained())
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
