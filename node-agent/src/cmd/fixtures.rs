//! `kiln-agent fixtures`: makes a versioned fixture file from a model and given or seeded-random
//! inputs, with golden outputs from the reference (unoptimised) execution of the source model.
//! Reads the model (and given inputs), writes only the output file. The reference runs in the
//! engine's own process ([`crate::pipeline::isolate`]), under the same limits as a compile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kiln_store::staged::{sha256_bytes, sha256_file};

use kiln_crds::compiled_target::{BackendKind, Tolerance};

use crate::backend::{Backend, Shapes};
use crate::error::{Error, Result};
use crate::pipeline::fixtures::{FixtureFile, Sample, Seeded, TextFixture};
use crate::pipeline::isolate::job::{Job, Outcome};
use crate::pipeline::tensor::HostTensor;
use crate::pipeline::text::{TextPrompt, TextRequest};

/// What to make.
pub struct Request<'a> {
    /// The source model.
    pub model: &'a Path,
    /// Fixture version to record.
    pub version: &'a str,
    /// Shapes for inputs with symbolic dims (`name` → shape); fixed inputs need none.
    pub shapes: Shapes,
    /// Safetensors files whose tensors (named like the inputs) are used instead of random ones:
    /// the first for the first sample, the second for the second, …
    pub given: Vec<PathBuf>,
    /// How many samples (input sets, each with its golden outputs) to make, at least one and at
    /// least one per given file; the inputs no file gives are seeded-random, different in each.
    pub samples: usize,
    /// Seed for random inputs.
    pub seed: u64,
    /// Tolerances to suggest in the metadata.
    pub tolerance: Option<Tolerance>,
    /// A language model's prompt as text: then no inputs are given or drawn.
    pub text: Option<TextRequest>,
}

