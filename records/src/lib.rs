//! tensortune-records: the database of measured schedules.
//!
//! This crate owns the database that tuning runs write and later builds read — a SQLite file,
//! or a database on a PostgreSQL server that many machines share — the schema and its
//! migrations ([`schema`]), inserting measured batches, best-k queries, the set of
//! traces already measured (for dedupe and resume), JSON-lines export and import ([`jsonl`])
//! and merging of databases ([`merge`]). It knows workloads and traces only as text: a
//! workload by its canonical spec (the workload key, e.g.
//! `matmul:K=1024,M=1024,N=1024,dtype=f32`), a target by its key (e.g. `cuda -arch=sm_90`),
//! a trace as the JSON the schedule crate wrote. Checking specs and traces against the op
//! library is the job of a [`RecordValidator`] that the caller supplies.
//!
//! # The data
//!
//! Three tables, readable with plain SQL (no blobs): `workloads` (key, op, flops), `runs`
//! (uid, start and finish times, tool version, target, seed, options) and `records`
//! (workload, target, trace JSON and its SHA-256, median/min/max seconds and repeats, or an
//! error kind and message, measurement time, run). A record has a timing exactly when it has
//! no error. Times are UTC text `YYYY-MM-DDTHH:MM:SS.mmmZ`.
//!
//! # Two kinds of database
//!
//! [`Database::open`] takes a path or a URL: `tuning.db` is a SQLite file (nothing to start;
//! the default), `postgres://user@host/dbname` a PostgreSQL server (with the `postgres`
//! feature, on by default). Behind [`Database`] one storage interface has an
//! implementation for each; the schema, its versions, the content ids and every query are
//! the same on both, so records export to the same lines from either and merge between them.
//!
//! # Safety of the data
//!
//! One transaction per batch: a process killed at any instant loses at most the batch it
//! was writing, never part of one, and several processes may write one database at once. A
//! file is in WAL mode with `synchronous = FULL`; a server retries a batch whose connection
//! failed, and content ids keep the retry from storing anything twice (see [`Database`]).
//!
//! ```
//! use tensortune_records::{Database, NewRecord, NewRun, Timing, Workload};
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("tune.db");
//! let mut db = Database::open(&path)?;
//! let run = db.begin_run(&NewRun {
//!     tool_version: "tensortune 0.1.0".into(),
//!     target: "llvm -mcpu=znver4".into(),
//!     seed: Some(42),
//!     options: "--trials 64".into(),
//!     plan: None,
//! })?;
//! let matmul = Workload::new("matmul:K=64,M=64,N=64,dtype=f32", 2.0 * 64.0 * 64.0 * 64.0);
//! let timing = Timing { median_s: 2e-5, min_s: 1.9e-5, max_s: 2.4e-5, repeats: 10 };
//! let batch = [NewRecord::measured(matmul.clone(), "llvm -mcpu=znver4", "[]", timing)];
//! db.insert_batch(Some(run), &batch)?;
//! db.finish_run(run)?;
//! let best = db.best(&matmul.key, "llvm -mcpu=znver4")?.expect("one record");
//! assert_eq!(best.outcome.timing().map(|t| t.median_s), Some(2e-5));
//! # Ok::<(), tensortune_records::RecordsError>(())
//! ```

#![warn(missing_docs)]

pub mod atomic;
mod db;
mod error;
mod hash;
pub mod jsonl;
pub mod merge;
mod query;
pub mod schema;
mod store;
mod time;
mod types;
mod validate;

pub use atomic::{write_atomic, write_bytes_atomic, write_files_atomic};
pub use db::{
    busy_timeout, check_busy_timeout_env, Database, BUSY_TIMEOUT, BUSY_TIMEOUT_ENV, WRITE_ATTEMPTS,
};
pub use error::{InvalidReason, LineError, LineErrorKind, RecordsError, Result};
pub use hash::{compact_json, sha256_hex, sha256_hex_bytes, trace_hash};
pub use jsonl::{to_json_line, ImportMode, ImportReport, FORMAT};
pub use merge::{MergeReport, RejectedRecord};
pub use schema::SCHEMA_VERSION;
pub use store::{is_server, redacted, Backend};
pub use time::{Timestamp, TimestampError};
pub use types::{
    ErrorKind, NewRecord, NewRun, Outcome, PlanProgress, Record, RecordId, RunId, RunInfo, RunPlan,
    StoredPlan, Summary, Timing, UnknownErrorKind, Workload, WorkloadInfo, MAX_FLOPS_PER_S,
    MAX_LATENCY_S, MIN_LATENCY_S,
};
pub use validate::{op_name, JsonSyntaxValidator, RecordValidator, ValidWorkload, ValidationError};
