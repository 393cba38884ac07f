//! tensortune: codegen, runtime, measurement, `tune()` and compile-time reuse.
pub use tensortune_schedules as schedules;

pub mod cli;
