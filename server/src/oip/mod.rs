//! The Open Inference Protocol v2 (KServe's and Triton's "v2" REST protocol) on the wire: request,
//! response and metadata bodies, the tensors in them to and from the host tensor, and Triton's
//! binary tensor extension (JSON header, then raw little-endian bytes, the header's length in
//! `Inference-Header-Content-Length`), which `tritonclient` uses by default. Both the server
//! (`kiln-agent serve`) and the warmer (the agent checking a serving pod) speak through it.
//! Pure; every body is hostile: shapes, sizes and values are checked before a byte is trusted.

pub mod binary;
pub mod config;

use safetensors::Dtype;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use kiln_engines::backend::tensor::HostTensor;

/// The header that carries the JSON part's length in the binary extension.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// Largest element count of one tensor in a body (the body's byte limit bounds it too).
pub const MAX_ELEMENTS: usize = 1 << 28;

/// One tensor as the protocol writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WireTensor {
    /// Tensor name.
    pub name: String,
    /// Extents, outermost first.
    pub shape: Vec<i64>,
    /// `FP32`, `INT64`, …
    pub datatype: String,
    /// `binary_data_size` (the binary extension) and others, passed through.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Map::is_empty"
    )]
    pub parameters: Map<String, Value>,
    /// Elements, row-major, flat or nested; absent when they travel as binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// An output the client asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// `binary_data: true` asks for the binary extension.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Map::is_empty"
    )]
    pub parameters: Map<String, Value>,
}

/// `POST /v2/models/{name}/infer`'s body.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InferRequest {
    /// Echoed in the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `binary_data_output: true` asks for every output in binary.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Map::is_empty"
    )]
    pub parameters: Map<String, Value>,
    /// Inputs.
    pub inputs: Vec<WireTensor>,
    /// Outputs asked for; all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Vec<RequestedOutput>>,
}

/// The infer response's body.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    /// The request's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Outputs.
    pub outputs: Vec<WireTensor>,
}

/// One input or output in the model metadata.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorMetadata {
    /// Name.
    pub name: String,
    /// Protocol datatype.
    pub datatype: String,
    /// Extents, -1 where they vary.
    pub shape: Vec<i64>,
}

/// `GET /v2/models/{name}`'s body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelMetadata {
    /// Model name.
    pub name: String,
    /// Versions served.
    #[serde(default, deserialize_with = "null_as_default")]
    pub versions: Vec<String>,
    /// The engine (`onnxruntime/cpu`, `tract`, `llamacpp`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub platform: String,
    /// Inputs.
    #[serde(default, deserialize_with = "null_as_default")]
    pub inputs: Vec<TensorMetadata>,
    /// Outputs.
    #[serde(default, deserialize_with = "null_as_default")]
    pub outputs: Vec<TensorMetadata>,
    /// How the server runs it (kiln: `instances`, `workers`, `maxQueue`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Map::is_empty"
    )]
    pub parameters: Map<String, Value>,
}

/// An optional field written as `null` read as absent: KServe's ModelServer writes
/// `"versions": null` in model metadata and `"parameters": null` on every tensor.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// An error body (`{"error": "..."}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}

/// The protocol's name of an element type; `None` for one it has no name for.
pub fn datatype(dtype: Dtype) -> Option<&'static str> {
    Some(match dtype {
        Dtype::BOOL => "BOOL",
        Dtype::U8 => "UINT8",
        Dtype::U16 => "UINT16",
        Dtype::U32 => "UINT32",
        Dtype::U64 => "UINT64",
        Dtype::I8 => "INT8",
        Dtype::I16 => "INT16",
        Dtype::I32 => "INT32",
        Dtype::I64 => "INT64",
        Dtype::F16 => "FP16",
        Dtype::BF16 => "BF16",
        Dtype::F32 => "FP32",
        Dtype::F64 => "FP64",
        _ => return None,
    })
}

/// The element type a protocol name stands for.
pub fn dtype_of(datatype: &str) -> Option<Dtype> {
    [
        Dtype::BOOL,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::F16,
        Dtype::BF16,
        Dtype::F32,
        Dtype::F64,
    ]
    .into_iter()
    .find(|d| self::datatype(*d) == Some(datatype))
}

/// Bytes per element of a dtype the protocol names.
pub fn element_bytes(dtype: Dtype) -> usize {
    dtype.bitsize().div_ceil(8)
}

