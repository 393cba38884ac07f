//! Static shape inference and constant folding, one pass in topological order.
//!
//! A node whose inputs are all known at import (initializers, `Constant`s, the output of
//! `Shape`) and whose op `fold` evaluates is computed here and leaves the graph: the shape
//! arithmetic that exporters write (`Shape → Gather → Concat → Reshape`) becomes the constant
//! it always is once the input shapes are fixed. Every other node gets its output shape from
//! the same parsing of its attributes that later builds its task or layout step, and is
//! refused here, by name and op type, if nothing can run it.

use crate::graph::{Attr, Data, Elem, Graph, Node};
use crate::layout::{self, Layout};
use crate::{ew, ops, ModelError};
use ndarray::{ArrayD, Axis, IxDyn};

/// Infers every value's shape and folds what is known at import.
pub fn infer(graph: &mut Graph) -> Result<(), ModelError> {
    let nodes = std::mem::take(&mut graph.nodes);
    for node in nodes {
        if let Some(data) = fold(&node, graph)? {
            crate::shapes::check_shape(&node, &data.shape(), crate::shapes::MAX_FOLDED_ELEMENTS)?;
            let out = node.output()?;
            let v = &mut graph.values[out.index()];
            v.shape = data.shape();
            v.elem = data.elem();
            v.constant = Some(data);
            continue;
        }
        for i in node.inputs.iter().flatten() {
            let v = graph.value(*i);
            if v.constant.is_none() && v.elem != Elem::F32 {
                return Err(ModelError::unsupported(
                    &node,
                    format!("input `{}` is not float", v.name),
                ));
            }
        }
        let shape = out_shape(&node, graph)?;
        crate::shapes::check_shape(&node, &shape, crate::shapes::MAX_ELEMENTS as usize)?;
        for (k, o) in node.outputs.iter().enumerate() {
            if k > 0 && !graph.value(*o).name.is_empty() {
                return Err(ModelError::unsupported(&node, format!("output {k}")));
            }
        }
        let out = node.output()?;
        graph.values[out.index()].shape = shape;
        graph.nodes.push(node);
    }
    Ok(())
}

/// The output shape of a node computed at run time.
fn out_shape(node: &Node, graph: &Graph) -> Result<Vec<usize>, ModelError> {
    if layout::is_layout(&node.op) {
        return Ok(layout::from_node(node, graph)?.1);
    }
    if ops::ANCHOR_OPS.contains(&node.op.as_str()) {
        return Ok(ops::anchor(node, graph)?.out_shape());
    }
    if ew::is_elementwise(&node.op) {
        let x = graph.value(node.input(0)?).shape.clone();
        if matches!(node.op.as_str(), "BatchNormalization" | "Clip") {
            return Ok(x);
        }
        let mut shape = x;
        for i in node.inputs.iter().flatten().skip(1) {
            let s = &graph.value(*i).shape;
            shape = ew::broadcast(&shape, s).ok_or_else(|| {
                ModelError::invalid(node, format!("shapes {shape:?} and {s:?} do not broadcast"))
            })?;
        }
        return Ok(shape);
    }
    Err(ModelError::unsupported(node, "op type"))
}

