//! ONNX `TensorProto` to [`Data`]: floats stay `f32`, every integer type (and `bool`)
//! widens to `i64`; other types are refused.
//!
//! The element count the dims promise is checked against the bytes present before anything
//! is allocated, so a hostile file cannot ask for a huge array it does not contain.

use crate::graph::{Data, Elem};
use crate::proto::TensorProto;
use crate::ModelError;
use ndarray::{ArrayD, IxDyn};

/// `TensorProto.DataType` numbers the importer reads.
pub(crate) mod dtype {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const UINT16: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const UINT32: i32 = 12;
}

/// The element type of an ONNX data type number.
pub(crate) fn elem_of(data_type: i32) -> Elem {
    use dtype::*;
    match data_type {
        FLOAT => Elem::F32,
        UINT8 | INT8 | UINT16 | INT16 | INT32 | INT64 | BOOL | UINT32 => Elem::I64,
        other => Elem::Other(other),
    }
}

/// The name ONNX gives a data type number, for messages.
pub fn dtype_name(data_type: i32) -> String {
    let name = match data_type {
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        16 => "bfloat16",
        _ => return format!("data type {data_type}"),
    };
    name.to_string()
}

/// The dims of a tensor as a checked shape and its element count.
pub(crate) fn checked_shape(name: &str, dims: &[i64]) -> Result<(Vec<usize>, usize), ModelError> {
    let mut shape = Vec::with_capacity(dims.len());
    let mut count: usize = 1;
    for &d in dims {
        let d = usize::try_from(d)
            .map_err(|_| ModelError::Malformed(format!("tensor `{name}` has dimension {d}")))?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| ModelError::Malformed(format!("tensor `{name}` is too large")))?;
        shape.push(d);
    }
    Ok((shape, count))
}

/// Converts a tensor of the model (an initializer or an attribute).
pub(crate) fn convert(t: &TensorProto) -> Result<Data, ModelError> {
    let name = t.name.as_deref().unwrap_or("(unnamed)");
    // 1 is `EXTERNAL`: the data lives in a file beside the model.
    if t.data_location == Some(1) {
        return Err(ModelError::ExternalData(name.to_string()));
    }
    let (shape, count) = checked_shape(name, &t.dims)?;
    let data_type = t.data_type.unwrap_or(0);
    let raw = t.raw_data.as_deref();
    let mismatch = |have: usize| {
        ModelError::Malformed(format!(
            "tensor `{name}` has shape {shape:?} ({count} elements) but {have} elements of data"
        ))
    };
    match elem_of(data_type) {
        Elem::F32 => {
            let v: Vec<f32> = match raw {
                Some(b) if !b.is_empty() || t.float_data.is_empty() => {
                    if b.len() != count.saturating_mul(4) {
                        return Err(mismatch(b.len() / 4));
                    }
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                }
                _ => t.float_data.clone(),
            };
            if v.len() != count {
                return Err(mismatch(v.len()));
            }
            let a = ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|_| mismatch(count))?;
            Ok(Data::F32(a))
        }
        Elem::I64 => {
            let v = ints(t, data_type, raw, count).ok_or_else(|| mismatch(0))?;
            if v.len() != count {
                return Err(mismatch(v.len()));
            }
            let a = ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|_| mismatch(count))?;
            Ok(Data::I64(a))
        }
        Elem::Other(d) => Err(ModelError::Malformed(format!(
            "tensor `{name}` is of type {}, which the importer does not read",
            dtype_name(d)
        ))),
    }
}

/// The elements of an integer tensor, widened; `None` where the raw bytes do not divide into
/// elements of the type.
fn ints(t: &TensorProto, data_type: i32, raw: Option<&[u8]>, count: usize) -> Option<Vec<i64>> {
    use dtype::*;
    let Some(b) = raw.filter(|b| {
        !b.is_empty()
            || (t.int64_data.is_empty() && t.int32_data.is_empty() && t.uint64_data.is_empty())
    }) else {
        return Some(match data_type {
            INT64 => t.int64_data.clone(),
            UINT32 => t.uint64_data.iter().map(|&v| v as i64).collect(),
            _ => t.int32_data.iter().map(|&v| v as i64).collect(),
        });
    };
    let width = match data_type {
        INT64 => 8,
        INT32 | UINT32 => 4,
        INT16 | UINT16 => 2,
        _ => 1,
    };
    if b.len() != count.checked_mul(width)? {
        return None;
    }
    Some(
        b.chunks_exact(width)
            .map(|c| match (data_type, width) {
                (_, 8) => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                (INT32, 4) => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64,
                (_, 4) => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64,
                (INT16, 2) => i16::from_le_bytes([c[0], c[1]]) as i64,
                (_, 2) => u16::from_le_bytes([c[0], c[1]]) as i64,
                (INT8, _) => c[0] as i8 as i64,
                _ => c[0] as i64,
            })
            .collect(),
    )
}

/// Decodes a serialized `TensorProto` (the `.pb` files of ONNX's test data).
pub fn decode_tensor(bytes: &[u8]) -> Result<Data, ModelError> {
    use prost::Message;
    let t = TensorProto::decode(bytes).map_err(|e| ModelError::Decode(e.to_string()))?;
    convert(&t)
}
