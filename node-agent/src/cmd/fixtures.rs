//! `kiln-agent fixtures`: makes a versioned fixture file from a model and given or seeded-random
//! inputs, with golden outputs from the reference (unoptimised) execution of the source model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::backend::{Backend, Shapes};
use crate::error::{Error, Result};
use crate::pipeline::digest::sha256_file;
use crate::pipeline::fixtures::{FixtureFile, Seeded};

/// What to make.
pub struct Request<'a> {
    /// The source model.
    pub model: &'a Path,
    /// Fixture version to record.
    pub version: &'a str,
    /// Shapes for inputs with symbolic dims (`name` → shape); fixed inputs need none.
    pub shapes: Shapes,
    /// A safetensors file whose tensors (named like the inputs) are used instead of random ones.
    pub given: Option<PathBuf>,
    /// Seed for random inputs.
    pub seed: u64,
    /// Tolerances to suggest in the metadata.
    pub tolerance: Option<(f64, f64)>,
}

/// Builds the fixture.
pub fn make(backend: &dyn Backend, req: &Request<'_>) -> Result<FixtureFile> {
    let given = match &req.given {
        Some(path) => read_given(path)?,
        None => BTreeMap::new(),
    };
    let mut seeded = Seeded::new(req.seed);
    let mut inputs = BTreeMap::new();
    let mut shapes = Shapes::new();
    for info in backend.inputs(req.model)? {
        let tensor = if let Some(t) = given.get(&info.name) {
            t.clone()
        } else {
            let shape = match req.shapes.get(&info.name) {
                Some(s) => s.clone(),
                None => info
                    .dims
                    .iter()
                    .map(|d| d.ok_or(()))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|()| {
                        Error::InvalidSpec(format!(
                            "input {} has symbolic dims {:?}; give --shape {}=D0,D1,…",
                            info.name, info.dims, info.name
                        ))
                    })?,
            };
            seeded.tensor(info.dtype, &shape)?
        };
        shapes.insert(info.name.clone(), tensor.shape.clone());
        inputs.insert(info.name, tensor);
    }
    if let Some(extra) = given.keys().find(|k| !inputs.contains_key(*k)) {
        return Err(Error::InvalidSpec(format!(
            "given tensor {extra:?} is not an input of the model"
        )));
    }
    let engine = backend.reference(req.model, &shapes)?;
    let outputs = engine.run(&inputs)?;
    let (model_sha256, _) = sha256_file(req.model).map_err(|e| Error::SourceUnavailable {
        uri: req.model.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(FixtureFile {
        version: req.version.to_string(),
        model_sha256: Some(model_sha256),
        tolerance: req.tolerance,
        inputs,
        outputs,
    })
}

fn read_given(path: &Path) -> Result<BTreeMap<String, crate::pipeline::tensor::HostTensor>> {
    let bytes = std::fs::read(path).map_err(|e| Error::SourceUnavailable {
        uri: path.display().to_string(),
        message: e.to_string(),
    })?;
    let tensors = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
        Error::InvalidSpec(format!("{}: not a safetensors file: {e}", path.display()))
    })?;
    Ok(tensors
        .tensors()
        .into_iter()
        .map(|(name, v)| {
            let name = name.strip_prefix("input/").unwrap_or(&name).to_string();
            (
                name,
                crate::pipeline::tensor::HostTensor {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data().to_vec(),
                },
            )
        })
        .collect())
}
