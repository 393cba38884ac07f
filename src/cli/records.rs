//! Subcommands over the records database: `records`, `best`, `export`, `import`, `merge`.
//!
//! Workload specs given on the command line are canonicalized with the op library
//! ([`WorkloadSpec::parse`]), so `matmul:M=64,N=64,K=64` finds the records of
//! `matmul:K=64,M=64,N=64,dtype=f32`. Imports are checked by [`SchedulesValidator`]: the op
//! must exist, the spec must parse, and the trace must replay on the workload's DAG.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use tensortune_records::{
    to_json_line, Database, ImportMode, Record, RecordValidator, RecordsError, ValidWorkload,
    ValidationError,
};
use tensortune_schedules::ops::{SpecError, WorkloadSpec};
use tensortune_schedules::text::single_line;
use tensortune_schedules::trace::Trace;

use super::CliError;

/// `tensortune records`: what a database holds.
#[derive(Debug, Args)]
#[command(after_help = "Example:\n  tensortune records --db tune.db")]
pub struct RecordsArgs {
    /// The records database: a SQLite file, or a `postgres://` URL.
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
}

/// `tensortune best`: the fastest record of a workload.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    tensortune best --db tune.db --workload matmul:M=1024,N=1024,K=1024\n  \
    tensortune best --db tune.db --workload matmul:M=64,N=64,K=64 --target 'cuda -arch=sm_90' --json")]
pub struct BestArgs {
    /// The records database: a SQLite file, or a `postgres://` URL.
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
    /// The workload spec, e.g. `matmul:M=1024,N=1024,K=1024` (any key order, defaults optional).
    #[arg(long, value_name = "SPEC")]
    pub workload: String,
    /// Only this target key; without it, the best record of every target is shown.
    #[arg(long, value_name = "TARGET")]
    pub target: Option<String>,
    /// Print each best record as one JSON line (the export format) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `tensortune export`: every record as JSON lines.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    tensortune export --db tune.db --out tune.jsonl\n  \
    tensortune export --db tune.db | gzip > tune.jsonl.gz")]
pub struct ExportArgs {
    /// The records database: a SQLite file, or a `postgres://` URL.
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
    /// Write to this file (replaced only once the export is complete); default: stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `tensortune import`: records from a JSON-lines file.
#[derive(Debug, Args)]
#[command(
    after_help = "By default the good lines are imported and each bad line is reported \
    (exit status 2 if there was any); with --strict a file with any bad line imports nothing. \
    Records already in the database are skipped. The database is created if missing.\n\n\
    Example:\n  tensortune import --db tune.db other-machine.jsonl"
)]
pub struct ImportArgs {
    /// The records database, a SQLite file or a `postgres://` URL (created if missing).
    #[arg(long, value_name = "DB")]
    pub db: PathBuf,
    /// The JSON-lines file to import (`-` for stdin).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Import nothing if any line is bad.
    #[arg(long)]
    pub strict: bool,
}

/// `tensortune merge`: several databases into one.
#[derive(Debug, Args)]
#[command(
    after_help = "Each record and run is stored once, however often it is merged; the \
    sources are only read. The target database is created if missing. A source record that \
    fails the checks `import` makes is reported on stderr, one line each (database, record, \
    reason), and skipped.\n\n\
    Example:\n  tensortune merge --into all.db node1.db node2.db"
)]
pub struct MergeArgs {
    /// The database to merge into, a file or a `postgres://` URL (created if missing).
    #[arg(long, value_name = "DB")]
    pub into: PathBuf,
    /// The databases to merge from: files, `postgres://` URLs, or both.
    #[arg(value_name = "SOURCE", required = true, num_args = 1..)]
    pub sources: Vec<PathBuf>,
}

/// The prefix of the workload keys of a model's layers that are not an op of the library
/// (`onnx_conv2d:...`): see `tensortune_model::plan`.
const MODEL_LAYER_PREFIX: &str = "onnx_";

/// Checks imported and merged records against the op library and the schedule language: the
/// op exists, the spec parses (and is canonicalized), the trace replays on the workload's
/// DAG, and the time is possible on the record's target ([`crate::plausible`]). A model's
/// layer (`onnx_...`, a DAG only its model rebuilds) is checked as far as it can be without
/// the model: its trace must be a trace.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedulesValidator;

