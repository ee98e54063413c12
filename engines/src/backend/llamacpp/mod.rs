//! `backend.kind: llamacpp`: GGUF language models on llama.cpp (the `llama-cpp-2` crate, built
//! from source: for the CPU, and with feature `cuda` its CUDA backend too, `device.rs`).
//! Compile = requantise the verified source through llama.cpp's own quantiser to the target's
//! weight type (`auto`: the largest that fits `warmup.memoryBudget`, the class's host memory and,
//! on a GPU, one GPU's memory, `fit.rs`; unset or the source's own type: a copy), with kiln's
//! index appended (`kiln_node_core::gguf_index`, which names the provider); an engine on CUDA has every layer
//! on the GPU (`offload.rs`); the reference is the unquantised source, on the CPU. Every file is read by
//! `gguf.rs` before llama.cpp opens it, and an architecture llama.cpp does not know is refused
//! (`UnsupportedOperator`).

use std::path::Path;
use std::sync::Mutex;

use kiln_crds::compiled_target::{ExecutionProvider, Precision};
use kiln_crds::llamacpp::{LlamacppSettings, Quantization};
use llama_cpp_2::model::LlamaModel;
use safetensors::Dtype;

use self::device::Device;
use super::TensorInfo;
use super::{Backend, CompileRequest, Compiled, Engine, GraphInterface, InputInfo, Shapes};
use kiln_node_core::error::{Error, Result};
use kiln_node_core::gguf_index;

mod architectures;
mod device;
mod engine;
mod ffi;
mod fit;
pub mod gguf;
mod offload;
mod runtime;

pub use engine::{GENERATE, LOGITS, PROMPT, TOKENS};

/// The llama.cpp kiln-agent links: the version of `llama-cpp-sys-2`, which vendors it (pinned
/// exactly in node-agent/Cargo.toml). The backend version in the compile key.
pub const VERSION: &str = "0.1.160";
const MEDIA_TYPE: &str = kiln_node_core::gguf_index::MEDIA_TYPE;

/// The llama.cpp backend with a target's settings.
pub struct Llamacpp {
    settings: LlamacppSettings,
    /// The chat template a reference run renders with in place of the GGUF's own
    /// (`kiln-agent fixtures --chat-template`).
    chat_template: Option<String>,
}

/// The largest chat template given beside a GGUF (templates are a few KB).
const MAX_CHAT_TEMPLATE: u64 = 256 << 10;

impl Llamacpp {
    /// The backend for a target's `backend` section.
    pub fn for_spec(spec: &kiln_crds::compiled_target::Backend) -> Self {
        Self {
            settings: spec.llamacpp.clone().unwrap_or_default(),
            chat_template: None,
        }
    }

    /// The same, its reference runs rendering chat with `template` in place of the GGUF's own.
    pub fn with_chat_template(mut self, template: String) -> Self {
        self.chat_template = Some(template);
        self
    }

    /// The weight type to compile to (`None`: the source's own) and why: as named, or for
    /// `auto` the largest that fits the memory figures of the request's class
    /// ([`fit::auto_budget`]).
    fn weights(
        &self,
        req: &CompileRequest<'_>,
        header: &gguf::Header,
        context: u32,
    ) -> Result<(Option<Quantization>, String)> {
        let source = fit::source_quantization(header);
        match self.settings.quantization {
            None => Ok((
                None,
                "the source's own types (no quantization set)".to_string(),
            )),
            Some(Quantization::Auto) => {
                let on_gpu = req.provider != ExecutionProvider::Cpu;
                let fit = req.memory_budget.clone().unwrap_or_default();
                let budget = fit::auto_budget(&fit, on_gpu).map_err(Error::InvalidSpec)?;
                // An already quantised source: its own types first, then only smaller ones.
                if let Some((name, _)) = &source {
                    let bytes = std::fs::metadata(req.model).map_or(u64::MAX, |m| m.len());
                    let need = fit::engine_bytes(header, bytes, context);
                    if need <= budget.bytes {
                        let why = format!(
                            "auto: the source's own {name}, about {need} of {} bytes, {} (a quantised source is never requantised to a larger type)",
                            budget.bytes, budget.from
                        );
                        return Ok((None, why));
                    }
                }
                let ceiling = fit::Ceiling::of(header);
                let q =
                    fit::choose(header, context, &budget, ceiling).map_err(Error::InvalidSpec)?;
                let need = fit::estimate(header, q, context);
                let why = format!(
                    "auto: about {need} of {} bytes, {}",
                    budget.bytes, budget.from
                );
                Ok((Some(q), why))
            }
            Some(q) => {
                if let Some(source) = &source
                    && !self.settings.allow_requantization.unwrap_or(false)
                {
                    fit::refuse_requantization(source, q).map_err(Error::InvalidSpec)?;
                }
                Ok((Some(q), "as the target names it".to_string()))
            }
        }
    }

