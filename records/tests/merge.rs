//! Merging databases: no duplicates, idempotent, commutative in content.

mod common;

use common::*;
use tensortune_records::{Database, RecordsError};

/// Two databases with one record in common (the same measurement, imported into both).
fn two_sources(place: &Place) -> (std::path::PathBuf, std::path::PathBuf) {
    let a_path = place.db("a.db");
    let b_path = place.db("b.db");
    let mut a = Database::open(&a_path).expect("open");
    fill_sample(&mut a, "a", 0);
    let mut b = Database::open(&b_path).expect("open");
    fill_sample(&mut b, "b", 1000);
    let shared = ok_record(&matmul(32), GPU, 4, 1e-6, 77);
    a.insert_batch(None, std::slice::from_ref(&shared))
        .expect("insert");
    b.insert_batch(None, &[shared]).expect("insert");
    // A run that never got a record still travels.
    b.begin_run(&new_run("empty")).expect("begin");
    (a_path, b_path)
}

on_both_backends!(merge_is_idempotent_and_commutative_in_content);
fn merge_is_idempotent_and_commutative_in_content(place: &Place) {
    let (a, b) = two_sources(place);

    let mut ab = Database::open(place.db("ab.db")).expect("open");
    let report = ab.merge_from(&[&a, &b], &FakeSchedules).expect("merge");
    assert_eq!(report.added(), 11, "5 + 5 + the shared record once");
    let mut ba = Database::open(place.db("ba.db")).expect("open");
    ba.merge_from(&[&b], &FakeSchedules).expect("merge");
    ba.merge_from(&[&a], &FakeSchedules).expect("merge");

    let ab_text = export_string(&ab);
    assert_eq!(ab_text, export_string(&ba));
    assert_eq!(ab.count().expect("count"), 11);
    let uids = |db: &Database| {
        let mut runs: Vec<_> = db
            .runs()
            .expect("runs")
            .into_iter()
            .map(|r| (r.uid, r.finished_at, r.records))
            .collect();
        runs.sort();
        runs
    };
    assert_eq!(uids(&ab), uids(&ba));
    assert_eq!(ab.runs().expect("runs").len(), 3);

    // Again, and again with itself as part of the sources: nothing new.
    assert_eq!(
        ab.merge_from(&[&a, &b], &FakeSchedules)
            .expect("merge")
            .added(),
        0
    );
    let ab_path = ab.path().to_path_buf();
    let copy = place.db("ab-copy.db");
    let mut c = Database::open(&copy).expect("open");
    c.merge_from(&[&ab_path], &FakeSchedules).expect("merge");
    drop(c);
    assert_eq!(
        ab.merge_from(&[&copy], &FakeSchedules)
            .expect("merge")
            .added(),
        0
    );
    assert_eq!(export_string(&ab), ab_text);
}

