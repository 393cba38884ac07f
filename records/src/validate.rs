//! Checking records that come from outside (an imported file) against the op library.
//!
//! The records crate knows workloads and traces only as text, so it cannot tell whether
//! `conv9d:N=1` is an op or whether a trace replays on its workload. The crate that can (the
//! root crate, through the schedule crate) implements [`RecordValidator`] and hands it to
//! [`crate::Database::import_file`]. [`JsonSyntaxValidator`] is the permissive default: it
//! checks the shape of the spec and the JSON syntax of the trace, nothing more.

/// A workload as the validator understands it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidWorkload {
    /// The canonical spec, which is the workload key (keys sorted, defaults filled), e.g.
    /// `matmul:K=1024,M=1024,N=1024,dtype=f32`.
    pub key: String,
    /// Floating-point operations of one execution, when the validator can compute them;
    /// `None` keeps the number written in the record.
    pub flops: Option<f64>,
}

/// Why a validator rejected a record. Cheap to construct: plain strings, no rendering.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// The spec names an op the library does not have.
    #[error("unknown op {op:?}")]
    UnknownOp {
        /// The name before the `:`.
        op: String,
    },
    /// The spec does not parse (missing key, bad value, unknown key).
    #[error("bad workload spec {spec:?}: {message}")]
    BadSpec {
        /// The spec as written.
        spec: String,
        /// What the parser said.
        message: String,
    },
    /// The trace is JSON but not a trace (wrong shape).
    #[error("the trace is not a schedule trace: {message}")]
    BadTrace {
        /// What the deserializer said.
        message: String,
    },
    /// The trace is a trace but does not replay on the workload's DAG.
    #[error("the trace does not replay on {workload}: {message}")]
    DoesNotReplay {
        /// The canonical workload key.
        workload: String,
        /// The schedule error of the failing step.
        message: String,
    },
}

/// Decides whether a record read from outside the database may go in.
pub trait RecordValidator {
    /// Checks `spec` (as written in the record) and `trace_json` (the trace as JSON text)
    /// and returns the workload under its canonical key.
    fn check(&self, spec: &str, trace_json: &str) -> Result<ValidWorkload, ValidationError>;

    /// The most FLOP/s a record of `target` may claim; a faster timing is rejected as
    /// impossible. The default is the target-blind [`crate::types::MAX_FLOPS_PER_S`].
    fn max_flops_per_s(&self, _target: &str) -> f64 {
        crate::types::MAX_FLOPS_PER_S
    }
}

/// Checks a record read from outside the database (an imported line, a merged row) as
/// [`crate::Database::insert_batch`] checks its own, and its timing against the target's
/// limit: the record with its workload under the validator's canonical key.
pub(crate) fn check_foreign(
    mut record: crate::NewRecord,
    validator: &dyn RecordValidator,
) -> Result<crate::NewRecord, crate::LineErrorKind> {
    let valid = validator.check(&record.workload.key, &record.trace_json)?;
    record.workload.key = valid.key;
    if let Some(flops) = valid.flops {
        record.workload.flops = flops;
    }
    crate::db::check_new_record(&record)?;
    if let crate::Outcome::Measured(t) = &record.outcome {
        t.check_plausible(
            record.workload.flops,
            validator.max_flops_per_s(&record.target),
        )?;
    }
    Ok(record)
}

/// The permissive validator: the spec must look like `NAME:...` with a non-empty name of
/// letters, digits and underscores, and the trace must be JSON. The spec is kept as written
/// and the record's own FLOPs are kept.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonSyntaxValidator;

impl RecordValidator for JsonSyntaxValidator {
    fn check(&self, spec: &str, trace_json: &str) -> Result<ValidWorkload, ValidationError> {
        let spec = spec.trim();
        let op = op_name(spec).ok_or_else(|| ValidationError::BadSpec {
            spec: spec.to_string(),
            message: "expected NAME:KEY=VALUE,...".to_string(),
        })?;
        if op.is_empty() {
            return Err(ValidationError::BadSpec {
                spec: spec.to_string(),
                message: "empty op name".to_string(),
            });
        }
        serde_json::from_str::<serde::de::IgnoredAny>(trace_json).map_err(|e| {
            ValidationError::BadTrace {
                message: e.to_string(),
            }
        })?;
        Ok(ValidWorkload {
            key: spec.to_string(),
            flops: None,
        })
    }
}

/// The op name of a workload key (`matmul` for `matmul:M=1,...`), or `None` when the key has
/// no `:` or the name has characters other than ASCII letters, digits and `_`.
pub fn op_name(key: &str) -> Option<&str> {
    let (op, _) = key.split_once(':')?;
    op.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
        .then_some(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_name_takes_the_prefix() {
        assert_eq!(op_name("matmul:M=1,N=2"), Some("matmul"));
        assert_eq!(op_name("batch_matmul:B=2"), Some("batch_matmul"));
        assert_eq!(op_name("matmul"), None);
        assert_eq!(op_name("mat mul:M=1"), None);
    }

    #[test]
    fn permissive_validator_checks_syntax_only() {
        let v = JsonSyntaxValidator;
        let ok = v.check(" matmul:M=1 ", "[1,2]").expect("valid");
        assert_eq!(ok.key, "matmul:M=1");
        assert!(matches!(
            v.check("matmul", "[]"),
            Err(ValidationError::BadSpec { .. })
        ));
        assert!(matches!(
            v.check(":M=1", "[]"),
            Err(ValidationError::BadSpec { .. })
        ));
        assert!(matches!(
            v.check("matmul:M=1", "[1,"),
            Err(ValidationError::BadTrace { .. })
        ));
    }
}
