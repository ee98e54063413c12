//! Golden outputs: a versioned fixture file made from a model and given or seeded-random inputs,
//! with golden outputs from the reference (unoptimised) execution of the source model. What
//! `kiln-agent fixtures` asks for ([`run`]: its flags become a `Reference`, nothing else) and
//! the engine's process ([`crate::pipeline::isolate`]) does: [`make_file`] runs in that child,
//! under the same limits as a compile. Reads the model (and
//! given inputs), writes only the output file.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_store::staged::{sha256_bytes, sha256_file};

use kiln_crds::compiled_target::BackendKind;

use crate::backend::tensor::HostTensor;
use crate::backend::{Backend, Shapes};
use crate::pipeline::fixtures::{FixtureFile, Sample, Seeded, TextFixture};
use crate::pipeline::isolate::task::{Outcome, Reference, Task};
use crate::pipeline::text::{TextPrompt, TextRequest};
use kiln_node_core::error::{Error, Result};

/// Builds the fixture.
pub fn make(backend: &dyn Backend, req: &Reference) -> Result<FixtureFile> {
    if let Some(text) = &req.text {
        return make_text(backend, req, text);
    }
    let count = req.samples.max(req.given.len()).max(1);
    if count > crate::pipeline::fixtures::MAX_SAMPLES - 1 {
        return Err(Error::InvalidSpec(format!(
            "{count} samples: a fixture holds at most {}",
            crate::pipeline::fixtures::MAX_SAMPLES - 1
        )));
    }
    let infos = backend.inputs(&req.model)?;
    let mut seeded = Seeded::new(req.seed);
    let mut samples = Vec::new();
    let mut reference: Option<(Shapes, Box<dyn crate::backend::Engine>)> = None;
    for k in 0..count {
        let given = match req.given.get(k) {
            Some(path) => read_given(path)?,
            None => BTreeMap::new(),
        };
        let inputs = sample_inputs(&infos, &given, &req.shapes, &mut seeded)?;
        let shapes: Shapes = inputs
            .iter()
            .map(|(n, t)| (n.clone(), t.shape.clone()))
            .collect();
        if reference.as_ref().is_some_and(|(s, _)| *s != shapes) {
            return Err(Error::InvalidSpec(format!(
                "sample {} has input shapes {shapes:?}, the first {:?}: every sample has the same shapes",
                k + 1,
                reference.as_ref().map(|(s, _)| s)
            )));
        }
        if reference.is_none() {
            reference = Some((shapes.clone(), backend.reference(&req.model, &shapes)?));
        }
        let Some((_, engine)) = &reference else {
            continue;
        };
        let outputs = engine.run(&inputs)?;
        samples.push(Sample { inputs, outputs });
    }
    let (model_sha256, _) = sha256_file(&req.model)
        .map_err(|e| Error::source_unavailable(req.model.display().to_string(), e))?;
    let mut samples = samples.into_iter();
    let first = samples
        .next()
        .ok_or_else(|| Error::InvalidSpec("no sample made".into()))?;
    Ok(FixtureFile {
        version: req.version.to_string(),
        model_sha256: Some(model_sha256),
        tolerance: req.tolerance,
        inputs: first.inputs,
        outputs: first.outputs,
        more: samples.collect(),
        text: TextFixture::default(),
    })
}

