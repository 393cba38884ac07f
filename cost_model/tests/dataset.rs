//! Samples from a records database, and the held-out evaluation on them.

use tensortune_cost_model::dataset::samples_from_records;
use tensortune_cost_model::eval::{evaluate, EvalOptions, Split};
use tensortune_cost_model::{GbdtModel, GbdtOptions};
use tensortune_records::{Database, ErrorKind, NewRecord, Timing, Workload};
use tensortune_schedules::{ops::WorkloadSpec, random::random_state};

const TARGET: &str = "llvm -mcpu=test";

#[test]
fn records_become_samples_and_bad_traces_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = Database::open(dir.path().join("t.db")).unwrap();
    let spec = WorkloadSpec::parse("matmul:M=32,N=32,K=32").unwrap();
    let dag = spec.build().unwrap();
    let workload = Workload::new(spec.canonical(), dag.flops());
    let mut batch = Vec::new();
    for seed in 0..60u64 {
        let trace = random_state(&dag, seed, 12, false).trace().to_json();
        let t = 1e-4 * (1.0 + (seed % 7) as f64);
        let timing = Timing {
            median_s: t,
            min_s: t,
            max_s: t,
            repeats: 5,
        };
        batch.push(NewRecord::measured(workload.clone(), TARGET, trace, timing));
    }
    let failed = random_state(&dag, 1000, 12, false).trace().to_json();
    batch.push(NewRecord::failed(
        workload.clone(),
        TARGET,
        failed,
        ErrorKind::Runtime,
        "x",
    ));
    let bogus = r#"{"steps":[{"Split":{"stage":9,"iter":0,"factors":[2]}}]}"#;
    batch.push(NewRecord::failed(
        workload.clone(),
        TARGET,
        bogus,
        ErrorKind::Runtime,
        "x",
    ));
    // A model's layer: a key the op library does not build, with a trace that may be fine.
    let layer = Workload::new(
        "onnx_conv2d:N=1,C=3,H=8,W=8,K=4,kernel=3x3".to_string(),
        1e6,
    );
    let trace = random_state(&dag, 7, 12, false).trace().to_json();
    let t = Timing {
        median_s: 1e-4,
        min_s: 1e-4,
        max_s: 1e-4,
        repeats: 5,
    };
    batch.push(NewRecord::measured(layer, TARGET, trace, t));
    db.insert_batch(None, &batch).unwrap();

    let (samples, report) = samples_from_records(&db, TARGET).unwrap();
    assert_eq!(report.records, 63);
    assert_eq!(report.skipped.len(), 2, "{:?}", report.skipped);
    // One does not replay; the layer is counted apart.
    assert_eq!(report.not_library_ops, 1);
    assert_eq!(report.no_longer_replay(), 1);
    assert_eq!(samples.len(), 61);
    assert_eq!(report.failed, 1);
    assert!(samples.iter().all(|s| s.workload == spec.canonical()));
    let best = samples.iter().map(|s| s.throughput).fold(0.0, f64::max);
    assert!((best - dag.flops() / 1e-4).abs() / best < 1e-9);
    // Another target has nothing.
    assert!(samples_from_records(&db, "cuda").unwrap().0.is_empty());

    let (model, _) = GbdtModel::from_records(
        &db,
        TARGET,
        GbdtOptions {
            rounds: 20,
            threads: 2,
            ..GbdtOptions::default()
        },
    )
    .unwrap();
    assert!(model.is_trained());

    let opts = EvalOptions {
        min_samples: 20,
        gbdt: GbdtOptions {
            rounds: 20,
            threads: 2,
            ..GbdtOptions::default()
        },
        ..EvalOptions::default()
    };
    let eval = evaluate(&samples, &opts).unwrap();
    assert_eq!(eval.workloads.len(), 1);
    let w = &eval.workloads[0];
    assert_eq!(w.train + w.test, 61);
    assert!(w.models.contains_key("random") && w.models.contains_key("analytic"));
    assert_eq!(w.models.len(), 3);
    assert!(eval.mean.contains_key("random"));
}

/// Samples of random programs of `spec`, each "measured" at a throughput that is a fixed
/// function of its features (the same function for every workload), so that what the model
/// learns on one workload carries to another.
fn learnable_samples(
    spec: &str,
    seeds: std::ops::Range<u64>,
) -> Vec<tensortune_cost_model::Sample> {
    let spec = WorkloadSpec::parse(spec).unwrap();
    let dag = spec.build().unwrap();
    seeds
        .map(|seed| {
            let state = random_state(&dag, seed, 12, false);
            let func = tensortune_schedules::lower::lower(&state).unwrap();
            let features = tensortune_cost_model::ProgramFeatures::extract(&func);
            let first = features.row(0).unwrap_or(&[]);
            let score: f64 = first.iter().map(|&v| f64::from(v).abs().ln_1p()).sum();
            tensortune_cost_model::Sample {
                features,
                workload: spec.canonical(),
                throughput: 1.0 + score,
            }
        })
        .collect()
}

#[test]
fn held_out_evaluation_trains_on_the_other_workloads_only() {
    let mut samples = learnable_samples("matmul:M=32,N=32,K=32", 0..120);
    samples.extend(learnable_samples("matmul:M=24,N=40,K=16", 200..300));
    let opts = EvalOptions {
        split: Split::HeldOut,
        min_samples: 20,
        gbdt: GbdtOptions {
            rounds: 30,
            threads: 2,
            ..GbdtOptions::default()
        },
        ..EvalOptions::default()
    };
    let eval = evaluate(&samples, &opts).unwrap();
    assert_eq!(eval.split, Split::HeldOut);
    let counts: Vec<(usize, usize)> = eval.workloads.iter().map(|w| (w.train, w.test)).collect();
    // By key order: K=16 (100 samples) first, then K=32 (120).
    assert_eq!(counts, vec![(120, 100), (100, 120)]);
    for w in &eval.workloads {
        let gbdt = w.models["gbdt-rank-pairwise"].pairwise_accuracy.unwrap();
        let random = w.models["random"].pairwise_accuracy.unwrap();
        // Random ranks at 0.5; the margin is small because the training set is 100-120 programs
        // and the label an arbitrary function of the features, which every added feature
        // column dilutes.
        assert!(
            gbdt > random + 0.1,
            "{}: {gbdt} against {random}",
            w.workload
        );
    }
    // A workload alone has nothing to be held out from.
    let alone = evaluate(&samples[..80], &opts).unwrap();
    assert!(alone.workloads.is_empty());
    assert_eq!(alone.skipped.len(), 1);
}
