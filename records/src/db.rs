//! [`Database`]: opening, runs, batches, and the queries of the tuner and the CLI.
//!
//! # Durability
//!
//! The file is in WAL mode with `synchronous = FULL`: a transaction is on disk when its commit
//! returns, and a process killed at any instant (SIGKILL included) leaves a file that passes
//! `PRAGMA integrity_check` and holds every transaction committed before the kill. Each
//! [`Database::insert_batch`] is one transaction. Every write transaction starts with
//! `BEGIN IMMEDIATE`, so a second writer waits on the busy timeout for the lock instead of
//! failing on a read-to-write upgrade; two processes writing one database both succeed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior};

use crate::error::{RecordsError, Result};
use crate::hash::{compact_json, record_uid, sha256_hex, trace_hash};
use crate::schema::{self, Kind, SCHEMA_VERSION};
use crate::time::Timestamp;
use crate::types::{
    ErrorKind, NewRecord, NewRun, Outcome, Record, RecordId, RunId, RunInfo, Summary, Timing,
    Workload, WorkloadInfo,
};

/// How long a writer waits for another writer's transaction before giving up, unless
/// [`BUSY_TIMEOUT_ENV`] says otherwise. Batches are small (one measured batch), so a wait
/// this long means a stuck process, not contention.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment variable that sets the busy timeout in seconds (0 to 86400, fractions
/// allowed): longer for a database many jobs share, shorter for a script that would rather
/// fail fast.
pub const BUSY_TIMEOUT_ENV: &str = "TENSORTUNE_BUSY_TIMEOUT";

/// The busy timeout in force: [`BUSY_TIMEOUT_ENV`] when set to a valid number of seconds,
/// else [`BUSY_TIMEOUT`] (the binary refuses an invalid value up front, through
/// [`check_busy_timeout_env`]).
pub fn busy_timeout() -> Duration {
    env_busy_timeout().ok().flatten().unwrap_or(BUSY_TIMEOUT)
}

/// An error naming what is wrong with [`BUSY_TIMEOUT_ENV`], if it is set to anything but a
/// number of seconds from 0 to 86400.
pub fn check_busy_timeout_env() -> std::result::Result<(), String> {
    env_busy_timeout().map(|_| ())
}

fn env_busy_timeout() -> std::result::Result<Option<Duration>, String> {
    let Some(text) = std::env::var_os(BUSY_TIMEOUT_ENV) else {
        return Ok(None);
    };
    let text = text.to_string_lossy();
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| (0.0..=86_400.0).contains(s))
        .map(|s| Some(Duration::from_secs_f64(s)))
        .ok_or_else(|| {
            format!(
                "{BUSY_TIMEOUT_ENV} must be a number of seconds from 0 to 86400, not `{}`",
                text.escape_debug()
            )
        })
}

/// An open records database.
#[derive(Debug)]
pub struct Database {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
}

/// The columns of `records` joined with its workload and run uid, in the order
/// [`read_record`] reads them. Every column exists since schema v1.
pub(crate) const RECORD_COLUMNS: &str = "r.id, r.uid, w.key, w.flops, r.target_key, r.trace, \
     r.trace_hash, r.median_s, r.min_s, r.max_s, r.repeats, r.error_kind, r.error_message, \
     r.measured_at, r.run_id";

/// The run columns in the order [`read_run`] reads them.
const RUN_SELECT: &str = "SELECT u.id, u.uid, u.started_at, u.finished_at, u.tool_version, \
     u.target_key, u.seed, u.options, (SELECT count(*) FROM records r WHERE r.run_id = u.id) \
     FROM runs u";

/// A record plus the uid of its run, for export and merge.
pub(crate) struct RecordWithRun {
    pub record: Record,
    pub run: Option<RunInfo>,
}

impl Database {
    /// Opens the database at `path`, creating the file when it does not exist, and migrates
    /// it to the current schema.
    pub fn open(path: impl AsRef<Path>) -> Result<Database> {
        Self::open_with(path.as_ref(), true)
    }

