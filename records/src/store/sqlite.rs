//! The SQLite store: a records database in one file.
//!
//! # Durability
//!
//! The file is in WAL mode with `synchronous = FULL`: a transaction is on disk when its commit
//! returns, and a process killed at any instant (SIGKILL included) leaves a file that passes
//! `PRAGMA integrity_check` and holds every transaction committed before the kill. Every
//! write transaction starts with `BEGIN IMMEDIATE`, so a second writer waits on the busy
//! timeout for the lock instead of failing on a read-to-write upgrade; two processes writing
//! one database both succeed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::{Backend, Param, Row, RowFn, Store, Tx, Value};
use crate::db::busy_timeout;
use crate::error::{RecordsError, Result};
use crate::schema::{self, Kind, SCHEMA_VERSION};

/// An open SQLite records file.
#[derive(Debug)]
pub(crate) struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

impl SqliteStore {
    /// Opens an existing database for reading only: no migration, no change to the file.
    /// Any schema version up to the current one is readable (see [`crate::schema`]).
    pub fn open_read_only(path: &Path) -> Result<SqliteStore> {
        let path = path.to_path_buf();
        if !path.exists() {
            return Err(RecordsError::Missing { path });
        }
        if let Some(e) = not_a_file(&path) {
            return Err(e);
        }
        let conn = connect_read_only(&path)?;
        let store = SqliteStore { conn, path };
        store
            .conn
            .busy_timeout(busy_timeout())
            .map_err(|e| store.error(e))?;
        match schema::inspect(&store.conn).map_err(|e| store.error(e))? {
            Kind::Records(v) if v <= SCHEMA_VERSION => Ok(store),
            Kind::Records(found) => Err(RecordsError::NewerSchema {
                path: store.path,
                found,
                supported: SCHEMA_VERSION,
            }),
            Kind::Empty => Err(RecordsError::Empty { path: store.path }),
            Kind::Foreign(reason) => Err(RecordsError::Foreign {
                path: store.path,
                reason,
            }),
        }
    }

    /// Opens (creating and migrating when asked), retrying while another process holds a
    /// lock the busy timeout does not wait for: SQLite answers `SQLITE_BUSY` at once, without
    /// the busy handler, where waiting could deadlock (two processes creating one file, each
    /// switching it to WAL or migrating it). Each attempt is a fresh connection.
    pub fn open(path: &Path, create: bool) -> Result<SqliteStore> {
        // SQLite says only "disk I/O error" for a folder, waits forever on a FIFO, and
        // leaves a `-journal` file beside a device (in `/dev`, as root).
        if let Some(e) = not_a_file(path) {
            return Err(e);
        }
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

    fn open_once(path: &Path, create: bool) -> Result<SqliteStore> {
        let path = path.to_path_buf();
        if !create && !path.exists() {
            return Err(RecordsError::Missing { path });
        }
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(&path, flags).map_err(|e| sqlite_error(&path, e))?;
        let mut store = SqliteStore { conn, path };
        store
            .conn
            .busy_timeout(busy_timeout())
            .map_err(|e| store.error(e))?;
        match schema::inspect(&store.conn).map_err(|e| store.error(e))? {
            Kind::Empty => {}
            Kind::Records(v) if v <= SCHEMA_VERSION => {}
            Kind::Records(found) => {
                return Err(RecordsError::NewerSchema {
                    path: store.path,
                    found,
                    supported: SCHEMA_VERSION,
                })
            }
            Kind::Foreign(reason) => {
                return Err(RecordsError::Foreign {
                    path: store.path,
                    reason,
                })
            }
        }
        let mode: String = store
            .conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| store.error(e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(RecordsError::NoWal {
                path: store.path,
                mode,
            });
        }
        store
            .conn
            .execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(|e| store.error(e))?;
        let migrated = schema::migrate(&mut store.conn);
        migrated.map_err(|e| match store.error(e) {
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
        Ok(store)
    }

    fn error(&self, e: rusqlite::Error) -> RecordsError {
        sqlite_error(&self.path, e)
    }
}

/// The error for a database path that is a folder (SQLite itself says "disk I/O error").
/// The error for a path that exists but is not a regular file (links followed): a
/// directory, a device, a FIFO or a socket. `None` for a file or nothing at all.
fn not_a_file(path: &Path) -> Option<RecordsError> {
    let meta = std::fs::metadata(path).ok()?;
    let (kind, what) = if meta.is_dir() {
        (std::io::ErrorKind::IsADirectory, "a directory")
    } else if meta.is_file() {
        return None;
    } else {
        (std::io::ErrorKind::InvalidInput, "a device, pipe or socket")
    };
    Some(RecordsError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(kind, format!("{what}, not a database file")),
    })
}

/// [`Store::identity`] of the SQLite file at `path`, known without opening it: the file
/// itself where the system can say (a hard link is another path to the same file, which a
/// path comparison takes for another database, and SQLite would keep a second WAL file for
/// it), else its canonical path.
pub(crate) fn file_identity(path: &Path) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(path) {
            return format!("sqlite:dev {} inode {}", m.dev(), m.ino());
        }
    }
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    format!("sqlite:{}", canonical.display())
}

impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn location(&self) -> &Path {
        &self.path
    }

    fn identity(&self) -> String {
        file_identity(&self.path)
    }

    fn schema_version(&self) -> Result<u32> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.error(e))
    }

    fn integrity_check(&self) -> Result<Vec<String>> {
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

    fn query(&self, sql: &str, params: &[Param<'_>], each: &mut RowFn<'_>) -> Result<()> {
        run_query(&self.conn, &self.path, sql, params, each)
    }

    fn begin(&mut self) -> Result<Box<dyn Tx + '_>> {
        let path = &self.path;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sqlite_error(path, e))?;
        Ok(Box::new(SqliteTx { tx, path }))
    }

    fn reconnect(&mut self) -> Result<()> {
        // A file has no connection to lose; its errors are never transient.
        Ok(())
    }
}

/// A `BEGIN IMMEDIATE` transaction: it holds the write lock from its first statement.
struct SqliteTx<'a> {
    tx: rusqlite::Transaction<'a>,
    path: &'a Path,
}

impl Tx for SqliteTx<'_> {
    fn location(&self) -> &Path {
        self.path
    }

    fn query(&mut self, sql: &str, params: &[Param<'_>], each: &mut RowFn<'_>) -> Result<()> {
        run_query(&self.tx, self.path, sql, params, each)
    }

    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64> {
        let mut stmt = self
            .tx
            .prepare_cached(&dialect(sql))
            .map_err(|e| sqlite_error(self.path, e))?;
        let changed = stmt
            .execute(rusqlite::params_from_iter(params))
            .map_err(|e| sqlite_error(self.path, e))?;
        Ok(changed as u64)
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let path = self.path;
        self.tx.commit().map_err(|e| sqlite_error(path, e))
    }
}

/// The shared dialect's `$N` parameters as SQLite's `?N`, which bind by number whatever the
/// order they appear in. No statement of the crate has a `$` inside a string literal.
fn dialect(sql: &str) -> String {
    sql.replace('$', "?")
}

fn run_query(
    conn: &Connection,
    path: &Path,
    sql: &str,
    params: &[Param<'_>],
    each: &mut RowFn<'_>,
) -> Result<()> {
    let error = |e| sqlite_error(path, e);
    let mut stmt = conn.prepare_cached(&dialect(sql)).map_err(error)?;
    let columns = stmt.column_count();
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params))
        .map_err(error)?;
    while let Some(row) = rows.next().map_err(error)? {
        let mut values = Vec::with_capacity(columns);
        for i in 0..columns {
            values.push(value_of(path, row.get_ref(i).map_err(error)?)?);
        }
        each(&Row {
            values,
            location: path,
        })?;
    }
    Ok(())
}

fn value_of(path: &Path, v: ValueRef<'_>) -> Result<Value> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => Value::Text(text.to_string()),
            Err(_) => {
                return Err(RecordsError::Corrupt {
                    path: path.to_path_buf(),
                    message: "a stored text is not UTF-8".to_string(),
                })
            }
        },
        ValueRef::Blob(_) => {
            return Err(RecordsError::Corrupt {
                path: path.to_path_buf(),
                message: "a blob where the schema has none".to_string(),
            })
        }
    })
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Param::Null => ValueRef::Null,
            Param::Int(v) => ValueRef::Integer(v),
            Param::Real(v) => ValueRef::Real(v),
            Param::Text(v) => ValueRef::Text(v.as_bytes()),
        }))
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
    // A read-only folder (a read-only mount, say) answers "cannot open" where a read-only
    // file answers "read-only": in both, SQLite cannot make the `-shm` file WAL mode wants.
    let blocked = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    );
    if !blocked || Path::new(&wal).exists() {
        return Err(sqlite_error(path, e));
    }
    let uri = format!("file:{}?immutable=1", uri_path(path));
    Connection::open_with_flags(&uri, flags | OpenFlags::SQLITE_OPEN_URI)
        .map_err(|e| sqlite_error(path, e))
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