impl RecordValidator for SchedulesValidator {
    fn check(&self, spec: &str, trace_json: &str) -> Result<ValidWorkload, ValidationError> {
        if spec.starts_with(MODEL_LAYER_PREFIX) && spec.contains(':') {
            // A model's layer: only its model rebuilds the DAG, so the trace is checked as a
            // trace, not replayed, and the key and FLOPs stay as written.
            Trace::from_json(trace_json).map_err(|e| ValidationError::BadTrace {
                message: e.to_string(),
            })?;
            return Ok(ValidWorkload {
                key: spec.to_string(),
                flops: None,
            });
        }
        let bad_spec = |e: SpecError| match e {
            SpecError::UnknownOp { name, .. } => ValidationError::UnknownOp { op: name },
            other => ValidationError::BadSpec {
                spec: spec.to_string(),
                message: other.to_string(),
            },
        };
        let workload = WorkloadSpec::parse(spec).map_err(bad_spec)?;
        let key = workload.canonical();
        let dag = workload.build().map_err(bad_spec)?;
        let trace = Trace::from_json(trace_json).map_err(|e| ValidationError::BadTrace {
            message: e.to_string(),
        })?;
        trace
            .replay(&dag)
            .map_err(|e| ValidationError::DoesNotReplay {
                workload: key.clone(),
                message: e.to_string(),
            })?;
        Ok(ValidWorkload {
            key,
            flops: Some(dag.flops()),
        })
    }

    fn max_flops_per_s(&self, target: &str) -> f64 {
        crate::plausible::max_flops_per_s(target)
    }
}

/// `tensortune records --db DB`: a table of workload, target, trials, errors, best latency
/// and GFLOP/s, then the tasks done and left of each plan tuned into the database.
pub fn records(args: &RecordsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let db = Database::open_read_only(&args.db)?;
    let rows = db.summary()?;
    let plans = super::plan::progress_lines(&db)?;
    if rows.is_empty() {
        let none = format!("{}: no records\n", tensortune_records::redacted(&args.db));
        return write_out(out, &(none + &plans));
    }
    let mut table = vec![[
        "workload".to_string(),
        "target".to_string(),
        "trials".to_string(),
        "errors".to_string(),
        "best".to_string(),
        "GFLOP/s".to_string(),
    ]];
    for row in &rows {
        // Strings from the file: control characters escaped, so that a key holding an escape
        // sequence cannot drive the terminal it is printed to.
        table.push([
            single_line(&row.workload.key).into_owned(),
            single_line(&row.target).into_owned(),
            row.trials.to_string(),
            row.errors.to_string(),
            row.best_s.map_or_else(|| "-".to_string(), format_seconds),
            row.best_gflops()
                .map_or_else(|| "-".to_string(), |g| format!("{g:.1}")),
        ]);
    }
    write_out(out, &(render_table(&table) + &plans))
}

/// `tensortune best`: the fastest successful record per target.
pub fn best(args: &BestArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let db = Database::open_read_only(&args.db)?;
    let key = workload_key(&db, &args.workload)?;
    let targets = match &args.target {
        Some(t) => vec![t.clone()],
        None => db.targets_of(&key)?,
    };
    let mut found = Vec::new();
    for target in &targets {
        if let Some(record) = db.best(&key, target)? {
            found.push(record);
        }
    }
    if found.is_empty() {
        let on = args
            .target
            .as_ref()
            .map(|t| format!(" on target `{t}`"))
            .unwrap_or_default();
        return Err(CliError::Usage(format!(
            "{}: no successful record of {key}{on}",
            tensortune_records::redacted(&args.db)
        )));
    }
    let mut text = String::new();
    for record in &found {
        if args.json {
            let run = match record.run {
                Some(id) => db.run(id)?,
                None => None,
            };
            text.push_str(&to_json_line(record, run.as_ref()));
            text.push('\n');
        } else {
            text.push_str(&describe(record));
        }
    }
    write_out(out, &text)
}

