//! Compiles the best records of `records.db` for this CPU, two threads, into a static library
//! and the module `tuned` (see src/main.rs): three kernels, and the whole network of
//! `mlp.onnx` as `tuned::mlp`.
//!
//! The records were tuned on one machine; on a CPU they were not tuned for the database has
//! no records for the host's target key, and the build falls back to the default schedules
//! (correct, untuned) with a cargo warning instead of failing. A user's real build would
//! usually leave fallback off, so that a missing tuning run is an error.

use tensortune::build::Build;
use tensortune::ReuseError;

/// What the program runs; `records.db` holds records of each (regenerate it with
/// `cargo test --release --test build_reuse -- --ignored regenerate` from the repository root).
const WORKLOADS: [&str; 3] = [
    "matmul:M=256,N=256,K=256",
    "dense_bias_relu:M=64,N=256,K=128",
    "softmax:M=128,N=256",
];

fn main() {
    let build = Build::new("records.db")
        .workloads(WORKLOADS)
        .model("mlp.onnx")
        .threads(2)
        .ndarray(true);
    let result = match build.clone().compile() {
        Err(ReuseError::NoTarget {
            target, available, ..
        }) => {
            println!(
                "cargo:warning=records.db has no records for this CPU (`{target}`; it has {}): \
                 building default schedules",
                available.join("; ")
            );
            build.fallback(true).compile()
        }
        other => other,
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
