//! The command line when the environment fails it, not the user's input: a full stdout or
//! stderr, a FIFO or device named as a database, an empty database file (another worker's,
//! just created), no file descriptors left for measuring. Each is a one-line error with exit
//! status 2 (or, for the empty file, just works), never a panic, a hang or bogus records.

#![cfg(unix)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensortune"))
}

/// `cmd` with a deadline: a hang is a failure of the test, not of the suite.
fn output_within(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn a_full_stdout_or_stderr_is_exit_status_2() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let full2 = full.try_clone().expect("dup");
    let out = bin().arg("workloads").stdout(full).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("tensortune: <stdout>: "), "{err}");
    // An error to report with stderr full: still status 2, no abort.
    let out = bin()
        .args(["records", "--db", "/nonexistent/x.db"])
        .stderr(full2)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_fifo_or_a_device_is_not_a_database() {
    let dir = tempfile::tempdir().expect("dir");
    let fifo = dir.path().join("f.db");
    let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("c string");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for args in [
        vec!["records", "--db"],
        vec!["best", "--workload", "matmul:M=8,N=8,K=8", "--db"],
        vec!["import", "--db"],
    ] {
        let mut cmd = bin();
        cmd.args(&args).arg(&fifo);
        if args[0] == "import" {
            cmd.arg(dir.path().join("none.jsonl"));
        }
        let out = output_within(&mut cmd, Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("not a database file") || err.contains("no such file"),
            "{args:?}: {err}"
        );
    }
    let out = bin()
        .args(["records", "--db", "/dev/null"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("a device, pipe or socket"), "{err}");
}

/// An empty file is what a worker sees when another has just created the database and not
/// yet set it up (or a creation that failed left): `tune` sets it up.
#[test]
fn tune_sets_up_an_empty_database_file() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("e.db");
    std::fs::write(&db, b"").expect("touch");
    let out = bin()
        .args([
            "tune",
            "--workload",
            "matmul:M=8,N=8,K=8",
            "--trials",
            "2",
            "-q",
        ])
        .arg("--db")
        .arg(&db)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bin()
        .arg("records")
        .arg("--db")
        .arg(&db)
        .output()
        .expect("runs");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("matmul:K=8,M=8,N=8"));
}

/// With no file descriptor to spare, no candidate can be measured: the run stops with the
/// reason and stores nothing, rather than filing every candidate as a failed program.
#[test]
fn a_host_that_cannot_measure_stores_no_failures() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("n.db");
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n 6 && exec "$0" tune --workload matmul:M=64,N=64,K=64 --trials 4 --batch-size 4 --db "$1""#)
        .arg(env!("CARGO_BIN_EXE_tensortune"))
        .arg(&db)
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the host cannot measure"), "{err}");
    if db.exists() {
        let out = bin()
            .arg("export")
            .arg("--db")
            .arg(&db)
            .output()
            .expect("runs");
        assert!(
            out.stdout.is_empty(),
            "stored: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
