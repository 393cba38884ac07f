//! The GPU's sketch rules: every op of the library (but softmax, see the rules' module doc)
//! gets sketches whose random instances bind blocks and threads, pass the GPU verifier, and
//! compute what the direct evaluator computes under the loop-IR interpreter.

use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;
use tensortune_schedules::data::NdData;
use tensortune_schedules::gpu::interp::run_lockstep;
use tensortune_schedules::gpu::verify::verify_gpu;
use tensortune_schedules::ir::{LoweredFunc, Scope, Stmt};
use tensortune_schedules::lower::lower;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::target::{CudaDesc, TargetDesc};
use tensortune_schedules::{eval, interp, ComputeDag};
use tensortune_tuner::sketch::rules::{
    default_schedule, generate_for, gpu_rules, DefaultGpuSchedule,
};
use tensortune_tuner::sketch::sample::sample;
use tensortune_tuner::TuneOptions;

/// Small, odd shapes of every op the GPU rules cover.
pub const SPECS: [&str; 7] = [
    "matmul:M=24,N=20,K=12",
    "batch_matmul:B=2,M=12,N=10,K=6",
    "dense_bias_relu:M=12,N=20,K=9",
    "conv2d:N=1,C=3,H=7,W=7,K=4,R=3,S=3,stride=1,pad=1",
    "conv2d_hwio:N=1,C=3,H=7,W=7,K=4,R=3,S=3,stride=1,pad=1",
    "depthwise_conv2d:N=1,C=4,H=7,W=7,R=3,S=3,stride=1,pad=1",
    "reduce_sum:M=10,N=14",
];

