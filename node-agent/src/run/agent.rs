//! One pass of the agent: for every CompiledTarget that selects this node, pick the artifact
//! for the node's class, prepare it (pull, check, load, warm) or apply the fallback policy, then
//! publish the KilnNode status and the pods' `kiln.dev/warm` conditions when they changed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::class::{class_facts, class_id, node_class_labels, selector_matches};
use kiln_crds::compiled_target::FallbackPolicy;
use kiln_crds::conditions::{self, READY};
use kiln_crds::kiln_node::{HardwareFacts, NodePhase, NodeTargetStatus};
use kiln_crds::{CompiledTarget, FailureReason, KilnNode, KilnNodeStatus, ModelArtifact};
use kiln_store::Store;
use kube::runtime::reflector::Store as Reader;
use kube::{Api, Client, ResourceExt};

use super::cache::{Cache, KnownGood};
use super::decide::{Next, Pick, after_failure, wanted};
use super::{gate, target, writes};
use crate::backend;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, TargetLabels};
use crate::pipeline::fetch::Fetcher;
use crate::pipeline::load;
use crate::pipeline::probe;
use crate::pipeline::spec::Spec;

/// (namespace, name) of a CompiledTarget.
type Key = (String, String);

/// What the agent needs for a pass.
pub struct Agent {
    /// This node's name (and its KilnNode's).
    pub node: String,
    /// The apiserver.
    pub client: Client,
    /// Watched: this node.
    pub nodes: Reader<Node>,
    /// Watched: every CompiledTarget.
    pub targets: Reader<CompiledTarget>,
    /// Watched: pods on this node.
    pub pods: Reader<Pod>,
    /// The artifact store (read only).
    pub store: Arc<dyn Store>,
    /// The node cache.
    pub cache: Cache,
    /// Fixture fetcher into the node cache.
    pub fetcher: Fetcher,
    /// Base for relative `file://` URIs of fixtures.
    pub source_base: PathBuf,
    /// Wait before retrying a failed artifact.
    pub retry: Duration,
    /// Metrics.
    pub metrics: Metrics,
    /// Probed hardware.
    pub hardware: HardwareFacts,
    /// When the hardware was probed.
    pub probed_at: Instant,
    /// Per-target state.
    pub states: BTreeMap<Key, State>,
    /// The status last applied.
    pub published: Option<KilnNodeStatus>,
}

/// One target on this node.
#[derive(Default)]
pub struct State {
    /// The row reported in the KilnNode.
    pub row: NodeTargetStatus,
    /// Last attempt: (generation, pick), when, and how many failed in a row (0: it serves).
    attempt: Option<(Option<i64>, Pick, Instant, u32)>,
    /// When the current pick was first seen.
    seen: Option<(Pick, Time, Instant)>,
    /// Metric labels of the row, to remove them when they change.
    labels: Option<TargetLabels>,
}