/// `tensortune export`: to `--out` (atomically) or to `out`.
pub fn export(args: &ExportArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if let Some(path) = &args.out {
        super::output::refuse_clobbering(&[("--db", &args.db)], &[("--out", path)])?;
    }
    let db = Database::open_read_only(&args.db)?;
    let result = match &args.out {
        Some(path) => db.export_file(path),
        None => db.export_to(out, Path::new("<stdout>")),
    };
    match result {
        Ok(_) => Ok(()),
        // A reader that stops early (`| head`) is not an error of the export.
        Err(RecordsError::Io { source, .. }) if source.kind() == io::ErrorKind::BrokenPipe => {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// `tensortune import`: lenient by default, `--strict` on request; reports go to `err`.
pub fn import(args: &ImportArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), CliError> {
    let mode = if args.strict {
        ImportMode::Strict
    } else {
        ImportMode::Lenient
    };
    if args.file != Path::new("-") && !args.file.is_file() {
        return Err(CliError::Usage(format!(
            "{}: no such file to import",
            args.file.display()
        )));
    }
    // The database read as JSON lines into itself: refused before either is opened.
    super::output::refuse_clobbering(&[("FILE", &args.file)], &[("--db", &args.db)])?;
    let mut db = Database::open(&args.db)?;
    let report = if args.file == Path::new("-") {
        let stdin = io::stdin();
        db.import_reader(
            stdin.lock(),
            Path::new("<stdin>"),
            &SchedulesValidator,
            mode,
        )?
    } else {
        db.import_file(&args.file, &SchedulesValidator, mode)?
    };
    for rejected in &report.rejected {
        // Reports are best effort: a closed stderr must not turn into a failed import.
        let _ = writeln!(err, "{rejected}");
    }
    write_out(
        out,
        &format!(
            "imported {} new record(s) into {} ({} already present, {} bad line(s) skipped)\n",
            report.imported,
            tensortune_records::redacted(&args.db),
            report.duplicates,
            report.rejected.len()
        ),
    )?;
    if report.rejected.is_empty() {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{}: {} bad line(s) skipped (listed above); the good lines were imported",
            args.file.display(),
            report.rejected.len()
        )))
    }
}

/// `tensortune merge`: all sources into `--into`, in one transaction.
pub fn merge(args: &MergeArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), CliError> {
    // A target this command creates is removed again if the merge fails (a missing or
    // damaged source): a failed command leaves no empty database behind.
    let created = !args.into.exists() && !tensortune_records::is_server(&args.into);
    let mut db = Database::open(&args.into)?;
    let report = match db.merge_from(&args.sources, &SchedulesValidator) {
        Ok(report) => report,
        Err(e) => {
            drop(db);
            if created {
                for suffix in ["", "-wal", "-shm"] {
                    let mut p = args.into.clone().into_os_string();
                    p.push(suffix);
                    let _ = std::fs::remove_file(p);
                }
            }
            return Err(e.into());
        }
    };
    for r in &report.rejected {
        // Best effort, like import's report of bad lines: stderr going away is not an error.
        let _ = writeln!(err, "{r}");
    }
    let mut text = String::new();
    for (path, read, added) in &report.sources {
        text.push_str(&format!(
            "{}: {read} record(s), {added} new\n",
            path.display()
        ));
    }
    text.push_str(&format!(
        "merged {} new record(s) into {}\n",
        report.added(),
        tensortune_records::redacted(&args.into)
    ));
    write_out(out, &text)?;
    if report.rejected.is_empty() {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{} bad record(s) of the sources skipped (listed above); the good ones were merged",
            report.rejected.len()
        )))
    }
}

/// The workload key for a spec from the command line: the canonical form from the op library,
/// or the text itself when the database holds exactly that key (an op this build lacks).
pub(super) fn workload_key(db: &Database, spec: &str) -> Result<String, CliError> {
    match WorkloadSpec::parse(spec) {
        Ok(w) => Ok(w.canonical()),
        Err(e) => {
            let known = db
                .workloads()?
                .into_iter()
                .any(|w| w.workload.key == spec.trim());
            if known {
                Ok(spec.trim().to_string())
            } else {
                Err(CliError::Usage(format!("--workload: {e}")))
            }
        }
    }
}

/// A record for a person: latency, throughput, spread, provenance, trace.
fn describe(record: &Record) -> String {
    let mut text = format!(
        "{} on {}\n",
        single_line(&record.workload.key),
        single_line(&record.target)
    );
    if let Some(t) = record.outcome.timing() {
        let gflops = record
            .gflops()
            .map(|g| format!(" ({g:.1} GFLOP/s)"))
            .unwrap_or_default();
        text.push_str(&format!(
            "  best     {}{gflops}\n  spread   min {}, max {}, {} repeats\n",
            format_seconds(t.median_s),
            format_seconds(t.min_s),
            format_seconds(t.max_s),
            t.repeats
        ));
    }
    text.push_str(&format!(
        "  measured {}\n  trace    {} {}\n",
        record.measured_at,
        single_line(&record.trace_hash[..record.trace_hash.len().min(12)]),
        single_line(&record.trace_json)
    ));
    text
}