/// The checked shape of a wire tensor and its element count.
pub fn shape_of(t: &WireTensor) -> Result<(Vec<usize>, usize), String> {
    let mut shape = Vec::with_capacity(t.shape.len());
    let mut count: usize = 1;
    for &d in &t.shape {
        let d = usize::try_from(d).map_err(|_| {
            format!(
                "tensor {:?}: shape {:?} has a negative extent",
                t.name, t.shape
            )
        })?;
        count = count
            .checked_mul(d)
            .filter(|c| *c <= MAX_ELEMENTS)
            .ok_or_else(|| {
                format!(
                    "tensor {:?}: shape {:?} holds more than {MAX_ELEMENTS} elements",
                    t.name, t.shape
                )
            })?;
        shape.push(d);
    }
    Ok((shape, count))
}

/// A wire tensor whose elements are in `data` (JSON) or in `binary` (the binary extension's
/// bytes for it) as a host tensor.
pub fn to_host(t: &WireTensor, binary: Option<&[u8]>) -> Result<HostTensor, String> {
    let dtype = dtype_of(&t.datatype).ok_or_else(|| {
        format!(
            "tensor {:?}: datatype {:?} is not one kiln serves (BOOL, UINT8–64, INT8–64, FP16, BF16, FP32, FP64)",
            t.name, t.datatype
        )
    })?;
    let (shape, count) = shape_of(t)?;
    let want = count * element_bytes(dtype);
    let data = match (binary, &t.data) {
        (Some(bytes), _) => {
            if bytes.len() != want {
                return Err(format!(
                    "tensor {:?}: {} binary bytes, shape {:?} of {} needs {want}",
                    t.name,
                    bytes.len(),
                    t.shape,
                    t.datatype
                ));
            }
            bytes.to_vec()
        }
        (None, Some(data)) => {
            let mut flat = Vec::with_capacity(count);
            flatten(data, &mut flat, count).map_err(|m| format!("tensor {:?}: {m}", t.name))?;
            if flat.len() != count {
                return Err(format!(
                    "tensor {:?}: {} elements, shape {:?} holds {count}",
                    t.name,
                    flat.len(),
                    t.shape
                ));
            }
            encode(dtype, &flat).map_err(|m| format!("tensor {:?}: {m}", t.name))?
        }
        (None, None) => return Err(format!("tensor {:?} has no data", t.name)),
    };
    Ok(HostTensor { dtype, shape, data })
}

/// A host tensor as a wire tensor with its elements in JSON.
pub fn from_host(name: &str, t: &HostTensor) -> Result<WireTensor, String> {
    let datatype = datatype(t.dtype)
        .ok_or_else(|| format!("output {name:?}: dtype {:?} has no protocol name", t.dtype))?;
    Ok(WireTensor {
        name: name.to_string(),
        shape: t.shape.iter().map(|d| *d as i64).collect(),
        datatype: datatype.to_string(),
        parameters: Map::new(),
        data: Some(Value::Array(decode(t)?)),
    })
}

/// A host tensor as a wire tensor whose elements travel as binary (`binary_data_size`); the
/// bytes are the host tensor's own.
pub fn from_host_binary(name: &str, t: &HostTensor) -> Result<WireTensor, String> {
    let datatype = datatype(t.dtype)
        .ok_or_else(|| format!("output {name:?}: dtype {:?} has no protocol name", t.dtype))?;
    let mut parameters = Map::new();
    parameters.insert("binary_data_size".into(), Value::from(t.data.len()));
    Ok(WireTensor {
        name: name.to_string(),
        shape: t.shape.iter().map(|d| *d as i64).collect(),
        datatype: datatype.to_string(),
        parameters,
        data: None,
    })
}

/// `binary_data_size` of a wire tensor, when it has one.
pub fn binary_size(t: &WireTensor) -> Result<Option<usize>, String> {
    match t.parameters.get("binary_data_size") {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "tensor {:?}: binary_data_size {v} is not a byte count",
                    t.name
                )
            }),
    }
}

/// Whether a request asks for an output in binary.
pub fn wants_binary(request: &InferRequest, output: &str) -> bool {
    let flag = |p: &Map<String, Value>, key: &str| p.get(key).and_then(Value::as_bool);
    let asked = request
        .outputs
        .iter()
        .flatten()
        .find(|o| o.name == output)
        .and_then(|o| flag(&o.parameters, "binary_data"));
    asked.unwrap_or_else(|| flag(&request.parameters, "binary_data_output").unwrap_or(false))
}

