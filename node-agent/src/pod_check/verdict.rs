//! What the check judges and reports, shared by every protocol: where a serving pod answers,
//! why it is cold, what warming it measured, and the pure judgements. Pure.

use std::collections::BTreeMap;

use kiln_crds::compiled_target::Warmup;
use kiln_crds::conditions::gate_reasons;
use kiln_crds::labels::{API_KEY_SECRET_ANNOTATION, PROTOCOL_ANNOTATION};

use kiln_engines::backend::tensor::HostTensor;
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_node_core::error::Error;

/// The protocols the check speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Any Open Inference Protocol v2 server over REST.
    OipV2,
    /// llama.cpp's own `llama-server`, its native REST API.
    LlamaServer,
    /// The OpenAI-compatible API of language-model servers (vLLM, SGLang, TGI, llama-server, …).
    OpenAi,
}

impl Protocol {
    /// The annotation's value.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "oip-v2" => Ok(Self::OipV2),
            "llama-server" => Ok(Self::LlamaServer),
            "openai" => Ok(Self::OpenAi),
            other => Err(format!(
                "{PROTOCOL_ANNOTATION}: {other:?} is not a protocol kiln speaks (oip-v2, llama-server, openai)"
            )),
        }
    }
}

/// Where a serving pod answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// How to talk to it.
    pub protocol: Protocol,
    /// `http://IP:PORT`.
    pub base: String,
    /// The model's name on that server.
    pub model: String,
    /// Where the server's API key is, when it wants one.
    pub api_key: Option<ApiKeyRef>,
}

/// Where a server's API key is: a key of a Secret in the pod's namespace. The key itself is
/// read only by the check that sends it, and is never logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyRef {
    /// The Secret's namespace (the pod's).
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// Its key.
    pub key: String,
}

impl ApiKeyRef {
    /// The annotation's value, `NAME` or `NAME/KEY` (default key `api-key`), in `namespace`.
    pub fn parse(namespace: &str, value: &str) -> Result<Self, String> {
        let (name, key) = value.split_once('/').unwrap_or((value, "api-key"));
        let key_ok = !key.is_empty()
            && key.len() <= 253
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !kiln_crds::names::is_dns1123_subdomain(name) || !key_ok {
            return Err(format!(
                "{API_KEY_SECRET_ANNOTATION} {value:?} must be NAME or NAME/KEY: a Secret of the pod's namespace, and a key of it (letters, digits, '-', '_', '.')"
            ));
        }
        Ok(Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            key: key.to_string(),
        })
    }
}

impl std::fmt::Display for ApiKeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secret {}/{} key {}",
            self.namespace, self.name, self.key
        )
    }
}

/// Why a serving pod is not warm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cold {
    /// The server did not answer (connection refused, timeout, not ready).
    Unreachable(String),
    /// It answered, but not in the protocol (status, body, types).
    Malformed(String),
    /// It serves something else: its model's inputs or outputs are not the fixture's.
    Mismatch(String),
    /// Its answers are outside the target's tolerances.
    ParityExceeded(String),
    /// It refused the agent's credentials, or the pod's API key could not be read.
    Unauthorized(String),
}

impl Cold {
    /// The gate's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => gate_reasons::SERVING_UNREACHABLE,
            Self::Malformed(_) => gate_reasons::SERVING_MALFORMED,
            Self::Mismatch(_) => gate_reasons::SERVING_MISMATCH,
            Self::ParityExceeded(_) => gate_reasons::SERVING_PARITY_EXCEEDED,
            Self::Unauthorized(_) => gate_reasons::SERVING_UNAUTHORIZED,
        }
    }

    /// The same, with the request it happened in named first.
    pub fn within(self, which: &str) -> Self {
        let named = |m: String| format!("{which}: {m}");
        match self {
            Self::Unreachable(m) => Self::Unreachable(named(m)),
            Self::Malformed(m) => Self::Malformed(named(m)),
            Self::Mismatch(m) => Self::Mismatch(named(m)),
            Self::ParityExceeded(m) => Self::ParityExceeded(named(m)),
            Self::Unauthorized(m) => Self::Unauthorized(named(m)),
        }
    }

    /// What went wrong, for the gate's message.
    pub fn message(&self) -> &str {
        match self {
            Self::Unreachable(m)
            | Self::Malformed(m)
            | Self::Mismatch(m)
            | Self::ParityExceeded(m)
            | Self::Unauthorized(m) => m,
        }
    }
}

/// What warming a serving pod measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Requests sent while warming (every sample at least once).
    pub requests: usize,
    /// The first request's latency (cold server), seconds.
    pub first_seconds: f64,
    /// Median latency of the rest, seconds.
    pub p50_seconds: f64,
    /// One more request once warm: what the first request after Ready finds, seconds.
    pub after_seconds: f64,
    /// Largest absolute error of any checked output.
    pub parity_max_abs_error: f64,
}