/// Builds the fixture.
pub fn make(backend: &dyn Backend, req: &Request<'_>) -> Result<FixtureFile> {
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
    let infos = backend.inputs(req.model)?;
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
            reference = Some((shapes.clone(), backend.reference(req.model, &shapes)?));
        }
        let Some((_, engine)) = &reference else {
            continue;
        };
        let outputs = engine.run(&inputs)?;
        samples.push(Sample { inputs, outputs });
    }
    let (model_sha256, _) = sha256_file(req.model)
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
fn make_text(backend: &dyn Backend, req: &Request<'_>, text: &TextRequest) -> Result<FixtureFile> {
    if !req.given.is_empty() || req.samples > 1 || !req.shapes.is_empty() {
        return Err(Error::InvalidSpec(
            "--prompt/--chat make the inputs from the text: give no --inputs, --shape or --samples"
                .into(),
        ));
    }
    if text.generate == 0 {
        return Err(Error::InvalidSpec("--generate must be at least 1".into()));
    }
    let engine = backend.reference(req.model, &Shapes::new())?;
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
    let tokens: Vec<i32> = crate::tensor::le_vec!(tokens.data, i32);
    golden.continuation = Some(tok.decode(&tokens)?);
    let (model_sha256, _) = sha256_file(req.model)
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

/// Flags of `fixtures`.
#[derive(clap::Args)]
pub struct Args {
    /// The source model: an ONNX file, or a GGUF file with `--reference llamacpp`.
    #[arg(long, env = "KILN_FIXTURE_MODEL")]
    model: PathBuf,
    /// Fixture version to record.
    #[arg(long = "fixture-version", env = "KILN_FIXTURE_VERSION")]
    version: String,
    /// Shape of an input with symbolic dims: NAME=D0,D1,... (repeatable; NAME= for a scalar).
    #[arg(long = "shape", env = "KILN_FIXTURE_SHAPES", value_delimiter = ';')]
    shapes: Vec<String>,
    /// Safetensors file with given input tensors, named like the inputs; repeated, one file per
    /// sample in order.
    #[arg(long, env = "KILN_FIXTURE_INPUTS", value_delimiter = ';')]
    inputs: Vec<PathBuf>,
    /// Samples (input sets with their golden outputs) to make; inputs no --inputs file gives
    /// are seeded-random, different in each. Warmup alternates them; backend.cuda.cudaGraphs
    /// needs at least two.
    #[arg(long, env = "KILN_FIXTURE_SAMPLES", default_value_t = 1)]
    samples: usize,
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
    /// A language model's prompt as text (with --reference llamacpp): tokenized by the model's
    /// own tokenizer; the fixture records the text, the ids, the greedy continuation and its
    /// text.
    #[arg(long, env = "KILN_FIXTURE_PROMPT", conflicts_with = "chat")]
    prompt: Option<String>,
    /// A JSON file of chat messages (`[{"role": "user", "content": "..."}]`), rendered by the
    /// model's own chat template, whose sha256 the fixture records.
    #[arg(long, env = "KILN_FIXTURE_CHAT")]
    chat: Option<PathBuf>,
    /// Tokens to continue greedily from --prompt or --chat.
    #[arg(long, env = "KILN_FIXTURE_GENERATE", default_value_t = 16)]
    generate: u32,
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

impl Reference {
    /// The backend that runs it.
    fn kind(self) -> BackendKind {
        match self {
            Self::Tract => BackendKind::Tract,
            Self::Onnxruntime => BackendKind::Onnxruntime,
            Self::Llamacpp => BackendKind::Llamacpp,
        }
    }
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
    let text = match text_request(&args) {
        Ok(t) => t,
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
        samples: args.samples,
        seed: args.seed,
        tolerance: args
            .atol
            .zip(args.rtol)
            .map(|(atol, rtol)| Tolerance { atol, rtol }),
        text,
    };
    let job = crate::pipeline::isolate::job::Reference {
        model: request.model.to_path_buf(),
        version: request.version.to_string(),
        shapes: request.shapes,
        given: request.given,
        samples: request.samples,
        seed: request.seed,
        tolerance: request.tolerance,
        runtime: args.reference.kind(),
        out: args.out.clone(),
        text: request.text,
    };
    let what = format!("running {} for reference outputs", args.model.display());
    let result =
        crate::pipeline::isolate::parent::run(Job::Reference(Box::new(job)), &what, DEADLINE)
            .and_then(|answer| match answer.outcome {
                Outcome::Made { sha256 } => Ok(sha256),
                _ => Err(Error::EngineAnswer(format!(
                    "{what}: the answer is not a fixture's"
                ))),
            });
    match result {
        Ok(sha256) => {
            println!("{sha256}  {}", args.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-agent fixtures: {} ({})", e, e.reason());
            ExitCode::FAILURE
        }
    }
}

/// `--prompt` or `--chat` as a request (the chat file read here, bounded), or `None`.
fn text_request(args: &Args) -> std::result::Result<Option<TextRequest>, String> {
    let prompt = match (&args.prompt, &args.chat) {
        (Some(p), _) => TextPrompt::Plain(p.clone()),
        (None, Some(path)) => {
            let meta =
                std::fs::metadata(path).map_err(|e| format!("--chat {}: {e}", path.display()))?;
            if !meta.is_file() || meta.len() > 1 << 20 {
                return Err(format!(
                    "--chat {}: not a regular file of at most 1 MiB",
                    path.display()
                ));
            }
            let json = std::fs::read_to_string(path)
                .map_err(|e| format!("--chat {}: {e}", path.display()))?;
            crate::pipeline::text::messages(&json)
                .map_err(|e| format!("--chat {}: {e}", path.display()))?;
            TextPrompt::Chat(json)
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(TextRequest {
        prompt,
        generate: args.generate,
    }))
}

/// How long one reference run may take.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(3600);

/// In the engine's process ([`crate::cmd::engine`]): makes the fixture `job` asks for with its
/// reference runtime, writes it to `job.out` and returns its sha256.
pub fn make_file(job: &crate::pipeline::isolate::job::Reference) -> Result<String> {
    let request = Request {
        model: &job.model,
        version: &job.version,
        shapes: job.shapes.clone(),
        given: job.given.clone(),
        samples: job.samples,
        seed: job.seed,
        tolerance: job.tolerance,
        text: job.text.clone(),
    };
    if !matches!(
        job.runtime,
        BackendKind::Tract | BackendKind::Onnxruntime | BackendKind::Llamacpp
    ) {
        return Err(Error::InvalidSpec(format!(
            "{} is not a reference runtime (tract, onnxruntime, llamacpp)",
            job.runtime.as_str()
        )));
    }
    let reference =
        crate::backend::for_target(&kiln_crds::compiled_target::Backend::of(job.runtime))?;
    let bytes = make(reference.as_ref(), &request)?.to_bytes()?;
    std::fs::write(&job.out, &bytes).map_err(|e| Error::store(&job.out, e))?;
    Ok(sha256_bytes(&bytes))
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
