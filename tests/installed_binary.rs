//! The `tensortune` binary runs wherever it is copied: XGBoost is linked statically (see
//! `cost_model/build.rs`), so a copy in another directory, run with an empty
//! `LD_LIBRARY_PATH` (cargo's test runner otherwise puts its build directories there), starts,
//! and tunes with the cost model.

use std::path::PathBuf;
use std::process::Command;

fn copy_of_the_binary() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("tt-installed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join("tensortune");
    std::fs::copy(env!("CARGO_BIN_EXE_tensortune"), &exe).expect("copy the binary");
    (dir, exe)
}

#[test]
fn a_copy_runs_from_another_directory_without_the_loader_path() {
    let (dir, exe) = copy_of_the_binary();
    // Enough trials for the model to train (its warm-up is 64 samples), on a tiny matmul.
    let out = Command::new(&exe)
        .args([
            "tune",
            "--workload",
            "matmul:M=16,N=16,K=16",
            "--trials",
            "80",
            "--threads",
            "1",
            "--quiet",
            "--db",
        ])
        .arg(dir.join("t.db"))
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", "")
        .output()
        .expect("the copy starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("libxgboost"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("GFLOP/s"), "{stdout}");

    // The dynamic section names no XGBoost library (where binutils can tell).
    if let Ok(r) = Command::new("readelf").arg("-d").arg(&exe).output() {
        if r.status.success() {
            let dynamic = String::from_utf8_lossy(&r.stdout);
            assert!(dynamic.contains("NEEDED"), "{dynamic}");
            assert!(!dynamic.contains("libxgboost"), "{dynamic}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
