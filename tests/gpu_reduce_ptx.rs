//! Cross-thread reductions through the PTX generator: verified instances of the cross-thread
//! sketches of softmax and a row sum (the partials combined by a tree in shared memory with
//! barriers, or on whole warps by `shfl.sync.bfly` first) become PTX that `ptxas -arch=sm_90` assembles, with the shared memory the GPU
//! verifier counts. Skipped (with a message) where no `ptxas` is found.

use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;
use std::path::PathBuf;
use std::process::Command;
use tensortune::codegen::nvptx::emit_ptx;
use tensortune_schedules::gpu::verify::verify_gpu;
use tensortune_schedules::ir::Stmt;
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::target::{CudaDesc, TargetDesc};
use tensortune_tuner::sketch::rules::{generate_for, gpu_rules};
use tensortune_tuner::sketch::sample::sample;
use tensortune_tuner::TuneOptions;

const ARCH: &str = "sm_90";

/// `ptxas`: `$PTXAS`, else on `PATH`, else in the `nvidia-cuda-nvcc-cu12` wheel of `python3`.
fn find_ptxas() -> Option<PathBuf> {
    tensortune::codegen::nvptx::find_ptxas()
}

/// The static shared memory `ptxas -v` reports for `ptx` (which must assemble).
fn assemble(ptxas: &PathBuf, ptx: &str, what: &str) -> u64 {
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
    // "ptxas info    : Used 10 registers, used 1 barriers, 128 bytes smem, ..."
    // (the smem part is absent when the kernel has none).
    log.lines()
        .filter(|l| l.contains("Used "))
        .flat_map(|l| l.split(','))
        .find_map(|part| part.trim().strip_suffix(" bytes smem")?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn cross_thread_reductions_assemble_with_ptxas() {
    let Some(ptxas) = find_ptxas() else {
        eprintln!("skipped: no ptxas (pip install nvidia-cuda-nvcc-cu12, or set PTXAS)");
        return;
    };
    let opts = TuneOptions::default();
    let desc = CudaDesc::for_arch(ARCH).expect("sm_90 is in the table");
    let target = TargetDesc::Cuda(desc.clone());
    for spec in [
        "softmax:M=33,N=40",
        "reduce_sum:M=7,N=300",
        "softmax:M=5,N=256",
        "reduce_sum:M=3,N=192,dtype=f64",
        "reduce_sum:M=3,N=128,dtype=i32",
    ] {
        let d = WorkloadSpec::parse(spec)
            .and_then(|w| w.build())
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        let sketches = generate_for(&d, &opts, &target, &gpu_rules());
        let sk = sketches
            .iter()
            .find(|s| s.name.contains("cross-thread"))
            .unwrap_or_else(|| panic!("{spec}: no cross-thread sketch"));
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut assembled = 0;
        let mut shuffled = 0;
        for n in 0..24 {
            let dec = sample(sk, &mut rng, &opts);
            let s = sk
                .instantiate(&d, &dec)
                .unwrap_or_else(|e| panic!("{spec}: {e}"));
            let f = lower(&s).unwrap_or_else(|e| panic!("{spec}: {e}"));
            let Ok(usage) = verify_gpu(&f, &desc) else {
                continue;
            };
            let ptx = emit_ptx(&f, ARCH).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
            assert!(ptx.contains("bar.sync"), "{spec}: no barrier\n{ptx}");
            let mut shuffles = false;
            f.body
                .visit(&mut |x| shuffles |= matches!(x, Stmt::Shuffle { .. }));
            assert_eq!(
                ptx.contains("shfl.sync.bfly.b32"),
                shuffles,
                "{spec}: warp shuffles in the IR and in the PTX\n{ptx}"
            );
            shuffled += usize::from(shuffles);
            let smem = assemble(&ptxas, &ptx, &format!("draw{n}"));
            assert_eq!(smem, usage.shared_bytes, "{spec}: shared memory\n{f}");
            assembled += 1;
        }
        assert!(assembled >= 12, "{spec}: {assembled} of 24 assembled");
        if !spec.contains("N=300") && !spec.contains("N=40") {
            assert!(shuffled >= 2, "{spec}: {shuffled} draws by warp shuffles");
        }
        eprintln!("{spec}: {assembled} of 24 draws assembled, {shuffled} by warp shuffles");
    }
}
