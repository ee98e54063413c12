//! The gate of a serving pod that names its server (`kiln.dev/protocol`): the node's row must be
//! served, the pod's containers ready, and the pod's own server warmed and checked through its
//! endpoint ([`crate::pod_check`]) for this pod, this container restart count and this revision;
//! only then True. A failed check stays False with its reason and is retried with back-off.
//! A pod without the annotation keeps the row-only gate ([`super::gate`]). The decisions are
//! pure; [`Serving`] is the state the agent keeps for them (`pods.rs` runs the checks).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kiln_crds::kiln_node::NodeTargetStatus;
use tokio::sync::Notify;

use super::gate::GateCondition;
use crate::pod_check::{ApiKeyRef, Cold, Endpoint, Figures, Protocol};
use kiln_crds::conditions::gate_reasons;
use kiln_crds::labels::{
    API_KEY_SECRET_ANNOTATION, MODEL_NAME_ANNOTATION, PORT_ANNOTATION, PROTOCOL_ANNOTATION,
};

/// How long one request to a serving pod may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What the agent keeps for serving pods.
pub struct Serving {
    /// Checks by pod uid.
    pub checks: Arc<Mutex<BTreeMap<String, Check>>>,
    /// Wakes the pass loop when a check ends.
    pub wake: Arc<Notify>,
    /// The HTTP client checks use.
    pub client: reqwest::Client,
}

impl Serving {
    /// Nothing checked yet; `wake` is the pass loop's.
    pub fn new(wake: Arc<Notify>) -> Self {
        Self {
            checks: Arc::default(),
            wake,
            client: crate::pod_check::client(REQUEST_TIMEOUT),
        }
    }
}

/// What a check is for: a change in any field means warming again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckKey {
    /// The pod's uid.
    pub uid: String,
    /// Restarts of all its containers: a restarted server is cold again.
    pub restarts: i64,
    /// The node row's revision and digest it was checked for.
    pub revision: i64,
    /// See `revision`.
    pub digest: String,
}

/// Where a pod's check stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// Under way; with the figures of the last check this same server (pod and restart count)
    /// passed under another revision, when there is one: it stays warm meanwhile.
    Running(CheckKey, Option<Figures>),
    /// Passed.
    Passed(CheckKey, Figures),
    /// Failed (`attempts` in a row); tried again from `retry_at`.
    Cold {
        /// For what.
        key: CheckKey,
        /// Why.
        cold: Cold,
        /// Failures in a row for this key.
        attempts: u32,
        /// When to try again.
        retry_at: Instant,
    },
}

impl Check {
    fn key(&self) -> &CheckKey {
        match self {
            Self::Running(k, _) | Self::Passed(k, _) | Self::Cold { key: k, .. } => k,
        }
    }
}

/// What the pod's gate should be, and whether a check should start now.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The condition.
    pub warm: GateCondition,
    /// Start a check of this endpoint for this key.
    pub start: Option<(Endpoint, CheckKey)>,
}

/// The pod's server, when it names one: `None` without `kiln.dev/protocol`; an error message
/// for annotations that cannot be used.
pub fn endpoint(pod: &Pod, target: &str) -> Option<Result<Endpoint, String>> {
    let annotations = pod.metadata.annotations.as_ref()?;
    let protocol = annotations.get(PROTOCOL_ANNOTATION)?;
    Some((|| {
        let protocol = Protocol::parse(protocol)?;
        let port: u16 = annotations
            .get(PORT_ANNOTATION)
            .ok_or_else(|| format!("{PROTOCOL_ANNOTATION} is set but {PORT_ANNOTATION} is not: name the server's port"))?
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{PORT_ANNOTATION} must be a port number (1–65535)"))?;
        let model = annotations
            .get(MODEL_NAME_ANNOTATION)
            .cloned()
            .unwrap_or_else(|| target.to_string());
        if model.is_empty()
            || !model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(format!(
                "{MODEL_NAME_ANNOTATION} {model:?} must be letters, digits, '-', '_' or '.'"
            ));
        }
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .unwrap_or_default();
        let base = match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(v6)) => format!("http://[{v6}]:{port}"),
            Ok(v4) => format!("http://{v4}:{port}"),
            Err(_) => String::new(),
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let api_key = annotations
            .get(API_KEY_SECRET_ANNOTATION)
            .map(|v| ApiKeyRef::parse(namespace, v))
            .transpose()?;
        Ok(Endpoint {
            protocol,
            base,
            model,
            api_key,
        })
    })())
}

/// Whether every container of the pod is ready (its `ContainersReady` condition).
pub fn containers_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "ContainersReady" && c.status == "True")
        })
}

/// Restarts of all the pod's containers.
pub fn restarts(pod: &Pod) -> i64 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| i64::from(c.restart_count)).sum())
}

/// What the pod holds and where its check stands: its endpoint (or why the annotations cannot
/// be used), its check, and the revision its csi.kiln.dev volume holds when known.
pub struct Seen<'a> {
    /// The pod's server.
    pub endpoint: Result<Endpoint, String>,
    /// Its check, if one ran or runs.
    pub check: Option<&'a Check>,
    /// The revision its volume holds (`kiln.json`), when it has one.
    pub mounted: Option<i64>,
}

