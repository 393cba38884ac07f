//! Compile-time reuse of tuning records: the example project (`examples/build-reuse`) builds
//! and runs with no LLVM in its binary; the build fails with a listing for a database of
//! another target; a missing record falls back or fails as asked; a stale record is skipped;
//! `tensortune codegen --emit obj` writes an object and a header a C program links with.
//!
//! `cargo test --release --test build_reuse -- --ignored regenerate` re-tunes the example's
//! small database on this machine.

#[path = "../examples/common/built_program.rs"]
mod built_program;

use std::path::{Path, PathBuf};
use std::process::Command;
use tensortune::build::{Build, Missing, ReuseOptions, ReuseWarning, Source};
use tensortune::records::{Database, NewRecord, Timing, Workload};
use tensortune::runtime::Runtime;
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::schedule::State;
use tensortune::{Kernel, ReuseError, Target, TuneOptions};

/// The example's workloads (as in its build.rs) and its target's thread count.
const EXAMPLE_WORKLOADS: [&str; 3] = [
    "matmul:M=256,N=256,K=256",
    "dense_bias_relu:M=64,N=256,K=128",
    "softmax:M=128,N=256",
];
const EXAMPLE_THREADS: usize = 2;

/// The example's model (`examples/build-reuse/mlp.onnx`): `softmax(relu(x·W1)·W2)` with
/// `x: [4, 32]`, and weights in closed form, so that the example computes the same network
/// with ndarray: `W1[k][j] = ((7k + 3j) mod 11)/11 - 0.5`, `W2[k][j] = ((5k + j) mod 13)/13
/// - 0.5`.
fn example_model_bytes() -> Vec<u8> {
    let w = |rows: usize, cols: usize, a: usize, b: usize, m: usize| -> Vec<f32> {
        (0..rows)
            .flat_map(|k| (0..cols).map(move |j| ((a * k + b * j) % m) as f32 / m as f32 - 0.5))
            .collect()
    };
    tensortune::model::testing::ModelBuilder::new(13)
        .input("x", &[4, 32])
        .init("W1", &[32, 64], w(32, 64, 7, 3, 11))
        .init("W2", &[64, 10], w(64, 10, 5, 1, 13))
        .node("MatMul", &["x", "W1"], &["h"], &[])
        .node("Relu", &["h"], &["r"], &[])
        .node("MatMul", &["r", "W2"], &["z"], &[])
        .node("Softmax", &["z"], &["y"], &[])
        .output("y")
        .build()
}

#[test]
fn the_example_model_is_the_one_its_program_checks() {
    let committed = std::fs::read(example_dir().join("mlp.onnx")).expect("mlp.onnx");
    assert!(
        committed == example_model_bytes(),
        "examples/build-reuse/mlp.onnx differs from example_model_bytes(): run the ignored \
         regenerate test"
    );
}

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/build-reuse")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tt-build-reuse-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A record of `state` for `spec` on `target`, measured at `seconds`.
fn record(spec: &WorkloadSpec, target: &str, trace_json: String, seconds: f64) -> NewRecord {
    NewRecord::measured(
        Workload::new(spec.canonical(), spec.flops()),
        target,
        trace_json,
        Timing {
            median_s: seconds,
            min_s: seconds,
            max_s: seconds,
            repeats: 3,
        },
    )
}

/// A hand schedule of a matmul: `j` split by 16, the reduction moved outside the 16 lanes,
/// which are vectorized.
fn hand_schedule(spec: &WorkloadSpec) -> State {
    let dag = spec.build().expect("dag");
    let mut s = State::new(&dag);
    let out = (s.stages().len() - 1) as u32;
    s.split(out, 1, &[16]).expect("split");
    s.reorder(out, &[0, 1, 3, 2]).expect("reorder");
    s.vectorize(out, 3).expect("vectorize");
    s
}

fn db_with(path: &Path, records: &[NewRecord]) -> Database {
    let mut db = Database::open(path).expect("db");
    db.insert_batch(None, records).expect("insert");
    db
}

fn matmul(n: i64) -> WorkloadSpec {
    WorkloadSpec::parse(&format!("matmul:M={n},N={n},K={n}")).expect("spec")
}

