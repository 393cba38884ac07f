//! Tune a matmul of bf16 inputs (f32 accumulation) and the same matmul in f32, run the bf16
//! kernel on our own data, and check it against ndarray.
//!
//! `cargo run --release --example bf16_matmul -- --trials 256 --size 1024` for a real budget.
//! On a CPU with AVX-512 BF16 (Zen 4, Sapphire Rapids and later) the bf16 kernel runs one
//! `vdpbf16ps` per 16 lanes and two steps of `k`; elsewhere it is correct but not faster.

#[path = "common/args.rs"]
mod common_args;

use ndarray::Array2;
use tensortune::runtime::{AlignedBuffer, Runtime};
use tensortune::schedules::data::{bf16_to_f32, f32_to_bf16};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::DType;
use tensortune::{tune, Kernel, Target, TuneOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials = common_args::arg("--trials", 32usize);
    let n = common_args::arg("--size", 256usize);
    let opts = TuneOptions {
        trials,
        batch_size: 16,
        population: 512,
        ..TuneOptions::default()
    };
    let mut best = Vec::new();
    for dtype in ["bf16", "f32"] {
        let spec = WorkloadSpec::parse(&format!("matmul:M={n},N={n},K={n},dtype={dtype}"))?;
        let report = tune(&spec, &Target::host(1), &opts)?;
        println!(
            "{}: {:.1} GFLOP/s after {} trials",
            report.workload,
            report.best_gflops.unwrap_or(0.0),
            report.trials
        );
        best.push((spec, report));
    }
    if let [(_, b), (_, f)] = &best[..] {
        if let (Some(b), Some(f)) = (b.best_gflops, f.best_gflops) {
            println!("bf16 / f32: {:.2}", b / f);
        }
    }

    // The bf16 kernel on our data: f32 values rounded to bf16, passed as their bits.
    let (spec, report) = &best[0];
    let dag = spec.build()?;
    let state = report
        .best_state(&dag)
        .ok_or("no valid program was found")?;
    let kernel = Kernel::from_state(&state, &Default::default())?;
    let a = Array2::from_shape_vec((n, n), common_args::values(n * n, 1))?;
    let b = Array2::from_shape_vec((n, n), common_args::values(n * n, 2))?;
    let to_buffer = |x: &Array2<f32>| -> Result<AlignedBuffer, Box<dyn std::error::Error>> {
        let mut buf = AlignedBuffer::zeros(&[n as i64, n as i64], DType::BF16)?;
        for (d, s) in buf.as_mut_slice::<u16>()?.iter_mut().zip(x.iter()) {
            *d = f32_to_bf16(*s);
        }
        Ok(buf)
    };
    let (ab, bb) = (to_buffer(&a)?, to_buffer(&b)?);
    let mut c = AlignedBuffer::zeros(&[n as i64, n as i64], DType::F32)?;
    kernel.run(&Runtime::new(1)?, &[&ab, &bb], &mut [&mut c])?;

    // Against ndarray on the rounded values (only the order of the sums differs) and on
    // the f32 values (bf16's rounding of the inputs shows: about 2^-8 of each product).
    let round = |x: &Array2<f32>| x.mapv(|v| bf16_to_f32(f32_to_bf16(v)));
    let want = round(&a).dot(&round(&b));
    let exact = a.dot(&b);
    let got = c.as_slice::<f32>()?;
    let worst = |w: &Array2<f32>| {
        got.iter()
            .zip(w.iter())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    let (same, inputs) = (worst(&want), worst(&exact));
    println!("largest difference to ndarray: {same:.2e} on the bf16 values, {inputs:.2e} on the f32 values");
    if same > 1e-3 {
        return Err(format!("the bf16 kernel disagrees with ndarray by {same}").into());
    }
    Ok(())
}
