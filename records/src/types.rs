//! The values that go into and come out of the database.
//!
//! Workloads and targets are named by their canonical key strings; traces are JSON text.
//! Times are seconds (`f64`) for latencies and [`Timestamp`]s for instants.

use std::fmt;
use std::str::FromStr;

use crate::error::InvalidReason;
use crate::time::Timestamp;
use crate::validate::op_name;

/// Row id of a run in one database. Ids are local: the same run has another id in another
/// database (its [`RunInfo::uid`] is the same everywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(pub i64);

/// Row id of a record in one database (local, like [`RunId`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId(pub i64);

/// A workload as records know it: its key and its work.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The canonical spec (keys sorted, defaults filled), e.g.
    /// `matmul:K=1024,M=1024,N=1024,dtype=f32`. Records match workloads by this exact text.
    pub key: String,
    /// Floating-point operations of one execution; GFLOP/s is `flops / median_s / 1e9`.
    pub flops: f64,
}

impl Workload {
    /// A workload from its canonical key and FLOPs.
    pub fn new(key: impl Into<String>, flops: f64) -> Workload {
        Workload {
            key: key.into(),
            flops,
        }
    }

    pub(crate) fn check(&self) -> Result<(), InvalidReason> {
        match op_name(&self.key) {
            Some(op) if !op.is_empty() => {}
            _ => return Err(InvalidReason::BadWorkloadKey(self.key.clone())),
        }
        if !self.flops.is_finite() || self.flops < 0.0 {
            return Err(InvalidReason::BadFlops(self.flops));
        }
        Ok(())
    }
}

