//! `kiln-agent fixtures`: makes a versioned fixture file from a model and given or seeded-random
//! inputs, with golden outputs from the reference (unoptimised) execution of the source model.
//! Reads the model (and given inputs), writes only the output file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kiln_store::staged::{sha256_bytes, sha256_file};

use kiln_crds::compiled_target::Tolerance;

use crate::backend::{Backend, Shapes};
use crate::error::{Error, Result};
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
    pub tolerance: Option<Tolerance>,
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

/// Flags of `fixtures`.
#[derive(clap::Args)]
pub struct Args {
    /// ONNX model.
    #[arg(long, env = "KILN_FIXTURE_MODEL")]
    model: PathBuf,
    /// Fixture version to record.
    #[arg(long = "fixture-version", env = "KILN_FIXTURE_VERSION")]
    version: String,
    /// Shape of an input with symbolic dims: NAME=D0,D1,... (repeatable; NAME= for a scalar).
    #[arg(long = "shape", env = "KILN_FIXTURE_SHAPES", value_delimiter = ';')]
    shapes: Vec<String>,
    /// Safetensors file with given input tensors, named like the inputs.
    #[arg(long, env = "KILN_FIXTURE_INPUTS")]
    inputs: Option<PathBuf>,
    /// Seed for random inputs.
    #[arg(long, env = "KILN_FIXTURE_SEED", default_value_t = 42)]
    seed: u64,
    /// Suggested absolute tolerance, recorded in metadata.
    #[arg(long, env = "KILN_FIXTURE_ATOL")]
    atol: Option<f64>,
    /// Suggested relative tolerance, recorded in metadata.
    #[arg(long, env = "KILN_FIXTURE_RTOL")]
    rtol: Option<f64>,
    /// Output file.
    #[arg(long, short, env = "KILN_FIXTURE_OUT")]
    out: PathBuf,
    /// Which runtime executes the source model, unoptimised, for the golden outputs: `tract`,
    /// `onnxruntime` for models tract cannot run (needs `--onnxruntime-lib`), or `llamacpp`
    /// for a GGUF language model (its context: 512 tokens).
    #[arg(
        long,
        env = "KILN_FIXTURE_REFERENCE",
        value_enum,
        default_value = "tract"
    )]
    reference: Reference,
}

/// The runtime golden outputs come from.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Reference {
    /// tract, built in.
    Tract,
    /// ONNX Runtime on the CPU, graph optimisation disabled.
    Onnxruntime,
    /// llama.cpp on the CPU, for GGUF language models: inputs `prompt` (token ids) and
    /// `generate` (how many tokens), outputs `logits` and the greedy `tokens`.
    Llamacpp,
}

/// Makes the fixture with the reference execution (`--reference`), writes it and prints
/// `<sha256>  <file>`; exit status 2 for a malformed `--shape`.
pub fn main(args: Args) -> ExitCode {
    let shapes = match parse_shapes(&args.shapes) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kiln-agent fixtures: {e}");
            return ExitCode::from(2);
        }
    };
    let request = Request {
        model: &args.model,
        version: &args.version,
        shapes,
        given: args.inputs,
        seed: args.seed,
        tolerance: args
            .atol
            .zip(args.rtol)
            .map(|(atol, rtol)| Tolerance { atol, rtol }),
    };
    let out = &args.out;
    let reference = match args.reference {
        Reference::Tract => Ok(crate::backend::guard::Guarded(Box::new(
            crate::backend::tract::Tract,
        ))),
        Reference::Onnxruntime => crate::backend::onnxruntime::OnnxRuntime::for_spec(
            &kiln_crds::compiled_target::Backend::of(
                kiln_crds::compiled_target::BackendKind::Onnxruntime,
            ),
        )
        .map(|ort| crate::backend::guard::Guarded(Box::new(ort))),
        Reference::Llamacpp => Ok(crate::backend::guard::Guarded(Box::new(
            crate::backend::llamacpp::Llamacpp::for_spec(&kiln_crds::compiled_target::Backend::of(
                kiln_crds::compiled_target::BackendKind::Llamacpp,
            )),
        ))),
    };
    let result = reference
        .and_then(|r| make(&r, &request))
        .and_then(|f| f.to_bytes())
        .and_then(|bytes| {
            std::fs::write(out, &bytes)
                .map_err(|e| Error::store(out, e))
                .map(|()| bytes)
        });
    match result {
        Ok(bytes) => {
            println!("{}  {}", sha256_bytes(&bytes), out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-agent fixtures: {} ({})", e, e.reason());
            ExitCode::FAILURE
        }
    }
}

/// `--shape NAME=D0,D1,...` values as shapes by input name.
fn parse_shapes(shapes: &[String]) -> std::result::Result<Shapes, String> {
    shapes
        .iter()
        .map(|s| {
            let (name, dims) = s
                .split_once('=')
                .ok_or_else(|| format!("--shape {s:?}: expected NAME=D0,D1,..."))?;
            // `NAME=` is a scalar (rank 0).
            if dims.trim().is_empty() {
                return Ok((name.to_string(), Vec::new()));
            }
            let dims = dims
                .split(',')
                .map(|d| {
                    d.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("--shape {s:?}: {d:?} is not a size"))
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok((name.to_string(), dims))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_a_malformed_one_says_which() {
        let parsed = parse_shapes(&["x=1, 3,224".into(), "y=2".into()]).expect("shapes");
        assert_eq!(parsed["x"], vec![1, 3, 224]);
        assert_eq!(parsed["y"], vec![2]);
        let scalar = parse_shapes(&["sr=".into()]).expect("scalar");
        assert_eq!(scalar["sr"], Vec::<usize>::new());
        let err = parse_shapes(&["x".into()]).expect_err("no =");
        assert!(err.contains("expected NAME=D0,D1"), "{err}");
        let err = parse_shapes(&["x=1,b".into()]).expect_err("not a size");
        assert!(err.contains("\"b\" is not a size"), "{err}");
    }
}