/// Row-major leaves of `value` (nested arrays or a flat one), at most `limit` of them.
fn flatten(value: &Value, out: &mut Vec<Value>, limit: usize) -> Result<(), String> {
    match value {
        Value::Array(items) => {
            for item in items {
                flatten(item, out, limit)?;
            }
            Ok(())
        }
        leaf @ (Value::Number(_) | Value::Bool(_)) => {
            if out.len() == limit {
                return Err(format!("more than the shape's {limit} elements"));
            }
            out.push(leaf.clone());
            Ok(())
        }
        other => Err(format!("element {other} is not a number or a boolean")),
    }
}

/// JSON elements as little-endian bytes of `dtype`, every value checked to fit.
fn encode(dtype: Dtype, values: &[Value]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(values.len() * element_bytes(dtype));
    for v in values {
        encode_one(dtype, v, &mut out)?;
    }
    Ok(out)
}

fn encode_one(dtype: Dtype, v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    let int = |v: &Value| -> Result<i128, String> {
        match v {
            Value::Bool(b) => Ok(i128::from(*b)),
            Value::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .ok_or_else(|| format!("{n} is not an integer")),
            _ => Err(format!("{v} is not a number")),
        }
    };
    let float = |v: &Value| -> Result<f64, String> {
        match v {
            Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a number")),
            _ => Err(format!("{v} is not a number")),
        }
    };
    macro_rules! put_int {
        ($t:ty) => {{
            let i = int(v)?;
            let x =
                <$t>::try_from(i).map_err(|_| format!("{i} does not fit {}", stringify!($t)))?;
            out.extend_from_slice(&x.to_le_bytes());
        }};
    }
    match dtype {
        Dtype::BOOL => match v {
            Value::Bool(b) => out.push(u8::from(*b)),
            _ => match int(v)? {
                i @ (0 | 1) => out.push(i as u8),
                i => return Err(format!("{i} is not a boolean")),
            },
        },
        Dtype::U8 => put_int!(u8),
        Dtype::U16 => put_int!(u16),
        Dtype::U32 => put_int!(u32),
        Dtype::U64 => put_int!(u64),
        Dtype::I8 => put_int!(i8),
        Dtype::I16 => put_int!(i16),
        Dtype::I32 => put_int!(i32),
        Dtype::I64 => put_int!(i64),
        Dtype::F16 => {
            out.extend_from_slice(&half::f16::from_f64(float(v)?).to_bits().to_le_bytes())
        }
        Dtype::BF16 => {
            out.extend_from_slice(&half::bf16::from_f64(float(v)?).to_bits().to_le_bytes())
        }
        Dtype::F32 => out.extend_from_slice(&(float(v)? as f32).to_le_bytes()),
        Dtype::F64 => out.extend_from_slice(&float(v)?.to_le_bytes()),
        other => return Err(format!("dtype {other:?} is not served")),
    }
    Ok(())
}

/// A host tensor's elements as JSON values (non-finite floats become `null`: JSON has none).
fn decode(t: &HostTensor) -> Result<Vec<Value>, String> {
    use kiln_engines::backend::tensor::le_vec;
    let d = &t.data;
    let floats = |v: Vec<f64>| v.into_iter().map(Value::from).collect::<Vec<_>>();
    Ok(match t.dtype {
        Dtype::BOOL => d.iter().map(|b| Value::Bool(*b != 0)).collect(),
        Dtype::U8 => d.iter().map(|b| Value::from(*b)).collect(),
        Dtype::U16 => le_vec!(d, u16).into_iter().map(Value::from).collect(),
        Dtype::U32 => le_vec!(d, u32).into_iter().map(Value::from).collect(),
        Dtype::U64 => le_vec!(d, u64).into_iter().map(Value::from).collect(),
        Dtype::I8 => d.iter().map(|b| Value::from(*b as i8)).collect(),
        Dtype::I16 => le_vec!(d, i16).into_iter().map(Value::from).collect(),
        Dtype::I32 => le_vec!(d, i32).into_iter().map(Value::from).collect(),
        Dtype::I64 => le_vec!(d, i64).into_iter().map(Value::from).collect(),
        Dtype::F16 => floats(
            le_vec!(d, u16)
                .into_iter()
                .map(|b| half::f16::from_bits(b).to_f64())
                .collect(),
        ),
        Dtype::BF16 => floats(
            le_vec!(d, u16)
                .into_iter()
                .map(|b| half::bf16::from_bits(b).to_f64())
                .collect(),
        ),
        Dtype::F32 => floats(le_vec!(d, f32).into_iter().map(f64::from).collect()),
        Dtype::F64 => floats(le_vec!(d, f64)),
        other => return Err(format!("dtype {other:?} has no protocol name")),
    })
}

#[cfg(test)]
mod tests;