impl Figures {
    /// For the gate's message.
    pub fn describe(&self) -> String {
        format!(
            "{} requests through the server within tolerance (max |error| {:.3e}); first {:.1} ms, p50 {:.1} ms, first after warm {:.1} ms",
            self.requests,
            self.parity_max_abs_error,
            self.first_seconds * 1e3,
            self.p50_seconds * 1e3,
            self.after_seconds * 1e3
        )
    }
}

/// How many requests warming sends: the target's warmup iterations, and every sample at least
/// once. Pure.
pub fn requests(warmup: &Warmup, samples: usize) -> usize {
    (warmup.iterations as usize).max(samples).max(1)
}

/// Sends `requests` requests, sample `k = i % samples` each, then one more (what the first
/// request after Ready finds): `send(k)` sends one and gives the answer, timed; `check(answer,
/// k)` judges it, its largest error. A failure names the request and sample it happened in.
pub async fn send_all<T, S, Fut, C>(
    requests: usize,
    samples: usize,
    mut send: S,
    mut check: C,
) -> Result<Figures, Cold>
where
    S: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, Cold>>,
    C: FnMut(&T, usize) -> Result<f64, Cold>,
{
    let mut figures = Figures {
        requests,
        ..Figures::default()
    };
    let mut latencies = Vec::with_capacity(requests);
    for i in 0..=requests {
        let k = i % samples.max(1);
        let named = |cold: Cold| {
            let after = if i == requests { " (after warmup)" } else { "" };
            cold.within(&format!("request {}{after}, sample {}", i + 1, k + 1))
        };
        let started = std::time::Instant::now();
        let answer = send(k).await.map_err(named)?;
        let seconds = started.elapsed().as_secs_f64();
        let error = check(&answer, k).map_err(named)?;
        figures.parity_max_abs_error = figures.parity_max_abs_error.max(error);
        if i == requests {
            figures.after_seconds = seconds;
        } else {
            latencies.push(seconds);
        }
    }
    figures.first_seconds = latencies.first().copied().unwrap_or(0.0);
    figures.p50_seconds = steady_p50(&latencies);
    Ok(figures)
}

/// Judges one answer against its sample's golden outputs with the target's tolerances. Pure.
pub fn judge(
    outputs: &BTreeMap<String, HostTensor>,
    sample: &FixtureFile,
    warmup: &Warmup,
) -> Result<f64, Cold> {
    match kiln_engines::pipeline::warmup::parity(outputs, sample, warmup) {
        Ok(errors) => Ok(errors.values().copied().fold(0.0, f64::max)),
        Err(Error::ParityExceeded(m)) => Err(Cold::ParityExceeded(m)),
        Err(e) => Err(Cold::Mismatch(e.to_string())),
    }
}

/// Median of the latencies after the first (the first when there is one only), as a node's
/// warmup reports it ([`kiln_engines::pipeline::warmup::steady_percentiles`]). Pure.
pub fn steady_p50(latencies: &[f64]) -> f64 {
    kiln_engines::pipeline::warmup::steady_percentiles(latencies).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p50_leaves_the_cold_first_request_out() {
        assert_eq!(steady_p50(&[9.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(steady_p50(&[9.0]), 9.0);
        assert_eq!(steady_p50(&[]), 0.0);
    }

    #[test]
    fn every_sample_is_sent_at_least_once() {
        let warmup = |iterations| Warmup {
            iterations,
            ..serde_json::from_value(serde_json::json!({"fixtureVersion": "v1"}))
                .expect("default warmup")
        };
        assert_eq!(requests(&warmup(10), 3), 10);
        assert_eq!(requests(&warmup(1), 3), 3);
        assert_eq!(requests(&warmup(0), 0), 1);
    }

    #[test]
    fn an_api_key_secret_is_a_name_and_a_key_of_the_pods_namespace() {
        let r = ApiKeyRef::parse("ml", "vllm-key").expect("name");
        assert_eq!((r.name.as_str(), r.key.as_str()), ("vllm-key", "api-key"));
        let r = ApiKeyRef::parse("ml", "keys/token.txt").expect("name/key");
        assert_eq!(
            (r.namespace.as_str(), r.name.as_str(), r.key.as_str()),
            ("ml", "keys", "token.txt")
        );
        for bad in ["", "Keys", "keys/", "keys/a b", "../x", "keys/a/b"] {
            let e = ApiKeyRef::parse("ml", bad).expect_err(bad);
            assert!(e.contains("NAME or NAME/KEY"), "{bad}: {e}");
        }
    }

    #[test]
    fn protocols_are_named_exactly() {
        assert_eq!(Protocol::parse("oip-v2"), Ok(Protocol::OipV2));
        assert_eq!(Protocol::parse("llama-server"), Ok(Protocol::LlamaServer));
        assert_eq!(Protocol::parse("openai"), Ok(Protocol::OpenAi));
        assert!(Protocol::parse("OpenAI").is_err());
        assert!(
            Protocol::parse("v2")
                .expect_err("unknown")
                .contains("oip-v2")
        );
    }
}
