//! A loaded GGUF language model on llama.cpp (CPU), run as kiln runs every engine: named
//! tensors in (`prompt`: token ids, i32 [n]; `generate`: how many tokens to continue, i32 [1]),
//! named tensors out (`logits`: the last prompt position's, f32 [vocab]; `tokens`: the greedy
//! continuation, i32 [generate]). The runs of one engine share one context, its KV cache
//! cleared before each, so runs are independent and repeatable; each measures prefill and
//! decode for the warmup report.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use safetensors::Dtype;

use crate::backend::tensor::{HostTensor, le_vec};
use crate::backend::{Engine, Generation, Shapes, Tokenizer};
use kiln_node_core::error::{Error, Result};

/// Input and output names.
pub const PROMPT: &str = "prompt";
pub const GENERATE: &str = "generate";
pub const LOGITS: &str = "logits";
pub const TOKENS: &str = "tokens";

/// The one context a model's runs share (`None` until the first run).
pub type Slot<'a> = Mutex<Option<LlamaContext<'a>>>;

self_cell::self_cell!(
    /// A loaded model and the context its runs share, which borrows it.
    pub struct Loaded {
        owner: LlamaModel,
        #[not_covariant]
        dependent: Slot,
    }
);

impl Loaded {
    /// The model, with no context yet.
    pub fn of(model: LlamaModel) -> Self {
        Self::new(model, |_| Mutex::new(None))
    }
}

/// A model with what a run needs.
pub struct LlamaEngine {
    pub(super) loaded: Loaded,
    pub(super) context_length: u32,
    pub(super) threads: i32,
    /// Where its layers, KV cache and operations are.
    pub(super) device: super::device::Device,
    pub(super) profiles: Vec<(String, Shapes)>,
    /// The chat template given beside the GGUF (a `chatTemplate` asset), which replaces the
    /// one inside it (`tokenizer.chat_template`).
    pub(super) chat_template: Option<String>,
    /// Serialises runs (llama.cpp may not create two contexts of one model at once) and keeps
    /// the last run's timings.
    pub(super) last: Mutex<Option<Generation>>,
}

impl LlamaEngine {
    fn model(&self) -> &LlamaModel {
        self.loaded.borrow_owner()
    }

    fn vocab(&self) -> usize {
        usize::try_from(self.model().n_vocab()).unwrap_or(0)
    }

    /// Refuses a token id outside the vocabulary (llama.cpp would abort on it).
    fn in_vocab(&self, ids: &[i32], what: &str) -> Result<()> {
        let vocab = self.vocab();
        match ids
            .iter()
            .find(|t| usize::try_from(**t).map_or(true, |t| t >= vocab))
        {
            Some(bad) => Err(Error::WarmupFailed(format!(
                "{what} id {bad} is outside the vocabulary of {vocab} tokens"
            ))),
            None => Ok(()),
        }
    }

    /// The prompt and continuation length, checked against the vocabulary and the context.
    fn read_inputs(&self, inputs: &BTreeMap<String, HostTensor>) -> Result<(Vec<i32>, usize)> {
        let get = |name: &str| {
            inputs
                .get(name)
                .filter(|t| t.dtype == Dtype::I32)
                .ok_or_else(|| {
                    Error::WarmupFailed(format!(
                        "a language model takes inputs {PROMPT} (i32 token ids) and {GENERATE} (i32 [1]); {name} is missing or not i32"
                    ))
                })
        };
        let prompt = le_vec!(get(PROMPT)?.data, i32);
        let generate = le_vec!(get(GENERATE)?.data, i32);
        self.in_vocab(&prompt, "prompt token")?;
        let n = match generate.as_slice() {
            [n] if *n >= 1 => usize::try_from(*n).unwrap_or(0),
            other => {
                return Err(Error::WarmupFailed(format!(
                    "{GENERATE} must be one count of at least 1, got {other:?}"
                )));
            }
        };
        let room = self.context_length as usize;
        if prompt.is_empty() || prompt.len() + n > room {
            return Err(Error::WarmupFailed(format!(
                "a prompt of {} tokens and {n} to generate do not fit the context of {room} tokens (backend.llamacpp.contextLength); prompt at least 1",
                prompt.len()
            )));
        }
        Ok((prompt, n))
    }
}

impl LlamaEngine {
    /// The one context this engine's runs share, made on the first run: a context holds the
    /// KV cache and compute buffers for `context_length` tokens, so making one per request
    /// would cost every request their allocation.
    fn params(&self) -> LlamaContextParams {
        let base = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(self.context_length))
            .with_n_batch(self.context_length)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        super::offload::context_params(self.device, base)
    }

    /// Prefill and greedy decode on `ctx`, whose KV cache is cleared first: every run starts
    /// from an empty cache, as a fresh context would, so reuse cannot change an answer.
    fn generate(
        &self,
        ctx: &mut LlamaContext<'_>,
        prompt: &[i32],
        n: usize,
    ) -> Result<(Vec<f32>, Vec<i32>, Generation)> {
        ctx.clear_kv_cache();
        let fail =
            |e: &dyn std::fmt::Display| Error::WarmupFailed(format!("llama.cpp decode: {e}"));
        let mut batch = LlamaBatch::new(self.context_length as usize, 1);
        let started = Instant::now();
        let last_pos = prompt.len() - 1;
        for (pos, id) in prompt.iter().enumerate() {
            batch
                .add(LlamaToken(*id), pos as i32, &[0], pos == last_pos)
                .map_err(|e| fail(&e))?;
        }
        ctx.decode(&mut batch).map_err(|e| fail(&e))?;
        let logits = ctx.get_logits_ith(batch.n_tokens() - 1).to_vec();
        let prefill = started.elapsed().as_secs_f64();
        let decode_started = Instant::now();
        let mut tokens = vec![argmax(&logits)];
        for step in 1..n {
            batch.clear();
            let pos = (prompt.len() + step - 1) as i32;
            batch
                .add(LlamaToken(tokens[step - 1]), pos, &[0], true)
                .map_err(|e| fail(&e))?;
            ctx.decode(&mut batch).map_err(|e| fail(&e))?;
            tokens.push(argmax(ctx.get_logits_ith(0)));
        }
        let decode = decode_started.elapsed().as_secs_f64();
        let generation = Generation {
            prompt_tokens: prompt.len() as u32,
            generated_tokens: n as u32,
            prefill_seconds: prefill,
            decode_tokens_per_second: if n > 1 && decode > 0.0 {
                (n - 1) as f64 / decode
            } else {
                0.0
            },
            ..Generation::default()
        };
        Ok((logits, tokens, generation))
    }
}

