//! `tensortune tune --target cuda` on a machine without a GPU: a clear usage error, and the
//! dry run that makes and checks GPU candidates without one.

use std::process::Command;

fn tensortune(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tensortune"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("tensortune runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn tune_for_cuda_without_a_driver_is_one_line_and_exit_2() {
    if tensortune::gpu::driver::driver_available().is_ok() {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("t.db");
    let db = db.to_str().expect("utf-8 path");
    for target in ["cuda", "cuda -arch=sm_90"] {
        let o = tensortune(&[
            "tune",
            "--target",
            target,
            "--workload",
            "matmul:M=64,N=64,K=64",
            "--trials",
            "4",
            "--db",
            db,
        ]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("no CUDA driver found"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(o.stdout.is_empty());
    }
    // Nothing was written: the run stopped before opening the database.
    assert!(!dir.path().join("t.db").exists());
    let out = dir.path().join("c.npy");
    let out = out.to_str().expect("utf-8 path");
    let o = tensortune(&[
        "run",
        "--target",
        "cuda",
        "--workload",
        "softmax:M=4,N=8",
        "--output",
        out,
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tensortune: cannot run on `cuda`: no CUDA driver found"),
        "{err}"
    );
    assert!(!dir.path().join("c.npy").exists());
}

#[test]
fn dry_run_verifies_compiles_and_simulates_gpu_candidates() {
    let o = tensortune(&[
        "tune",
        "--target",
        "cuda -arch=sm_86",
        "--dry-run",
        "--json",
        "--workload",
        "matmul:M=40,N=24,K=20",
        "--workload",
        "conv2d:N=1,C=4,H=7,W=7,K=8,R=3,S=3,stride=1,pad=1",
        "--trials",
        "12",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let lines: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(lines.len(), 2);
    for j in &lines {
        assert_eq!(j["target"], "cuda -arch=sm_86", "{j}");
        assert_eq!(j["drawn"], 12, "{j}");
        let ptx = j["ptx"].as_u64().expect("count");
        let refused = j["refused"].as_u64().expect("count");
        let invalid = j["invalid"].as_u64().expect("count");
        assert_eq!(ptx + refused + invalid, 12, "{j}");
        assert!(ptx >= 6, "most small candidates should fit: {j}");
        // Small workloads are simulated: every candidate that made PTX ran and was right.
        assert_eq!(j["simulated_right"].as_u64(), Some(ptx), "{j}");
        assert_eq!(j["simulated_wrong"], 0, "{j}");
        if let Some(n) = j["assembled"].as_u64() {
            assert_eq!(n, ptx, "ptxas refused some: {j}");
            // ptxas's resource lines were read for every kernel it assembled. (At shapes
            // this small a draw may unroll the whole reduction, fetches and barriers
            // included, and spill a few registers: the large shapes' test in gpu_verify.rs
            // is where local memory must not appear.)
            assert!(j["local_memory"].as_u64().is_some_and(|l| l <= n), "{j}");
            let regs = &j["registers"];
            let (lo, hi) = (regs[0].as_u64(), regs[2].as_u64());
            assert!(
                lo.is_some_and(|lo| lo > 0) && hi.is_some_and(|hi| hi <= 255),
                "{j}"
            );
        } else {
            eprintln!("no ptxas: PTX not assembled");
        }
    }
}

#[test]
fn dry_run_bad_input_is_a_usage_error() {
    for (args, want) in [
        (
            vec!["--dry-run", "--workload", "matmul:M=8,N=8,K=8"],
            "--dry-run is for cuda targets",
        ),
        (
            vec![
                "--target",
                "cuda -arch=sm_75",
                "--dry-run",
                "--workload",
                "matmul:M=8,N=8,K=8",
            ],
            "unknown GPU architecture `sm_75`",
        ),
        (
            vec![
                "--target",
                "cuda -arch=75",
                "--workload",
                "matmul:M=8,N=8,K=8",
            ],
            "bad value in `-arch=75`",
        ),
    ] {
        let mut a = vec!["tune"];
        a.extend(args);
        let o = tensortune(&a);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{a:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{a:?}: {err}");
    }
}
