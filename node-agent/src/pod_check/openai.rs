//! Checking a server through the OpenAI-compatible API that vLLM, SGLang, TGI, llama-server,
//! Ollama and most language-model servers share. The server must list the model
//! (`GET /v1/models`, `kiln.dev/model-name`); each request is greedy (`temperature: 0`, a fixed
//! `seed`, `max_tokens` the K tokens checked, `logprobs` on, token ids asked for where the server
//! knows how: vLLM's `return_tokens_as_token_ids`, llama-server's `id` fields; no repetition
//! penalty or nucleus cut, which some servers apply by default):
//! `/v1/chat/completions` with the fixture's chat messages, which the server renders with its own
//! template, so another template answers otherwise; else `/v1/completions` with the prompt text.
//!
//! How an answer is judged (pure, [`judge`]):
//! * the prompt's length, where the server reports it (`usage.prompt_tokens`), must be the
//!   fixture's prompt ids': another chat template or tokenizer is `ServingMismatch` before any
//!   token is compared;
//! * with token ids in the answer: the first K exact, as the agent's own warmup checks them; an
//!   answer may end early only by `finish_reason: stop` (end of generation, which the golden
//!   tokens then end with too: the shorter answer must be their prefix and its text the whole
//!   golden text);
//! * without ids, as text: the answer must be the start of the fixture's detokenized golden
//!   continuation, or all of it when the server stopped (`finish_reason: stop`). Leading and
//!   trailing whitespace is not compared (servers differ in trimming it; a token's leading space
//!   is the common case), whitespace inside is;
//! * the first token's log-probability, where the server returns one, within twice the `logits`
//!   tolerance of the fixture's log-softmax.
//!
//! A failure names the first differing token or character and both texts.

use kiln_crds::compiled_target::Warmup;
use serde::Deserialize;
use serde_json::{Value, json};

use super::lm::{LOGITS, Sample, TOKENS, first_difference, first_logprob};
use super::verdict::{Cold, Endpoint, Figures, requests, send_all};
use super::wire::{exchange, json_of};
use kiln_engines::pipeline::fixtures::FixtureFile;

