//! From the bytes of an ONNX file to a [`Graph`] with static shapes: decoding (prost, from
//! ONNX's own `onnx.proto`), then shape inference and constant folding ([`crate::infer`]),
//! then batch normalization folded into the convolutions before it ([`crate::fold`]).
//!
//! Graph inputs take their shapes from the model, except where [`ImportOptions::input_shapes`]
//! fixes them; a dynamic dimension (a `dim_param`, or a `dim_value` below 1) that nothing fixes
//! is an error naming the input, since every later step needs static shapes.

use crate::graph::{Attr, Elem, Graph, Node, Value, ValueId};
use crate::proto::{self, ModelProto};
use crate::tensor::{convert, dtype_name, elem_of};
use crate::ModelError;
use prost::Message;
use std::collections::{BTreeMap, HashMap};

/// How a model is imported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportOptions {
    /// Shapes that replace those the model declares for its inputs, by input name (what
    /// `--input-shape NAME=1x3x224x224` gives).
    pub input_shapes: BTreeMap<String, Vec<usize>>,
    /// Values for graph inputs, which then are constants of the model rather than inputs of
    /// each run: what a caller does with an input the importer needs at import (a shape, the
    /// scales of a `Resize`), as an exporter would have written it as an initializer.
    pub constants: BTreeMap<String, crate::graph::Data>,
}

/// Parses `NAME=D1xD2x...` (e.g. `x=1x3x224x224`) into the input's name and shape.
pub fn parse_input_shape(text: &str) -> Result<(String, Vec<usize>), String> {
    let bad = || format!("bad input shape `{text}`: expected NAME=D1xD2x... (e.g. x=1x3x224x224)");
    let (name, dims) = text.rsplit_once('=').ok_or_else(bad)?;
    if name.is_empty() || dims.is_empty() {
        return Err(bad());
    }
    let shape = dims
        .split('x')
        .map(|d| d.trim().parse::<usize>().ok().filter(|&d| d >= 1))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    Ok((name.to_string(), shape))
}

/// Decodes, infers shapes, folds constants and batch normalization: the graph every later
/// step works on.
pub fn import(bytes: &[u8], opts: &ImportOptions) -> Result<Graph, ModelError> {
    let model = ModelProto::decode(bytes).map_err(|e| ModelError::Decode(e.to_string()))?;
    let mut graph = from_proto(&model, opts)?;
    crate::infer::infer(&mut graph)?;
    crate::fold::fold_batchnorm(&mut graph)?;
    Ok(graph)
}

/// The version of the default op set the model imports.
fn opset(model: &ModelProto) -> Result<i64, ModelError> {
    model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .ok_or_else(|| ModelError::Malformed("the model imports no default ONNX op set".into()))
}

/// The raw graph: values and nodes as the file has them, shapes of node outputs not yet known.
fn from_proto(model: &ModelProto, opts: &ImportOptions) -> Result<Graph, ModelError> {
    let opset = opset(model)?;
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| ModelError::Malformed("the model has no graph".into()))?;
    let mut graph = Graph {
        opset,
        ..Graph::default()
    };
    let mut names: HashMap<String, ValueId> = HashMap::new();
    for t in &g.initializer {
        let data = convert(t)?;
        let name = t.name.clone().unwrap_or_default();
        let id = graph.add_value(Value {
            name: name.clone(),
            shape: data.shape(),
            elem: data.elem(),
            constant: Some(data),
        });
        names.insert(name, id);
    }
    for unknown in opts.input_shapes.keys().chain(opts.constants.keys()) {
        if !g
            .input
            .iter()
            .any(|i| i.name.as_deref() == Some(unknown.as_str()))
        {
            return Err(ModelError::InputShape {
                input: unknown.clone(),
                reason: format!("the model has no such input (it has: {})", input_list(g)),
            });
        }
    }
    for input in &g.input {
        let name = input.name.clone().unwrap_or_default();
        // An input that an initializer also names is a default the caller may override; a
        // model is run here with its initializers, as ONNX Runtime does.
        if names.contains_key(&name) {
            continue;
        }
        if let Some(data) = opts.constants.get(&name) {
            let id = graph.add_value(Value {
                name: name.clone(),
                shape: data.shape(),
                elem: data.elem(),
                constant: Some(data.clone()),
            });
            names.insert(name, id);
            continue;
        }
        let (elem, shape) = input_type(input, opts)?;
        let id = graph.add_value(Value {
            name: name.clone(),
            shape,
            elem,
            constant: None,
        });
        graph.inputs.push(id);
        names.insert(name, id);
    }
    for (i, n) in g.node.iter().enumerate() {
        let node = node_from_proto(n, i, &mut graph, &mut names)?;
        graph.nodes.push(node);
    }
    for o in &g.output {
        let name = o.name.clone().unwrap_or_default();
        let id = *names.get(&name).ok_or_else(|| {
            ModelError::Malformed(format!("graph output `{name}` is computed by no node"))
        })?;
        graph.outputs.push(id);
    }
    if graph.outputs.is_empty() {
        return Err(ModelError::Malformed("the graph has no outputs".into()));
    }
    Ok(graph)
}

