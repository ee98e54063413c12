//! The pods on this node that declare the `kiln.dev/warm` gate: each pass computes each one's
//! condition ([`gate`] from the node's row; for a pod that names its server, [`serving`] on top)
//! and patches what changed. Checks of serving pods run as tasks beside the pass loop, one per
//! pod at a time; each finished one records its verdict and wakes the loop.
//! Touches the apiserver (pod status patches, through `writes.rs`), the pods' endpoints (through
//! [`crate::pod_check`]) and the fixture blobs in the node cache (read only).

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::conditions::gate_reasons;
use kiln_crds::kiln_node::NodeTargetStatus;
use kiln_crds::labels::TARGET_ANNOTATION;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::agent::Agent;
use super::decide::TargetKey;
use super::serving::{self, Check, CheckKey};
use super::{gate, writes};
use crate::pod_check::{self, Cold, Endpoint};
use kiln_engines::metrics::TargetLabels;
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_engines::pipeline::isolate::task::FixtureRef;

/// The first wait after a failed check of a serving pod, doubling per failure in a row.
const RETRY_BASE: Duration = Duration::from_secs(5);
/// The longest wait between checks of a failing serving pod.
const RETRY_MAX: Duration = Duration::from_secs(300);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl Agent {
    /// Sets every gated pod's condition where it changed; starts the checks the decisions ask
    /// for; forgets the checks of pods that left.
    pub(super) async fn gates(&self, rows: &BTreeMap<TargetKey, NodeTargetStatus>) {
        let pods = self.pods.state();
        if let Ok(mut checks) = self.serving.checks.lock() {
            checks.retain(|uid, _| pods.iter().any(|p| p.metadata.uid.as_deref() == Some(uid)));
        }
        // What each pod's volume holds: one read of the cache's published/ per pass.
        let mounted = self.cache.mounted_revisions();
        for pod in pods {
            let Some(want) = self.desired(&pod, rows, &mounted) else {
                continue;
            };
            if !gate::differs(&pod, &want) {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let transition = gate::transition_time(&pod, &want, now());
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            match writes::patch_gate(&api, &pod.name_any(), &want, transition).await {
                Ok(()) => {
                    tracing::info!(pod = %format!("{ns}/{}", pod.name_any()), status = want.status, reason = %want.reason, "set kiln.dev/warm")
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{}", pod.name_any()), error = %e, "cannot set kiln.dev/warm")
                }
            }
        }
    }

    /// The pod's condition: the row's ([`gate::desired`]), and for a pod that names its server,
    /// the check through it ([`serving::decide`]), started here when the decision says so.
    fn desired(
        &self,
        pod: &Pod,
        rows: &BTreeMap<TargetKey, NodeTargetStatus>,
        mounted: &BTreeMap<String, i64>,
    ) -> Option<gate::GateCondition> {
        let row_warm = gate::desired(pod, rows)?;
        let target = pod.annotations().get(TARGET_ANNOTATION)?.clone();
        let Some(endpoint) = serving::endpoint(pod, &target) else {
            return Some(row_warm);
        };
        let key = TargetKey::new(pod.namespace().unwrap_or_default(), target);
        let Some(row) = rows.get(&key) else {
            return Some(row_warm);
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let check = self
            .serving
            .checks
            .lock()
            .ok()
            .and_then(|c| c.get(&uid).cloned());
        let name = format!("{}/{}", key.namespace, pod.name_any());
        let seen = serving::Seen {
            endpoint,
            check: check.as_ref(),
            mounted: mounted.get(&name).copied(),
        };
        let decision = serving::decide(pod, row, row_warm, seen, Instant::now());
        if let Some((endpoint, check_key)) = decision.start {
            let failures = serving::failures(check.as_ref(), &check_key);
            if let Err(message) = self.start_check(&key, row, endpoint, check_key, failures) {
                return Some(gate::GateCondition {
                    status: false,
                    reason: gate_reasons::WARMING_SERVER.into(),
                    message,
                });
            }
        }
        Some(decision.warm)
    }

    /// Starts a check of a serving pod as a task; refuses (saying why) when this node has not
    /// fetched the target's fixture yet.
    fn start_check(
        &self,
        key: &TargetKey,
        row: &NodeTargetStatus,
        endpoint: Endpoint,
        check_key: CheckKey,
        failures: u32,
    ) -> Result<(), String> {
        let digest = row.artifact_digest.as_deref().unwrap_or_default();
        let (path, sha256) = self
            .cache
            .fixture_of(&key.to_string(), row.revision, digest)
            .ok_or_else(|| {
                format!(
                    "revision {} is served on this node, but the node cache records no fixture its pass warmed with; the check starts after this node's next warmup",
                    row.revision
                )
            })?;
        let fixture = FixtureRef { path, sha256 };
        let warmup = self
            .targets
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
            .map(|t| t.spec.warmup.clone())
            .ok_or_else(|| format!("CompiledTarget {key} is gone"))?;
        let uid = check_key.uid.clone();
        if let Ok(mut checks) = self.serving.checks.lock() {
            let warm = serving::still_warm(checks.get(&uid), &check_key);
            checks.insert(uid.clone(), Check::Running(check_key.clone(), warm));
        }
        let labels = TargetLabels {
            namespace: key.namespace.clone(),
            target: key.name.clone(),
            class: row.class.clone(),
        };
        let (checks, wake, client, metrics, kube) = (
            self.serving.checks.clone(),
            self.serving.wake.clone(),
            self.serving.client.clone(),
            self.metrics.clone(),
            self.client.clone(),
        );
        tracing::info!(target = %key, pod_uid = %uid, server = %endpoint.base, "checking a serving pod through its endpoint");
        tokio::spawn(async move {
            let result = match (
                read_fixture(fixture).await,
                authorized(&kube, &endpoint, client).await,
            ) {
                (Ok(f), Ok(client)) => pod_check::check(&client, &endpoint, &f, &warmup).await,
                (Err(m), _) => Err(Cold::Mismatch(m)),
                (_, Err(cold)) => Err(cold),
            };
            let (name, ratio) = match &result {
                Ok(f) => (
                    "warm",
                    (f.p50_seconds > 0.0).then(|| f.after_seconds / f.p50_seconds),
                ),
                Err(cold) => (cold.reason(), None),
            };
            metrics.serving_check(&labels, name, ratio);
            match &result {
                Ok(f) => {
                    tracing::info!(server = %endpoint.base, figures = %f.describe(), "serving pod warm")
                }
                Err(cold) => {
                    tracing::warn!(server = %endpoint.base, reason = cold.reason(), message = cold.message(), "serving pod cold")
                }
            }
            let verdict = serving::finished(
                check_key,
                result,
                failures,
                Instant::now(),
                (RETRY_BASE, RETRY_MAX),
            );
            let retry = match &verdict {
                Check::Cold { retry_at, .. } => {
                    Some(retry_at.saturating_duration_since(Instant::now()))
                }
                _ => None,
            };
            if let Ok(mut checks) = checks.lock() {
                checks.insert(uid, verdict);
            }
            wake.notify_one();
            if let Some(wait) = retry {
                tokio::time::sleep(wait).await;
                wake.notify_one();
            }
        });
        Ok(())
    }
}

/// The fixture blob, re-hashed against the digest its fetch verified.
/// The check's client: `client` itself, or for a pod that names an API key
/// (`kiln.dev/api-key-secret`) one that sends it, read from the Secret now (so a rotated key is
/// used by the next check). The key is never logged; a Secret the agent may not or cannot read
/// is `ServingUnauthorized` saying which and why.
async fn authorized(
    kube: &kube::Client,
    endpoint: &pod_check::Endpoint,
    client: reqwest::Client,
) -> Result<reqwest::Client, Cold> {
    let Some(r) = &endpoint.api_key else {
        return Ok(client);
    };
    let api: Api<Secret> = Api::namespaced(kube.clone(), &r.namespace);
    let secret = api.get(&r.name).await.map_err(|e| {
        let why = match &e {
            kube::Error::Api(s) if s.code == 403 => {
                "the agent may not read it: list it in the chart's agent.servingSecrets".to_string()
            }
            kube::Error::Api(s) if s.code == 404 => "it does not exist".to_string(),
            other => other.to_string(),
        };
        Cold::Unauthorized(format!("{r}: {why}"))
    })?;
    let key = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .filter(|k| !k.trim().is_empty())
        .ok_or_else(|| Cold::Unauthorized(format!("{r}: no such key, or not a UTF-8 token")))?;
    pod_check::client_with_key(serving::REQUEST_TIMEOUT, &key)
        .map_err(|m| Cold::Unauthorized(format!("{r}: {m}")))
}

async fn read_fixture(fixture: FixtureRef) -> Result<FixtureFile, String> {
    tokio::task::spawn_blocking(move || {
        let (got, _) = kiln_store::staged::sha256_file(&fixture.path)
            .map_err(|e| format!("fixture {}: {e}", fixture.path.display()))?;
        if got != fixture.sha256 {
            return Err(format!(
                "fixture {} changed in the node cache (sha256 {got}, fetched as {})",
                fixture.path.display(),
                fixture.sha256
            ));
        }
        FixtureFile::read(&fixture.path).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("reading the fixture: {e}"))?
}
