//! Small ONNX models written in Rust, for tests and examples that must not depend on Python:
//! [`ModelBuilder`] encodes a graph with the same prost messages the importer decodes.

use crate::proto::{
    attribute_proto::AttributeType, tensor_shape_proto, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use prost::Message;

/// An attribute value for [`ModelBuilder::node`].
#[derive(Clone, Debug)]
pub enum AttrValue {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f32),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A string.
    Str(String),
}

/// Builds an ONNX model in memory.
#[derive(Clone, Debug, Default)]
pub struct ModelBuilder {
    graph: GraphProto,
    opset: i64,
}

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    use tensor_shape_proto::{dimension::Value, Dimension};
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(if d > 0 {
                Value::DimValue(d)
            } else {
                Value::DimParam("N".into())
            }),
            ..Dimension::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..TypeProto::default()
        }),
        ..ValueInfoProto::default()
    }
}

impl ModelBuilder {
    /// An empty model importing the default op set at version `opset`.
    pub fn new(opset: i64) -> ModelBuilder {
        ModelBuilder {
            graph: GraphProto::default(),
            opset,
        }
    }

    /// A float graph input; a dimension of 0 or less is dynamic.
    pub fn input(mut self, name: &str, dims: &[i64]) -> Self {
        self.graph.input.push(value_info(name, dims));
        self
    }

    /// A graph output.
    pub fn output(mut self, name: &str) -> Self {
        self.graph.output.push(ValueInfoProto {
            name: Some(name.into()),
            ..ValueInfoProto::default()
        });
        self
    }

    /// A float initializer.
    pub fn init(mut self, name: &str, dims: &[i64], data: Vec<f32>) -> Self {
        self.graph.initializer.push(TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(1),
            float_data: data,
            ..TensorProto::default()
        });
        self
    }

    /// An int64 initializer.
    pub fn init_i64(mut self, name: &str, dims: &[i64], data: Vec<i64>) -> Self {
        self.graph.initializer.push(TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(7),
            int64_data: data,
            ..TensorProto::default()
        });
        self
    }

    /// A node.
    pub fn node(
        mut self,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: &[(&str, AttrValue)],
    ) -> Self {
        let attribute = attrs
            .iter()
            .map(|(name, v)| {
                let mut a = AttributeProto {
                    name: Some((*name).into()),
                    ..AttributeProto::default()
                };
                match v {
                    AttrValue::Int(i) => {
                        a.i = Some(*i);
                        a.r#type = Some(AttributeType::Int as i32);
                    }
                    AttrValue::Float(f) => {
                        a.f = Some(*f);
                        a.r#type = Some(AttributeType::Float as i32);
                    }
                    AttrValue::Ints(v) => {
                        a.ints = v.clone();
                        a.r#type = Some(AttributeType::Ints as i32);
                    }
                    AttrValue::Str(s) => {
                        a.s = Some(s.clone().into_bytes());
                        a.r#type = Some(AttributeType::String as i32);
                    }
                }
                a
            })
            .collect();
        self.graph.node.push(NodeProto {
            name: Some(format!("{}_{}", op.to_lowercase(), self.graph.node.len())),
            op_type: Some(op.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute,
            ..NodeProto::default()
        });
        self
    }

    /// The encoded model.
    pub fn build(self) -> Vec<u8> {
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(self.opset),
            }],
            graph: Some(self.graph),
            ..ModelProto::default()
        }
        .encode_to_vec()
    }
}

/// `y = relu(x · W)`, `x: [2, 3]`, `W: [3, 4]` with `W[k][j] = k - j`.
pub fn mlp_bytes() -> Vec<u8> {
    let w: Vec<f32> = (0..3)
        .flat_map(|k| (0..4).map(move |j| (k - j) as f32))
        .collect();
    ModelBuilder::new(13)
        .input("x", &[2, 3])
        .init("W", &[3, 4], w)
        .node("MatMul", &["x", "W"], &["h"], &[])
        .node("Relu", &["h"], &["y"], &[])
        .output("y")
        .build()
}

/// [`mlp_bytes`] with a dynamic batch: `x: [N, 3]` (`N` a `dim_param`), `y: [N, 4]`.
pub fn mlp_dynamic_batch_bytes() -> Vec<u8> {
    let w: Vec<f32> = (0..3)
        .flat_map(|k| (0..4).map(move |j| (k - j) as f32))
        .collect();
    ModelBuilder::new(13)
        .input("x", &[-1, 3])
        .init("W", &[3, 4], w)
        .node("MatMul", &["x", "W"], &["h"], &[])
        .node("Relu", &["h"], &["y"], &[])
        .output("y")
        .build()
}

/// Values of `shape` from a seed, in [-1, 1) (xorshift: reproducible, no dependency).
pub fn random(shape: &[usize], seed: u64) -> ndarray::ArrayD<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(shape), |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 2000) as f32 / 1000.0 - 1.0
    })
}
