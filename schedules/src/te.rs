//! Tensor expressions: *what* is computed, with no schedule.
//!
//! A [`Graph`] is an arena of operations built in order: placeholders (inputs) and computes
//! (`out[i, j, ...] = body(i, j, ...)`). Handles are small `Copy` ids ([`Tensor`]), and a
//! compute can only read tensors created before it, so a graph is acyclic by construction;
//! [`crate::ComputeDag::new`] still checks every reference, because ids from another graph
//! can be passed by mistake.
//!
//! ```
//! use tensortune_schedules::{te::Graph, expr::sum, DType, ComputeDag};
//! let mut g = Graph::new();
//! let a = g.placeholder("A", &[4, 8], DType::F32);
//! let b = g.placeholder("B", &[8, 3], DType::F32);
//! let k = g.reduce_axis(8, "k");
//! let c = g.compute("C", &[4, 3], &["i", "j"], |ax| {
//!     sum(a.at([ax[0].clone(), k.expr()]) * b.at([k.expr(), ax[1].clone()]), [&k])
//! });
//! let dag = ComputeDag::new(&g, &[c]).unwrap();
//! assert_eq!(dag.num_ops(), 3);
//! ```

use crate::expr::{DType, Expr, IterVar, TensorId, Var};

/// A handle to a tensor of a [`Graph`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tensor {
    /// Its id in the graph.
    pub id: TensorId,
    /// Element type.
    pub dtype: DType,
}

impl Tensor {
    /// The element at `indices` (one index expression per dimension).
    pub fn at<I: Into<Expr>>(&self, indices: impl IntoIterator<Item = I>) -> Expr {
        Expr::Load {
            tensor: self.id,
            dtype: self.dtype,
            indices: indices.into_iter().map(Into::into).collect(),
        }
    }
}

/// What an operation is.
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// An input, filled by the caller.
    Placeholder,
    /// `out[axes] = body`, where the body may be a top-level reduction.
    Compute {
        /// One spatial axis per output dimension, extents equal to the shape.
        axes: Vec<IterVar>,
        /// The value of one element.
        body: Expr,
    },
}

/// One operation of a graph: the tensor it defines and how.
#[derive(Clone, Debug, PartialEq)]
pub struct OpNode {
    /// Tensor name (unique names make printed IR readable; not required).
    pub name: String,
    /// Extent of each dimension.
    pub shape: Vec<i64>,
    /// Element type.
    pub dtype: DType,
    /// Placeholder or compute.
    pub kind: OpKind,
}

/// An arena of operations under construction.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub(crate) ops: Vec<OpNode>,
    next_var: u32,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Operations in creation order.
    pub fn ops(&self) -> &[OpNode] {
        &self.ops
    }

    fn fresh_var(&mut self, name: &str) -> Var {
        let v = Var::new(self.next_var, name);
        self.next_var += 1;
        v
    }

    /// A fresh reduction axis over `[0, extent)`.
    pub fn reduce_axis(&mut self, extent: i64, name: &str) -> IterVar {
        IterVar {
            var: self.fresh_var(name),
            extent,
        }
    }

    /// An input tensor.
    pub fn placeholder(&mut self, name: &str, shape: &[i64], dtype: DType) -> Tensor {
        let id = TensorId(self.ops.len() as u32);
        self.ops.push(OpNode {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            kind: OpKind::Placeholder,
        });
        Tensor { id, dtype }
    }

    /// A computed tensor: `body` receives one index expression per dimension (named by
    /// `axis_names`, or `ax0`, `ax1`, ... where fewer names are given) and returns the value of
    /// that element. Its dtype is the body's.
    pub fn compute(
        &mut self,
        name: &str,
        shape: &[i64],
        axis_names: &[&str],
        body: impl FnOnce(&[Expr]) -> Expr,
    ) -> Tensor {
        let axes: Vec<IterVar> = shape
            .iter()
            .enumerate()
            .map(|(d, &extent)| {
                let n = axis_names
                    .get(d)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("ax{d}"));
                IterVar {
                    var: self.fresh_var(&n),
                    extent,
                }
            })
            .collect();
        let idx: Vec<Expr> = axes.iter().map(IterVar::expr).collect();
        let body = body(&idx);
        let dtype = body.dtype();
        let id = TensorId(self.ops.len() as u32);
        self.ops.push(OpNode {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            kind: OpKind::Compute { axes, body },
        });
        Tensor { id, dtype }
    }
}
