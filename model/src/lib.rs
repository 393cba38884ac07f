//! ONNX models for tensortune: import, static shapes, and the graph cut into tasks.
//!
//! A model goes through three steps, none of which compiles anything (the root crate's
//! `tensortune::model` compiles and runs what this crate plans):
//!
//! 1. [`import()`]: the file's protobuf decoded with prost from ONNX's own `onnx.proto`,
//!    into a [`Graph`] of values and nodes with typed ids; the input shapes fixed
//!    ([`ImportOptions::input_shapes`] for dynamic ones); every shape inferred and every value
//!    known at import folded ([`infer`]); batch normalization folded into the convolution
//!    before it ([`fold`]).
//! 2. [`plan()`]: nodes mapped to tasks, each a tensor-expression DAG ([`ops`] for
//!    convolution, matrix products, pooling and softmax; [`ew`] for the elementwise ops fused
//!    after them or standing alone), identical layers one task; layout ops ([`layout`]) become
//!    steps run directly.
//! 3. The caller compiles each task's DAG once and runs the [`Step`]s in order.
//!
//! ```
//! use tensortune_model::{import, plan, ImportOptions};
//! // A model written by hand: y = relu(x · W), W known at import.
//! let bytes = tensortune_model::testing::mlp_bytes();
//! let p = plan(import(&bytes, &ImportOptions::default())?)?;
//! assert_eq!(p.tasks.len(), 1);
//! assert_eq!(p.tasks[0].ops, "MatMul+Relu");
//! # Ok::<(), tensortune_model::ModelError>(())
//! ```

mod error;
pub mod ew;
pub mod fold;
pub mod graph;
pub mod import;
pub mod infer;
pub mod layout;
pub mod ops;
pub mod plan;
mod proto;
pub mod resize;
pub mod shapes;
pub mod tensor;
pub mod testing;

pub use error::ModelError;
pub use graph::{Data, Graph, ValueId};
pub use import::{import, parse_input_shape, ImportOptions};
pub use plan::{plan, Plan, Step, Task};
