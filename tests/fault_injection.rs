//! Faults injected end to end through the `tensortune` binary: the tuner killed at random
//! moments, forged and hostile records, outputs that name inputs, workloads too large for the
//! memory, unbounded flags. Each must end in a sound database, a typed one-line error with
//! exit status 2, and no process left behind; never a panic or an abort.
//!
//! Crashing, hanging and faulting candidates are covered at the measurer in `tests/measure.rs`
//! (crash isolation for SEGV/BUS/ILL/FPE/ABRT/KILL and the watchdog).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tensortune_records::{Database, NewRecord, Timing, Workload};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensortune"))
}

fn temp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 2, one line on stderr containing `needle`, no panic.
fn assert_usage_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

const SPEC: &str = "matmul:M=16,N=16,K=16";

fn tune_cmd(db: &Path, trials: &str) -> Command {
    let mut c = bin();
    c.args([
        "tune",
        "--workload",
        SPEC,
        "--trials",
        trials,
        "--batch-size",
        "4",
        "--population",
        "16",
        "--quiet",
        "--db",
    ])
    .arg(db);
    c
}

/// Processes whose command line names `needle` (a path unique to one test): the tuner and
/// any forked candidate, which inherit its command line.
fn processes_naming(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                found.push(pid);
            }
        }
    }
    found
}

#[test]
fn the_tuner_killed_at_random_moments_loses_only_the_batch_in_flight() {
    let dir = temp();
    let db = dir.path().join("killed.db");
    let needle = db.to_string_lossy().into_owned();
    // Deterministic "random" moments over the run: start-up, search, measuring, recording.
    let delays_ms = [150u64, 700, 1300, 2100, 3000];
    let mut before = 0u64;
    for (i, delay) in delays_ms.iter().enumerate() {
        let mut child = tune_cmd(&db, "400")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        std::thread::sleep(Duration::from_millis(*delay));
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        // Forked candidates die with their parent (PR_SET_PDEATHSIG): none lives on.
        let t0 = Instant::now();
        while !processes_naming(&needle).is_empty() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            processes_naming(&needle),
            Vec::<u32>::new(),
            "kill {i}: orphans"
        );
        if !db.exists() {
            continue;
        }
        let d = Database::open_existing(&db).expect("the database opens after a kill");
        assert_eq!(d.integrity_check().expect("check"), Vec::<String>::new());
        let n = d.count().expect("count");
        // Records only grow, in whole batches of 4 (or the resumed run's first partial one).
        assert!(n >= before, "kill {i}: {n} < {before}");
        before = n;
    }
    // A last run resumes from what survived and finishes.
    let out = tune_cmd(&db, "8").output().expect("runs");
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A copy of `base` (a tuned database of `SPEC`) whose first sound record's latency was
/// edited by hand to `median` (negative, zero, impossibly small).
fn forged_db(base: &Path, name: &str, median: f64) -> PathBuf {
    let path = base.with_file_name(name);
    std::fs::copy(base, &path).expect("copy");
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    conn.execute(
        "UPDATE records SET median_s = ?1, min_s = ?1 WHERE id = \
         (SELECT min(id) FROM records WHERE error_kind IS NULL)",
        rusqlite::params![median],
    )
    .expect("forge");
    path
}

