//! The CPU goals of issue 22 in one run: this machine's FMA peak and bandwidth (the probe),
//! then each goal workload tuned from scratch, its best figure as a fraction of the probe's
//! figure measured in the same run, and numpy's figure for the ops numpy has.
//!
//! ```text
//! cargo bench --bench cpu_goals                  # every row, 256 trials each (hours)
//! CPU_GOALS_TRIALS=64 CPU_GOALS_ONLY=matmul1024,softmax cargo bench --bench cpu_goals
//! ```
//!
//! Environment: `CPU_GOALS_TRIALS` (256), `CPU_GOALS_ONLY` (a comma list of row names),
//! `CPU_GOALS_SEED` (0), `CPU_GOALS_THREADS` (the multi-thread rows; default every core).
//! Run it on an otherwise idle machine and unpinned: the one-thread rows use one thread, the
//! others `CPU_GOALS_THREADS`. numpy runs with `OPENBLAS_CORETYPE`/`OPENBLAS_L2_SIZE` unset
//! and `OPENBLAS_NUM_THREADS` set to the row's threads (skipped where python3 or numpy is
//! missing). Prints a markdown table; the figures quoted are in docs/measurements.md.

use std::process::Command;
use std::time::Instant;
use tensortune::probe::{probe, ProbeOptions, ProbeReport};
use tensortune::{tune, Target, TuneOptions, WorkloadSpec};

/// A row: its name, the workload, whether it runs on every core, whether it is memory-bound.
struct Row {
    name: &'static str,
    spec: &'static str,
    all_threads: bool,
}

const ROWS: &[Row] = &[
    Row {
        name: "matmul1024",
        spec: "matmul:M=1024,N=1024,K=1024",
        all_threads: false,
    },
    Row {
        name: "matmul1024-bf16",
        spec: "matmul:M=1024,N=1024,K=1024,dtype=bf16",
        all_threads: false,
    },
    Row {
        name: "matmul2048",
        spec: "matmul:M=2048,N=2048,K=2048",
        all_threads: false,
    },
    Row {
        name: "conv56",
        spec: "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1",
        all_threads: false,
    },
    Row {
        name: "conv28",
        spec: "conv2d:N=1,C=128,H=28,W=28,K=128,R=3,S=3,stride=1,pad=1",
        all_threads: false,
    },
    Row {
        name: "conv1x1",
        spec: "conv2d:N=1,C=256,H=56,W=56,K=64,R=1,S=1,stride=1,pad=0",
        all_threads: false,
    },
    Row {
        name: "matmul2048-all",
        spec: "matmul:M=2048,N=2048,K=2048",
        all_threads: true,
    },
    Row {
        name: "softmax",
        spec: "softmax:M=4096,N=4096",
        all_threads: false,
    },
    Row {
        name: "reduce_sum",
        spec: "reduce_sum:M=4096,N=4096",
        all_threads: false,
    },
    Row {
        name: "depthwise",
        spec: "depthwise_conv2d:N=1,C=256,H=56,W=56,R=3,S=3,stride=1,pad=1",
        all_threads: false,
    },
    Row {
        name: "gemv",
        spec: "dense_bias_relu:M=1,N=4096,K=4096",
        all_threads: false,
    },
];

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("cpu_goals: {name}={v} is not a count");
            std::process::exit(2)
        }),
        Err(_) => default,
    }
}

