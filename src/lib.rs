//! tensortune: the root crate. It owns everything that touches a machine, on top of the
//! schedule language ([`schedules`]), the records database ([`records`]), the cost model and
//! the search ([`tuner`]), none of which compiles or runs code:
//! - [`backend`]: the [`backend::Backend`] interface a machine implements to be tuned for
//!   (the host CPU's is [`Target`]);
//! - [`codegen`]: loop IR to LLVM IR for the host CPU (JIT and object files);
//! - [`runtime`]: aligned buffers and the thread pool behind parallel loops;
//! - [`kernel`]: [`Kernel`], a compiled schedule with checked calls;
//! - [`measure`]: [`measure::CpuMeasurer`], the tuner's `Measurer` for this CPU;
//! - [`tune`](mod@tune): [`tune()`], the entry point of tuning, and its report;
//! - [`build`]: compile-time reuse of records (a static library and safe wrappers);
//! - [`model`]: whole ONNX models: imported, tuned task by task, run with their kernels;
//! - [`cli`]: the `tensortune` command line;
//! - [`Target`]: where kernels run, and the key of their records;
//! - [`plausible`]: the bound on what a measured time can be;
//! - [`probe`]: this machine's FMA peak, memory bandwidth and parallel-loop overhead, measured.
//!
//! Cargo features: `tuning` (on by default) brings the tuning loop ([`tune()`], the
//! cost model, which builds XGBoost's C++) and the command line. Without it the crate still
//! compiles, runs and emits tuned records (`Kernel::from_records`, [`build`], [`codegen`],
//! [`measure`]): what a `build.rs` that reuses records needs, at a fraction of the build.
//!
//! What a caller needs most is re-exported here: [`WorkloadSpec`], [`Target`],
//! [`TuneOptions`], [`Kernel`], [`Runtime`], and [`ndarray`] itself.
//!
//! The library reports warnings (a record skipped, a fallback taken) and tuning progress
//! through the [`log`](https://docs.rs/log) facade, so an application decides what is shown;
//! the `tensortune` binary installs a logger (`-v`, `-q`, `RUST_LOG`).
//!
//! A kernel from a workload's default schedule, run on `ndarray` data (tuning finds a faster
//! schedule for the same call: `tune()`, then [`Kernel::from_state`] on its best state):
//!
//! ```
//! use tensortune::ndarray::Array2;
//! use tensortune::schedules::schedule::State;
//! use tensortune::{Kernel, Runtime, WorkloadSpec};
//!
//! let spec = WorkloadSpec::parse("matmul:M=8,N=6,K=4")?;
//! let kernel = Kernel::from_state(&State::new(&spec.build()?), &Default::default())?;
//! let a = Array2::<f32>::from_shape_fn((8, 4), |(i, k)| (i + k) as f32);
//! let b = Array2::<f32>::from_shape_fn((4, 6), |(k, j)| (k * j) as f32);
//! let c = kernel.run_arrays(&Runtime::serial(), &[a.view().into_dyn(), b.view().into_dyn()])?;
//! assert_eq!(c[0][[7, 5]], (0..4).map(|k| ((7 + k) * k * 5) as f32).sum::<f32>());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The README's example is compiled as a doctest (`ReadmeDoctests`, under `cfg(doctest)`).
/// The array crate of [`Kernel::run_arrays`] and of the `_nd` wrappers that [`build`] writes,
/// re-exported so that a caller's arrays are of the same version.
pub use ndarray;
pub use tensortune_records as records;
pub use tensortune_schedules as schedules;
pub use tensortune_tuner as tuner;

pub mod backend;
pub mod build;
#[cfg(feature = "tuning")]
pub mod cli;
pub mod codegen;
pub mod gpu;
pub mod kernel;
pub mod measure;
pub mod model;
#[cfg(feature = "tuning")]
pub mod npy;
pub mod plan;
pub mod plausible;
pub mod probe;
pub mod runtime;
pub mod target;
#[cfg(feature = "tuning")]
pub mod tune;

pub use build::{Missing, ReuseError};
pub use kernel::{BuildError, Kernel, ParamSpec, RunError};
pub use runtime::Runtime;
pub use target::{Target, UnknownTarget};
pub use tensortune_schedules::ops::WorkloadSpec;
pub use tensortune_tuner::TuneOptions;
#[cfg(feature = "tuning")]
pub use tune::{tune, tune_dags, TuneError, TuneReport};

/// The README's code, compiled by `cargo test --doc` so the example it shows stays true.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "tuning"))]
pub struct ReadmeDoctests;
