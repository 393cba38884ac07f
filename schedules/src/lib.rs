//! tensortune-schedules: the schedule language.
//!
//! It owns what is computed and how it is scheduled, down to a loop nest any backend can walk:
//! - [`expr`]: scalar expressions shared by every layer, with strict dtypes;
//! - [`te`] and [`dag`]: tensor expressions and the validated compute DAG;
//! - [`ops`]: the op library and workload specs;
//! - [`ir`]: the loop IR and its printer;
//! - [`data`]: host tensors for the references;
//! - [`target`]: target keys and the plain-data description of a machine the search reads.
//!
//! A matmul from the op library, tiled and vectorized by hand, lowered to loop IR, and run
//! by the loop-IR interpreter against the direct evaluator of the tensor expression:
//!
//! ```
//! use tensortune_schedules::data::NdData;
//! use tensortune_schedules::ops::WorkloadSpec;
//! use tensortune_schedules::schedule::State;
//! use tensortune_schedules::{eval, interp, lower};
//!
//! let dag = WorkloadSpec::parse("matmul:M=12,N=8,K=5")?.build()?;
//! let mut s = State::new(&dag);
//! // Stages: 0 A, 1 B, 2 C. Tile C's (i, j) by 4x4, then put k outside the inner tile.
//! s.tile(2, 0, 1, 4, 4)?; // i.0 j.0 i.1 j.1 k
//! s.reorder(2, &[0, 1, 4, 2, 3])?; // i.0 j.0 k i.1 j.1
//! s.vectorize(2, 4)?;
//! let program = lower::lower(&s)?;
//! println!("{program}");
//! let inputs: Vec<NdData> = dag
//!     .inputs()
//!     .iter()
//!     .enumerate()
//!     .map(|(i, &t)| NdData::random(&dag.op(t).shape, dag.op(t).dtype, i as u64))
//!     .collect::<Result<_, _>>()?;
//! let want = eval::evaluate(&dag, &inputs)?;
//! let got = interp::run(&program, &inputs)?;
//! assert!(got[0].max_rel_diff(&want[0]).is_some_and(|d| d < 1e-5));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
pub mod bounds;
pub mod dag;
pub mod data;
pub mod expr;
pub mod ir;
pub mod ops;
pub mod te;

pub use dag::{ComputeDag, DagError};
pub use expr::{BufId, Combiner, Const, DType, Expr, IterVar, TensorId, Var};
pub mod eval;
pub mod gpu;
pub mod interp;
pub mod lanes;
pub mod lower;
pub mod random;
pub mod scalar;
pub mod schedule;
pub mod simplify;
pub mod target;
pub mod text;
pub mod trace;
pub mod verify;
