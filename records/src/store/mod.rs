//! The storage interface: one trait, [`Store`], with two implementations, a SQLite file
//! ([`sqlite`]) and a PostgreSQL server ([`postgres`]).
//!
//! A store is a SQL connection that speaks the records schema: it opens (creating and
//! migrating the schema where asked), runs parameterized statements, and opens
//! transactions. Everything above it — which statements, in which transaction, how rows
//! become [`crate::Record`]s, retries — is written once, in [`crate::Database`] and its
//! modules, so both kinds of database hold the same rows and answer the same queries.
//!
//! The statements are written in the dialect both engines share: `$1`, `$2`... for
//! parameters (numbered in order of first appearance, which SQLite requires), `ON CONFLICT`
//! upserts, no engine-specific functions. Text columns compare as bytes on both (SQLite's
//! default, `COLLATE "C"` on PostgreSQL), so every `ORDER BY` lists rows in the same order.
//!
//! Which store a database argument names is decided by its text alone ([`Location`]): a
//! `postgres://` or `postgresql://` URL is a server, anything else a file path.

use std::path::{Path, PathBuf};

use crate::error::{RecordsError, Result};

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod sqlite;

/// A statement parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
}

impl From<i64> for Param<'_> {
    fn from(v: i64) -> Self {
        Param::Int(v)
    }
}

impl From<f64> for Param<'_> {
    fn from(v: f64) -> Self {
        Param::Real(v)
    }
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(v: &'a str) -> Self {
        Param::Text(v)
    }
}

impl<'a, T: Into<Param<'a>>> From<Option<T>> for Param<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Param::Null, Into::into)
    }
}

/// One value of a result row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

/// A result row, read by position. A value of the wrong type is damage in the database
/// (a hand edit, another program's rows), reported as [`RecordsError::Corrupt`].
pub(crate) struct Row<'a> {
    pub values: Vec<Value>,
    pub location: &'a Path,
}

impl Row<'_> {
    fn wrong(&self, column: usize, wanted: &str) -> RecordsError {
        RecordsError::Corrupt {
            path: self.location.to_path_buf(),
            message: format!(
                "a stored value is out of place: column {column} holds {:?} where {wanted} belongs",
                self.values.get(column)
            ),
        }
    }

    pub fn opt_int(&self, column: usize) -> Result<Option<i64>> {
        match self.values.get(column) {
            Some(Value::Null) => Ok(None),
            Some(Value::Int(v)) => Ok(Some(*v)),
            _ => Err(self.wrong(column, "an integer")),
        }
    }

    pub fn int(&self, column: usize) -> Result<i64> {
        self.opt_int(column)?
            .ok_or_else(|| self.wrong(column, "an integer"))
    }

    /// A count: never negative in a sound database, clamped to 0 otherwise.
    pub fn count(&self, column: usize) -> Result<u64> {
        Ok(self.int(column)?.max(0) as u64)
    }

    pub fn opt_real(&self, column: usize) -> Result<Option<f64>> {
        match self.values.get(column) {
            Some(Value::Null) => Ok(None),
            Some(Value::Real(v)) => Ok(Some(*v)),
            // SQLite stores a REAL with no fraction as it was given; an integer read from a
            // REAL column is the same number.
            Some(Value::Int(v)) => Ok(Some(*v as f64)),
            _ => Err(self.wrong(column, "a number")),
        }
    }

    pub fn real(&self, column: usize) -> Result<f64> {
        self.opt_real(column)?
            .ok_or_else(|| self.wrong(column, "a number"))
    }

    pub fn opt_text(&self, column: usize) -> Result<Option<String>> {
        match self.values.get(column) {
            Some(Value::Null) => Ok(None),
            Some(Value::Text(v)) => Ok(Some(v.clone())),
            _ => Err(self.wrong(column, "text")),
        }
    }

    pub fn text(&self, column: usize) -> Result<String> {
        self.opt_text(column)?
            .ok_or_else(|| self.wrong(column, "text"))
    }
}

/// What a caller does with each row of a query; an error stops the query.
pub(crate) type RowFn<'f> = dyn FnMut(&Row<'_>) -> Result<()> + 'f;