    /// Opens an existing database and migrates it; a missing file is
    /// [`RecordsError::Missing`] rather than a new empty database.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Database> {
        Self::open_with(path.as_ref(), false)
    }

    /// Opens an existing database for reading only: no migration, no change to the file.
    /// Any schema version up to the current one is readable (see [`crate::schema`]).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Database> {
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            return Err(RecordsError::Missing { path });
        }
        let conn = Self::connect_read_only(&path)?;
        let db = Database { conn, path };
        db.conn
            .busy_timeout(busy_timeout())
            .map_err(|e| db.error(e))?;
        match schema::inspect(&db.conn).map_err(|e| db.error(e))? {
            Kind::Records(v) if v <= SCHEMA_VERSION => Ok(db),
            Kind::Records(found) => Err(RecordsError::NewerSchema {
                path: db.path,
                found,
                supported: SCHEMA_VERSION,
            }),
            Kind::Empty => Err(RecordsError::Foreign {
                path: db.path,
                reason: "the file is empty".to_string(),
            }),
            Kind::Foreign(reason) => Err(RecordsError::Foreign {
                path: db.path,
                reason,
            }),
        }
    }

    /// A read-only connection. A WAL database needs its shared-memory file, which a reader
    /// cannot create in a folder it may not write; when no write-ahead log is there either
    /// (no connection has the file open for writing: the last one to close removes it), the
    /// file is complete on its own and is read as immutable instead.
    fn connect_read_only(path: &Path) -> Result<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let first = Connection::open_with_flags(path, flags).and_then(|c| {
            // Opening is lazy: this read is what needs the shared memory.
            c.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
            Ok(c)
        });
        let e = match first {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        let mut wal = path.as_os_str().to_os_string();
        wal.push("-wal");
        if e.sqlite_error_code() != Some(rusqlite::ErrorCode::ReadOnly) || Path::new(&wal).exists()
        {
            return Err(sqlite_error(path, e));
        }
        let uri = format!("file:{}?immutable=1", uri_path(path));
        Connection::open_with_flags(&uri, flags | OpenFlags::SQLITE_OPEN_URI)
            .map_err(|e| sqlite_error(path, e))
    }

    /// Opens (creating and migrating when asked), retrying while another process holds a
    /// lock the busy timeout does not wait for: SQLite answers `SQLITE_BUSY` at once, without
    /// the busy handler, where waiting could deadlock (two processes creating one file, each
    /// switching it to WAL or migrating it). Each attempt is a fresh connection.
    fn open_with(path: &Path, create: bool) -> Result<Database> {
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            match Self::open_once(path, create) {
                Err(e) if e.is_busy() && start.elapsed() < busy_timeout() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                r => return r,
            }
        }
    }

    fn open_once(path: &Path, create: bool) -> Result<Database> {
        let path = path.to_path_buf();
        if !create && !path.exists() {
            return Err(RecordsError::Missing { path });
        }
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(&path, flags).map_err(|e| sqlite_error(&path, e))?;
        let mut db = Database { conn, path };
        db.conn
            .busy_timeout(busy_timeout())
            .map_err(|e| db.error(e))?;
        match schema::inspect(&db.conn).map_err(|e| db.error(e))? {
            Kind::Empty => {}
            Kind::Records(v) if v <= SCHEMA_VERSION => {}
            Kind::Records(found) => {
                return Err(RecordsError::NewerSchema {
                    path: db.path,
                    found,
                    supported: SCHEMA_VERSION,
                })
            }
            Kind::Foreign(reason) => {
                return Err(RecordsError::Foreign {
                    path: db.path,
                    reason,
                })
            }
        }
        let mode: String = db
            .conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| db.error(e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(RecordsError::NoWal {
                path: db.path,
                mode,
            });
        }
        db.conn
            .execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(|e| db.error(e))?;
        let migrated = schema::migrate(&mut db.conn);
        migrated.map_err(|e| match db.error(e) {
            // The upgrade's own statements failed: tables that do not match the version the
            // file claims (a hand-edited `user_version`), which is damage, not a bug here.
            RecordsError::Sqlite { path, source }
                if source.sqlite_error_code() == Some(rusqlite::ErrorCode::Unknown) =>
            {
                RecordsError::Corrupt {
                    path,
                    message: format!("its tables do not match its schema version: {source}"),
                }
            }
            e => e,
        })?;
        Ok(db)
    }

    /// The path the database was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `PRAGMA user_version` of the file (the current version after [`Database::open`]).
    pub fn schema_version(&self) -> Result<u32> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.error(e))
    }

    /// The messages of `PRAGMA integrity_check`; empty when the file is sound.
    pub fn integrity_check(&self) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare("PRAGMA integrity_check")
            .map_err(|e| self.error(e))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.error(e))?;
        Ok(rows.into_iter().filter(|m| m != "ok").collect())
    }

    /// Records a new run as started now and returns its id.
    pub fn begin_run(&mut self, run: &NewRun) -> Result<RunId> {
        let started_at = Timestamp::now();
        let uid = new_run_uid(started_at, run);
        let path = self.path.clone();
        let tx = self.write_tx()?;
        tx.execute(
            "INSERT INTO runs (uid, started_at, tool_version, target_key, seed, options)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                uid,
                started_at.to_string(),
                run.tool_version,
                run.target,
                run.seed.map(seed_to_sql),
                run.options
            ],
        )
        .map_err(|e| sqlite_error(&path, e))?;
        let id = tx.last_insert_rowid();
        tx.commit().map_err(|e| sqlite_error(&path, e))?;
        Ok(RunId(id))
    }

    /// Marks a run as finished now.
    pub fn finish_run(&mut self, run: RunId) -> Result<()> {
        let now = Timestamp::now().to_string();
        let changed = self
            .conn
            .execute(
                "UPDATE runs SET finished_at = ?1 WHERE id = ?2",
                params![now, run.0],
            )
            .map_err(|e| self.error(e))?;
        if changed == 0 {
            return Err(RecordsError::UnknownRun {
                path: self.path.clone(),
                run: run.0,
            });
        }
        Ok(())
    }

    /// Inserts one measured batch in one transaction: all of it is stored, or (on any error)
    /// none of it. Records already present (same content id) are skipped. Returns how many
    /// were new.
    pub fn insert_batch(&mut self, run: Option<RunId>, batch: &[NewRecord]) -> Result<usize> {
        for (index, record) in batch.iter().enumerate() {
            check_new_record(record)
                .map_err(|reason| RecordsError::InvalidRecord { index, reason })?;
        }
        let path = self.path.clone();
        let tx = self.write_tx()?;
        let run_uid: Option<String> = match run {
            None => None,
            Some(id) => Some(
                tx.query_row("SELECT uid FROM runs WHERE id = ?1", [id.0], |r| r.get(0))
                    .optional()
                    .map_err(|e| sqlite_error(&path, e))?
                    .ok_or(RecordsError::UnknownRun {
                        path: path.clone(),
                        run: id.0,
                    })?,
            ),
        };
        let mut inserted = 0;
        for record in batch {
            let trace = compact_json(&record.trace_json);
            let stored = StoredRecord {
                workload: &record.workload,
                target: &record.target,
                trace_hash: trace_hash(&trace),
                trace: &trace,
                outcome: &record.outcome,
                measured_at: record.measured_at,
                run: run.zip(run_uid.as_deref()),
            };
            if insert_stored(&tx, &stored).map_err(|e| sqlite_error(&path, e))? {
                inserted += 1;
            }
        }
        tx.commit().map_err(|e| sqlite_error(&path, e))?;
        Ok(inserted)
    }

    /// The fastest successful record of a workload on a target.
    pub fn best(&self, workload_key: &str, target: &str) -> Result<Option<Record>> {
        Ok(self.best_k(workload_key, target, 1)?.into_iter().next())
    }

    /// The `k` fastest successful records, fastest first (ties by measurement time).
    pub fn best_k(&self, workload_key: &str, target: &str, k: usize) -> Result<Vec<Record>> {
        let limit = i64::try_from(k).unwrap_or(i64::MAX);
        self.query_records(
            &format!(
                "SELECT {RECORD_COLUMNS} FROM records r JOIN workloads w ON w.id = r.workload_id
                 WHERE w.key = ?1 AND r.target_key = ?2 AND {}
                 ORDER BY r.median_s, r.measured_at, r.uid LIMIT ?3",
                plausible_sql()
            ),
            params![workload_key, target, limit],
        )
        // A row the SQL filter lets through but `read_record` still finds out of range.
        .map(|rs| {
            rs.into_iter()
                .filter(|r| r.outcome.timing().is_some())
                .collect()
        })
    }

    /// Every record of a workload on a target, failures included, in measurement order.
    pub fn records(&self, workload_key: &str, target: &str) -> Result<Vec<Record>> {
        self.query_records(
            &format!(
                "SELECT {RECORD_COLUMNS} FROM records r JOIN workloads w ON w.id = r.workload_id
                 WHERE w.key = ?1 AND r.target_key = ?2
                 ORDER BY r.measured_at, r.uid"
            ),
            params![workload_key, target],
        )
    }

    /// The hashes of every trace measured for a workload on a target, failures included:
    /// what a resumed run must not measure again.
    pub fn measured_hashes(&self, workload_key: &str, target: &str) -> Result<HashSet<String>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT DISTINCT r.trace_hash FROM records r
                 JOIN workloads w ON w.id = r.workload_id
                 WHERE w.key = ?1 AND r.target_key = ?2",
            )
            .map_err(|e| self.error(e))?;
        let hashes = stmt
            .query_map(params![workload_key, target], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<HashSet<_>>>())
            .map_err(|e| self.error(e));
        hashes
    }

    /// Every run, oldest first, with its record count.
    pub fn runs(&self) -> Result<Vec<RunInfo>> {
        let mut stmt = self
            .conn
            .prepare(&format!("{RUN_SELECT} ORDER BY u.started_at, u.uid"))
            .map_err(|e| self.error(e))?;
        let runs = stmt
            .query_map([], read_run)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.error(e));
        runs
    }

    /// The run with a local id, if this database has it.
    pub fn run(&self, id: RunId) -> Result<Option<RunInfo>> {
        self.conn
            .query_row(&format!("{RUN_SELECT} WHERE u.id = ?1"), [id.0], read_run)
            .optional()
            .map_err(|e| self.error(e))
    }

    /// Every workload, by key, with its record count.
    pub fn workloads(&self) -> Result<Vec<WorkloadInfo>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT w.key, w.flops,
                        (SELECT count(*) FROM records r WHERE r.workload_id = w.id)
                 FROM workloads w ORDER BY w.key",
            )
            .map_err(|e| self.error(e))?;
        let workloads = stmt
            .query_map([], |r| {
                let key: String = r.get(0)?;
                Ok(WorkloadInfo {
                    op: crate::validate::op_name(&key).unwrap_or("").to_string(),
                    workload: Workload::new(key, r.get(1)?),
                    records: r.get::<_, i64>(2)?.max(0) as u64,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.error(e));
        workloads
    }

    /// The distinct target keys that have records, sorted.
    pub fn targets(&self) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare("SELECT DISTINCT target_key FROM records ORDER BY target_key")
            .map_err(|e| self.error(e))?;
        let targets = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.error(e));
        targets
    }

    /// The target keys that have records of one workload, sorted.
    pub fn targets_of(&self, workload_key: &str) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT DISTINCT r.target_key FROM records r
                 JOIN workloads w ON w.id = r.workload_id
                 WHERE w.key = ?1 ORDER BY r.target_key",
            )
            .map_err(|e| self.error(e))?;
        let targets = stmt
            .query_map([workload_key], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.error(e));
        targets
    }

    /// Trials, errors and best latency per (workload, target), by workload key then target.
    pub fn summary(&self) -> Result<Vec<Summary>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT w.key, w.flops, r.target_key, count(*),
                            sum(CASE WHEN {ok} THEN 0 ELSE 1 END),
                            min(CASE WHEN {ok} THEN r.median_s END)
                     FROM records r JOIN workloads w ON w.id = r.workload_id
                     GROUP BY w.id, r.target_key ORDER BY w.key, r.target_key",
                ok = plausible_sql()
            ))
            .map_err(|e| self.error(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(Summary {
                    workload: Workload::new(r.get::<_, String>(0)?, r.get(1)?),
                    target: r.get(2)?,
                    trials: r.get::<_, i64>(3)?.max(0) as u64,
                    errors: r.get::<_, i64>(4)?.max(0) as u64,
                    best_s: r.get(5)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.error(e));
        rows
    }

    /// Number of records in the database.
    pub fn count(&self) -> Result<u64> {
        self.conn
            .query_row("SELECT count(*) FROM records", [], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.error(e))
    }

    fn query_records(&self, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Record>> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| self.error(e))?;
        let records = stmt
            .query_map(params, read_record)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.error(e));
        records
    }

    /// Every record with its run, in export order: by workload key, target, measurement time
    /// and content id, which depends on content only, so two databases with the same records
    /// export the same text.
    pub(crate) fn for_each_record_with_run(
        &self,
        mut f: impl FnMut(RecordWithRun) -> Result<()>,
    ) -> Result<()> {
        let sql = format!(
            "SELECT {RECORD_COLUMNS}, u.id, u.uid, u.started_at, u.finished_at, u.tool_version,
                    u.target_key, u.seed, u.options, 0
             FROM records r JOIN workloads w ON w.id = r.workload_id
             LEFT JOIN runs u ON u.id = r.run_id
             ORDER BY w.key, r.target_key, r.measured_at, r.uid"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.error(e))?;
        let mut rows = stmt.query([]).map_err(|e| self.error(e))?;
        while let Some(row) = rows.next().map_err(|e| sqlite_error(&self.path, e))? {
            let record = read_record(row).map_err(|e| sqlite_error(&self.path, e))?;
            let run = match row
                .get::<_, Option<i64>>(15)
                .map_err(|e| sqlite_error(&self.path, e))?
            {
                None => None,
                Some(_) => Some(read_run_at(row, 15).map_err(|e| sqlite_error(&self.path, e))?),
            };
            f(RecordWithRun { record, run })?;
        }
        Ok(())
    }

    /// Starts a write transaction that holds the write lock from its first statement.
    pub(crate) fn write_tx(&mut self) -> Result<rusqlite::Transaction<'_>> {
        let path = &self.path;
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sqlite_error(path, e))
    }

    pub(crate) fn error(&self, e: rusqlite::Error) -> RecordsError {
        sqlite_error(&self.path, e)
    }
}