    fn threads(&self) -> i32 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = self.settings.threads.map_or(cores, |t| t as usize);
        i32::try_from(threads).unwrap_or(1)
    }
}

/// The instruction sets the linked llama.cpp was compiled for (ggml's defaults for a non-native
/// x86-64 build: x86-64-v3). On a CPU without them its code would die of an illegal
/// instruction, so such a machine is refused first. `dynamic-backends` would instead load the
/// best of ggml's CPU variants at run time (see README, Language models).
fn cpu_supported() -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    {
        let missing: Vec<&str> = [
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("bmi2", std::arch::is_x86_feature_detected!("bmi2")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
        ]
        .into_iter()
        .filter_map(|(name, present)| (!present).then_some(name))
        .collect();
        if !missing.is_empty() {
            return Err(Error::IncompatibleHardware(format!(
                "this kiln-agent's llama.cpp is built for x86-64-v3; this CPU lacks {}",
                missing.join(", ")
            )));
        }
    }
    Ok(())
}

/// Reads and checks a file's GGUF header; `wrap` classifies a refusal (a source is the spec's
/// fault, an artifact the load's). An architecture llama.cpp does not know is
/// `UnsupportedOperator` either way.
fn checked(path: &Path, wrap: fn(String) -> Error) -> Result<gguf::Header> {
    let header = gguf::read(path).map_err(|e| wrap(format!("{}: {e}", path.display())))?;
    if !architectures::KNOWN.contains(&header.architecture.as_str()) {
        return Err(Error::UnsupportedOperator {
            backend: "llamacpp".into(),
            operators: vec![format!(
                "architecture {:?} (llama.cpp {VERSION} does not know it)",
                header.architecture
            )],
        });
    }
    Ok(header)
}

fn source_error(m: String) -> Error {
    Error::InvalidSpec(format!(
        "spec.format gguf, but the source is not a usable GGUF file: {m}"
    ))
}

/// Loads the model at `path` with `context` tokens onto `device`, refusing an engine the
/// device has not the memory for (`IncompatibleHardware`): this machine's memory for the CPU,
/// the GPU's free memory for CUDA.
fn load_model(
    path: &Path,
    header: &gguf::Header,
    context: u32,
    device: Device,
) -> Result<LlamaModel> {
    cpu_supported()?;
    let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
    let need = fit::engine_bytes(header, bytes, context);
    if device == Device::Cpu {
        fit::fits_machine(need, crate::host::memory::available(), context)
            .map_err(Error::IncompatibleHardware)?;
    }
    let params = offload::model_params(device, need)?;
    let backend = runtime::backend().map_err(Error::LoadFailed)?;
    LlamaModel::load_from_file(backend, path, &params).map_err(|e| {
        Error::LoadFailed(format!(
            "llama.cpp could not load {}: {e} (its log says why)",
            path.display()
        ))
    })
}

