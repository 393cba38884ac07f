//! `tensortune codegen --target cuda` and `tensortune show --target cuda` end to end, with no
//! GPU: PTX, NVPTX LLVM IR and loop IR of the default GPU schedule of every op of the library,
//! `ptxas` assembling the PTX where one is found (skipped with a message otherwise), a record
//! of a CUDA key from a database, and the usage errors (exit status 2, one line).

use std::path::PathBuf;
use std::process::{Command, Output};
use tensortune::records::{Database, NewRecord, Timing, Workload};
use tensortune::schedules::ops::{WorkloadSpec, OPS};
use tensortune::schedules::target::CudaDesc;
use tensortune::tuner::sketch::rules::default_schedule;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensortune"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("tensortune runs")
}

fn stdout_of_success(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts exit status 2 and one line on stderr that contains every one of `needles`.
fn assert_usage_error(out: &Output, needles: &[&str], what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: not one line:\n{err}"
    );
    for n in needles {
        assert!(err.contains(n), "{what}: no `{n}` in {err}");
    }
}

/// Small shapes of every op of the library (the test fails on an op added without one), and
/// of every dtype.
const SPECS: [&str; 11] = [
    "matmul:M=24,N=20,K=12",
    "matmul:M=8,N=8,K=8,dtype=f64",
    "matmul:M=24,N=20,K=12,dtype=bf16",
    "dense_bias_relu:M=12,N=20,K=10,dtype=bf16",
    "batch_matmul:B=2,M=12,N=10,K=6",
    "dense_bias_relu:M=12,N=20,K=9",
    "conv2d:N=1,C=3,H=7,W=7,K=4,R=3,S=3,stride=1,pad=1",
    "conv2d_hwio:N=1,C=3,H=7,W=7,K=4,R=3,S=3,stride=1,pad=1",
    "depthwise_conv2d:N=1,C=4,H=7,W=7,R=3,S=3,stride=1,pad=1",
    "softmax:M=6,N=10",
    "reduce_sum:M=10,N=14",
];

/// `ptxas`: `$PTXAS`, else on `PATH`, else in the `nvidia-cuda-nvcc-cu12` wheel of `python3`
/// (as tests/gpu_verify.rs finds it).
fn find_ptxas() -> Option<PathBuf> {
    tensortune::codegen::nvptx::find_ptxas()
}