/// How a failed measurement failed. Stored as the lower-case name in `records.error_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The candidate did not compile (lowering, codegen, NVRTC).
    Compile,
    /// It compiled but crashed or reported an error while running.
    Runtime,
    /// It ran past the measurement time limit.
    Timeout,
    /// It ran but its output differed from the reference.
    WrongResult,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Every kind, in the order of the `CHECK` constraint of the schema.
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::Compile,
        ErrorKind::Runtime,
        ErrorKind::Timeout,
        ErrorKind::WrongResult,
        ErrorKind::Other,
    ];

    /// The stored name: `compile`, `runtime`, `timeout`, `wrong_result` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Compile => "compile",
            ErrorKind::Runtime => "runtime",
            ErrorKind::Timeout => "timeout",
            ErrorKind::WrongResult => "wrong_result",
            ErrorKind::Other => "other",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`ErrorKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error kind {0:?} (expected compile, runtime, timeout, wrong_result or other)")]
pub struct UnknownErrorKind(pub String);

impl FromStr for ErrorKind {
    type Err = UnknownErrorKind;

    fn from_str(s: &str) -> Result<ErrorKind, UnknownErrorKind> {
        ErrorKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownErrorKind(s.to_string()))
    }
}

/// The timing of a successful measurement, in seconds per execution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Median over the repeats; what "best" ranks by.
    pub median_s: f64,
    /// Fastest repeat.
    pub min_s: f64,
    /// Slowest repeat.
    pub max_s: f64,
    /// Number of timed repeats (each of which may average several runs).
    pub repeats: u32,
}

/// No kernel call returns in less than this (seconds): a tenth of a nanosecond is under one
/// clock cycle of any processor, and the call alone costs several. A stored or imported time
/// below it was not measured.
pub const MIN_LATENCY_S: f64 = 1e-10;

/// No measured kernel call takes longer than this (seconds): a day, far past every timeout of
/// the measurers. A stored or imported time above it was not measured (a value of 1e308 had
/// readers print a 300-digit latency).
pub const MAX_LATENCY_S: f64 = 86_400.0;

/// The most floating-point operations per second any record may claim, whatever its target:
/// 10 PFLOP/s, about a hundred times the fp32 peak of the fastest single accelerator. A
/// validator that knows the target bounds it tighter ([`crate::RecordValidator::max_flops_per_s`]).
pub const MAX_FLOPS_PER_S: f64 = 1e16;

impl Timing {
    /// Checks that the times could have been measured: finite, at least [`MIN_LATENCY_S`],
    /// `min_s <= median_s <= max_s`, at least one repeat.
    pub fn check(&self) -> Result<(), InvalidReason> {
        let all_possible = [self.median_s, self.min_s, self.max_s]
            .iter()
            .all(|t| t.is_finite() && (MIN_LATENCY_S..=MAX_LATENCY_S).contains(t));
        if !all_possible {
            return Err(InvalidReason::BadTiming(format!(
                "times must be {MIN_LATENCY_S:e} to {MAX_LATENCY_S} s, got {self:?}"
            )));
        }
        if !(self.min_s <= self.median_s && self.median_s <= self.max_s) {
            return Err(InvalidReason::BadTiming(format!(
                "expected min_s <= median_s <= max_s, got {self:?}"
            )));
        }
        if self.repeats == 0 {
            return Err(InvalidReason::BadTiming(
                "repeats must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// [`Timing::check`], and that `flops` in `median_s` is at most `max_flops_per_s`.
    pub fn check_plausible(&self, flops: f64, max_flops_per_s: f64) -> Result<(), InvalidReason> {
        self.check()?;
        if flops > self.median_s * max_flops_per_s {
            return Err(InvalidReason::ImpossiblyFast {
                median_s: self.median_s,
                flops_per_s: flops / self.median_s,
                limit: max_flops_per_s,
            });
        }
        Ok(())
    }
}

/// What a measurement produced: a timing, or an error.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The candidate ran and was correct.
    Measured(Timing),
    /// The candidate failed; it stays in the database so that it is not measured again.
    Failed {
        /// How it failed.
        kind: ErrorKind,
        /// The message for a person (compiler output, panic text...).
        message: String,
    },
}

impl Outcome {
    /// The timing, when the measurement succeeded.
    pub fn timing(&self) -> Option<&Timing> {
        match self {
            Outcome::Measured(t) => Some(t),
            Outcome::Failed { .. } => None,
        }
    }
}

/// A measurement to insert. The strings are taken as they are: the caller canonicalizes the
/// workload key; the trace is any JSON text (stored without insignificant whitespace).
#[derive(Debug, Clone, PartialEq)]
pub struct NewRecord {
    /// The workload measured.
    pub workload: Workload,
    /// The target key, e.g. `llvm -mcpu=znver4 -mattr=+avx512f -threads=1`.
    pub target: String,
    /// The schedule trace, as JSON text.
    pub trace_json: String,
    /// The result.
    pub outcome: Outcome,
    /// When it was measured.
    pub measured_at: Timestamp,
}

impl NewRecord {
    /// A successful measurement taken now.
    pub fn measured(
        workload: Workload,
        target: impl Into<String>,
        trace_json: impl Into<String>,
        timing: Timing,
    ) -> NewRecord {
        NewRecord {
            workload,
            target: target.into(),
            trace_json: trace_json.into(),
            outcome: Outcome::Measured(timing),
            measured_at: Timestamp::now(),
        }
    }

    /// A failed measurement taken now.
    pub fn failed(
        workload: Workload,
        target: impl Into<String>,
        trace_json: impl Into<String>,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> NewRecord {
        NewRecord {
            workload,
            target: target.into(),
            trace_json: trace_json.into(),
            outcome: Outcome::Failed {
                kind,
                message: message.into(),
            },
            measured_at: Timestamp::now(),
        }
    }
}

/// A record read back from the database.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Local row id.
    pub id: RecordId,
    /// Content id: the same measurement has the same uid in every database (it is what
    /// import and merge deduplicate on).
    pub uid: String,
    /// The workload measured.
    pub workload: Workload,
    /// The target key.
    pub target: String,
    /// The trace, as stored (compact JSON text).
    pub trace_json: String,
    /// SHA-256 of `trace_json`, lower-case hex.
    pub trace_hash: String,
    /// The result.
    pub outcome: Outcome,
    /// When it was measured.
    pub measured_at: Timestamp,
    /// The run that measured it, if known.
    pub run: Option<RunId>,
}

impl Record {
    /// Throughput of a successful record in GFLOP/s (`None` for failures or a zero time).
    pub fn gflops(&self) -> Option<f64> {
        let t = self.outcome.timing()?;
        (t.median_s > 0.0).then(|| self.workload.flops / t.median_s / 1e9)
    }
}

/// What a new tuning run states about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// Version of the tool that measures, e.g. `tensortune 0.1.0`.
    pub tool_version: String,
    /// The target key the run measures on.
    pub target: String,
    /// The seed that fixes the run's random choices, if it has one.
    pub seed: Option<u64>,
    /// The command line or the options (JSON of `TuneOptions`), as text.
    pub options: String,
    /// The plan and shard the run tunes, when it tunes one.
    pub plan: Option<RunPlan>,
}

/// Which plan, and which shard of it, a run tuned (`tensortune tune --plan FILE --shard I/N`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunPlan {
    /// The plan's content id (the `id` of the plan file).
    pub id: String,
    /// The shard, `0 <= shard < shards`.
    pub shard: u32,
    /// How many shards the plan was split into.
    pub shards: u32,
}

/// A plan as a database keeps it: the plan file of a run it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPlan {
    /// The plan's content id.
    pub id: String,
    /// When the first run of the plan wrote it here.
    pub created_at: Timestamp,
    /// The plan file's JSON, as the run read it.
    pub body: String,
}

/// The records that runs of one plan measured for one workload on one target.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanProgress {
    /// The workload key.
    pub workload: String,
    /// The target key.
    pub target: String,
    /// Records measured by runs of the plan, failures included.
    pub records: u64,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// Local row id.
    pub id: RunId,
    /// Global id of the run, the same in every database the run's records reach.
    pub uid: String,
    /// When the run began.
    pub started_at: Timestamp,
    /// When it finished; `None` while it runs or when it was killed.
    pub finished_at: Option<Timestamp>,
    /// Version of the tool that measured.
    pub tool_version: String,
    /// The target key.
    pub target: String,
    /// The seed. Seeds above `i64::MAX` are stored as their two's-complement `INTEGER`.
    pub seed: Option<u64>,
    /// Command line or options.
    pub options: String,
    /// How many records of this database point to the run.
    pub records: u64,
    /// The plan and shard the run tuned, if any.
    pub plan: Option<RunPlan>,
}

/// A workload as listed by [`crate::Database::workloads`].
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadInfo {
    /// Key and FLOPs.
    pub workload: Workload,
    /// The op name (the part of the key before `:`).
    pub op: String,
    /// How many records it has, over all targets.
    pub records: u64,
}

/// One line of the per-(workload, target) overview printed by `tensortune records`.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The workload.
    pub workload: Workload,
    /// The target key.
    pub target: String,
    /// All records (trials), failures included.
    pub trials: u64,
    /// Failed records.
    pub errors: u64,
    /// Smallest median latency of the successful records, seconds.
    pub best_s: Option<f64>,
}

impl Summary {
    /// GFLOP/s of the best record.
    pub fn best_gflops(&self) -> Option<f64> {
        let t = self.best_s?;
        let flops = self.workload.flops;
        (t > 0.0 && flops.is_finite() && flops > 0.0).then(|| flops / t / 1e9)
    }
}