impl Backend for Llamacpp {
    fn name(&self) -> &'static str {
        "llamacpp"
    }

    fn version(&self) -> String {
        VERSION.to_string()
    }

    fn media_type(&self) -> &'static str {
        MEDIA_TYPE
    }

    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled> {
        refuse_settings(req)?;
        let device = device_for(req.provider)?;
        cpu_supported()?;
        let header = checked(req.model, source_error)?;
        let context = self.settings.context_length();
        let (weights, why) = self.weights(req, &header, context)?;
        let same =
            weights.is_none_or(|q| header.tensor_types.keys().collect::<Vec<_>>() == [q.as_str()]);
        if same {
            std::fs::copy(req.model, req.out).map_err(|e| Error::store(req.out, e))?;
        } else if let Some(q) = weights {
            ffi::quantize(req.model, req.out, q, self.threads())
                .map_err(|e| Error::CompileFailed(format!("quantising to {}: {e}", q.as_str())))?;
        }
        let gguf_bytes = std::fs::metadata(req.out)
            .map_err(|e| Error::store(req.out, e))?
            .len();
        let chosen = weights.map_or("source", Quantization::as_str);
        let index = gguf_index::Index {
            profiles: req
                .profiles
                .iter()
                .map(|(n, s)| (n.clone(), s.clone()))
                .collect(),
            context_length: context,
            quantization: chosen.to_string(),
            gguf_bytes,
            chat_template: req.chat_template.map(read_chat_template).transpose()?,
            provider: (device != Device::Cpu).then(|| device.provider()),
        };
        gguf_index::append(req.out, &index).map_err(Error::CompileFailed)?;
        let source_bytes = std::fs::metadata(req.model).map_or(0, |m| m.len());
        let mut resolved = std::collections::BTreeMap::from([
            ("llamacpp.weights".into(), chosen.into()),
            ("llamacpp.sourceBytes".into(), source_bytes.to_string()),
            ("llamacpp.ggufBytes".into(), gguf_bytes.to_string()),
        ]);
        if self.settings.quantization == Some(Quantization::Auto) {
            resolved.insert("llamacpp.autoFit".into(), why.clone());
        }
        Ok(Compiled {
            outputs: vec![LOGITS.into(), TOKENS.into()],
            log: vec![format!(
                "llama.cpp {VERSION}: {} ({} parameters, {:?}) → {chosen} ({why}), {source_bytes} → {gguf_bytes} bytes{}",
                header.architecture,
                header.parameters,
                header.tensor_types,
                if same { ", copied" } else { ", requantised" }
            )],
            machine_bound: None,
            resolved,
        })
    }

    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>> {
        let index = gguf_index::read(artifact)
            .map_err(|e| Error::LoadFailed(format!("{}: {e}", artifact.display())))?;
        let header = checked(artifact, Error::LoadFailed)?;
        // The provider is the artifact's (the compile key binds it to the class).
        let device = device_for(index.provider.unwrap_or_default())?;
        let model = load_model(artifact, &header, index.context_length, device)?;
        // Threads are the target's: not in the compile key, so not in the artifact either.
        engine_for(
            model,
            (index.context_length, self.threads(), device),
            index.profiles,
            index.chat_template,
        )
    }

    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>> {
        let header = checked(model, source_error)?;
        let profiles = vec![("reference".to_string(), shapes.clone())];
        let context = self.settings.context_length();
        // The reference is the source on the CPU, whatever device the target's engine uses.
        engine_for(
            load_model(model, &header, context, Device::Cpu)?,
            (context, self.threads(), Device::Cpu),
            profiles,
            self.chat_template.clone(),
        )
    }

    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>> {
        checked(model, source_error)?;
        Ok(vec![
            InputInfo {
                name: PROMPT.into(),
                dtype: Dtype::I32,
                dims: vec![None],
            },
            InputInfo {
                name: GENERATE.into(),
                dtype: Dtype::I32,
                dims: vec![Some(1)],
            },
        ])
    }

    fn interface(&self, model: &Path) -> Result<GraphInterface> {
        let header = checked(model, source_error)?;
        let info = |name: &str, dtype, dims| TensorInfo {
            name: name.into(),
            dtype: Some(dtype),
            dims: Some(dims),
        };
        let vocab = usize::try_from(header.vocab_size).ok();
        Ok(GraphInterface {
            inputs: vec![
                info(PROMPT, Dtype::I32, vec![None]),
                info(GENERATE, Dtype::I32, vec![Some(1)]),
            ],
            outputs: vec![
                info(LOGITS, Dtype::F32, vec![vocab]),
                info(TOKENS, Dtype::I32, vec![None]),
            ],
        })
    }
}

