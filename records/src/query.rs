//! The queries of the tuner and the CLI, written once for both stores, and how their rows
//! become records and runs.

use std::collections::HashSet;
use std::path::Path;

use crate::db::{run_plan, seed_from_sql, stored_plan, Database};
use crate::error::{RecordsError, Result};
use crate::store::{all_rows, first_row, Param, Row, RowFn};
use crate::time::Timestamp;
use crate::types::{
    ErrorKind, Outcome, PlanProgress, Record, RecordId, RunId, RunInfo, StoredPlan, Summary,
    Timing, Workload, WorkloadInfo,
};

/// The columns of `records` joined with its workload, in the order [`read_record`] reads
/// them. Every column exists since schema v1.
const RECORD_COLUMNS: &str = "r.id, r.uid, w.key, w.flops, r.target_key, r.trace, \
     r.trace_hash, r.median_s, r.min_s, r.max_s, r.repeats, r.error_kind, r.error_message, \
     r.measured_at, r.run_id";

/// How many columns [`RECORD_COLUMNS`] has: where the run's columns start in an export row.
const RECORD_WIDTH: usize = 15;

/// A record plus its run, for export and merge.
pub(crate) struct RecordWithRun {
    pub record: Record,
    pub run: Option<RunInfo>,
}

impl Database {
    /// The run columns in the order [`read_run`] reads them, `count` standing for the record
    /// count. A file older than v3 has no plan columns: they read as null.
    fn run_columns(&self, count: &str) -> String {
        let plan = if self.plans {
            "u.plan_id, u.shard, u.shards"
        } else {
            "NULL, NULL, NULL"
        };
        format!(
            "u.id, u.uid, u.started_at, u.finished_at, u.tool_version, u.target_key, u.seed, \
             u.options, {count}, {plan}"
        )
    }

    fn run_select(&self) -> String {
        format!(
            "SELECT {} FROM runs u",
            self.run_columns("(SELECT count(*) FROM records r WHERE r.run_id = u.id)")
        )
    }

