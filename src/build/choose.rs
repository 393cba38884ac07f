//! Choosing the program to compile for a workload: the best record that still replays, or the
//! default schedule.
//!
//! Records are tried fastest first. A record is usable when its trace parses, replays on the
//! workload's DAG and lowers; one that does not (a trace from an older version of the schedule
//! language, say) is skipped with a [`ReuseWarning::Stale`] naming it, and the next one is
//! tried. Where none is usable, [`Missing`] decides: the default schedule with a
//! [`ReuseWarning::NoRecord`], or [`ReuseError::NoRecord`].

use super::ReuseError;
use crate::codegen::CodegenOptions;
use std::fmt;
use tensortune_records::Database;
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::lower::{lower_with, LowerOptions};
use tensortune_schedules::ops::WorkloadSpec;
use tensortune_schedules::schedule::State;
use tensortune_schedules::trace::Trace;
use tensortune_schedules::ComputeDag;

/// What to do where a workload has no usable record for the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Missing {
    /// Compile the default schedule (correct, untuned) and warn.
    #[default]
    Fallback,
    /// Fail.
    Error,
}

/// Options of [`crate::Kernel::from_records_with`].
#[derive(Clone, Debug, Default)]
pub struct ReuseOptions {
    /// What a missing record does (default: fall back to the default schedule).
    pub missing: Missing,
    /// Codegen options for the chosen program.
    pub codegen: CodegenOptions,
}

/// Where a compiled program came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A record of the database.
    Record {
        /// Its row id in the database it was read from.
        id: i64,
        /// Its content id (the same in every database holding it).
        uid: String,
        /// Its throughput when it was measured, GFLOP/s.
        gflops: Option<f64>,
    },
    /// The workload's default schedule.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Record { id, gflops, .. } => {
                write!(f, "record #{id}")?;
                if let Some(g) = gflops {
                    write!(f, " ({g:.1} GFLOP/s when measured)")?;
                }
                Ok(())
            }
            Source::Default => f.write_str("default schedule"),
        }
    }
}

/// Something a user should hear about that did not stop the build.
#[derive(Clone, Debug, PartialEq)]
pub enum ReuseWarning {
    /// The database has no record for the target at all: every kernel uses its default
    /// schedule.
    NoTarget {
        /// The target key.
        target: String,
        /// The targets the database has records for.
        available: Vec<String>,
    },
    /// A record was skipped because its trace no longer replays or lowers.
    Stale {
        /// The workload key.
        workload: String,
        /// The record's row id.
        id: i64,
        /// The record's content id.
        uid: String,
        /// Why it was skipped.
        reason: String,
    },
    /// No usable record: the default schedule was compiled.
    NoRecord {
        /// The workload key.
        workload: String,
        /// The target key.
        target: String,
        /// Targets this workload does have records for.
        available: Vec<String>,
    },
}

impl fmt::Display for ReuseWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReuseWarning::NoTarget { target, available } => write!(
                f,
                "the records database has no records for target `{target}` (it has: {}); \
                 using default schedules",
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join("; ")
                }
            ),
            ReuseWarning::Stale {
                workload,
                id,
                uid,
                reason,
            } => write!(
                f,
                "skipping stale record #{id} (uid {}) of `{workload}`: {reason}",
                uid.get(..12).unwrap_or(uid)
            ),
            ReuseWarning::NoRecord {
                workload,
                target,
                available,
            } => {
                write!(
                    f,
                    "no usable record of `{workload}` for target `{target}`: default schedule"
                )?;
                if !available.is_empty() {
                    write!(f, " (it has records for: {})", available.join("; "))?;
                }
                Ok(())
            }
        }
    }
}

/// The program chosen for a workload, lowered, with where it came from.
#[derive(Clone, Debug)]
pub struct Choice {
    /// The workload key.
    pub workload: String,
    /// The schedule state.
    pub state: State,
    /// Its loop IR, named as requested.
    pub func: LoweredFunc,
    /// Where it came from.
    pub source: Source,
    /// What was skipped or fallen back on.
    pub warnings: Vec<ReuseWarning>,
}

/// Chooses the program for `workload` on `target_key`, with the function named `kernel`
/// (the default of the lowering).
pub fn choose(
    db: &Database,
    workload: &WorkloadSpec,
    target_key: &str,
    missing: Missing,
) -> Result<Choice, ReuseError> {
    choose_named(db, workload, target_key, missing, None)
}

/// [`choose`] with the function named `name` (a C identifier).
pub(crate) fn choose_named(
    db: &Database,
    workload: &WorkloadSpec,
    target_key: &str,
    missing: Missing,
    name: Option<&str>,
) -> Result<Choice, ReuseError> {
    let key = workload.canonical();
    let dag = workload.build().map_err(|source| ReuseError::Spec {
        spec: key.clone(),
        source,
    })?;
    choose_dag(db, &key, &dag, target_key, missing, name)
}

