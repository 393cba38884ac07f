//! Errors of the records database.
//!
//! Every error that concerns a file names that file; every error that concerns a line of a
//! JSON-lines file names the file and the 1-based line. [`RecordsError::is_user_error`] tells
//! a front end whether the person at the keyboard can fix it (a wrong path, a bad file) or
//! whether something inside failed (SQLite, the disk).

use std::fmt;
use std::path::PathBuf;

use crate::validate::ValidationError;

/// Result alias used throughout the crate.
pub type Result<T, E = RecordsError> = std::result::Result<T, E>;

/// What went wrong while opening, reading or writing a records database. `path` is the
/// database's file, or its server's URL without the password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordsError {
    /// The database file does not exist and the caller asked not to create it.
    #[error("{}: no such records database", path.display())]
    Missing {
        /// The path that was asked for.
        path: PathBuf,
    },
    /// The file exists but is not a SQLite database at all.
    #[error("{}: not a SQLite database", path.display())]
    NotADatabase {
        /// The offending file.
        path: PathBuf,
    },
    /// The file is SQLite but damaged (for example truncated).
    #[error("{}: the database is corrupt: {message}", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// SQLite's description of the damage.
        message: String,
    },
    /// An SQLite file with no tables at all: a database another process has just created
    /// and not yet set up, or one whose creation failed before its tables were written.
    /// Opening it for writing sets it up; reading it finds no records.
    #[error(
        "{}: an empty SQLite file, not yet a tensortune records database (no records)",
        path.display()
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file is a SQLite database that some other program owns.
    #[error(
        "{}: a SQLite database, but not a tensortune records database ({reason})",
        path.display()
    )]
    Foreign {
        /// The offending file.
        path: PathBuf,
        /// Why it was not recognized.
        reason: String,
    },
    /// The database was written by a newer tensortune whose schema this build does not know.
    #[error(
        "{}: records schema version {found} is newer than the newest this tensortune \
         understands ({supported}); use a newer tensortune",
        path.display()
    )]
    NewerSchema {
        /// The offending file.
        path: PathBuf,
        /// `PRAGMA user_version` of the file.
        found: u32,
        /// The newest version this build can read and write.
        supported: u32,
    },
    /// The file system does not support WAL mode (needed for crash safety and concurrent
    /// writers), e.g. some network file systems.
    #[error(
        "{}: cannot use WAL mode here (journal mode stays {mode}); keep the database on a \
         local file system",
        path.display()
    )]
    NoWal {
        /// The database file.
        path: PathBuf,
        /// The journal mode SQLite kept.
        mode: String,
    },
    /// Another process held a lock on the database for longer than the busy timeout.
    #[error(
        "{}: locked by another process for longer than {waited_s} s (set {} to wait longer)",
        path.display(),
        crate::BUSY_TIMEOUT_ENV
    )]
    Locked {
        /// The database file.
        path: PathBuf,
        /// How long this process waited, in seconds.
        waited_s: f64,
    },
    /// SQLite refused an operation for a reason other than the ones above.
    #[error("{}: {source}", path.display())]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: rusqlite::Error,
    },
    /// The PostgreSQL server refused an operation, or could not be reached.
    #[error("{}: {message}", path.display())]
    Postgres {
        /// The server's URL, without its password.
        path: PathBuf,
        /// The SQLSTATE of the server's error, when the server answered.
        code: Option<String>,
        /// True when the connection itself failed (refused, reset, closed, the server
        /// shutting down) rather than a statement.
        connection: bool,
        /// The server's or the client's description.
        message: String,
    },
    /// A write lost its connection to the server on every attempt. Each attempt was one
    /// transaction, so the write is stored whole or not at all.
    #[error(
        "{}: lost the connection to the server on {attempts} attempt(s) of one write, \
         which is stored whole or not at all: {message}",
        path.display()
    )]
    ConnectionLost {
        /// The server's URL, without its password.
        path: PathBuf,
        /// How many times the write was tried.
        attempts: u32,
        /// The last failure.
        message: String,
    },
    /// A `postgres://` URL that does not parse.
    #[error("{}: not a valid PostgreSQL URL: {message}", path.display())]
    BadUrl {
        /// The URL, without its password.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A `postgres://` URL, in a build without the `postgres` feature.
    #[error(
        "{}: this build of tensortune has no PostgreSQL support (the `postgres` feature)",
        path.display()
    )]
    NoPostgres {
        /// The URL, without its password.
        path: PathBuf,
    },
    /// Reading or writing a file other than the database failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A record handed to [`crate::Database::insert_batch`] is malformed; nothing of the batch
    /// was written.
    #[error("record {index} of the batch is invalid: {reason}")]
    InvalidRecord {
        /// 0-based position in the batch.
        index: usize,
        /// What is wrong with it.
        reason: InvalidReason,
    },
    /// A run id that this database does not hold.
    #[error("{}: no run with id {run}", path.display())]
    UnknownRun {
        /// The database file.
        path: PathBuf,
        /// The id that was asked for.
        run: i64,
    },
    /// A strict import found bad lines and imported nothing.
    #[error("{}", StrictRejection(errors))]
    ImportRejected {
        /// Every bad line, in file order.
        errors: Vec<LineError>,
    },
    /// `merge` was asked to merge a database into itself.
    #[error("{}: cannot merge a database into itself", path.display())]
    MergeIntoSelf {
        /// The database named twice.
        path: PathBuf,
    },
}