/// The gate of a pod whose row-only gate is `row_warm` (True: the row serves) given what is
/// `seen` of it. A pod whose volume holds another revision than the row's keeps it (a mounted
/// artifact never changes) and says so. A pod being deleted starts no check: it leaves its
/// Service's endpoints anyway, and on a node busy loading a model a check of it delays its
/// replacement's.
pub fn decide(
    pod: &Pod,
    row: &NodeTargetStatus,
    row_warm: GateCondition,
    seen: Seen<'_>,
    now: Instant,
) -> Decision {
    let mut decision = decide_live(pod, row, row_warm, seen, now);
    if pod.metadata.deletion_timestamp.is_some() {
        decision.start = None;
    }
    decision
}

/// [`decide`] for a pod that is not being deleted.
fn decide_live(
    pod: &Pod,
    row: &NodeTargetStatus,
    row_warm: GateCondition,
    seen: Seen<'_>,
    now: Instant,
) -> Decision {
    let Seen {
        endpoint,
        check,
        mounted,
    } = seen;
    let cold = |reason: &str, message: String| Decision {
        warm: GateCondition {
            status: false,
            reason: reason.into(),
            message,
        },
        start: None,
    };
    if !row_warm.status {
        return Decision {
            warm: row_warm,
            start: None,
        };
    }
    let endpoint = match endpoint {
        Ok(e) => e,
        Err(m) => return cold(gate_reasons::INVALID_SPEC, m),
    };
    let revision = row.revision;
    if !containers_ready(pod) || endpoint.base.is_empty() {
        return cold(
            gate_reasons::WAITING_FOR_SERVER,
            format!(
                "revision {revision} is served on this node; waiting for the pod's containers to be ready before its server is checked"
            ),
        );
    }
    let key = CheckKey {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        restarts: restarts(pod),
        revision,
        digest: row.artifact_digest.clone().unwrap_or_default(),
    };
    let warming = format!(
        "revision {revision} is served on this node; sending the fixture through the pod's server at {}",
        endpoint.base
    );
    let passed = |figures: &Figures, rechecking: bool| {
        let served = match mounted.filter(|m| *m != revision) {
            Some(m) => format!(
                "this pod's volume holds revision {m} (a mounted artifact never changes; replace the pod to move it), the node serves revision {revision}"
            ),
            None => row_warm.message.clone(),
        };
        let again = if rechecking {
            format!("; checking the same server again for revision {revision}, its last check")
        } else {
            String::new()
        };
        GateCondition {
            status: true,
            reason: row_warm.reason.clone(),
            message: format!("{served}{again}: {}", figures.describe()),
        }
    };
    match check.filter(|c| c.key() == &key) {
        None => match still_warm(check, &key) {
            // The same server passed under another revision: warm while it is checked again.
            Some(figures) => Decision {
                warm: passed(&figures, true),
                start: Some((endpoint, key)),
            },
            None => Decision {
                start: Some((endpoint, key)),
                ..cold(gate_reasons::WARMING_SERVER, warming)
            },
        },
        Some(Check::Running(_, Some(figures))) => Decision {
            warm: passed(figures, true),
            start: None,
        },
        Some(Check::Running(_, None)) => cold(gate_reasons::WARMING_SERVER, warming),
        Some(Check::Passed(_, figures)) => Decision {
            warm: passed(figures, false),
            start: None,
        },
        Some(Check::Cold {
            cold: why,
            retry_at,
            ..
        }) => Decision {
            start: (now >= *retry_at).then(|| (endpoint, key.clone())),
            ..cold(why.reason(), why.message().to_string())
        },
    }
}

/// The figures of the last check `check` says this same server passed (the same pod and
/// restart count as `key`, under another revision), which keep it warm while it is checked
/// again; `None` for a new or restarted server, or one that failed.
pub fn still_warm(check: Option<&Check>, key: &CheckKey) -> Option<Figures> {
    let same = |k: &CheckKey| k.uid == key.uid && k.restarts == key.restarts;
    match check? {
        Check::Passed(k, f) if same(k) => Some(f.clone()),
        Check::Running(k, Some(f)) if same(k) => Some(f.clone()),
        _ => None,
    }
}

/// Failures in a row of `check` for `key` (0 when it is for another key or not cold).
pub fn failures(check: Option<&Check>, key: &CheckKey) -> u32 {
    match check {
        Some(Check::Cold {
            key: k, attempts, ..
        }) if k == key => *attempts,
        _ => 0,
    }
}

/// What a finished check leaves: warm, or cold after `failures_before` + 1 failures in a row,
/// with the back-off before the next try (`base` doubling per failure, at most `max`).
pub fn finished(
    key: CheckKey,
    result: Result<Figures, Cold>,
    failures_before: u32,
    now: Instant,
    (base, max): (Duration, Duration),
) -> Check {
    match result {
        Ok(figures) => Check::Passed(key, figures),
        Err(cold) => {
            let attempts = failures_before + 1;
            Check::Cold {
                retry_at: now + kiln_crds::backoff(base, max.max(base), attempts),
                key,
                cold,
                attempts,
            }
        }
    }
}

#[cfg(test)]
mod tests;
