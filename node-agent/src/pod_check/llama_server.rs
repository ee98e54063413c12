//! Warming llama.cpp's own `llama-server` (its native REST API, not the OpenAI one): the server
//! must be healthy (`GET /health`), render chat with the fixture's template (`GET /props`),
//! tokenize the fixture's prompt text to the fixture's ids (`POST /tokenize`), and continue each
//! sample's prompt ids greedily to the fixture's tokens (`POST /completion`, `temperature: 0`,
//! `cache_prompt: false`): exact for the first K (the `tokens` output's `firstElements`, else
//! all), as the agent's own warmup checks them; the first token's log-probability (`n_probs`)
//! within the `logits` output's tolerance of the fixture's logits. The figures time the
//! completions.

use kiln_crds::compiled_target::Warmup;
use serde::Deserialize;
use serde_json::json;

use super::lm::{self, LOGITS, PROMPT, Sample, TOKENS, first_difference, ids};
use super::verdict::{Cold, Endpoint, Figures, requests, send_all};
use super::wire::{exchange, json_of, snippet};
use kiln_engines::pipeline::fixtures::FixtureFile;

/// See [`super::check`].
pub async fn check(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<Figures, Cold> {
    let base = &endpoint.base;
    health(client, base).await?;
    check_text(client, base, fixture).await?;
    let samples = fixture
        .samples()
        .iter()
        .map(Sample::of)
        .collect::<Result<Vec<_>, Cold>>()?;
    let n = requests(warmup, samples.len());
    send_all(
        n,
        samples.len(),
        |k| complete(client, base, &samples[k]),
        |answer, k| judge(answer, &samples[k], warmup),
    )
    .await
}

/// `GET /health`: 200 once the model is loaded (503 while loading).
async fn health(client: &reqwest::Client, base: &str) -> Result<(), Cold> {
    let url = format!("{base}/health");
    match exchange(client.get(&url)).await? {
        (200, _, _) => Ok(()),
        (status, _, body) => Err(Cold::Unreachable(format!(
            "GET {url} answered {status}: not ready ({})",
            snippet(&body)
        ))),
    }
}

/// The fixture's text against the server's: its chat template (sha256, as the fixture recorded
/// it) and its tokenizer on the fixture's prompt. Nothing for a fixture without text.
async fn check_text(
    client: &reqwest::Client,
    base: &str,
    fixture: &FixtureFile,
) -> Result<(), Cold> {
    let text = &fixture.text;
    if let Some(want) = &text.chat_template_sha256 {
        let url = format!("{base}/props");
        let props: Props = json_of("llama-server's", &url, exchange(client.get(&url)).await?)?;
        let have = props
            .chat_template
            .as_deref()
            .map(|t| kiln_store::staged::sha256_bytes(t.as_bytes()));
        if have.as_deref() != Some(want.as_str()) {
            return Err(Cold::Mismatch(format!(
                "the server's chat template has sha256 {}, the fixture was rendered with {want}: another model or a --chat-template override",
                have.as_deref().unwrap_or("(none)")
            )));
        }
    }
    let Some(prompt) = &text.prompt else {
        return Ok(());
    };
    let url = format!("{base}/tokenize");
    // As kiln's tokenizer: a rendered chat prompt carries its special tokens in the text; a
    // plain prompt gets the model's leading ones (BOS).
    let body =
        json!({"content": prompt, "add_special": text.chat.is_none(), "parse_special": true});
    let answer: Tokenized = json_of(
        "llama-server's",
        &url,
        exchange(client.post(&url).json(&body)).await?,
    )?;
    let want = ids(fixture.inputs.get(PROMPT), PROMPT)?;
    match first_difference(&answer.tokens, &want) {
        None => Ok(()),
        Some(m) => Err(Cold::Mismatch(format!(
            "the server's tokenizer turns the fixture's prompt into other tokens than the reference did: {m}"
        ))),
    }
}

/// What a completion returned.
#[derive(Debug, Deserialize)]
struct Completion {
    /// Every sampled token, the end-of-generation one included (`return_tokens`).
    #[serde(default)]
    tokens: Vec<i32>,
    /// `eos`, `limit`, `word`, `none`.
    #[serde(default)]
    stop_type: String,
    /// Per generated token its id and log-probability (`n_probs`).
    #[serde(default)]
    completion_probabilities: Vec<Probability>,
}

#[derive(Debug, Deserialize)]
struct Probability {
    id: i32,
    logprob: f64,
}

#[derive(Debug, Deserialize)]
struct Tokenized {
    tokens: Vec<i32>,
}

#[derive(Debug, Deserialize)]
struct Props {
    #[serde(default)]
    chat_template: Option<String>,
}

/// One greedy completion of a sample's prompt ids.
async fn complete(
    client: &reqwest::Client,
    base: &str,
    sample: &Sample,
) -> Result<Completion, Cold> {
    let url = format!("{base}/completion");
    let body = json!({
        "prompt": sample.prompt,
        "n_predict": sample.generate,
        "temperature": 0.0,
        "cache_prompt": false,
        "n_probs": 1,
        "return_tokens": true,
        "stream": false,
    });
    json_of(
        "llama-server's",
        &url,
        exchange(client.post(&url).json(&body)).await?,
    )
}

/// Judges a completion against its sample. The greedy tokens: exact for the first K (the
/// `tokens` output's `firstElements`, else all); an answer may end early only where the server
/// sampled an end-of-generation token, which is then the golden one at that position. The
/// first token's log-probability: within twice the `logits` tolerance of the fixture's
/// log-softmax (a log-softmax moves by at most twice the largest logit error). The largest
/// log-probability error. Pure.
fn judge(answer: &Completion, sample: &Sample, warmup: &Warmup) -> Result<f64, Cold> {
    let k = sample.checked(warmup);
    let got = &answer.tokens;
    if !warmup.excludes(TOKENS) {
        if got.len() < k && answer.stop_type != "eos" {
            return Err(Cold::Malformed(format!(
                "the server returned {} tokens of the {k} asked, stopped by {:?}, not by end of generation",
                got.len(),
                answer.stop_type
            )));
        }
        let checked = k.min(got.len());
        if let Some(m) = first_difference(&got[..checked], &sample.tokens[..checked]) {
            return Err(Cold::ParityExceeded(format!(
                "greedy tokens: {m} (first {k} checked)"
            )));
        }
    }
    match (&sample.logits, warmup.excludes(LOGITS)) {
        (Some(logits), false) => first_logprob(answer, logits, warmup),
        _ => Ok(0.0),
    }
}

/// The first generated token's log-probability against the fixture's logits. Pure.
fn first_logprob(answer: &Completion, logits: &[f64], warmup: &Warmup) -> Result<f64, Cold> {
    let Some(first) = answer.completion_probabilities.first() else {
        return Err(Cold::Malformed(
            "the completion carries no completion_probabilities, though n_probs was asked".into(),
        ));
    };
    lm::first_logprob(first.id, first.logprob, logits, warmup)
}

#[cfg(test)]
mod tests;