/// `path` for a `file:` URI: bytes outside the unreserved set percent-encoded.
fn uri_path(path: &Path) -> String {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    #[cfg(unix)]
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(abs.as_os_str()).to_vec();
    #[cfg(not(unix))]
    let bytes = abs.to_string_lossy().replace('\\', "/").into_bytes();
    let mut out = String::new();
    for &b in &bytes {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Classifies a SQLite error: a file that is not a database or is damaged gets its own
/// variant, everything else is [`RecordsError::Sqlite`].
pub(crate) fn sqlite_error(path: &Path, e: rusqlite::Error) -> RecordsError {
    let path = path.to_path_buf();
    // A stored value of the wrong type or range (text where a number belongs, a negative
    // version): the file's damage, reported as such rather than as an internal error.
    if matches!(
        e,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
    ) {
        return RecordsError::Corrupt {
            path,
            message: format!("a stored value is out of place: {e}"),
        };
    }
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => RecordsError::NotADatabase { path },
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            RecordsError::Locked {
                path,
                waited_s: busy_timeout().as_secs_f64(),
            }
        }
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => RecordsError::Corrupt {
            path,
            message: e.to_string(),
        },
        _ => RecordsError::Sqlite { path, source: e },
    }
}

/// A record ready to be written: checked, trace compacted and hashed.
pub(crate) struct StoredRecord<'a> {
    pub workload: &'a Workload,
    pub target: &'a str,
    pub trace: &'a str,
    pub trace_hash: String,
    pub outcome: &'a Outcome,
    pub measured_at: Timestamp,
    /// The run's local id and global uid.
    pub run: Option<(RunId, &'a str)>,
}

