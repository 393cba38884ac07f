//! Merging databases: every run and record of the sources into one database, once.
//!
//! Records are matched by their content id ([`crate::Record::uid`]), runs by their global
//! uid, so merging is idempotent (merging a source twice adds nothing) and commutative in
//! content (A then B holds the same records and runs as B then A). Sources are only read,
//! never migrated: they may be of any schema version up to the current one.
//!
//! A source is as much outside input as an imported file: every record is checked with the
//! caller's [`RecordValidator`] exactly as an imported line is (op, spec, trace, target,
//! plausible timing), and a record that fails is left out and reported, never copied.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::db::{insert_stored, put_plan, upsert_run, Database, StoredRecord};
use crate::error::{InvalidReason, LineErrorKind, RecordsError, Result};
use crate::query::OUT_OF_RANGE;
use crate::store::Tx;
use crate::types::{ErrorKind, NewRecord, Outcome, RunId};
use crate::validate::{check_foreign, RecordValidator};

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MergeReport {
    /// Per source, in the order given: (path or URL without password, records read,
    /// records new to the target).
    pub sources: Vec<(PathBuf, usize, usize)>,
    /// Records of the sources that failed the validator and were not copied.
    pub rejected: Vec<RejectedRecord>,
}

/// A record of a source database that failed validation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: record {uid}: {kind}", path.display())]
pub struct RejectedRecord {
    /// The source database.
    pub path: PathBuf,
    /// The record's content id in that database.
    pub uid: String,
    /// What is wrong with it.
    pub kind: LineErrorKind,
}

impl MergeReport {
    /// Records new to the target, over all sources.
    pub fn added(&self) -> usize {
        self.sources.iter().map(|(_, _, added)| added).sum()
    }
}

impl Database {
    /// Merges the databases at `sources` (files or server URLs, of either kind whatever this
    /// one is) into this one, in one transaction: all of them or (on any error) none. Every
    /// source is opened and checked before anything is written; records that `validator`
    /// rejects are reported in [`MergeReport::rejected`] and left out. The plans of the
    /// sources' runs come along with the runs.
    pub fn merge_from(
        &mut self,
        sources: &[impl AsRef<Path>],
        validator: &dyn RecordValidator,
    ) -> Result<MergeReport> {
        let own = self.store.identity();
        let mut opened = Vec::with_capacity(sources.len());
        for source in sources {
            // Before opening it: SQLite refuses a second handle on a file open here under
            // another name (a hard link) with a bare I/O error.
            let path = source.as_ref();
            if crate::store::sqlite::file_identity(path) == own {
                return Err(RecordsError::MergeIntoSelf {
                    path: path.to_path_buf(),
                });
            }
            let source = Database::open_read_only(source)?;
            if source.store.identity() == own {
                return Err(RecordsError::MergeIntoSelf {
                    path: source.location().to_path_buf(),
                });
            }
            opened.push(source);
        }
        self.write_once(&mut |tx| {
            let mut report = MergeReport::default();
            for source in &opened {
                let (read, added) = merge_one(tx, source, validator, &mut report.rejected)?;
                report
                    .sources
                    .push((source.location().to_path_buf(), read, added));
            }
            Ok(report)
        })
    }
}

/// Copies one source's plans, runs and valid records in the open transaction; returns the
/// records read and the records new to the target.
fn merge_one(
    tx: &mut dyn Tx,
    source: &Database,
    validator: &dyn RecordValidator,
    rejected: &mut Vec<RejectedRecord>,
) -> Result<(usize, usize)> {
    for plan in source.plans()? {
        put_plan(tx, &plan.id, plan.created_at, &plan.body)?;
    }
    let mut runs: HashMap<String, RunId> = HashMap::new();
    // Runs first, including those without records, so that provenance travels whole.
    for run in source.runs()? {
        let id = upsert_run(tx, &run)?;
        runs.insert(run.uid, id);
    }
    let (mut read, mut added) = (0, 0);
    source.for_each_record_with_run(|r| {
        read += 1;
        let checked = match check_merged(&r.record, validator) {
            Ok(c) => c,
            Err(kind) => {
                rejected.push(RejectedRecord {
                    path: source.location().to_path_buf(),
                    uid: r.record.uid.clone(),
                    kind,
                });
                return Ok(());
            }
        };
        let run = r
            .run
            .as_ref()
            .and_then(|info| runs.get(&info.uid).map(|id| (*id, info.uid.as_str())));
        let stored = StoredRecord {
            workload: &checked.workload,
            target: &checked.target,
            trace: &checked.trace_json,
            trace_hash: crate::hash::trace_hash(&checked.trace_json),
            outcome: &checked.outcome,
            measured_at: checked.measured_at,
            run,
        };
        if insert_stored(tx, &stored)? {
            added += 1;
        }
        Ok(())
    })?;
    Ok((read, added))
}

/// A source's record checked as an imported line is, or why it is left out. A row whose
/// stored timing could not have been measured is left out by name.
fn check_merged(
    record: &crate::Record,
    validator: &dyn RecordValidator,
) -> Result<NewRecord, LineErrorKind> {
    if let Outcome::Failed {
        kind: ErrorKind::Other,
        message,
    } = &record.outcome
    {
        if message.starts_with(OUT_OF_RANGE) {
            return Err(LineErrorKind::Invalid(InvalidReason::BadTiming(
                message.clone(),
            )));
        }
    }
    check_foreign(
        NewRecord {
            workload: record.workload.clone(),
            target: record.target.clone(),
            trace_json: record.trace_json.clone(),
            outcome: record.outcome.clone(),
            measured_at: record.measured_at,
        },
        validator,
    )
}