/// What a successful preparation measured.
struct Prepared {
    pick: Pick,
    pull_bytes: u64,
    pull_seconds: f64,
    load_seconds: f64,
    warmup: crate::pipeline::warmup::WarmupReport,
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn served(row: &NodeTargetStatus) -> bool {
    matches!(row.phase, NodePhase::Ready | NodePhase::Degraded)
}

impl Agent {
    /// One pass over every target; publishes what changed.
    pub async fn pass(&mut self) {
        if self.probed_at.elapsed() > Duration::from_secs(300) {
            self.hardware = tokio::task::block_in_place(|| probe::probe(backend::runtimes()));
            self.probed_at = Instant::now();
        }
        let Some(node) = self.nodes.state().into_iter().next() else {
            tracing::warn!(node = %self.node, "own Node not in the watch cache yet");
            return;
        };
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        let class_labels = node_class_labels(&node_labels, Some(&self.hardware));
        let mut live = BTreeSet::new();
        let mut keep = BTreeMap::new();
        for t in self.targets.state() {
            if t.spec
                .node_selector
                .as_ref()
                .is_some_and(|s| !selector_matches(s, &node_labels))
            {
                continue;
            }
            let key = (t.namespace().unwrap_or_default(), t.name_any());
            live.insert(key.clone());
            keep.insert(
                format!("{}/{}", key.0, key.1),
                t.spec.rollout.known_good_history as usize,
            );
            let facts = class_facts(
                t.spec.class_label_keys.iter().map(String::as_str),
                &class_labels,
            );
            let class = class_id(&facts);
            let state = self.states.entry(key.clone()).or_default();
            let pick = match wanted(t.status.as_ref(), t.spec.rollout.pinned_revision, &class) {
                Ok(p) => p,
                Err(message) => {
                    // A node that serves something keeps serving it while the operator catches up.
                    if !served(&state.row) {
                        state.row = NodeTargetStatus {
                            namespace: key.0.clone(),
                            name: key.1.clone(),
                            class: class.clone(),
                            phase: NodePhase::Pending,
                            message: Some(message),
                            ..NodeTargetStatus::default()
                        };
                    }
                    continue;
                }
            };
            let generation = t.metadata.generation;
            let failures = match &state.attempt {
                Some((g, p, at, failures)) if *g == generation && *p == pick => {
                    if *failures == 0 || at.elapsed() < backoff(self.retry, *failures) {
                        continue;
                    }
                    *failures
                }
                _ => 0,
            };
            if state.seen.as_ref().is_none_or(|(p, _, _)| *p != pick) {
                state.seen = Some((pick.clone(), now(), Instant::now()));
            }
            let ok = self.attempt(&key, &t, pick.clone(), &facts).await;
            if let Some(state) = self.states.get_mut(&key) {
                let failures = if ok { 0 } else { failures + 1 };
                state.attempt = Some((generation, pick, Instant::now(), failures));
            }
        }
        let gone: Vec<Key> = self
            .states
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(labels) = self.states.remove(&key).and_then(|s| s.labels) {
                self.metrics.forget_target(&labels);
            }
        }
        let in_use: BTreeSet<String> = self
            .states
            .values()
            .filter(|s| served(&s.row))
            .filter_map(|s| s.row.artifact_digest.clone())
            .collect();
        match self.cache.evict(&keep, &in_use) {
            Ok(deleted) if !deleted.is_empty() => {
                tracing::info!(?deleted, "evicted artifacts from the node cache")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "node cache eviction failed"),
        }
        self.publish().await;
    }

