//! The query and insert API on one database.

mod common;

use common::*;
use tensortune_records::{Database, ErrorKind, Outcome, RecordsError, Timing};

on_both_backends!(best_and_best_k_rank_by_median_and_skip_failures);
fn best_and_best_k_rank_by_median_and_skip_failures(place: &Place) {
    let mut db = Database::open(place.db("t.db")).expect("open");
    fill_sample(&mut db, "a", 0);
    let m64 = matmul(64);

    let best = db
        .best(&m64.key, CPU)
        .expect("query")
        .expect("a best record");
    assert_eq!(best.outcome.timing().map(|t| t.median_s), Some(2e-5));
    assert_eq!(best.trace_json, trace(16));
    let gflops = best.gflops().expect("gflops");
    assert!((gflops - m64.flops / 2e-5 / 1e9).abs() < 1e-9);

    let top = db.best_k(&m64.key, CPU, 5).expect("query");
    let medians: Vec<f64> = top
        .iter()
        .filter_map(|r| r.outcome.timing().map(|t| t.median_s))
        .collect();
    assert_eq!(medians, vec![2e-5, 3e-5], "failures are never 'best'");

    assert!(db
        .best(&m64.key, "llvm -mcpu=other")
        .expect("query")
        .is_none());
    assert!(db
        .best("matmul:K=1,M=1,N=1,dtype=f32", CPU)
        .expect("query")
        .is_none());
}

on_both_backends!(records_hashes_targets_runs_workloads_and_summary);
fn records_hashes_targets_runs_workloads_and_summary(place: &Place) {
    let mut db = Database::open(place.db("t.db")).expect("open");
    fill_sample(&mut db, "a", 0);
    let m64 = matmul(64);

    let all = db.records(&m64.key, CPU).expect("records");
    assert_eq!(all.len(), 3);
    assert!(matches!(
        all[2].outcome,
        Outcome::Failed {
            kind: ErrorKind::WrongResult,
            ..
        }
    ));

    let hashes = db.measured_hashes(&m64.key, CPU).expect("hashes");
    assert_eq!(hashes.len(), 3, "failed traces count as measured");
    assert!(hashes.contains(&tensortune_records::trace_hash(&trace(32))));

    assert_eq!(
        db.targets().expect("targets"),
        vec![GPU.to_string(), CPU.to_string()]
    );
    assert_eq!(
        db.targets_of(&matmul(128).key).expect("targets"),
        vec![CPU.to_string()]
    );

    let runs = db.runs().expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].records, 5);
    assert_eq!(runs[0].seed, Some(7));
    assert!(runs[0].finished_at.is_some());
    assert_eq!(db.run(runs[0].id).expect("run").as_ref(), Some(&runs[0]));

    let workloads = db.workloads().expect("workloads");
    let keys: Vec<&str> = workloads.iter().map(|w| w.workload.key.as_str()).collect();
    assert_eq!(keys, vec![matmul(128).key.as_str(), m64.key.as_str()]);
    assert!(workloads.iter().all(|w| w.op == "matmul"));

    let summary = db.summary().expect("summary");
    let row = summary
        .iter()
        .find(|s| s.workload.key == m64.key && s.target == CPU)
        .expect("row");
    assert_eq!((row.trials, row.errors, row.best_s), (3, 1, Some(2e-5)));
    assert_eq!(summary.len(), 3);
}

on_both_backends!(a_bad_record_rejects_the_whole_batch);
fn a_bad_record_rejects_the_whole_batch(place: &Place) {
    let mut db = Database::open(place.db("t.db")).expect("open");
    let m64 = matmul(64);
    let mut bad_timing = ok_record(&m64, CPU, 4, 1e-5, 1);
    bad_timing.outcome = Outcome::Measured(Timing {
        median_s: 1e-5,
        min_s: 2e-5,
        max_s: 3e-5,
        repeats: 3,
    });
    let mut bad_trace = ok_record(&m64, CPU, 4, 1e-5, 2);
    bad_trace.trace_json = "[{\"Split\":".into();
    let mut bad_key = ok_record(&m64, CPU, 4, 1e-5, 3);
    bad_key.workload.key = "matmul".into();
    let mut nan = ok_record(&m64, CPU, 4, 1e-5, 4);
    nan.workload.flops = f64::NAN;

    for (i, bad) in [bad_timing, bad_trace, bad_key, nan]
        .into_iter()
        .enumerate()
    {
        let batch = vec![ok_record(&m64, CPU, 2, 1e-5, 0), bad];
        let err = db.insert_batch(None, &batch).expect_err("bad record");
        assert!(
            matches!(err, RecordsError::InvalidRecord { index: 1, .. }),
            "case {i}: {err}"
        );
    }
    assert_eq!(db.count().expect("count"), 0);
}

on_both_backends!(the_same_measurement_is_stored_once_and_traces_are_compacted);
fn the_same_measurement_is_stored_once_and_traces_are_compacted(place: &Place) {
    let mut db = Database::open(place.db("t.db")).expect("open");
    let m64 = matmul(64);
    let mut pretty = ok_record(&m64, CPU, 4, 1e-5, 0);
    pretty.trace_json = "[\n  {\"Split\": {\"stage\": 0, \"name\": \"a b\"}}\n]".into();
    assert_eq!(db.insert_batch(None, &[pretty.clone()]).expect("insert"), 1);
    assert_eq!(db.insert_batch(None, &[pretty]).expect("insert"), 0);
    let stored = db.records(&m64.key, CPU).expect("records");
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].trace_json,
        r#"[{"Split":{"stage":0,"name":"a b"}}]"#
    );
    assert_eq!(
        stored[0].trace_hash,
        tensortune_records::trace_hash(&stored[0].trace_json)
    );
}

on_both_backends!(unknown_runs_are_errors);
fn unknown_runs_are_errors(place: &Place) {
    let mut db = Database::open(place.db("t.db")).expect("open");
    let run = tensortune_records::RunId(99);
    assert!(matches!(
        db.finish_run(run),
        Err(RecordsError::UnknownRun { run: 99, .. })
    ));
    let batch = vec![ok_record(&matmul(8), CPU, 2, 1e-6, 0)];
    assert!(matches!(
        db.insert_batch(Some(run), &batch),
        Err(RecordsError::UnknownRun { run: 99, .. })
    ));
}

on_both_backends!(large_seeds_round_trip);
fn large_seeds_round_trip(place: &Place) {
    let mut db = Database::open(place.db("t.db")).expect("open");
    let mut run = new_run("big seed");
    run.seed = Some(u64::MAX - 3);
    db.begin_run(&run).expect("begin");
    assert_eq!(db.runs().expect("runs")[0].seed, Some(u64::MAX - 3));
}
