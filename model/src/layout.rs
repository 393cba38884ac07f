//! Layout ops, executed directly rather than tuned: they move elements and compute nothing.
//!
//! Every one is one of four kinds of [`Layout`]: a new shape over the same elements
//! (`Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`, `Identity`, `Dropout`), a permutation of
//! axes (`Transpose`), a concatenation (`Concat`), or a per-axis index map (`Pad`, `Slice`,
//! `Resize` nearest, `Expand`): each output coordinate along an axis reads one input
//! coordinate along the same axis, or the fill value. The maps are computed once from the
//! static shapes, at import.

use crate::graph::{Graph, Node};
use crate::ModelError;
use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};

/// A layout op with every parameter resolved against static shapes.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// The same elements in the same order, under the output's shape.
    Reshape,
    /// Output axis `i` is input axis `perm[i]`.
    Transpose(Vec<usize>),
    /// The inputs joined along an axis.
    Concat(usize),
    /// Along each axis, output coordinate `j` reads input coordinate `maps[axis][j]`, or
    /// `fill` where that is `None` (constant padding).
    Map {
        /// One map per axis, as long as the output's extent.
        maps: Vec<Vec<Option<usize>>>,
        /// The value of unmapped coordinates.
        fill: f32,
    },
}

/// The layout ops the importer runs directly.
pub const LAYOUT_OPS: &[&str] = &[
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Dropout",
    "Transpose",
    "Concat",
    "Pad",
    "Slice",
    "Resize",
    "Expand",
];

/// Whether `op` is a layout op of [`LAYOUT_OPS`].
pub fn is_layout(op: &str) -> bool {
    LAYOUT_OPS.contains(&op)
}

/// The layout of `node` and its output shape.
pub fn from_node(node: &Node, graph: &Graph) -> Result<(Layout, Vec<usize>), ModelError> {
    let x = graph.value(node.input(0)?).shape.clone();
    match node.op.as_str() {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            Ok((Layout::Reshape, crate::shapes::reshaped(node, graph, &x)?))
        }
        "Identity" => Ok((Layout::Reshape, x)),
        "Dropout" => {
            if node.outputs.len() > 1 {
                return Err(ModelError::unsupported(node, "the mask output"));
            }
            // Inference is the identity; training mode (input 2, opset 12 on) drops elements.
            let training = crate::shapes::const_ints(node, graph, 2)?
                .is_some_and(|t| t.iter().any(|&v| v != 0));
            if training || node.int("is_test", 1)? == 0 {
                return Err(ModelError::unsupported(node, "training mode"));
            }
            Ok((Layout::Reshape, x))
        }
        "Transpose" => {
            let perm = match node.ints("perm")? {
                Some(p) => p
                    .iter()
                    .map(|&a| crate::shapes::axis(node, a, x.len()))
                    .collect::<Result<Vec<_>, _>>()?,
                None => (0..x.len()).rev().collect(),
            };
            let mut seen = vec![false; x.len()];
            for &p in &perm {
                if std::mem::replace(&mut seen[p], true) {
                    return Err(ModelError::invalid(node, "perm repeats an axis"));
                }
            }
            if perm.len() != x.len() {
                return Err(ModelError::invalid(node, "perm does not name every axis"));
            }
            let shape = perm.iter().map(|&p| x[p]).collect();
            Ok((Layout::Transpose(perm), shape))
        }
        "Concat" => concat(node, graph, &x),
        "Pad" => crate::shapes::pad(node, graph, &x),
        "Slice" => crate::shapes::slice(node, graph, &x),
        "Resize" => crate::resize::resize(node, graph, &x),
        "Expand" => crate::shapes::expand(node, graph, &x),
        _ => Err(ModelError::unsupported(node, "not a layout op")),
    }
}

fn concat(node: &Node, graph: &Graph, x: &[usize]) -> Result<(Layout, Vec<usize>), ModelError> {
    let axis = crate::shapes::axis(node, node.int("axis", 0)?, x.len())?;
    let mut shape = x.to_vec();
    shape[axis] = 0;
    for i in node.inputs.iter().flatten() {
        let s = &graph.value(*i).shape;
        let fits = s.len() == x.len() && (0..x.len()).all(|d| d == axis || s[d] == x[d]);
        if !fits {
            return Err(ModelError::invalid(
                node,
                format!("input shapes {x:?} and {s:?} do not concatenate on axis {axis}"),
            ));
        }
        shape[axis] += s[axis];
    }
    Ok((Layout::Concat(axis), shape))
}

impl Layout {
    /// Applies the op to `inputs` (all of them for a concatenation, the first otherwise);
    /// `out_shape` is the shape [`from_node`] returned.
    pub fn apply<T: Copy + Default>(
        &self,
        inputs: &[ArrayViewD<'_, T>],
        out_shape: &[usize],
        fill: T,
    ) -> Option<ArrayD<T>> {
        let x = inputs.first()?;
        match self {
            Layout::Reshape => {
                let v: Vec<T> = x.iter().copied().collect();
                ArrayD::from_shape_vec(IxDyn(out_shape), v).ok()
            }
            Layout::Transpose(perm) => Some(
                x.clone()
                    .permuted_axes(IxDyn(perm))
                    .as_standard_layout()
                    .into_owned(),
            ),
            Layout::Concat(axis) => ndarray::concatenate(Axis(*axis), inputs)
                .ok()
                .map(|a| a.as_standard_layout().into_owned()),
            Layout::Map { maps, .. } => Some(apply_maps(x, maps, out_shape, fill)),
        }
    }
}

/// `out[j0, j1, ...] = x[maps[0][j0], maps[1][j1], ...]`, `fill` where a map says `None`.
fn apply_maps<T: Copy + Default>(
    x: &ArrayViewD<'_, T>,
    maps: &[Vec<Option<usize>>],
    out_shape: &[usize],
    fill: T,
) -> ArrayD<T> {
    let x = x.as_standard_layout();
    let src = x.as_slice().unwrap_or(&[]);
    // The input's shape with leading 1s up to the output's rank (`Expand` adds axes).
    let lead = maps.len().saturating_sub(x.ndim());
    let dims: Vec<usize> = std::iter::repeat_n(1, lead)
        .chain(x.shape().iter().copied())
        .collect();
    // Per axis, the offset into the input's elements of each output coordinate.
    let mut stride = 1usize;
    let mut offsets: Vec<Vec<Option<usize>>> = vec![Vec::new(); maps.len()];
    for (d, map) in maps.iter().enumerate().rev() {
        offsets[d] = map.iter().map(|m| m.map(|i| i * stride)).collect();
        stride *= dims.get(d).copied().unwrap_or(1);
    }
    ArrayD::from_shape_fn(IxDyn(out_shape), |idx| {
        let mut off = 0;
        for (d, o) in offsets.iter().enumerate() {
            match o.get(idx[d]).copied().flatten() {
                Some(v) => off += v,
                None => return fill,
            }
        }
        src.get(off).copied().unwrap_or(fill)
    })
}
