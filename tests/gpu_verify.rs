//! The GPU verifier (`tensortune_schedules::gpu::verify`) against `ptxas`: for kernels with
//! shared temporaries of different sizes, the static shared memory `ptxas -v` reports for
//! the PTX that `emit_ptx` makes is exactly the verifier's `shared_bytes` (alignment gaps
//! between arrays included), and the registers are within the description's limit. Skipped (with a message) where no `ptxas` is found.

use std::path::PathBuf;
use std::process::Command;
use tensortune::codegen::nvptx::{emit_ptx, PtxasResources};
use tensortune_schedules::expr::{BinOp, BufId};
use tensortune_schedules::gpu::verify::{verify_gpu, GpuUsage};
use tensortune_schedules::ir::{
    BufKind, BufferDecl, ForKind, LoweredFunc, Scope, Stmt, ThreadAxis,
};
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::CudaDesc;
use tensortune_schedules::{DType, Expr, Var};

const ARCH: &str = "sm_90";

fn desc() -> CudaDesc {
    CudaDesc::for_arch(ARCH).expect("sm_90 is in the table")
}

/// `ptxas`: `$PTXAS`, else on `PATH`, else in the `nvidia-cuda-nvcc-cu12` wheel of `python3`.
fn find_ptxas() -> Option<PathBuf> {
    tensortune::codegen::nvptx::find_ptxas()
}

/// Assembles `ptx` with `ptxas -arch=sm_90 -v` and reads the resource lines of its stderr.
fn ptxas_info(ptxas: &PathBuf, ptx: &str, what: &str) -> PtxasResources {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join(format!("{what}.ptx"));
    std::fs::write(&file, ptx).expect("write PTX");
    let out = Command::new(ptxas)
        .arg(format!("-arch={ARCH}"))
        .arg("-v")
        .arg("-o")
        .arg(dir.path().join(format!("{what}.cubin")))
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", ptxas.display()));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ptxas rejected {what}:\n{log}\n{ptx}");
    assert!(
        log.contains("Used "),
        "no `Used N registers` line from ptxas for {what}:\n{log}"
    );
    PtxasResources::parse(&log)
}

fn f_buffer(name: &str, dtype: DType, len: i64, kind: BufKind, scope: Scope) -> BufferDecl {
    BufferDecl {
        name: name.into(),
        dtype,
        shape: vec![len],
        scope,
        kind,
        row_pad: 0,
    }
}

fn load(buf: u32, dtype: DType, index: Expr) -> Expr {
    Expr::BufLoad {
        buf: BufId(buf),
        dtype,
        index: Box::new(index),
    }
}

fn add(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::Add, a, b)
}

fn mul(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::Mul, a, b)
}

fn thread_loop(var: Var, extent: i64, body: Stmt) -> Stmt {
    Stmt::For {
        var,
        extent,
        kind: ForKind::ThreadBound(ThreadAxis::ThreadX),
        body: Box::new(body),
    }
}

fn serial(var: Var, extent: i64, body: Stmt) -> Stmt {
    Stmt::For {
        var,
        extent,
        kind: ForKind::Serial,
        body: Box::new(body),
    }
}