fn input_list(g: &proto::GraphProto) -> String {
    let names: Vec<&str> = g.input.iter().filter_map(|i| i.name.as_deref()).collect();
    names.join(", ")
}

/// The element type and static shape of a graph input.
fn input_type(
    input: &proto::ValueInfoProto,
    opts: &ImportOptions,
) -> Result<(Elem, Vec<usize>), ModelError> {
    use proto::type_proto::Value as Ty;
    let name = input.name.clone().unwrap_or_default();
    let err = |reason: String| ModelError::InputShape {
        input: name.clone(),
        reason,
    };
    let Some(Ty::TensorType(t)) = input.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(err("only tensor inputs are supported".into()));
    };
    let data_type = t.elem_type.unwrap_or(0);
    if elem_of(data_type) != Elem::F32 {
        return Err(err(format!(
            "of type {}: only float inputs are supported",
            dtype_name(data_type)
        )));
    }
    let declared: DeclaredShape = t.shape.as_ref().map(declared_dims);
    if let Some(given) = opts.input_shapes.get(&name) {
        if let Some(decl) = &declared {
            let fits = decl.len() == given.len()
                && decl
                    .iter()
                    .zip(given)
                    .all(|(d, g)| d.is_none_or(|d| d == *g));
            if !fits {
                return Err(err(format!(
                    "the shape given, {}, does not fit the model's {}",
                    shape_text(&given.iter().map(|&g| Some(g)).collect::<Vec<_>>()),
                    shape_text(decl)
                )));
            }
        }
        return bounded(given.clone()).map_err(err).map(|s| (Elem::F32, s));
    }
    let decl = declared.ok_or_else(|| {
        err(format!(
            "the model declares no shape: give one with --input-shape {name}=..."
        ))
    })?;
    match decl.iter().copied().collect::<Option<Vec<usize>>>() {
        Some(shape) => bounded(shape).map_err(err).map(|s| (Elem::F32, s)),
        None => Err(err(format!(
            "dynamic shape {}: fix it with --input-shape {name}=...",
            shape_text(&decl)
        ))),
    }
}

/// An input's shape within the bounds every tensor of a model keeps
/// ([`crate::shapes::MAX_DIM`] an axis, [`crate::shapes::MAX_ELEMENTS`] in all): an input is
/// allocated and fed to kernels by this shape.
fn bounded(shape: Vec<usize>) -> Result<Vec<usize>, String> {
    match crate::shapes::out_of_bounds(&shape, crate::shapes::MAX_ELEMENTS as usize) {
        Some(why) => Err(why),
        None => Ok(shape),
    }
}

/// `1x3x?x?` for a shape with dynamic dimensions.
fn shape_text(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.map_or("?".to_string(), |d| d.to_string()))
        .collect();
    parts.join("x")
}

fn node_from_proto(
    n: &proto::NodeProto,
    index: usize,
    graph: &mut Graph,
    names: &mut HashMap<String, ValueId>,
) -> Result<Node, ModelError> {
    let op = n.op_type.clone().unwrap_or_default();
    let name = match n.name.as_deref() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => match n.output.first() {
            Some(o) if !o.is_empty() => o.clone(),
            _ => format!("#{index}"),
        },
    };
    let mut node = Node {
        name,
        op,
        inputs: Vec::with_capacity(n.input.len()),
        outputs: Vec::with_capacity(n.output.len()),
        attrs: BTreeMap::new(),
    };
    if !matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
        let domain = n.domain.clone().unwrap_or_default();
        return Err(ModelError::unsupported(
            &node,
            format!("op domain `{domain}`"),
        ));
    }
    for i in &n.input {
        if i.is_empty() {
            node.inputs.push(None);
            continue;
        }
        let id = names.get(i).copied().ok_or_else(|| {
            ModelError::Malformed(format!(
                "node `{}` reads `{i}`, which no earlier node, input or initializer defines",
                node.name
            ))
        })?;
        node.inputs.push(Some(id));
    }
    for a in &n.attribute {
        node.attrs
            .insert(a.name.clone().unwrap_or_default(), attr_from_proto(a)?);
    }
    // Trailing optional outputs left out are dropped; one left out in the middle still gets
    // a value, so that positions keep their meaning.
    let last = n
        .output
        .iter()
        .rposition(|o| !o.is_empty())
        .map_or(0, |p| p + 1);
    for o in &n.output[..last] {
        let id = graph.add_value(Value {
            name: o.clone(),
            shape: Vec::new(),
            elem: Elem::F32,
            constant: None,
        });
        if !o.is_empty() && names.insert(o.clone(), id).is_some() {
            return Err(ModelError::Malformed(format!(
                "value `{o}` is defined twice"
            )));
        }
        node.outputs.push(id);
    }
    Ok(node)
}

