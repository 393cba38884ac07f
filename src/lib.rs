//! tensortune: codegen, runtime, measurement, `tune()` and compile-time reuse.
pub use tensortune_schedules as schedules;

pub mod cli;
pub mod codegen;
pub mod kernel;
pub mod measure;
pub mod runtime;

pub use kernel::{BuildError, Kernel, ParamSpec, RunError};
