//! JSON-lines export and import: one self-describing record a line.
//!
//! # The line format (`tensortune.record/1`)
//!
//! ```json
//! {"format":"tensortune.record/1","workload":"matmul:K=64,M=64,N=64,dtype=f32",
//!  "flops":524288.0,"target":"llvm -mcpu=znver4","trace":[{"Split":{"stage":0}}],
//!  "trace_hash":"5f2c…","result":{"median_s":1.5e-5,"min_s":1.4e-5,"max_s":1.9e-5,
//!  "repeats":10},"measured_at":"2026-01-02T03:04:05.678Z",
//!  "run":{"uid":"9a…","started_at":"…","finished_at":null,"tool_version":"tensortune 0.1.0",
//!  "target":"llvm -mcpu=znver4","seed":42,"options":"--trials 1000"}}
//! ```
//!
//! (shown wrapped; a real line has no line break). Fields:
//!
//! * `format`: always `tensortune.record/1`; a line of another format is rejected by name.
//! * `workload` (canonical spec) and `flops`; `target` (target key).
//! * `trace`: the trace as a JSON value (not a string), exactly the stored text.
//! * `trace_hash`: SHA-256 hex of the compact trace text; optional on import, checked when
//!   present.
//! * exactly one of `result` (`median_s`, `min_s`, `max_s` in seconds, `repeats`) and
//!   `error` (`kind`: `compile`, `runtime`, `timeout`, `wrong_result` or `other`; `message`).
//! * `measured_at`: `YYYY-MM-DDTHH:MM:SS.mmmZ`.
//! * `run`: the provenance, or absent. Runs are matched across databases by `uid`. A run of
//!   a plan has `plan` (`id`, `shard`, `shards`); a run of none has no `plan` field.
//!
//! Unknown fields are ignored, so a later minor addition stays readable by this build.
//! Export writes records sorted by workload key, target, measurement time and content id,
//! which depend only on content: export → import → export gives the same bytes.
//!
//! # Import modes
//!
//! [`ImportMode::Lenient`] (the default) imports every good line and reports every bad one;
//! [`ImportMode::Strict`] imports nothing when any line is bad and reports them all. Either
//! way the import is one transaction, and records already present are skipped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::db::{insert_stored, upsert_run, Database, StoredRecord};
use crate::error::{LineError, LineErrorKind, RecordsError, Result};
use crate::hash::{compact_json, trace_hash};
use crate::store::Tx;
use crate::time::Timestamp;
use crate::types::{
    NewRecord, Outcome, Record, RunId, RunInfo, RunPlan, Timing, UnknownErrorKind, Workload,
};
use crate::validate::{check_foreign, RecordValidator};

/// The `format` field of every line this build writes and reads.
pub const FORMAT: &str = "tensortune.record/1";

/// What to do with a file that has bad lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImportMode {
    /// Import the good lines, report the bad ones.
    #[default]
    Lenient,
    /// Import nothing if any line is bad.
    Strict,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImportReport {
    /// Non-blank lines read.
    pub lines: usize,
    /// Records that were new to the database.
    pub imported: usize,
    /// Good records that the database already held.
    pub duplicates: usize,
    /// The bad lines, in file order (lenient mode only: strict mode returns an error).
    pub rejected: Vec<LineError>,
}

#[derive(Serialize, Deserialize)]
struct Line {
    format: String,
    workload: String,
    flops: f64,
    target: String,
    trace: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trace_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<LineTiming>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<LineFailure>,
    measured_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<LineRun>,
}

#[derive(Serialize, Deserialize)]
struct LineTiming {
    median_s: f64,
    min_s: f64,
    max_s: f64,
    repeats: u32,
}

#[derive(Serialize, Deserialize)]
struct LineFailure {
    kind: String,
    message: String,
}

#[derive(Serialize, Deserialize)]
struct LineRun {
    uid: String,
    started_at: String,
    finished_at: Option<String>,
    tool_version: String,
    target: String,
    seed: Option<u64>,
    options: String,
    /// Which plan and shard the run tuned; absent for a run of no plan (and in lines
    /// written before plans existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plan: Option<RunPlan>,
}

/// Only the `format` field, to name the format of a line that does not parse as ours.
#[derive(Deserialize)]
struct FormatOnly {
    format: Option<String>,
}

