//! Fuzzing of JSON-lines import (`tensortune import`): mutations of exported lines are each
//! imported or rejected with a one-line reason naming the file and line, never a panic and
//! never a failure of the whole import. What was accepted exports to lines that import again,
//! unchanged, into a fresh database.

mod common;

use std::cell::RefCell;
use std::io::Cursor;
use std::path::Path;

use common::*;
use tensortune_fuzzkit::{escape, one_line, Campaign};
use tensortune_records::{Database, ImportMode, JsonSyntaxValidator};

const TOKENS: &[&str] = &[
    "\"format\":",
    "\"tensortune.record/1\"",
    "\"tensortune.record/2\"",
    "\"workload\":",
    "\"flops\":",
    "\"target\":",
    "\"trace\":",
    "\"trace_hash\":",
    "\"result\":",
    "\"error\":",
    "\"median_s\":",
    "\"min_s\":",
    "\"max_s\":",
    "\"repeats\":",
    "\"kind\":\"timeout\"",
    "\"kind\":\"segfault\"",
    "\"message\":",
    "\"measured_at\":",
    "\"2026-02-30T25:61:61.000Z\"",
    "\"9999-12-31T23:59:59.999Z\"",
    "\"run\":",
    "\"uid\":",
    "\"finished_at\":null",
    "\"seed\":",
    "null",
    "matmul:",
];

/// Lines by hand for what an export of the sample does not have: a run without a finish
/// time or seed, no trace hash, extra fields.
const HAND_LINES: &[&str] = &[
    r#"{"format":"tensortune.record/1","workload":"matmul:K=8,M=8,N=8,dtype=f32","flops":1024.0,"target":"llvm -mcpu=x","trace":[{"op":"split","stage":0,"iter":0,"factors":[4]}],"result":{"median_s":1e-6,"min_s":9e-7,"max_s":2e-6,"repeats":3},"measured_at":"2026-01-02T03:04:05.678Z","run":{"uid":"abc","started_at":"2026-01-02T03:00:00.000Z","finished_at":null,"tool_version":"tensortune 0.1.0","target":"llvm -mcpu=x","seed":null,"options":""},"extra":{"nested":[1,2]}}"#,
    r#"{"format":"tensortune.record/1","workload":"softmax:M=4,N=9,dtype=f32","flops":0.0,"target":"cuda -arch=sm_90","trace":[],"error":{"kind":"timeout","message":"ran past 10 s"},"measured_at":"2026-01-02T03:04:05Z"}"#,
];

/// Imports `bytes` in lenient mode and checks the report: every line accounted for, every
/// rejection one line naming the source.
fn check(db: &RefCell<Database>, bytes: &[u8]) -> Result<(), String> {
    let source = Path::new("fuzz.jsonl");
    let report = db
        .borrow_mut()
        .import_reader(
            Cursor::new(bytes),
            source,
            &JsonSyntaxValidator,
            ImportMode::Lenient,
        )
        .map_err(|e| format!("a lenient import failed as a whole: {e}"))?;
    let lines = bytes
        .split(|&b| b == b'\n')
        .filter(|l| std::str::from_utf8(l).map_or(true, |t| !t.trim().is_empty()))
        .count();
    if report.lines != lines {
        return Err(format!(
            "{} lines reported, {lines} in the input",
            report.lines
        ));
    }
    let accounted = report.imported + report.duplicates + report.rejected.len();
    if accounted != report.lines {
        return Err(format!(
            "{} lines, but {} imported, {} duplicates, {} rejected",
            report.lines,
            report.imported,
            report.duplicates,
            report.rejected.len()
        ));
    }
    for rejected in &report.rejected {
        one_line(rejected)?;
        if !rejected.to_string().starts_with("fuzz.jsonl:") {
            return Err(format!(
                "a rejection that does not name the source: {rejected}"
            ));
        }
    }
    Ok(())
}

fn export(db: &Database) -> Vec<u8> {
    let mut out = Vec::new();
    db.export_to(&mut out, Path::new("export.jsonl"))
        .expect("export of a fuzzed database");
    out
}

#[test]
fn mutated_lines_import_or_are_rejected_with_one_line() {
    // SQLite syncs every import; on tmpfs that costs nothing.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("temp dir");
    let mut sample = Database::open(dir.path().join("sample.db")).expect("open");
    fill_sample(&mut sample, "fuzz", 0);
    let exported = String::from_utf8(export(&sample)).expect("UTF-8 export");
    let mut seeds: Vec<&str> = exported.lines().collect();
    seeds.extend(HAND_LINES);
    let seeds: Vec<&[u8]> = seeds.iter().map(|s| s.as_bytes()).collect();

    let db = RefCell::new(Database::open(dir.path().join("fuzz.db")).expect("open"));
    Campaign::new("JSON-lines import", &seeds)
        .json()
        .tokens(TOKENS)
        .run(|bytes| check(&db, bytes));

    // Everything accepted round-trips: export, import into a fresh database, export again.
    let fuzzed = db.into_inner();
    let first = export(&fuzzed);
    let mut fresh = Database::open(dir.path().join("fresh.db")).expect("open");
    let report = fresh
        .import_reader(
            Cursor::new(&first),
            Path::new("export.jsonl"),
            &JsonSyntaxValidator,
            ImportMode::Lenient,
        )
        .expect("import of an export");
    let bad: Vec<String> = report
        .rejected
        .iter()
        .map(|e| {
            let line = first.split(|&b| b == b'\n').nth(e.line - 1).unwrap_or(b"");
            format!("{e}\n  b\"{}\"", escape(line))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "exported lines that do not import:\n{}",
        bad.join("\n")
    );
    eprintln!(
        "{} distinct records accepted from the mutated lines",
        report.imported
    );
    assert!(
        report.imported > 300,
        "too few mutated lines were accepted: {report:?}"
    );
    assert_eq!(
        export(&fresh),
        first,
        "export -> import -> export changed the bytes"
    );
}