/// Writes one record (and its workload, if new) unless a record with the same content id is
/// there. Returns whether it was new.
pub(crate) fn insert_stored(conn: &Connection, r: &StoredRecord<'_>) -> rusqlite::Result<bool> {
    let op = crate::validate::op_name(&r.workload.key).unwrap_or("");
    conn.prepare_cached(
        "INSERT INTO workloads (key, flops, op) VALUES (?1, ?2, ?3) ON CONFLICT (key) DO NOTHING",
    )?
    .execute(params![r.workload.key, r.workload.flops, op])?;
    let workload_id: i64 = conn
        .prepare_cached("SELECT id FROM workloads WHERE key = ?1")?
        .query_row([&r.workload.key], |row| row.get(0))?;
    let uid = record_uid(
        r.workload,
        r.target,
        &r.trace_hash,
        r.outcome,
        r.measured_at,
        r.run.map(|(_, uid)| uid),
    );
    let (timing, error): (Option<&Timing>, Option<(ErrorKind, &str)>) = match r.outcome {
        Outcome::Measured(t) => (Some(t), None),
        Outcome::Failed { kind, message } => (None, Some((*kind, message.as_str()))),
    };
    let changed = conn
        .prepare_cached(
            "INSERT INTO records (uid, workload_id, target_key, trace, trace_hash, median_s,
                 min_s, max_s, repeats, error_kind, error_message, measured_at, run_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
             ON CONFLICT (uid) DO NOTHING",
        )?
        .execute(params![
            uid,
            workload_id,
            r.target,
            r.trace,
            r.trace_hash,
            timing.map(|t| t.median_s),
            timing.map(|t| t.min_s),
            timing.map(|t| t.max_s),
            timing.map(|t| t.repeats),
            error.map(|(k, _)| k.as_str()),
            error.map(|(_, m)| m),
            r.measured_at.to_string(),
            r.run.map(|(id, _)| id.0),
        ])?;
    Ok(changed == 1)
}