fn attr_from_proto(a: &proto::AttributeProto) -> Result<Attr, ModelError> {
    use proto::attribute_proto::AttributeType as T;
    let ty = a.r#type.and_then(|t| T::try_from(t).ok());
    Ok(match ty {
        Some(T::Int) => Attr::Int(a.i.unwrap_or(0)),
        Some(T::Float) => Attr::Float(a.f.unwrap_or(0.0)),
        Some(T::Ints) => Attr::Ints(a.ints.clone()),
        Some(T::Floats) => Attr::Floats(a.floats.clone()),
        Some(T::String) => Attr::Str(String::from_utf8_lossy(a.s.as_deref().unwrap_or(&[])).into()),
        Some(T::Tensor) => match &a.t {
            Some(t) => Attr::Tensor(convert(t)?),
            None => Attr::Other,
        },
        // Files written before attributes had a type field: guess from what is set.
        None if a.i.is_some() => Attr::Int(a.i.unwrap_or(0)),
        None if a.f.is_some() => Attr::Float(a.f.unwrap_or(0.0)),
        None if !a.ints.is_empty() => Attr::Ints(a.ints.clone()),
        None if !a.floats.is_empty() => Attr::Floats(a.floats.clone()),
        _ => Attr::Other,
    })
}

/// The names of the inputs a caller provides (those no initializer names), without importing
/// the rest of the model.
pub fn input_names(bytes: &[u8]) -> Result<Vec<String>, ModelError> {
    Ok(declared_inputs(bytes)?
        .into_iter()
        .map(|(n, _)| n)
        .collect())
}

/// The dimensions of a declared shape: `None` for a dynamic one (a `dim_param`, or a
/// `dim_value` below 1).
fn declared_dims(shape: &proto::TensorShapeProto) -> Vec<Option<usize>> {
    use proto::tensor_shape_proto::dimension::Value as Dim;
    shape
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(Dim::DimValue(v)) if *v >= 1 => Some(*v as usize),
            _ => None,
        })
        .collect()
}

/// An input's shape as the model declares it: `None` for no shape, `None` dimensions dynamic.
pub type DeclaredShape = Option<Vec<Option<usize>>>;

/// The inputs a caller provides (initializers left out), in the model's order, each with the
/// shape it declares, `None` for a dynamic dimension (a `dim_param`, or a `dim_value` below
/// 1), and `None` for the whole shape where it declares none: what a caller needs to tell
/// which dimension is the dynamic batch.
pub fn declared_inputs(bytes: &[u8]) -> Result<Vec<(String, DeclaredShape)>, ModelError> {
    use proto::type_proto::Value as Ty;
    let model = ModelProto::decode(bytes).map_err(|e| ModelError::Decode(e.to_string()))?;
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| ModelError::Malformed("the model has no graph".into()))?;
    let inits: std::collections::HashSet<&str> = g
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    Ok(g.input
        .iter()
        .filter_map(|i| Some((i.name.clone()?, i)))
        .filter(|(n, _)| !inits.contains(n.as_str()))
        .map(|(name, i)| {
            let shape = match i.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(Ty::TensorType(t)) => t.shape.as_ref().map(declared_dims),
                _ => None,
            };
            (name, shape)
        })
        .collect())
}

/// The op types of the model's nodes, in order, without importing it: what a caller needs to
/// tell whether a model uses only supported ops.
pub fn op_types(bytes: &[u8]) -> Result<Vec<String>, ModelError> {
    let model = ModelProto::decode(bytes).map_err(|e| ModelError::Decode(e.to_string()))?;
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| ModelError::Malformed("the model has no graph".into()))?;
    Ok(g.node
        .iter()
        .map(|n| n.op_type.clone().unwrap_or_default())
        .collect())
}