impl LlamaEngine {
    /// The chat template: the one given beside the GGUF, else the GGUF's own.
    fn template(&self) -> Result<LlamaChatTemplate> {
        match &self.chat_template {
            Some(given) => LlamaChatTemplate::new(given).map_err(|e| {
                Error::InvalidSpec(format!("the chatTemplate asset holds a NUL byte: {e}"))
            }),
            None => self.model().chat_template(None).map_err(|e| {
                Error::ChatTemplateMismatch(format!(
                    "the model has no chat template (give one beside it: a spec.assets entry of kind chatTemplate): {e}"
                ))
            }),
        }
    }
}

impl Engine for LlamaEngine {
    fn run(&self, inputs: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
        let (prompt, n) = self.read_inputs(inputs)?;
        let mut last = self
            .last
            .lock()
            .map_err(|_| Error::WarmupFailed("an earlier run panicked".into()))?;
        let (logits, tokens, generation) = self.loaded.with_dependent(|model, slot| {
            let mut slot = slot
                .lock()
                .map_err(|_| Error::WarmupFailed("an earlier run panicked".into()))?;
            if slot.is_none() {
                let backend = super::runtime::backend().map_err(Error::WarmupFailed)?;
                let ctx = model
                    .new_context(backend, self.params())
                    .map_err(|e| Error::WarmupFailed(format!("llama.cpp context: {e}")))?;
                *slot = Some(ctx);
            }
            match slot.as_mut() {
                Some(ctx) => self.generate(ctx, &prompt, n),
                None => Err(Error::WarmupFailed("no llama.cpp context".into())),
            }
        })?;
        *last = Some(generation);
        let f32s: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let i32s: Vec<u8> = tokens.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(BTreeMap::from([
            (
                LOGITS.to_string(),
                HostTensor {
                    dtype: Dtype::F32,
                    shape: vec![logits.len()],
                    data: f32s,
                },
            ),
            (
                TOKENS.to_string(),
                HostTensor {
                    dtype: Dtype::I32,
                    shape: vec![n],
                    data: i32s,
                },
            ),
        ]))
    }

    fn profiles(&self) -> Vec<(String, Shapes)> {
        self.profiles.clone()
    }

    fn input_dtypes(&self) -> BTreeMap<String, Dtype> {
        BTreeMap::from([(PROMPT.into(), Dtype::I32), (GENERATE.into(), Dtype::I32)])
    }

    fn generation(&self) -> Option<Generation> {
        self.last.lock().ok().and_then(|g| *g)
    }

    fn tokenizer(&self) -> Option<&dyn Tokenizer> {
        Some(self)
    }
}

/// The tokenizer and chat template inside the GGUF, as llama.cpp reads them.
impl Tokenizer for LlamaEngine {
    fn encode(&self, text: &str, rendered: bool) -> Result<Vec<i32>> {
        // Special tokens written in the text (a rendered template's) are parsed as such; the
        // model's own leading tokens (BOS) are added to a plain prompt only.
        let ids = self
            .model()
            .vocab()
            .tokenize(text.as_bytes(), !rendered, true);
        if ids.is_empty() {
            return Err(Error::WarmupFailed(format!(
                "the prompt {text:?} gives no tokens; give a non-empty prompt"
            )));
        }
        Ok(ids.into_iter().map(|t| t.0).collect())
    }

    fn piece(&self, id: i32) -> String {
        if self.in_vocab(&[id], "token").is_err() {
            return "(outside the vocabulary)".into();
        }
        let bytes = self
            .model()
            .vocab()
            .token_to_piece(LlamaToken(id), true, None);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn decode(&self, ids: &[i32]) -> Result<String> {
        self.in_vocab(ids, "token")?;
        let tokens: Vec<LlamaToken> = ids.iter().map(|t| LlamaToken(*t)).collect();
        let bytes = self.model().vocab().detokenize(&tokens, false, false);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn chat_template(&self) -> Option<String> {
        self.template().ok().and_then(|t| t.to_string().ok())
    }

    fn render(&self, messages: &[(String, String)]) -> Result<String> {
        let bad = |e: &dyn std::fmt::Display| {
            Error::InvalidSpec(format!(
                "rendering the chat messages with the model's chat template: {e}"
            ))
        };
        let template = self.template()?;
        let chat = messages
            .iter()
            .map(|(role, content)| LlamaChatMessage::new(role.clone(), content.clone()))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(&e))?;
        self.model()
            .apply_chat_template(&template, &chat, true)
            .map_err(|e| bad(&e))
    }
}

/// The greedy choice: the first highest logit (NaN never wins).
pub fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0usize;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    i32::try_from(best).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_highest_and_skips_nan() {
        assert_eq!(argmax(&[0.1, 0.9, 0.9, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.2, 0.1]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 1);
        assert_eq!(argmax(&[]), 0);
    }
}
