//! One parallel runtime: a multi-threaded matmul kernel built by `tensortune::build` into a
//! program of its own (which carries the runtime as source) computes what the JIT kernel and
//! the direct evaluator compute, with 2 and 4 threads, over repeated calls. Speed is compared
//! by `examples/jit_vs_build.rs`, not here.

#[path = "../examples/common/built_program.rs"]
mod built_program;

use std::path::PathBuf;
use std::process::Command;
use tensortune::measure::{max_reduction_len, random_inputs, tolerance};
use tensortune::runtime::Runtime;
use tensortune::schedules::data::{Data, NdData};
use tensortune::schedules::ops::WorkloadSpec;
use tensortune::schedules::{eval, lower::lower, DType};
use tensortune::Kernel;

/// Rows not a multiple of the threads or of the row block: chunks of unequal size.
const SPEC: &str = "matmul:M=97,N=80,K=64";

/// Reads A and B (little-endian f32), runs the kernel `REPEATS` times, checks every result
/// equals the first, writes C and prints the pool's thread count.
const MAIN: &str = r#"
include!(concat!(env!("OUT_DIR"), "/tuned.rs"));
const REPEATS: usize = 20;
fn read(path: &str) -> Vec<f32> {
    let bytes = std::fs::read(path).expect("input file");
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (a, b) = (read(&args[1]), read(&args[2]));
    let len: usize = args[4].parse().expect("output length");
    let mut first = vec![0.0f32; len];
    tuned::KERNEL(&a, &b, &mut first).expect("kernel");
    for _ in 1..REPEATS {
        let mut c = vec![0.0f32; len];
        tuned::KERNEL(&a, &b, &mut c).expect("kernel");
        assert!(c.iter().zip(&first).all(|(x, y)| x.to_bits() == y.to_bits()), "calls differ");
    }
    let out: Vec<u8> = first.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(&args[3], out).expect("output file");
    println!("threads {}", tuned::threads());
}
"#;

fn temp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("tt-build-parallel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn f32s(x: &NdData) -> &[f32] {
    match &x.data {
        Data::F32(v) => v,
        other => panic!("expected f32 data, got {:?}", other.dtype()),
    }
}

#[test]
fn a_built_parallel_kernel_matches_the_jit_and_the_evaluator() {
    let dir = temp_dir();
    let spec = WorkloadSpec::parse(SPEC).expect("spec");
    let dag = spec.build().expect("dag");
    let state = built_program::parallel_matmul(&spec).expect("schedule");
    let func = lower(&state).expect("lowers");
    assert!(
        func.to_string().contains("parallel "),
        "no parallel loop:\n{func}"
    );
    let kernel = Kernel::from_state(&state, &Default::default()).expect("compiles");
    let ins = random_inputs(&dag, 7).expect("inputs");
    let want = eval::evaluate(&dag, &ins).expect("evaluates");
    let tol = tolerance(DType::F32, max_reduction_len(&dag));
    for (name, x) in ["a.bin", "b.bin"].iter().zip(&ins) {
        let bytes: Vec<u8> = f32s(x).iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.join(name), bytes).expect("write input");
    }
    let len = f32s(&want[0]).len();

    for threads in [2, 4] {
        let rt = Runtime::new(threads).expect("runtime");
        let jit = kernel.run_nd(&rt, &ins).expect("jit runs");
        let d = jit[0].max_rel_diff(&want[0]).expect("same shape");
        assert!(
            d <= tol,
            "{threads} threads: the JIT differs by {d} > {tol}"
        );

        let sub = dir.join(format!("t{threads}"));
        let exe = built_program::build_program(&sub, &spec, &state, threads, MAIN)
            .unwrap_or_else(|e| panic!("{threads} threads: build: {e}"));
        let out = Command::new(&exe)
            .arg(dir.join("a.bin"))
            .arg(dir.join("b.bin"))
            .arg(sub.join("c.bin"))
            .arg(len.to_string())
            .output()
            .expect("program runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout.trim(), format!("threads {threads}"));
        let bytes = std::fs::read(sub.join("c.bin")).expect("output");
        let built: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let built = NdData::new(want[0].shape.clone(), Data::F32(built)).expect("shape");
        let d = built.max_rel_diff(&want[0]).expect("same shape");
        assert!(
            d <= tol,
            "{threads} threads: the build differs by {d} > {tol}"
        );
        // The same machine code over the same static chunks: the same bits.
        let same = f32s(&built)
            .iter()
            .zip(f32s(&jit[0]))
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{threads} threads: the build and the JIT differ");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