/// Whether `python3` can import numpy: checked once, so that a machine without it gets one
/// line instead of a traceback per row.
fn numpy_available() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// numpy's GFLOP/s and GB/s of `spec` on `threads` threads, where numpy has the op.
fn numpy(spec: &str, threads: usize) -> Option<(f64, Option<f64>)> {
    let op = spec.split(':').next()?;
    // numpy has no bf16 arithmetic.
    if !matches!(op, "matmul" | "softmax" | "reduce_sum") || spec.contains("dtype=bf16") {
        return None;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/numpy_baseline.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(spec)
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .env("OPENBLAS_NUM_THREADS", threads.to_string())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "cpu_goals: numpy on {spec}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v["gflops"].as_f64()?, v["gbs"].as_f64()))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing to run: a smoke
    // check that the bench starts is all that is wanted there.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let trials = env_usize("CPU_GOALS_TRIALS", 256);
    let seed = env_usize("CPU_GOALS_SEED", 0) as u64;
    let all = env_usize(
        "CPU_GOALS_THREADS",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let only: Option<Vec<String>> = std::env::var("CPU_GOALS_ONLY")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let p: ProbeReport = match probe(&ProbeOptions {
        threads: all,
        ..ProbeOptions::default()
    }) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cpu_goals: probe: {e}");
            std::process::exit(1)
        }
    };
    println!(
        "probe: {} ({}), FMA peak {:.1} GFLOP/s on 1 thread, {:.1} on {all}; bandwidth (best of copy and triad) {:.1} GB/s on 1 thread, {:.1} on {all}; read-only {:.1} GB/s on 1 thread, {:.1} on {all}; parallel loop {:.2} µs",
        p.cpu,
        p.isa,
        p.fma_gflops_1t,
        p.fma_gflops_all,
        p.bandwidth_gbs_1t(),
        p.bandwidth_gbs_all(),
        p.read_gbs_1t,
        p.read_gbs_all,
        p.parallel_loop_us
    );
    if let Some(dot) = p.bf16_dot_gflops_1t {
        println!(
            "probe: bf16 dot-product peak {dot:.1} GFLOP/s on 1 thread ({:.2}x the FMA peak)",
            dot / p.fma_gflops_1t.max(1e-9)
        );
    }
    let have_numpy = numpy_available();
    if !have_numpy {
        println!("numpy: python3 with numpy not found; the numpy columns stay empty");
    }
    println!();
    println!("| row | workload | threads | trials | tuning s | GFLOP/s | GB/s | of probe | of copy | numpy | × numpy |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut one_thread_2048: Option<f64> = None;
    let mut f32_1024: Option<f64> = None;
    for row in ROWS {
        if let Some(only) = &only {
            if !only.iter().any(|o| o == row.name) {
                continue;
            }
        }
        let threads = if row.all_threads { all } else { 1 };
        let spec = match WorkloadSpec::parse(row.spec) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("cpu_goals: {}: {e}", row.spec);
                continue;
            }
        };
        let opts = TuneOptions {
            trials,
            seed,
            quiet: true,
            ..TuneOptions::default()
        };
        let t = Instant::now();
        let r = match tune(&spec, &Target::host(threads), &opts) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cpu_goals: tuning {}: {e}", row.spec);
                continue;
            }
        };
        let secs = t.elapsed().as_secs_f64();
        let (Some(gflops), Some(gbs)) = (r.best_gflops, r.best_gbs) else {
            println!(
                "| {} | {} | {threads} | {} | {secs:.0} | no valid program | | | | | |",
                row.name, row.spec, r.trials
            );
            continue;
        };
        // A memory-bound op against the bandwidth of its mix of reads and writes (an op that
        // only reads against the read-only pass), and beside it against copy/triad alone; a
        // compute-bound one against the FMA peak.
        let written = r.min_written_bytes;
        let read = r.min_bytes - written;
        let (fraction, of_copy) = match (r.memory_bound(), threads) {
            (true, 1) => (
                gbs / p.bandwidth_gbs_for(read, written, false),
                format!("{:.2}", gbs / p.bandwidth_gbs_1t()),
            ),
            (true, _) => (
                gbs / p.bandwidth_gbs_for(read, written, true),
                format!("{:.2}", gbs / p.bandwidth_gbs_all()),
            ),
            (false, 1) => (gflops / p.fma_gflops_1t, String::new()),
            (false, _) => (gflops / p.fma_gflops_all, String::new()),
        };
        let np = if have_numpy {
            numpy(row.spec, threads)
        } else {
            None
        };
        let (np_text, ratio) = match np {
            Some((_, Some(b))) if r.memory_bound() => (format!("{b:.1} GB/s"), gbs / b),
            Some((g, _)) => (format!("{g:.1} GFLOP/s"), gflops / g),
            None => ("".to_string(), f64::NAN),
        };
        println!(
            "| {} | {} | {threads} | {} | {secs:.0} | {gflops:.1} | {gbs:.1} | {fraction:.2} | {of_copy} | {np_text} | {} |",
            row.name,
            row.spec,
            r.trials,
            if ratio.is_nan() { String::new() } else { format!("{ratio:.2}") }
        );
        if row.name == "matmul1024" {
            f32_1024 = Some(gflops);
        }
        if row.name == "matmul1024-bf16" {
            // bf16 pairs run two products per f32 lane: the FMA peak is not this row's ceiling,
            // the probe's bf16 dot-product peak is (where the CPU has one).
            if let Some(f) = f32_1024 {
                println!(
                    "|  | bf16 inputs / f32 = {:.2} |  |  |  |  |  |  |  |  |  |",
                    gflops / f
                );
            }
            if let Some(dot) = p.bf16_dot_gflops_1t {
                println!(
                    "|  | of the bf16 dot-product peak ({dot:.1} GFLOP/s) = {:.2} |  |  |  |  |  |  |  |  |  |",
                    gflops / dot
                );
            }
        }
        if row.name == "matmul2048" {
            one_thread_2048 = Some(gflops);
        }
        if row.name == "matmul2048-all" {
            if let Some(one) = one_thread_2048 {
                println!(
                    "|  | scaling: {threads} threads / 1 thread = {:.2} |  |  |  |  |  |  |  |  |  |",
                    gflops / one
                );
            }
        }
    }
}
