//! matmul 512³ f32 on one thread: the tuned schedule against the default schedule (what an
//! untuned workload runs: `tensortune::build::default_cpu_state`) and
//! ndarray's `.dot()` (matrixmultiply), then a side-by-side summary of GFLOP/s and ratios
//! (the sides interleaved, A B C A B C ...).
//!
//! Where the tuned schedule comes from:
//! - `TENSORTUNE_BENCH_DB=tuning.db`: the best record of `matmul:M=512,N=512,K=512` on this
//!   CPU with one thread in that database (what `bash scripts/tune.sh` writes), if it has one;
//! - otherwise a short tuning run of 64 trials, done once before the benchmarks (about a
//!   minute; its records are not kept). 64 trials find a good schedule, not the best one:
//!   point the variable at a longer run's database for the figures worth quoting.
//!
//! What it showed is in docs/measurements.md ("Tuned matmul").
//!
//! Run pinned to one core, as docs/benchmarks.md asks:
//! `taskset -c 1 cargo bench --bench tuned_matmul` (summary only: `-- --summary-only`).

use criterion::Criterion;
use ndarray::Array2;
use std::time::{Duration, Instant};
use tensortune::measure::random_inputs;
use tensortune::records::Database;
use tensortune::runtime::{AlignedBuffer, Runtime};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::schedule::State;
use tensortune::schedules::trace::Trace;
use tensortune::schedules::ComputeDag;
use tensortune::{Kernel, Target, TuneOptions};

const SPEC: &str = "matmul:M=512,N=512,K=512";
/// The records database to take the tuned schedule from.
const DB_VAR: &str = "TENSORTUNE_BENCH_DB";
/// Trials of the tuning run when no database has a record.
const TRIALS: usize = 64;

/// A schedule compiled, with its operands allocated once: each call runs it once.
fn prepared<'a>(rt: &'a Runtime, dag: &ComputeDag, state: &State) -> impl FnMut() + 'a {
    let kernel = Kernel::from_state(state, &Default::default()).expect("compiles");
    let ins: Vec<AlignedBuffer> = random_inputs(dag, 0)
        .expect("inputs")
        .iter()
        .map(|x| AlignedBuffer::from_nd(x).expect("buffer"))
        .collect();
    let mut outs: Vec<AlignedBuffer> = kernel
        .outputs()
        .map(|p| AlignedBuffer::zeros(&p.shape, p.dtype).expect("buffer"))
        .collect();
    move || {
        let ins: Vec<&AlignedBuffer> = ins.iter().collect();
        let mut outs: Vec<&mut AlignedBuffer> = outs.iter_mut().collect();
        kernel.run(rt, &ins, &mut outs).expect("runs");
    }
}

/// The tuned schedule and where it came from.
fn tuned_state(spec: &WorkloadSpec, dag: &ComputeDag) -> (State, String) {
    let target = Target::host(1);
    if let Some(path) = std::env::var_os(DB_VAR) {
        let db = Database::open_existing(&path).expect("the database of TENSORTUNE_BENCH_DB");
        if let Some(best) = db.best(&spec.canonical(), &target.key()).expect("query") {
            let state = Trace::from_json(&best.trace_json)
                .expect("stored trace")
                .replay(dag)
                .expect("stored trace replays");
            let from = format!(
                "the best of {} records in {}",
                best_count(&db, spec),
                std::path::Path::new(&path).display()
            );
            return (state, from);
        }
        eprintln!(
            "{}: no record of {SPEC} for this CPU and one thread; tuning {TRIALS} trials",
            std::path::Path::new(&path).display()
        );
    }
    let opts = TuneOptions {
        trials: TRIALS,
        quiet: true,
        ..TuneOptions::default()
    };
    let t = Instant::now();
    let report = tensortune::tune(spec, &target, &opts).expect("tunes");
    let state = report.best_state(dag).expect("a schedule was found");
    let from = format!(
        "a {TRIALS}-trial tuning run of {:.0} s in this bench's setup",
        t.elapsed().as_secs_f64()
    );
    (state, from)
}

fn best_count(db: &Database, spec: &WorkloadSpec) -> usize {
    db.records(&spec.canonical(), &Target::host(1).key())
        .map_or(0, |r| r.len())
}

fn operands() -> (Array2<f32>, Array2<f32>) {
    let a = Array2::from_shape_fn((512, 512), |(i, j)| ((i * 7 + j * 3) % 17) as f32 / 17.0);
    let b = Array2::from_shape_fn((512, 512), |(i, j)| ((i * 5 + j * 11) % 13) as f32 / 13.0);
    (a, b)
}

/// Median seconds a call of three timings, each of as many calls as fill `min_ms`: the
/// same clock for all three sides.
fn seconds(mut f: impl FnMut(), min_ms: f64) -> f64 {
    let mut timings: Vec<f64> = (0..3)
        .map(|_| {
            let (mut n, t0) = (0u32, Instant::now());
            while t0.elapsed().as_secs_f64() * 1e3 < min_ms {
                f();
                n += 1;
            }
            t0.elapsed().as_secs_f64() / f64::from(n)
        })
        .collect();
    timings.sort_by(f64::total_cmp);
    timings[1]
}

fn main() {
    let spec = WorkloadSpec::parse(SPEC).expect("spec");
    let dag = spec.build().expect("dag");
    let (tuned, from) = tuned_state(&spec, &dag);
    let rt = Runtime::serial();
    let mut tuned = prepared(&rt, &dag, &tuned);
    let mut default = prepared(&rt, &dag, &tensortune::build::default_cpu_state(&dag, 1));
    let (a, b) = operands();
    let mut dot = || {
        std::hint::black_box(a.dot(&b));
    };

    if !std::env::args().any(|a| a == "--summary-only") {
        let mut c = Criterion::default().configure_from_args();
        let mut g = c.benchmark_group("tuned_matmul_512_f32_1thread");
        g.sample_size(10).measurement_time(Duration::from_secs(3));
        g.bench_function("tensortune_tuned", |bch| bch.iter(&mut tuned));
        g.bench_function("tensortune_default", |bch| bch.iter(&mut default));
        g.bench_function("ndarray_dot", |bch| bch.iter(&mut dot));
        g.finish();
        c.final_summary();
    }

    // Interleaved rounds; each side keeps its best round.
    let mut t = [f64::INFINITY; 3];
    for _ in 0..3 {
        t[0] = t[0].min(seconds(&mut tuned, 200.0));
        t[1] = t[1].min(seconds(&mut dot, 200.0));
        t[2] = t[2].min(seconds(&mut default, 200.0));
    }
    let gflops = t.map(|s| dag.flops() / s / 1e9);
    println!("\nmatmul 512^3 f32, one thread ({})", Target::host(1).key());
    println!("  tuned schedule from {from}");
    println!("  tensortune tuned      {:8.1} GFLOP/s", gflops[0]);
    println!("  ndarray .dot()        {:8.1} GFLOP/s", gflops[1]);
    println!("  tensortune default    {:8.1} GFLOP/s", gflops[2]);
    println!("  tuned / ndarray       {:8.2}", gflops[0] / gflops[1]);
    println!("  tuned / default       {:8.1}", gflops[0] / gflops[2]);
}
