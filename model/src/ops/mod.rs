//! The compute ops a task is built around ([`Anchor`]): convolution, matrix products,
//! pooling and softmax, each parsed from its node against static shapes and written as
//! tensor expressions of the DSL.
//!
//! An anchor's DAG computes its result in the anchor's own layout ([`Anchor::kernel_shape`],
//! e.g. `[N, G, K/G, P, Q]` for a grouped convolution, so that every index stays affine);
//! [`Anchor::logical`] maps the kernel's axes back to ONNX's coordinates, which is where a
//! fused epilogue reads its broadcast operands. Kernel and ONNX layouts always hold the
//! elements in the same row-major order, so the executor passes buffers between them as
//! they are.

pub mod conv;
pub mod matmul;
pub mod pool;
pub mod softmax;

use crate::graph::{Graph, Node};
use crate::shapes::MAX_DIM;
use crate::ModelError;
use tensortune_schedules::expr::Expr;
use tensortune_schedules::te::{Graph as Te, Tensor};

/// A compute op at the root of a task.
pub trait Anchor {
    /// The task's name and parameters, e.g. `conv2d:C=16,...`: the start of its workload key.
    fn key(&self) -> String;
    /// The result's shape as ONNX has it.
    fn out_shape(&self) -> Vec<usize>;
    /// The result's shape in the kernel (see the module doc); by default ONNX's.
    fn kernel_shape(&self) -> Vec<usize> {
        self.out_shape()
    }
    /// Adds the op's placeholders (in the order of the node's inputs it reads, see
    /// [`Anchor::inputs`]) and computes to `g`; returns the placeholders and the result.
    fn build(&self, g: &mut Te) -> (Vec<Tensor>, Tensor);
    /// How many of the node's inputs, from the first, the kernel reads.
    fn inputs(&self) -> usize;
    /// Tensors the kernel reads after the node's inputs, computed at import from the op's
    /// parameters (average pooling's divisors) or from its constant inputs (a convolution's
    /// weights laid out output channels last).
    fn constants(&self) -> Vec<ndarray::ArrayD<f32>> {
        Vec::new()
    }
    /// ONNX's coordinates of the kernel's axes `axes`; by default the same.
    fn logical(&self, axes: &[Expr]) -> Vec<Expr> {
        axes.to_vec()
    }
    /// Whether elementwise consumers may be fused after it.
    fn fusable(&self) -> bool {
        true
    }
    /// A workload of the op library that is exactly this op, where there is one; its key and
    /// DAG are then the library's (its inputs in the same order).
    fn library_spec(&self) -> Option<String> {
        None
    }
}

/// The op types that anchor a task.
pub const ANCHOR_OPS: &[&str] = &[
    "Conv",
    "Gemm",
    "MatMul",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Softmax",
];

/// The anchor of `node`, whose op is one of [`ANCHOR_OPS`].
pub fn anchor(node: &Node, graph: &Graph) -> Result<Box<dyn Anchor>, ModelError> {
    Ok(match node.op.as_str() {
        "Conv" => Box::new(conv::Conv::from_node(node, graph)?),
        "Gemm" | "MatMul" => Box::new(matmul::MatMul::from_node(node, graph)?),
        "MaxPool" | "AveragePool" | "GlobalAveragePool" | "GlobalMaxPool" => {
            Box::new(pool::Pool::from_node(node, graph)?)
        }
        "Softmax" => Box::new(softmax::Softmax::from_node(node, graph)?),
        _ => return Err(ModelError::unsupported(node, "not a compute op")),
    })
}

/// The input `i` of `node` as a 4-D (NCHW) shape, or an error saying only 2-D spatial ops
/// are supported.
pub(crate) fn nchw(node: &Node, graph: &Graph, i: usize) -> Result<[usize; 4], ModelError> {
    let s = &graph.value(node.input(i)?).shape;
    match s.as_slice() {
        &[n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(ModelError::unsupported(
            node,
            format!("an input of rank {} (only 2-D images, NCHW)", s.len()),
        )),
    }
}

/// Two-element spatial attributes (`strides`, `dilations`, `kernel_shape`) with a default.
pub(crate) fn pair(node: &Node, name: &str, default: usize) -> Result<[usize; 2], ModelError> {
    match node.ints(name)?.as_deref() {
        None => Ok([default, default]),
        Some(&[a, b]) if (1..=MAX_DIM).contains(&a) && (1..=MAX_DIM).contains(&b) => {
            Ok([a as usize, b as usize])
        }
        Some(v) => Err(ModelError::invalid(
            node,
            format!("`{name}` = {v:?} (two integers from 1 to {MAX_DIM} for 2-D)"),
        )),
    }
}

/// The padding `[top, left, bottom, right]` of a 2-D window op, from `pads` or `auto_pad`,
/// for input extents `hw`, window extents `win` (dilated) and strides.
pub(crate) fn pads(
    node: &Node,
    hw: [usize; 2],
    win: [usize; 2],
    strides: [usize; 2],
) -> Result<[usize; 4], ModelError> {
    let auto = node.string("auto_pad", "NOTSET")?;
    match auto.as_str() {
        "NOTSET" => match node.ints("pads")?.as_deref() {
            None => Ok([0; 4]),
            Some(&[t, l, b, r]) if [t, l, b, r].iter().all(|p| (0..=MAX_DIM).contains(p)) => {
                Ok([t as usize, l as usize, b as usize, r as usize])
            }
            Some(v) => Err(ModelError::invalid(
                node,
                format!("pads {v:?} (four integers from 0 to {MAX_DIM} for 2-D)"),
            )),
        },
        "VALID" => Ok([0; 4]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut p = [0; 4];
            for d in 0..2 {
                let out = hw[d].div_ceil(strides[d]);
                let total = (out.saturating_sub(1) * strides[d] + win[d]).saturating_sub(hw[d]);
                let small = total / 2;
                let (begin, end) = if auto == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                p[d] = begin;
                p[d + 2] = end;
            }
            Ok(p)
        }
        other => Err(ModelError::invalid(node, format!("auto_pad `{other}`"))),
    }
}

/// A padding stage: `data` of shape `[n, c, h, w]` padded to `[n, c, ph, pw]` with `fill`,
/// its first row and column at `top`, `left`; `data` itself where nothing is added.
pub(crate) fn pad_stage(
    g: &mut Te,
    data: Tensor,
    nchw: [usize; 4],
    padded: [usize; 2],
    top_left: [usize; 2],
    fill: f32,
) -> Tensor {
    let [n, c, h, w] = nchw.map(|d| d as i64);
    let (ph, pw) = (padded[0] as i64, padded[1] as i64);
    let (t, l) = (top_left[0] as i64, top_left[1] as i64);
    if ph == h && pw == w && t == 0 && l == 0 {
        return data;
    }
    g.compute("pad", &[n, c, ph, pw], &["n", "c", "h", "w"], |ax| {
        let (y, x) = (&ax[2], &ax[3]);
        let inside = y
            .clone()
            .ge(t)
            .and(y.clone().lt(h + t))
            .and(x.clone().ge(l))
            .and(x.clone().lt(w + l));
        tensortune_schedules::expr::select(
            inside,
            data.at([ax[0].clone(), ax[1].clone(), y - t, x - l]),
            Expr::f32(fill),
        )
    })
}

/// `[a, b, c]` as `axbxc`, the way shapes are written in keys.
pub fn dims(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    if parts.is_empty() {
        "scalar".to_string()
    } else {
        parts.join("x")
    }
}
