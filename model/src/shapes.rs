//! The shape arithmetic of the layout ops (`Reshape` and its kin, `Pad`, `Slice`,
//! `Expand`), shared by shape inference, constant folding and the executor, so that all three
//! read an op's attributes one way.

use crate::graph::{Graph, Node};
use crate::layout::Layout;
use crate::ModelError;

/// The largest extent of one axis a model's tensors, windows, strides and paddings may have
/// (the op library's own bound on a workload's dimensions): numbers from a model file are
/// checked against it before anything is sized or allocated by them, so that a hostile or
/// damaged model fails with an error instead of overflowing or exhausting memory.
pub const MAX_DIM: i64 = tensortune_schedules::ops::MAX_DIM;

/// The most elements a tensor of a model may have (the op library's bound on a workload).
pub const MAX_ELEMENTS: i64 = tensortune_schedules::ops::MAX_ELEMENTS;

/// The most elements a constant folded at import may have: folding materializes it (and
/// `ConstantOfShape` of a model's numbers could ask for any size); the shape arithmetic that
/// folding exists for is a few integers, and a mask of 4096 x 4096 is 2^24.
pub const MAX_FOLDED_ELEMENTS: usize = 1 << 28;

/// An output extent computed from a model's numbers, checked against [`MAX_DIM`].
pub fn extent(node: &Node, what: &str, e: i64) -> Result<usize, ModelError> {
    if (0..=MAX_DIM).contains(&e) {
        Ok(e as usize)
    } else {
        Err(ModelError::invalid(
            node,
            format!("{what} {e}: extents must be 0 to {MAX_DIM}"),
        ))
    }
}

/// Checks a shape computed for `node`: each extent at most [`MAX_DIM`], the elements at most
/// `max_elements`.
pub fn check_shape(node: &Node, shape: &[usize], max_elements: usize) -> Result<(), ModelError> {
    match out_of_bounds(shape, max_elements) {
        Some(why) => Err(ModelError::invalid(
            node,
            format!("output shape {shape:?}: {why}"),
        )),
        None => Ok(()),
    }
}

/// What is wrong with `shape` against the bounds (an extent past [`MAX_DIM`], more than
/// `max_elements` elements), or `None`.
pub(crate) fn out_of_bounds(shape: &[usize], max_elements: usize) -> Option<String> {
    if let Some(d) = shape.iter().find(|&&d| d as u64 > MAX_DIM as u64) {
        return Some(format!("extent {d} (at most {MAX_DIM})"));
    }
    let count = shape.iter().fold(1usize, |a, &d| a.saturating_mul(d));
    (count > max_elements).then(|| format!("{count} elements (at most {max_elements})"))
}

/// Axis `a` of a rank-`rank` tensor, negative counting from the end.
pub fn axis(node: &Node, a: i64, rank: usize) -> Result<usize, ModelError> {
    let r = rank as i64;
    let i = if a < 0 { a + r } else { a };
    if (0..r).contains(&i) {
        Ok(i as usize)
    } else {
        Err(ModelError::invalid(
            node,
            format!("axis {a} is out of range for rank {rank}"),
        ))
    }
}

/// The integers of input `i` where it is given; it must be known at import.
pub fn const_ints(node: &Node, graph: &Graph, i: usize) -> Result<Option<Vec<i64>>, ModelError> {
    let Some(v) = node.opt_input(i) else {
        return Ok(None);
    };
    match graph.constant(v) {
        Some(d) => Ok(Some(d.to_i64s())),
        None => Err(ModelError::unsupported(
            node,
            format!(
                "input {i} (`{}`) must be known at import",
                graph.value(v).name
            ),
        )),
    }
}

/// The axes of `Squeeze`/`Unsqueeze`: an attribute before opset 13, an input after.
fn axes_of(node: &Node, graph: &Graph) -> Result<Option<Vec<i64>>, ModelError> {
    match node.ints("axes")? {
        Some(a) => Ok(Some(a)),
        None => const_ints(node, graph, 1),
    }
}

