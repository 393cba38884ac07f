//! tensortune: the root crate. It owns everything that touches a machine, on top of the
//! schedule language ([`schedules`]), the records database ([`records`]), the cost model and
//! the search ([`tuner`]), none of which compiles or runs code:
//! - [`codegen`]: loop IR to LLVM IR for the host CPU (JIT and object files);
//! - [`runtime`]: aligned buffers and the thread pool behind parallel loops;
//! - [`kernel`]: [`Kernel`], a compiled schedule with checked calls;
//! - [`measure`]: [`measure::CpuMeasurer`], the tuner's `Measurer` for this CPU;
//! - [`tune`](mod@tune): [`tune()`], the entry point of tuning, and its report;
//! - [`build`]: compile-time reuse of records (a static library and safe wrappers);
//! - [`cli`]: the `tensortune` command line.
//!
//! The README's example is compiled as a doctest (`ReadmeDoctests`, under `cfg(doctest)`).
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

/// The README's code, compiled by `cargo test --doc` so the example it shows stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