/// An error that only a database whose tables were changed by something else gives: one of
/// ours at the current version always has these tables, columns and constraints. SQLite
/// reports them all as its generic error, so they are told apart by message.
fn damaged_schema(e: &rusqlite::Error) -> bool {
    let text = e.to_string();
    [
        "no such table",
        "no such column",
        "has no column named",
        "does not match any PRIMARY KEY or UNIQUE constraint",
    ]
    .iter()
    .any(|m| text.contains(m))
}

impl RecordsError {
    /// True when the cause lies in what the user gave (a path, a file, a flag) rather than in
    /// the program or the machine; front ends exit with a usage status for these.
    pub fn is_user_error(&self) -> bool {
        match self {
            RecordsError::Missing { .. }
            | RecordsError::NotADatabase { .. }
            | RecordsError::Corrupt { .. }
            | RecordsError::Foreign { .. }
            | RecordsError::Empty { .. }
            | RecordsError::NewerSchema { .. }
            | RecordsError::ImportRejected { .. }
            | RecordsError::MergeIntoSelf { .. }
            | RecordsError::NoWal { .. }
            | RecordsError::BadUrl { .. }
            | RecordsError::NoPostgres { .. }
            // A server that is down or unreachable is the user's to start or reach.
            | RecordsError::ConnectionLost { .. }
            // Another process's to release (or a longer timeout to ask for), not a bug here.
            | RecordsError::Locked { .. } => true,
            // A full disk is the user's to free, like every other place it shows up: the
            // same exit status whichever subcommand meets it.
            RecordsError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::StorageFull
                    | std::io::ErrorKind::ReadOnlyFilesystem
                    | std::io::ErrorKind::IsADirectory
                    | std::io::ErrorKind::NotADirectory
                    // A device, FIFO or socket where a database file was named.
                    | std::io::ErrorKind::InvalidInput
                    | std::io::ErrorKind::InvalidFilename
                    | std::io::ErrorKind::FileTooLarge
            ),
            // A path in a missing folder, a file or folder without write permission, a full
            // disk, or a "database" that is a device (`/dev/null` fails with an I/O error).
            RecordsError::Sqlite { source, .. } => {
                matches!(
                    source.sqlite_error_code(),
                    Some(
                        rusqlite::ErrorCode::CannotOpen
                            | rusqlite::ErrorCode::ReadOnly
                            | rusqlite::ErrorCode::PermissionDenied
                            | rusqlite::ErrorCode::DiskFull
                            | rusqlite::ErrorCode::SystemIoFailure
                    )
                ) || damaged_schema(source)
            }
            // Unreachable, wrong credentials, no such database or schema, no permission.
            RecordsError::Postgres {
                code, connection, ..
            } => {
                *connection
                    || code.as_deref().is_some_and(|c| {
                        c.starts_with("28") || ["3D000", "3F000", "42501", "25006"].contains(&c)
                    })
            }
            RecordsError::InvalidRecord { .. } | RecordsError::UnknownRun { .. } => false,
        }
    }
}

