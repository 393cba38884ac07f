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

use crate::db::{insert_stored, sqlite_error, upsert_run, Database, StoredRecord, OUT_OF_RANGE};
use crate::error::{InvalidReason, LineErrorKind, RecordsError, Result};
use crate::types::{ErrorKind, NewRecord, Outcome, RunId};
use crate::validate::{check_foreign, RecordValidator};

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MergeReport {
    /// Per source, in the order given: (path, records read, records new to the target).
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
    /// Merges the databases at `sources` into this one, in one transaction: all of them or
    /// (on any error) none. Every source is opened and checked before anything is written;
    /// records that `validator` rejects are reported in [`MergeReport::rejected`] and left out.
    pub fn merge_from(
        &mut self,
        sources: &[impl AsRef<Path>],
        validator: &dyn RecordValidator,
    ) -> Result<MergeReport> {
        let own = canonical(&self.path);
        let mut opened = Vec::with_capacity(sources.len());
        for source in sources {
            let source = source.as_ref();
            if source.exists() && canonical(source) == own {
                return Err(RecordsError::MergeIntoSelf {
                    path: source.to_path_buf(),
                });
            }
            opened.push(Database::open_read_only(source)?);
        }
        let db_path = self.path.clone();
        let tx = self.write_tx()?;
        let mut report = MergeReport::default();
        for source in &opened {
            let mut runs: HashMap<String, RunId> = HashMap::new();
            // Runs first, including those without records, so that provenance travels whole.
            for run in source.runs()? {
                let id = upsert_run(&tx, &run).map_err(|e| sqlite_error(&db_path, e))?;
                runs.insert(run.uid, id);
            }
            let (mut read, mut added) = (0, 0);
            let mut rejected = Vec::new();
            source.for_each_record_with_run(|r| {
                read += 1;
                let forged = match &r.record.outcome {
                    Outcome::Failed {
                        kind: ErrorKind::Other,
                        message,
                    } if message.starts_with(OUT_OF_RANGE) => Some(message.clone()),
                    _ => None,
                };
                let checked = match forged {
                    Some(message) => Err(LineErrorKind::Invalid(InvalidReason::BadTiming(message))),
                    None => check_foreign(
                        NewRecord {
                            workload: r.record.workload.clone(),
                            target: r.record.target.clone(),
                            trace_json: r.record.trace_json.clone(),
                            outcome: r.record.outcome.clone(),
                            measured_at: r.record.measured_at,
                        },
                        validator,
                    ),
                };
                let checked = match checked {
                    Ok(c) => c,
                    Err(kind) => {
                        rejected.push(RejectedRecord {
                            path: source.path.clone(),
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
                if insert_stored(&tx, &stored).map_err(|e| sqlite_error(&db_path, e))? {
                    added += 1;
                }
                Ok(())
            })?;
            report.rejected.append(&mut rejected);
            report.sources.push((source.path.clone(), read, added));
        }
        tx.commit().map_err(|e| sqlite_error(&db_path, e))?;
        Ok(report)
    }
}

/// The path with links and `..` resolved, or as given when it cannot be resolved.
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}
