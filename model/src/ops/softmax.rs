//! `Softmax` along one axis. From opset 13 the axis alone is normalized; before, the input is
//! read as a matrix of the axes before `axis` by those from it on, and each row normalized.
//! Either way the op is `[outer, n, inner]` normalized over `n`, and a softmax over the last
//! axis (`inner = 1`) is the op library's `softmax`.

use super::Anchor;
use crate::graph::{Graph, Node};
use crate::ModelError;
use tensortune_schedules::expr::{self, max_reduce, sum, DType};
use tensortune_schedules::te::{Graph as Te, Tensor};

/// A softmax's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Softmax {
    /// The input's shape.
    pub shape: Vec<usize>,
    /// `[outer, n, inner]`: the extents before, along and after the normalized axis.
    pub split: [usize; 3],
}

impl Softmax {
    /// Reads a `Softmax` node.
    pub fn from_node(node: &Node, graph: &Graph) -> Result<Softmax, ModelError> {
        let shape = graph.value(node.input(0)?).shape.clone();
        let old = graph.opset < 13;
        let axis = node.int("axis", if old { 1 } else { -1 })?;
        let a = crate::shapes::axis(node, axis, shape.len().max(1))?;
        let prod = |s: &[usize]| s.iter().product::<usize>();
        let split = if old || shape.is_empty() {
            [
                prod(&shape[..a.min(shape.len())]),
                prod(&shape[a.min(shape.len())..]),
                1,
            ]
        } else {
            [prod(&shape[..a]), shape[a], prod(&shape[a + 1..])]
        };
        Ok(Softmax { shape, split })
    }
}

impl Anchor for Softmax {
    fn key(&self) -> String {
        let [o, n, i] = self.split;
        format!("onnx_softmax:outer={o},n={n},inner={i}")
    }

    fn out_shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    fn kernel_shape(&self) -> Vec<usize> {
        let [o, n, i] = self.split;
        if i == 1 {
            vec![o, n]
        } else {
            vec![o, n, i]
        }
    }

    fn inputs(&self) -> usize {
        1
    }

    fn fusable(&self) -> bool {
        // Its kernel's axes are not ONNX's: an epilogue's broadcast would need a division.
        false
    }

    fn library_spec(&self) -> Option<String> {
        let [o, n, i] = self.split;
        (i == 1).then(|| format!("softmax:M={o},N={n}"))
    }

    fn build(&self, g: &mut Te) -> (Vec<Tensor>, Tensor) {
        let [o, n, i] = self.split.map(|d| d as i64);
        let x = g.placeholder("X", &[o, n, i], DType::F32);
        let r1 = g.reduce_axis(n, "k");
        let mx = g.compute("max", &[o, i], &["a", "b"], |ax| {
            max_reduce(x.at([ax[0].clone(), r1.expr(), ax[1].clone()]), [&r1])
        });
        let e = g.compute("exp", &[o, n, i], &["a", "j", "b"], |ax| {
            expr::exp(x.at(ax.to_vec()) - mx.at([ax[0].clone(), ax[2].clone()]))
        });
        let r2 = g.reduce_axis(n, "k");
        let s = g.compute("sum", &[o, i], &["a", "b"], |ax| {
            sum(e.at([ax[0].clone(), r2.expr(), ax[1].clone()]), [&r2])
        });
        let y = g.compute("Y", &[o, n, i], &["a", "j", "b"], |ax| {
            e.at(ax.to_vec()) / s.at([ax[0].clone(), ax[2].clone()])
        });
        (vec![x], y)
    }
}
