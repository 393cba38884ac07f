//! The host CPU as a [`Backend`]: [`crate::Target::Llvm`] compiles through LLVM's JIT
//! ([`Kernel`]) and measures with [`CpuMeasurer`] (fork isolation, the reference check, the
//! hopeless cutoff), as tuning did before backends were a seam.

use super::{Backend, Purpose};
use crate::codegen::{CodegenOptions, HostTarget};
use crate::kernel::Kernel;
use crate::measure::{CpuMeasurer, MeasureOptions};
use crate::target::Target;
use std::time::Duration;
use tensortune_schedules::ir::LoweredFunc;
use tensortune_schedules::schedule::State;
use tensortune_schedules::target::{TargetDesc, TargetKey};
use tensortune_schedules::ComputeDag;
use tensortune_tuner::measure::{MeasureError, MeasureErrorKind, MeasureResult, Measurer};
use tensortune_tuner::sketch::rules::{cpu_rules, default_for_target, SketchRule};

/// Measurement settings for tuning: shorter timings than a benchmark's (the final
/// re-measurement uses the full ones).
pub fn tuning_measure_options() -> MeasureOptions {
    MeasureOptions {
        repeat: 3,
        min_repeat_ms: 20.0,
        timeout: Duration::from_secs(10),
        ..MeasureOptions::default()
    }
}

impl Target {
    /// The measurement settings of `purpose` on this target, inputs drawn from `seed`.
    pub fn measure_options(&self, purpose: Purpose, seed: u64) -> MeasureOptions {
        let tuning = MeasureOptions {
            threads: self.threads(),
            seed,
            flush_cache: self.cache_flush(),
            ..tuning_measure_options()
        };
        match purpose {
            Purpose::Tuning => tuning,
            Purpose::Final => MeasureOptions {
                repeat: 5,
                min_repeat_ms: 100.0,
                ..tuning
            },
        }
    }
}

impl Backend for Target {
    type Artifact = Kernel;

    fn target_key(&self) -> TargetKey {
        HostTarget::host().target_key(self.threads())
    }

    fn target(&self) -> TargetDesc {
        HostTarget::host().desc(self.threads())
    }

    fn rules(&self) -> Vec<Box<dyn SketchRule>> {
        cpu_rules()
    }

    fn default_schedule(&self, dag: &ComputeDag) -> Option<State> {
        Some(default_for_target(dag, &self.target()))
    }

    fn compile(&self, func: &LoweredFunc) -> Result<Kernel, MeasureError> {
        Kernel::compile_with(func, &CodegenOptions::default())
            .map_err(|e| MeasureError::new(MeasureErrorKind::Compile, e.to_string()))
    }

    fn run(
        &self,
        dag: &ComputeDag,
        artifacts: &[Kernel],
        purpose: Purpose,
        seed: u64,
    ) -> Vec<MeasureResult> {
        CpuMeasurer::new(self.measure_options(purpose, seed)).measure_kernels(dag, artifacts)
    }

    fn measurer<'a>(&'a self, purpose: Purpose, seed: u64) -> Box<dyn Measurer + 'a> {
        Box::new(CpuMeasurer::new(self.measure_options(purpose, seed)))
    }
}
