//! matmul 512³ f32 on one thread: a hand-written schedule (register-tiled accumulator,
//! vectorized inner loop, unrolled rows, contiguous B row segments) against the default
//! schedule and ndarray's `.dot()` (matrixmultiply), then a side-by-side summary that also
//! runs numpy/OpenBLAS (`benches/numpy_baseline.py`, if python3 and numpy are there) and
//! the hand schedule compiled for 256-bit vectors, and prints GFLOP/s and ratios.
//!
//! Run pinned to one core, as docs/benchmarks.md asks:
//! `taskset -c 1 cargo bench --bench matmul` (summary only: `-- --summary-only`).

#[path = "hand/mod.rs"]
mod hand;

use criterion::Criterion;
use ndarray::Array2;
use std::process::Command;
use std::time::{Duration, Instant};
use tensortune::codegen::CodegenOptions;
use tensortune::measure::{random_inputs, time_kernel, MeasureOptions};
use tensortune::runtime::{AlignedBuffer, Runtime};
use tensortune::Kernel;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;

const SPEC: &str = "matmul:M=512,N=512,K=512";

struct Case {
    kernel: Kernel,
    ins: Vec<AlignedBuffer>,
    outs: Vec<AlignedBuffer>,
}

impl Case {
    fn new(state: &State, opts: &CodegenOptions) -> Case {
        let dag = WorkloadSpec::parse(SPEC)
            .expect("spec")
            .build()
            .expect("dag");
        let kernel = Kernel::from_state(state, opts).expect("compiles");
        let ins = random_inputs(&dag, 0)
            .expect("inputs")
            .iter()
            .map(|x| AlignedBuffer::from_nd(x).expect("buffer"))
            .collect();
        let outs = kernel
            .outputs()
            .map(|p| AlignedBuffer::zeros(&p.shape, p.dtype).expect("buffer"))
            .collect();
        Case { kernel, ins, outs }
    }

    fn run(&mut self, rt: &Runtime) {
        let ins: Vec<&AlignedBuffer> = self.ins.iter().collect();
        let mut outs: Vec<&mut AlignedBuffer> = self.outs.iter_mut().collect();
        self.kernel.run(rt, &ins, &mut outs).expect("runs");
    }

    /// Median seconds per run (timings of at least `min_ms`).
    fn time(&mut self, rt: &Runtime, min_ms: f64) -> f64 {
        let opts = MeasureOptions {
            repeat: 3,
            min_repeat_ms: min_ms,
            ..MeasureOptions::default()
        };
        let ins: Vec<&AlignedBuffer> = self.ins.iter().collect();
        let mut outs: Vec<&mut AlignedBuffer> = self.outs.iter_mut().collect();
        time_kernel(&self.kernel, rt, &ins, &mut outs, &opts)
            .expect("times")
            .median_s
    }
}

fn states() -> (State, State) {
    let dag = WorkloadSpec::parse(SPEC)
        .expect("spec")
        .build()
        .expect("dag");
    let hand = hand::matmul_register_tiled(&dag, 8, 32).expect("hand schedule applies");
    (hand, State::new(&dag))
}

fn operands() -> (Array2<f32>, Array2<f32>) {
    let a = Array2::from_shape_fn((512, 512), |(i, j)| {
        ((i * 7 + j * 3) % 17) as f32 / 17.0 - 0.5
    });
    let b = Array2::from_shape_fn((512, 512), |(i, j)| {
        ((i * 5 + j * 11) % 13) as f32 / 13.0 - 0.5
    });
    (a, b)
}

fn dot_time(a: &Array2<f32>, b: &Array2<f32>, min_ms: f64) -> f64 {
    let mut best = Vec::new();
    for _ in 0..3 {
        let mut n = 0u32;
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() * 1e3 < min_ms {
            std::hint::black_box(a.dot(b));
            n += 1;
        }
        best.push(t0.elapsed().as_secs_f64() / n as f64);
    }
    best.sort_by(|x, y| x.total_cmp(y));
    best[1]
}

fn bench(c: &mut Criterion) {
    let rt = Runtime::serial();
    let (hand, default) = states();
    let mut g = c.benchmark_group("matmul_512_f32_1thread");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let mut h = Case::new(&hand, &CodegenOptions::default());
    g.bench_function("tensortune_hand", |bch| bch.iter(|| h.run(&rt)));
    let mut d = Case::new(&default, &CodegenOptions::default());
    g.bench_function("tensortune_default", |bch| bch.iter(|| d.run(&rt)));
    let (a, b) = operands();
    g.bench_function("ndarray_dot", |bch| {
        bch.iter(|| std::hint::black_box(a.dot(&b)))
    });
    g.finish();
}

/// numpy's single-thread GFLOP/s, if python3 with numpy can run the baseline script.
fn numpy_gflops() -> Option<f64> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/numpy_baseline.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(SPEC)
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .env("OPENBLAS_NUM_THREADS", "1")
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["gflops"].as_f64()
}

fn summary() {
    let flops = 2.0 * 512f64.powi(3);
    let rt = Runtime::serial();
    let (hand, default) = states();
    let mut h = Case::new(&hand, &CodegenOptions::default());
    let narrow = CodegenOptions {
        vector_bits: Some(256),
        ..CodegenOptions::default()
    };
    let mut h256 = Case::new(&hand, &narrow);
    let mut d = Case::new(&default, &CodegenOptions::default());
    let (a, b) = operands();
    // Interleave the sides (A B A B ...) and keep each side's best round median.
    let mut t = [f64::INFINITY; 4];
    let mut np = f64::NAN;
    for round in 0..3 {
        t[0] = t[0].min(h.time(&rt, 200.0));
        t[1] = t[1].min(h256.time(&rt, 200.0));
        t[2] = t[2].min(dot_time(&a, &b, 200.0));
        if round == 0 {
            t[3] = d.time(&rt, 200.0);
        }
        if let Some(g) = numpy_gflops() {
            np = if np.is_nan() { g } else { np.max(g) };
        }
    }
    let gf: Vec<f64> = t.iter().map(|s| flops / s / 1e9).collect();
    println!(
        "\nmatmul 512^3 f32, one thread ({})",
        tensortune::codegen::HostTarget::host().key(1)
    );
    println!("  tensortune hand schedule   {:8.1} GFLOP/s", gf[0]);
    println!(
        "  same, 256-bit vectors      {:8.1} GFLOP/s  (512-bit is {:.2}x)",
        gf[1],
        gf[0] / gf[1]
    );
    println!("  ndarray .dot()             {:8.1} GFLOP/s", gf[2]);
    println!("  tensortune default         {:8.1} GFLOP/s", gf[3]);
    if np.is_nan() {
        println!("  numpy/OpenBLAS             (python3 with numpy not found)");
    } else {
        println!("  numpy/OpenBLAS             {np:8.1} GFLOP/s");
        println!("  hand / numpy               {:8.2}", gf[0] / np);
    }
    println!("  hand / ndarray             {:8.2}", gf[0] / gf[2]);
    println!("  hand / default             {:8.1}", gf[0] / gf[3]);
}

fn main() {
    let summary_only = std::env::args().any(|a| a == "--summary-only");
    if !summary_only {
        let mut c = Criterion::default().configure_from_args();
        bench(&mut c);
        c.final_summary();
    }
    summary();
}
