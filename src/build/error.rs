//! [`ReuseError`]: why records could not be turned into a kernel or a library.

use crate::codegen::CodegenError;
use std::path::PathBuf;
use tensortune_records::RecordsError;
use tensortune_schedules::lower::LowerError;
use tensortune_schedules::ops::SpecError;

/// Why compile-time reuse failed. Every variant names what the user can act on: the
/// workload, the target, the database and, where the database has other targets, those.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReuseError {
    /// A workload spec did not parse or build.
    #[error("workload `{spec}`: {source}")]
    Spec {
        /// The spec as given.
        spec: String,
        /// Why.
        source: SpecError,
    },
    /// The records database could not be opened or read.
    #[error(transparent)]
    Records(#[from] RecordsError),
    /// The database has no record at all for the target the build states.
    #[error(
        "{}: no records for target `{target}`; the database has records for {}. \
         Name one of those targets, or ask for fallback to default schedules",
        db.display(), list(available)
    )]
    NoTarget {
        /// The database.
        db: PathBuf,
        /// The target asked for.
        target: String,
        /// The targets the database has records for.
        available: Vec<String>,
    },
    /// No usable record of a workload for the target, and fallback was not asked for.
    #[error(
        "no usable record of `{workload}` for target `{target}`{}; the workload has records \
         for {}. Ask for fallback to use its default schedule",
        if *stale > 0 { format!(" ({stale} stale records skipped)") } else { String::new() },
        list(available)
    )]
    NoRecord {
        /// The workload key.
        workload: String,
        /// The target asked for.
        target: String,
        /// Records of this workload and target whose traces did not replay.
        stale: usize,
        /// The targets this workload has records for.
        available: Vec<String>,
    },
    /// The stated target is not a target key this build can generate code for.
    #[error("target `{target}`: {reason}")]
    Target {
        /// The target key as stated.
        target: String,
        /// Why it cannot be built for.
        reason: String,
    },
    /// Two workloads would get the same function name.
    #[error("workloads `{first}` and `{second}` both name the function `{name}`")]
    DuplicateName {
        /// The function name.
        name: String,
        /// The first workload.
        first: String,
        /// The second workload.
        second: String,
    },
    /// The default schedule of a workload did not lower (a bug in lowering).
    #[error("workload `{workload}`: lowering its default schedule: {source}")]
    Lower {
        /// The workload key.
        workload: String,
        /// Why.
        source: LowerError,
    },
    /// The backend failed on a chosen program.
    #[error("codegen: {0}")]
    Codegen(#[from] CodegenError),
    /// A model given to the build could not be read, imported or laid out.
    #[error("model {}: {reason}", path.display())]
    Model {
        /// The model file.
        path: PathBuf,
        /// Why.
        reason: String,
        /// Whether the model (rather than something inside) is at fault.
        user: bool,
    },
    /// Writing an output file failed.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        message: String,
    },
}

impl ReuseError {
    /// True where the person running the build can fix it (a bad spec, a missing database,
    /// a target the database lacks), false where something inside failed.
    pub fn is_user_error(&self) -> bool {
        match self {
            ReuseError::Records(e) => e.is_user_error(),
            ReuseError::Spec { .. }
            | ReuseError::NoTarget { .. }
            | ReuseError::NoRecord { .. }
            | ReuseError::Target { .. }
            | ReuseError::DuplicateName { .. }
            | ReuseError::Io { .. } => true,
            ReuseError::Model { user, .. } => *user,
            ReuseError::Lower { .. } | ReuseError::Codegen(_) => false,
        }
    }
}

/// `none`, or the targets in backquotes, comma-separated.
fn list(targets: &[String]) -> String {
    if targets.is_empty() {
        "no target at all".into()
    } else {
        targets
            .iter()
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
