//! A backend-neutral host tensor (dtype, shape, little-endian bytes): what fixtures hold and what
//! every engine backend takes and returns, so parity is computed the same way for all of them.
//! Pure.

use safetensors::Dtype;
use tract_onnx::prelude::{DatumType, Tensor, f16};

use kiln_node_core::error::{Error, Result};

/// The fixture/engine dtype a declared dtype stands for.
pub fn host_dtype(d: kiln_crds::model_artifact::DType) -> Dtype {
    use kiln_crds::model_artifact::DType;
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::Bf16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

/// A dense tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Elements, little-endian, row-major.
    pub data: Vec<u8>,
}

/// Little-endian bytes as a `Vec` of `$t` (for every backend's conversion from a host tensor,
/// and the server's).
#[macro_export]
macro_rules! le_vec {
    ($bytes:expr, $t:ty) => {
        $bytes
            .chunks_exact(std::mem::size_of::<$t>())
            .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect::<Vec<$t>>()
    };
}
pub use crate::le_vec;

impl HostTensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements as i32 (token ids), or `None` for a tensor of another type.
    pub fn i32s(&self) -> Option<Vec<i32>> {
        (self.dtype == Dtype::I32).then(|| le_vec!(&self.data, i32))
    }

    /// Elements as f64, for parity.
    pub fn to_f64(&self) -> Result<Vec<f64>> {
        let d = &self.data;
        Ok(match self.dtype {
            Dtype::F32 => le_vec!(d, f32).into_iter().map(f64::from).collect(),
            Dtype::F64 => le_vec!(d, f64),
            Dtype::F16 => le_vec!(d, u16)
                .into_iter()
                .map(|b| f64::from(f16::from_bits(b).to_f32()))
                .collect(),
            Dtype::I64 => le_vec!(d, i64).into_iter().map(|v| v as f64).collect(),
            Dtype::I32 => le_vec!(d, i32).into_iter().map(f64::from).collect(),
            Dtype::I8 => d.iter().map(|b| f64::from(*b as i8)).collect(),
            Dtype::U8 | Dtype::BOOL => d.iter().map(|b| f64::from(*b)).collect(),
            other => {
                return Err(Error::InvalidSpec(format!(
                    "dtype {other:?} is not supported in fixtures"
                )));
            }
        })
    }

    /// The tract tensor with the same contents.
    pub fn to_tract(&self) -> Result<Tensor> {
        let (s, d) = (&self.shape, &self.data);
        let wrong = |e: tract_onnx::prelude::TractError| {
            Error::InvalidSpec(format!("tensor of shape {s:?}: {e}"))
        };
        match self.dtype {
            Dtype::F32 => Tensor::from_shape(s, &le_vec!(d, f32)).map_err(wrong),
            Dtype::F64 => Tensor::from_shape(s, &le_vec!(d, f64)).map_err(wrong),
            Dtype::F16 => Tensor::from_shape(
                s,
                &le_vec!(d, u16)
                    .into_iter()
                    .map(f16::from_bits)
                    .collect::<Vec<_>>(),
            )
            .map_err(wrong),
            Dtype::I64 => Tensor::from_shape(s, &le_vec!(d, i64)).map_err(wrong),
            Dtype::I32 => Tensor::from_shape(s, &le_vec!(d, i32)).map_err(wrong),
            Dtype::I8 => Tensor::from_shape(s, &d.iter().map(|b| *b as i8).collect::<Vec<_>>())
                .map_err(wrong),
            Dtype::U8 => Tensor::from_shape(s, d).map_err(wrong),
            Dtype::BOOL => {
                Tensor::from_shape(s, &d.iter().map(|b| *b != 0).collect::<Vec<_>>()).map_err(wrong)
            }
            other => Err(Error::InvalidSpec(format!(
                "dtype {other:?} is not supported by the tract backend"
            ))),
        }
    }

    /// A host copy of a tract tensor.
    pub fn from_tract(t: &Tensor) -> Result<Self> {
        let dtype = safetensors_dtype(t.datum_type()).ok_or_else(|| {
            Error::WarmupFailed(format!(
                "output dtype {:?} cannot be compared",
                t.datum_type()
            ))
        })?;
        // tract stores plain numbers in native order; this agent only targets little-endian hosts.
        Ok(Self {
            dtype,
            shape: t.shape().to_vec(),
            data: t.as_bytes().to_vec(),
        })
    }
}

/// The safetensors dtype for a tract datum type.
pub fn safetensors_dtype(dt: DatumType) -> Option<Dtype> {
    Some(match dt {
        DatumType::F32 => Dtype::F32,
        DatumType::F64 => Dtype::F64,
        DatumType::F16 => Dtype::F16,
        DatumType::I64 => Dtype::I64,
        DatumType::I32 => Dtype::I32,
        DatumType::I8 => Dtype::I8,
        DatumType::U8 => Dtype::U8,
        DatumType::Bool => Dtype::BOOL,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_tract() {
        let t = HostTensor {
            dtype: Dtype::F32,
            shape: vec![2, 2],
            data: [1.0f32, -2.5, 3.25, 0.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        };
        let back = HostTensor::from_tract(&t.to_tract().expect("to tract")).expect("from tract");
        assert_eq!(back, t);
        assert_eq!(t.to_f64().expect("f64"), vec![1.0, -2.5, 3.25, 0.0]);
        let bad = HostTensor {
            shape: vec![3, 2],
            ..t
        };
        assert!(bad.to_tract().is_err(), "6 elements declared, 4 present");
    }
}
