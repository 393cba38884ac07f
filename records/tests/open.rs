//! Opening files: bad files, newer and older schemas, the v1 -> v2 migration.

mod common;

use common::*;
use rusqlite::Connection;
use tensortune_records::{Database, RecordsError, SCHEMA_VERSION};

/// Schema v1 exactly as the first release wrote it. Frozen here on purpose: it is what
/// databases in the wild hold, whatever the crate's own constants say today.
const V1_SCHEMA: &str = "
CREATE TABLE workloads (
    id    INTEGER PRIMARY KEY,
    key   TEXT NOT NULL UNIQUE,
    flops REAL NOT NULL
);
CREATE TABLE runs (
    id           INTEGER PRIMARY KEY,
    uid          TEXT NOT NULL UNIQUE,
    started_at   TEXT NOT NULL,
    finished_at  TEXT,
    tool_version TEXT NOT NULL,
    target_key   TEXT NOT NULL,
    seed         INTEGER,
    options      TEXT NOT NULL
);
CREATE TABLE records (
    id            INTEGER PRIMARY KEY,
    uid           TEXT NOT NULL UNIQUE,
    workload_id   INTEGER NOT NULL REFERENCES workloads(id),
    target_key    TEXT NOT NULL,
    trace         TEXT NOT NULL,
    trace_hash    TEXT NOT NULL,
    median_s      REAL,
    min_s         REAL,
    max_s         REAL,
    repeats       INTEGER,
    error_kind    TEXT CHECK (error_kind IN
                      ('compile', 'runtime', 'timeout', 'wrong_result', 'other')),
    error_message TEXT,
    measured_at   TEXT NOT NULL,
    run_id        INTEGER REFERENCES runs(id),
    CHECK ((error_kind IS NULL) =
           (median_s IS NOT NULL AND min_s IS NOT NULL AND max_s IS NOT NULL
            AND repeats IS NOT NULL))
);
CREATE INDEX records_best ON records(workload_id, target_key, median_s)
    WHERE error_kind IS NULL;
PRAGMA application_id = 1414820451;
PRAGMA user_version = 1;
";

/// A v1 file written by hand, in rollback-journal mode, with one run and two records.
fn make_v1(path: &std::path::Path) {
    let conn = Connection::open(path).expect("create");
    conn.execute_batch(V1_SCHEMA).expect("v1 schema");
    conn.execute_batch(
        "INSERT INTO workloads (id, key, flops) VALUES (1, 'matmul:K=64,M=64,N=64,dtype=f32', 524288);
         INSERT INTO runs VALUES (1, 'run-v1', '2025-06-01T10:00:00.000Z', '2025-06-01T11:00:00.000Z',
                                  'tensortune 0.0.9', 'llvm -mcpu=znver4', 3, '--trials 2');
         INSERT INTO records (uid, workload_id, target_key, trace, trace_hash, median_s, min_s,
                              max_s, repeats, measured_at, run_id)
             VALUES ('r1', 1, 'llvm -mcpu=znver4', '[]',
                     '4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945',
                     2e-5, 1e-5, 3e-5, 5, '2025-06-01T10:30:00.000Z', 1);
         INSERT INTO records (uid, workload_id, target_key, trace, trace_hash, error_kind,
                              error_message, measured_at, run_id)
             VALUES ('r2', 1, 'llvm -mcpu=znver4', '[1]',
                     'a9a9c8d8c9bbef1b6b5e3a1d1a5b5a0c2d4c4b0b5b1d0e6b2e4c6a5c6d8d9e0f', 'timeout',
                     'ran past 10 s', '2025-06-01T10:31:00.000Z', 1);",
    )
    .expect("v1 rows");
}