#[test]
fn forged_latencies_neither_panic_nor_win() {
    let dir = temp();
    let base = dir.path().join("base.db");
    let out = tune_cmd(&base, "4").output().expect("tune");
    assert!(out.status.success(), "{}", stderr(&out));
    for (i, median) in [-1.0, 0.0, 1e-300].into_iter().enumerate() {
        let db = forged_db(&base, &format!("forged{i}.db"), median);
        // Resuming on it: no panic at the cutoff, the run finishes and its run row too.
        let out = tune_cmd(&db, "4").output().expect("tune");
        assert!(out.status.success(), "median {median}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
        // `best` never shows the forged row.
        let out = bin()
            .args(["best", "--workload", SPEC, "--json", "--db"])
            .arg(&db)
            .output()
            .expect("best");
        assert!(out.status.success(), "{}", stderr(&out));
        let line = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value =
            serde_json::from_str(line.lines().next().expect("one line")).expect("json");
        let best = v["result"]["median_s"].as_f64().expect("a timing");
        assert!(best > 1e-8, "median {median}: best {best}");
        // Merging it into another database copies the sound records, reports the forged one.
        let into = dir.path().join(format!("into{i}.db"));
        let out = bin()
            .args(["merge", "--into"])
            .arg(&into)
            .arg(&db)
            .output()
            .expect("merge");
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("out of range"), "{}", stderr(&out));
        assert!(
            Database::open_existing(&into)
                .expect("open")
                .count()
                .expect("n")
                > 0
        );
    }
}

#[test]
fn an_output_that_is_the_database_is_refused_and_the_database_kept() {
    let dir = temp();
    let db = dir.path().join("a.db");
    let mut d = Database::open(&db).expect("open");
    let w = Workload::new("matmul:K=16,M=16,N=16,dtype=f32", 8192.0);
    let t = Timing {
        median_s: 1e-6,
        min_s: 1e-6,
        max_s: 1e-6,
        repeats: 1,
    };
    d.insert_batch(
        None,
        &[NewRecord::measured(w, "llvm", r#"{"steps":[]}"#, t)],
    )
    .expect("insert");
    drop(d);
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&db, &link).expect("symlink");
    let cases: Vec<Vec<std::ffi::OsString>> = vec![
        vec![
            "export".into(),
            "--db".into(),
            db.clone().into(),
            "--out".into(),
            db.clone().into(),
        ],
        vec![
            "export".into(),
            "--db".into(),
            db.clone().into(),
            "--out".into(),
            link.clone().into(),
        ],
        vec![
            "report".into(),
            "--db".into(),
            db.clone().into(),
            "--out".into(),
            db.clone().into(),
        ],
        vec![
            "plot".into(),
            "--db".into(),
            db.clone().into(),
            "--workload".into(),
            SPEC.into(),
            "--out".into(),
            db.clone().into(),
        ],
        vec![
            "model".into(),
            "train".into(),
            "--db".into(),
            db.clone().into(),
            "--out".into(),
            db.clone().into(),
        ],
    ];
    let before = std::fs::read(&db).expect("read");
    for args in &cases {
        let out = bin().args(args).output().expect("runs");
        assert_usage_error(&out, "same file");
        assert_eq!(std::fs::read(&db).expect("read"), before, "{args:?}");
    }
    let obj = dir.path().join("k.o");
    let out = bin()
        .args(["codegen", "--workload", SPEC, "--emit", "obj", "--out"])
        .arg(&obj)
        .arg("--header")
        .arg(&obj)
        .output()
        .expect("codegen");
    assert_usage_error(&out, "same file");
    assert!(!obj.exists());
}

#[test]
fn a_workload_too_large_for_the_memory_is_a_usage_error() {
    // 2 GiB of address space, as in the probe: the 17 GB input cannot fit.
    let out = bin()
        .args(["run", "--workload", "matmul:M=65536,N=4,K=65536"])
        .pre_exec_limit_address_space(2 << 30)
        .output()
        .expect("run");
    assert_usage_error(&out, "GiB");
}

/// Sets `RLIMIT_AS` in the child before it runs.
trait LimitAddressSpace {
    fn pre_exec_limit_address_space(&mut self, bytes: u64) -> &mut Self;
}

impl LimitAddressSpace for Command {
    fn pre_exec_limit_address_space(&mut self, bytes: u64) -> &mut Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only calls setrlimit, which is async-signal-safe.
        unsafe {
            self.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        }
    }
}

