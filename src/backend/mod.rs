//! Backends: what a machine brings to tuning, behind one interface.
//!
//! A [`Backend`] is its target key and description, its sketch rules, a compiler from a
//! lowered program to an artifact, and a runner that checks an artifact's outputs and times
//! it. [`crate::tune()`] takes any backend: the search reads the description and the rules
//! and measures through [`Backend::measurer`], whose default, [`BackendMeasurer`], lowers and
//! compiles a batch in parallel and hands the artifacts to [`Backend::run`].
//!
//! The CPU backend is [`crate::Target`] ([`cpu`]): JIT-compiled kernels, checked and timed by
//! [`crate::measure::CpuMeasurer`].

pub mod cpu;
pub mod cuda;

use rayon::prelude::*;
use std::time::Instant;
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::lower::lower;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::{TargetDesc, TargetKey};
use tensortune_schedules::ComputeDag;
use tensortune_tuner::measure::{
    MeasureError, MeasureErrorKind, MeasureResult, MeasureStats, Measurer,
};
use tensortune_tuner::sketch::rules::SketchRule;

/// What a measurement is for: its timings are shorter while tuning than for the final
/// re-measurement of the best programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Candidates of a tuning round.
    Tuning,
    /// The best few, re-measured at the end of a run.
    Final,
}

/// A machine to tune for; see the module doc.
pub trait Backend: Sync {
    /// A compiled program.
    type Artifact: Send;

    /// The key records are filed under.
    fn target_key(&self) -> TargetKey;

    /// What the search reads about the machine.
    fn target(&self) -> TargetDesc;

    /// The sketch rules for the machine, in the order they are asked.
    fn rules(&self) -> Vec<Box<dyn SketchRule>>;

    /// The schedule a workload runs on this machine without a record, or `None` (the
    /// default) where the backend has none: tuning measures it in a workload's first batch
    /// and re-measures it beside the best at the end.
    fn default_schedule(&self, dag: &ComputeDag) -> Option<State> {
        let _ = dag;
        None
    }

    /// Compiles a lowered program.
    fn compile(&self, func: &LoweredFunc) -> Result<Self::Artifact, MeasureError>;

    /// Runs each artifact, all programs of `dag`, on inputs drawn from `seed`: checks its
    /// outputs against the reference, then times it. One result per artifact, in order.
    fn run(
        &self,
        dag: &ComputeDag,
        artifacts: &[Self::Artifact],
        purpose: Purpose,
        seed: u64,
    ) -> Vec<MeasureResult>;

    /// The measurer tuning uses. The default compiles with [`Backend::compile`] and runs with
    /// [`Backend::run`] ([`BackendMeasurer`]); a backend with a measurer of its own that does
    /// both in one pass (the CPU's, with its batch-wide hopeless cutoff) returns that.
    fn measurer<'a>(&'a self, purpose: Purpose, seed: u64) -> Box<dyn Measurer + 'a>
    where
        Self: Sized,
    {
        Box::new(BackendMeasurer::new(self, purpose, seed))
    }
}

/// The tuner's [`Measurer`] over any backend: lowers and compiles a batch in parallel, then
/// runs the compiled ones through [`Backend::run`].
pub struct BackendMeasurer<'a, B: Backend> {
    backend: &'a B,
    purpose: Purpose,
    seed: u64,
    key: String,
    stats: MeasureStats,
}

impl<'a, B: Backend> BackendMeasurer<'a, B> {
    /// A measurer for `purpose` with inputs drawn from `seed`.
    pub fn new(backend: &'a B, purpose: Purpose, seed: u64) -> BackendMeasurer<'a, B> {
        BackendMeasurer {
            backend,
            purpose,
            seed,
            key: backend.target_key().to_string(),
            stats: MeasureStats::default(),
        }
    }
}

impl<B: Backend> Measurer for BackendMeasurer<'_, B> {
    fn measure(&mut self, dag: &ComputeDag, candidates: &[State]) -> Vec<MeasureResult> {
        let t = Instant::now();
        let compiled: Vec<Result<B::Artifact, MeasureError>> = candidates
            .par_iter()
            .map(|s| {
                let func = lower(s)
                    .map_err(|e| MeasureError::new(MeasureErrorKind::Lower, e.to_string()))?;
                self.backend.compile(&func)
            })
            .collect();
        self.stats.compile_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (mut ok, mut slots) = (Vec::new(), Vec::new());
        let mut results: Vec<Option<MeasureResult>> = Vec::with_capacity(compiled.len());
        for (i, c) in compiled.into_iter().enumerate() {
            match c {
                Ok(a) => {
                    ok.push(a);
                    slots.push(i);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let ran = self.backend.run(dag, &ok, self.purpose, self.seed);
        let mut ran = ran.into_iter();
        for i in slots {
            results[i] = Some(ran.next().unwrap_or_else(|| {
                Err(MeasureError::new(
                    MeasureErrorKind::Internal,
                    "the backend returned fewer results than artifacts",
                ))
            }));
        }
        self.stats.run_s += t.elapsed().as_secs_f64();
        results.into_iter().flatten().collect()
    }

    fn target_key(&self) -> String {
        self.key.clone()
    }

    fn stats(&self) -> MeasureStats {
        self.stats
    }
}
