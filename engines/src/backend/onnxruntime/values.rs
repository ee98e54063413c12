//! Between kiln's host tensors and ONNX Runtime's values and types: element types, graph
//! outlets, profile binding.

use ort::value::{DynValue, Tensor, TensorElementType, ValueType};
use safetensors::Dtype;

use super::super::Shapes;
use crate::backend::tensor::{HostTensor, le_vec};
use kiln_node_core::error::{Error, Result};

pub(super) fn unsupported_io(what: &str, o: &ort::value::Outlet) -> Error {
    Error::UnsupportedOperator {
        backend: "onnxruntime".into(),
        operators: vec![format!("{what} {} of type {}", o.name(), o.dtype())],
    }
}

/// Checks a profile's shapes against the graph's inputs: the same names, the same rank, and
/// every fixed extent kept.
pub(super) fn bind_profile(
    profile: &str,
    shapes: &Shapes,
    inputs: &[ort::value::Outlet],
) -> Result<Vec<(String, Vec<usize>)>> {
    let model_inputs: Vec<&str> = inputs.iter().map(|o| o.name()).collect();
    let mut sorted = model_inputs.clone();
    sorted.sort_unstable();
    let declared: Vec<&str> = shapes.keys().map(String::as_str).collect();
    if sorted != declared {
        return Err(Error::InvalidSpec(format!(
            "the model's inputs are {model_inputs:?} but the spec declares {declared:?}; make spec.inputs name exactly the graph inputs"
        )));
    }
    let mut bound = Vec::new();
    for o in inputs {
        let shape = &shapes[o.name()];
        if let Some((_, dims)) = tensor_type(o.dtype()) {
            let fits = dims.len() == shape.len()
                && dims
                    .iter()
                    .zip(shape)
                    .all(|(d, s)| d.is_none_or(|d| d == *s));
            if !fits {
                return Err(Error::CompileFailed(format!(
                    "profile {profile}: shape {shape:?} for input {} does not fit the graph's {}",
                    o.name(),
                    show_dims(&dims)
                )));
            }
        }
        bound.push((o.name().to_string(), shape.clone()));
    }
    Ok(bound)
}

pub(super) fn show_dims(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.map_or("?".to_string(), |d| d.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// A tensor outlet's element type and dims (`None` for a symbolic dim); `None` for sequences,
/// maps, optionals and element types no fixture can hold.
pub(super) fn tensor_type(t: &ValueType) -> Option<(Dtype, Vec<Option<usize>>)> {
    let ValueType::Tensor { ty, shape, .. } = t else {
        return None;
    };
    let dims = shape
        .iter()
        .map(|d| usize::try_from(*d).ok())
        .collect::<Vec<_>>();
    Some((dtype(*ty)?, dims))
}

pub(super) fn dtype(ty: TensorElementType) -> Option<Dtype> {
    Some(match ty {
        TensorElementType::Float32 => Dtype::F32,
        TensorElementType::Float64 => Dtype::F64,
        TensorElementType::Float16 => Dtype::F16,
        TensorElementType::Int64 => Dtype::I64,
        TensorElementType::Int32 => Dtype::I32,
        TensorElementType::Int8 => Dtype::I8,
        TensorElementType::Uint8 => Dtype::U8,
        TensorElementType::Bool => Dtype::BOOL,
        _ => return None,
    })
}

pub(super) fn to_value(t: &HostTensor) -> Result<DynValue> {
    let shape = t.shape.clone();
    let d = &t.data;
    let wrong = |e: ort::Error| Error::InvalidSpec(format!("tensor of shape {shape:?}: {e}"));
    let s = t.shape.clone();
    Ok(match t.dtype {
        Dtype::F32 => Tensor::from_array((s, le_vec!(d, f32)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::F64 => Tensor::from_array((s, le_vec!(d, f64)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::F16 => Tensor::from_array((
            s,
            le_vec!(d, u16)
                .into_iter()
                .map(half::f16::from_bits)
                .collect::<Vec<_>>(),
        ))
        .map_err(wrong)?
        .into_dyn(),
        Dtype::I64 => Tensor::from_array((s, le_vec!(d, i64)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::I32 => Tensor::from_array((s, le_vec!(d, i32)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::I8 => Tensor::from_array((s, d.iter().map(|b| *b as i8).collect::<Vec<_>>()))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::U8 => Tensor::from_array((s, d.clone()))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::BOOL => Tensor::from_array((s, d.iter().map(|b| *b != 0).collect::<Vec<_>>()))
            .map_err(wrong)?
            .into_dyn(),
        other => {
            return Err(Error::InvalidSpec(format!(
                "dtype {other:?} is not supported by the onnxruntime backend"
            )));
        }
    })
}

pub(super) fn from_value(name: &str, v: &ort::value::DynValueRef<'_>) -> Result<HostTensor> {
    let failed = |e: ort::Error| Error::WarmupFailed(format!("output {name}: {e}"));
    let ValueType::Tensor { ty, .. } = v.dtype() else {
        return Err(Error::WarmupFailed(format!(
            "output {name} is a {}, not a tensor; it cannot be compared",
            v.dtype()
        )));
    };
    macro_rules! bytes {
        ($t:ty) => {{
            let (shape, data) = v.try_extract_tensor::<$t>().map_err(failed)?;
            (
                shape.iter().map(|d| *d as usize).collect::<Vec<_>>(),
                data.iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            )
        }};
    }
    let (shape, data) = match ty {
        TensorElementType::Float32 => bytes!(f32),
        TensorElementType::Float64 => bytes!(f64),
        TensorElementType::Float16 => bytes!(half::f16),
        TensorElementType::Int64 => bytes!(i64),
        TensorElementType::Int32 => bytes!(i32),
        TensorElementType::Int8 => bytes!(i8),
        TensorElementType::Uint8 => bytes!(u8),
        TensorElementType::Bool => {
            let (shape, data) = v.try_extract_tensor::<bool>().map_err(failed)?;
            (
                shape.iter().map(|d| *d as usize).collect(),
                data.iter().map(|b| u8::from(*b)).collect(),
            )
        }
        other => {
            return Err(Error::WarmupFailed(format!(
                "output {name} has element type {other:?}, which cannot be compared"
            )));
        }
    };
    Ok(HostTensor {
        dtype: dtype(*ty).unwrap_or(Dtype::U8),
        shape,
        data,
    })
}