/// [`choose`] for a DAG filed under `key` rather than a workload of the op library: what
/// `tune_dags` records a user's own DAG under (a model's layers, say). The function is named
/// `name`, or the lowering's default.
pub fn choose_dag(
    db: &Database,
    key: &str,
    dag: &ComputeDag,
    target_key: &str,
    missing: Missing,
    name: Option<&str>,
) -> Result<Choice, ReuseError> {
    let lopts = LowerOptions {
        name: name.map(str::to_string),
        ..LowerOptions::default()
    };
    let mut warnings: Vec<ReuseWarning> = Vec::new();
    let on_cpu = target_key
        .parse::<tensortune_schedules::target::TargetKey>()
        .is_ok_and(|k| k.kind() == tensortune_schedules::target::TargetKind::Cpu);
    // Every successful record, fastest first: a database holds at most a few thousand per
    // workload and target, and usually the first replays.
    let records = db.best_k(key, target_key, usize::MAX)?;
    for r in &records {
        let usable = Trace::from_json(&r.trace_json)
            .map_err(|e| e.to_string())
            .and_then(|t| t.replay(dag).map_err(|e| e.to_string()))
            .and_then(|state| {
                lower_with(&state, &lopts)
                    .map(|func| (state, func))
                    .map_err(|e| format!("lowering: {e}"))
            })
            .and_then(|(state, func)| {
                // A record filed under a CPU key whose program holds what only a GPU runs (a
                // warp shuffle, from an imported or hand-made trace) would fail to compile
                // after being chosen: skip it here like any other stale record.
                match gpu_only(&func.body) {
                    Some(what) if on_cpu => Err(format!("{what} cannot run on the CPU")),
                    _ => Ok((state, func)),
                }
            });
        match usable {
            Ok((state, func)) => {
                return Ok(Choice {
                    workload: key.to_string(),
                    state,
                    func,
                    source: Source::Record {
                        id: r.id.0,
                        uid: r.uid.clone(),
                        gflops: r.gflops(),
                    },
                    warnings,
                })
            }
            Err(reason) => warnings.push(ReuseWarning::Stale {
                workload: key.to_string(),
                id: r.id.0,
                uid: r.uid.clone(),
                reason,
            }),
        }
    }
    let stale = warnings.len();
    let available: Vec<String> = db
        .targets_of(key)?
        .into_iter()
        .filter(|t| t != target_key || stale > 0)
        .collect();
    if missing == Missing::Error {
        return Err(ReuseError::NoRecord {
            workload: key.to_string(),
            target: target_key.to_string(),
            stale,
            available,
        });
    }
    warnings.push(ReuseWarning::NoRecord {
        workload: key.to_string(),
        target: target_key.to_string(),
        available,
    });
    let threads = target_key
        .parse::<tensortune_schedules::target::TargetKey>()
        .map_or(1, |k| k.threads());
    let mut choice = default_choice_threads(key, dag, name, threads)?;
    choice.warnings = warnings;
    Ok(choice)
}

/// The default schedule of `workload`, lowered, with the function named `name`.
pub(crate) fn default_choice(
    workload: &WorkloadSpec,
    name: Option<&str>,
) -> Result<Choice, ReuseError> {
    let key = workload.canonical();
    let dag = workload.build().map_err(|source| ReuseError::Spec {
        spec: key.clone(),
        source,
    })?;
    default_choice_dag(&key, &dag, name)
}

/// The schedule a workload runs on without a record, on this CPU with `threads` threads:
/// the best the analytic estimate ranks of seeded draws of the CPU sketches
/// ([`tensortune_tuner::sketch::rules::cpu_default_schedule`]; the same on every run on one
/// machine), not the op's loops as written.
pub fn default_cpu_state(dag: &ComputeDag, threads: usize) -> State {
    let desc = crate::codegen::HostTarget::host().desc(threads);
    tensortune_tuner::sketch::rules::cpu_default_schedule(dag, &desc)
}

/// The default schedule of a DAG filed under `key` ([`default_cpu_state`] for one thread),
/// lowered, with the function named `name`.
pub fn default_choice_dag(
    key: &str,
    dag: &ComputeDag,
    name: Option<&str>,
) -> Result<Choice, ReuseError> {
    default_choice_threads(key, dag, name, 1)
}

/// [`default_choice_dag`] for `threads` threads.
pub fn default_choice_threads(
    key: &str,
    dag: &ComputeDag,
    name: Option<&str>,
    threads: usize,
) -> Result<Choice, ReuseError> {
    let lopts = LowerOptions {
        name: name.map(str::to_string),
        ..LowerOptions::default()
    };
    let state = default_cpu_state(dag, threads);
    let func = lower_with(&state, &lopts).map_err(|source| ReuseError::Lower {
        workload: key.to_string(),
        source,
    })?;
    Ok(Choice {
        workload: key.to_string(),
        state,
        func,
        source: Source::Default,
        warnings: Vec::new(),
    })
}

/// What in `s` only a GPU runs: a warp shuffle (the CPU code generator refuses it).
pub(crate) fn gpu_only(s: &tensortune_schedules::ir::Stmt) -> Option<&'static str> {
    use tensortune_schedules::ir::Stmt;
    match s {
        Stmt::Shuffle { .. } => Some("a warp shuffle"),
        Stmt::For { body, .. } | Stmt::Allocate { body, .. } => gpu_only(body),
        Stmt::If {
            then, otherwise, ..
        } => gpu_only(then).or_else(|| otherwise.as_deref().and_then(gpu_only)),
        Stmt::Seq(items) => items.iter().find_map(gpu_only),
        Stmt::Store { .. } | Stmt::Sync | Stmt::Prefetch { .. } => None,
    }
}
