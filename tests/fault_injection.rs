//! Faults injected end to end through the `tensortune` binary: the tuner killed at random
//! moments; candidates that crash, hang, allocate without bound or write out of bounds
//! (through the binary's fault plan, `TENSORTUNE_INJECT_FAULTS`); forged and hostile records;
//! outputs that name inputs; workloads too large for the memory; unbounded flags; a database
//! locked by another process, read-only, or on a full disk. Each must end in a sound
//! database, a typed one-line error with exit status 2, and no process left behind; never a
//! panic or an abort.
//!
//! The measurer's own crash isolation (SEGV/BUS/ILL/FPE/ABRT/KILL, the watchdog) is tested on
//! hand-written kernels in `tests/measure.rs`.

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
    tune_of(SPEC, db, trials)
}

/// `tune` of `spec` in batches of 4, quietly.
fn tune_of(spec: &str, db: &Path, trials: &str) -> Command {
    let mut c = bin();
    c.args([
        "tune",
        "--workload",
        spec,
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

/// The error messages of `db`'s failed records, and how many records it holds.
fn error_messages(db: &Path) -> (Vec<String>, usize) {
    let d = Database::open_read_only(db).expect("opens");
    assert_eq!(d.integrity_check().expect("check"), Vec::<String>::new());
    let mut errors = Vec::new();
    let mut n = 0;
    for w in d.workloads().expect("workloads") {
        for t in d.targets_of(&w.workload.key).expect("targets") {
            for r in d.records(&w.workload.key, &t).expect("records") {
                n += 1;
                if let tensortune_records::Outcome::Failed { message, .. } = &r.outcome {
                    errors.push(message.clone());
                }
            }
        }
    }
    (errors, n)
}

#[test]
fn candidates_that_crash_hang_exhaust_memory_or_write_out_of_bounds_cost_one_error_each() {
    let dir = temp();
    let db = dir.path().join("faults.db");
    let needle = db.to_string_lossy().into_owned();
    // Odd sizes, so the output (60 bytes) ends inside the alignment slack before its fence:
    // the write just past it is seen by the fence check, not by a fault. Candidate 3 is the
    // first sound one; the hang comes after it, so the cutoff stops it early.
    let out = tune_of("matmul:M=3,N=5,K=7", &db, "8")
        .env(
            tensortune::measure::FAULTS_ENV,
            "alloc@0,segv@1,oob@2,hang@5",
        )
        // The candidate that allocates without bound meets its cap (three quarters of what
        // is left of this limit) in well under a second instead of filling the machine.
        .pre_exec_limit_address_space(2 << 30)
        .output()
        .expect("tune");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    let (errors, n) = error_messages(&db);
    assert_eq!(n, 8, "every candidate has its record");
    for (needle, what) in [
        ("out of memory for a temporary", "the allocating candidate"),
        ("signal 11", "the segfaulting candidate"),
        (
            "wrote outside its output buffer 0",
            "the out-of-bounds write",
        ),
        (
            "before its checked first run finished",
            "the hung candidate",
        ),
    ] {
        let found = errors.iter().filter(|m| m.contains(needle)).count();
        assert_eq!(found, 1, "{what}: `{needle}` in {errors:?}");
    }
    assert_eq!(
        errors.len(),
        4,
        "only the injected candidates failed: {errors:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("GFLOP/s"),
        "a best was found and re-measured"
    );
    assert_eq!(
        processes_naming(&needle),
        Vec::<u32>::new(),
        "no child left"
    );
    // A write just past an output that ends on a page boundary faults on the fence.
    let db2 = dir.path().join("fence.db");
    let out = tune_cmd(&db2, "4")
        .env(tensortune::measure::FAULTS_ENV, "oob@0")
        .output()
        .expect("tune");
    assert!(out.status.success(), "{}", stderr(&out));
    let (errors, _) = error_messages(&db2);
    assert!(
        errors.len() == 1 && errors[0].contains("signal 11"),
        "{errors:?}"
    );
    // A malformed plan would test nothing: refused up front.
    let out = tune_cmd(&dir.path().join("x.db"), "4")
        .env(tensortune::measure::FAULTS_ENV, "boom@1")
        .output()
        .expect("tune");
    assert_usage_error(&out, "boom@1");
}

/// Tunes `SPEC` for 4 trials into `db` and exports its records to `to`.
fn tune_and_export(db: &Path, to: &Path) {
    assert!(tune_cmd(db, "4").output().expect("tune").status.success());
    let out = bin()
        .args(["export", "--db"])
        .arg(db)
        .arg("--out")
        .arg(to)
        .output()
        .expect("export");
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_database_locked_past_the_busy_timeout_is_a_usage_error_and_readers_still_work() {
    let dir = temp();
    let db = dir.path().join("locked.db");
    let exported = dir.path().join("records.jsonl");
    tune_and_export(&db, &exported);
    let before = error_messages(&db).1;
    // Another process's writer holds the lock: rusqlite's own build of SQLite, in this
    // process, with a transaction that is never committed.
    let holder = rusqlite::Connection::open(&db).expect("open");
    holder
        .execute_batch("BEGIN IMMEDIATE; UPDATE runs SET finished_at = finished_at;")
        .expect("lock");
    let t0 = Instant::now();
    let out = tune_cmd(&db, "8")
        .env(tensortune_records::BUSY_TIMEOUT_ENV, "1")
        .output()
        .expect("tune");
    assert_usage_error(&out, "locked by another process");
    assert!(t0.elapsed() >= Duration::from_millis(900), "it waited");
    let out = bin()
        .args(["import", "--db"])
        .arg(&db)
        .arg(&exported)
        .env(tensortune_records::BUSY_TIMEOUT_ENV, "0.5")
        .output()
        .expect("import");
    assert_usage_error(&out, "locked by another process");
    // Readers are not writers: WAL lets them read past the lock.
    for args in [
        vec!["records", "--db"],
        vec!["best", "--workload", SPEC, "--db"],
        vec!["export", "--db"],
    ] {
        let out = bin()
            .args(&args)
            .arg(&db)
            .env(tensortune_records::BUSY_TIMEOUT_ENV, "1")
            .output()
            .expect("reader");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
    holder.execute_batch("ROLLBACK").expect("unlock");
    drop(holder);
    assert_eq!(
        error_messages(&db).1,
        before,
        "nothing lost, nothing half-written"
    );
    // A bad timeout is refused, not replaced by the default.
    let out = tune_cmd(&db, "8")
        .env(tensortune_records::BUSY_TIMEOUT_ENV, "forever")
        .output()
        .expect("tune");
    assert_usage_error(&out, tensortune_records::BUSY_TIMEOUT_ENV);
}

/// Runs the command as `nobody` when this test runs as root (for whom permissions do not
/// apply), so that a file and folder the test makes read-only are read-only to it.
fn as_unprivileged(c: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        c.uid(65534).gid(65534);
    }
    c
}

#[test]
fn a_read_only_database_serves_every_reader_and_refuses_writers_cleanly() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp();
    let folder = dir.path().join("ro");
    std::fs::create_dir(&folder).expect("mkdir");
    let db = folder.join("frozen.db");
    assert!(tune_cmd(&db, "4").output().expect("tune").status.success());
    let bytes = std::fs::read(&db).expect("read");
    // Reachable by `nobody`, writable by no one but root.
    let perms = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    perms(dir.path(), 0o755);
    perms(&folder, 0o555);
    perms(&db, 0o444);
    let outdir = dir.path().join("out");
    std::fs::create_dir(&outdir).expect("mkdir");
    perms(&outdir, 0o777);
    let report = outdir.join("r.html");
    if !as_unprivileged(bin().arg("--version"))
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("skipped: the binary is not reachable by `nobody` from this checkout");
        return;
    }
    let readers: Vec<Vec<&str>> = vec![
        vec!["records", "--db"],
        vec!["best", "--workload", SPEC, "--db"],
        vec!["export", "--db"],
        vec!["show", "--workload", SPEC, "--db"],
        vec!["run", "--workload", SPEC, "--repeat", "1", "--db"],
        vec!["codegen", "--workload", SPEC, "--emit", "loop", "--db"],
    ];
    for args in &readers {
        let out = as_unprivileged(bin().args(args).arg(&db))
            .output()
            .expect("reader");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
    let out = as_unprivileged(
        bin()
            .args(["report", "--out"])
            .arg(&report)
            .arg("--db")
            .arg(&db),
    )
    .output()
    .expect("report");
    assert!(out.status.success(), "report: {}", stderr(&out));
    assert!(report.exists());
    // Writers: a clear one-line error, exit 2, the file untouched.
    let out = as_unprivileged(&mut tune_cmd(&db, "8"))
        .output()
        .expect("tune");
    assert_usage_error(&out, "frozen.db");
    let out = as_unprivileged(bin().args(["import", "--db"]).arg(&db).arg("/dev/null"))
        .output()
        .expect("import");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    perms(&folder, 0o755);
    assert_eq!(std::fs::read(&db).expect("read"), bytes, "unchanged");
}

/// A small tmpfs mounted for one test and unmounted when dropped (root only).
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: PathBuf, kib: u32) -> Option<SmallDisk> {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            return None;
        }
        std::fs::create_dir_all(&at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallDisk(at))
    }

    /// Fills what is left with a file, so the next write fails.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).expect("filler");
        let block = vec![7u8; 4096];
        while f.write_all(&block).is_ok() {}
        let _ = f.write_all(&[7u8; 1]);
        let _ = f.sync_all();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_is_a_usage_error_and_keeps_every_record_and_output() {
    let dir = temp();
    let Some(disk) = SmallDisk::mount(dir.path().join("disk"), 1024) else {
        eprintln!("skipped: a full disk needs root to mount a small tmpfs");
        return;
    };
    let db = disk.0.join("full.db");
    let export = disk.0.join("records.jsonl");
    tune_and_export(&db, &export);
    let exported = std::fs::read(&export).expect("read");
    let before = error_messages(&db).1;
    disk.fill();
    let out = tune_cmd(&db, "64").output().expect("tune");
    assert_usage_error(&out, "full");
    // An output rewritten on the full disk stays as it was: written elsewhere first, renamed
    // into place only when whole.
    let report = disk.0.join("report.html");
    std::fs::write(&report, b"old report").expect("small write fits");
    for args in [
        vec!["export", "--out", export.to_str().expect("utf-8")],
        vec!["report", "--out", report.to_str().expect("utf-8")],
    ] {
        let out = bin()
            .args(&args)
            .arg("--db")
            .arg(&db)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out).trim_end().lines().count(),
            1,
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(std::fs::read(&export).expect("read"), exported);
    assert_eq!(std::fs::read(&report).expect("read"), b"old report");
    let _ = std::fs::remove_file(disk.0.join("filler"));
    assert_eq!(error_messages(&db).1, before, "every committed record kept");
    let leftovers: Vec<_> = std::fs::read_dir(&disk.0)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert_eq!(
        leftovers,
        Vec::<String>::new(),
        "no temporary file left behind"
    );
}

/// A copy of `base` changed by `sql` (plain SQL, as a hostile or careless hand would).
fn edited_db(base: &Path, name: &str, sql: &str) -> PathBuf {
    let path = base.with_file_name(name);
    std::fs::copy(base, &path).expect("copy");
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    conn.execute_batch(sql).expect("edit");
    path
}

/// Cases of the hostile-user probe (`scripts/probe.py`) that once panicked, hung or exited 1:
/// each now ends in one line and exit status 2, quickly.
#[test]
fn probe_regressions_are_one_line_usage_errors() {
    let dir = temp();
    let base = dir.path().join("base.db");
    assert!(tune_cmd(&base, "4")
        .output()
        .expect("tune")
        .status
        .success());
    let long_key = format!("llvm {}", "x".repeat(100_000));
    let huge_trace = format!(
        "{{\"steps\":[{}]}}",
        vec![r#"{"op":"split","stage":2,"iter":0,"factors":[1]}"#; 5000].join(",")
    );
    let cases: Vec<(PathBuf, &str)> = vec![
        // A key wider than `format!` pads (the table panicked).
        (
            edited_db(
                &base,
                "wide.db",
                &format!("UPDATE records SET target_key = '{long_key}' WHERE id = 1;"),
            ),
            "",
        ),
        // Text where a number belongs.
        (
            edited_db(
                &base,
                "text.db",
                "UPDATE records SET median_s = 'abc' WHERE error_kind IS NULL;",
            ),
            "out of place",
        ),
        // A version no file of ours has.
        (
            edited_db(&base, "neg.db", "PRAGMA user_version = -5;"),
            "schema version -5",
        ),
        // Tables of today's schema claiming the first version.
        (
            edited_db(&base, "older.db", "PRAGMA user_version = 1;"),
            "do not match its schema version",
        ),
        // A trace long enough to take minutes to replay.
        (
            edited_db(
                &base,
                "longtrace.db",
                &format!("UPDATE records SET trace = '{huge_trace}';"),
            ),
            "",
        ),
    ];
    for (db, needle) in &cases {
        for args in [
            vec!["records", "--db"],
            vec!["export", "--db"],
            vec!["merge", "--into", "merged.db"],
        ] {
            let t0 = Instant::now();
            let out = bin()
                .current_dir(dir.path())
                .args(&args)
                .arg(db)
                .output()
                .expect("runs");
            let err = stderr(&out);
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{args:?} {db:?} took {:?}",
                t0.elapsed()
            );
            assert!(!err.contains("panicked"), "{args:?} {db:?}: {err}");
            match out.status.code() {
                Some(0) => {}
                // merge lists each bad record and ends with one summary line.
                Some(2) if args[0] == "merge" && err.contains("bad record") => {}
                Some(2) => assert_usage_error(&out, needle),
                c => panic!("{args:?} {db:?}: exit {c:?}: {err}"),
            }
        }
    }
    let out = bin()
        .args(["export", "--db"])
        .arg(&base)
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("export");
    assert_usage_error(&out, "directory");
    // A device as the output is written, not replaced by a renamed file.
    let out = bin()
        .args(["export", "--db"])
        .arg(&base)
        .arg("--out")
        .arg("/dev/null")
        .output()
        .expect("export");
    assert!(out.status.success(), "{}", stderr(&out));
    let meta = std::fs::metadata("/dev/null").expect("/dev/null");
    assert!(!meta.is_file(), "/dev/null is still a device");
    let out = bin()
        .args(["run", "--workload", "matmul:M=2,N=2,K=2", "--inputs"])
        .arg("/dev/zero,/dev/zero")
        .output()
        .expect("run");
    assert_usage_error(&out, "not a regular file");
    let out = bin()
        .args(["model", "eval", "--rounds", "100000", "--db"])
        .arg(&base)
        .output()
        .expect("eval");
    assert_usage_error(&out, "--rounds");
    for (flag, value) in [
        ("--eta", "0"),
        ("--eta", "NaN"),
        ("--pairs-per-program", "0"),
    ] {
        let out = bin()
            .args(["model", "eval", flag, value, "--db"])
            .arg(&base)
            .output()
            .expect("eval");
        assert_usage_error(&out, flag);
    }
    let out = bin()
        .args([
            "best",
            "--workload",
            SPEC,
            "--target",
            "llvm\n-mcpu=x",
            "--db",
        ])
        .arg(&base)
        .output()
        .expect("best");
    assert_usage_error(&out, "llvm\\n-mcpu=x");
    let out = bin()
        .args(["run", "--workload", SPEC, "--repeat", "1"])
        .env("TENSORTUNE_LLVM_ARGS", "-unroll-threshold=abc")
        .output()
        .expect("run");
    assert_usage_error(&out, "'abc' value invalid");
}