    /// Prepares `pick`; on failure applies the fallback policy. Returns whether the target is
    /// served afterwards.
    async fn attempt(
        &mut self,
        key: &Key,
        t: &CompiledTarget,
        pick: Pick,
        facts: &kiln_crds::class::ClassFacts,
    ) -> bool {
        tracing::info!(target = %format!("{}/{}", key.0, key.1), revision = pick.revision, class = %pick.class, digest = %pick.digest, "preparing");
        let err = match self.prepare(key, t, &pick, facts, false).await {
            Ok(p) => {
                self.served(key, p, t.metadata.generation, None);
                return true;
            }
            Err(e) => e,
        };
        let reason = err.reason();
        self.metrics.failure(reason);
        tracing::warn!(target = %format!("{}/{}", key.0, key.1), revision = pick.revision, %reason, error = %err, "artifact failed on this node");
        let target_key = format!("{}/{}", key.0, key.1);
        let next = after_failure(
            &t.spec.fallback,
            &pick,
            t.metadata.generation,
            &self.cache.known_good(&target_key),
            t.status.as_ref(),
            t.spec.rollout.pinned_revision,
        );
        let policy = t.spec.fallback.policy;
        let fell_back = match next {
            Next::FailClosed => None,
            Next::Previous(entry) => match self.reverify(&entry) {
                Ok(()) => Some(Prepared {
                    pick: Pick {
                        revision: entry.revision,
                        class: entry.class.clone(),
                        compile_key: entry.compile_key.clone(),
                        digest: entry.digest.clone(),
                        manifest_digest: String::new(),
                    },
                    pull_bytes: 0,
                    pull_seconds: 0.0,
                    load_seconds: 0.0,
                    warmup: Default::default(),
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "previous known-good artifact failed re-verification");
                    None
                }
            },
            Next::Class(other) => match self.prepare(key, t, &other, facts, true).await {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, class = %other.class, "fallback class artifact failed too");
                    None
                }
            },
        };
        match fell_back {
            Some(p) => {
                self.metrics.fallback(reason, policy_name(policy));
                self.served(
                    key,
                    p,
                    t.metadata.generation,
                    Some((pick, policy, reason, err.to_string())),
                );
                true
            }
            None => {
                self.metrics.fail_closed(reason);
                let row = self.row(key);
                let keep_time = row.revision_seen_at.clone();
                *row = NodeTargetStatus {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    revision: pick.revision,
                    class: pick.class.clone(),
                    phase: NodePhase::Failed,
                    artifact_digest: Some(pick.digest.clone()),
                    reason: Some(reason),
                    message: Some(err.to_string()),
                    fallback: Some(policy),
                    revision_seen_at: keep_time,
                    ..NodeTargetStatus::default()
                };
                self.set_ready_metric(key, false);
                false
            }
        }
    }

    /// Re-hashes a previous known-good artifact before it is served again.
    fn reverify(&self, entry: &KnownGood) -> Result<()> {
        match tokio::task::block_in_place(|| self.cache.verified(&entry.digest)) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Error::HashMismatch {
                what: format!("cached revision {}", entry.revision),
                message: "no longer in the node cache".into(),
            }),
            Err(e) => {
                self.metrics.verify_failure(e.reason());
                Err(e)
            }
        }
    }

    /// Pull, check, load and warm one artifact, publishing each phase.
    async fn prepare(
        &mut self,
        key: &Key,
        t: &CompiledTarget,
        pick: &Pick,
        facts: &kiln_crds::class::ClassFacts,
        fallback: bool,
    ) -> Result<Prepared> {
        self.phase(key, pick, NodePhase::Pulling).await;
        let backend = backend::for_target(&t.spec.backend)?;
        let pulled = target::pull(self.store.as_ref(), &self.cache, pick, &self.metrics).await?;
        let probed = class_facts(
            t.spec.class_label_keys.iter().map(String::as_str),
            &probe::labels(&self.hardware),
        );
        target::check(
            &pulled.manifest,
            backend.as_ref(),
            facts,
            &probed,
            fallback,
            &self.metrics,
        )?;
        let spec = self.spec(t).await?;
        let (fixture, _) = crate::pipeline::build::fetch_fixture(&spec, &self.fetcher).await?;
        self.phase(key, pick, NodePhase::Loading).await;
        let (engine, load_seconds) = tokio::task::block_in_place(|| {
            load::load(backend.as_ref(), &pulled.path, &pick.class, &self.metrics)
        })?;
        self.phase(key, pick, NodePhase::Warming).await;
        let warmup = tokio::task::block_in_place(|| {
            load::warm_engine(
                engine.as_ref(),
                &fixture,
                &t.spec.warmup,
                &pick.class,
                &self.metrics,
            )
        })?;
        // The agent proves the engine; serving pods load their own copy from the cache.
        drop(engine);
        Ok(Prepared {
            pick: pick.clone(),
            pull_bytes: pulled.bytes,
            pull_seconds: pulled.seconds,
            load_seconds,
            warmup,
        })
    }

    /// The target's ModelArtifact with the target, checked and with relative URIs resolved.
    async fn spec(&self, t: &CompiledTarget) -> Result<Spec> {
        let ns = t.namespace().unwrap_or_default();
        let name = &t.spec.model_ref.name;
        let api: Api<ModelArtifact> = Api::namespaced(self.client.clone(), &ns);
        let model = api
            .get_opt(name)
            .await
            .map_err(|e| Error::SourceUnavailable {
                uri: format!("ModelArtifact {ns}/{name}"),
                message: e.to_string(),
            })?
            .ok_or_else(|| {
                Error::InvalidSpec(format!("ModelArtifact {ns}/{name} does not exist"))
            })?;
        Spec::from_objects(model, t.clone(), &self.source_base)
    }

    fn row(&mut self, key: &Key) -> &mut NodeTargetStatus {
        &mut self.states.entry(key.clone()).or_default().row
    }

    /// Shows progress: a row that serves nothing takes the phase; a row that serves an earlier
    /// artifact keeps serving it and says what is being prepared.
    async fn phase(&mut self, key: &Key, pick: &Pick, phase: NodePhase) {
        let seen = self
            .states
            .get(key)
            .and_then(|s| s.seen.as_ref())
            .map(|(_, t, _)| t.clone());
        let row = self.row(key);
        if served(row) {
            row.desired_revision = Some(pick.revision);
            row.message = Some(format!(
                "preparing revision {} (class {}): {phase:?}",
                pick.revision, pick.class
            ));
        } else {
            *row = NodeTargetStatus {
                namespace: key.0.clone(),
                name: key.1.clone(),
                revision: pick.revision,
                class: pick.class.clone(),
                phase,
                artifact_digest: Some(pick.digest.clone()),
                revision_seen_at: seen,
                ..NodeTargetStatus::default()
            };
        }
        self.publish().await;
    }

    /// Records a served artifact: Ready, or Degraded on a fallback for `failed`.
    fn served(
        &mut self,
        key: &Key,
        p: Prepared,
        generation: Option<i64>,
        failed: Option<(Pick, FallbackPolicy, FailureReason, String)>,
    ) {
        let (seen_time, seen_instant) = self
            .states
            .get(key)
            .and_then(|s| s.seen.as_ref())
            .map(|(_, t, i)| (Some(t.clone()), Some(*i)))
            .unwrap_or((None, None));
        let old = self.row(key).clone();
        let same = served(&old)
            && old.revision == p.pick.revision
            && old.artifact_digest.as_deref() == Some(p.pick.digest.as_str());
        let ready_since = if same {
            old.ready_since.clone()
        } else {
            Some(now())
        };
        let seen_time = if same {
            old.revision_seen_at.clone()
        } else {
            seen_time
        };
        let mut row = NodeTargetStatus {
            namespace: key.0.clone(),
            name: key.1.clone(),
            revision: p.pick.revision,
            class: p.pick.class.clone(),
            phase: NodePhase::Ready,
            artifact_digest: Some(p.pick.digest.clone()),
            pull_seconds: Some(p.pull_seconds),
            pull_bytes: Some(i64::try_from(p.pull_bytes).unwrap_or(i64::MAX)),
            load_seconds: Some(p.load_seconds),
            warmup_seconds: Some(p.warmup.total_seconds),
            parity_max_abs_error: Some(p.warmup.parity_max_abs_error),
            revision_seen_at: seen_time,
            ready_since,
            ..NodeTargetStatus::default()
        };
        match failed {
            None => {
                if let Some(i) = seen_instant
                    && !same
                {
                    self.metrics.revision_ready(i.elapsed().as_secs_f64());
                }
                let entry = KnownGood {
                    revision: p.pick.revision,
                    class: p.pick.class.clone(),
                    compile_key: p.pick.compile_key.clone(),
                    digest: p.pick.digest.clone(),
                    passed_at: k8s_openapi::jiff::Timestamp::now().as_second(),
                    generation,
                };
                if let Err(e) = self
                    .cache
                    .record_pass(&format!("{}/{}", key.0, key.1), entry)
                {
                    tracing::warn!(error = %e, "cannot record the pass in the node cache index");
                }
                tracing::info!(target = %format!("{}/{}", key.0, key.1), revision = p.pick.revision, load_seconds = p.load_seconds, warmup_seconds = p.warmup.total_seconds, parity_max_abs_error = p.warmup.parity_max_abs_error, "ready");
            }
            Some((wanted, policy, reason, message)) => {
                row.phase = NodePhase::Degraded;
                row.desired_revision = Some(wanted.revision);
                row.fallback = Some(policy);
                row.reason = Some(reason);
                row.message = Some(format!(
                    "revision {} (class {}) failed: {message}; serving revision {} (class {}) under fallback {}",
                    wanted.revision,
                    wanted.class,
                    p.pick.revision,
                    p.pick.class,
                    policy_name(policy)
                ));
                if policy == FallbackPolicy::PreviousKnownGood {
                    // Re-verified, not re-warmed: report the figures of its pass when this agent
                    // measured them, none otherwise.
                    row.load_seconds = old.load_seconds.filter(|_| same);
                    row.warmup_seconds = old.warmup_seconds.filter(|_| same);
                    row.parity_max_abs_error = old.parity_max_abs_error.filter(|_| same);
                    row.pull_seconds = old.pull_seconds.filter(|_| same);
                    row.pull_bytes = old.pull_bytes.filter(|_| same);
                }
                tracing::warn!(target = %format!("{}/{}", key.0, key.1), served = p.pick.revision, wanted = wanted.revision, %reason, "serving a fallback");
            }
        }
        *self.row(key) = row;
        self.set_ready_metric(key, true);
    }

    fn set_ready_metric(&mut self, key: &Key, ready: bool) {
        let metrics = self.metrics.clone();
        let state = self.states.entry(key.clone()).or_default();
        let labels = TargetLabels {
            namespace: key.0.clone(),
            target: key.1.clone(),
            class: state.row.class.clone(),
        };
        if let Some(old) = &state.labels
            && *old != labels
        {
            metrics.forget_target(old);
        }
        metrics.target_ready(&labels, ready);
        state.labels = Some(labels);
    }

    /// Applies the KilnNode status when it changed, then the pods' gates.
    pub async fn publish(&mut self) {
        let rows: BTreeMap<Key, NodeTargetStatus> = self
            .states
            .iter()
            .map(|(k, s)| (k.clone(), s.row.clone()))
            .collect();
        let mut conds = self
            .published
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let not_served: Vec<&NodeTargetStatus> = rows.values().filter(|r| !served(r)).collect();
        let ready = match not_served.first() {
            None => conditions::condition(
                READY,
                true,
                "Ready",
                format!("{} target(s) served on this node", rows.len()),
                None,
                now(),
            ),
            Some(r) => conditions::condition(
                READY,
                false,
                r.reason.map(|r| r.as_str()).unwrap_or("Preparing"),
                format!(
                    "{} of {} target(s) not served; first: {}/{} {:?}",
                    not_served.len(),
                    rows.len(),
                    r.namespace,
                    r.name,
                    r.phase
                ),
                None,
                now(),
            ),
        };
        conditions::upsert(&mut conds, ready);
        let status = KilnNodeStatus {
            observed_generation: None,
            conditions: conds,
            hardware: Some(self.hardware.clone()),
            targets: rows.values().cloned().collect(),
        };
        if self.published.as_ref() != Some(&status) {
            let api: Api<KilnNode> = Api::all(self.client.clone());
            let result = match writes::apply_status(&api, &self.node, &status).await {
                // Deleted from under us: create it again and re-apply.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    match writes::ensure_kiln_node(&api, &self.node).await {
                        Ok(()) => writes::apply_status(&api, &self.node, &status).await,
                        Err(e) => Err(e),
                    }
                }
                other => other,
            };
            match result {
                Ok(()) => self.published = Some(status),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot apply KilnNode status; retrying next pass")
                }
            }
        }
        self.gates(&rows).await;
    }

    async fn gates(&self, rows: &BTreeMap<Key, NodeTargetStatus>) {
        for pod in self.pods.state() {
            let Some(want) = gate::desired(&pod, rows) else {
                continue;
            };
            if !gate::differs(&pod, &want) {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let current = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| {
                    c.iter()
                        .find(|c| c.type_ == kiln_crds::labels::WARM_CONDITION)
                });
            let transition = match current {
                Some(c) if (c.status == "True") == want.status => {
                    c.last_transition_time.clone().unwrap_or_else(now)
                }
                _ => now(),
            };
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
}

/// Wait before the next try of an artifact that failed `failures` times in a row: `retry`,
/// doubling, at most ten minutes, so a corrupt multi-GiB artifact is not pulled in a loop.
fn backoff(retry: Duration, failures: u32) -> Duration {
    retry
        .saturating_mul(1 << failures.saturating_sub(1).min(10))
        .min(Duration::from_secs(600).max(retry))
}

fn policy_name(policy: FallbackPolicy) -> &'static str {
    match policy {
        FallbackPolicy::FailClosed => "FailClosed",
        FallbackPolicy::PreviousKnownGood => "PreviousKnownGood",
        FallbackPolicy::Class => "Class",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_ten_minutes() {
        let r = Duration::from_secs(60);
        assert_eq!(backoff(r, 1), r);
        assert_eq!(backoff(r, 2), r * 2);
        assert_eq!(backoff(r, 4), r * 8);
        assert_eq!(backoff(r, 30), Duration::from_secs(600));
        assert_eq!(backoff(Duration::from_secs(5), 2), Duration::from_secs(10));
    }
}
