//! Merging databases: every run and record of the sources into one database, once.
//!
//! Records are matched by their content id ([`crate::Record::uid`]), runs by their global
//! uid, so merging is idempotent (merging a source twice adds nothing) and commutative in
//! content (A then B holds the same records and runs as B then A). Sources are only read,
//! never migrated: they may be of any schema version up to the current one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::db::{insert_stored, sqlite_error, upsert_run, Database, StoredRecord};
use crate::error::{RecordsError, Result};
use crate::types::RunId;

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MergeReport {
    /// Per source, in the order given: (path, records read, records new to the target).
    pub sources: Vec<(PathBuf, usize, usize)>,
}

impl MergeReport {
    /// Records new to the target, over all sources.
    pub fn added(&self) -> usize {
        self.sources.iter().map(|(_, _, added)| added).sum()
    }
}

impl Database {
    /// Merges the databases at `sources` into this one, in one transaction: all of them or
    /// (on any error) none. Every source is opened and checked before anything is written.
    pub fn merge_from(&mut self, sources: &[impl AsRef<Path>]) -> Result<MergeReport> {
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
            source.for_each_record_with_run(|r| {
                read += 1;
                let run = r
                    .run
                    .as_ref()
                    .and_then(|info| runs.get(&info.uid).map(|id| (*id, info.uid.as_str())));
                let stored = StoredRecord {
                    workload: &r.record.workload,
                    target: &r.record.target,
                    trace: &r.record.trace_json,
                    trace_hash: r.record.trace_hash.clone(),
                    outcome: &r.record.outcome,
                    measured_at: r.record.measured_at,
                    run,
                };
                if insert_stored(&tx, &stored).map_err(|e| sqlite_error(&db_path, e))? {
                    added += 1;
                }
                Ok(())
            })?;
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
