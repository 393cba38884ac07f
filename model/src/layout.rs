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
                // One copy where the input is contiguous: a dynamic-rank iterator costs
                // nanoseconds per element.
                let v: Vec<T> = match x.as_slice() {
                    Some(s) => s.to_vec(),
                    None => x.iter().copied().collect(),
                };
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
            Layout::Map { .. } => {
                let x = x.as_standard_layout();
                let offsets = self.axis_offsets(x.shape(), out_shape)?;
                Some(gather(x.as_slice()?, &offsets, out_shape, fill))
            }
        }
    }
}

/// Per output axis, the offset into the input's row-major elements of each coordinate along
/// it (`None`: the fill value): `out[j0, j1, ...] = x[offsets[0][j0] + offsets[1][j1] + ...]`,
/// the output's elements in row-major order over these axes (a reshape has one axis of all
/// its elements).
/// A whole-index-free description of a permutation or an index map, so that code generated
/// ahead of time (`tensortune::build` of a model) can move elements without this crate.
pub type AxisOffsets = Vec<Vec<Option<usize>>>;

impl Layout {
    /// The op as [`AxisOffsets`] for an input of `in_shape` (a reshape as one axis read in
    /// order); `None` for a concatenation, which reads several inputs.
    pub fn axis_offsets(&self, in_shape: &[usize], out_shape: &[usize]) -> Option<AxisOffsets> {
        match self {
            Layout::Reshape => {
                let n: usize = in_shape.iter().product();
                Some(vec![(0..n).map(Some).collect()])
            }
            Layout::Transpose(perm) => {
                let strides = row_major_strides(in_shape);
                perm.iter()
                    .zip(out_shape)
                    .map(|(&p, &n)| {
                        let s = *strides.get(p)?;
                        Some((0..n).map(|j| Some(j * s)).collect())
                    })
                    .collect()
            }
            Layout::Concat(_) => None,
            Layout::Map { maps, .. } => {
                // The input's shape with leading 1s up to the output's rank (`Expand` adds
                // axes).
                let lead = maps.len().saturating_sub(in_shape.len());
                let dims: Vec<usize> = std::iter::repeat_n(1, lead)
                    .chain(in_shape.iter().copied())
                    .collect();
                let strides = row_major_strides(&dims);
                Some(
                    maps.iter()
                        .zip(&strides)
                        .map(|(map, &s)| map.iter().map(|m| m.map(|i| i * s)).collect())
                        .collect(),
                )
            }
        }
    }
}

/// Row-major strides, in elements, of `shape`.
fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// `out[j0, j1, ...] = src[offsets[0][j0] + offsets[1][j1] + ...]`, `fill` where an
/// offset is `None` (or out of range).
fn gather<T: Copy + Default>(
    src: &[T],
    offsets: &AxisOffsets,
    out_shape: &[usize],
    fill: T,
) -> ArrayD<T> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The output's elements, in row-major order, read through `offsets` from `src`: a
    /// second, index-by-index reading of [`AxisOffsets`] against ndarray's own permutation
    /// and [`Layout::apply`].
    fn flat_gather(src: &[f32], offsets: &AxisOffsets, fill: f32) -> Vec<f32> {
        let mut bases = vec![Some(0usize)];
        for axis in offsets {
            let mut next = Vec::with_capacity(bases.len() * axis.len());
            for b in &bases {
                for o in axis {
                    next.push(b.zip(*o).map(|(b, o)| b + o));
                }
            }
            bases = next;
        }
        bases
            .into_iter()
            .map(|b| b.and_then(|i| src.get(i).copied()).unwrap_or(fill))
            .collect()
    }

    fn counting(shape: &[usize]) -> ArrayD<f32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|i| i as f32).collect()).expect("shape")
    }

    #[test]
    fn offsets_of_a_transpose_read_what_ndarray_permutes() {
        let x = counting(&[2, 3, 4, 5]);
        for perm in [
            vec![0, 1, 2, 3],
            vec![3, 2, 1, 0],
            vec![0, 2, 3, 1],
            vec![1, 0, 3, 2],
        ] {
            let want = x
                .clone()
                .permuted_axes(IxDyn(&perm))
                .as_standard_layout()
                .into_owned();
            let out_shape: Vec<usize> = want.shape().to_vec();
            let layout = Layout::Transpose(perm.clone());
            let offsets = layout.axis_offsets(x.shape(), &out_shape).expect("offsets");
            let got = flat_gather(x.as_slice().expect("standard"), &offsets, 0.0);
            assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "{perm:?}");
        }
    }

    #[test]
    fn offsets_of_maps_and_reshapes_agree_with_apply() {
        let x = counting(&[1, 2, 3]);
        // Pad the last axis by one each side (fill 7), repeat the middle axis (a nearest
        // resize), and add a leading axis of 2 (an expand).
        let maps = vec![
            vec![Some(0), Some(0)],
            vec![Some(0), Some(0)],
            vec![Some(0), Some(0), Some(1), Some(1)],
            vec![None, Some(0), Some(1), Some(2), None],
        ];
        let out_shape = [2, 2, 4, 5];
        let layout = Layout::Map { maps, fill: 7.0 };
        let want = layout.apply(&[x.view()], &out_shape, 7.0).expect("applies");
        let offsets = layout.axis_offsets(x.shape(), &out_shape).expect("offsets");
        let got = flat_gather(x.as_slice().expect("standard"), &offsets, 7.0);
        assert_eq!(got, want.iter().copied().collect::<Vec<_>>());
        assert!(got.contains(&7.0) && got.contains(&5.0));

        let reshape = Layout::Reshape
            .axis_offsets(&[2, 3], &[3, 2])
            .expect("offsets");
        assert_eq!(
            flat_gather(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &reshape, 0.0),
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
        assert!(Layout::Concat(0).axis_offsets(&[2], &[4]).is_none());
    }
}