/// See [`super::check`].
pub async fn check(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<Figures, Cold> {
    let asked = Asked::of(fixture, &endpoint.model, warmup)?;
    models(client, endpoint).await?;
    let n = requests(warmup, 1);
    send_all(
        n,
        1,
        |_| complete(client, endpoint, &asked),
        |answer, _| judge(answer, &asked, warmup),
    )
    .await
}

/// What every request sends and every answer is held to.
#[derive(Clone, Debug, PartialEq)]
pub struct Asked {
    /// The route, relative to the server's base.
    pub route: &'static str,
    /// The request body.
    pub body: Value,
    /// The fixture's sample.
    pub sample: Sample,
    /// The fixture's golden continuation, as text.
    pub continuation: String,
}

impl Asked {
    /// The request for `fixture` to the model `model`. Refuses a fixture that is not a language
    /// model's text fixture, or whose chat is not a list of messages.
    pub fn of(fixture: &FixtureFile, model: &str, warmup: &Warmup) -> Result<Self, Cold> {
        let text = &fixture.text;
        let not_text = || {
            Cold::Mismatch(
                "the fixture has no prompt text and golden continuation: an openai pod is checked with a language model's text fixture (kiln-agent fixtures --prompt or --chat)".into(),
            )
        };
        let continuation = text.continuation.clone().ok_or_else(not_text)?;
        let sample = Sample::of(fixture)?;
        let max_tokens = sample.checked(warmup).max(1);
        // Greedy means the argmax of the model's own logits: no penalty or nucleus cut, which
        // some servers apply by default (llama-cpp-python's repeat_penalty 1.1); each server
        // reads the names it knows and ignores the others.
        let common = json!({
            "model": model, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0, "n": 1,
            "top_p": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "repeat_penalty": 1.0, "repetition_penalty": 1.0,
            "stream": false, "return_tokens_as_token_ids": true,
        });
        let (route, mut body) = match (&text.chat, &text.prompt) {
            (Some(chat), _) => {
                let messages: Value = serde_json::from_str(chat)
                    .ok()
                    .filter(Value::is_array)
                    .ok_or_else(|| {
                        Cold::Mismatch("the fixture's chat is not a JSON list of messages".into())
                    })?;
                let extra = json!({"messages": messages, "logprobs": true, "top_logprobs": 1});
                ("/v1/chat/completions", extra)
            }
            (None, Some(prompt)) => ("/v1/completions", json!({"prompt": prompt, "logprobs": 1})),
            (None, None) => return Err(not_text()),
        };
        if let (Some(body), Some(common)) = (body.as_object_mut(), common.as_object()) {
            body.extend(common.clone());
        }
        Ok(Self {
            route,
            body,
            sample,
            continuation,
        })
    }
}

/// `GET /v1/models` must list `endpoint.model`.
async fn models(client: &reqwest::Client, endpoint: &Endpoint) -> Result<(), Cold> {
    #[derive(Deserialize)]
    struct Models {
        data: Vec<Model>,
    }
    #[derive(Deserialize)]
    struct Model {
        id: String,
    }
    let url = format!("{}/v1/models", endpoint.base);
    let listed: Models = json_of(
        "an OpenAI-compatible",
        &url,
        exchange(client.get(&url)).await?,
    )?;
    let ids: Vec<&str> = listed.data.iter().map(|m| m.id.as_str()).collect();
    if ids.contains(&endpoint.model.as_str()) {
        return Ok(());
    }
    Err(Cold::Mismatch(format!(
        "GET {url} lists {ids:?}, not {:?}: the server serves another model (set kiln.dev/model-name to the name it serves this target's model under)",
        endpoint.model
    )))
}

/// One greedy request.
async fn complete(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    asked: &Asked,
) -> Result<Answer, Cold> {
    let url = format!("{}{}", endpoint.base, asked.route);
    json_of(
        "an OpenAI-compatible",
        &url,
        exchange(client.post(&url).json(&asked.body)).await?,
    )
}

/// A completion or chat completion, as far as the check reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Answer {
    /// The choices (one asked).
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One choice.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Choice {
    /// `/v1/completions`: the text.
    #[serde(default)]
    pub text: Option<String>,
    /// `/v1/chat/completions`: the message.
    #[serde(default)]
    pub message: Option<Message>,
    /// `stop` (end of generation or a stop word) or `length`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Per generated token: its log-probability, and its id where the server gives one.
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
}

/// A chat answer's message.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Message {
    /// Its text.
    #[serde(default)]
    pub content: Option<String>,
}

/// Both shapes servers answer `logprobs` in: the chat one (`content`, which llama-server uses for
/// completions too) and the legacy completions one (`tokens`, `token_logprobs`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Logprobs {
    /// Chat shape.
    #[serde(default)]
    pub content: Option<Vec<TokenLogprob>>,
    /// Legacy shape: the tokens as text (`token_id:N` with `return_tokens_as_token_ids`).
    #[serde(default)]
    pub tokens: Option<Vec<String>>,
    /// Legacy shape: their log-probabilities.
    #[serde(default)]
    pub token_logprobs: Option<Vec<Option<f64>>>,
}

/// One generated token, chat shape.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TokenLogprob {
    /// Its id (llama-server).
    #[serde(default)]
    pub id: Option<i64>,
    /// Its text (`token_id:N` with vLLM's `return_tokens_as_token_ids`).
    #[serde(default)]
    pub token: Option<String>,
    /// Its log-probability.
    #[serde(default)]
    pub logprob: Option<f64>,
}

/// Token counts.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Usage {
    /// The prompt's, as the server tokenized (and for a chat, rendered) it.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
}

impl Choice {
    fn text(&self) -> Option<&str> {
        self.text
            .as_deref()
            .or_else(|| self.message.as_ref().and_then(|m| m.content.as_deref()))
    }

    /// The generated ids, when the server said every one of them.
    fn ids(&self) -> Option<Vec<i32>> {
        let lp = self.logprobs.as_ref()?;
        let id_of = |id: Option<i64>, token: Option<&str>| {
            id.and_then(|i| i32::try_from(i).ok()).or_else(|| {
                token?
                    .strip_prefix("token_id:")
                    .and_then(|n| n.parse().ok())
            })
        };
        match (&lp.content, &lp.tokens) {
            (Some(content), _) => content
                .iter()
                .map(|t| id_of(t.id, t.token.as_deref()))
                .collect(),
            (None, Some(tokens)) => tokens.iter().map(|t| id_of(None, Some(t))).collect(),
            (None, None) => None,
        }
    }

