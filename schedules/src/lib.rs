//! tensortune-schedules: the schedule language.
//!
//! It owns what is computed and how it is scheduled, up to a loop nest any backend can walk:
//! - [`expr`]: scalar expressions shared by every layer, with strict dtypes;
//! - [`ir`]: the loop IR and its printer.
pub mod data;
pub mod expr;
pub mod ir;

pub use expr::{BufId, Combiner, Const, DType, Expr, IterVar, TensorId, Var};
