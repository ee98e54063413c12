//! `spec.profiles`: concrete values for a model's symbolic dimensions, and binding them to the
//! model's declared inputs.

use std::collections::BTreeMap;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::model_artifact::ModelArtifactSpec;

/// Concrete values for symbolic dims.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShapeProfile {
    /// Profile name, unique within the target.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Symbol → value; every symbol of the model must be bound within its bounds.
    #[serde(default)]
    pub dims: BTreeMap<String, i64>,
}

/// Why a profile cannot be bound to a model.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    /// A symbol of the model has no value in the profile.
    #[error(
        "profile {profile:?} does not bind symbol {symbol:?} (input {input:?}); add it under profiles[].dims"
    )]
    Unbound {
        profile: String,
        symbol: String,
        input: String,
    },
    /// A value is outside the symbol's bounds.
    #[error(
        "profile {profile:?} binds {symbol}={value}, outside [{min}, {max}] declared on input {input:?}"
    )]
    OutOfBounds {
        profile: String,
        symbol: String,
        value: i64,
        min: i64,
        max: i64,
        input: String,
    },
    /// The profile binds a symbol the model does not have.
    #[error("profile {profile:?} binds {symbol:?}, which no input of the model declares")]
    Unknown { profile: String, symbol: String },
}

impl ShapeProfile {
    /// Concrete shapes of every model input under this profile, checked against the bounds.
    pub fn bind(
        &self,
        model: &ModelArtifactSpec,
    ) -> Result<BTreeMap<String, Vec<usize>>, ProfileError> {
        let symbols = model.symbols();
        if let Some(extra) = self.dims.keys().find(|k| !symbols.contains(k.as_str())) {
            return Err(ProfileError::Unknown {
                profile: self.name.clone(),
                symbol: extra.clone(),
            });
        }
        let mut shapes = BTreeMap::new();
        for input in &model.inputs {
            let mut shape = Vec::with_capacity(input.dims.len());
            for dim in &input.dims {
                let value = match (&dim.size, &dim.symbol) {
                    (Some(size), _) => *size,
                    (None, Some(symbol)) => {
                        let value =
                            *self.dims.get(symbol).ok_or_else(|| ProfileError::Unbound {
                                profile: self.name.clone(),
                                symbol: symbol.clone(),
                                input: input.name.clone(),
                            })?;
                        let (min, max) = (dim.min.unwrap_or(0), dim.max.unwrap_or(i64::MAX));
                        if value < min || value > max {
                            return Err(ProfileError::OutOfBounds {
                                profile: self.name.clone(),
                                symbol: symbol.clone(),
                                value,
                                min,
                                max,
                                input: input.name.clone(),
                            });
                        }
                        value
                    }
                    (None, None) => 0,
                };
                shape.push(usize::try_from(value).unwrap_or(0));
            }
            shapes.insert(input.name.clone(), shape);
        }
        Ok(shapes)
    }
}