/// What a llamacpp compile refuses: another precision (the weight type is
/// `backend.llamacpp.quantization`), flags.
fn refuse_settings(req: &CompileRequest<'_>) -> Result<()> {
    if req.precision != Precision::Fp32 {
        return Err(Error::InvalidSpec(format!(
            "backend llamacpp computes fp32 activations; its weight type is backend.llamacpp.quantization, not precision {}: set precision: fp32",
            req.precision.as_str()
        )));
    }
    if let Some(flag) = req.flags.keys().next() {
        return Err(Error::InvalidSpec(format!(
            "the llamacpp backend takes no flags; remove backend.flags.{flag} (its settings are backend.llamacpp)"
        )));
    }
    Ok(())
}

/// The device of an engine on `provider` in this build ([`device::for_provider`]): TensorRT
/// is the spec's fault (`InvalidSpec`), CUDA in a build without it the image's
/// (`IncompatibleRuntime`).
fn device_for(provider: ExecutionProvider) -> Result<Device> {
    device::for_provider(provider, device::CUDA_ARCHITECTURES).map_err(|m| {
        if provider == ExecutionProvider::Tensorrt {
            Error::InvalidSpec(m)
        } else {
            Error::IncompatibleRuntime(m)
        }
    })
}

/// An engine of `model` with (context length, threads, device), its profiles and the chat
/// template given beside it.
fn engine_for(
    model: LlamaModel,
    (context_length, threads, device): (u32, i32, Device),
    profiles: Vec<(String, Shapes)>,
    chat_template: Option<String>,
) -> Result<Box<dyn Engine>> {
    let engine = engine::LlamaEngine {
        loaded: engine::Loaded::of(model),
        context_length,
        threads,
        device,
        profiles,
        chat_template,
        last: Mutex::new(None),
    };
    Ok(Box::new(engine))
}

/// A chat template file given beside a GGUF: UTF-8 text without NUL, at most
/// [`MAX_CHAT_TEMPLATE`] bytes.
pub fn read_chat_template(path: &Path) -> Result<String> {
    let bad = |m: String| Error::InvalidSpec(format!("chat template {}: {m}", path.display()));
    let size = std::fs::metadata(path)
        .map_err(|e| Error::store(path, e))?
        .len();
    if size > MAX_CHAT_TEMPLATE {
        return Err(bad(format!(
            "{size} bytes, over the {MAX_CHAT_TEMPLATE} a chat template may have"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| Error::store(path, e))?;
    let text = String::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    if text.contains('\0') || text.trim().is_empty() {
        return Err(bad(
            "empty or holding a NUL byte; give the Jinja template's text".into(),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_pinned_crate_and_the_architecture_list_is_its_own() {
        let lock =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"))
                .expect("Cargo.lock");
        let pinned = lock
            .split("[[package]]")
            .find(|p| p.contains("name = \"llama-cpp-sys-2\""))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .map(|v| v.trim_matches('"').to_string());
        assert_eq!(pinned.as_deref(), Some(VERSION));
        assert_eq!(architectures::FROM, VERSION);
        assert!(architectures::KNOWN.contains(&"llama"));
    }

    #[test]
    fn this_machine_runs_the_linked_llama_cpp() {
        // The development and CI machines are x86-64-v3 or newer (or not x86 at all).
        cpu_supported().expect("supported CPU");
    }

    #[test]
    fn a_chat_template_file_must_be_bounded_utf8_text() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).expect("write");
            p
        };
        let ok = file(
            "ok.jinja",
            b"{% for m in messages %}{{ m.content }}{% endfor %}",
        );
        assert!(
            read_chat_template(&ok)
                .expect("a template")
                .contains("messages")
        );
        let refused = |path: &Path, needle: &str| {
            let e = read_chat_template(path).expect_err("refused");
            assert!(matches!(e, Error::InvalidSpec(_)), "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        };
        let big = vec![b'x'; (MAX_CHAT_TEMPLATE + 1) as usize];
        refused(&file("big.jinja", &big), "over the");
        refused(&file("latin1.jinja", b"caf\xe9"), "not UTF-8");
        refused(&file("nul.jinja", b"a\0b"), "NUL");
        refused(&file("blank.jinja", b"  \n"), "empty");
        assert!(read_chat_template(&dir.path().join("absent")).is_err());
    }
}