on_both_backends!(merge_is_all_or_nothing_and_refuses_itself);
fn merge_is_all_or_nothing_and_refuses_itself(place: &Place) {
    let (a, _) = two_sources(place);
    let not_db = place.file("notes.txt");
    std::fs::write(
        &not_db,
        "hello, this is not SQLite, but long enough to have a header ......\n".repeat(20),
    )
    .expect("write");
    let mut into = Database::open(place.db("into.db")).expect("open");
    let err = into
        .merge_from(&[&a, &not_db], &FakeSchedules)
        .expect_err("bad source");
    assert!(matches!(err, RecordsError::NotADatabase { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"));
    assert_eq!(into.count().expect("count"), 0);

    let missing = place.db("missing.db");
    let err = into
        .merge_from(&[&missing], &FakeSchedules)
        .expect_err("missing");
    assert!(matches!(err, RecordsError::Missing { .. }), "{err}");

    let own = into.path().to_path_buf();
    let err = into.merge_from(&[&own], &FakeSchedules).expect_err("self");
    assert!(matches!(err, RecordsError::MergeIntoSelf { .. }), "{err}");
    // A hard link is the same file under another name (a file: not a server's database).
    #[cfg(unix)]
    if !tensortune_records::is_server(&own) {
        let link = own.with_file_name("hard-link.db");
        std::fs::hard_link(&own, &link).expect("hard link");
        let err = into.merge_from(&[&link], &FakeSchedules).expect_err("self");
        assert!(matches!(err, RecordsError::MergeIntoSelf { .. }), "{err}");
    }
}

/// A source whose rows were edited by hand (or by another program) into what no tuning run
/// writes: a negative latency, a trace that is not JSON, an op the library does not have,
/// markup in a key, a latency too short to be real.
fn hostile_source(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = db_path(dir, "hostile.db");
    let mut db = Database::open(&path).expect("open");
    let batch: Vec<_> = (0..6u32)
        .map(|i| ok_record(&matmul(16 + i), CPU, 4, 1e-5, i64::from(i)))
        .collect();
    db.insert_batch(None, &batch).expect("insert");
    drop(db);
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    let edits = [
        "UPDATE records SET median_s = -1.0, min_s = -2.0 WHERE workload_id = \
         (SELECT id FROM workloads WHERE key = 'matmul:K=16,M=16,N=16,dtype=f32')",
        "UPDATE records SET trace = 'not json {' WHERE workload_id = \
         (SELECT id FROM workloads WHERE key = 'matmul:K=17,M=17,N=17,dtype=f32')",
        "UPDATE workloads SET key = 'conv9d:N=1' WHERE key = 'matmul:K=18,M=18,N=18,dtype=f32'",
        "UPDATE workloads SET key = '<b>x</b>:M=1' WHERE key = 'matmul:K=19,M=19,N=19,dtype=f32'",
        "UPDATE records SET median_s = 1e-300, min_s = 1e-300 WHERE workload_id = \
         (SELECT id FROM workloads WHERE key = 'matmul:K=20,M=20,N=20,dtype=f32')",
    ];
    for sql in edits {
        conn.execute(sql, []).expect(sql);
    }
    path
}

#[test]
fn merge_checks_every_record_like_import() {
    let dir = temp_dir();
    let source = hostile_source(&dir);
    let mut into = Database::open(db_path(&dir, "into.db")).expect("open");
    let report = into.merge_from(&[&source], &FakeSchedules).expect("merge");
    assert_eq!(report.added(), 1, "only matmul 21 is sound: {report:?}");
    assert_eq!(report.rejected.len(), 5, "{report:?}");
    let text: Vec<String> = report.rejected.iter().map(|r| r.to_string()).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("stored timing out of range")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|t| t.contains("not valid JSON") || t.contains("trace")),
        "{text:?}"
    );
    assert!(text.iter().any(|t| t.contains("conv9d")), "{text:?}");
    assert!(text.iter().any(|t| t.contains("<b>x</b>")), "{text:?}");
    assert!(text.iter().all(|t| !t.contains('\n')), "{text:?}");
    let keys: Vec<String> = into
        .workloads()
        .expect("workloads")
        .into_iter()
        .map(|w| w.workload.key)
        .collect();
    assert_eq!(keys, ["matmul:K=21,M=21,N=21,dtype=f32"]);
}

#[test]
fn readers_treat_out_of_range_rows_as_bad_records() {
    let dir = temp_dir();
    let path = db_path(&dir, "one.db");
    let w = matmul(64);
    let mut db = Database::open(&path).expect("open");
    db.insert_batch(
        None,
        &[
            ok_record(&w, CPU, 4, 2e-5, 0),
            ok_record(&w, CPU, 8, 3e-5, 1),
        ],
    )
    .expect("insert");
    drop(db);
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    // The slower record becomes a negative, then a zero, then a NULL-free impossible time.
    for (median, min) in [(-1.0, -1.0), (0.0, 0.0), (1e-300, 1e-300)] {
        conn.execute(
            "UPDATE records SET median_s = ?1, min_s = ?2 WHERE median_s >= 2.9e-5 OR median_s < 1e-5",
            rusqlite::params![median, min],
        )
        .expect("update");
        let db = Database::open_existing(&path).expect("open");
        let best = db.best(&w.key, CPU).expect("best").expect("a sound record");
        assert_eq!(
            best.outcome.timing().map(|t| t.median_s),
            Some(2e-5),
            "median {median}"
        );
        let all = db.records(&w.key, CPU).expect("records");
        assert_eq!(all.len(), 2);
        let bad = all
            .iter()
            .find(|r| r.outcome.timing().is_none())
            .expect("the edited row reads as a failure");
        assert!(matches!(
            &bad.outcome,
            tensortune_records::Outcome::Failed { kind: tensortune_records::ErrorKind::Other, message }
                if message.contains("out of range")
        ));
        let summary = db.summary().expect("summary");
        assert_eq!(summary[0].errors, 1, "median {median}");
        assert_eq!(summary[0].best_s, Some(2e-5), "median {median}");
    }
    // Times past a day (readers printed 1e308 s as 300 digits) and a workload's FLOPs that
    // are negative: bad records too.
    conn.execute(
        "UPDATE records SET median_s = 1e308, min_s = 1e308, max_s = 1e308 WHERE median_s < 1e-5",
        [],
    )
    .expect("update");
    let db = Database::open_existing(&path).expect("open");
    assert_eq!(db.summary().expect("summary")[0].errors, 1);
    let best = db.best(&w.key, CPU).expect("best").expect("a sound record");
    assert_eq!(best.outcome.timing().map(|t| t.median_s), Some(2e-5));
    drop(db);
    conn.execute("UPDATE workloads SET flops = -1e9", [])
        .expect("update");
    let db = Database::open_existing(&path).expect("open");
    let summary = db.summary().expect("summary");
    assert_eq!((summary[0].errors, summary[0].best_s), (2, None));
    assert!(db.best(&w.key, CPU).expect("best").is_none());
}