    fn query(&self, sql: &str, params: &[Param<'_>], each: &mut RowFn<'_>) -> Result<()> {
        self.store.query(sql, params, each)
    }

    fn all<T>(
        &self,
        sql: &str,
        params: &[Param<'_>],
        read: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        all_rows(|each| self.query(sql, params, each), read)
    }

    /// The fastest successful record of a workload on a target.
    pub fn best(&self, workload_key: &str, target: &str) -> Result<Option<Record>> {
        Ok(self.best_k(workload_key, target, 1)?.into_iter().next())
    }

    /// The `k` fastest successful records, fastest first (ties by measurement time).
    pub fn best_k(&self, workload_key: &str, target: &str, k: usize) -> Result<Vec<Record>> {
        let limit = i64::try_from(k).unwrap_or(i64::MAX);
        let records = self.all(
            &format!(
                "SELECT {RECORD_COLUMNS} FROM records r JOIN workloads w ON w.id = r.workload_id
                 WHERE w.key = $1 AND r.target_key = $2 AND {}
                 ORDER BY r.median_s, r.measured_at, r.uid LIMIT $3",
                plausible_sql()
            ),
            &[workload_key.into(), target.into(), limit.into()],
            read_record,
        )?;
        // A row the SQL filter lets through but `read_record` still finds out of range.
        Ok(records
            .into_iter()
            .filter(|r| r.outcome.timing().is_some())
            .collect())
    }

    /// Every record of a workload on a target, failures included, in measurement order.
    pub fn records(&self, workload_key: &str, target: &str) -> Result<Vec<Record>> {
        self.all(
            &format!(
                "SELECT {RECORD_COLUMNS} FROM records r JOIN workloads w ON w.id = r.workload_id
                 WHERE w.key = $1 AND r.target_key = $2
                 ORDER BY r.measured_at, r.uid"
            ),
            &[workload_key.into(), target.into()],
            read_record,
        )
    }

    /// The hashes of every trace measured for a workload on a target, failures included:
    /// what a resumed run must not measure again.
    pub fn measured_hashes(&self, workload_key: &str, target: &str) -> Result<HashSet<String>> {
        let hashes = self.all(
            "SELECT DISTINCT r.trace_hash FROM records r
             JOIN workloads w ON w.id = r.workload_id
             WHERE w.key = $1 AND r.target_key = $2",
            &[workload_key.into(), target.into()],
            |row| row.text(0),
        )?;
        Ok(hashes.into_iter().collect())
    }

    /// Every run, oldest first, with its record count.
    pub fn runs(&self) -> Result<Vec<RunInfo>> {
        self.all(
            &format!("{} ORDER BY u.started_at, u.uid", self.run_select()),
            &[],
            |row| read_run(row, 0),
        )
    }

    /// The run with a local id, if this database has it.
    pub fn run(&self, id: RunId) -> Result<Option<RunInfo>> {
        first_row(
            |each| {
                self.query(
                    &format!("{} WHERE u.id = $1", self.run_select()),
                    &[id.0.into()],
                    each,
                )
            },
            |row| read_run(row, 0),
        )
    }

    /// Every workload, by key, with its record count.
    pub fn workloads(&self) -> Result<Vec<WorkloadInfo>> {
        self.all(
            "SELECT w.key, w.flops, (SELECT count(*) FROM records r WHERE r.workload_id = w.id)
             FROM workloads w ORDER BY w.key",
            &[],
            |row| {
                let key = row.text(0)?;
                Ok(WorkloadInfo {
                    op: crate::validate::op_name(&key).unwrap_or("").to_string(),
                    workload: Workload::new(key, row.real(1)?),
                    records: row.count(2)?,
                })
            },
        )
    }

    /// The distinct target keys that have records, sorted.
    pub fn targets(&self) -> Result<Vec<String>> {
        self.all(
            "SELECT DISTINCT target_key FROM records ORDER BY target_key",
            &[],
            |row| row.text(0),
        )
    }

    /// The target keys that have records of one workload, sorted.
    pub fn targets_of(&self, workload_key: &str) -> Result<Vec<String>> {
        self.all(
            "SELECT DISTINCT r.target_key FROM records r
             JOIN workloads w ON w.id = r.workload_id
             WHERE w.key = $1 ORDER BY r.target_key",
            &[workload_key.into()],
            |row| row.text(0),
        )
    }

    /// Trials, errors and best latency per (workload, target), by workload key then target.
    pub fn summary(&self) -> Result<Vec<Summary>> {
        self.all(
            &format!(
                "SELECT w.key, w.flops, r.target_key, count(*),
                        sum(CASE WHEN {ok} THEN 0 ELSE 1 END),
                        min(CASE WHEN {ok} THEN r.median_s END)
                 FROM records r JOIN workloads w ON w.id = r.workload_id
                 GROUP BY w.id, r.target_key ORDER BY w.key, r.target_key",
                ok = plausible_sql()
            ),
            &[],
            |row| {
                Ok(Summary {
                    workload: Workload::new(row.text(0)?, row.real(1)?),
                    target: row.text(2)?,
                    trials: row.count(3)?,
                    errors: row.count(4)?,
                    best_s: row.opt_real(5)?,
                })
            },
        )
    }

    /// Number of records in the database.
    pub fn count(&self) -> Result<u64> {
        let n = first_row(
            |each| self.query("SELECT count(*) FROM records", &[], each),
            |row| row.count(0),
        )?;
        Ok(n.unwrap_or(0))
    }

    /// The plans that runs of this database tuned, oldest first (none in a file older than
    /// schema v3).
    pub fn plans(&self) -> Result<Vec<StoredPlan>> {
        if !self.plans {
            return Ok(Vec::new());
        }
        self.all(
            "SELECT id, created_at, body FROM plans ORDER BY created_at, id",
            &[],
            |row| stored_plan(row.text(0)?, &row.text(1)?, row.text(2)?, row.location),
        )
    }

    /// Per workload and target, the records that runs of plan `plan_id` measured.
    pub fn plan_progress(&self, plan_id: &str) -> Result<Vec<PlanProgress>> {
        if !self.plans {
            return Ok(Vec::new());
        }
        self.all(
            "SELECT w.key, r.target_key, count(*) FROM records r
             JOIN runs u ON u.id = r.run_id JOIN workloads w ON w.id = r.workload_id
             WHERE u.plan_id = $1 GROUP BY w.key, r.target_key ORDER BY w.key, r.target_key",
            &[plan_id.into()],
            |row| {
                Ok(PlanProgress {
                    workload: row.text(0)?,
                    target: row.text(1)?,
                    records: row.count(2)?,
                })
            },
        )
    }

    /// Every record with its run, in export order: by workload key, target, measurement time
    /// and content id, which depends on content only, so two databases with the same records
    /// export the same text.
    pub(crate) fn for_each_record_with_run(
        &self,
        mut f: impl FnMut(RecordWithRun) -> Result<()>,
    ) -> Result<()> {
        let sql = format!(
            "SELECT {RECORD_COLUMNS}, {} FROM records r JOIN workloads w ON w.id = r.workload_id
             LEFT JOIN runs u ON u.id = r.run_id
             ORDER BY w.key, r.target_key, r.measured_at, r.uid",
            self.run_columns("0")
        );
        self.query(&sql, &[], &mut |row| {
            let record = read_record(row)?;
            let run = match row.opt_int(RECORD_WIDTH)? {
                None => None,
                Some(_) => Some(read_run(row, RECORD_WIDTH)?),
            };
            f(RecordWithRun { record, run })
        })
    }
}

/// A stored time, or the damage it is.
pub(crate) fn parse_time(text: &str, location: &Path) -> Result<Timestamp> {
    text.parse().map_err(|e| RecordsError::Corrupt {
        path: location.to_path_buf(),
        message: format!("a stored time {text:?} is not a time: {e}"),
    })
}

/// The SQL condition (on `records r JOIN workloads w`) of a successful record whose timing
/// passes [`Timing::check_plausible`] with the target-blind limit: what the best-record
/// queries rank. Comparisons with NULL are not true, so a row with a missing time fails it.
fn plausible_sql() -> String {
    use crate::types::{MAX_FLOPS_PER_S, MAX_LATENCY_S, MIN_LATENCY_S};
    format!(
        "(r.error_kind IS NULL AND r.min_s >= {MIN_LATENCY_S:e} AND r.min_s <= r.median_s \
         AND r.median_s <= r.max_s AND r.max_s <= {MAX_LATENCY_S:e} AND r.repeats >= 1 \
         AND w.flops >= 0 AND w.flops <= r.median_s * {MAX_FLOPS_PER_S:e})"
    )
}

/// How the failure that [`stored_timing`] makes of an impossible row begins, so that merge
/// can tell it from a measured failure and leave it out.
pub(crate) const OUT_OF_RANGE: &str = "stored timing out of range";

/// The outcome of a row with no error kind: its timing, or, when the stored values could not
/// have been measured (negative, NULL, out of order, impossibly fast; rows written by hand
/// or by another program), a failure of kind `other` saying so, so that every reader treats
/// the row as a bad record rather than ranking or trusting it.
fn stored_timing(row: &Row<'_>, flops: f64) -> Result<Outcome> {
    let bad = |why: String| Outcome::Failed {
        kind: ErrorKind::Other,
        message: format!("{OUT_OF_RANGE}: {why}"),
    };
    let (Some(median_s), Some(min_s), Some(max_s), Some(repeats)) = (
        row.opt_real(7)?,
        row.opt_real(8)?,
        row.opt_real(9)?,
        row.opt_int(10)?,
    ) else {
        return Ok(bad("a time or the repeat count is missing".into()));
    };
    let Ok(repeats) = u32::try_from(repeats) else {
        return Ok(bad(format!("repeats {repeats}")));
    };
    // The workload's FLOPs come from the op library and are finite and not negative; another
    // value (edited by hand) would rank the record by a negative or infinite throughput.
    if !(flops.is_finite() && flops >= 0.0) {
        return Ok(bad(format!("the workload's flops are {flops}")));
    }
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
fn read_record(row: &Row<'_>) -> Result<Record> {
    let flops = row.real(3)?;
    let outcome = match row.opt_text(11)? {
        None => stored_timing(row, flops)?,
        Some(kind) => Outcome::Failed {
            kind: kind.parse().map_err(|e: crate::types::UnknownErrorKind| {
                RecordsError::Corrupt {
                    path: row.location.to_path_buf(),
                    message: e.to_string(),
                }
            })?,
            message: row.opt_text(12)?.unwrap_or_default(),
        },
    };
    Ok(Record {
        id: RecordId(row.int(0)?),
        uid: row.text(1)?,
        workload: Workload::new(row.text(2)?, flops),
        target: row.text(4)?,
        trace_json: row.text(5)?,
        trace_hash: row.text(6)?,
        outcome,
        measured_at: parse_time(&row.text(13)?, row.location)?,
        run: row.opt_int(14)?.map(RunId),
    })
}

/// Reads run columns `id, uid, started_at, finished_at, tool_version, target_key, seed,
/// options, record count, plan_id, shard, shards` starting at column `at`.
fn read_run(row: &Row<'_>, at: usize) -> Result<RunInfo> {
    Ok(RunInfo {
        id: RunId(row.int(at)?),
        uid: row.text(at + 1)?,
        started_at: parse_time(&row.text(at + 2)?, row.location)?,
        finished_at: match row.opt_text(at + 3)? {
            None => None,
            Some(t) => Some(parse_time(&t, row.location)?),
        },
        tool_version: row.text(at + 4)?,
        target: row.text(at + 5)?,
        seed: row.opt_int(at + 6)?.map(seed_from_sql),
        options: row.opt_text(at + 7)?.unwrap_or_default(),
        records: row.count(at + 8)?,
        plan: run_plan(
            row.opt_text(at + 9)?,
            row.opt_int(at + 10)?,
            row.opt_int(at + 11)?,
        ),
    })
}
