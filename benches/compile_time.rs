//! Compile time per candidate: lowering plus LLVM codegen (O3 and machine code) of a tiled
//! matmul and of the default schedule, the work a measurer does for every candidate.

#[path = "hand/mod.rs"]
mod hand;

use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Duration;
use tensortune::Kernel;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;

fn compile_time(c: &mut Criterion) {
    let dag = WorkloadSpec::parse("matmul:M=512,N=512,K=512")
        .expect("spec")
        .build()
        .expect("dag");
    let tiled = hand::matmul_register_tiled(&dag, 8, 32).expect("hand schedule applies");
    let default = State::new(&dag);
    let mut g = c.benchmark_group("compile_per_candidate");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    g.bench_function("matmul_512_tiled", |b| {
        b.iter(|| Kernel::from_state(&tiled, &Default::default()).expect("compiles"))
    });
    g.bench_function("matmul_512_default", |b| {
        b.iter(|| Kernel::from_state(&default, &Default::default()).expect("compiles"))
    });
    g.finish();
}

criterion_group!(benches, compile_time);
criterion_main!(benches);