/// A kernel of `threads` threads with one shared temporary per entry of `shared` (its dtype
/// and elements). Each thread fills its slice of every temporary from the input `A`, the
/// block meets at a barrier, and each thread then sums, for every temporary, the element a
/// reversed index picks (one another thread wrote) into its own element of `B`. Every
/// temporary is written and read through indices that depend on the thread, so LLVM cannot
/// fold or remove any of them.
fn shared_kernel(name: &str, threads: i64, shared: &[(DType, i64)]) -> LoweredFunc {
    let len = threads * 8;
    let mut buffers = vec![
        f_buffer("A", DType::F32, len, BufKind::Input(0), Scope::Global),
        f_buffer("B", DType::F32, threads, BufKind::Output(0), Scope::Global),
    ];
    let mut next = 0u32;
    let mut var = |name: &str| {
        next += 1;
        Var::new(next - 1, name)
    };
    let mut fills = Vec::new();
    let mut sum = Expr::f32(0.0);
    let tid = var("t_read");
    for (n, &(dtype, elems)) in shared.iter().enumerate() {
        let buf = 2 + n as u32;
        buffers.push(f_buffer(
            &format!("S{n}.shared"),
            dtype,
            elems,
            BufKind::Temp,
            Scope::Shared,
        ));
        // Thread t writes elements t, t + threads, ... below `elems`.
        let per_thread = (elems + threads - 1) / threads;
        let (t, r) = (var("t"), var("r"));
        let idx = add(mul(Expr::var(&r), Expr::int(threads)), Expr::var(&t));
        let value = load(0, DType::F32, Expr::var(&t)).cast(dtype);
        let store = Stmt::Store {
            buf: BufId(buf),
            index: idx.clone(),
            value,
        };
        let guarded = Stmt::If {
            cond: idx.lt(Expr::int(elems)),
            then: Box::new(store),
            otherwise: None,
        };
        fills.push(thread_loop(t, threads, serial(r, per_thread, guarded)));
        // Thread t reads element elems - 1 - t mod elems: another thread's.
        let rev = Expr::bin(
            BinOp::Sub,
            Expr::int(elems - 1),
            Expr::var(&tid).floormod(Expr::int(elems)),
        );
        sum = add(sum, load(buf, dtype, rev).cast(DType::F32));
    }
    let read = thread_loop(
        tid,
        threads,
        Stmt::Store {
            buf: BufId(1),
            index: Expr::var(&tid),
            value: sum,
        },
    );
    let mut body = Stmt::seq(fills.into_iter().chain([Stmt::Sync, read]).collect());
    for n in (0..shared.len()).rev() {
        body = Stmt::Allocate {
            buf: BufId(2 + n as u32),
            body: Box::new(body),
        };
    }
    LoweredFunc {
        name: name.into(),
        buffers,
        params: vec![BufId(0), BufId(1)],
        body,
        num_vars: next,
    }
}

/// The value of a schedule step, or a panic naming it.
fn step<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A 64x64x64 matmul in 16x16 blocks of 16x16 threads, with `A` and `B` staged through
/// shared memory per step of 8 along k by the block's threads together (the schedule of a
/// GPU sketch, by hand).
fn shared_matmul() -> LoweredFunc {
    let dag = WorkloadSpec::parse("matmul:M=64,N=64,K=64")
        .and_then(|w| w.build())
        .expect("matmul builds");
    let mut s = State::new(&dag);
    let a = step(s.cache_read(0, Scope::Shared, &[2]), "cache A"); // 0 A, 1 A.shared, 2 B, 3 C
    let b = step(s.cache_read(2, Scope::Shared, &[3]), "cache B"); // .. 3 B.shared, 4 C
    let c = 4;
    step(s.split(c, 0, &[16]), "split i"); // io ii j k
    step(s.split(c, 2, &[16]), "split j"); // io ii jo ji k
    step(s.split(c, 4, &[8]), "split k"); // io ii jo ji ko ki
    step(s.reorder(c, &[0, 2, 1, 3, 4, 5]), "reorder"); // io jo ii ji ko ki
    for (pos, axis) in [
        ThreadAxis::BlockX,
        ThreadAxis::BlockY,
        ThreadAxis::ThreadX,
        ThreadAxis::ThreadY,
    ]
    .into_iter()
    .enumerate()
    {
        step(s.bind(c, pos as u32, axis), "bind");
    }
    step(s.compute_at(a, c, 4), "A.shared at ko");
    step(s.compute_at(b, c, 4), "B.shared at ko");
    // Each copy spread over the block's threads (16 x 8 and 8 x 16 of its 16 x 16), so that
    // no two threads write one element.
    for copy in [a, b] {
        step(s.bind(copy, 0, ThreadAxis::ThreadX), "bind the copy's rows");
        step(
            s.bind(copy, 1, ThreadAxis::ThreadY),
            "bind the copy's columns",
        );
    }
    lower(&s).unwrap_or_else(|e| panic!("lowers: {e}\n{s}"))
}

fn checked(f: &LoweredFunc) -> GpuUsage {
    verify_gpu(f, &desc()).unwrap_or_else(|e| panic!("{}: {e}\n{f}", f.name))
}

