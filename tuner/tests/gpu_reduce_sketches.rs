//! The cross-thread reduction sketches (`CrossThreadReduction`): softmax and a row sum with few
//! rows get a GPU sketch whose reductions run on a block's threads together, and most of its
//! random instances pass the GPU verifier and agree with the evaluator in the lockstep
//! interpreter (which reports any race), whether they combine in shared memory or, on whole
//! warps, by warp shuffles.

use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;
use tensortune_schedules::data::NdData;
use tensortune_schedules::gpu::interp::run_lockstep;
use tensortune_schedules::gpu::verify::verify_gpu;
use tensortune_schedules::ir::Stmt;
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::target::{CudaDesc, TargetDesc};
use tensortune_schedules::{eval, ComputeDag};
use tensortune_tuner::sketch::rules::{generate_for, gpu_rules};
use tensortune_tuner::sketch::sample::sample;
use tensortune_tuner::TuneOptions;

fn dag(spec: &str) -> ComputeDag {
    WorkloadSpec::parse(spec)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .build()
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[test]
fn cross_thread_sketches_verify_and_compute_the_op() {
    let opts = TuneOptions::default();
    let desc = CudaDesc::for_arch("sm_90").expect("sm_90 is known");
    let target = TargetDesc::Cuda(desc.clone());
    // Odd rows (the shared-memory tree) and rows of whole warps (warp shuffles), in each
    // dtype a shuffle moves differently (f32, i32 in one 32-bit exchange, f64 in two).
    for spec in [
        "softmax:M=33,N=40",
        "reduce_sum:M=7,N=300",
        "softmax:M=5,N=256",
        "reduce_sum:M=3,N=192,dtype=f64",
        "reduce_sum:M=3,N=128,dtype=i32",
    ] {
        let d = dag(spec);
        let sketches = generate_for(&d, &opts, &target, &gpu_rules());
        let names: Vec<&str> = sketches.iter().map(|s| s.name.as_str()).collect();
        let Some(sk) = sketches.iter().find(|s| s.name.contains("cross-thread")) else {
            panic!("{spec}: no cross-thread sketch among {names:?}")
        };
        let ins: Vec<NdData> = d
            .inputs()
            .iter()
            .enumerate()
            .map(|(i, &t)| NdData::random(&d.op(t).shape, d.op(t).dtype, 3 + i as u64))
            .collect::<Result<_, _>>()
            .expect("data");
        let want = eval::evaluate(&d, &ins).expect("evaluate");
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut verified = 0;
        let mut shuffled = 0;
        for _ in 0..40 {
            let dec = sample(sk, &mut rng, &opts);
            let s = sk
                .instantiate(&d, &dec)
                .unwrap_or_else(|e| panic!("{spec}: {e}"));
            let f = lower(&s).unwrap_or_else(|e| panic!("{spec}: {e}\n{s}"));
            if verify_gpu(&f, &desc).is_err() {
                continue;
            }
            verified += 1;
            let mut shuffles = false;
            f.body
                .visit(&mut |x| shuffles |= matches!(x, Stmt::Shuffle { .. }));
            shuffled += usize::from(shuffles);
            let got = run_lockstep(&f, &ins).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
            for (w, g) in want.iter().zip(&got) {
                let diff = g.max_rel_diff(w).expect("same shape");
                assert!(diff < 1e-4, "{spec}: differs by {diff}\n{}\n{f}", s.trace());
            }
        }
        assert!(verified >= 20, "{spec}: {verified} of 40 verified");
        let whole_warps = !(spec.contains("N=40") || spec.contains("N=300"));
        if whole_warps {
            // Divisors of the row length that are whole warps come up among the draws.
            assert!(
                shuffled >= 3,
                "{spec}: {shuffled} of {verified} reduce by shuffles"
            );
        } else {
            assert_eq!(
                shuffled, 0,
                "{spec}: no thread count of whole warps divides it"
            );
        }
        eprintln!(
            "{spec}: sketches {names:?}; {verified} of 40 verified, {shuffled} by warp shuffles"
        );
    }
}
