//! Content hashes: of traces (for dedupe and resume), of records and of runs (for merge).
//!
//! All are SHA-256 in lower-case hex. A trace is hashed as its stored text, which is the JSON
//! the caller gave with insignificant whitespace removed ([`compact_json`]): the schedule
//! crate's `serde_json::to_string` output is already compact, so its hash is the hash of
//! exactly that text. Key order is kept, not sorted, so the text in the database is the text
//! the schedule crate wrote.

use sha2::{Digest, Sha256};

use crate::time::Timestamp;
use crate::types::{Outcome, Workload};

/// SHA-256 of `text`, lower-case hex.
pub fn sha256_hex(text: &str) -> String {
    sha256_hex_bytes(text.as_bytes())
}

/// SHA-256 of `bytes` (a model file, say), lower-case hex.
pub fn sha256_hex_bytes(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        hex.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        hex.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    hex
}

/// The trace hash of a stored (compact) trace text.
pub fn trace_hash(trace_json: &str) -> String {
    sha256_hex(trace_json)
}

/// `json` without whitespace outside strings. The input must be valid JSON (checked before);
/// JSON allows whitespace only between tokens and two value tokens never touch, so removing it
/// keeps the meaning and the key order. The result has no line breaks, so it fits on one
/// JSON-lines line.
pub fn compact_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

/// The content id of a record: equal exactly when workload key, target, trace, outcome,
/// measurement time and run are equal. Floats enter by their bits, so no rounding merges two
/// measurements.
pub(crate) fn record_uid(
    workload: &Workload,
    target: &str,
    trace_hash: &str,
    outcome: &Outcome,
    measured_at: Timestamp,
    run_uid: Option<&str>,
) -> String {
    // A JSON array is an unambiguous encoding of the field list (strings are quoted and
    // escaped), so two different records cannot produce the same text.
    let outcome_fields = match outcome {
        Outcome::Measured(t) => serde_json::json!([
            "ok",
            t.median_s.to_bits(),
            t.min_s.to_bits(),
            t.max_s.to_bits(),
            t.repeats
        ]),
        Outcome::Failed { kind, message } => serde_json::json!(["err", kind.as_str(), message]),
    };
    let fields = serde_json::json!([
        "record/1",
        workload.key,
        target,
        trace_hash,
        measured_at.unix_ms(),
        run_uid,
        outcome_fields
    ]);
    sha256_hex(&fields.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_abc() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn compact_keeps_strings_and_order() {
        let text = "{ \"b\" : [1, 2],\n  \"a\": \"x y\\\" z\\\\\" ,\r\n\"c\":{} }";
        assert_eq!(compact_json(text), r#"{"b":[1,2],"a":"x y\" z\\","c":{}}"#);
        let compact = r#"[{"Split":{"stage":0,"factors":[4,8]}}]"#;
        assert_eq!(compact_json(compact), compact);
    }
}