/// The value of `node` when it can be computed at import.
fn fold(node: &Node, graph: &Graph) -> Result<Option<Data>, ModelError> {
    if node.op == "Constant" {
        return constant(node).map(Some);
    }
    if node.op == "Shape" {
        let s = &graph.value(node.input(0)?).shape;
        let r = s.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let start = clamp(node.int("start", 0)?);
        let end = clamp(node.int("end", r)?).max(start);
        let dims: Vec<i64> = s[start..end].iter().map(|&d| d as i64).collect();
        return Ok(Some(Data::I64(
            ArrayD::from_shape_vec(IxDyn(&[dims.len()]), dims)
                .map_err(|e| ModelError::invalid(node, e.to_string()))?,
        )));
    }
    let known: Option<Vec<&Data>> = node
        .inputs
        .iter()
        .flatten()
        .map(|i| graph.constant(*i))
        .collect();
    let Some(args) = known else {
        return Ok(None);
    };
    if args.is_empty() || node.outputs.len() != 1 {
        return Ok(None);
    }
    match node.op.as_str() {
        "Identity" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Transpose" | "Concat"
        | "Slice" | "Expand" => {
            let (op, shape) = layout::from_node(node, graph)?;
            Ok(Some(apply_layout(node, &op, &args, &shape)?))
        }
        "Cast" => cast(node, args[0]).map(Some),
        "Gather" => gather(node, args[0], args.get(1).copied()).map(Some),
        "Add" | "Sub" | "Mul" | "Div" if args.len() == 2 => arith(node, args[0], args[1]),
        "ConstantOfShape" => {
            let shape: Vec<usize> = args[0]
                .to_i64s()
                .iter()
                .map(|&d| crate::shapes::extent(node, "extent", d.max(0)))
                .collect::<Result<_, _>>()?;
            crate::shapes::check_shape(node, &shape, crate::shapes::MAX_FOLDED_ELEMENTS)?;
            let value = match node.attrs.get("value") {
                Some(Attr::Tensor(t)) => t.clone(),
                _ => Data::F32(ArrayD::zeros(IxDyn(&[1]))),
            };
            Ok(Some(match value {
                Data::F32(v) => Data::F32(ArrayD::from_elem(
                    IxDyn(&shape),
                    v.iter().copied().next().unwrap_or(0.0),
                )),
                Data::I64(v) => Data::I64(ArrayD::from_elem(
                    IxDyn(&shape),
                    v.iter().copied().next().unwrap_or(0),
                )),
            }))
        }
        _ => Ok(None),
    }
}