/// The JSON line of a record (no trailing newline), as `export` writes it.
pub fn to_json_line(record: &Record, run: Option<&RunInfo>) -> String {
    let (result, error) = match &record.outcome {
        Outcome::Measured(t) => (
            Some(LineTiming {
                median_s: t.median_s,
                min_s: t.min_s,
                max_s: t.max_s,
                repeats: t.repeats,
            }),
            None,
        ),
        Outcome::Failed { kind, message } => (
            None,
            Some(LineFailure {
                kind: kind.as_str().to_string(),
                message: message.clone(),
            }),
        ),
    };
    // The stored trace was checked to be JSON when it was written; should a damaged row
    // hold something else, it is exported as a JSON string so that the line stays JSON (and
    // its import then fails by name).
    let trace = RawValue::from_string(record.trace_json.clone()).unwrap_or_else(|_| {
        RawValue::from_string(serde_json::Value::from(record.trace_json.clone()).to_string())
            .unwrap_or_default()
    });
    let line = Line {
        format: FORMAT.to_string(),
        workload: record.workload.key.clone(),
        flops: record.workload.flops,
        target: record.target.clone(),
        trace,
        trace_hash: Some(record.trace_hash.clone()),
        result,
        error,
        measured_at: record.measured_at.to_string(),
        run: run.map(|r| LineRun {
            uid: r.uid.clone(),
            started_at: r.started_at.to_string(),
            finished_at: r.finished_at.map(|t| t.to_string()),
            tool_version: r.tool_version.clone(),
            target: r.target.clone(),
            seed: r.seed,
            options: r.options.clone(),
            plan: r.plan.clone(),
        }),
    };
    // Serializing plain strings, numbers and raw JSON cannot fail; non-finite floats (which
    // checks keep out of the database) would become null.
    serde_json::to_string(&line).unwrap_or_default()
}

/// A line that passed every check, ready to insert.
struct Parsed {
    workload: Workload,
    target: String,
    trace: String,
    trace_hash: String,
    outcome: Outcome,
    measured_at: Timestamp,
    run: Option<RunInfo>,
}

fn parse_time(text: &str) -> Result<Timestamp, LineErrorKind> {
    text.parse()
        .map_err(|_| LineErrorKind::BadTimestamp(text.to_string()))
}

fn parse_line(text: &str, validator: &dyn RecordValidator) -> Result<Parsed, LineErrorKind> {
    let line: Line = match serde_json::from_str(text) {
        Ok(line) => line,
        Err(e) => {
            return Err(match serde_json::from_str::<FormatOnly>(text) {
                Ok(FormatOnly {
                    format: Some(found),
                }) if found != FORMAT => LineErrorKind::UnsupportedFormat {
                    found,
                    expected: FORMAT,
                },
                _ if e.is_eof() => LineErrorKind::Malformed(format!("truncated line ({e})")),
                _ => LineErrorKind::Malformed(e.to_string()),
            })
        }
    };
    if line.format != FORMAT {
        return Err(LineErrorKind::UnsupportedFormat {
            found: line.format,
            expected: FORMAT,
        });
    }
    let outcome = match (line.result, line.error) {
        (Some(t), None) => Outcome::Measured(Timing {
            median_s: t.median_s,
            min_s: t.min_s,
            max_s: t.max_s,
            repeats: t.repeats,
        }),
        (None, Some(f)) => Outcome::Failed {
            kind: f
                .kind
                .parse()
                .map_err(|e: UnknownErrorKind| LineErrorKind::Malformed(e.to_string()))?,
            message: f.message,
        },
        _ => return Err(LineErrorKind::OutcomeAmbiguous),
    };
    let trace = compact_json(line.trace.get());
    let hash = trace_hash(&trace);
    if let Some(found) = line.trace_hash {
        if found != hash {
            return Err(LineErrorKind::HashMismatch {
                found,
                expected: hash,
            });
        }
    }
    let measured_at = parse_time(&line.measured_at)?;
    let run = match line.run {
        None => None,
        Some(r) => Some(RunInfo {
            id: RunId(0),
            uid: r.uid,
            started_at: parse_time(&r.started_at)?,
            finished_at: r.finished_at.as_deref().map(parse_time).transpose()?,
            tool_version: r.tool_version,
            target: r.target,
            seed: r.seed,
            options: r.options,
            records: 0,
            plan: r.plan,
        }),
    };
    let checked = check_foreign(
        NewRecord {
            workload: Workload::new(line.workload, line.flops),
            target: line.target,
            trace_json: trace,
            outcome,
            measured_at,
        },
        validator,
    )?;
    Ok(Parsed {
        workload: checked.workload,
        target: checked.target,
        trace: checked.trace_json,
        trace_hash: hash,
        outcome: checked.outcome,
        measured_at: checked.measured_at,
        run,
    })
}

