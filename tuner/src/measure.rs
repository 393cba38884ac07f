//! The measurement interface between the search and the machines it tunes for.
//!
//! The tuner never compiles or runs code itself: it hands a batch of candidate schedules of
//! one workload to a [`Measurer`] and gets one [`MeasureResult`] per candidate, in order.
//! The root crate implements it for the host CPU (`tensortune::measure::CpuMeasurer`); tests
//! of the search implement it with a simulated cost.
//!
//! A failed candidate is an ordinary result ([`MeasureError`], with a [`MeasureErrorKind`] the
//! search can act on), never the end of a run: the search records it and moves on.

use serde::{Deserialize, Serialize};
use tensortune_schedules::schedule::State;
use tensortune_schedules::ComputeDag;

/// Timings of one candidate that ran and passed the correctness check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Median over `repeats` of the seconds per run.
    pub median_s: f64,
    /// Standard deviation of `repeats`, in seconds.
    pub spread_s: f64,
    /// Seconds per run of each timing (each the mean of `number` back-to-back runs).
    pub repeats: Vec<f64>,
    /// Runs per timing, grown until one timing lasted the measurer's minimum.
    pub number: u64,
    /// The candidate was so much slower than the cutoff (see [`Measurer::set_cutoff`]) that
    /// it was timed once, not `repeat` times: `repeats` holds that single time.
    #[serde(default)]
    pub cut_short: bool,
    /// Seconds spent checking: preparing the output buffers of the first run and comparing
    /// them with the reference (0 where the measurer does not report it).
    #[serde(default)]
    pub check_s: f64,
    /// Seconds of the candidate's first run, the one whose outputs are checked; it is also
    /// the first warm-up run and the first look at a hopeless candidate (0 where the
    /// measurer does not report it).
    #[serde(default)]
    pub first_s: f64,
}

impl Timing {
    /// Builds the summary of per-run times (one per timing); `None` if `repeats` is empty.
    pub fn from_repeats(repeats: Vec<f64>, number: u64) -> Option<Timing> {
        if repeats.is_empty() {
            return None;
        }
        let mut sorted = repeats.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let n = sorted.len();
        let median_s = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        Some(Timing {
            median_s,
            spread_s: var.sqrt(),
            repeats,
            number,
            cut_short: false,
            check_s: 0.0,
            first_s: 0.0,
        })
    }
}

/// What went wrong with a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum MeasureErrorKind {
    /// The schedule did not lower to loop IR.
    Lower,
    /// The backend could not compile the loop IR.
    Compile,
    /// The program crashed (a signal) or reported a failure while running.
    Runtime,
    /// The program ran past the time limit and was stopped.
    Timeout,
    /// The program's output differs from the reference beyond the tolerance.
    WrongResult,
    /// The measurer itself failed (no reference, no child process...).
    Internal,
}

impl MeasureErrorKind {
    /// Lower-case name, for records and messages.
    pub fn name(self) -> &'static str {
        match self {
            MeasureErrorKind::Lower => "lower",
            MeasureErrorKind::Compile => "compile",
            MeasureErrorKind::Runtime => "runtime",
            MeasureErrorKind::Timeout => "timeout",
            MeasureErrorKind::WrongResult => "wrong_result",
            MeasureErrorKind::Internal => "internal",
        }
    }
}

/// A failed candidate: the kind, and a message for a person.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", kind.name())]
pub struct MeasureError {
    /// What went wrong.
    pub kind: MeasureErrorKind,
    /// Details (the lowering or compiler error, the signal, the worst difference...).
    pub message: String,
}

impl MeasureError {
    /// An error of `kind`.
    pub fn new(kind: MeasureErrorKind, message: impl Into<String>) -> MeasureError {
        MeasureError {
            kind,
            message: message.into(),
        }
    }
}

/// The outcome for one candidate.
pub type MeasureResult = Result<Timing, MeasureError>;

/// Where a measurer's time went, summed since it was made (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasureStats {
    /// Lowering and compiling candidates (wall time, builds run in parallel).
    pub compile_s: f64,
    /// Running candidates: the first (checked) run, warm-up and timings, the checking, and
    /// process isolation.
    pub run_s: f64,
    /// Of `run_s`, checking the first run's outputs (see [`Timing::check_s`]).
    pub check_s: f64,
    /// Of `run_s`, the first runs (see [`Timing::first_s`]).
    #[serde(default)]
    pub first_run_s: f64,
}

/// Measures candidate schedules of one workload on some machine.
pub trait Measurer {
    /// Measures `candidates`, all schedules of `dag`; returns one result per candidate, in
    /// order. Implementations check each candidate's output against a reference before its
    /// time counts.
    fn measure(&mut self, dag: &ComputeDag, candidates: &[State]) -> Vec<MeasureResult>;

    /// The target key results are filed under (e.g. `llvm -mcpu=znver4 ... -threads=1`).
    fn target_key(&self) -> String;

    /// Candidates whose first run takes longer than `factor` times the best time per run so
    /// far (`best_s`, or a faster candidate earlier in the same batch) are hopeless: time them
    /// once and report that single time (with [`Timing::cut_short`]) instead of timing them
    /// `repeat` times, so they do not eat the tuning budget. A factor of 0 times every
    /// candidate fully. The default ignores the setting.
    fn set_cutoff(&mut self, _best_s: Option<f64>, _factor: f64) {}

    /// Time spent so far, by phase; zero where the measurer does not keep it.
    fn stats(&self) -> MeasureStats {
        MeasureStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_summary() {
        let t = Timing::from_repeats(vec![3.0, 1.0, 2.0], 4).expect("non-empty");
        assert_eq!(t.median_s, 2.0);
        assert!((t.spread_s - (2.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(
            Timing::from_repeats(vec![1.0, 2.0], 1).map(|t| t.median_s),
            Some(1.5)
        );
        assert!(Timing::from_repeats(vec![], 1).is_none());
        let e = MeasureError::new(MeasureErrorKind::Timeout, "ran 10 s");
        assert_eq!(e.to_string(), "timeout: ran 10 s");
    }
}
