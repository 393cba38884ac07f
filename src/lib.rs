//! tensortune: codegen, runtime, measurement, `tune()` and compile-time reuse.
pub use tensortune_records as records;
pub use tensortune_schedules as schedules;
pub use tensortune_tuner as tuner;

pub mod build;
pub mod cli;
pub mod codegen;
pub mod kernel;
pub mod measure;
pub mod runtime;
pub mod tune;

pub use build::{Missing, ReuseError};
pub use kernel::{BuildError, Kernel, ParamSpec, RunError};
pub use tensortune_tuner::TuneOptions;
pub use tune::{tune, tune_dags, Target, TuneError, TuneReport};