#[test]
fn shared_memory_and_registers_agree_with_ptxas() {
    let kernels = [
        shared_kernel("one_f32", 32, &[(DType::F32, 32)]),
        shared_kernel("f32_and_f64", 256, &[(DType::F32, 1024), (DType::F64, 512)]),
        shared_kernel(
            "three",
            128,
            &[(DType::F32, 4), (DType::I32, 2048), (DType::F64, 100)],
        ),
        // Exactly the 48 KiB of static shared memory a block may have.
        shared_kernel(
            "at_the_limit",
            512,
            &[(DType::F32, 8192), (DType::F64, 2048)],
        ),
        shared_matmul(),
        // Sizes that are no multiple of the arrays' 16-byte alignment: gaps between them.
        shared_kernel(
            "unaligned",
            32,
            &[(DType::F32, 33), (DType::F32, 5), (DType::F64, 3)],
        ),
        shared_kernel(
            "unaligned_four",
            64,
            &[
                (DType::F64, 7),
                (DType::I32, 3),
                (DType::F32, 65),
                (DType::F32, 1),
            ],
        ),
    ];
    let want_bytes = [128, 4096 + 4096, 16 + 8192 + 800, 48 * 1024];
    for (f, want) in kernels.iter().zip(want_bytes) {
        assert_eq!(checked(f).shared_bytes, want, "{}", f.name);
    }
    // The matmul's two stages hold 16x8 elements each.
    assert_eq!(checked(&kernels[4]).shared_bytes, 2 * 16 * 8 * 4);
    // 132 bytes to 144, 20 to 176, then 24; 56 to 64, 12 to 80, 260 to 352, then 4.
    assert_eq!(checked(&kernels[5]).shared_bytes, 200);
    assert_eq!(checked(&kernels[6]).shared_bytes, 356);
    let Some(ptxas) = find_ptxas() else {
        eprintln!("skipped: no ptxas (pip install nvidia-cuda-nvcc-cu12, or set PTXAS)");
        return;
    };
    let d = desc();
    for f in &kernels {
        let usage = checked(f);
        let ptx = emit_ptx(f, ARCH).unwrap_or_else(|e| panic!("{}: {e}\n{f}", f.name));
        let info = ptxas_info(&ptxas, &ptx, &f.name);
        eprintln!("{}: {info:?}, verifier {usage:?}", f.name);
        assert_eq!(
            info.shared_bytes, usage.shared_bytes,
            "{}: ptxas and the verifier disagree on shared memory\n{f}",
            f.name
        );
        assert!(
            info.registers <= d.registers_per_thread,
            "{}: {} registers",
            f.name,
            info.registers
        );
    }
}