impl Database {
    /// Writes every record as one JSON line to `out`; `out_name` names it in errors.
    /// Returns the number of lines.
    pub fn export_to(&self, out: &mut dyn Write, out_name: &Path) -> Result<usize> {
        let io = |source| RecordsError::Io {
            path: out_name.to_path_buf(),
            source,
        };
        let mut count = 0;
        self.for_each_record_with_run(|r| {
            let line = to_json_line(&r.record, r.run.as_ref());
            writeln!(out, "{line}").map_err(io)?;
            count += 1;
            Ok(())
        })?;
        out.flush().map_err(io)?;
        Ok(count)
    }

    /// Exports to the file `path`, replacing it only once the export is complete (a
    /// temporary file beside it is renamed over it), so an interrupted export never leaves
    /// half a file.
    pub fn export_file(&self, path: impl AsRef<Path>) -> Result<usize> {
        let path = path.as_ref();
        let io = |source| RecordsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut result = Ok(0);
        let written = crate::atomic::write_atomic(path, |w| {
            result = self.export_to(w, path);
            // The database's error is returned below; this one only stops the rename.
            match &result {
                Ok(_) => Ok(()),
                Err(_) => Err(std::io::Error::other("export failed")),
            }
        });
        match (result, written) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(io(e)),
            (Ok(n), Ok(())) => Ok(n),
        }
    }

    /// Imports a JSON-lines file; errors and bad lines name `path`.
    pub fn import_file(
        &mut self,
        path: impl AsRef<Path>,
        validator: &dyn RecordValidator,
        mode: ImportMode,
    ) -> Result<ImportReport> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| RecordsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        self.import_reader(BufReader::new(file), path, validator, mode)
    }

    /// Imports JSON lines from `input`; `source` names it in errors and bad-line reports.
    /// The import is one transaction. Blank lines are skipped.
    pub fn import_reader(
        &mut self,
        mut input: impl BufRead,
        source: &Path,
        validator: &dyn RecordValidator,
        mode: ImportMode,
    ) -> Result<ImportReport> {
        // Not tried again on a lost connection: the input is read once, as it streams.
        self.write_once(&mut |tx| import_lines(tx, &mut input, source, validator, mode))
    }
}

/// Reads every line of `input` and inserts the good ones in the open transaction; a strict
/// import with a bad line returns the error that rolls it back.
fn import_lines(
    tx: &mut dyn Tx,
    input: &mut dyn BufRead,
    source: &Path,
    validator: &dyn RecordValidator,
    mode: ImportMode,
) -> Result<ImportReport> {
    let mut report = ImportReport::default();
    let mut runs: HashMap<String, RunId> = HashMap::new();
    let mut bytes = Vec::new();
    let mut number = 0;
    loop {
        bytes.clear();
        let n = input
            .read_until(b'\n', &mut bytes)
            .map_err(|source_err| RecordsError::Io {
                path: source.to_path_buf(),
                source: source_err,
            })?;
        if n == 0 {
            break;
        }
        number += 1;
        let reject = |kind| LineError {
            path: source.to_path_buf(),
            line: number,
            kind,
        };
        let Ok(text) = std::str::from_utf8(&bytes) else {
            report.lines += 1;
            report.rejected.push(reject(LineErrorKind::NotUtf8));
            continue;
        };
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        report.lines += 1;
        let parsed = match parse_line(text, validator) {
            Ok(parsed) => parsed,
            Err(kind) => {
                report.rejected.push(reject(kind));
                continue;
            }
        };
        if mode == ImportMode::Strict && !report.rejected.is_empty() {
            // Nothing will be committed; keep checking lines to report them all.
            continue;
        }
        let run = match &parsed.run {
            None => None,
            Some(info) => Some(match runs.get(&info.uid) {
                Some(id) => (*id, info.uid.as_str()),
                None => {
                    let id = upsert_run(tx, info)?;
                    runs.insert(info.uid.clone(), id);
                    (id, info.uid.as_str())
                }
            }),
        };
        let stored = StoredRecord {
            workload: &parsed.workload,
            target: &parsed.target,
            trace: &parsed.trace,
            trace_hash: parsed.trace_hash.clone(),
            outcome: &parsed.outcome,
            measured_at: parsed.measured_at,
            run,
        };
        if insert_stored(tx, &stored)? {
            report.imported += 1;
        } else {
            report.duplicates += 1;
        }
    }
    if mode == ImportMode::Strict && !report.rejected.is_empty() {
        return Err(RecordsError::ImportRejected {
            errors: report.rejected,
        });
    }
    Ok(report)
}