#[test]
fn unbounded_flags_and_foreign_targets_are_usage_errors() {
    let dir = temp();
    let db = dir.path().join("t.db");
    let run = |extra: &[&str]| {
        bin()
            .args(["run", "--workload", "matmul:M=4,N=4,K=4"])
            .args(extra)
            .output()
            .expect("run")
    };
    assert_usage_error(&run(&["--min-repeat-ms", "inf"]), "--min-repeat-ms");
    assert_usage_error(&run(&["--min-repeat-ms=-5"]), "--min-repeat-ms");
    assert_usage_error(&run(&["--threads", "100000"]), "--threads");
    // (`--threads 0` is every core: tests/cli_run.rs.)
    assert_usage_error(&run(&["--timeout", "inf"]), "--timeout");
    let out = tune_cmd(&db, "4")
        .args(["--target", "llvm -mcpu=skylake"])
        .output()
        .expect("tune");
    assert_usage_error(&out, "skylake");
    let out = tune_cmd(&db, "4")
        .args(["--time-budget", "inf"])
        .output()
        .expect("tune");
    assert_usage_error(&out, "--time-budget");
    assert!(!db.exists(), "nothing written for a refused command");
}

#[test]
fn a_resumed_run_says_so() {
    let dir = temp();
    let db = dir.path().join("r.db");
    let out = tune_cmd(&db, "4").output().expect("tune");
    assert!(out.status.success(), "{}", stderr(&out));
    let mut again = bin();
    again
        .args([
            "tune",
            "--workload",
            SPEC,
            "--trials",
            "4",
            "--batch-size",
            "4",
        ])
        .args(["--population", "16", "--json", "--db"])
        .arg(&db);
    let out = again.output().expect("tune");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("resuming"), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("a JSON line");
    assert_eq!(v["resumed"]["trials"].as_u64(), Some(4), "{stdout}");
    assert!(
        v["resumed"]["best_latency_s"].as_f64().is_some(),
        "{stdout}"
    );
}

#[test]
fn usage_errors_are_one_line_and_a_hint() {
    let out = bin().args(["run", "--bogus"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(err.contains("--bogus") && err.contains("--help"), "{err}");
    let out = bin()
        .args(["run", "--workload", "matmul:M=4,N=4,K=4\nx"])
        .output()
        .expect("run");
    assert_usage_error(&out, "4\\nx");
}

#[test]
fn a_device_as_the_database_is_a_usage_error_for_every_subcommand() {
    for args in [
        vec!["records", "--db", "/dev/null"],
        vec!["best", "--workload", SPEC, "--db", "/dev/null"],
        vec!["export", "--db", "/dev/null"],
    ] {
        let out = bin().args(&args).output().expect("runs");
        assert_usage_error(&out, "/dev/null");
    }
    let out = tune_cmd(Path::new("/dev/null"), "2")
        .output()
        .expect("tune");
    assert_usage_error(&out, "/dev/null");
}

#[test]
fn unknown_llvm_options_are_usage_errors() {
    let dir = temp();
    let db = dir.path().join("t.db");
    for bad in ["-bogus-option", "-unroll-threshold=300 -help", "unroll"] {
        let out = tune_cmd(&db, "4")
            .env("TENSORTUNE_LLVM_ARGS", bad)
            .output()
            .expect("tune");
        assert_usage_error(&out, "TENSORTUNE_LLVM_ARGS");
        assert!(!db.exists(), "nothing written for a refused command");
    }
    let out = bin()
        .args(["run", "--workload", "matmul:M=4,N=4,K=4", "--repeat", "1"])
        .env("TENSORTUNE_LLVM_ARGS", "-bogus-option")
        .output()
        .expect("run");
    assert_usage_error(&out, "bogus-option");
    // A real option is still taken.
    let out = bin()
        .args(["run", "--workload", "matmul:M=4,N=4,K=4", "--repeat", "1"])
        .env("TENSORTUNE_LLVM_ARGS", "-unroll-threshold=300")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", stderr(&out));
}