/// Writes a run that came from another database, or finds it by uid. A run finished in
/// either copy is finished in the result, so merging is order-independent.
pub(crate) fn upsert_run(conn: &Connection, run: &RunInfo) -> rusqlite::Result<RunId> {
    conn.prepare_cached(
        "INSERT INTO runs (uid, started_at, finished_at, tool_version, target_key, seed, options)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (uid) DO UPDATE SET finished_at = coalesce(runs.finished_at,
                                                                excluded.finished_at)",
    )?
    .execute(params![
        run.uid,
        run.started_at.to_string(),
        run.finished_at.map(|t| t.to_string()),
        run.tool_version,
        run.target,
        run.seed.map(seed_to_sql),
        run.options
    ])?;
    let id: i64 = conn
        .prepare_cached("SELECT id FROM runs WHERE uid = ?1")?
        .query_row([&run.uid], |r| r.get(0))?;
    Ok(RunId(id))
}

pub(crate) fn check_new_record(r: &NewRecord) -> Result<(), crate::error::InvalidReason> {
    use crate::error::InvalidReason;
    r.workload.check()?;
    if r.target.trim().is_empty() {
        return Err(InvalidReason::EmptyTarget);
    }
    serde_json::from_str::<serde::de::IgnoredAny>(&r.trace_json)
        .map_err(|e| InvalidReason::TraceNotJson(e.to_string()))?;
    if let Outcome::Measured(t) = &r.outcome {
        t.check_plausible(r.workload.flops, crate::types::MAX_FLOPS_PER_S)?;
    }
    Ok(())
}

