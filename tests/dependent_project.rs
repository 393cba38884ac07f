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

/// One offline release build of the project in `target`; `jobs` caps cargo's (and so
/// XGBoost's cmake's) parallel jobs.
fn cargo_build(dir: &Path, target: &Path, jobs: Option<u32>) -> std::process::Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--release", "--offline"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("XGBOOST_LIB_DIR")
        .env_remove("RUSTFLAGS");
    if let Some(j) = jobs {
        cmd.env("CARGO_BUILD_JOBS", j.to_string());
    }
    cmd.output().expect("cargo runs")
}

/// What a failed build's log says about why, for the end of a panic message (a CI log that
/// keeps only a long output's head and tail loses a compiler's error in the middle of a
/// build script's output): the lines that name an error, and the disk and memory left.
fn failure_summary(stderr: &[u8], target: &Path) -> String {
    const SIGNS: [&str; 8] = [
        "error",
        "no space",
        "killed",
        "fatal",
        "cannot allocate",
        "out of memory",
        "signal",
        "terminated",
    ];
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            SIGNS.iter().any(|s| l.contains(s))
        })
        .collect();
    let tail = &lines[lines.len().saturating_sub(30)..];
    let disk = Command::new("df")
        .arg("-Pk")
        .arg(target.parent().unwrap_or(target))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("df failed: {e}"));
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "MemAvailable unknown".into());
    format!(
        "lines naming an error ({} of {}):\n{}\ndisk where the target directory is:\n{disk}{memory}",
        tail.len(),
        lines.len(),
        tail.join("\n")
    )
}

/// Builds the project offline in `target` and runs its binary from another directory.
///
/// A build that fails is tried once more with one job, the first failure printed: on a
/// machine short of memory, XGBoost's C++ compiled two files at a time beside rustc can be
/// killed, which says nothing about whether the project builds. A build that fails twice
/// fails the test, both failures summed up at the end of the message.
fn build_and_run(dir: &Path, name: &str, target: &Path) {
    let mut out = cargo_build(dir, target, None);
    if !out.status.success() {
        let first = failure_summary(&out.stderr, target);
        eprintln!("offline build of {name} failed; once more with one job. In short:\n{first}");
        out = cargo_build(dir, target, Some(1));
        assert!(
            out.status.success(),
            "offline build of {name} failed twice, the second time with one job:\n{}\n\
             --- the first failure in short:\n{first}\n--- the second in short:\n{}",
            String::from_utf8_lossy(&out.stderr),
            failure_summary(&out.stderr, target)
        );
    }
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