/// A language model's fixture from text: tokenized (a chat rendered first) by the reference's
/// own tokenizer, run once, the continuation detokenized.
fn make_text(backend: &dyn Backend, req: &Reference, text: &TextRequest) -> Result<FixtureFile> {
    if !req.given.is_empty() || req.samples > 1 || !req.shapes.is_empty() {
        return Err(Error::InvalidSpec(
            "--prompt/--chat make the inputs from the text: give no --inputs, --shape or --samples"
                .into(),
        ));
    }
    if text.generate == 0 {
        return Err(Error::InvalidSpec("--generate must be at least 1".into()));
    }
    let engine = backend.reference(&req.model, &Shapes::new())?;
    let tok = engine.tokenizer().ok_or_else(|| {
        Error::InvalidSpec(
            "--prompt and --chat need a language model (--reference llamacpp)".into(),
        )
    })?;
    let mut golden = TextFixture::default();
    let (prompt, rendered) = match &text.prompt {
        TextPrompt::Plain(p) => (p.clone(), false),
        TextPrompt::Chat(json) => {
            let messages = crate::pipeline::text::messages(json).map_err(Error::InvalidSpec)?;
            let template = tok.chat_template().ok_or_else(|| {
                Error::InvalidSpec("--chat: this model carries no chat template".into())
            })?;
            golden.chat = Some(json.clone());
            golden.chat_template_sha256 = Some(sha256_bytes(template.as_bytes()));
            (tok.render(&messages)?, true)
        }
    };
    let ids = tok.encode(&prompt, rendered)?;
    golden.prompt = Some(prompt);
    let generate = i32::try_from(text.generate).unwrap_or(i32::MAX);
    let inputs = BTreeMap::from([
        ("prompt".to_string(), i32_tensor(&ids)),
        ("generate".to_string(), i32_tensor(&[generate])),
    ]);
    let outputs = engine.run(&inputs)?;
    let tokens = outputs
        .get("tokens")
        .ok_or_else(|| Error::WarmupFailed("the reference gave no tokens".into()))?;
    let tokens: Vec<i32> = crate::backend::tensor::le_vec!(tokens.data, i32);
    golden.continuation = Some(tok.decode(&tokens)?);
    let (model_sha256, _) = sha256_file(&req.model)
        .map_err(|e| Error::source_unavailable(req.model.display().to_string(), e))?;
    Ok(FixtureFile {
        version: req.version.to_string(),
        model_sha256: Some(model_sha256),
        tolerance: req.tolerance,
        inputs,
        outputs,
        more: Vec::new(),
        text: golden,
    })
}

fn i32_tensor(values: &[i32]) -> HostTensor {
    HostTensor {
        dtype: safetensors::Dtype::I32,
        shape: vec![values.len()],
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// One sample's inputs: the given tensors, the others drawn from `seeded` at the shape the
/// graph fixes or `shapes` names.
fn sample_inputs(
    infos: &[crate::backend::InputInfo],
    given: &BTreeMap<String, HostTensor>,
    shapes: &Shapes,
    seeded: &mut Seeded,
) -> Result<BTreeMap<String, HostTensor>> {
    let mut inputs = BTreeMap::new();
    for info in infos {
        let tensor = if let Some(t) = given.get(&info.name) {
            t.clone()
        } else {
            let shape = match shapes.get(&info.name) {
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
        inputs.insert(info.name.clone(), tensor);
    }
    if let Some(extra) = given.keys().find(|k| !inputs.contains_key(*k)) {
        return Err(Error::InvalidSpec(format!(
            "given tensor {extra:?} is not an input of the model"
        )));
    }
    Ok(inputs)
}

fn read_given(path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::source_unavailable(path.display().to_string(), e))?;
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
                HostTensor {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data().to_vec(),
                },
            )
        })
        .collect())
}

/// How long one reference run may take.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Makes the fixture `job` asks for in the engine's own process ([`crate::pipeline::isolate`]),
/// under the same limits as a compile, and returns the file's sha256.
pub fn run(job: Reference) -> Result<String> {
    let what = format!("running {} for reference outputs", job.model.display());
    let answer =
        crate::pipeline::isolate::parent::run(Task::Reference(Box::new(job)), &what, DEADLINE)?;
    match answer.outcome {
        Outcome::Made { sha256 } => Ok(sha256),
        _ => Err(Error::EngineAnswer(format!(
            "{what}: the answer is not a fixture's"
        ))),
    }
}

/// In the engine's process (`kiln-agent engine`): makes the fixture `job` asks for with its
/// reference runtime, writes it to `job.out` and returns its sha256.
pub fn make_file(job: &Reference) -> Result<String> {
    if !matches!(
        job.runtime,
        BackendKind::Tract | BackendKind::Onnxruntime | BackendKind::Llamacpp
    ) {
        return Err(Error::InvalidSpec(format!(
            "{} is not a reference runtime (tract, onnxruntime, llamacpp)",
            job.runtime.as_str()
        )));
    }
    let spec = kiln_crds::compiled_target::Backend::of(job.runtime);
    let given = job.text.as_ref().and_then(|t| t.chat_template.clone());
    let reference: Box<dyn crate::backend::Backend> = match given {
        Some(template) if job.runtime == BackendKind::Llamacpp => Box::new(
            crate::backend::llamacpp::Llamacpp::for_spec(&spec).with_chat_template(template),
        ),
        Some(_) => {
            return Err(Error::InvalidSpec(
                "--chat-template needs a language model (--reference llamacpp)".into(),
            ));
        }
        None => crate::backend::for_target(&spec)?,
    };
    let bytes = make(reference.as_ref(), job)?.to_bytes()?;
    std::fs::write(&job.out, &bytes).map_err(|e| Error::store(&job.out, e))?;
    Ok(sha256_bytes(&bytes))
}