/// A kernel one element over the limit is refused before any code is made, and `ptxas`
/// refuses it too: the limit is the GPU's, not a guess.
#[test]
fn over_the_static_limit_both_refuse() {
    let f = shared_kernel("over", 512, &[(DType::F32, 8192), (DType::F64, 2049)]);
    let e = verify_gpu(&f, &desc()).expect_err("over 48 KiB");
    assert!(
        e.to_string()
            .contains("`S0.shared`, `S1.shared` over the 48 KiB per block of sm_90"),
        "{e}"
    );
    let Some(ptxas) = find_ptxas() else {
        eprintln!("skipped: no ptxas (pip install nvidia-cuda-nvcc-cu12, or set PTXAS)");
        return;
    };
    let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("over.ptx");
    std::fs::write(&file, &ptx).expect("write PTX");
    let out = Command::new(&ptxas)
        .arg(format!("-arch={ARCH}"))
        .arg("-o")
        .arg(dir.path().join("over.cubin"))
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", ptxas.display()));
    assert!(
        !out.status.success(),
        "ptxas took 49160 bytes of static shared memory:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "ptxas refused it: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `draws` lowered candidates of the GPU sketches of `spec` for sm_90 (the sketches in turn,
/// decisions drawn from `seed`), each with its decisions.
fn gpu_draws(
    spec: &str,
    draws: usize,
    seed: u64,
) -> Vec<(Vec<Vec<i64>>, tensortune_schedules::ir::LoweredFunc)> {
    use rand::SeedableRng;
    use tensortune_schedules::target::TargetDesc;
    use tensortune_tuner::sketch::rules::{generate_for, gpu_rules};
    use tensortune_tuner::sketch::sample::sample;
    let opts = tensortune_tuner::TuneOptions::default();
    let target = TargetDesc::Cuda(desc());
    let d = step(step(WorkloadSpec::parse(spec), spec).build(), spec);
    let sketches = generate_for(&d, &opts, &target, &gpu_rules());
    assert!(!sketches.is_empty(), "{spec}: no GPU sketch");
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(seed);
    (0..draws)
        .map(|n| {
            let sk = &sketches[n % sketches.len()];
            let dec = sample(sk, &mut rng, &opts);
            let s = step(sk.instantiate(&d, &dec), spec);
            (dec, step(lower(&s), spec))
        })
        .collect()
}

/// Sampled candidates of the GPU sketch rules, every op they cover, at shapes where blocks
/// hold many threads: each assembles, with the shared memory the verifier computed and
/// registers within the limit. `TENSORTUNE_PTXAS_SAMPLES` sets the draws per op (default 40;
/// the issue's 200 take about five times as long).
#[test]
fn sampled_gpu_candidates_of_every_op_assemble_as_verified() {
    let Some(ptxas) = find_ptxas() else {
        eprintln!("skipped: no ptxas (install the nvidia-cuda-nvcc-cu12 wheel or set PTXAS)");
        return;
    };
    let draws: usize = std::env::var("TENSORTUNE_PTXAS_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let desc = desc();
    for spec in [
        "matmul:M=128,N=96,K=64",
        "matmul:M=128,N=96,K=64,dtype=bf16",
        "batch_matmul:B=2,M=64,N=48,K=32",
        "dense_bias_relu:M=64,N=80,K=48",
        "conv2d:N=1,C=16,H=14,W=14,K=32,R=3,S=3,stride=1,pad=1",
        "conv2d_hwio:N=1,C=16,H=14,W=14,K=32,R=3,S=3,stride=1,pad=1",
        "depthwise_conv2d:N=1,C=32,H=14,W=14,R=3,S=3,stride=1,pad=1",
        "reduce_sum:M=128,N=96",
    ] {
        let (mut assembled, mut refused, mut wide) = (0, 0, 0);
        for (_, f) in gpu_draws(spec, draws, 11) {
            let usage = match verify_gpu(&f, &desc) {
                Ok(u) => u,
                Err(_) => {
                    // Over the thread or shared-memory limit: the cheap error record.
                    refused += 1;
                    continue;
                }
            };
            let ptx = step(emit_ptx(&f, ARCH), spec);
            let info = ptxas_info(&ptxas, &ptx, "candidate");
            if info.shared_bytes != usage.shared_bytes {
                for l in ptx.lines().filter(|l| l.contains(".shared")) {
                    eprintln!("{l}");
                }
            }
            assert_eq!(
                info.shared_bytes, usage.shared_bytes,
                "{spec}: ptxas and the verifier disagree on shared memory\n{f}"
            );
            assert!(
                info.registers <= desc.registers_per_thread,
                "{spec}: {info:?}"
            );
            assembled += 1;
            // Cooperative fetches whose lanes are provably contiguous and aligned move
            // 8 or 16 bytes per instruction.
            // (Read-only inputs load through the non-coherent cache: `ld.global.nc.v4.f32`.)
            wide +=
                usize::from(ptx.lines().any(|l| {
                    l.contains("ld.global") && (l.contains(".v2.") || l.contains(".v4."))
                }));
        }
        eprintln!(
            "{spec}: {assembled} assembled ({wide} with vector loads), {refused} refused by the \
             verifier"
        );
        // (Of f32: bf16 copies move 2-byte halves, which the cooperative fetch does not
        // widen.)
        if (spec.starts_with("matmul") || spec.starts_with("batch_matmul"))
            && !spec.ends_with("dtype=bf16")
        {
            assert!(wide >= 2, "{spec}: {wide} of {assembled} with vector loads");
        }
        assert!(
            assembled * 2 >= draws,
            "{spec}: only {assembled} of {draws} candidates verify"
        );
    }
}

/// Candidates of the tiled ops at the shapes the GPU goals tune (blocks of many threads,
/// reductions of thousands of steps) verify, and keep each thread's accumulators in
/// registers: no local-memory frame in the PTX (and, where ptxas is found, no stack frame
/// and no spills in the cubin). Drawn without bounds on a thread's tile and a block's shared
/// copies, most draws of these shapes were over the shared memory and most of the rest
/// accumulated in local memory, loaded and stored around every FMA.
#[test]
fn tiled_candidates_of_large_shapes_verify_and_accumulate_in_registers() {
    let ptxas = find_ptxas();
    let desc = desc();
    let draws = 40;
    for spec in [
        "matmul:M=1024,N=1024,K=1024",
        "conv2d:N=16,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1",
        "dense_bias_relu:M=256,N=1024,K=1024",
    ] {
        let mut verified = 0;
        for (dec, f) in gpu_draws(spec, draws, 5) {
            if verify_gpu(&f, &desc).is_err() {
                continue;
            }
            verified += 1;
            let ptx = step(emit_ptx(&f, ARCH), spec);
            assert!(
                !ptx.contains("__local_depot"),
                "{spec}: decisions {dec:?} keep a local-memory frame:\n{f}"
            );
            if let Some(ptxas) = &ptxas {
                let info = ptxas_info(ptxas, &ptx, "large");
                assert!(
                    !info.uses_local_memory(),
                    "{spec}: decisions {dec:?}: {info:?}"
                );
            }
        }
        assert!(
            verified * 10 >= draws * 9,
            "{spec}: only {verified} of {draws} candidates verify"
        );
    }
}
