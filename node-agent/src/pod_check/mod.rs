//! The serving-pod check: sends a target's fixture samples through a serving pod's own endpoint
//! (Open Inference Protocol v2, [`oip_v2`]; llama.cpp's `llama-server`, [`llama_server`]; the
//! OpenAI-compatible API of language-model servers, [`openai`]),
//! checks every answer with the target's tolerances (a v2 answer with the same parity judge as
//! a node's warmup, [`kiln_engines::pipeline::warmup::parity`]; a completion's greedy tokens as that
//! judge checks them) and measures the first request and the p50 through the server. Its
//! verdict decides the pod's `kiln.dev/warm` gate; it never guesses: no answer, a malformed one
//! or a wrong one is a reason of its own. Touches the network (the pod's endpoint) only.

pub mod llama_server;
pub mod lm;
pub mod oip_v2;
pub mod openai;
pub mod verdict;
mod wire;

use std::time::Duration;

use kiln_crds::compiled_target::Warmup;

use kiln_engines::pipeline::fixtures::FixtureFile;
pub use verdict::{ApiKeyRef, Cold, Endpoint, Figures, Protocol, judge, requests, steady_p50};

/// Sends every sample through `endpoint` (`requests` of them, samples alternated, plus one
/// after), each answer judged; the figures, or why the pod is cold.
pub async fn check(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<Figures, Cold> {
    match endpoint.protocol {
        Protocol::OipV2 => oip_v2::check(client, endpoint, fixture, warmup).await,
        Protocol::LlamaServer => llama_server::check(client, endpoint, fixture, warmup).await,
        Protocol::OpenAi => openai::check(client, endpoint, fixture, warmup).await,
    }
}

/// The client the check uses: bounded connect and request times, no proxy (pod IPs are
/// cluster-internal).
pub fn client(timeout: Duration) -> reqwest::Client {
    builder(timeout).build().unwrap_or_default()
}

/// The same, sending `key` as a bearer token with every request (a header marked sensitive, so
/// no debug output shows it). Refuses a key that is no HTTP header value, without saying it.
pub fn client_with_key(timeout: Duration, key: &str) -> Result<reqwest::Client, String> {
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.trim()))
        .map_err(|_| {
            "the API key is not a valid HTTP header value (a token of printable characters)"
                .to_string()
        })?;
    value.set_sensitive(true);
    let headers = reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, value)]);
    builder(timeout)
        .default_headers(headers)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

fn builder(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .no_proxy()
}