#[test]
fn a_v1_database_is_migrated_on_open_and_keeps_its_records() {
    let dir = temp_dir();
    let path = db_path(&dir, "old.db");
    make_v1(&path);

    // Read-only opening reads v1 as it is, and leaves it v1.
    let ro = Database::open_read_only(&path).expect("read-only open");
    assert_eq!(ro.schema_version().expect("version"), 1);
    assert_eq!(ro.count().expect("count"), 2);
    assert_eq!(ro.workloads().expect("workloads")[0].op, "matmul");
    drop(ro);

    let mut db = Database::open_existing(&path).expect("open");
    assert_eq!(db.schema_version().expect("version"), SCHEMA_VERSION);
    assert!(db.integrity_check().expect("check").is_empty());
    let key = "matmul:K=64,M=64,N=64,dtype=f32";
    let best = db
        .best(key, "llvm -mcpu=znver4")
        .expect("best")
        .expect("record");
    assert_eq!(best.outcome.timing().map(|t| t.repeats), Some(5));
    assert_eq!(
        db.measured_hashes(key, "llvm -mcpu=znver4")
            .expect("hashes")
            .len(),
        2
    );
    assert_eq!(db.runs().expect("runs")[0].tool_version, "tensortune 0.0.9");

    // v2's column is backfilled and its index exists.
    let conn = Connection::open(&path).expect("plain open");
    let op: String = conn
        .query_row("SELECT op FROM workloads", [], |r| r.get(0))
        .expect("op column");
    assert_eq!(op, "matmul");
    let indexes: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index'
             AND name IN ('records_by_trace', 'workloads_by_op')",
            [],
            |r| r.get(0),
        )
        .expect("indexes");
    assert_eq!(indexes, 2);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("mode");
    assert_eq!(mode, "wal");

    // New records go in beside the old ones; reopening does not migrate again.
    db.insert_batch(
        None,
        &[ok_record(&matmul(64), "llvm -mcpu=znver4", 4, 1e-5, 0)],
    )
    .expect("insert");
    drop(db);
    let db = Database::open_existing(&path).expect("reopen");
    assert_eq!(db.count().expect("count"), 3);
}

#[test]
fn a_database_of_a_newer_schema_is_refused_by_name() {
    let dir = temp_dir();
    let path = db_path(&dir, "future.db");
    drop(Database::open(&path).expect("create"));
    let conn = Connection::open(&path).expect("plain open");
    conn.execute_batch("PRAGMA user_version = 99;")
        .expect("bump");
    drop(conn);
    for err in [
        Database::open(&path).expect_err("newer"),
        Database::open_read_only(&path).expect_err("newer"),
    ] {
        assert!(
            matches!(
                err,
                RecordsError::NewerSchema {
                    found: 99,
                    supported: SCHEMA_VERSION,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("future.db"), "{err}");
        assert!(err.is_user_error());
    }
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_by_name() {
    let dir = temp_dir();
    let path = db_path(&dir, "records.jsonl");
    std::fs::write(&path, "{\"format\":\"tensortune.record/1\"}\n".repeat(100)).expect("write");
    let before = std::fs::read(&path).expect("read");
    let err = Database::open(&path).expect_err("not sqlite");
    assert!(matches!(err, RecordsError::NotADatabase { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("{}: not a SQLite database", path.display())
    );
    assert_eq!(
        std::fs::read(&path).expect("read"),
        before,
        "the file is untouched"
    );
}

#[test]
fn a_truncated_database_is_an_error_not_a_panic() {
    let dir = temp_dir();
    let path = db_path(&dir, "cut.db");
    let mut db = Database::open(&path).expect("create");
    for i in 0..50 {
        fill_sample(&mut db, "x", i * 10);
    }
    drop(db);
    let bytes = std::fs::read(&path).expect("read");
    assert!(bytes.len() > 8192);
    let cut = db_path(&dir, "cut2.db");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    // Opening may succeed (the header is intact); reading all records must then fail with an
    // error naming the file, or the integrity check must report damage.
    match Database::open(&cut) {
        Err(err) => assert!(err.to_string().contains("cut2.db"), "{err}"),
        Ok(db) => {
            let damaged = db.summary().is_err()
                || db.count().is_err()
                || !db.integrity_check().map(|m| m.is_empty()).unwrap_or(false);
            assert!(damaged);
        }
    }
}

#[test]
fn another_programs_database_is_not_taken_over() {
    let dir = temp_dir();
    let path = db_path(&dir, "other.db");
    let conn = Connection::open(&path).expect("create");
    conn.execute_batch("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT);")
        .expect("table");
    drop(conn);
    let err = Database::open(&path).expect_err("foreign");
    assert!(matches!(err, RecordsError::Foreign { .. }), "{err}");
    let conn = Connection::open(&path).expect("reopen");
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 0, "nothing was migrated");
}

#[test]
fn open_existing_does_not_create() {
    let dir = temp_dir();
    let path = db_path(&dir, "none.db");
    let err = Database::open_existing(&path).expect_err("missing");
    assert!(matches!(err, RecordsError::Missing { .. }), "{err}");
    assert!(!path.exists());
}