/// The output shape of `Reshape`, `Flatten`, `Squeeze` or `Unsqueeze` on an input of
/// shape `x`.
pub fn reshaped(node: &Node, graph: &Graph, x: &[usize]) -> Result<Vec<usize>, ModelError> {
    let count: usize = x.iter().product();
    let shape = match node.op.as_str() {
        "Flatten" => {
            let a = node.int("axis", 1)?;
            let a = if a == x.len() as i64 {
                x.len()
            } else {
                axis(node, a, x.len())?
            };
            let outer: usize = x[..a].iter().product();
            vec![outer, x[a..].iter().product()]
        }
        "Squeeze" => {
            let axes = match axes_of(node, graph)? {
                Some(a) => a
                    .iter()
                    .map(|&a| axis(node, a, x.len()))
                    .collect::<Result<Vec<_>, _>>()?,
                None => (0..x.len()).filter(|&d| x[d] == 1).collect(),
            };
            if axes.iter().any(|&a| x[a] != 1) {
                return Err(ModelError::invalid(
                    node,
                    "squeezes an axis whose extent is not 1",
                ));
            }
            (0..x.len())
                .filter(|d| !axes.contains(d))
                .map(|d| x[d])
                .collect()
        }
        "Unsqueeze" => {
            let axes = axes_of(node, graph)?.ok_or_else(|| ModelError::invalid(node, "no axes"))?;
            let rank = x.len() + axes.len();
            let axes = axes
                .iter()
                .map(|&a| axis(node, a, rank))
                .collect::<Result<Vec<_>, _>>()?;
            let mut rest = x.iter();
            (0..rank)
                .map(|d| {
                    if axes.contains(&d) {
                        1
                    } else {
                        rest.next().copied().unwrap_or(1)
                    }
                })
                .collect()
        }
        _ => reshape_target(node, graph, x, count)?,
    };
    if shape.iter().product::<usize>() != count {
        return Err(ModelError::invalid(
            node,
            format!("cannot reshape {x:?} to {shape:?}"),
        ));
    }
    Ok(shape)
}

/// `Reshape`'s target: `0` copies the input's extent (unless `allowzero`), one `-1` takes
/// what is left.
fn reshape_target(
    node: &Node,
    graph: &Graph,
    x: &[usize],
    count: usize,
) -> Result<Vec<usize>, ModelError> {
    let target = const_ints(node, graph, 1)?
        .or(node.ints("shape")?)
        .ok_or_else(|| ModelError::invalid(node, "no target shape"))?;
    let allow_zero = node.int("allowzero", 0)? != 0;
    let mut shape = Vec::with_capacity(target.len());
    let mut infer = None;
    for (d, &t) in target.iter().enumerate() {
        match t {
            -1 if infer.is_none() => {
                infer = Some(d);
                shape.push(1);
            }
            0 if !allow_zero => shape.push(*x.get(d).ok_or_else(|| {
                ModelError::invalid(node, "a 0 in the shape beyond the input's rank")
            })?),
            t if t >= 0 => shape.push(t as usize),
            _ => {
                return Err(ModelError::invalid(
                    node,
                    format!("bad target shape {target:?}"),
                ))
            }
        }
    }
    if let Some(d) = infer {
        let known: usize = shape.iter().product();
        if known == 0 || !count.is_multiple_of(known) {
            return Err(ModelError::invalid(
                node,
                format!("cannot reshape {x:?} to {target:?}"),
            ));
        }
        shape[d] = count / known;
    }
    Ok(shape)
}

