//! JSON-lines export and import, and every kind of bad line.

mod common;

use std::io::Cursor;
use std::path::Path;

use common::*;
use tensortune_records::{
    Database, ImportMode, JsonSyntaxValidator, LineErrorKind, RecordsError, ValidationError,
};

fn import_text(
    db: &mut Database,
    text: &str,
    mode: ImportMode,
) -> tensortune_records::Result<tensortune_records::ImportReport> {
    db.import_reader(
        Cursor::new(text.as_bytes()),
        Path::new("in.jsonl"),
        &FakeSchedules,
        mode,
    )
}

on_both_backends!(export_import_export_is_identical);
fn export_import_export_is_identical(place: &Place) {
    let mut a = Database::open(place.db("a.db")).expect("open");
    fill_sample(&mut a, "a", 0);
    // A record with no run, and a message with quotes, newlines and non-ASCII text.
    let mut odd = failed_record(&matmul(64), GPU, 99, 50);
    odd.outcome = tensortune_records::Outcome::Failed {
        kind: tensortune_records::ErrorKind::Compile,
        message: "nvrtc: \"error\"\n  at line 3 — µ".into(),
    };
    a.insert_batch(None, &[odd]).expect("insert");
    let first = export_string(&a);
    assert_eq!(first.lines().count(), 6);

    let file = place.file("a.jsonl");
    assert_eq!(a.export_file(&file).expect("export file"), 6);
    assert_eq!(std::fs::read_to_string(&file).expect("read"), first);

    let mut b = Database::open(place.db("b.db")).expect("open");
    let report = b
        .import_file(&file, &FakeSchedules, ImportMode::Strict)
        .expect("import");
    assert_eq!(
        (report.lines, report.imported, report.duplicates),
        (6, 6, 0)
    );
    assert!(report.rejected.is_empty());
    assert_eq!(export_string(&b), first);

    // The run travels with its records, and a second import adds nothing.
    assert_eq!(b.runs().expect("runs"), {
        let mut runs = a.runs().expect("runs");
        let b_runs = b.runs().expect("runs");
        runs[0].id = b_runs[0].id;
        runs
    });
    let again = b
        .import_file(&file, &FakeSchedules, ImportMode::Lenient)
        .expect("import");
    assert_eq!((again.imported, again.duplicates), (0, 6));
    assert_eq!(export_string(&b), first);
}

on_both_backends!(every_line_is_self_describing);
fn every_line_is_self_describing(place: &Place) {
    let mut a = Database::open(place.db("a.db")).expect("open");
    fill_sample(&mut a, "a", 0);
    let text = export_string(&a);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        assert_eq!(v["format"], "tensortune.record/1");
        for field in [
            "workload",
            "flops",
            "target",
            "trace",
            "trace_hash",
            "measured_at",
            "run",
        ] {
            assert!(!v[field].is_null(), "{field} in {line}");
        }
        assert!(v["trace"].is_array(), "the trace is JSON, not a string");
        assert!(v["result"].is_object() != v["error"].is_object());
        assert_eq!(v["run"]["tool_version"], "tensortune 0.1.0");
    }
}

on_both_backends!(import_canonicalizes_specs_through_the_validator);
fn import_canonicalizes_specs_through_the_validator(place: &Place) {
    let mut db = Database::open(place.db("a.db")).expect("open");
    let line = format!(
        r#"{{"format":"tensortune.record/1","workload":"matmul:M=8,N=8,K=8","flops":0,"target":"{CPU}","trace":{},"result":{{"median_s":1e-6,"min_s":1e-6,"max_s":2e-6,"repeats":3}},"measured_at":"2026-01-01T00:00:00.000Z"}}"#,
        trace(2)
    );
    let report = import_text(&mut db, &line, ImportMode::Strict).expect("import");
    assert_eq!(report.imported, 1);
    let w = db.workloads().expect("workloads");
    assert_eq!(w[0].workload.key, "matmul:K=8,M=8,N=8,dtype=f32");
    assert_eq!(w[0].workload.flops, 1024.0, "the validator's flops win");
}

