//! Merging databases: no duplicates, idempotent, commutative in content.

mod common;

use common::*;
use tensortune_records::{Database, RecordsError};

/// Two databases with one record in common (the same measurement, imported into both).
fn two_sources(dir: &tempfile::TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let a_path = db_path(dir, "a.db");
    let b_path = db_path(dir, "b.db");
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

#[test]
fn merge_is_idempotent_and_commutative_in_content() {
    let dir = temp_dir();
    let (a, b) = two_sources(&dir);

    let mut ab = Database::open(db_path(&dir, "ab.db")).expect("open");
    let report = ab.merge_from(&[&a, &b]).expect("merge");
    assert_eq!(report.added(), 11, "5 + 5 + the shared record once");
    let mut ba = Database::open(db_path(&dir, "ba.db")).expect("open");
    ba.merge_from(&[&b]).expect("merge");
    ba.merge_from(&[&a]).expect("merge");

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
    assert_eq!(ab.merge_from(&[&a, &b]).expect("merge").added(), 0);
    let ab_path = ab.path().to_path_buf();
    let copy = db_path(&dir, "ab-copy.db");
    let mut c = Database::open(&copy).expect("open");
    c.merge_from(&[&ab_path]).expect("merge");
    drop(c);
    assert_eq!(ab.merge_from(&[&copy]).expect("merge").added(), 0);
    assert_eq!(export_string(&ab), ab_text);
}

#[test]
fn merge_is_all_or_nothing_and_refuses_itself() {
    let dir = temp_dir();
    let (a, _) = two_sources(&dir);
    let not_db = db_path(&dir, "notes.txt");
    std::fs::write(
        &not_db,
        "hello, this is not SQLite, but long enough to have a header ......\n".repeat(20),
    )
    .expect("write");
    let mut into = Database::open(db_path(&dir, "into.db")).expect("open");
    let err = into.merge_from(&[&a, &not_db]).expect_err("bad source");
    assert!(matches!(err, RecordsError::NotADatabase { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"));
    assert_eq!(into.count().expect("count"), 0);

    let missing = db_path(&dir, "missing.db");
    let err = into.merge_from(&[&missing]).expect_err("missing");
    assert!(matches!(err, RecordsError::Missing { .. }), "{err}");

    let own = into.path().to_path_buf();
    let err = into.merge_from(&[&own]).expect_err("self");
    assert!(matches!(err, RecordsError::MergeIntoSelf { .. }), "{err}");
}
