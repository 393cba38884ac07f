//! The model graph as the importer holds it: values and nodes in arenas, referred to by
//! [`ValueId`], with the ONNX attributes of each node.
//!
//! Invariants after [`crate::import()`]:
//! - nodes are in topological order (a node reads only graph inputs, constants and outputs
//!   of earlier nodes; ONNX requires the same of a file, and the importer checks it);
//! - every value has a static shape, and a value whose contents are known at import (an
//!   initializer, a `Constant`, or a node folded because all its inputs were known) holds
//!   them in [`Value::constant`] and is produced by no node;
//! - every tensor computed at run time is `f32`; `i64` tensors exist only as constants
//!   (shapes, axes, pads), which is what a CNN uses them for.

use ndarray::ArrayD;
use std::collections::BTreeMap;

/// The id of a value of a [`Graph`]: an index into [`Graph::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The index into [`Graph::values`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The contents of a tensor known at import.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// Float tensors (weights, biases, scalars of elementwise ops).
    F32(ArrayD<f32>),
    /// Integer tensors (shapes, axes, pads); every ONNX integer type is widened to `i64`.
    I64(ArrayD<i64>),
}

impl Data {
    /// The shape.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Data::F32(a) => a.shape().to_vec(),
            Data::I64(a) => a.shape().to_vec(),
        }
    }

    /// The elements as integers (floats truncated), row-major.
    pub fn to_i64s(&self) -> Vec<i64> {
        match self {
            Data::F32(a) => a.iter().map(|&v| v as i64).collect(),
            Data::I64(a) => a.iter().copied().collect(),
        }
    }

    /// The elements as floats, row-major.
    pub fn to_f32s(&self) -> Vec<f32> {
        match self {
            Data::F32(a) => a.iter().copied().collect(),
            Data::I64(a) => a.iter().map(|&v| v as f32).collect(),
        }
    }

    /// The element type.
    pub fn elem(&self) -> Elem {
        match self {
            Data::F32(_) => Elem::F32,
            Data::I64(_) => Elem::I64,
        }
    }
}

/// The element type of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// `float`.
    F32,
    /// Any integer type (held as `i64`; only constants).
    I64,
    /// Another ONNX type, by its `TensorProto.DataType` number.
    Other(i32),
}

/// One tensor of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// Its name in the model.
    pub name: String,
    /// Static shape (known for every value after import).
    pub shape: Vec<usize>,
    /// Element type.
    pub elem: Elem,
    /// The contents, for a value known at import.
    pub constant: Option<Data>,
}

/// An attribute of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// `INT`.
    Int(i64),
    /// `FLOAT`.
    Float(f32),
    /// `INTS`.
    Ints(Vec<i64>),
    /// `FLOATS`.
    Floats(Vec<f32>),
    /// `STRING` (as UTF-8, lossily).
    Str(String),
    /// `TENSOR`.
    Tensor(Data),
    /// Any other kind (graphs, sparse tensors, ...): kept only to be refused by name.
    Other,
}

/// One node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Its name (its first output's name where the model gives none).
    pub name: String,
    /// Its op type (`Conv`, `Relu`, ...).
    pub op: String,
    /// Its inputs; `None` for an optional input left out.
    pub inputs: Vec<Option<ValueId>>,
    /// Its outputs.
    pub outputs: Vec<ValueId>,
    /// Its attributes by name.
    pub attrs: BTreeMap<String, Attr>,
}

/// A model's graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// Every value.
    pub values: Vec<Value>,
    /// The nodes computed at run time, in topological order.
    pub nodes: Vec<Node>,
    /// The graph inputs a caller provides, in the model's order.
    pub inputs: Vec<ValueId>,
    /// The graph outputs, in the model's order.
    pub outputs: Vec<ValueId>,
    /// The version of the default ONNX op set the model imports.
    pub opset: i64,
}

impl Graph {
    /// The value `id`.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }

    /// Adds a value and returns its id.
    pub fn add_value(&mut self, value: Value) -> ValueId {
        let id = ValueId(self.values.len() as u32);
        self.values.push(value);
        id
    }

    /// The contents of `id` when known at import.
    pub fn constant(&self, id: ValueId) -> Option<&Data> {
        self.value(id).constant.as_ref()
    }

    /// How many nodes read each value, plus one for each time it is a graph output.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0; self.values.len()];
        for n in &self.nodes {
            for i in n.inputs.iter().flatten() {
                uses[i.index()] += 1;
            }
        }
        for o in &self.outputs {
            uses[o.index()] += 1;
        }
        uses
    }
}

impl Node {
    /// The `i`-th input, which the op requires.
    pub fn input(&self, i: usize) -> Result<ValueId, crate::ModelError> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| crate::ModelError::invalid(self, format!("input {i} is missing")))
    }

    /// The `i`-th input where it is given.
    pub fn opt_input(&self, i: usize) -> Option<ValueId> {
        self.inputs.get(i).copied().flatten()
    }

    /// The first output.
    pub fn output(&self) -> Result<ValueId, crate::ModelError> {
        self.outputs
            .first()
            .copied()
            .ok_or_else(|| crate::ModelError::invalid(self, "the node has no output"))
    }

    /// An integer attribute, or `default`.
    pub fn int(&self, name: &str, default: i64) -> Result<i64, crate::ModelError> {
        match self.attrs.get(name) {
            None => Ok(default),
            Some(Attr::Int(v)) => Ok(*v),
            Some(_) => Err(self.bad_attr(name, "an integer")),
        }
    }

    /// A float attribute, or `default`.
    pub fn float(&self, name: &str, default: f32) -> Result<f32, crate::ModelError> {
        match self.attrs.get(name) {
            None => Ok(default),
            Some(Attr::Float(v)) => Ok(*v),
            Some(Attr::Int(v)) => Ok(*v as f32),
            Some(_) => Err(self.bad_attr(name, "a float")),
        }
    }

    /// An integer-list attribute, or `None` where absent.
    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, crate::ModelError> {
        match self.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Int(v)) => Ok(Some(vec![*v])),
            Some(_) => Err(self.bad_attr(name, "a list of integers")),
        }
    }

    /// A string attribute, or `default`.
    pub fn string(&self, name: &str, default: &str) -> Result<String, crate::ModelError> {
        match self.attrs.get(name) {
            None => Ok(default.to_string()),
            Some(Attr::Str(s)) => Ok(s.clone()),
            Some(_) => Err(self.bad_attr(name, "a string")),
        }
    }

    fn bad_attr(&self, name: &str, want: &str) -> crate::ModelError {
        crate::ModelError::invalid(self, format!("attribute `{name}` must be {want}"))
    }
}
