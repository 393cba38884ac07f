//! tensortune-schedules: the schedule language.
//!
//! It owns what is computed and how it is scheduled, down to a loop nest any backend can walk:
//! - [`expr`]: scalar expressions shared by every layer, with strict dtypes;
//! - [`te`] and [`dag`]: tensor expressions and the validated compute DAG;
//! - [`ops`]: the op library and workload specs;
//! - [`ir`]: the loop IR and its printer;
//! - [`data`]: host tensors for the references;
//! - [`target`]: target keys and the plain-data description of a machine the search reads.
pub mod dag;
pub mod data;
pub mod expr;
pub mod ir;
pub mod ops;
pub mod te;

pub use dag::{ComputeDag, DagError};
pub use expr::{BufId, Combiner, Const, DType, Expr, IterVar, TensorId, Var};
pub mod eval;
pub mod interp;
pub mod lower;
pub mod random;
pub mod scalar;
pub mod schedule;
pub mod simplify;
pub mod target;
pub mod text;
pub mod trace;
pub mod verify;
