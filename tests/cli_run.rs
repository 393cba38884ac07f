//! `tensortune run` (`--threads 0`, `--timeout`), `tensortune codegen`, `tensortune tune`
//! (`--task-scheduler`, a negative `--max-unrolled-statements`) and `tensortune completions`
//! end to end: `.npy` in and out, errors as exit status 2 with one line.

use ndarray::{Array2, ArrayD};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensortune"))
}

/// The JSON a run that must have succeeded printed on stdout.
fn json_of_success(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// `a` and `b` written as `.npy` into `dir`: the `--inputs` list and a path for the output.
fn npy_pair(
    dir: &std::path::Path,
    a: &Array2<f32>,
    b: &Array2<f32>,
) -> (String, std::path::PathBuf) {
    let (pa, pb) = (dir.join("a.npy"), dir.join("b.npy"));
    ndarray_npy::write_npy(&pa, a).expect("write a");
    ndarray_npy::write_npy(&pb, b).expect("write b");
    (
        format!("{},{}", pa.display(), pb.display()),
        dir.join("c.npy"),
    )
}

#[test]
fn run_reads_and_writes_npy() {
    let dir = std::env::temp_dir().join(format!("tt-cli-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let a = Array2::from_shape_fn((5, 3), |(i, j)| (i * 3 + j) as f32 * 0.25 - 1.0);
    let b = Array2::from_shape_fn((3, 7), |(i, j)| (i as f32 - j as f32) * 0.5);
    let (inputs, pc) = npy_pair(&dir, &a, &b);
    let out = bin()
        .args([
            "run",
            "--workload",
            "matmul:M=5,N=7,K=3",
            "--min-repeat-ms",
            "1",
            "--repeat",
            "2",
            "--json",
        ])
        .args(["--inputs", &inputs, "--output"])
        .arg(&pc)
        .output()
        .expect("runs");
    let v = json_of_success(&out);
    assert!(v["median_s"].as_f64().expect("median") > 0.0);
    let c: ArrayD<f32> = ndarray_npy::read_npy(&pc).expect("read c");
    let want = a.dot(&b).into_dyn();
    assert_eq!(c.shape(), want.shape());
    for (x, y) in c.iter().zip(want.iter()) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }

    // Wrong shape: a usage error, one line, exit status 2.
    let out = bin()
        .args([
            "run",
            "--workload",
            "matmul:M=5,N=7,K=4",
            "--inputs",
            &inputs,
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("shape") && err.lines().count() == 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn codegen_prints_ir_and_asm() {
    for (emit, needle) in [("llvm", "define"), ("asm", "ret"), ("loop", "for ")] {
        let out = bin()
            .args([
                "codegen",
                "--workload",
                "reduce_sum:M=4,N=33",
                "--emit",
                emit,
            ])
            .output()
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(needle),
            "{emit}"
        );
    }
}

#[test]
fn tune_takes_a_task_scheduler() {
    let dir = std::env::temp_dir().join(format!("tt-cli-sched-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("t.db");
    let db = db.to_str().expect("utf-8 path");
    let tune = |policy: &str| {
        bin()
            .args([
                "tune",
                "--workload",
                "matmul:M=8,N=16,K=8",
                "--workload",
                "matmul:M=4,N=16,K=4@8",
                "--trials",
                "8",
                "--batch-size",
                "2",
                "--population",
                "16",
                "--task-scheduler",
                policy,
                "--db",
                db,
                "--json",
                "--quiet",
            ])
            .output()
            .expect("runs")
    };
    // Round-robin: the same trials for both, whatever their weights and latencies.
    let out = tune("round-robin");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let trials: Vec<u64> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("trials").and_then(|t| t.as_u64()))
        .collect();
    assert_eq!(trials, vec![4, 4], "{stdout}");

    let out = tune("fastest");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    // One line of error (naming the values that would do) and clap's one-line hint.
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.contains("fastest")
            && first.contains("round-robin")
            && first.contains("gradient")
            && err.lines().count() == 2,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tune_rejects_a_negative_unrolled_statement_limit() {
    let dir = std::env::temp_dir().join(format!("tt-cli-unroll-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("t.db");
    let out = bin()
        .args(["tune", "--workload", "matmul:M=8,N=16,K=8", "--trials", "2"])
        .args(["--max-unrolled-statements=-5", "--quiet", "--db"])
        .arg(&db)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-unrolled-statements"), "{err}");
    // Nothing was tuned: the database was not even created.
    assert!(!db.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = bin().args(["completions", shell]).output().expect("runs");
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8_lossy(&out.stdout);
        // The script names the binary and offers its subcommands, their flags (fish spells
        // them `-l workload`, hence no dashes here) and the values a flag takes.
        for word in ["tensortune", "tune", "export", "workload", "round-robin"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    let out = bin()
        .args(["completions", "cmd.exe"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn run_takes_every_core_with_threads_zero() {
    let out = bin()
        .args([
            "run",
            "--workload",
            "matmul:M=16,N=16,K=16",
            "--threads",
            "0",
        ])
        .args(["--repeat", "1", "--min-repeat-ms", "0", "--json"])
        .output()
        .expect("runs");
    let v = json_of_success(&out);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(v["threads"].as_u64(), Some(cores), "{v}");
    // A count past the machine's cores is still refused.
    let out = bin()
        .args(["run", "--workload", "matmul:M=16,N=16,K=16", "--threads"])
        .arg("100000")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    // And so is one stated in the target's key, by `run` and by `tune`.
    for cmd in ["run", "tune"] {
        let out = bin()
            .args([cmd, "--workload", "matmul:M=16,N=16,K=16"])
            .args(["--target", "llvm -threads=100000", "--db"])
            .arg(std::env::temp_dir().join(format!("tt-threads-{}.db", std::process::id())))
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("-threads must be between 1 and"),
            "{cmd}: {err}"
        );
    }
}

/// A record filed under this CPU's key whose program only a GPU runs (a warp shuffle, from
/// an imported trace) is skipped for the next one by `run` and `codegen`, as a record that no
/// longer replays is, not compiled and failed on.
#[test]
fn a_record_only_a_gpu_runs_is_skipped_on_the_cpu() {
    let dir = tempfile::tempdir().expect("dir");
    let key = tensortune::Target::host(1).key();
    let record = |trace: &str, median: f64| {
        format!(
            r#"{{"format":"tensortune.record/1","workload":"reduce_sum:M=1,N=32","flops":32.0,"target":"{key}","trace":{trace},"result":{{"median_s":{median},"min_s":{median},"max_s":{median},"repeats":3}},"measured_at":"2026-01-02T03:04:05.678Z"}}"#
        )
    };
    let lines = [
        record(
            r#"{"steps":[{"op":"annotate","stage":1,"iter":1,"annotation":{"bind":"ThreadX"}}]}"#,
            1e-6,
        ),
        record(r#"{"steps":[]}"#, 2e-6),
    ];
    let jsonl = dir.path().join("r.jsonl");
    std::fs::write(&jsonl, lines.join("\n") + "\n").expect("write");
    let db = dir.path().join("r.db");
    let out = bin()
        .arg("import")
        .arg("--db")
        .arg(&db)
        .arg(&jsonl)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bin()
        .args([
            "codegen",
            "--workload",
            "reduce_sum:M=1,N=32",
            "--emit",
            "obj",
            "--db",
        ])
        .arg(&db)
        .arg("--out")
        .arg(dir.path().join("k.o"))
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("cannot run on the CPU"), "{err}");
    let out = bin()
        .args(["run", "--workload", "reduce_sum:M=1,N=32", "--db"])
        .arg(&db)
        .args(["--repeat", "1", "--min-repeat-ms", "0", "--json"])
        .output()
        .expect("runs");
    let v = json_of_success(&out);
    assert_eq!(v["schedule"].as_str(), Some("best record"), "{v}");
}

#[test]
fn run_gives_up_after_its_timeout() {
    // The default schedule of this matmul takes about a second on one core: far past 1 ms.
    let start = std::time::Instant::now();
    let out = bin()
        .args(["run", "--workload", "matmul:M=1024,N=1024,K=1024"])
        .args(["--timeout", "0.001"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--timeout") && err.lines().count() == 1,
        "{err}"
    );
    // It stopped waiting rather than finishing the run.
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
    for bad in ["0", "-1", "nan"] {
        let out = bin()
            .args(["run", "--workload", "matmul:M=4,N=4,K=4", "--timeout", bad])
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "--timeout {bad}");
    }
}

/// A bf16 matmul from f32 `.npy` inputs: each input rounded to bf16 (nearest, ties to even),
/// the products of the rounded values summed in f32; ndarray's f64 product of the same
/// rounded values is the reference.
#[test]
fn run_takes_bf16_inputs_from_f32_npy() {
    let dir = std::env::temp_dir().join(format!("tt-cli-run-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (m, n, k) = (9, 40, 34);
    // Values with more than bf16's 8 significant bits, so that the rounding shows.
    let a = Array2::from_shape_fn((m, k), |(i, j)| {
        ((i * 7 + j * 3) % 17) as f32 * 0.1234 - 1.0
    });
    let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 5 + j) % 13) as f32 * 0.0777 - 0.5);
    let (inputs, pc) = npy_pair(&dir, &a, &b);
    let out = bin()
        .args([
            "run",
            "--workload",
            &format!("matmul:M={m},N={n},K={k},dtype=bf16"),
            "--min-repeat-ms",
            "1",
            "--repeat",
            "2",
            "--json",
            "--inputs",
            &inputs,
            "--output",
        ])
        .arg(&pc)
        .output()
        .expect("runs");
    json_of_success(&out);
    // bf16 by hand: keep the upper 16 bits, rounded to nearest even.
    let round = |x: f32| {
        let bits = x.to_bits();
        f32::from_bits((bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff_0000) as f64
    };
    let (ra, rb) = (a.mapv(round), b.mapv(round));
    let want = ra.dot(&rb).into_dyn();
    let (fa, fb) = (a.mapv(|x| x as f64), b.mapv(|x| x as f64));
    let exact = fa.dot(&fb);
    // Against the f32 inputs' product, bf16's tolerance: each input is off by at most 2^-9
    // of itself, so each product by about 2^-8 of |a|·|b|, the sum by 2^-8 of Σ|a|·|b|.
    let bound = fa.mapv(f64::abs).dot(&fb.mapv(f64::abs)) * (1.0 / 256.0) + 1e-5;
    let c: ArrayD<f32> = ndarray_npy::read_npy(&pc).expect("read c");
    assert_eq!(c.shape(), want.shape());
    let mut off_exact = 0.0f64;
    for (((x, y), e), tol) in c
        .iter()
        .zip(want.iter())
        .zip(exact.iter())
        .zip(bound.iter())
    {
        assert!((*x as f64 - y).abs() < 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        assert!((*x as f64 - e).abs() <= *tol, "{x} vs the f32 inputs' {e}");
        off_exact = off_exact.max((*x as f64 - e).abs());
    }
    // The rounding of the inputs is visible against the f32 inputs' product.
    assert!(off_exact > 1e-4, "{off_exact}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Commands that write a file named by the user, given an output that is one of their inputs
/// (or a header that cannot be written beside a new object): exit status 2, one line, and
/// every file as it was. `run-model --output` and `plan --out` overwrote the model, an input
/// or the database and exited 0; `codegen --emit obj` replaced its object before failing on
/// the header.
#[test]
fn outputs_onto_inputs_are_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let model = d.join("m.onnx");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/build-reuse/mlp.onnx"),
        &model,
    )
    .expect("copy the model");
    let db = d.join("a.db");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/build-reuse/records.db"
        ),
        &db,
    )
    .expect("copy the records");
    let x = d.join("x.npy");
    ndarray_npy::write_npy(&x, &Array2::<f32>::ones((4, 32))).expect("write x");
    let obj = d.join("w.o");
    std::fs::write(&obj, "an old object").expect("write");
    let header_dir = d.join("include");
    std::fs::create_dir(&header_dir).expect("dir");
    let files = [&model, &db, &x, &obj];
    let before: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).expect("read"))
        .collect();
    let p = |p: &std::path::Path| p.display().to_string();
    let cases: Vec<Vec<String>> = vec![
        vec![
            "run-model".into(),
            p(&model),
            "--repeat=1".into(),
            "--output".into(),
            p(&model),
        ],
        vec![
            "run-model".into(),
            p(&model),
            "--repeat=1".into(),
            "--inputs".into(),
            p(&x),
            "--output".into(),
            p(&x),
        ],
        vec![
            "run-model".into(),
            p(&model),
            "--repeat=1".into(),
            "--db".into(),
            p(&db),
            "--output".into(),
            p(&db),
        ],
        vec![
            "plan".into(),
            "--model".into(),
            p(&model),
            "--out".into(),
            p(&model),
        ],
        vec!["import".into(), "--db".into(), p(&db), p(&db)],
        vec![
            "codegen".into(),
            "--workload=matmul:M=8,N=8,K=8".into(),
            "--emit=obj".into(),
            "--out".into(),
            p(&obj),
            "--header".into(),
            p(&header_dir),
        ],
    ];
    for args in cases {
        let out = bin().args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("tensortune: "), "{args:?}: {err}");
    }
    for (f, b) in files.iter().zip(&before) {
        assert_eq!(
            &std::fs::read(f).expect("read"),
            b,
            "{} changed",
            f.display()
        );
    }
    // A merge that fails (a source that is not there) leaves no new, empty target behind.
    let target = d.join("new.db");
    let out = bin()
        .args(["merge", "--into"])
        .arg(&target)
        .arg(d.join("missing.db"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !target.exists(),
        "a failed merge created {}",
        target.display()
    );
    // A folder given as the database: said so (SQLite's own word was "disk I/O error").
    let out = bin()
        .args(["records", "--db"])
        .arg(&header_dir)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a directory"));
}