    fn first_logprob(&self) -> Option<f64> {
        let lp = self.logprobs.as_ref()?;
        match (&lp.content, &lp.token_logprobs) {
            (Some(content), _) => content.first()?.logprob,
            (None, Some(l)) => *l.first()?,
            (None, None) => None,
        }
    }
}

/// Judges an answer (see the module's text); the first token's log-probability error. Pure.
pub fn judge(answer: &Answer, asked: &Asked, warmup: &Warmup) -> Result<f64, Cold> {
    let Some(choice) = answer.choices.first() else {
        return Err(Cold::Malformed("the answer has no choices".into()));
    };
    let sample = &asked.sample;
    if let Some(n) = answer.usage.as_ref().and_then(|u| u.prompt_tokens)
        && n != sample.prompt.len() as u64
    {
        return Err(Cold::Mismatch(format!(
            "the server's prompt is {n} tokens, the fixture's {}: another chat template or tokenizer than the reference's",
            sample.prompt.len()
        )));
    }
    let text = choice.text().unwrap_or_default();
    let stopped = choice.finish_reason.as_deref() == Some("stop");
    let ids = choice.ids();
    if !warmup.excludes(TOKENS) {
        match &ids {
            Some(ids) => judge_ids(ids, stopped, text, asked, warmup)?,
            None => judge_text(text, stopped, &asked.continuation)?,
        }
    }
    match (&sample.logits, warmup.excludes(LOGITS)) {
        (Some(logits), false) => {
            let Some(logprob) = choice.first_logprob() else {
                return Err(Cold::Malformed(
                    "the answer carries no log-probability for its first token, though logprobs was asked".into(),
                ));
            };
            let first = ids
                .and_then(|ids| ids.first().copied())
                .or_else(|| sample.tokens.first().copied())
                .unwrap_or_default();
            first_logprob(first, logprob, logits, warmup)
        }
        _ => Ok(0.0),
    }
}

/// The first K ids exact; fewer only after an end of generation.
fn judge_ids(
    ids: &[i32],
    stopped: bool,
    text: &str,
    asked: &Asked,
    warmup: &Warmup,
) -> Result<(), Cold> {
    let golden = &asked.sample.tokens;
    let k = asked.sample.checked(warmup);
    let texts = || {
        format!(
            "the server's text {text:?}, the fixture's {:?}",
            asked.continuation
        )
    };
    if ids.len() < k && !stopped {
        return Err(Cold::Malformed(format!(
            "the server returned {} tokens of the {k} asked without an end of generation; {}",
            ids.len(),
            texts()
        )));
    }
    let checked = k.min(ids.len());
    if let Some(m) = first_difference(&ids[..checked], &golden[..checked]) {
        return Err(Cold::ParityExceeded(format!(
            "greedy tokens: {m} (first {k} checked); {}",
            texts()
        )));
    }
    if checked < k && text.trim() != asked.continuation.trim() {
        return Err(Cold::ParityExceeded(format!(
            "the server ended after {checked} of the {k} golden tokens checked, where the reference went on; {}",
            texts()
        )));
    }
    Ok(())
}

/// The answer's text the start of the golden continuation (all of it after a stop), leading and
/// trailing whitespace aside.
fn judge_text(text: &str, stopped: bool, continuation: &str) -> Result<(), Cold> {
    let (got, want) = (text.trim(), continuation.trim());
    let ok = if stopped {
        got == want
    } else {
        want.starts_with(got) && !got.is_empty()
    };
    if ok {
        return Ok(());
    }
    let at = got
        .chars()
        .zip(want.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let ended = if stopped {
        " (the server ended its answer there)"
    } else {
        ""
    };
    Err(Cold::ParityExceeded(format!(
        "the greedy text differs at character {at}{ended}: the server's {text:?}, the fixture's {continuation:?}"
    )))
}

#[cfg(test)]
mod tests;
