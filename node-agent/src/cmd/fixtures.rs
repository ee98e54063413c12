//! `kiln-agent fixtures`: makes a versioned fixture file from a model and given or seeded-random
//! inputs, with golden outputs from the reference (unoptimised) execution of the source model.
//! Reads the model (and given inputs), writes only the output file. The reference runs in the
//! engine's own process ([`kiln_engines::pipeline::isolate`]), under the same limits as a compile.

use std::path::PathBuf;
use std::process::ExitCode;

use kiln_crds::compiled_target::{BackendKind, Tolerance};

use kiln_engines::backend::Shapes;

use kiln_engines::pipeline::isolate::task;
use kiln_engines::pipeline::text::{TextPrompt, TextRequest};

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
    /// A chat template (Jinja text) given beside the GGUF, which renders --chat in place of the
    /// model's own, as a `chatTemplate` asset of the ModelArtifact does; the fixture records
    /// its sha256.
    #[arg(long, env = "KILN_FIXTURE_CHAT_TEMPLATE", requires = "chat")]
    chat_template: Option<PathBuf>,
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
    let job = task::Reference {
        model: args.model.clone(),
        version: args.version.clone(),
        shapes,
        given: args.inputs.clone(),
        samples: args.samples,
        seed: args.seed,
        tolerance: args
            .atol
            .zip(args.rtol)
            .map(|(atol, rtol)| Tolerance { atol, rtol }),
        runtime: args.reference.kind(),
        out: args.out.clone(),
        text,
    };
    let result = kiln_engines::golden::run(job);
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
            kiln_engines::pipeline::text::messages(&json)
                .map_err(|e| format!("--chat {}: {e}", path.display()))?;
            TextPrompt::Chat(json)
        }
        (None, None) => return Ok(None),
    };
    let chat_template = match &args.chat_template {
        Some(path) => Some(
            kiln_engines::backend::llamacpp::read_chat_template(path)
                .map_err(|e| format!("--chat-template: {e}"))?,
        ),
        None => None,
    };
    Ok(Some(TextRequest {
        prompt,
        generate: args.generate,
        chat_template,
    }))
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