#[test]
fn a_database_of_another_target_fails_the_build_with_its_targets() {
    let dir = temp_dir("other-target");
    let spec = matmul(32);
    let other = "llvm -mcpu=imaginary -mattr=+avx2 -threads=1";
    let trace = State::new(&spec.build().expect("dag")).trace().to_json();
    drop(db_with(
        &dir.join("r.db"),
        &[record(&spec, other, trace, 1e-3)],
    ));
    let build = Build::new(dir.join("r.db"))
        .workload("matmul:M=32,N=32,K=32")
        .out_dir(dir.join("out"));
    let err = build.clone().write().expect_err("no records for this CPU");
    assert!(matches!(err, ReuseError::NoTarget { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(other), "{msg}");
    assert!(msg.contains(&Target::host(1).key()), "{msg}");

    let built = build.fallback(true).write().expect("fallback");
    assert!(matches!(built.warnings[0], ReuseWarning::NoTarget { .. }));
    assert_eq!(built.kernels[0].2, Source::Default);
    assert!(built.lib.exists() && built.module.exists());

    // A key naming another CPU cannot be built for at all.
    let err = Build::new(dir.join("r.db"))
        .workload("matmul:M=32,N=32,K=32")
        .target(other)
        .out_dir(dir.join("out"))
        .write()
        .expect_err("another CPU");
    assert!(matches!(err, ReuseError::Target { .. }), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_record_falls_back_or_fails_as_asked() {
    let dir = temp_dir("missing");
    let (tuned, untuned) = (matmul(32), matmul(48));
    let key = Target::host(1).key();
    let trace = hand_schedule(&tuned).trace().to_json();
    let db = db_with(&dir.join("r.db"), &[record(&tuned, &key, trace, 1e-3)]);

    let strict = ReuseOptions {
        missing: Missing::Error,
        ..ReuseOptions::default()
    };
    let err =
        Kernel::from_records_with(&db, &untuned, &Target::host(1), &strict).expect_err("strict");
    assert!(matches!(err, ReuseError::NoRecord { .. }), "{err}");
    let (kernel, choice) =
        Kernel::from_records_with(&db, &untuned, &Target::host(1), &ReuseOptions::default())
            .expect("fallback");
    assert_eq!(choice.source, Source::Default);
    assert!(matches!(
        choice.warnings[..],
        [ReuseWarning::NoRecord { .. }]
    ));
    let (tuned_kernel, choice) =
        Kernel::from_records_with(&db, &tuned, &Target::host(1), &strict).expect("tuned");
    assert!(matches!(choice.source, Source::Record { .. }));
    assert!(choice.warnings.is_empty());

    // Both compute the product.
    let rt = Runtime::serial();
    for (k, n) in [(&kernel, 48usize), (&tuned_kernel, 32)] {
        let a = ndarray::Array2::<f32>::from_shape_fn((n, n), |(i, j)| (i + 2 * j) as f32 / 64.0);
        let b = ndarray::Array2::<f32>::from_shape_fn((n, n), |(i, j)| (i * j % 7) as f32);
        let c = k
            .run_arrays(&rt, &[a.view().into_dyn(), b.view().into_dyn()])
            .expect("run");
        let want = a.dot(&b).into_dyn();
        assert!(c[0]
            .iter()
            .zip(want.iter())
            .all(|(x, y)| (x - y).abs() <= 1e-3 * y.abs().max(1.0)));
    }

    // The same through the build.
    let build = Build::new(dir.join("r.db"))
        .workloads(["matmul:M=32,N=32,K=32", "matmul:M=48,N=48,K=48"])
        .out_dir(dir.join("out"));
    let err = build.clone().write().expect_err("strict build");
    assert!(err.to_string().contains("matmul:K=48,M=48,N=48"), "{err}");
    let built = build.fallback(true).write().expect("fallback build");
    assert!(matches!(built.kernels[0].2, Source::Record { .. }));
    assert_eq!(built.kernels[1].2, Source::Default);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stale_record_is_skipped_for_the_next_best() {
    let dir = temp_dir("stale");
    let spec = matmul(32);
    let key = Target::host(1).key();
    let good = hand_schedule(&spec).trace().to_json();
    // A step kind this version does not know (an older or newer tool), and a split of a loop
    // the DAG does not have: both are faster than the good record, both unusable.
    let unknown = r#"{"steps":[{"op":"retile","stage":0}]}"#.to_string();
    let bad = good.replacen(r#""iter":1,"factors""#, r#""iter":9,"factors""#, 1);
    assert_ne!(bad, good, "the bad split must differ from the good trace");
    let db = db_with(
        &dir.join("r.db"),
        &[
            record(&spec, &key, unknown, 1e-5),
            record(&spec, &key, bad, 2e-5),
            record(&spec, &key, good, 1e-3),
        ],
    );
    let (_, choice) =
        Kernel::from_records_with(&db, &spec, &Target::host(1), &ReuseOptions::default())
            .expect("kernel");
    assert_eq!(
        choice.state.trace().steps_json(),
        hand_schedule(&spec).trace().steps_json()
    );
    let stale: Vec<_> = choice
        .warnings
        .iter()
        .filter(|w| matches!(w, ReuseWarning::Stale { .. }))
        .collect();
    assert_eq!(stale.len(), 2, "{:?}", choice.warnings);
    let best = db
        .best(&spec.canonical(), &key)
        .expect("best")
        .expect("a record");
    assert!(
        stale[0].to_string().contains(&format!("#{}", best.id.0)),
        "{}",
        stale[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tensortune codegen --db --workload --emit obj --out` and a C program that includes the
/// header, links the object, and checks one product. Skipped where there is no C compiler.
#[test]
fn codegen_emits_an_object_and_header_for_c() {
    let Some(cc) = ["cc", "clang", "gcc"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
    else {
        eprintln!("skipped: no C compiler");
        return;
    };
    let dir = temp_dir("cli");
    let spec = matmul(16);
    let key = Target::host(1).key();
    drop(db_with(
        &dir.join("r.db"),
        &[record(
            &spec,
            &key,
            hand_schedule(&spec).trace().to_json(),
            1e-6,
        )],
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_tensortune"))
        .args(["codegen", "--db"])
        .arg(dir.join("r.db"))
        .args([
            "--workload",
            "matmul:M=16,N=16,K=16",
            "--emit",
            "obj",
            "--out",
        ])
        .arg(dir.join("mm.o"))
        .output()
        .expect("tensortune runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("record #"));
    let header = std::fs::read_to_string(dir.join("mm.h")).expect("header");
    assert!(
        header.contains("int32_t tt_matmul_k16_m16_n16(const float *A"),
        "{header}"
    );
    let main = r#"
#include <stdio.h>
#include <stdlib.h>
#include "mm.h"
static int32_t pfor(const tt_runtime *rt, int64_t n, tt_parallel_body body, void *c) { return body(c, 0, n); }
static void *al(const tt_runtime *rt, int64_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }
static void fr(const tt_runtime *rt, void *p) { free(p); }
int main(void) {
  tt_runtime rt = {pfor, al, fr, 0};
  float *a = aligned_alloc(64, 1024), *b = aligned_alloc(64, 1024), *c = aligned_alloc(64, 1024);
  for (int i = 0; i < 256; i++) { a[i] = i % 16; b[i] = 1; }
  if (tt_matmul_k16_m16_n16(a, b, c, &rt) != 0) return 2;
  /* C[i][j] = sum_k A[i][k] = 0 + 1 + ... + 15 */
  for (int i = 0; i < 256; i++) if (c[i] != 120.0f) { printf("bad %d %f\n", i, c[i]); return 3; }
  printf("ok\n");
  return 0;
}
"#;
    std::fs::write(dir.join("main.c"), main).expect("write");
    let exe = dir.join("prog");
    let link = Command::new(cc)
        .arg(dir.join("main.c"))
        .arg(dir.join("mm.o"))
        .arg("-I")
        .arg(&dir)
        .args(["-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(
        link.status.success(),
        "{}",
        String::from_utf8_lossy(&link.stderr)
    );
    let run = Command::new(&exe).output().expect("run");
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "ok");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The target directory this test binary was built in (`<target>/release/deps/this`).
fn target_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(d));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.to_path_buf())
}

/// Builds the example with cargo, runs it, and looks at its binary.
///
/// tensortune is a build-dependency of the example, without its `tuning` feature, so this
/// compiles the reuse stack (LLVM bindings, SQLite, the schedule language) once more for the
/// build script, but not XGBoost: a few minutes on two cores the first time. It builds in a
/// target directory of its own under this one, kept for the next run.
#[test]
fn the_example_builds_runs_and_links_no_llvm() {
    let Some(target) = target_dir() else {
        panic!("cannot tell the target directory");
    };
    // Not the directory `cargo test` itself holds a lock on while it runs.
    let target = target.join("build-reuse-example");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--release", "--manifest-path"])
        .arg(example_dir().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "example build failed:\n{stderr}");
    let exe = target.join("release/build-reuse");
    let run = Command::new(&exe).output().expect("example runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("all results match ndarray"), "{stdout}");
    assert!(stdout.contains("refused as expected"), "{stdout}");
    assert!(stdout.contains("mlp.onnx (whole network): "), "{stdout}");

    // This test binary links tensortune, and so LLVM: the example must be far smaller.
    let said = built_program::check_no_llvm(&exe, "tt_matmul_k256_m256_n256")
        .unwrap_or_else(|e| panic!("the example: {e}"));
    eprintln!("example {said}");
}

const RUST_MAIN: &str = r#"
include!(concat!(env!("OUT_DIR"), "/tuned.rs"));
fn main() {
    let n = 256usize;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.5).collect();
    let mut c = vec![0.0f32; n * n];
    tuned::matmul_k256_m256_n256(&a, &b, &mut c).expect("matmul");
    for i in (0..n).step_by(17) {
        for j in (0..n).step_by(13) {
            let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
            assert!((c[i * n + j] - want).abs() <= 1e-3 * want.abs().max(1.0), "c[{i}][{j}]");
        }
    }
    let short = vec![0.0f32; 3];
    assert!(tuned::matmul_k256_m256_n256(&short, &b, &mut c).is_err());
    println!("ok {} {}", tuned::threads(), tuned::KERNELS[0].source);
}
"#;

/// The library and module of the example's database (or default schedules where it has no
/// records for this CPU), compiled into a program by `rustc` alone: it links, computes the
/// product, refuses a short slice, and contains no LLVM.
#[test]
fn generated_module_links_without_llvm() {
    let dir = temp_dir("rustc");
    let built = Build::new(example_dir().join("records.db"))
        .workload("matmul:M=256,N=256,K=256")
        .threads(EXAMPLE_THREADS)
        .fallback(true)
        .out_dir(&dir)
        .write()
        .expect("build");
    std::fs::write(dir.join("main.rs"), RUST_MAIN).expect("write");
    let exe = built_program::compile_main(&dir, &dir.join("main.rs"), &built.lib_name)
        .unwrap_or_else(|e| panic!("rustc: {e}"));
    let run = Command::new(&exe).output().expect("program runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.starts_with(&format!("ok {EXAMPLE_THREADS} ")),
        "{stdout}"
    );
    let said = built_program::check_no_llvm(&exe, "tt_matmul_k256_m256_n256")
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rewrites the example's model from [`example_model_bytes`].
#[test]
#[ignore = "rewrites examples/build-reuse/mlp.onnx"]
fn regenerate_example_model() {
    std::fs::write(example_dir().join("mlp.onnx"), example_model_bytes()).expect("write");
}

/// Re-tunes the example's database on this machine (a few seconds per workload), its model's
/// tasks included.
#[test]
#[ignore = "rewrites examples/build-reuse/records.db"]
fn regenerate_example_records() {
    let path = example_dir().join("records.db");
    let model = example_dir().join("mlp.onnx");
    std::fs::write(&model, example_model_bytes()).expect("write mlp.onnx");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    for w in EXAMPLE_WORKLOADS {
        let spec = WorkloadSpec::parse(w).expect("spec");
        let opts = TuneOptions {
            trials: 24,
            batch_size: 8,
            population: 64,
            remeasure_top: 0,
            db: Some(path.clone()),
            quiet: true,
            ..Default::default()
        };
        let r = tensortune::tune(&spec, &Target::host(EXAMPLE_THREADS), &opts).expect("tune");
        eprintln!("{w}: {:.1} GFLOP/s", r.best_gflops.unwrap_or(0.0));
    }
    let plan = tensortune::model::plan_file(&model, &Default::default()).expect("plan");
    let opts = TuneOptions {
        trials: 8 * plan.tasks.len(),
        batch_size: 8,
        remeasure_top: 0,
        db: Some(path.clone()),
        quiet: true,
        ..Default::default()
    };
    tensortune::model::tune_model(&plan, &Target::host(EXAMPLE_THREADS), &opts).expect("tune");
    // Readers of a database in WAL mode leave -wal/-shm files beside it; a committed file is
    // only read, so switch it to a rollback journal where the sqlite3 tool is installed.
    let _ = Command::new("sqlite3")
        .arg(&path)
        .arg("PRAGMA journal_mode=DELETE; VACUUM;")
        .output();
}