fn dag(spec: &str) -> ComputeDag {
    WorkloadSpec::parse(spec)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .build()
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn sm90() -> TargetDesc {
    TargetDesc::Cuda(CudaDesc::for_arch("sm_90").expect("sm_90 is known"))
}

fn inputs(d: &ComputeDag) -> Vec<NdData> {
    d.inputs()
        .iter()
        .enumerate()
        .map(|(i, &t)| NdData::random(&d.op(t).shape, d.op(t).dtype, 5 + i as u64).expect("data"))
        .collect()
}

/// Number of `Sync` statements.
fn syncs(f: &LoweredFunc) -> usize {
    let mut n = 0;
    f.body.visit(&mut |s| n += matches!(s, Stmt::Sync) as usize);
    n
}

#[test]
fn every_covered_op_gets_gpu_sketches_that_verify_and_compute_the_op() {
    let opts = TuneOptions::default();
    let target = sm90();
    let Some(desc) = (match &target {
        TargetDesc::Cuda(d) => Some(d.clone()),
        _ => None,
    }) else {
        unreachable!("a cuda desc")
    };
    // Draws per sketch: 12 here; `TENSORTUNE_GPU_SKETCH_DRAWS=300` for a deeper check after
    // a change to GPU lowering or sketches (2100 instances, about 30 s).
    let draws: usize = std::env::var("TENSORTUNE_GPU_SKETCH_DRAWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    for spec in SPECS {
        let d = dag(spec);
        let sketches = generate_for(&d, &opts, &target, &gpu_rules());
        assert!(!sketches.is_empty(), "{spec}: no GPU sketch");
        let ins = inputs(&d);
        let want = eval::evaluate(&d, &ins).expect("evaluate");
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (mut passed, mut shared_seen) = (0, false);
        for sk in &sketches {
            for _ in 0..draws {
                let dec = sample(sk, &mut rng, &opts);
                let s = sk
                    .instantiate(&d, &dec)
                    .unwrap_or_else(|e| panic!("{spec} {}: {e}", sk.name));
                let f = lower(&s).unwrap_or_else(|e| panic!("{spec}: {e}\n{s}"));
                let usage = match verify_gpu(&f, &desc) {
                    Ok(u) => u,
                    // Too many threads for a block is a draw the search drops cheaply.
                    Err(e) if e.to_string().contains("threads") => continue,
                    Err(e) => panic!("{spec} {}: {e}\n{f}", sk.name),
                };
                assert!(usage.launch.threads_per_block() >= 1);
                if f.buffers.iter().any(|b| b.scope == Scope::Shared) {
                    shared_seen = true;
                    assert!(syncs(&f) >= 2, "{spec}: shared without barriers\n{f}");
                }
                // Lockstep: the block's threads together, every race and divergent barrier
                // reported; the serial interpreter agrees.
                let got = run_lockstep(&f, &ins).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
                let serial = interp::run(&f, &ins).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
                assert_eq!(got, serial, "{spec}: lockstep and serial differ\n{f}");
                for (w, g) in want.iter().zip(&got) {
                    let diff = g.max_rel_diff(w).expect("same shape");
                    assert!(diff < 1e-4, "{spec}: differs by {diff}\n{}\n{f}", s.trace());
                }
                passed += 1;
            }
        }
        assert!(passed >= 3, "{spec}: only {passed} instances verified");
        if spec != "reduce_sum:M=10,N=14" {
            assert!(
                shared_seen,
                "{spec}: no sketch stages an input in shared memory"
            );
        }
        eprintln!(
            "{spec}: {} sketches, {passed} instances checked",
            sketches.len()
        );
    }
}

/// Without tuning, every op, softmax included (the cross-thread reduction sketches), gets a
/// verified draw of a GPU sketch, not the one-thread kernel, and it computes the op.
#[test]
fn the_default_gpu_schedule_is_a_verified_sketch_draw_or_one_thread() {
    let TargetDesc::Cuda(desc) = sm90() else {
        unreachable!("a cuda desc")
    };
    for spec in SPECS.iter().copied().chain(["softmax:M=6,N=10"]) {
        let d = dag(spec);
        let (s, what) = default_schedule(&d, &desc);
        let f = lower(&s).unwrap_or_else(|e| panic!("{spec}: {e}"));
        verify_gpu(&f, &desc).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
        assert!(
            matches!(what, DefaultGpuSchedule::Sketch(_)),
            "{spec}: {what:?}"
        );
        let ins = inputs(&d);
        let want = eval::evaluate(&d, &ins).expect("evaluate");
        let got = run_lockstep(&f, &ins).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
        let diff = got[0].max_rel_diff(&want[0]).expect("same shape");
        assert!(diff < 1e-4, "{spec}: differs by {diff}\n{f}");
    }
}

/// The default GPU schedule of a large matmul is a kernel worth launching: whole warps, at
/// least two warps a block, a block for every multiprocessor, and an accumulator that fits
/// in registers. Also prints how long `default_schedule` takes on the shapes the GPU check
/// tunes (it runs before every `codegen --target cuda` without a record).
#[test]
fn the_default_gpu_schedule_of_a_large_matmul_fills_the_gpu() {
    let TargetDesc::Cuda(desc) = sm90() else {
        unreachable!("a cuda desc")
    };
    for spec in [
        "matmul:M=512,N=512,K=512",
        "matmul:M=4096,N=4096,K=4096",
        "conv2d:N=16,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1",
    ] {
        let d = dag(spec);
        let t0 = std::time::Instant::now();
        let (s, what) = default_schedule(&d, &desc);
        let took = t0.elapsed();
        let f = lower(&s).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let u = verify_gpu(&f, &desc).unwrap_or_else(|e| panic!("{spec}: {e}\n{f}"));
        let blocks: u64 = u.launch.grid.iter().map(|&g| g as u64).product();
        let threads = u.launch.threads_per_block();
        eprintln!(
            "{spec}: {what:?} in {took:?}: {blocks} blocks of {threads} threads, {} local \
             bytes, {} shared bytes",
            u.local_bytes, u.shared_bytes
        );
        assert!(
            matches!(what, DefaultGpuSchedule::Sketch(_)),
            "{spec}: {what:?}"
        );
        assert!(u.whole_warps, "{spec}: {threads} threads");
        assert!(threads >= 64, "{spec}: {threads} threads");
        assert!(
            blocks >= desc.multiprocessors as u64,
            "{spec}: {blocks} blocks"
        );
        assert!(
            u.local_bytes <= 256,
            "{spec}: {} local bytes",
            u.local_bytes
        );
    }
}

/// The extent of the loop bound to `vthread` in a lowered function, if it has one (the
/// product of the virtual-thread levels of all axes, before lowering pushes it down).
fn vthread_extent(s: &tensortune_schedules::schedule::State) -> Option<i64> {
    s.stages().iter().find_map(|st| {
        st.leaves.iter().find_map(|&l| {
            let it = st.iter(l);
            (it.annotation
                == Some(tensortune_schedules::trace::Annotation::Bind(
                    tensortune_schedules::ir::ThreadAxis::VThread,
                )))
            .then_some(it.extent)
        })
    })
}

/// A tile's virtual threads span every output axis, never more than 8 of them in all, in
/// draws and in mutations: the bound is shared by the axes, not split among them in advance.
#[test]
fn virtual_threads_span_every_axis_within_one_bound() {
    let opts = TuneOptions::default();
    let target = sm90();
    for spec in [
        "matmul:M=64,N=64,K=16",
        "conv2d:N=2,C=4,H=8,W=8,K=8,R=3,S=3,stride=1,pad=1",
    ] {
        let d = dag(spec);
        let sketches = generate_for(&d, &opts, &target, &gpu_rules());
        let sk = sketches
            .iter()
            .find(|s| !s.caps.is_empty())
            .unwrap_or_else(|| panic!("{spec}: no sketch bounds its virtual threads"));
        let cap = &sk.caps[0];
        assert_eq!(cap.max, 8);
        let axes = d.op(d.outputs()[0]).shape.len();
        assert_eq!(
            cap.factors.len(),
            axes,
            "{spec}: one factor per output axis"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut above_one = vec![false; axes];
        let mut products = std::collections::BTreeSet::new();
        let weights = opts.mutation_weights.clone();
        for _ in 0..400 {
            let dec = sample(sk, &mut rng, &opts);
            let levels: Vec<i64> = cap.factors.iter().map(|&(h, i)| dec[h][i]).collect();
            let product: i64 = levels.iter().product();
            assert!(product <= 8, "{spec}: {levels:?}");
            products.insert(product);
            for (a, &f) in levels.iter().enumerate() {
                above_one[a] |= f > 1;
            }
            // The instantiated schedule's vthread loop is the fused product.
            let s = sk.instantiate(&d, &dec).expect("instantiate");
            assert_eq!(vthread_extent(&s), Some(product), "{spec}: {levels:?}");
            for _ in 0..4 {
                if let Some(m) = tensortune_tuner::mutate::mutate(sk, &dec, &mut rng, &weights) {
                    assert!(sk.within_caps(&m), "{spec}: mutated over the bound: {m:?}");
                }
            }
        }
        assert!(above_one.iter().all(|&x| x), "{spec}: {above_one:?}");
        assert!(products.contains(&8), "{spec}: {products:?}");
    }
}

/// Matmul and dense get a second tiling whose shared copies of the operands indexed by the
/// reduction last (A[i, k] of matmul; both X[i, k] and W[j, k] of dense) are stored
/// reduction-first, so that a thread's tile reads consecutive words at each reduction step;
/// a copy indexed otherwise (B[k, j]) is as it was. Both tilings take the same decisions.
#[test]
fn a_reduction_major_tiling_transposes_only_the_reduction_last_shared_copies() {
    let opts = TuneOptions::default();
    for (spec, transposed, kept) in [
        (
            "matmul:M=64,N=48,K=40",
            &["A.shared"][..],
            &["B.shared"][..],
        ),
        (
            "dense_bias_relu:M=64,N=80,K=48",
            &["X.shared", "W.shared"][..],
            &[][..],
        ),
    ] {
        let d = dag(spec);
        let sketches = generate_for(&d, &opts, &sm90(), &gpu_rules());
        let names: Vec<&str> = sketches.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), 2, "{spec}: {names:?}");
        assert!(names[1].contains("+kmajor"), "{spec}: {names:?}");
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for _ in 0..20 {
            let dec = sample(&sketches[0], &mut rng, &opts);
            let lowered: Vec<LoweredFunc> = (0..2)
                .map(|i| {
                    lower(&sketches[i].instantiate(&d, &dec).expect("instantiate")).expect("lower")
                })
                .collect();
            let shape = |f: &LoweredFunc, name: &str| {
                f.buffers
                    .iter()
                    .find(|b| b.name == name)
                    .unwrap_or_else(|| panic!("{spec}: no {name} in\n{f}"))
                    .shape
                    .clone()
            };
            for &name in transposed {
                let mut reversed = shape(&lowered[0], name);
                reversed.reverse();
                assert_eq!(
                    shape(&lowered[1], name),
                    reversed,
                    "{spec}: {name} with {dec:?}"
                );
            }
            for &name in kept {
                assert_eq!(
                    shape(&lowered[1], name),
                    shape(&lowered[0], name),
                    "{spec}: {name} with {dec:?}"
                );
            }
        }
    }
}