/// Seeds are `u64`; SQLite integers are `i64`. The bits are kept, so the round trip is exact.
fn seed_to_sql(seed: u64) -> i64 {
    seed as i64
}

fn seed_from_sql(seed: i64) -> u64 {
    seed as u64
}

/// A unique id for a new run: the start time, the process, a per-process counter and the
/// run's own fields, hashed. Two runs started in the same millisecond by the same process
/// still differ by the counter.
fn new_run_uid(started_at: Timestamp, run: &NewRun) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let text = serde_json::json!([
        "run/1",
        started_at.unix_ms(),
        nanos.to_string(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        run.tool_version,
        run.target,
        run.seed,
        run.options
    ]);
    // 128 bits are plenty for an id and keep the column readable.
    sha256_hex(&text.to_string())[..32].to_string()
}

fn parse_time(text: &str, column: usize) -> rusqlite::Result<Timestamp> {
    text.parse().map_err(|e: crate::time::TimestampError| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.into())
    })
}

/// The SQL condition (on `records r JOIN workloads w`) of a successful record whose timing passes
/// [`Timing::check_plausible`] with the target-blind limit: what the best-record queries rank.
/// Comparisons with NULL are not true, so a row with a missing time fails it too.
fn plausible_sql() -> String {
    use crate::types::{MAX_FLOPS_PER_S, MIN_LATENCY_S};
    format!(
        "(r.error_kind IS NULL AND r.median_s >= {MIN_LATENCY_S:e} AND r.min_s <= r.median_s \
         AND r.median_s <= r.max_s AND r.repeats >= 1 AND w.flops <= r.median_s * \
         {MAX_FLOPS_PER_S:e})"
    )
}