/// One good line, then one line of each kind of bad input, then another good line.
fn mixed_file(place: &Place) -> (String, Vec<&'static str>) {
    let mut a = Database::open(place.db("src.db")).expect("open");
    fill_sample(&mut a, "a", 0);
    let good = export_string(&a);
    let mut lines: Vec<String> = good.lines().map(String::from).collect();
    let second_good = lines.pop().expect("lines");
    lines.truncate(1);
    let template = lines[0].clone();
    // Edits are made on the text: re-serializing through serde_json::Value would reorder
    // the trace's keys and change its hash.
    let edit = |from: &str, to: &str| {
        assert!(template.contains(from), "{from} in {template}");
        template.replacen(from, to, 1)
    };
    let workload = r#""workload":"matmul:K=128,M=128,N=128,dtype=f32""#;
    let hash = template
        .split(r#""trace_hash":""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a trace hash")
        .to_string();
    let mut expected = Vec::new();
    // 2: malformed JSON.
    lines.push("{\"format\": tensortune".into());
    expected.push("malformed");
    // 3: unknown op.
    lines.push(edit(workload, r#""workload":"conv9d:N=1""#));
    expected.push("unknown op");
    // 4: a trace that does not replay (its hash left out, so only replay can fail).
    lines.push(
        edit(r#""stage":0,"loop":0"#, r#""stage":3,"loop":0"#).replacen(
            &format!(r#""trace_hash":"{hash}","#),
            "",
            1,
        ),
    );
    expected.push("replay");
    // 5: a hand-edited trace whose hash no longer matches.
    lines.push(edit(r#""stage":0,"loop":0"#, r#""stage":0,"loop":1"#));
    expected.push("remove its trace_hash");
    // 6: another format.
    lines.push(edit("tensortune.record/1", "tensortune.record/9"));
    expected.push("unsupported record format");
    // 7: both a result and an error.
    lines.push(edit(
        r#""measured_at""#,
        r#""error":{"kind":"other","message":"x"},"measured_at""#,
    ));
    expected.push("exactly one");
    // 8: a bad timestamp.
    lines.push(edit(
        r#""measured_at":"2026"#,
        r#""measured_at":"yesterday"#,
    ));
    expected.push("timestamp");
    // 9: a bad spec for a known op.
    lines.push(edit(workload, r#""workload":"matmul:M=8""#));
    expected.push("bad workload spec");
    // 10: blank, skipped.
    lines.push(String::new());
    // 11: good.
    lines.push(second_good);
    // 12: truncated, as a killed writer leaves it.
    let cut = &template[..template.len() / 2];
    lines.push(cut.to_string());
    expected.push("truncated");
    (lines.join("\n"), expected)
}

on_both_backends!(lenient_import_keeps_good_lines_and_names_each_bad_one);
fn lenient_import_keeps_good_lines_and_names_each_bad_one(place: &Place) {
    let (text, expected) = mixed_file(place);
    let mut db = Database::open(place.db("dst.db")).expect("open");
    let report = import_text(&mut db, &text, ImportMode::Lenient).expect("import");
    assert_eq!(report.imported, 2);
    assert_eq!(report.lines, 11);
    let lines: Vec<usize> = report.rejected.iter().map(|e| e.line).collect();
    assert_eq!(lines, vec![2, 3, 4, 5, 6, 7, 8, 9, 12]);
    for (error, want) in report.rejected.iter().zip(&expected) {
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("in.jsonl:{}: ", error.line)),
            "{text}"
        );
        assert!(text.contains(want), "{text:?} should mention {want:?}");
    }
    assert!(matches!(
        report.rejected[1].kind,
        LineErrorKind::Validation(ValidationError::UnknownOp { .. })
    ));
    assert!(matches!(
        report.rejected[2].kind,
        LineErrorKind::Validation(ValidationError::DoesNotReplay { .. })
    ));
    assert_eq!(db.count().expect("count"), 2);
}

on_both_backends!(strict_import_imports_nothing_and_reports_every_bad_line);
fn strict_import_imports_nothing_and_reports_every_bad_line(place: &Place) {
    let (text, expected) = mixed_file(place);
    let mut db = Database::open(place.db("dst.db")).expect("open");
    let err = import_text(&mut db, &text, ImportMode::Strict).expect_err("strict");
    match &err {
        RecordsError::ImportRejected { errors } => assert_eq!(errors.len(), expected.len()),
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("in.jsonl:12:"), "{err}");
    assert!(err.is_user_error());
    assert_eq!(db.count().expect("count"), 0);
}

#[test]
fn non_utf8_lines_are_rejected_by_line() {
    let dir = temp_dir();
    let mut db = Database::open(db_path(&dir, "dst.db")).expect("open");
    let bytes: &[u8] = b"\n\xff\xfe{}\n";
    let report = db
        .import_reader(
            Cursor::new(bytes),
            Path::new("x.jsonl"),
            &JsonSyntaxValidator,
            ImportMode::Lenient,
        )
        .expect("import");
    assert_eq!(report.rejected.len(), 1);
    assert_eq!(report.rejected[0].line, 2);
    assert_eq!(report.rejected[0].kind, LineErrorKind::NotUtf8);
}

#[test]
fn a_missing_import_file_names_the_file() {
    let dir = temp_dir();
    let mut db = Database::open(db_path(&dir, "dst.db")).expect("open");
    let err = db
        .import_file(
            dir.path().join("nope.jsonl"),
            &JsonSyntaxValidator,
            ImportMode::Lenient,
        )
        .expect_err("missing");
    assert!(err.to_string().contains("nope.jsonl"), "{err}");
    assert!(err.is_user_error());
}

on_both_backends!(impossible_timings_are_rejected_on_import);
fn impossible_timings_are_rejected_on_import(place: &Place) {
    let mut src = Database::open(place.db("src.db")).expect("open");
    let w = matmul(512);
    src.insert_batch(None, &[ok_record(&w, CPU, 4, 1e-3, 0)])
        .expect("insert");
    let line = export_string(&src);
    // Zero, a denormal-scale time, a negative one, and one that claims 2.7e17 FLOP/s.
    let forged: Vec<String> = [0.0, 1e-300, -1.0, 1e-9]
        .iter()
        .map(|&t| {
            let mut v: serde_json::Value = serde_json::from_str(line.trim()).expect("json");
            v["result"]["median_s"] = t.into();
            v["result"]["min_s"] = t.into();
            // Re-serializing may reorder the trace's keys, which changes its hash.
            if let Some(o) = v.as_object_mut() {
                o.remove("trace_hash");
            }
            format!("{v}\n")
        })
        .collect();
    let mut db = Database::open(place.db("into.db")).expect("open");
    let report = import_text(&mut db, &forged.concat(), ImportMode::Lenient).expect("import");
    assert_eq!(report.imported, 0, "{report:?}");
    assert_eq!(report.rejected.len(), 4, "{report:?}");
    assert!(
        matches!(
            report.rejected[3].kind,
            LineErrorKind::Invalid(tensortune_records::InvalidReason::ImpossiblyFast { .. })
        ),
        "{:?}",
        report.rejected[3]
    );
    assert_eq!(db.count().expect("count"), 0);
}

/// Found by `fuzz_jsonl`: a `trace_hash` holding a line break was quoted as written, so the
/// rejection took two lines.
#[test]
fn a_bad_trace_hash_is_quoted_on_one_line() {
    let dir = temp_dir();
    let mut db = Database::open(db_path(&dir, "dst.db")).expect("open");
    let line = r#"{"format":"tensortune.record/1","workload":"matmul:M=1","flops":2.0,"target":"t","trace":[],"trace_hash":"ab\ncd","error":{"kind":"other","message":""},"measured_at":"2026-01-01T00:00:00.000Z"}"#;
    let report = import_text(&mut db, line, ImportMode::Lenient).expect("import");
    assert_eq!(report.rejected.len(), 1);
    assert!(matches!(
        report.rejected[0].kind,
        LineErrorKind::HashMismatch { .. }
    ));
    let message = report.rejected[0].to_string();
    assert!(
        message.contains(r#"trace_hash "ab\ncd" does not match"#),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
}