/// Assembles `ptx` with `ptxas -arch=sm_90`; `false` (and a message) without a `ptxas`.
fn assemble(ptxas: Option<&PathBuf>, ptx: &str, what: &str) -> bool {
    let Some(ptxas) = ptxas else {
        eprintln!("skipped ptxas for {what}: none found (pip install nvidia-cuda-nvcc-cu12)");
        return false;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("k.ptx");
    std::fs::write(&file, ptx).expect("write PTX");
    let out = Command::new(ptxas)
        .arg("-arch=sm_90")
        .arg("-o")
        .arg(dir.path().join("k.cubin"))
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", ptxas.display()));
    assert!(
        out.status.success(),
        "ptxas rejected {what}:\n{}\n{ptx}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

#[test]
fn every_op_emits_ptx_for_cuda_that_ptxas_assembles() {
    for op in OPS {
        assert!(
            SPECS.iter().any(|s| s.split(':').next() == Some(op.name)),
            "no spec for `{}`",
            op.name
        );
    }
    let ptxas = find_ptxas();
    let mut assembled = 0;
    for spec in SPECS {
        let symbol = format!("tt_{}", WorkloadSpec::parse(spec).expect("spec").ident());
        let ptx = stdout_of_success(
            &run(&[
                "codegen",
                "--target",
                "cuda",
                "--emit",
                "ptx",
                "--workload",
                spec,
            ]),
            spec,
        );
        assert!(ptx.contains(".entry"), "{spec}: no .entry\n{ptx}");
        assert!(ptx.contains(&symbol), "{spec}: no `{symbol}`\n{ptx}");
        assert!(ptx.contains(".target sm_90"), "{spec}\n{ptx}");
        // Everything is in the kernel: no call to a function defined elsewhere (libdevice).
        assert!(!ptx.contains(".extern"), "{spec}\n{ptx}");
        assembled += assemble(ptxas.as_ref(), &ptx, spec) as usize;
    }
    eprintln!("ptxas assembled {assembled} of {} kernels", SPECS.len());
}

#[test]
fn cuda_emits_nvptx_llvm_ir_and_the_bound_loop_nest() {
    let spec = "matmul:M=24,N=20,K=12";
    let ir = stdout_of_success(
        &run(&[
            "codegen",
            "--target",
            "cuda -arch=sm_86",
            "--emit",
            "llvm",
            "--workload",
            spec,
        ]),
        "llvm",
    );
    assert!(ir.contains("nvptx64-nvidia-cuda"), "{ir}");
    assert!(ir.contains("define"), "{ir}");
    assert!(ir.contains("tt_matmul"), "{ir}");
    let nest = stdout_of_success(
        &run(&[
            "codegen",
            "--target",
            "cuda",
            "--emit",
            "loop",
            "--workload",
            spec,
        ]),
        "loop",
    );
    assert!(nest.contains("blockIdx.x for"), "{nest}");
    assert!(nest.contains("threadIdx.x for"), "{nest}");
    let ptx = stdout_of_success(
        &run(&[
            "codegen",
            "--target",
            "cuda -arch=sm_80",
            "--emit",
            "ptx",
            "--workload",
            spec,
        ]),
        "sm_80",
    );
    assert!(ptx.contains(".target sm_80"), "{ptx}");
}

#[test]
fn bad_cuda_requests_are_usage_errors() {
    let spec = "matmul:M=8,N=8,K=8";
    assert_usage_error(
        &run(&[
            "codegen",
            "--target",
            "cuda -arch=sm_75",
            "--emit",
            "ptx",
            "--workload",
            spec,
        ]),
        &["sm_75", "sm_80", "sm_90"],
        "unknown arch",
    );
    assert_usage_error(
        &run(&[
            "codegen",
            "--target",
            "cuda -arch=volta",
            "--emit",
            "ptx",
            "--workload",
            spec,
        ]),
        &["volta"],
        "malformed arch",
    );
    assert_usage_error(
        &run(&[
            "codegen",
            "--target",
            "llvm",
            "--emit",
            "ptx",
            "--workload",
            spec,
        ]),
        &["--emit ptx"],
        "ptx for llvm",
    );
    assert_usage_error(
        &run(&["codegen", "--emit", "ptx", "--workload", spec]),
        &["--emit ptx"],
        "ptx for the host",
    );
    for emit in ["obj", "asm"] {
        assert_usage_error(
            &run(&[
                "codegen",
                "--target",
                "cuda",
                "--emit",
                emit,
                "--workload",
                spec,
            ]),
            &["--emit ptx"],
            emit,
        );
    }
}

/// A database holding one record of a CUDA key: the default GPU schedule of a matmul.
fn cuda_db(dir: &std::path::Path, spec: &WorkloadSpec, target: &str) -> PathBuf {
    let dag = spec.build().expect("dag");
    let desc = CudaDesc::for_arch("sm_90").expect("sm_90");
    let (state, _) = default_schedule(&dag, &desc);
    let path = dir.join("cuda.db");
    let mut db = Database::open(&path).expect("db");
    let rec = NewRecord::measured(
        Workload::new(spec.canonical(), spec.flops()),
        target,
        state.trace().to_json(),
        Timing {
            median_s: 1e-5,
            min_s: 1e-5,
            max_s: 1e-5,
            repeats: 3,
        },
    );
    db.insert_batch(None, &[rec]).expect("insert");
    path
}

#[test]
fn codegen_and_show_read_a_record_of_a_cuda_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = WorkloadSpec::parse("matmul:M=32,N=32,K=16").expect("spec");
    let db = cuda_db(dir.path(), &spec, "cuda -arch=sm_90");
    let db_arg = db.display().to_string();
    let canonical = spec.canonical();
    let ptx = stdout_of_success(
        &run(&[
            "codegen",
            "--db",
            &db_arg,
            "--target",
            "cuda",
            "--emit",
            "ptx",
            "--workload",
            &canonical,
        ]),
        "codegen --db",
    );
    assert!(ptx.contains(".entry"), "{ptx}");
    // Another key has no record: an error, or with --fallback the default GPU schedule.
    let other = [
        "codegen",
        "--db",
        &db_arg,
        "--target",
        "cuda -arch=sm_86",
        "--emit",
        "ptx",
    ];
    let out = bin()
        .args(other)
        .args(["--workload", &canonical])
        .output()
        .expect("runs");
    assert_usage_error(&out, &["cuda -arch=sm_86"], "no record");
    let out = bin()
        .args(other)
        .args(["--fallback", "--workload", &canonical])
        .output()
        .expect("runs");
    assert!(stdout_of_success(&out, "fallback").contains(".target sm_86"));

    let shown = stdout_of_success(
        &run(&[
            "show",
            "--db",
            &db_arg,
            "--target",
            "cuda",
            "--workload",
            &canonical,
        ]),
        "show",
    );
    for want in [
        "on cuda",
        "GFLOP/s",
        "blockIdx.x for",
        "threadIdx.x for",
        "launch: grid (",
        "threads/block",
        "bytes shared/block",
    ] {
        assert!(shown.contains(want), "no `{want}` in\n{shown}");
    }
}

/// Without `--db`, `show` prints the target's default schedule; for CUDA with the launch the
/// verifier agrees with.
#[test]
fn show_prints_the_default_gpu_schedule_with_its_launch() {
    let shown = stdout_of_success(
        &run(&[
            "show",
            "--target",
            "cuda",
            "--workload",
            "matmul:M=64,N=64,K=64",
        ]),
        "show",
    );
    for want in [
        "the default GPU schedule",
        "blockIdx.x for",
        "threadIdx.x for",
        "launch: grid (",
        "sm_90: ",
        "threads/block",
        "bytes shared/block (limit 49152)",
    ] {
        assert!(shown.contains(want), "no `{want}` in\n{shown}");
    }
    // The CPU's default is the unbound schedule, with no GPU section.
    let cpu = stdout_of_success(&run(&["show", "--workload", "matmul:M=8,N=8,K=8"]), "cpu");
    assert!(cpu.contains("the default schedule"), "{cpu}");
    assert!(!cpu.contains("launch:"), "{cpu}");
    assert_usage_error(
        &run(&[
            "show",
            "--target",
            "cuda -arch=sm_70",
            "--workload",
            "matmul:M=8,N=8,K=8",
        ]),
        &["sm_70"],
        "show unknown arch",
    );
}
