//! The schema, its versions, and the migrations that run on open: of SQLite files here, of
//! PostgreSQL databases in the server store (the same tables and columns in the server's
//! types, created directly at version 3).
//!
//! In a file the version lives in `PRAGMA user_version`; `PRAGMA application_id` marks the file as a
//! tensortune records database. Opening a database brings it to [`SCHEMA_VERSION`] in one
//! `BEGIN IMMEDIATE` transaction, so a migration either happens whole or not at all, and two
//! processes opening an old file at once migrate it once (the second re-reads the version
//! after it gets the write lock).
//!
//! # Versions
//!
//! * **v1**: `workloads(id, key, flops)`, `runs(...)`, `records(...)` and the partial index
//!   `records_best` for best-k.
//! * **v2**: `workloads.op` (the op name, backfilled from the key) with the index
//!   `workloads_by_op`, and the index `records_by_trace` on (workload, target, trace hash) for
//!   the measured-trace set.
//! * **v3**: `runs.plan_id`, `runs.shard`, `runs.shards` (which plan and which shard of it a
//!   run tuned; null for a run of no plan) with the index `runs_by_plan`; the table
//!   `plans(id, created_at, body)` holding each plan a run of the database tuned (its JSON);
//!   the index `records_by_run`.
//!
//! Readers of other databases ([`crate::Database::open_read_only`], used by merge) read the
//! plan columns only from v3 on and everything else from columns that exist since v1, so
//! they read every version without migrating the file.
//!
//! # Invariants the schema enforces
//!
//! * a record has a timing (`median_s`, `min_s`, `max_s`, `repeats` all non-null) exactly
//!   when it has no `error_kind`;
//! * `error_kind` is one of `compile`, `runtime`, `timeout`, `wrong_result`, `other`;
//! * `records.uid` (the content id) is unique, so the same measurement is stored once;
//! * every record's workload exists, and its run exists when it names one.

use rusqlite::{Connection, TransactionBehavior};

/// The schema version this build writes and the newest it reads.
pub const SCHEMA_VERSION: u32 = 3;

/// `PRAGMA application_id` of a records database: the ASCII bytes `TTrc`.
pub const APPLICATION_ID: i32 = 0x5454_7263;

/// The statements that create schema v1 from an empty file.
pub(crate) const V1: &str = "
CREATE TABLE workloads (
    id    INTEGER PRIMARY KEY,
    key   TEXT NOT NULL UNIQUE,   -- canonical spec, e.g. matmul:K=64,M=64,N=64,dtype=f32
    flops REAL NOT NULL           -- floating-point operations of one execution
);
CREATE TABLE runs (
    id           INTEGER PRIMARY KEY,
    uid          TEXT NOT NULL UNIQUE,  -- global id, the same in every database
    started_at   TEXT NOT NULL,         -- YYYY-MM-DDTHH:MM:SS.mmmZ
    finished_at  TEXT,                  -- null while running or after a kill
    tool_version TEXT NOT NULL,
    target_key   TEXT NOT NULL,
    seed         INTEGER,
    options      TEXT NOT NULL          -- command line or options JSON
);
CREATE TABLE records (
    id            INTEGER PRIMARY KEY,
    uid           TEXT NOT NULL UNIQUE,  -- content id: what import and merge dedupe on
    workload_id   INTEGER NOT NULL REFERENCES workloads(id),
    target_key    TEXT NOT NULL,
    trace         TEXT NOT NULL,         -- JSON of the schedule steps
    trace_hash    TEXT NOT NULL,         -- sha256 hex of trace
    median_s      REAL,                  -- seconds per execution
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
";

/// The statements that take a v1 database to v2.
pub(crate) const V1_TO_V2: &str = "
ALTER TABLE workloads ADD COLUMN op TEXT NOT NULL DEFAULT '';
UPDATE workloads SET op = substr(key, 1, instr(key, ':') - 1) WHERE instr(key, ':') > 0;
CREATE INDEX workloads_by_op ON workloads(op);
CREATE INDEX records_by_trace ON records(workload_id, target_key, trace_hash);
";

/// The statements that take a v2 database to v3.
pub(crate) const V2_TO_V3: &str = "
ALTER TABLE runs ADD COLUMN plan_id TEXT;
ALTER TABLE runs ADD COLUMN shard INTEGER;
ALTER TABLE runs ADD COLUMN shards INTEGER;
CREATE INDEX runs_by_plan ON runs(plan_id);
CREATE INDEX records_by_run ON records(run_id);
CREATE TABLE plans (
    id         TEXT PRIMARY KEY,  -- the plan's content id
    created_at TEXT NOT NULL,
    body       TEXT NOT NULL      -- the plan file's JSON
);
";

/// The first version whose runs say which plan and shard they tuned.
pub(crate) const PLANS_SINCE: u32 = 3;

/// Migration steps: `MIGRATIONS[i]` takes version `i` to version `i + 1`.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [V1, V1_TO_V2, V2_TO_V3];

/// What the header of a file says about it.
pub(crate) enum Kind {
    /// A fresh file: no tables, version 0.
    Empty,
    /// A records database of the given version.
    Records(u32),
    /// Some other SQLite database, with the reason it was not recognized.
    Foreign(String),
}

/// Reads the version markers of an open file. Errors are SQLite's (a non-database file
/// fails here with `SQLITE_NOTADB`).
pub(crate) fn inspect(conn: &Connection) -> rusqlite::Result<Kind> {
    // One statement, so the three markers come from one snapshot: read one by one, they could
    // straddle another process's creation of the schema and look like a foreign file.
    let (version, app_id, tables): (i64, i32, i64) = conn.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version),
                (SELECT application_id FROM pragma_application_id),
                (SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%')",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    // A version outside u32 (negative, say) can only be a hand edit.
    let Ok(version) = u32::try_from(version) else {
        return Ok(Kind::Foreign(format!("schema version {version}")));
    };
    Ok(match (app_id, version, tables) {
        (0, 0, 0) => Kind::Empty,
        (APPLICATION_ID, v, _) if v > 0 => Kind::Records(v),
        (0, 0, _) => Kind::Foreign(format!("it has {tables} table(s) of its own")),
        (APPLICATION_ID, _, _) => Kind::Foreign("no schema version".to_string()),
        (other, _, _) => Kind::Foreign(format!("application id {other:#x}")),
    })
}

/// Brings the database to [`SCHEMA_VERSION`]. The caller has checked that the version is not
/// newer; this re-reads it under the write lock.
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Checked by `inspect` before; a file changed since then fails the conversion here.
    let version: u32 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for step in MIGRATIONS.iter().skip(version as usize) {
        tx.execute_batch(step)?;
    }
    if version < SCHEMA_VERSION {
        // Pragmas take no parameters; both values are constants of this module.
        tx.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
        ))?;
    }
    tx.commit()
}
