//! `tensortune tune`'s cost model start (`--model`, `--cold`, and by default a model trained on
//! the database's other workloads of the same target), its GB/s figure for memory-bound ops,
//! its report of the re-measured top programs against their tuning order, records kept apart
//! by thread count, and the default schedule measured with the rest.

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensortune"))
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs `cmd`, which must succeed (its stderr in the failure message).
fn succeeds(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `tune --json` of one workload with a small budget; the JSON object it printed.
fn tune(db: &Path, workload: &str, trials: &str, extra: &[&str]) -> serde_json::Value {
    let out = bin()
        .args(["tune", "--workload", workload, "--trials", trials])
        .args([
            "--batch-size",
            "16",
            "--population",
            "64",
            "--json",
            "--quiet",
        ])
        .arg("--db")
        .arg(db)
        .args(extra)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().expect("a line")).expect("json")
}

#[test]
fn a_new_shape_starts_from_the_other_workloads_records_unless_told_otherwise() {
    let dir = temp_dir("warm");
    let db = dir.join("t.db");
    // Nothing else in the database: the model starts untrained.
    let first = tune(&db, "matmul:M=32,N=48,K=16", "32", &[]);
    assert!(first["warm_start"].is_null(), "{first}");

    // A second shape: trained on the first one's 32 records (the workload being tuned is
    // never part of it), unless `--cold`.
    let second = tune(&db, "matmul:M=40,N=24,K=16", "16", &[]);
    let warm = &second["warm_start"];
    assert_eq!(warm["source"], "records", "{second}");
    assert_eq!(warm["workloads"], 1, "{second}");
    assert_eq!(warm["samples"], 32, "{second}");
    let cold = tune(&db, "matmul:M=24,N=24,K=24", "16", &["--cold"]);
    assert!(cold["warm_start"].is_null(), "{cold}");

    // A model file trained on the database starts the run instead, whatever the database holds.
    let model = dir.join("m.json");
    succeeds(
        bin()
            .args(["model", "train", "--db"])
            .arg(&db)
            .arg("--out")
            .arg(&model),
    );
    let from_file = tune(
        &db,
        "matmul:M=16,N=40,K=8",
        "8",
        &["--model", model.to_str().expect("utf-8 path")],
    );
    assert_eq!(from_file["warm_start"]["source"], "file", "{from_file}");
    assert_eq!(from_file["warm_start"]["samples"], 64, "{from_file}");

    // `model eval` trains with the step and the pairs it is given (the options it used are
    // in its JSON), held out over the workloads the database now holds.
    let out = succeeds(
        bin()
            .args([
                "model",
                "eval",
                "--held-out",
                "--min-records",
                "8",
                "--json",
            ])
            .args(["--eta", "0.3", "--pairs-per-program", "4", "--rounds", "20"])
            .arg("--db")
            .arg(&db),
    );
    let eval: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(eval["gbdt_options"]["eta"], 0.3, "{eval}");
    assert_eq!(eval["gbdt_options"]["pairs_per_sample"], 4, "{eval}");
    assert_eq!(eval["gbdt_options"]["rounds"], 20, "{eval}");
    let mean = &eval["eval"]["mean"]["gbdt-rank-pairwise"]["pairwise_accuracy"];
    assert!(
        mean.as_f64().is_some_and(|a| (0.0..=1.0).contains(&a)),
        "{eval}"
    );
    // Each workload says how many of its pairs are more than 5% apart (the unit tests of
    // `share_of_pairs_apart` check the count itself).
    let workloads = eval["eval"]["workloads"].as_array().expect("workloads");
    assert!(!workloads.is_empty(), "{eval}");
    for w in workloads {
        let share = w["pairs_apart_share"].as_f64();
        assert!(share.is_some_and(|x| (0.0..=1.0).contains(&x)), "{w}");
    }

    // Records of another target (here: two threads) are not trained on: a model of one
    // machine's timings must not rank another's.
    let other = tune(&db, "matmul:M=8,N=8,K=8", "8", &["--threads", "2"]);
    assert!(other["warm_start"].is_null(), "{other}");

    // A model file that is not one: exit 2, one line, nothing measured.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, b"{\"format\": 1}").expect("write");
    let before = std::fs::read(&db).expect("db");
    let out = bin()
        .args([
            "tune",
            "--workload",
            "matmul:M=8,N=8,K=4",
            "--trials",
            "8",
            "--quiet",
        ])
        .arg("--db")
        .arg(&db)
        .arg("--model")
        .arg(&bad)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--model"), "{err}");
    assert_eq!(
        std::fs::read(&db).expect("db"),
        before,
        "the database is unchanged"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memory_bound_ops_report_gb_per_s_and_the_remeasured_ranking() {
    let dir = temp_dir("gbs");
    let db = dir.join("t.db");
    let (m, n) = (64.0, 96.0);
    let v = tune(&db, "softmax:M=64,N=96", "24", &[]);
    assert_eq!(v["memory_bound"], true, "{v}");
    let latency = v["best_latency_s"].as_f64().expect("a best");
    // Read once and written once, four bytes an element.
    let want = 2.0 * 4.0 * m * n / latency / 1e9;
    let gbs = v["best_gbs"].as_f64().expect("GB/s");
    assert!((gbs - want).abs() <= 1e-9 * want, "{gbs} against {want}");

    // The top three by tuning latency, in that order, each re-measured; the reported best is
    // the fastest re-measured one and its rank says which it was.
    let top = v["remeasured"].as_array().expect("remeasured");
    assert_eq!(top.len(), 3, "{v}");
    let tuning: Vec<f64> = top
        .iter()
        .map(|p| p["tuning_latency_s"].as_f64().expect("tuning latency"))
        .collect();
    assert!(tuning.windows(2).all(|w| w[0] <= w[1]), "{tuning:?}");
    for (i, p) in top.iter().enumerate() {
        assert_eq!(p["tuning_rank"], i + 1);
    }
    // Three rounds at the least, up to nine while they disagree; every program is timed in
    // each round.
    let rounds = top[0]["rounds"].as_u64().expect("rounds");
    assert!((3..=9).contains(&rounds), "{v}");
    assert!(top.iter().all(|p| p["rounds"] == rounds), "{v}");
    let re: Vec<f64> = top
        .iter()
        .map(|p| p["latency_s"].as_f64().expect("re-measured"))
        .collect();
    let fastest = re
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i + 1)
        .expect("three");
    assert_eq!(v["remeasured_best_rank"], fastest, "{v}");
    assert_eq!(latency, re[fastest - 1]);
    assert_eq!(v["tuning_latency_s"].as_f64(), Some(tuning[0]));
    // The default schedule (what the workload runs without a record) timed in the same
    // rounds, so that the gain of tuning over it is measured side by side.
    let default = v["default_latency_s"].as_f64().expect("the default timed");
    assert!(default > 0.0 && default.is_finite(), "{v}");

    // This run's failed trials, and the database's failed records by kind (a CPU run of
    // reduce_sum has none).
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v["cut_short"].as_u64().is_some(), "{v}");
    assert_eq!(v["failed_records"], serde_json::json!({}), "{v}");

    // A compute-bound op is not called memory-bound.
    let mm = tune(&db, "matmul:M=64,N=64,K=64", "8", &[]);
    assert_eq!(mm["memory_bound"], false, "{mm}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --db` on `threads` threads: the JSON it printed.
fn run_with(db: &Path, workload: &str, threads: &str) -> serde_json::Value {
    let out = bin()
        .args(["run", "--workload", workload, "--threads", threads])
        .args(["--repeat", "1", "--min-repeat-ms", "1", "--json", "--db"])
        .arg(db)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

#[test]
fn a_two_thread_record_is_never_reused_for_one_thread() {
    // The thread count is part of the target key: a schedule tuned with its parallel loop
    // over two threads says nothing of one thread's best, in either direction.
    let dir = temp_dir("threads");
    let db = dir.join("t.db");
    let w = "matmul:M=32,N=32,K=32";
    let two = tune(&db, w, "8", &["--threads", "2"]);
    assert!(two["target"].as_str().expect("key").ends_with("-threads=2"));
    assert_eq!(run_with(&db, w, "2")["schedule"], "best record");
    assert_eq!(run_with(&db, w, "1")["schedule"], "default schedule");
    // A one-thread run resumes nothing of the two-thread one, and starts its model cold.
    let one = tune(&db, w, "8", &["--threads", "1"]);
    assert_eq!(one["resumed"]["trials"], 0, "{one}");
    assert!(one["warm_start"].is_null(), "{one}");
    assert_eq!(run_with(&db, w, "1")["schedule"], "best record");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_default_schedule_is_measured_and_recorded() {
    // What a workload runs without a record is measured in its first batch like any
    // candidate, so its record competes with the tuned ones; a second run does not measure
    // it again. For a matmul it is a sketch's instance, for a row sum the loops as written.
    let dir = temp_dir("default");
    let db = dir.join("t.db");
    for (w, trials) in [
        ("matmul:M=32,N=48,K=64", "8"),
        ("reduce_sum:M=64,N=256", "4"),
    ] {
        let spec = tensortune::WorkloadSpec::parse(w).expect("spec");
        let dag = spec.build().expect("dag");
        // Compared as programs: a proposal with the same loop nest stands for it.
        let program = |s: &tensortune::schedules::schedule::State| {
            tensortune::tuner::search::program_fingerprint(s).expect("lowers")
        };
        let want = program(&tensortune::build::default_cpu_state(&dag, 1));
        let count = || {
            let d = tensortune::records::Database::open_read_only(&db).expect("db");
            let records = d
                .records(&spec.canonical(), &d.targets().expect("targets")[0])
                .expect("records");
            records
                .iter()
                .filter(|r| {
                    let trace = tensortune::schedules::trace::Trace::from_json(&r.trace_json)
                        .expect("trace");
                    program(&trace.replay(&dag).expect("replays")) == want
                })
                .count()
        };
        let v = tune(&db, w, trials, &[]);
        assert_eq!(v["errors"], 0, "{v}");
        assert_eq!(count(), 1, "{w}: the default recorded once");
        tune(&db, w, trials, &[]);
        assert_eq!(count(), 1, "{w}: and not measured again");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