/// `Pad`: per axis, output coordinate `j` reads `j - begin`, or for `edge`/`reflect` the
/// clamped or mirrored coordinate; negative pads crop.
pub fn pad(node: &Node, graph: &Graph, x: &[usize]) -> Result<(Layout, Vec<usize>), ModelError> {
    let rank = x.len();
    let (pads, value) = if graph.opset < 11 {
        (node.ints("pads")?, node.float("value", 0.0)?)
    } else {
        let v = match node.opt_input(2).and_then(|v| graph.constant(v)) {
            Some(d) => d.to_f32s().first().copied().unwrap_or(0.0),
            None if node.opt_input(2).is_some() => {
                return Err(ModelError::unsupported(
                    node,
                    "a constant_value known only at run time",
                ))
            }
            None => 0.0,
        };
        (const_ints(node, graph, 1)?, v)
    };
    let pads = pads.ok_or_else(|| ModelError::invalid(node, "no pads"))?;
    let axes: Vec<usize> = match const_ints(node, graph, 3)? {
        Some(a) => a
            .iter()
            .map(|&a| axis(node, a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(ModelError::invalid(
            node,
            format!("{} pads for {} axes", pads.len(), axes.len()),
        ));
    }
    let mode = node.string("mode", "constant")?;
    if !matches!(mode.as_str(), "constant" | "edge" | "reflect" | "wrap") {
        return Err(ModelError::unsupported(node, format!("mode `{mode}`")));
    }
    if let Some(p) = pads.iter().find(|p| p.unsigned_abs() > MAX_DIM as u64) {
        return Err(ModelError::invalid(
            node,
            format!("pad {p}: pads must be within {MAX_DIM} either way"),
        ));
    }
    let mut maps: Vec<Vec<Option<usize>>> = x.iter().map(|&n| (0..n).map(Some).collect()).collect();
    let mut shape = x.to_vec();
    for (k, &a) in axes.iter().enumerate() {
        let (b, e, n) = (pads[k], pads[k + axes.len()], x[a] as i64);
        // Bounded: each of the three is within 2^24.
        let out = extent(node, "padded extent", n + b + e)
            .map_err(|_| ModelError::invalid(node, format!("pads {b}, {e} on an axis of {n}")))?
            as i64;
        if out < 0 || (mode != "constant" && n == 0) || (mode == "reflect" && (b >= n || e >= n)) {
            return Err(ModelError::invalid(
                node,
                format!("pads {b}, {e} on an axis of {n}"),
            ));
        }
        maps[a] = (0..out)
            .map(|j| {
                let i = j - b;
                match mode.as_str() {
                    "edge" => Some(i.clamp(0, n - 1) as usize),
                    "wrap" => Some(i.rem_euclid(n) as usize),
                    "reflect" => {
                        let period = 2 * (n - 1).max(1);
                        let m = i.rem_euclid(period);
                        Some((if m >= n { period - m } else { m }) as usize)
                    }
                    _ => (0..n).contains(&i).then_some(i as usize),
                }
            })
            .collect();
        shape[a] = out as usize;
    }
    Ok((Layout::Map { maps, fill: value }, shape))
}

/// `Slice` (opset 10 on: starts, ends, axes, steps as inputs; before: attributes).
pub fn slice(node: &Node, graph: &Graph, x: &[usize]) -> Result<(Layout, Vec<usize>), ModelError> {
    let rank = x.len();
    let get = |i: usize, attr: &str| -> Result<Option<Vec<i64>>, ModelError> {
        if graph.opset < 10 {
            node.ints(attr)
        } else {
            const_ints(node, graph, i)
        }
    };
    let starts = get(1, "starts")?.ok_or_else(|| ModelError::invalid(node, "no starts"))?;
    let ends = get(2, "ends")?.ok_or_else(|| ModelError::invalid(node, "no ends"))?;
    let axes: Vec<usize> = match get(3, "axes")? {
        Some(a) => a
            .iter()
            .map(|&a| axis(node, a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = get(4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(ModelError::invalid(
            node,
            "starts, ends, axes and steps differ in length",
        ));
    }
    let mut maps: Vec<Vec<Option<usize>>> = x.iter().map(|&n| (0..n).map(Some).collect()).collect();
    let mut shape = x.to_vec();
    for k in 0..starts.len() {
        let (a, step) = (axes[k], steps[k]);
        let n = x[a] as i64;
        if step == 0 {
            return Err(ModelError::invalid(node, "a step of 0"));
        }
        let norm = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
        let (start, end) = if step > 0 {
            (norm(starts[k]).clamp(0, n), norm(ends[k]).clamp(0, n))
        } else {
            (
                norm(starts[k]).clamp(0, n - 1),
                norm(ends[k]).clamp(-1, n - 1),
            )
        };
        let mut coords = Vec::new();
        let mut i = start;
        while (step > 0 && i < end) || (step < 0 && i > end) {
            coords.push(Some(i as usize));
            i += step;
        }
        shape[a] = coords.len();
        maps[a] = coords;
    }
    Ok((Layout::Map { maps, fill: 0.0 }, shape))
}

/// `Expand`: numpy broadcasting of the input to the given shape.
pub fn expand(node: &Node, graph: &Graph, x: &[usize]) -> Result<(Layout, Vec<usize>), ModelError> {
    let target =
        const_ints(node, graph, 1)?.ok_or_else(|| ModelError::invalid(node, "no shape"))?;
    let target: Vec<usize> = target
        .iter()
        .map(|&t| extent(node, "expanded extent", t.max(0)))
        .collect::<Result<_, _>>()?;
    let shape = crate::ew::broadcast(x, &target)
        .ok_or_else(|| ModelError::invalid(node, format!("{x:?} does not expand to {target:?}")))?;
    check_shape(node, &shape, MAX_ELEMENTS as usize)?;
    let off = shape.len() - x.len();
    // The leading new axes have extent 1 in the input: they read coordinate 0.
    let maps = (0..shape.len())
        .map(|d| {
            let from = if d < off { 1 } else { x[d - off] };
            (0..shape[d])
                .map(|j| Some(if from == 1 { 0 } else { j }))
                .collect()
        })
        .collect();
    Ok((Layout::Map { maps, fill: 0.0 }, shape))
}