/// Seconds in the unit that keeps 3-4 significant digits readable.
pub(super) fn format_seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.2} us", s * 1e6)
    } else {
        format!("{:.0} ns", s * 1e9)
    }
}

/// Left-aligned text columns, right-aligned number columns (trials on), two spaces apart.
fn render_table(rows: &[[String; 6]]) -> String {
    let mut widths = [0usize; 6];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                // Padded by hand: `format!`'s width is a u16, and a hostile database can hold
                // a key longer than that.
                let pad = " ".repeat(w.saturating_sub(cell.chars().count()));
                if i < 2 {
                    format!("{cell}{pad}")
                } else {
                    format!("{pad}{cell}")
                }
            })
            .collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}

pub(super) fn write_out(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::Internal(format!("writing the output: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_records::{NewRecord, Timing, Workload};

    const CPU: &str = "llvm -mcpu=znver4";

    fn sample_db(dir: &Path) -> PathBuf {
        let path = dir.join("t.db");
        let mut db = Database::open(&path).expect("open");
        let spec = WorkloadSpec::parse("matmul:M=64,N=64,K=64").expect("spec");
        let w = Workload::new(spec.canonical(), spec.flops());
        let timing = |m: f64| Timing {
            median_s: m,
            min_s: m * 0.9,
            max_s: m * 1.1,
            repeats: 5,
        };
        let batch = [
            NewRecord::measured(w.clone(), CPU, r#"{"steps":[]}"#, timing(2e-5)),
            NewRecord::measured(w.clone(), CPU, r#"{"steps":[{"op":"x"}]}"#, timing(1e-5)),
            NewRecord::failed(
                w,
                CPU,
                r#"{"steps":[{"op":"y"}]}"#,
                tensortune_records::ErrorKind::Timeout,
                "slow",
            ),
        ];
        db.insert_batch(None, &batch).expect("insert");
        path
    }

    /// A fresh directory under the system's temp dir, removed on drop (the root crate has
    /// no tempfile dependency).
    struct TempDir(PathBuf);

    impl TempDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir() -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tensortune-cli-records-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn text(buf: Vec<u8>) -> String {
        String::from_utf8(buf).expect("utf-8")
    }

    #[test]
    fn records_prints_a_table() {
        let dir = tempdir();
        let db = sample_db(dir.path());
        let mut out = Vec::new();
        records(&RecordsArgs { db }, &mut out).expect("records");
        let out = text(out);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].starts_with("workload"));
        assert!(
            lines[1].contains("matmul:K=64,M=64,N=64,dtype=f32"),
            "{out}"
        );
        assert!(lines[1].contains("10.00 us"), "{out}");
        let cols: Vec<&str> = lines[1].split_whitespace().collect();
        // ... trials errors best unit GFLOP/s
        assert_eq!(&cols[cols.len() - 5..cols.len() - 2], &["3", "1", "10.00"]);
    }

    #[test]
    fn best_canonicalizes_the_spec_and_prints_json() {
        let dir = tempdir();
        let db = sample_db(dir.path());
        let mut out = Vec::new();
        let args = BestArgs {
            db: db.clone(),
            workload: "matmul:N=64,K=64,M=64".into(),
            target: None,
            json: true,
        };
        best(&args, &mut out).expect("best");
        let line: serde_json::Value = serde_json::from_str(text(out).trim()).expect("json");
        assert_eq!(line["result"]["median_s"], 1e-5);
        assert_eq!(line["target"], CPU);

        let missing = BestArgs {
            db,
            workload: "matmul:M=8,N=8,K=8".into(),
            target: None,
            json: false,
        };
        let err = best(&missing, &mut Vec::new()).expect_err("none");
        assert_eq!(err.exit_code(), 2);
        let bad = BestArgs {
            workload: "conv9d:N=1".into(),
            ..missing
        };
        let err = best(&bad, &mut Vec::new()).expect_err("unknown op");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("conv9d"), "{err}");
    }

    #[test]
    fn missing_and_bad_databases_are_usage_errors() {
        let dir = tempdir();
        let missing = dir.path().join("nope.db");
        let err = records(&RecordsArgs { db: missing }, &mut Vec::new()).expect_err("missing");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("nope.db"), "{err}");
        let junk = dir.path().join("junk.db");
        std::fs::write(&junk, "x".repeat(4096)).expect("write");
        let err = records(&RecordsArgs { db: junk }, &mut Vec::new()).expect_err("junk");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("not a SQLite database"), "{err}");
    }

    #[test]
    fn export_then_import_through_the_schedules_validator() {
        let dir = tempdir();
        let db = sample_db(dir.path());
        let file = dir.path().join("out.jsonl");
        export(
            &ExportArgs {
                db,
                out: Some(file.clone()),
            },
            &mut Vec::new(),
        )
        .expect("export");
        // The sample's fake steps do not replay: only the empty trace is imported, and the
        // two others are reported by line.
        let args = ImportArgs {
            db: dir.path().join("new.db"),
            file: file.clone(),
            strict: false,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let result = import(&args, &mut out, &mut err).expect_err("bad lines");
        assert_eq!(result.exit_code(), 2);
        let err = text(err);
        assert_eq!(err.lines().count(), 2, "{err}");
        assert!(err.contains("out.jsonl:"), "{err}");
        assert!(text(out).contains("imported 1 new record(s)"));

        let strict = ImportArgs {
            db: dir.path().join("strict.db"),
            file,
            strict: true,
        };
        let e = import(&strict, &mut Vec::new(), &mut Vec::new()).expect_err("strict");
        assert_eq!(e.exit_code(), 2);
        let db = Database::open_existing(dir.path().join("strict.db")).expect("open");
        assert_eq!(db.count().expect("count"), 0);
    }

    #[test]
    fn the_validator_rejects_unknown_ops_bad_specs_and_traces_that_do_not_replay() {
        let v = SchedulesValidator;
        let ok = v
            .check("matmul:M=8,N=8,K=8", r#"{"steps":[]}"#)
            .expect("valid");
        assert_eq!(ok.key, "matmul:K=8,M=8,N=8,dtype=f32");
        assert_eq!(ok.flops, Some(2.0 * 8.0 * 8.0 * 8.0));
        assert!(matches!(
            v.check("conv9d:N=1", r#"{"steps":[]}"#),
            Err(ValidationError::UnknownOp { .. })
        ));
        assert!(matches!(
            v.check("matmul:M=8", r#"{"steps":[]}"#),
            Err(ValidationError::BadSpec { .. })
        ));
        assert!(matches!(
            v.check("matmul:M=8,N=8,K=8", r#"[1,2]"#),
            Err(ValidationError::BadTrace { .. })
        ));
        // A model's layer: kept as written when its trace is a trace.
        let layer = "onnx_matmul:M=2,N=4,K=3,epilogue=relu(acc),args=";
        let ok = v.check(layer, r#"{"steps":[]}"#).expect("a layer");
        assert_eq!((ok.key.as_str(), ok.flops), (layer, None));
        assert!(matches!(
            v.check(layer, r#"[1,2]"#),
            Err(ValidationError::BadTrace { .. })
        ));
        let far = r#"{"steps":[{"op":"split","stage":99,"iter":0,"factors":[2]}]}"#;
        assert!(matches!(
            v.check("matmul:M=8,N=8,K=8", far),
            Err(ValidationError::DoesNotReplay { .. })
        ));
    }

    #[test]
    fn merge_reports_per_source() {
        let dir = tempdir();
        let a = sample_db(dir.path());
        let mut out = Vec::new();
        let args = MergeArgs {
            into: dir.path().join("all.db"),
            sources: vec![a.clone()],
        };
        // Two of the sample's traces name steps the schedule language does not have: merge
        // checks records as import does, so it copies the sound one and reports the others.
        let mut err = Vec::new();
        let e = merge(&args, &mut out, &mut err).expect_err("two bad records");
        assert_eq!(e.exit_code(), 2, "{e}");
        assert!(e.to_string().contains("2 bad record(s)"), "{e}");
        assert!(text(out).contains("merged 1 new record(s)"));
        assert_eq!(text(err).lines().count(), 2);
        let mut out = Vec::new();
        let _ = merge(&args, &mut out, &mut Vec::new());
        assert!(text(out).contains("merged 0 new record(s)"));
    }

    #[test]
    fn seconds_pick_a_unit() {
        assert_eq!(format_seconds(1.5), "1.500 s");
        assert_eq!(format_seconds(2.5e-3), "2.500 ms");
        assert_eq!(format_seconds(1.25e-5), "12.50 us");
        assert_eq!(format_seconds(3e-8), "30 ns");
    }
}
