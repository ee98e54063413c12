//! The serving-pod check: sends a target's fixture samples through a serving pod's own endpoint
//! (Open Inference Protocol v2, [`oip_v2`]; llama.cpp's `llama-server`, [`llama_server`]),
//! checks every answer with the target's tolerances (a v2 answer with the same parity judge as
//! a node's warmup, [`kiln_engines::pipeline::warmup::parity`]; a completion's greedy tokens as that
//! judge checks them) and measures the first request and the p50 through the server. Its
//! verdict decides the pod's `kiln.dev/warm` gate; it never guesses: no answer, a malformed one
//! or a wrong one is a reason of its own. Touches the network (the pod's endpoint) only.

pub mod llama_server;
pub mod oip_v2;
pub mod verdict;
mod wire;

use std::time::Duration;

use kiln_crds::compiled_target::Warmup;

use kiln_engines::pipeline::fixtures::FixtureFile;
pub use verdict::{Cold, Endpoint, Figures, Protocol, judge, requests, steady_p50};

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
    }
}

/// The client the check uses: bounded connect and request times, no proxy (pod IPs are
/// cluster-internal).
pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .no_proxy()
        .build()
        .unwrap_or_default()
}