fn apply_layout(
    node: &Node,
    op: &Layout,
    args: &[&Data],
    shape: &[usize],
) -> Result<Data, ModelError> {
    let bad = || ModelError::invalid(node, "inputs of mixed types");
    // Only the data inputs take part: a concatenation's are all of them, the others' the first.
    let data: &[&Data] = if matches!(op, Layout::Concat(_)) {
        args
    } else {
        &args[..1]
    };
    let out = match data[0] {
        Data::F32(_) => {
            let views = data
                .iter()
                .map(|d| match d {
                    Data::F32(a) => Ok(a.view()),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            op.apply(&views, shape, 0.0).map(Data::F32)
        }
        Data::I64(_) => {
            let views = data
                .iter()
                .map(|d| match d {
                    Data::I64(a) => Ok(a.view()),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            op.apply(&views, shape, 0).map(Data::I64)
        }
    };
    out.ok_or_else(|| ModelError::invalid(node, "layout of constants failed"))
}

fn constant(node: &Node) -> Result<Data, ModelError> {
    let vec1 = |v: Vec<f32>| {
        Data::F32(
            ArrayD::from_shape_vec(IxDyn(&[v.len()]), v)
                .unwrap_or_else(|_| ArrayD::zeros(IxDyn(&[0]))),
        )
    };
    let ivec = |v: Vec<i64>| {
        Data::I64(
            ArrayD::from_shape_vec(IxDyn(&[v.len()]), v)
                .unwrap_or_else(|_| ArrayD::zeros(IxDyn(&[0]))),
        )
    };
    match node.attrs.iter().next() {
        Some((k, Attr::Tensor(t))) if k == "value" => Ok(t.clone()),
        Some((k, Attr::Float(f))) if k == "value_float" => {
            Ok(Data::F32(ArrayD::from_elem(IxDyn(&[]), *f)))
        }
        Some((k, Attr::Floats(f))) if k == "value_floats" => Ok(vec1(f.clone())),
        Some((k, Attr::Int(i))) if k == "value_int" => {
            Ok(Data::I64(ArrayD::from_elem(IxDyn(&[]), *i)))
        }
        Some((k, Attr::Ints(i))) if k == "value_ints" => Ok(ivec(i.clone())),
        Some((k, _)) => Err(ModelError::unsupported(
            node,
            format!("a constant given as `{k}`"),
        )),
        None => Err(ModelError::invalid(node, "no value")),
    }
}

fn cast(node: &Node, x: &Data) -> Result<Data, ModelError> {
    let to = node.int("to", 0)?;
    match crate::tensor::elem_of(to as i32) {
        Elem::F32 => Ok(Data::F32(match x {
            Data::F32(a) => a.clone(),
            Data::I64(a) => a.mapv(|v| v as f32),
        })),
        Elem::I64 => Ok(Data::I64(match x {
            Data::F32(a) => a.mapv(|v| v as i64),
            Data::I64(a) => a.clone(),
        })),
        Elem::Other(t) => Err(ModelError::unsupported(
            node,
            format!("a cast to {}", crate::tensor::dtype_name(t)),
        )),
    }
}

fn gather(node: &Node, data: &Data, indices: Option<&Data>) -> Result<Data, ModelError> {
    let indices = indices.ok_or_else(|| ModelError::invalid(node, "no indices"))?;
    let shape = data.shape();
    let axis = crate::shapes::axis(node, node.int("axis", 0)?, shape.len())?;
    let n = shape[axis] as i64;
    let idx: Vec<usize> = indices
        .to_i64s()
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + n } else { i };
            usize::try_from(j).ok().filter(|&j| j < shape[axis])
        })
        .collect::<Option<_>>()
        .ok_or_else(|| ModelError::invalid(node, "an index out of range"))?;
    let mut out_shape = shape[..axis].to_vec();
    out_shape.extend(indices.shape());
    out_shape.extend(&shape[axis + 1..]);
    let bad = |e: ndarray::ShapeError| ModelError::invalid(node, e.to_string());
    Ok(match data {
        Data::F32(a) => Data::F32(
            a.select(Axis(axis), &idx)
                .as_standard_layout()
                .into_owned()
                .into_shape_with_order(IxDyn(&out_shape))
                .map_err(bad)?,
        ),
        Data::I64(a) => Data::I64(
            a.select(Axis(axis), &idx)
                .as_standard_layout()
                .into_owned()
                .into_shape_with_order(IxDyn(&out_shape))
                .map_err(bad)?,
        ),
    })
}

/// `Add`, `Sub`, `Mul` or `Div` of constants, numpy-broadcast; integers divide truncating
/// (ONNX's integer `Div`), and a division by zero leaves the node to run time.
fn arith(node: &Node, a: &Data, b: &Data) -> Result<Option<Data>, ModelError> {
    let shape = ew::broadcast(&a.shape(), &b.shape()).ok_or_else(|| {
        ModelError::invalid(
            node,
            format!(
                "shapes {:?} and {:?} do not broadcast",
                a.shape(),
                b.shape()
            ),
        )
    })?;
    let sh = IxDyn(&shape);
    let bad = || ModelError::invalid(node, "operands do not broadcast");
    Ok(match (a, b) {
        (Data::I64(x), Data::I64(y)) => {
            let (x, y) = (
                x.broadcast(sh.clone()).ok_or_else(bad)?,
                y.broadcast(sh.clone()).ok_or_else(bad)?,
            );
            let mut out = Vec::with_capacity(x.len());
            for (p, q) in x.iter().zip(y.iter()) {
                out.push(match node.op.as_str() {
                    "Add" => p.wrapping_add(*q),
                    "Sub" => p.wrapping_sub(*q),
                    "Mul" => p.wrapping_mul(*q),
                    _ => match p.checked_div(*q) {
                        Some(v) => v,
                        None => return Ok(None),
                    },
                });
            }
            Some(Data::I64(
                ArrayD::from_shape_vec(sh, out).map_err(|_| bad())?,
            ))
        }
        (Data::F32(x), Data::F32(y)) => {
            let (x, y) = (
                x.broadcast(sh.clone()).ok_or_else(bad)?,
                y.broadcast(sh.clone()).ok_or_else(bad)?,
            );
            let f = |p: f32, q: f32| match node.op.as_str() {
                "Add" => p + q,
                "Sub" => p - q,
                "Mul" => p * q,
                _ => p / q,
            };
            let out: Vec<f32> = x.iter().zip(y.iter()).map(|(p, q)| f(*p, *q)).collect();
            Some(Data::F32(
                ArrayD::from_shape_vec(sh, out).map_err(|_| bad())?,
            ))
        }
        _ => None,
    })
}
