//! [`Database`]: opening, runs, batches and plans, on whichever store the argument names.
//!
//! # Writes
//!
//! Every write is one transaction of the store: [`Database::insert_batch`] stores the whole
//! batch or nothing, on either kind. A write to a server that fails on its connection (or is
//! chosen to abort in a deadlock) is tried again on a new connection, up to
//! [`WRITE_ATTEMPTS`] times, then fails with [`RecordsError::ConnectionLost`]. Trying again
//! cannot store a record twice: records are keyed by their content id, runs by their uid,
//! so a batch whose commit reached the server before the connection broke is found there
//! and skipped on the next attempt.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{RecordsError, Result};
use crate::hash::{compact_json, record_uid, sha256_hex, trace_hash};
use crate::schema::PLANS_SINCE;
use crate::store::sqlite::SqliteStore;
use crate::store::{first_row, Backend, Location, Store, Tx};
use crate::time::Timestamp;
use crate::types::{
    ErrorKind, NewRecord, NewRun, Outcome, RunId, RunInfo, RunPlan, StoredPlan, Timing, Workload,
};

/// How long a writer waits for another writer's transaction before giving up, unless
/// [`BUSY_TIMEOUT_ENV`] says otherwise. Batches are small (one measured batch), so a wait
/// this long means a stuck process, not contention.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment variable that sets the busy timeout in seconds (0 to 86400, fractions
/// allowed): longer for a database many jobs share, shorter for a script that would rather
/// fail fast.
pub const BUSY_TIMEOUT_ENV: &str = "TENSORTUNE_BUSY_TIMEOUT";

/// How many times a write to a server is tried when its connection fails. With the pauses
/// between them (a quarter second, doubling) the last try comes about 8 s after the first:
/// long enough for a server's restart or a network blip, short enough that a run whose
/// server is gone stops soon.
pub const WRITE_ATTEMPTS: u32 = 6;

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

/// An open records database: a SQLite file, or a database on a PostgreSQL server.
///
/// Every constructor takes the database argument as a path: a `postgres://` or
/// `postgresql://` URL (`postgres://user:password@host:port/dbname`, with libpq's
/// parameters such as `?options=-csearch_path%3Dteam` after it) names a server, anything
/// else a file. The two hold the same schema and answer every query the same way; only
/// [`Database::backend`] tells them apart.
#[derive(Debug)]
pub struct Database {
    pub(crate) store: Box<dyn Store>,
    /// Whether the schema has the plan columns (v3); a reader of an older file has not.
    pub(crate) plans: bool,
    /// The argument it was opened with, password and all, so that it can be opened again.
    given: PathBuf,
}

impl Database {
    /// Opens the database at `db`, creating the file (or, on a server, the tables) when it
    /// does not exist, and migrates it to the current schema.
    pub fn open(db: impl AsRef<Path>) -> Result<Database> {
        Self::open_writable(db.as_ref(), true)
    }

    /// Opens an existing database and migrates it; a missing file (or a server database
    /// without the tables) is [`RecordsError::Missing`] rather than a new empty database.
    pub fn open_existing(db: impl AsRef<Path>) -> Result<Database> {
        Self::open_writable(db.as_ref(), false)
    }

    /// Opens an existing database for reading only: no migration, no change to it. Any
    /// schema version up to the current one is readable (see [`crate::schema`]).
    pub fn open_read_only(db: impl AsRef<Path>) -> Result<Database> {
        let store: Box<dyn Store> = match Location::of(db.as_ref()) {
            Location::File(path) => Box::new(SqliteStore::open_read_only(&path)?),
            Location::Server(url) => server(&url, false, true)?,
        };
        Self::with(store, db.as_ref())
    }

    fn open_writable(db: &Path, create: bool) -> Result<Database> {
        let store: Box<dyn Store> = match Location::of(db) {
            Location::File(path) => Box::new(SqliteStore::open(&path, create)?),
            Location::Server(url) => server(&url, create, false)?,
        };
        Self::with(store, db)
    }

    fn with(store: Box<dyn Store>, given: &Path) -> Result<Database> {
        let plans = store.schema_version()? >= PLANS_SINCE;
        Ok(Database {
            store,
            plans,
            given: given.to_path_buf(),
        })
    }

    /// The path or URL the database was opened with, as given: it opens the same database
    /// again. A URL may hold a password; show [`Database::location`] instead.
    pub fn path(&self) -> &Path {
        &self.given
    }

    /// What to show a person: the path, or the URL without its password (what errors name).
    pub fn location(&self) -> &Path {
        self.store.location()
    }

    /// The engine the database is on.
    pub fn backend(&self) -> Backend {
        self.store.backend()
    }

    /// The schema version (the current version after [`Database::open`]).
    pub fn schema_version(&self) -> Result<u32> {
        self.store.schema_version()
    }

