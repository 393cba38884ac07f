//! A Rust project outside this repository that depends on tensortune by path builds with
//! `cargo build --offline` and none of our environment (no `XGBOOST_LIB_DIR`, no
//! `.cargo/config.toml` of ours applies to it), once with the default features (the tuning
//! loop, XGBoost built from source) and once with `default-features = false`; each binary's
//! kernel agrees with a matmul written out in the project itself.
//!
//! Offline means after the dependencies are in cargo's cache: this repository's Cargo.lock is
//! copied into the project, so nothing new is resolved (as after `cargo fetch`).
//!
//! Ignored by default: the first run compiles XGBoost's C++ and the LLVM-linked crate in a
//! target directory of its own (kept under this one for the next run), many minutes on two
//! cores. CI runs it: `cargo test --release --test dependent_project -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The project's program: builds a kernel (how depends on the features), runs it on
/// deterministic inputs and compares with a plain triple loop.
const MAIN: &str = r#"
use tensortune::ndarray::Array2;
use tensortune::{Kernel, Runtime, WorkloadSpec};

const M: usize = 24;
const N: usize = 20;
const K: usize = 16;

#[cfg(feature = "tuned")]
fn state(spec: &WorkloadSpec) -> Result<tensortune::schedules::schedule::State, Box<dyn std::error::Error>> {
    use tensortune::{tune, Target, TuneOptions};
    let opts = TuneOptions { trials: 16, seed: 3, threads: 1, quiet: true, ..TuneOptions::default() };
    let report = tune(spec, &Target::host(1), &opts)?;
    Ok(report.best_state(&spec.build()?).ok_or("no program")?)
}

#[cfg(not(feature = "tuned"))]
fn state(spec: &WorkloadSpec) -> Result<tensortune::schedules::schedule::State, Box<dyn std::error::Error>> {
    Ok(tensortune::schedules::schedule::State::new(&spec.build()?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = WorkloadSpec::parse(&format!("matmul:M={M},N={N},K={K}"))?;
    let kernel = Kernel::from_state(&state(&spec)?, &Default::default())?;
    let a = Array2::<f32>::from_shape_fn((M, K), |(i, k)| ((i * 7 + k * 3) % 11) as f32 - 5.0);
    let b = Array2::<f32>::from_shape_fn((K, N), |(k, j)| ((k * 5 + j) % 9) as f32 * 0.25);
    let c = kernel.run_arrays(&Runtime::serial(), &[a.view().into_dyn(), b.view().into_dyn()])?;
    let mut worst = 0.0f32;
    for i in 0..M {
        for j in 0..N {
            let want: f32 = (0..K).map(|k| a[[i, k]] * b[[k, j]]).sum();
            worst = worst.max((c[0][[i, j]] - want).abs());
        }
    }
    println!("max abs error {worst}");
    if worst > 1e-3 {
        return Err("the kernel disagrees with the reference".into());
    }
    println!("kernel matches the reference");
    Ok(())
}
"#;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo().join("target"))
}

/// Writes the project into a fresh temporary directory and returns it.
fn write_project(name: &str, dependency: &str, features: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tt-dependent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).expect("temp dir");
    let manifest = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\npublish = false\n\n\
         [workspace]\n\n[dependencies]\n{dependency}\n\n[features]\n{features}\n"
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("manifest");
    std::fs::write(dir.join("src/main.rs"), MAIN).expect("main.rs");
    std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock")).expect("lock file");
    dir
}

/// Builds the project offline in `target` and runs its binary from another directory.
fn build_and_run(dir: &Path, name: &str, target: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--release", "--offline"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("XGBOOST_LIB_DIR")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "offline build of {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(target.join("release").join(name))
        .current_dir(std::env::temp_dir())
        .env("LD_LIBRARY_PATH", "")
        .output()
        .expect("the binary starts");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("kernel matches the reference"),
        "{name}: {stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "builds tensortune twice in a target directory of its own; run by CI"]
fn a_dependent_project_builds_offline_with_and_without_default_features() {
    // Not the directory `cargo test` holds a lock on while it runs.
    let target = target_dir().join("dependent-project");
    let path = repo().display().to_string();
    let tuned = write_project(
        "tt-dependent-tuned",
        &format!("tensortune = {{ path = {path:?} }}"),
        "default = [\"tuned\"]\ntuned = []",
    );
    build_and_run(&tuned, "tt-dependent-tuned", &target);
    let minimal = write_project(
        "tt-dependent-minimal",
        &format!("tensortune = {{ path = {path:?}, default-features = false }}"),
        "tuned = []",
    );
    build_and_run(&minimal, "tt-dependent-minimal", &target);
}
