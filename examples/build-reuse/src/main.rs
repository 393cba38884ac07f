//! Runs three tuned kernels and a whole ONNX network compiled at build time (see build.rs)
//! and checks each against ndarray. The binary links no LLVM and no tensortune: only the kernels' machine code and the
//! small runtime of the generated module.

include!(concat!(env!("OUT_DIR"), "/tuned.rs"));

use ndarray::{Array1, Array2, Axis};
use std::process::ExitCode;
use std::time::Instant;

/// A deterministic pseudo-random matrix in [-1, 1).
fn random(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Array2::from_shape_simple_fn((rows, cols), || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    })
}

/// The largest absolute difference, relative to the largest reference value.
fn rel_err(got: &Array2<f32>, want: &Array2<f32>) -> f32 {
    let scale = want.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want.iter())
        .fold(0.0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

/// Each row of `x` through a softmax.
fn softmax_rows(mut x: Array2<f32>) -> Array2<f32> {
    for mut row in x.rows_mut() {
        let m = row.fold(f32::MIN, |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - m).exp());
        let s = row.sum();
        row /= s;
    }
    x
}

fn check(name: &str, got: &Array2<f32>, want: &Array2<f32>) -> bool {
    let e = rel_err(got, want);
    let ok = e < 1e-4;
    println!(
        "{name}: max relative error {e:.1e} {}",
        if ok { "ok" } else { "WRONG" }
    );
    ok
}

fn main() -> ExitCode {
    println!("target: {} ({} threads)", tuned::TARGET, tuned::threads());
    for k in tuned::KERNELS {
        println!("  {} <- {}", k.name, k.source);
    }
    let mut ok = true;

    // matmul on slices: plain Vecs (copied into aligned buffers by the wrapper) and
    // AlignedVecs (passed as they are).
    let (a, b) = (random(256, 256, 1), random(256, 256, 2));
    let want = a.dot(&b);
    let (a_s, b_s) = (
        a.as_slice().unwrap_or(&[]).to_vec(),
        b.as_slice().unwrap_or(&[]).to_vec(),
    );
    let mut c = vec![0.0f32; 256 * 256];
    if let Err(e) = tuned::matmul_k256_m256_n256(&a_s, &b_s, &mut c) {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    let got = Array2::from_shape_vec((256, 256), c).unwrap_or_default();
    ok &= check("matmul (Vec)", &got, &want);
    let (a_al, b_al) = (
        tuned::AlignedVec::from_slice(&a_s),
        tuned::AlignedVec::from_slice(&b_s),
    );
    let mut c_al = tuned::AlignedVec::<f32>::zeros(256 * 256);
    let start = Instant::now();
    let runs = 20;
    for _ in 0..runs {
        if let Err(e) = tuned::matmul_k256_m256_n256(&a_al, &b_al, &mut c_al) {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    }
    let secs = start.elapsed().as_secs_f64() / runs as f64;
    let got = Array2::from_shape_vec((256, 256), c_al.to_vec()).unwrap_or_default();
    ok &= check("matmul (AlignedVec)", &got, &want);
    println!("matmul: {:.2} GFLOP/s", 2.0 * 256f64.powi(3) / secs / 1e9);

    // A wrong length is an error, not a crash.
    let short = vec![0.0f32; 10];
    let mut c2 = vec![0.0f32; 256 * 256];
    match tuned::matmul_k256_m256_n256(&short, &b_s, &mut c2) {
        Err(e) => println!("refused as expected: {e}"),
        Ok(()) => ok = false,
    }

    // dense + bias + relu on ndarray views, one of them transposed (any layout is accepted).
    let x = random(64, 128, 3);
    let w_t = random(128, 256, 4);
    let bias: Array1<f32> = random(1, 256, 5).index_axis_move(Axis(0), 0);
    let want = (x.dot(&w_t) + &bias).mapv(|v| v.max(0.0));
    match tuned::dense_bias_relu_k128_m64_n256_nd(x.view(), w_t.t(), bias.view()) {
        Ok(got) => ok &= check("dense_bias_relu (ndarray)", &got, &want),
        Err(e) => {
            eprintln!("{e}");
            ok = false;
        }
    }

    // softmax over rows.
    let xs = random(128, 256, 6) * 4.0;
    let want = softmax_rows(xs.clone());
    match tuned::softmax_m128_n256_nd(xs.view()) {
        Ok(got) => ok &= check("softmax (ndarray)", &got, &want),
        Err(e) => {
            eprintln!("{e}");
            ok = false;
        }
    }

    // The whole network of mlp.onnx: softmax(relu(x·W1)·W2), its weights in closed form (see
    // `example_model_bytes` in the repository's tests/build_reuse.rs).
    let w = |rows: usize, cols: usize, a: usize, b: usize, m: usize| {
        Array2::from_shape_fn((rows, cols), |(k, j)| {
            ((a * k + b * j) % m) as f32 / m as f32 - 0.5
        })
    };
    let x = random(4, 32, 7);
    let z = x.dot(&w(32, 64, 7, 3, 11)).mapv(|v| v.max(0.0)).dot(&w(64, 10, 5, 1, 13));
    let want = softmax_rows(z);
    for t in tuned::mlp::tasks() {
        println!("  mlp task {} ({}) <- {}", t.key, t.ops, t.source);
    }
    match tuned::mlp::run_nd(&[x.view().into_dyn()]) {
        Ok(outs) => match outs.into_iter().next().map(|y| y.into_dimensionality()) {
            Some(Ok(got)) => ok &= check("mlp.onnx (whole network)", &got, &want),
            _ => ok = false,
        },
        Err(e) => {
            eprintln!("{e}");
            ok = false;
        }
    }

    if ok {
        println!("all results match ndarray");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
