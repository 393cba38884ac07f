//! Several processes and killed processes: the durability promises of the database.
//!
//! The children are this test binary itself, run with `--exact child --ignored` and told
//! what to do through environment variables (read only here, by the test harness).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use tensortune_records::{Database, NewRecord};

const DB: &str = "TENSORTUNE_RECORDS_TEST_DB";
const TAG: &str = "TENSORTUNE_RECORDS_TEST_TAG";
const BATCHES: &str = "TENSORTUNE_RECORDS_TEST_BATCHES";

/// Records per batch. Large enough that a batch takes a while to write, so that kills land
/// inside transactions as well as between them.
const BATCH: usize = 50;

fn batch(tag: &str, index: usize) -> Vec<NewRecord> {
    let w = matmul(256);
    (0..BATCH)
        .map(|i| {
            let mut r = ok_record(
                &w,
                CPU,
                1,
                1e-3 + i as f64 * 1e-6,
                (index * BATCH + i) as i64,
            );
            // A long, distinct trace per record and writer.
            r.trace_json = format!(
                r#"[{{"Split":{{"stage":0,"tag":"{tag}","batch":{index},"i":{i},"pad":"{}"}}}}]"#,
                "x".repeat(400)
            );
            r
        })
        .collect()
}

/// The child's side: insert batches and print `committed N` after each commit; stop after
/// `BATCHES` batches, or never (until killed) without it.
#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let (Ok(db), Ok(tag)) = (std::env::var(DB), std::env::var(TAG)) else {
        return;
    };
    let limit: usize = std::env::var(BATCHES)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    let mut db = Database::open(&db).expect("child open");
    let run = db.begin_run(&new_run(&tag)).expect("child begin run");
    for index in 0..limit {
        db.insert_batch(Some(run), &batch(&tag, index))
            .expect("child insert");
        println!("committed {}", index + 1);
    }
    db.finish_run(run).expect("child finish");
}

fn spawn(db: &Path, tag: &str, batches: Option<usize>) -> Child {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(DB, db)
    .env(TAG, tag)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    if let Some(n) = batches {
        cmd.env(BATCHES, n.to_string());
    }
    cmd.spawn().expect("spawn child")
}

on_both_backends!(two_processes_writing_at_once_lose_nothing);
fn two_processes_writing_at_once_lose_nothing(place: &Place) {
    // A fresh path: the two children also race to create and migrate the file.
    let path = place.db("shared.db");
    let batches = 100;
    let children = [
        spawn(&path, "left", Some(batches)),
        spawn(&path, "right", Some(batches)),
    ];
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "a writer failed: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("committed {batches}")), "{text}");
    }
    let db = Database::open_existing(&path).expect("open");
    assert!(db.integrity_check().expect("check").is_empty());
    assert_eq!(db.count().expect("count"), (2 * batches * BATCH) as u64);
    let runs = db.runs().expect("runs");
    assert_eq!(runs.len(), 2);
    assert!(runs
        .iter()
        .all(|r| r.records == (batches * BATCH) as u64 && r.finished_at.is_some()));
}

on_both_backends!(sigkill_during_inserts_keeps_every_committed_batch);
fn sigkill_during_inserts_keeps_every_committed_batch(place: &Place) {
    let path = place.db("killed.db");
    // Kill after different numbers of commits and at different delays after the last one,
    // so the kill lands between batches, inside a batch and inside a commit. Each round
    // appends to the same file, which must survive every kill.
    let mut committed_total = 0usize;
    for (round, (after, delay_us)) in [(1usize, 0u64), (3, 300), (5, 1500), (2, 4000), (4, 700)]
        .into_iter()
        .enumerate()
    {
        let mut child = spawn(&path, &format!("round{round}"), None);
        // The reader stays open until after the kill: closing the pipe early would make the
        // child die of a broken pipe between batches instead of by SIGKILL at a random point.
        let mut stdout = BufReader::new(child.stdout.take().expect("child stdout"));
        let mut committed = 0usize;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut line = String::new();
        while committed < after {
            line.clear();
            let n = stdout.read_line(&mut line).expect("child output");
            assert!(n > 0, "the child stopped early");
            if let Some(count) = line.strip_prefix("committed ") {
                committed = count.trim().parse().expect("a count");
            }
            assert!(Instant::now() < deadline, "the child is too slow");
        }
        std::thread::sleep(Duration::from_micros(delay_us));
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("reap");
        drop(stdout);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "the child died by SIGKILL, not by itself"
        );
        committed_total += committed;

        let db = Database::open_existing(&path).expect("open after kill");
        assert_eq!(db.integrity_check().expect("check"), Vec::<String>::new());
        let count = db.count().expect("count") as usize;
        assert!(
            count >= committed_total * BATCH,
            "round {round}: {count} records, but {committed_total} batches were committed"
        );
        assert_eq!(count % BATCH, 0, "a batch was stored in part");
        // Count what is really there, for the next round's lower bound.
        committed_total = count / BATCH;
        let runs = db.runs().expect("runs");
        assert_eq!(runs.len(), round + 1);
        assert!(
            runs.iter().all(|r| r.finished_at.is_none()),
            "killed runs never finish"
        );
    }
}