/// How the failure that [`stored_timing`] makes of an impossible row begins, so that merge
/// can tell it from a measured failure and leave it out.
pub(crate) const OUT_OF_RANGE: &str = "stored timing out of range";

/// The outcome of a row with no error kind: its timing, or, when the stored values could not
/// have been measured (negative, NULL, out of order, impossibly fast; rows written by hand
/// or by another program), a failure of kind `other` saying so, so that every reader treats
/// the row as a bad record rather than ranking or trusting it.
fn stored_timing(row: &Row<'_>, flops: f64) -> rusqlite::Result<Outcome> {
    let median_s: Option<f64> = row.get(7)?;
    let min_s: Option<f64> = row.get(8)?;
    let max_s: Option<f64> = row.get(9)?;
    let repeats: Option<i64> = row.get(10)?;
    let bad = |why: String| Outcome::Failed {
        kind: crate::types::ErrorKind::Other,
        message: format!("{OUT_OF_RANGE}: {why}"),
    };
    let (Some(median_s), Some(min_s), Some(max_s), Some(repeats)) =
        (median_s, min_s, max_s, repeats)
    else {
        return Ok(bad("a time or the repeat count is missing".into()));
    };
    let Ok(repeats) = u32::try_from(repeats) else {
        return Ok(bad(format!("repeats {repeats}")));
    };
    let t = Timing {
        median_s,
        min_s,
        max_s,
        repeats,
    };
    Ok(
        match t.check_plausible(flops, crate::types::MAX_FLOPS_PER_S) {
            Ok(()) => Outcome::Measured(t),
            Err(e) => bad(e.to_string()),
        },
    )
}

/// Reads the [`RECORD_COLUMNS`] of a row.
pub(crate) fn read_record(row: &Row<'_>) -> rusqlite::Result<Record> {
    let error_kind: Option<String> = row.get(11)?;
    let flops: f64 = row.get(3)?;
    let outcome = match error_kind {
        None => stored_timing(row, flops)?,
        Some(kind) => Outcome::Failed {
            kind: kind.parse().map_err(|e: crate::types::UnknownErrorKind| {
                rusqlite::Error::FromSqlConversionFailure(11, rusqlite::types::Type::Text, e.into())
            })?,
            message: row.get::<_, Option<String>>(12)?.unwrap_or_default(),
        },
    };
    Ok(Record {
        id: RecordId(row.get(0)?),
        uid: row.get(1)?,
        workload: Workload::new(row.get::<_, String>(2)?, flops),
        target: row.get(4)?,
        trace_json: row.get(5)?,
        trace_hash: row.get(6)?,
        outcome,
        measured_at: parse_time(&row.get::<_, String>(13)?, 13)?,
        run: row.get::<_, Option<i64>>(14)?.map(RunId),
    })
}

fn read_run(row: &Row<'_>) -> rusqlite::Result<RunInfo> {
    read_run_at(row, 0)
}

/// Reads run columns `id, uid, started_at, finished_at, tool_version, target_key, seed,
/// options, record count` starting at column `at`.
fn read_run_at(row: &Row<'_>, at: usize) -> rusqlite::Result<RunInfo> {
    Ok(RunInfo {
        id: RunId(row.get(at)?),
        uid: row.get(at + 1)?,
        started_at: parse_time(&row.get::<_, String>(at + 2)?, at + 2)?,
        finished_at: match row.get::<_, Option<String>>(at + 3)? {
            None => None,
            Some(t) => Some(parse_time(&t, at + 3)?),
        },
        tool_version: row.get(at + 4)?,
        target: row.get(at + 5)?,
        seed: row.get::<_, Option<i64>>(at + 6)?.map(seed_from_sql),
        options: row.get(at + 7)?,
        records: row.get::<_, i64>(at + 8)?.max(0) as u64,
    })
}
