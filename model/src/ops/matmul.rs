//! `MatMul` (numpy semantics: batch dimensions broadcast, both operands of rank 2 or more)
//! and `Gemm` (2-D, optionally transposed operands). Gemm's `alpha`, `beta` and `C` are not
//! part of the anchor: they are the start of its epilogue.

use super::{dims, Anchor};
use crate::ew::{broadcast, broadcast_index};
use crate::graph::{Graph, Node};
use crate::ModelError;
use tensortune_schedules::expr::{sum, DType};
use tensortune_schedules::te::{Graph as Te, Tensor};

/// A (batched) matrix product `A·B`.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMul {
    /// `A`'s shape as stored.
    pub a: Vec<usize>,
    /// `B`'s shape as stored.
    pub b: Vec<usize>,
    /// `A` is stored `[K, M]` (Gemm's `transA`).
    pub trans_a: bool,
    /// `B` is stored `[N, K]` (Gemm's `transB`).
    pub trans_b: bool,
    /// The output's batch dimensions (numpy broadcast of both operands').
    pub batch: Vec<usize>,
    /// Rows, columns, and the reduced extent.
    pub mnk: [usize; 3],
}

impl MatMul {
    /// Reads a `MatMul` or `Gemm` node.
    pub fn from_node(node: &Node, graph: &Graph) -> Result<MatMul, ModelError> {
        let a = graph.value(node.input(0)?).shape.clone();
        let b = graph.value(node.input(1)?).shape.clone();
        let gemm = node.op == "Gemm";
        let (trans_a, trans_b) = if gemm {
            (node.int("transA", 0)? != 0, node.int("transB", 0)? != 0)
        } else {
            (false, false)
        };
        if a.len() < 2 || b.len() < 2 || (gemm && (a.len() != 2 || b.len() != 2)) {
            return Err(ModelError::unsupported(
                node,
                format!(
                    "operands of shapes {a:?} and {b:?} (both must be at least 2-D; 2-D for Gemm)"
                ),
            ));
        }
        let (ra, rb) = (a.len(), b.len());
        let (m, ka) = if trans_a {
            (a[ra - 1], a[ra - 2])
        } else {
            (a[ra - 2], a[ra - 1])
        };
        let (kb, n) = if trans_b {
            (b[rb - 1], b[rb - 2])
        } else {
            (b[rb - 2], b[rb - 1])
        };
        if ka != kb {
            return Err(ModelError::invalid(
                node,
                format!("inner extents differ: {a:?} and {b:?}"),
            ));
        }
        let batch = broadcast(&a[..ra - 2], &b[..rb - 2]).ok_or_else(|| {
            ModelError::invalid(
                node,
                format!("batch dimensions of {a:?} and {b:?} do not broadcast"),
            )
        })?;
        Ok(MatMul {
            a,
            b,
            trans_a,
            trans_b,
            batch,
            mnk: [m, n, ka],
        })
    }
}

impl Anchor for MatMul {
    fn key(&self) -> String {
        let t = |x: bool| if x { "T" } else { "N" };
        format!(
            "onnx_matmul:A={},B={},trans={}{}",
            dims(&self.a),
            dims(&self.b),
            t(self.trans_a),
            t(self.trans_b)
        )
    }

    fn out_shape(&self) -> Vec<usize> {
        let mut s = self.batch.clone();
        s.extend([self.mnk[0], self.mnk[1]]);
        s
    }

    fn inputs(&self) -> usize {
        2
    }

    fn library_spec(&self) -> Option<String> {
        let [m, n, k] = self.mnk;
        let plain = !self.trans_a && !self.trans_b && self.a.len() == 2 && self.b.len() == 2;
        plain.then(|| format!("matmul:M={m},N={n},K={k}"))
    }

    fn build(&self, g: &mut Te) -> (Vec<Tensor>, Tensor) {
        let i = |v: &[usize]| v.iter().map(|&d| d as i64).collect::<Vec<_>>();
        let a = g.placeholder("A", &i(&self.a), DType::F32);
        let b = g.placeholder("B", &i(&self.b), DType::F32);
        let k = self.mnk[2];
        let rk = g.reduce_axis(k as i64, "k");
        let shape = i(&self.out_shape());
        let nb = self.batch.len();
        let names: Vec<String> = (0..nb)
            .map(|d| format!("b{d}"))
            .chain(["i".into(), "j".into()])
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let c = g.compute("matmul", &shape, &names, |ax| {
            let (bat, i_ax, j_ax) = (&ax[..nb], ax[nb].clone(), ax[nb + 1].clone());
            let mut ia = broadcast_index(&self.a[..self.a.len() - 2], bat);
            if self.a.len() == 2 {
                ia.clear();
            }
            let mut ib = broadcast_index(&self.b[..self.b.len() - 2], bat);
            if self.b.len() == 2 {
                ib.clear();
            }
            if self.trans_a {
                ia.extend([rk.expr(), i_ax]);
            } else {
                ia.extend([i_ax, rk.expr()]);
            }
            if self.trans_b {
                ib.extend([j_ax, rk.expr()]);
            } else {
                ib.extend([rk.expr(), j_ax]);
            }
            sum(a.at(ia) * b.at(ib), [&rk])
        });
        (vec![a, b], c)
    }
}

/// Gemm's epilogue before any fused op: `alpha·acc + beta·C` (terms of 1 and absent `C` left
/// out), with `C` as argument 0 where it is given.
pub fn gemm_epilogue(node: &Node) -> Result<crate::ew::Ew, ModelError> {
    use crate::ew::{Bin, Ew};
    let alpha = node.float("alpha", 1.0)?;
    let beta = node.float("beta", 1.0)?;
    let scaled = |e: Ew, s: f32| {
        if s == 1.0 {
            e
        } else {
            Ew::Bin(Bin::Mul, Box::new(e), Box::new(Ew::Const(s)))
        }
    };
    let acc = scaled(Ew::Acc, alpha);
    Ok(match node.opt_input(2) {
        Some(_) if beta != 0.0 => {
            Ew::Bin(Bin::Add, Box::new(acc), Box::new(scaled(Ew::Arg(0), beta)))
        }
        _ => acc,
    })
}
