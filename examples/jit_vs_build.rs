//! What tuning measures against what a build ships: one parallel matmul schedule timed as a
//! JIT kernel on [`Runtime`] and as the kernel of a program built by `tensortune::build`
//! (compiled by `rustc`, carrying the runtime as source), rounds of the two interleaved.
//! Prints the median time per call of each and their ratio.
//!
//! `taskset -c 0,1 cargo run --release --example jit_vs_build -- --threads 2 --rounds 5`
//! (`--workload SPEC` for another matmul). What it showed is in docs/measurements.md ("One
//! parallel runtime").

#[path = "common/args.rs"]
mod args;
#[path = "common/built_program.rs"]
mod built_program;

use std::process::Command;
use std::time::Instant;
use tensortune::measure::random_inputs;
use tensortune::runtime::{AlignedBuffer, Runtime};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::Kernel;

/// Calls timed per round on each side (after as many warm-up calls).
const CALLS: usize = 50;

/// Times `CALLS` calls after a warm-up and prints the median in seconds.
const MAIN: &str = r#"
include!(concat!(env!("OUT_DIR"), "/tuned.rs"));
fn main() {
    let calls: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(50);
    let sizes: Vec<usize> = std::env::args().skip(2).filter_map(|s| s.parse().ok()).collect();
    // Aligned, as the JIT's buffers are: the wrappers would copy other slices on each call.
    let a: Vec<f32> = (0..sizes[0]).map(|i| (i % 17) as f32 * 0.25 - 2.0).collect();
    let b: Vec<f32> = (0..sizes[1]).map(|i| (i % 13) as f32 * 0.5 - 3.0).collect();
    let (a, b) = (tuned::AlignedVec::from_slice(&a), tuned::AlignedVec::from_slice(&b));
    let mut c = tuned::AlignedVec::<f32>::zeros(sizes[2]);
    let mut times = Vec::with_capacity(calls);
    for round in 0..2 {
        for _ in 0..calls {
            let t = std::time::Instant::now();
            tuned::KERNEL(&a, &b, &mut c).expect("kernel");
            if round == 1 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
    }
    times.sort_by(f64::total_cmp);
    println!("{}", times[times.len() / 2]);
}
"#;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = args::arg("--threads", 2);
    let rounds: usize = args::arg("--rounds", 5).max(1);
    let workload: String = args::arg("--workload", "matmul:M=512,N=512,K=512".to_string());
    let spec = WorkloadSpec::parse(&workload)?;
    let dag = spec.build()?;
    let state = built_program::parallel_matmul(&spec)?;

    let kernel = Kernel::from_state(&state, &Default::default())?;
    let rt = Runtime::new(threads)?;
    let ins: Vec<AlignedBuffer> = random_inputs(&dag, 0)?
        .iter()
        .map(AlignedBuffer::from_nd)
        .collect::<Result<_, _>>()?;
    let mut outs: Vec<AlignedBuffer> = kernel
        .outputs()
        .map(|p| AlignedBuffer::zeros(&p.shape, p.dtype))
        .collect::<Result<_, _>>()?;
    let sizes: Vec<String> = kernel
        .inputs()
        .chain(kernel.outputs())
        .map(|p| p.shape.iter().product::<i64>().to_string())
        .collect();

    let dir = std::env::temp_dir().join(format!("tt-jit-vs-build-{}", std::process::id()));
    let exe = built_program::build_program(&dir, &spec, &state, threads, MAIN)?;

    let (mut jit, mut built) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut times = Vec::with_capacity(CALLS);
        for round in 0..2 {
            for _ in 0..CALLS {
                let ins: Vec<&AlignedBuffer> = ins.iter().collect();
                let mut outs: Vec<&mut AlignedBuffer> = outs.iter_mut().collect();
                let t = Instant::now();
                kernel.run(&rt, &ins, &mut outs)?;
                if round == 1 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
        }
        jit.push(median(times));
        let out = Command::new(&exe)
            .arg(CALLS.to_string())
            .args(&sizes)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "the built program failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        built.push(text.trim().parse::<f64>()?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The fastest round as well: on a loaded machine it is the one least disturbed.
    let fastest = |xs: &[f64]| xs.iter().copied().fold(f64::INFINITY, f64::min);
    let (j, b) = (median(jit.clone()), median(built.clone()));
    let (jf, bf) = (fastest(&jit), fastest(&built));
    let gflops = |s: f64| spec.flops() / s / 1e9;
    println!("{workload}, {threads} threads, {rounds} rounds of {CALLS} calls a side");
    for (side, m, f, all) in [("JIT", j, jf, &jit), ("built", b, bf, &built)] {
        println!(
            "{side:>5}: median {:.4} ms/call ({:.1} GFLOP/s), fastest round {:.4} ms; rounds {all:.6?}",
            m * 1e3,
            gflops(m),
            f * 1e3
        );
    }
    println!(
        "built / JIT time: {:.3} (medians), {:.3} (fastest rounds)",
        b / j,
        bf / jf
    );
    Ok(())
}
