//! `Resize` (and the older `Upsample` form of opset 10) in `nearest` mode, as a per-axis index
//! map: output coordinate `j` reads the input coordinate that the coordinate transformation
//! and the rounding mode give, clamped to the input.

use crate::graph::{Graph, Node};
use crate::layout::Layout;
use crate::shapes::{axis, const_ints};
use crate::ModelError;

/// The map and output shape of a nearest-neighbour `Resize` of an input of shape `x`.
pub fn resize(node: &Node, graph: &Graph, x: &[usize]) -> Result<(Layout, Vec<usize>), ModelError> {
    let mode = node.string("mode", "nearest")?;
    if mode != "nearest" {
        return Err(ModelError::unsupported(
            node,
            format!("mode `{mode}` (only nearest)"),
        ));
    }
    let policy = node.string("keep_aspect_ratio_policy", "stretch")?;
    if policy != "stretch" {
        return Err(ModelError::unsupported(
            node,
            format!("keep_aspect_ratio_policy `{policy}`"),
        ));
    }
    let transform = node.string(
        "coordinate_transformation_mode",
        if graph.opset < 11 {
            "asymmetric"
        } else {
            "half_pixel"
        },
    )?;
    let rounding = node.string(
        "nearest_mode",
        if graph.opset < 11 {
            "floor"
        } else {
            "round_prefer_floor"
        },
    )?;
    let rank = x.len();
    let axes: Vec<usize> = match node.ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&a| axis(node, a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    let (scales_at, sizes_at) = if graph.opset < 11 {
        (1, usize::MAX)
    } else {
        (2, 3)
    };
    let scales = match node.opt_input(scales_at).and_then(|v| graph.constant(v)) {
        Some(d) if !d.shape().contains(&0) => Some(d.to_f32s()),
        Some(_) => None,
        None if node.opt_input(scales_at).is_some() => {
            return Err(ModelError::unsupported(
                node,
                "scales known only at run time",
            ))
        }
        None => None,
    };
    let sizes = if sizes_at == usize::MAX {
        None
    } else {
        const_ints(node, graph, sizes_at)?
    };
    // Per axis of `axes`: the output extent and the scale coordinates are divided by.
    let mut out = x.to_vec();
    let mut scale = vec![1.0f32; rank];
    match (scales, sizes) {
        (_, Some(sizes)) if sizes.len() == axes.len() => {
            for (&a, &s) in axes.iter().zip(&sizes) {
                out[a] = crate::shapes::extent(node, "size", s.max(0))?;
                scale[a] = out[a] as f32 / x[a].max(1) as f32;
            }
        }
        (Some(scales), _) if scales.len() == axes.len() => {
            for (&a, &s) in axes.iter().zip(&scales) {
                if !(s.is_finite() && s > 0.0) {
                    return Err(ModelError::invalid(node, format!("scale {s}")));
                }
                // A float past i64 saturates in the cast, and fails the bound.
                out[a] =
                    crate::shapes::extent(node, "scaled extent", (x[a] as f32 * s).floor() as i64)?;
                scale[a] = s;
            }
        }
        _ => {
            return Err(ModelError::invalid(
                node,
                "needs one of scales and sizes, one per axis",
            ))
        }
    }
    crate::shapes::check_shape(node, &out, crate::shapes::MAX_ELEMENTS as usize)?;
    let mut maps = Vec::with_capacity(rank);
    for d in 0..rank {
        let (n, m, s) = (x[d], out[d], scale[d]);
        let mut map = Vec::with_capacity(m);
        for j in 0..m {
            let src = source(node, &transform, j as f32, s, n, m)?;
            let i = nearest(node, &rounding, src)?;
            map.push(Some(i.clamp(0, n as i64 - 1).max(0) as usize));
        }
        maps.push(map);
    }
    Ok((Layout::Map { maps, fill: 0.0 }, out))
}

/// The input coordinate of output coordinate `j` (ONNX's `coordinate_transformation_mode`).
fn source(
    node: &Node,
    transform: &str,
    j: f32,
    scale: f32,
    n: usize,
    m: usize,
) -> Result<f32, ModelError> {
    Ok(match transform {
        "half_pixel" => (j + 0.5) / scale - 0.5,
        "pytorch_half_pixel" => {
            if m > 1 {
                (j + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        "asymmetric" => j / scale,
        "tf_half_pixel_for_nn" => (j + 0.5) / scale,
        "align_corners" => {
            if m > 1 {
                j * (n as f32 - 1.0) / (m as f32 - 1.0)
            } else {
                0.0
            }
        }
        "half_pixel_symmetric" => {
            let adjusted = m as f32 / scale;
            let center = n as f32 / 2.0;
            let offset = center * (1.0 - adjusted / n as f32);
            offset + (j + 0.5) / scale - 0.5
        }
        other => {
            return Err(ModelError::unsupported(
                node,
                format!("coordinate_transformation_mode `{other}`"),
            ))
        }
    })
}

/// The integer coordinate `nearest_mode` picks for `x`.
fn nearest(node: &Node, rounding: &str, x: f32) -> Result<i64, ModelError> {
    let halfway = (x - x.floor() - 0.5).abs() < 1e-6;
    Ok(match rounding {
        "round_prefer_floor" if halfway => x.floor(),
        "round_prefer_ceil" if halfway => x.ceil(),
        "round_prefer_floor" | "round_prefer_ceil" => x.round(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        other => {
            return Err(ModelError::unsupported(
                node,
                format!("nearest_mode `{other}`"),
            ))
        }
    } as i64)
}