    /// The messages of the engine's consistency check (`PRAGMA integrity_check` of a file);
    /// empty when the database is sound.
    pub fn integrity_check(&self) -> Result<Vec<String>> {
        self.store.integrity_check()
    }

    /// Records a new run as started now and returns its id.
    pub fn begin_run(&mut self, run: &NewRun) -> Result<RunId> {
        let started_at = Timestamp::now();
        let info = RunInfo {
            id: RunId(0),
            uid: new_run_uid(started_at, run),
            started_at,
            finished_at: None,
            tool_version: run.tool_version.clone(),
            target: run.target.clone(),
            seed: run.seed,
            options: run.options.clone(),
            records: 0,
            plan: run.plan.clone(),
        };
        self.write(|tx| upsert_run(tx, &info))
    }

    /// Marks a run as finished now.
    pub fn finish_run(&mut self, run: RunId) -> Result<()> {
        let now = Timestamp::now().to_string();
        let changed = self.write(|tx| {
            tx.execute(
                "UPDATE runs SET finished_at = $1 WHERE id = $2",
                &[now.as_str().into(), run.0.into()],
            )
        })?;
        if changed == 0 {
            return Err(RecordsError::UnknownRun {
                path: self.location().to_path_buf(),
                run: run.0,
            });
        }
        Ok(())
    }

    /// Inserts one measured batch in one transaction: all of it is stored, or (on any error)
    /// none of it. Records already present (same content id) are skipped. Returns how many
    /// were new (a batch tried again after its commit reached a server counts as none new).
    pub fn insert_batch(&mut self, run: Option<RunId>, batch: &[NewRecord]) -> Result<usize> {
        for (index, record) in batch.iter().enumerate() {
            check_new_record(record)
                .map_err(|reason| RecordsError::InvalidRecord { index, reason })?;
        }
        let traces: Vec<String> = batch.iter().map(|r| compact_json(&r.trace_json)).collect();
        let path = self.location().to_path_buf();
        self.write(|tx| {
            let run = match run {
                None => None,
                Some(id) => Some((
                    id,
                    run_uid(tx, id)?.ok_or(RecordsError::UnknownRun {
                        path: path.clone(),
                        run: id.0,
                    })?,
                )),
            };
            let mut inserted = 0;
            for (record, trace) in batch.iter().zip(&traces) {
                let stored = StoredRecord {
                    workload: &record.workload,
                    target: &record.target,
                    trace_hash: trace_hash(trace),
                    trace,
                    outcome: &record.outcome,
                    measured_at: record.measured_at,
                    run: run.as_ref().map(|(id, uid)| (*id, uid.as_str())),
                };
                if insert_stored(tx, &stored)? {
                    inserted += 1;
                }
            }
            Ok(inserted)
        })
    }

    /// Keeps the plan file `body` under its id, unless the database has it already.
    pub fn put_plan(&mut self, id: &str, body: &str) -> Result<()> {
        let now = Timestamp::now();
        self.write(|tx| put_plan(tx, id, now, body))
    }

    /// A write, tried again on a new connection while it fails transiently (see the module
    /// doc). `body` runs in the transaction and may run more than once.
    fn write<T>(&mut self, mut body: impl FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        let mut pause = Duration::from_millis(250);
        let mut attempt = 1;
        loop {
            let tried = if attempt == 1 {
                self.write_once(&mut body)
            } else {
                self.store
                    .reconnect()
                    .and_then(|()| self.write_once(&mut body))
            };
            match tried {
                Err(e) if e.is_transient() && attempt < WRITE_ATTEMPTS => {
                    std::thread::sleep(pause);
                    pause *= 2;
                    attempt += 1;
                }
                Err(RecordsError::Postgres {
                    path,
                    connection: true,
                    message,
                    ..
                }) => {
                    return Err(RecordsError::ConnectionLost {
                        path,
                        attempts: attempt,
                        message,
                    })
                }
                r => return r,
            }
        }
    }

    /// One transaction running `body`; an error of `body` rolls it back.
    pub(crate) fn write_once<T>(
        &mut self,
        body: &mut dyn FnMut(&mut dyn Tx) -> Result<T>,
    ) -> Result<T> {
        let mut tx = self.store.begin()?;
        let value = body(tx.as_mut())?;
        tx.commit()?;
        Ok(value)
    }
}