impl RecordsError {
    /// True for SQLite's "database is busy" or "locked": another connection holds a lock.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self, RecordsError::Locked { .. })
    }

    /// True when trying the same write again on a new connection may succeed: the
    /// connection to a server failed, or the server chose this transaction to abort in a
    /// deadlock or a serialization conflict with another writer.
    pub fn is_transient(&self) -> bool {
        match self {
            RecordsError::Postgres {
                code, connection, ..
            } => *connection || matches!(code.as_deref(), Some("40001" | "40P01")),
            _ => false,
        }
    }
}

/// Renders the list of a strict import's bad lines, one per line.
struct StrictRejection<'a>(&'a [LineError]);

impl fmt::Display for StrictRejection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "strict import rejected {} bad line(s), imported nothing",
            self.0.len()
        )?;
        for error in self.0 {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}

/// Why a record is not acceptable, whether it came from a caller or from a file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidReason {
    /// The workload key is empty or has no `NAME:` prefix.
    #[error("workload key {0:?} is not of the form NAME:KEY=VALUE,...")]
    BadWorkloadKey(String),
    /// The target key is empty.
    #[error("the target key is empty")]
    EmptyTarget,
    /// The trace text is not JSON.
    #[error("the trace is not valid JSON: {0}")]
    TraceNotJson(String),
    /// A timing is negative, not finite, or out of order (`min <= median <= max`).
    #[error("bad timing: {0}")]
    BadTiming(String),
    /// FLOPs are negative or not finite.
    #[error("bad flops {0}")]
    BadFlops(f64),
    /// The timing claims more FLOP/s than the target could reach.
    #[error(
        "impossibly fast: {median_s:e} s is {flops_per_s:.3e} FLOP/s, above the limit of \
         {limit:.1e} for this target"
    )]
    ImpossiblyFast {
        /// The claimed median, seconds.
        median_s: f64,
        /// What it implies.
        flops_per_s: f64,
        /// The most the target's validator allows.
        limit: f64,
    },
}

/// One rejected line of a JSON-lines file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}:{line}: {kind}", path.display())]
pub struct LineError {
    /// The file (or the name given for a stream).
    pub path: PathBuf,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with the line.
    pub kind: LineErrorKind,
}

/// What is wrong with one line of a JSON-lines file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LineErrorKind {
    /// The line is not UTF-8.
    #[error("the line is not UTF-8 text")]
    NotUtf8,
    /// The line is not a JSON object of the record format (includes truncated lines).
    #[error("malformed record line: {0}")]
    Malformed(String),
    /// The line names a format this build does not read.
    #[error("unsupported record format {found:?} (this build reads {expected:?})")]
    UnsupportedFormat {
        /// The `format` field of the line.
        found: String,
        /// The format this build reads.
        expected: &'static str,
    },
    /// Neither or both of `result` and `error` are present.
    #[error("a record has exactly one of \"result\" and \"error\"")]
    OutcomeAmbiguous,
    /// `trace_hash` does not match the trace (a hand edit or a damaged file).
    #[error(
        "trace_hash {found:?} does not match the trace (expected {expected}); \
         to keep an edited trace, remove its trace_hash"
    )]
    HashMismatch {
        /// The hash written in the line.
        found: String,
        /// The hash of the trace in the line.
        expected: String,
    },
    /// A timestamp is not `YYYY-MM-DDTHH:MM:SS[.mmm]Z`.
    #[error("bad timestamp {0:?} (expected YYYY-MM-DDTHH:MM:SS.mmmZ)")]
    BadTimestamp(String),
    /// The record's fields are out of range.
    #[error(transparent)]
    Invalid(#[from] InvalidReason),
    /// The validator rejected the workload or the trace.
    #[error(transparent)]
    Validation(#[from] ValidationError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table or column dropped, or a constraint removed, by something other than this
    /// crate: the user's file to repair, not an internal error.
    #[test]
    fn a_damaged_schema_is_the_users_error() {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        conn.execute_batch("create table t (a integer)")
            .expect("create");
        let err = |sql: &str| RecordsError::Sqlite {
            path: PathBuf::from("x.db"),
            source: conn.execute_batch(sql).expect_err(sql),
        };
        for sql in [
            "select * from records",
            "select b from t",
            "insert into t (b) values (1)",
            "insert into t (a) values (1) on conflict (a) do nothing",
        ] {
            assert!(err(sql).is_user_error(), "{sql}: {}", err(sql));
        }
        // A statement of ours with a syntax error is ours.
        assert!(!err("selec 1").is_user_error());
    }
}
