//! Every sketch of every op instantiates, with random decisions, to a schedule that lowers and
//! computes what the direct evaluator computes; mutations keep that true.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tensortune_schedules::data::NdData;
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::{eval, interp, lower::lower, ComputeDag};
use tensortune_tuner::mutate::mutate;
use tensortune_tuner::sketch::{rules, sample::sample};
use tensortune_tuner::TuneOptions;

fn check(dag: &ComputeDag, state: &tensortune_schedules::schedule::State, seed: u64) {
    let f = lower(state).unwrap_or_else(|e| panic!("lower: {e}\n{state}"));
    let ins: Vec<NdData> = dag
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &t)| NdData::random(&dag.op(t).shape, dag.op(t).dtype, seed + i as u64).unwrap())
        .collect();
    let want = eval::evaluate(dag, &ins).unwrap();
    let got = interp::run(&f, &ins).unwrap_or_else(|e| panic!("interp: {e}\n{state}\n{f}"));
    for (w, g) in want.iter().zip(&got) {
        let d = g.max_rel_diff(w).unwrap();
        assert!(d < 1e-4, "mismatch {d}\n{}\n{f}", state.trace());
    }
}

#[test]
fn sketches_of_every_op_are_correct() {
    let specs = [
        ("matmul:M=12,N=20,K=9", 1),
        ("batch_matmul:B=2,M=6,N=8,K=5", 1),
        ("dense_bias_relu:M=6,N=10,K=7", 1),
        ("conv2d:N=1,C=3,H=7,W=7,K=4,R=3,S=3,pad=1", 1),
        ("depthwise_conv2d:N=1,C=3,H=8,W=8,R=3,S=3,stride=2,pad=1", 1),
        ("softmax:M=4,N=24", 1),
        ("reduce_sum:M=3,N=40", 2),
        ("matmul:M=16,N=16,K=16", 4),
    ];
    for (spec, threads) in specs {
        let dag = WorkloadSpec::parse(spec).unwrap().build().unwrap();
        let opts = TuneOptions {
            threads,
            imperfect_tile_prob: 0.3,
            ..TuneOptions::default()
        };
        let sketches = rules::generate(&dag, &opts);
        assert!(!sketches.is_empty(), "{spec}");
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for sk in &sketches {
            let mut ok = 0;
            for case in 0..12 {
                let d = sample(sk, &mut rng, &opts);
                let st = sk
                    .instantiate(&dag, &d)
                    .unwrap_or_else(|e| panic!("{spec} {}: {e}", sk.name));
                check(&dag, &st, case);
                ok += 1;
                if let Some(m) = mutate(sk, &d, &mut rng, &opts.mutation_weights) {
                    assert!(sk.fits(&m));
                    let st = sk.instantiate(&dag, &m).unwrap();
                    check(&dag, &st, case + 100);
                }
            }
            assert_eq!(ok, 12);
        }
        eprintln!(
            "{spec}: {:?}",
            sketches.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()
        );
    }
}