/// Opens a server database, in a build that can.
fn server(url: &str, create: bool, read_only: bool) -> Result<Box<dyn Store>> {
    #[cfg(feature = "postgres")]
    {
        Ok(Box::new(crate::store::postgres::PgStore::open(
            url, create, read_only,
        )?))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (create, read_only);
        Err(RecordsError::NoPostgres {
            path: crate::store::redacted(url).into(),
        })
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

/// The uid of the run with a local id.
fn run_uid(tx: &mut dyn Tx, id: RunId) -> Result<Option<String>> {
    first_row(
        |each| tx.query("SELECT uid FROM runs WHERE id = $1", &[id.0.into()], each),
        |row| row.text(0),
    )
}

/// Writes one record (and its workload, if new) unless a record with the same content id is
/// there. Returns whether it was new.
pub(crate) fn insert_stored(tx: &mut dyn Tx, r: &StoredRecord<'_>) -> Result<bool> {
    let op = crate::validate::op_name(&r.workload.key).unwrap_or("");
    tx.execute(
        "INSERT INTO workloads (key, flops, op) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING",
        &[
            r.workload.key.as_str().into(),
            r.workload.flops.into(),
            op.into(),
        ],
    )?;
    let workload_id = first_row(
        |each| {
            tx.query(
                "SELECT id FROM workloads WHERE key = $1",
                &[r.workload.key.as_str().into()],
                each,
            )
        },
        |row| row.int(0),
    )?;
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
    let measured_at = r.measured_at.to_string();
    let changed = tx.execute(
        "INSERT INTO records (uid, workload_id, target_key, trace, trace_hash, median_s,
             min_s, max_s, repeats, error_kind, error_message, measured_at, run_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (uid) DO NOTHING",
        &[
            uid.as_str().into(),
            workload_id.into(),
            r.target.into(),
            r.trace.into(),
            r.trace_hash.as_str().into(),
            timing.map(|t| t.median_s).into(),
            timing.map(|t| t.min_s).into(),
            timing.map(|t| t.max_s).into(),
            timing.map(|t| i64::from(t.repeats)).into(),
            error.map(|(k, _)| k.as_str()).into(),
            error.map(|(_, m)| m).into(),
            measured_at.as_str().into(),
            r.run.map(|(id, _)| id.0).into(),
        ],
    )?;
    Ok(changed == 1)
}

/// Writes a run, or finds it by uid: a new run, or one that came from another database. A
/// run finished in either copy is finished in the result, so merging is order-independent.
pub(crate) fn upsert_run(tx: &mut dyn Tx, run: &RunInfo) -> Result<RunId> {
    let started_at = run.started_at.to_string();
    let finished_at = run.finished_at.map(|t| t.to_string());
    let plan = run.plan.as_ref();
    tx.execute(
        "INSERT INTO runs (uid, started_at, finished_at, tool_version, target_key, seed, options,
                           plan_id, shard, shards)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (uid) DO UPDATE SET finished_at = coalesce(runs.finished_at,
                                                                excluded.finished_at)",
        &[
            run.uid.as_str().into(),
            started_at.as_str().into(),
            finished_at.as_deref().into(),
            run.tool_version.as_str().into(),
            run.target.as_str().into(),
            run.seed.map(seed_to_sql).into(),
            run.options.as_str().into(),
            plan.map(|p| p.id.as_str()).into(),
            plan.map(|p| i64::from(p.shard)).into(),
            plan.map(|p| i64::from(p.shards)).into(),
        ],
    )?;
    let id = first_row(
        |each| {
            tx.query(
                "SELECT id FROM runs WHERE uid = $1",
                &[run.uid.as_str().into()],
                each,
            )
        },
        |row| row.int(0),
    )?;
    id.map(RunId).ok_or_else(|| RecordsError::Corrupt {
        path: tx.location().to_path_buf(),
        message: format!("run {} vanished while it was written", run.uid),
    })
}

/// Keeps a plan unless one of the same id is there.
pub(crate) fn put_plan(tx: &mut dyn Tx, id: &str, created_at: Timestamp, body: &str) -> Result<()> {
    let created_at = created_at.to_string();
    tx.execute(
        "INSERT INTO plans (id, created_at, body) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
        &[id.into(), created_at.as_str().into(), body.into()],
    )?;
    Ok(())
}

/// A plan read from its row.
pub(crate) fn stored_plan(
    id: String,
    created_at: &str,
    body: String,
    location: &Path,
) -> Result<StoredPlan> {
    Ok(StoredPlan {
        id,
        created_at: crate::query::parse_time(created_at, location)?,
        body,
    })
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

/// Seeds are `u64`; SQL integers are `i64`. The bits are kept, so the round trip is exact.
fn seed_to_sql(seed: u64) -> i64 {
    seed as i64
}

pub(crate) fn seed_from_sql(seed: i64) -> u64 {
    seed as u64
}

/// A plan of a run from its stored columns, when it has one whose shard numbers fit.
pub(crate) fn run_plan(
    id: Option<String>,
    shard: Option<i64>,
    shards: Option<i64>,
) -> Option<RunPlan> {
    Some(RunPlan {
        id: id?,
        shard: u32::try_from(shard?).ok()?,
        shards: u32::try_from(shards?).ok()?,
    })
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
