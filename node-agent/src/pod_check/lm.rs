//! What every language-model protocol's check shares (llama.cpp's native API, [`super::llama_server`];
//! the OpenAI-compatible one, [`super::openai`]): a text fixture's sample (prompt ids, how many
//! tokens to generate, the golden greedy tokens and first-token logits), where two id lists
//! first differ, and the first token's log-probability against the fixture's logits. Pure.

use kiln_crds::compiled_target::Warmup;

use super::verdict::Cold;
use kiln_engines::backend::tensor::HostTensor;
use kiln_engines::pipeline::fixtures::FixtureFile;

/// The fixture's tensors a language model's check reads.
pub const PROMPT: &str = "prompt";
pub const GENERATE: &str = "generate";
pub const TOKENS: &str = "tokens";
pub const LOGITS: &str = "logits";

/// One sample: the prompt's ids and the golden continuation.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The prompt's token ids (a chat as the reference's template rendered it).
    pub prompt: Vec<i32>,
    /// How many tokens the reference generated.
    pub generate: usize,
    /// The golden greedy tokens.
    pub tokens: Vec<i32>,
    /// The first generated position's logits, when the fixture holds them.
    pub logits: Option<Vec<f64>>,
}

impl Sample {
    /// The sample of a language model's fixture (`prompt`, `generate`, `tokens`, `logits`).
    pub fn of(s: &FixtureFile) -> Result<Self, Cold> {
        let generate = ids(s.inputs.get(GENERATE), GENERATE)?;
        let generate = match generate.as_slice() {
            [n] if *n >= 1 => *n as usize,
            other => {
                return Err(Cold::Mismatch(format!(
                    "fixture input {GENERATE} must be one count of at least 1, got {other:?}"
                )));
            }
        };
        let logits = match s.outputs.get(LOGITS) {
            Some(t) => Some(t.to_f64().map_err(|e| Cold::Mismatch(e.to_string()))?),
            None => None,
        };
        Ok(Self {
            prompt: ids(s.inputs.get(PROMPT), PROMPT)?,
            generate,
            tokens: ids(s.outputs.get(TOKENS), TOKENS)?,
            logits,
        })
    }

    /// How many of the golden tokens are checked: the `tokens` output's `firstElements`, else
    /// all of them.
    pub fn checked(&self, warmup: &Warmup) -> usize {
        warmup
            .first_elements(TOKENS)
            .unwrap_or(self.tokens.len())
            .min(self.tokens.len())
    }
}

/// The log-probability `logprob` the server gave token `token` at the first generated position,
/// against the fixture's `logits`: within twice the `logits` tolerance of the fixture's
/// log-softmax (a log-softmax moves by at most twice the largest logit error). The error.
pub fn first_logprob(
    token: i32,
    logprob: f64,
    logits: &[f64],
    warmup: &Warmup,
) -> Result<f64, Cold> {
    let Some(logit) = usize::try_from(token).ok().and_then(|i| logits.get(i)) else {
        return Err(Cold::Mismatch(format!(
            "the server's first token {token} is outside the fixture's vocabulary of {}",
            logits.len()
        )));
    };
    let want = logit - log_sum_exp(logits);
    let tol = warmup.tolerance(LOGITS);
    let largest = logits.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let bound = 2.0 * (tol.atol + tol.rtol * largest);
    let error = (logprob - want).abs();
    if error.is_nan() || error > bound {
        return Err(Cold::ParityExceeded(format!(
            "the first token's log-probability is {logprob:.6} through the server, {want:.6} from the fixture's logits: |error| {error:.3e} over {bound:.3e} (twice the logits tolerance)"
        )));
    }
    Ok(error)
}

/// log Σ exp(v), stable.
pub fn log_sum_exp(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return max;
    }
    max + values.iter().map(|v| (v - max).exp()).sum::<f64>().ln()
}

/// A fixture tensor as i32 ids.
pub fn ids(t: Option<&HostTensor>, name: &str) -> Result<Vec<i32>, Cold> {
    t.and_then(HostTensor::i32s).ok_or_else(|| {
        Cold::Mismatch(format!(
            "the fixture has no i32 tensor {name}: a language-model server's pod is checked with a language model's fixture (prompt, generate, tokens)"
        ))
    })
}

/// Where two id lists first differ, for messages.
pub fn first_difference(got: &[i32], want: &[i32]) -> Option<String> {
    if got == want {
        return None;
    }
    let i = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    Some(format!(
        "position {i}: {} where {} was expected ({} against {} ids)",
        got.get(i).map_or("nothing".into(), i32::to_string),
        want.get(i).map_or("nothing".into(), i32::to_string),
        got.len(),
        want.len()
    ))
}