/// Which engine a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// A records database on one engine. See the module doc.
pub(crate) trait Store: std::fmt::Debug + Send {
    /// The engine.
    fn backend(&self) -> Backend;
    /// The path, or the URL without its password: what errors and reports name.
    fn location(&self) -> &Path;
    /// What tells two handles on one database apart from handles on two: the file (its
    /// device and inode, else its canonical path), or the server, port, database and options
    /// of the URL.
    fn identity(&self) -> String;
    /// The schema version of the database.
    fn schema_version(&self) -> Result<u32>;
    /// Messages of the engine's own consistency check; empty when sound.
    fn integrity_check(&self) -> Result<Vec<String>>;
    /// Runs a query outside any transaction, calling `each` for every row in order.
    fn query(&self, sql: &str, params: &[Param<'_>], each: &mut RowFn<'_>) -> Result<()>;
    /// Opens a write transaction. Dropping it without [`Tx::commit`] rolls it back.
    fn begin(&mut self) -> Result<Box<dyn Tx + '_>>;
    /// Replaces a connection that failed ([`RecordsError::is_transient`]) with a new one.
    fn reconnect(&mut self) -> Result<()>;
}

/// An open write transaction.
pub(crate) trait Tx {
    /// The database's path or URL, for errors.
    fn location(&self) -> &Path;
    /// Runs a query in the transaction, calling `each` for every row in order.
    fn query(&mut self, sql: &str, params: &[Param<'_>], each: &mut RowFn<'_>) -> Result<()>;
    /// Runs a statement; returns how many rows it changed.
    fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64>;
    /// Makes the transaction's changes durable and visible.
    fn commit(self: Box<Self>) -> Result<()>;
}

/// The one row of a query, if it returns any.
pub(crate) fn first_row<T>(
    query: impl FnOnce(&mut RowFn<'_>) -> Result<()>,
    mut read: impl FnMut(&Row<'_>) -> Result<T>,
) -> Result<Option<T>> {
    let mut first = None;
    query(&mut |row| {
        if first.is_none() {
            first = Some(read(row)?);
        }
        Ok(())
    })?;
    Ok(first)
}

/// Every row of a query, read by `read`.
pub(crate) fn all_rows<T>(
    query: impl FnOnce(&mut RowFn<'_>) -> Result<()>,
    mut read: impl FnMut(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut rows = Vec::new();
    query(&mut |row| {
        rows.push(read(row)?);
        Ok(())
    })?;
    Ok(rows)
}

/// What a database argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A SQLite file.
    File(PathBuf),
    /// A PostgreSQL server: the URL as given (with any password).
    Server(String),
}

impl Location {
    pub fn of(path: &Path) -> Location {
        match path.to_str() {
            Some(text) if is_server_url(text) => Location::Server(text.to_string()),
            _ => Location::File(path.to_path_buf()),
        }
    }
}

/// True when `text` is a PostgreSQL URL (`postgres://` or `postgresql://`) rather than a path.
fn is_server_url(text: &str) -> bool {
    ["postgres://", "postgresql://"].iter().any(|scheme| {
        text.get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    })
}

/// True when a database argument names a PostgreSQL server rather than a file, so that
/// a caller does not look for it on disk.
pub fn is_server(db: impl AsRef<Path>) -> bool {
    matches!(Location::of(db.as_ref()), Location::Server(_))
}

/// A database argument as it may be shown or stored: a path as it is, a URL with its
/// password (in the user part or a `password=` parameter) replaced by `***`.
pub fn redacted(db: impl AsRef<Path>) -> String {
    match Location::of(db.as_ref()) {
        Location::File(path) => path.display().to_string(),
        Location::Server(url) => redact_url(&url),
    }
}

fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    // The user part ends at the last `@` before the host's path or query.
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let mut out = format!("{scheme}://");
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = match user.split_once(':') {
                Some((name, _)) => format!("{name}:***"),
                None => user.to_string(),
            };
            out.push_str(&format!("{user}@{host}"));
        }
        None => out.push_str(authority),
    }
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    out.push_str(path);
    if !query.is_empty() {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_a_server_and_its_password_is_never_shown() {
        assert!(is_server("postgres://u@h/db"));
        assert!(is_server("PostgreSQL://h/db"));
        assert!(!is_server("tuning.db"));
        assert!(!is_server("postgres/tuning.db"));
        assert_eq!(
            redacted("postgres://ann:s3cret@db.lab:5433/tune?sslmode=disable"),
            "postgres://ann:***@db.lab:5433/tune?sslmode=disable"
        );
        assert_eq!(
            redacted("postgresql://h/tune?user=ann&password=s3cret"),
            "postgresql://h/tune?user=ann&password=***"
        );
        assert_eq!(redacted("postgres://ann@h"), "postgres://ann@h");
        assert_eq!(redacted("runs/a.db"), "runs/a.db");
    }
}
