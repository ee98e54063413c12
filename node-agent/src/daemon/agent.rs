//! One pass of the agent: for every CompiledTarget that selects this node, decide what to do
//! ([`decide::next_action`], [`pick::after_failure`]) and carry it out — pull, check, load and
//! warm, or serve a fallback — then publish the rows ([`decide::rows`]) as the KilnNode status and
//! the pods' `kiln.dev/warm` conditions ([`gate`]) when they changed. The deciding is pure and
//! lives in those modules; this one does the I/O: the apiserver, the node cache, engines,
//! metrics.
//!
//! [`decide::next_action`]: super::decide::next_action
//! [`pick::after_failure`]: super::decide::pick::after_failure
//! [`decide::rows`]: super::decide::rows
//! [`gate`]: super::gate

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::class::{ClassFacts, class_facts, class_id, node_class_labels, selector_matches};
use kiln_crds::kiln_node::{HardwareFacts, NodePhase, NodeTargetStatus};
use kiln_crds::{CompiledTarget, CompiledTargetStatus, KilnNode, KilnNodeStatus, ModelArtifact};
use kiln_store::Store;
use kube::runtime::reflector::Store as Reader;
use kube::{Api, Client, ResourceExt};

use super::deadline::within;
use super::decide::pick::{Next, Pick, after_failure, alternates, wanted};
use super::decide::rows::{self, Fallback, Prepared, serves};
use super::decide::{Action, Attempt, State, TargetKey, next_action};
use super::{target, writes};
use kiln_engines::backend;
use kiln_engines::host::probe;
use kiln_engines::metrics::{Metrics, TargetLabels};
use kiln_engines::pipeline::fetch::Fetcher;
use kiln_engines::pipeline::isolate::task::{FixtureRef, LoadWarm};
use kiln_engines::pipeline::ready;
use kiln_engines::pipeline::spec::Spec;
use kiln_node_core::cache::{Cache, KnownGood};
use kiln_node_core::error::{Error, Result};

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
    /// Whose attestations an artifact needs before it is pulled.
    pub trust: kiln_store::attest::Trust,
    /// The node cache.
    pub cache: Cache,
    /// Fixture fetcher into the node cache.
    pub fetcher: Fetcher,
    /// Base for relative `file://` URIs of fixtures.
    pub source_base: PathBuf,
    /// Wait before retrying a failed artifact.
    pub retry: Duration,
    /// How long pulling, and loading plus warming, one target may take.
    pub deadlines: super::deadline::Deadlines,
    /// Metrics.
    pub metrics: Metrics,
    /// Probed hardware.
    pub hardware: HardwareFacts,
    /// When the hardware was probed.
    pub probed_at: Instant,
    /// Per-target state.
    pub states: BTreeMap<TargetKey, State>,
    /// The status last applied.
    pub published: Option<KilnNodeStatus>,
    /// The verified build manifest of the artifact each target last pulled: where
    /// `fallback.policy: NextCandidate` finds the other engine candidates when it fails.
    pub pulled: BTreeMap<TargetKey, kiln_crds::BuildManifest>,
    /// Serving pods: the fixture each target's served pass used, the checks through their
    /// endpoints, and how a finished check wakes the pass loop (`pods.rs`).
    pub serving: super::serving::Serving,
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl Agent {
    /// One pass over every target that selects this node; publishes what changed.
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
        let mut history = BTreeSet::new();
        for t in self.targets.state() {
            if t.spec
                .node_selector
                .as_ref()
                .is_some_and(|s| !selector_matches(s, &node_labels))
            {
                continue;
            }
            let key = TargetKey::of(&t);
            live.insert(key.clone());
            keep.insert(key.to_string(), t.spec.rollout.known_good_history as usize);
            history.extend(known_good_digests(t.status.as_ref()));
            let facts = class_facts(
                t.spec.class_label_keys.iter().map(String::as_str),
                &class_labels,
            );
            self.step(&key, &t, &facts).await;
        }
        self.forget_gone(&live);
        self.evict(&keep, history);
        self.publish().await;
    }

    /// Decides what to do for one target ([`next_action`]) and does it.
    async fn step(&mut self, key: &TargetKey, t: &CompiledTarget, facts: &ClassFacts) {
        let class = class_id(facts);
        if let Some(state) = self.states.get_mut(key)
            && let Some(row) = rows::class_moved(&state.row, key, &class)
        {
            tracing::warn!(target = %key, from = %state.row.class, to = %class, "node class changed; readiness withdrawn");
            state.row = row;
            state.attempt = None;
        }
        let generation = t.metadata.generation;
        let wanted = wanted(t.status.as_ref(), t.spec.rollout.pinned_revision, &class);
        let state = self.states.entry(key.clone()).or_default();
        let action = next_action(
            state.attempt.as_ref(),
            wanted,
            generation,
            self.retry,
            Instant::now(),
        );
        match action {
            Action::Wait { message } => {
                if !serves(&state.row) {
                    state.row = rows::pending(key, &class, message);
                }
            }
            Action::Skip | Action::BackOff { .. } => {}
            Action::Prepare { pick, failures } => {
                state.see(&pick, now(), Instant::now());
                let ok = self.attempt(key, t, pick.clone(), facts).await;
                if let Some(state) = self.states.get_mut(key) {
                    state.attempt = Some(Attempt {
                        generation,
                        pick,
                        at: Instant::now(),
                        failures: if ok { 0 } else { failures + 1 },
                    });
                }
            }
        }
    }

    /// Drops the state (and the metric series) of targets that no longer select this node.
    fn forget_gone(&mut self, live: &BTreeSet<TargetKey>) {
        let gone: Vec<TargetKey> = self
            .states
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.pulled.remove(&key);
            if let Some(labels) = self.states.remove(&key).and_then(|s| s.labels) {
                self.metrics.forget_target(&labels);
            }
        }
    }

    /// Evicts from the node cache what no target keeps (`keep`: known-good history per target),
    /// nothing that serves and nothing in `history` (known-good revisions targets still list).
    fn evict(&mut self, keep: &BTreeMap<String, usize>, mut history: BTreeSet<String>) {
        history.extend(
            self.states
                .values()
                .filter(|s| serves(&s.row))
                .filter_map(|s| s.row.artifact_digest.clone()),
        );
        match self.cache.evict(keep, &history) {
            Ok(deleted) if !deleted.is_empty() => {
                tracing::info!(?deleted, "evicted artifacts from the node cache")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "node cache eviction failed"),
        }
    }

    /// Prepares `pick`; on failure applies the fallback policy. Returns whether the target is
    /// served afterwards.
    async fn attempt(
        &mut self,
        key: &TargetKey,
        t: &CompiledTarget,
        pick: Pick,
        facts: &ClassFacts,
    ) -> bool {
        tracing::info!(target = %key, revision = pick.revision, class = %pick.class, digest = %pick.digest, "preparing");
        let err = match self.prepare(key, t, &pick, facts, false).await {
            Ok(p) => {
                self.served(key, p, t.metadata.generation, None);
                return true;
            }
            Err(e) => e,
        };
        let reason = err.reason();
        self.metrics.failure(reason);
        tracing::warn!(target = %key, revision = pick.revision, %reason, error = %err, "artifact failed on this node");
        let others = self
            .pulled
            .get(key)
            .map(|m| alternates(m, &pick))
            .unwrap_or_default();
        let next = after_failure(
            &t.spec.fallback,
            &pick,
            t.metadata.generation,
            &self.cache.known_good(&key.to_string()),
            t.status.as_ref(),
            t.spec.rollout.pinned_revision,
            &others,
        );
        let policy = t.spec.fallback.policy;
        let fell_back = match next {
            Next::FailClosed => None,
            Next::Previous(entry) => match self.reverify(&entry) {
                Ok(()) => Some(Prepared::reverified(&entry)),
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
            Next::Candidates(others) => self.next_candidate(key, t, &others, facts).await,
        };
        match fell_back {
            Some(p) => {
                self.metrics.fallback(reason, policy.as_str());
                let why = Fallback {
                    wanted: pick,
                    policy,
                    reason,
                    message: err.to_string(),
                };
                self.served(key, p, t.metadata.generation, Some(why));
                true
            }
            None => {
                self.metrics.fail_closed(reason);
                let row = self.row(key);
                *row = rows::failed(row, key, &pick, reason, err.to_string(), policy);
                self.set_ready_metric(key, false);
                false
            }
        }
    }

    /// The first of the other engine candidates that passes here, tried in order.
    async fn next_candidate(
        &mut self,
        key: &TargetKey,
        t: &CompiledTarget,
        others: &[Pick],
        facts: &ClassFacts,
    ) -> Option<Prepared> {
        for other in others {
            match self.prepare(key, t, other, facts, true).await {
                Ok(p) => return Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, compile_key = %other.compile_key, "next engine candidate failed too")
                }
            }
        }
        None
    }

    /// Re-hashes a previous known-good artifact before it is served again.
    fn reverify(&self, entry: &KnownGood) -> Result<()> {
        match tokio::task::block_in_place(|| self.cache.verified(&entry.digest)) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Error::HashMismatch {
                what: format!("cached revision {}", entry.revision),
                message: "no longer in the node cache".into(),
                source: None,
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
        key: &TargetKey,
        t: &CompiledTarget,
        pick: &Pick,
        facts: &ClassFacts,
        fallback: bool,
    ) -> Result<Prepared> {
        self.phase(key, pick, NodePhase::Pulling).await;
        let name = format!("target {}/{}", key.namespace, key.name);
        let serving: BTreeSet<String> = self
            .states
            .values()
            .filter(|s| serves(&s.row))
            .filter_map(|s| s.row.artifact_digest.clone())
            .collect();
        let pulled = within(
            self.deadlines.pull,
            &format!("pulling the artifact of {name}"),
            "--pull-deadline-seconds",
            target::pull(
                self.store.as_ref(),
                &self.trust,
                &mut self.cache,
                pick,
                &serving,
                &self.metrics,
            ),
        )
        .await?;
        if !fallback {
            self.pulled.insert(key.clone(), pulled.manifest.clone());
        }
        let backend = backend::for_artifact(&t.spec.backend, &pulled.manifest)?;
        let engine = pulled.manifest.engine();
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
        let fixture = within(
            self.deadlines.pull,
            &format!("fetching the fixture of {name}"),
            "--pull-deadline-seconds",
            kiln_engines::pipeline::build::fetch_fixture(&spec, &self.fetcher),
        )
        .await?;
        let job = LoadWarm {
            backend: t.spec.backend.clone(),
            manifest: pulled.manifest.clone(),
            artifact: pulled.path.clone(),
            fixture: FixtureRef {
                path: fixture.path,
                sha256: fixture.sha256.clone(),
            },
            warmup: t.spec.warmup.clone(),
        };
        let fixture_sha256 = fixture.sha256;
        let ready = self.load_warm(key, t, pick, job, &name).await?;
        let (load_seconds, warmup) = (ready.load_seconds, ready.warmup);
        Ok(Prepared {
            pick: pick.clone(),
            pull_bytes: pulled.bytes,
            pull_seconds: pulled.seconds,
            load_seconds,
            warmup,
            engine: Some(engine),
            fixture_digest: Some(fixture_sha256),
        })
    }

    /// Loads and warms in the engine's own process (kiln_engines::pipeline::isolate), which proves the engine
    /// and exits: nothing stays loaded here; serving pods load their own copy. Publishes
    /// Loading, then Warming once the child says the engine is loaded.
    async fn load_warm(
        &mut self,
        key: &TargetKey,
        t: &CompiledTarget,
        pick: &Pick,
        job: LoadWarm,
        name: &str,
    ) -> Result<ready::Ready> {
        self.phase(key, pick, NodePhase::Loading).await;
        ready::fits_node(&t.spec.warmup, kiln_engines::host::memory::available())?;
        // --warmup-deadline-seconds bounds loading and warming each, so both together get twice.
        let deadline = self.deadlines.warm.saturating_mul(2);
        let what = format!("loading and warming {name} (--warmup-deadline-seconds)");
        let (loaded, warming) = tokio::sync::oneshot::channel();
        let mut child = tokio::task::spawn_blocking(move || {
            ready::load_warm_isolated(job, &what, deadline, move || {
                let _ = loaded.send(());
            })
        });
        let warmed = tokio::select! {
            done = &mut child => done,
            Ok(()) = warming => {
                self.phase(key, pick, NodePhase::Warming).await;
                child.await
            }
        }
        .map_err(|e| Error::LoadFailed(format!("{name}: the engine's thread failed: {e}")))??;
        let labels = TargetLabels {
            namespace: key.namespace.clone(),
            target: key.name.clone(),
            class: pick.class.clone(),
        };
        ready::judge_warmed(
            warmed,
            &t.spec,
            &labels,
            ready::gpu_memory(&self.hardware),
            &self.metrics,
        )
    }

    /// The target's ModelArtifact with the target, checked and with relative URIs resolved.
    async fn spec(&self, t: &CompiledTarget) -> Result<Spec> {
        let ns = t.namespace().unwrap_or_default();
        let name = &t.spec.model_ref.name;
        let api: Api<ModelArtifact> = Api::namespaced(self.client.clone(), &ns);
        let model = api
            .get_opt(name)
            .await
            .map_err(|e| Error::source_unavailable(format!("ModelArtifact {ns}/{name}"), e))?
            .ok_or_else(|| {
                Error::InvalidSpec(format!("ModelArtifact {ns}/{name} does not exist"))
            })?;
        Spec::from_objects(model, t.clone(), &self.source_base)
    }

    fn row(&mut self, key: &TargetKey) -> &mut NodeTargetStatus {
        &mut self.states.entry(key.clone()).or_default().row
    }

    /// Shows progress ([`rows::preparing`]) and publishes it.
    async fn phase(&mut self, key: &TargetKey, pick: &Pick, phase: NodePhase) {
        let state = self.states.entry(key.clone()).or_default();
        state.row = rows::preparing(&state.row, key, pick, phase, state.seen_time());
        self.publish().await;
    }

    /// Records a served artifact ([`rows::served`]): Ready, or Degraded as `fallback` for a
    /// failed one. A newly ready artifact of its own (no fallback) is recorded as known good in
    /// the node cache and counts towards the time-to-ready metric.
    fn served(
        &mut self,
        key: &TargetKey,
        p: Prepared,
        generation: Option<i64>,
        fallback: Option<Fallback>,
    ) {
        let state = self.states.entry(key.clone()).or_default();
        let first_seen = state.seen.as_ref().map(|s| s.at);
        let same = rows::serves_same(&state.row, &p.pick);
        state.row = rows::served(
            &state.row,
            key,
            &p,
            state.seen_time(),
            fallback.as_ref(),
            now(),
        );
        match fallback {
            None => {
                if let Some(at) = first_seen
                    && !same
                {
                    self.metrics.revision_ready(at.elapsed().as_secs_f64());
                }
                let entry = KnownGood {
                    revision: p.pick.revision,
                    class: p.pick.class.clone(),
                    compile_key: p.pick.compile_key.clone(),
                    digest: p.pick.digest.clone(),
                    passed_at: k8s_openapi::jiff::Timestamp::now().as_second(),
                    generation,
                    fixture_digest: p.fixture_digest.clone(),
                };
                if let Err(e) = self.cache.record_pass(&key.to_string(), entry) {
                    tracing::warn!(error = %e, "cannot record the pass in the node cache index");
                }
                tracing::info!(target = %key, revision = p.pick.revision, load_seconds = p.load_seconds, warmup_seconds = p.warmup.total_seconds, parity_max_abs_error = p.warmup.parity_max_abs_error, "ready");
            }
            Some(f) => {
                tracing::warn!(target = %key, served = p.pick.revision, wanted = f.wanted.revision, reason = %f.reason, "serving a fallback");
            }
        }
        self.set_ready_metric(key, true);
    }

    fn set_ready_metric(&mut self, key: &TargetKey, ready: bool) {
        let metrics = self.metrics.clone();
        let state = self.states.entry(key.clone()).or_default();
        let labels = TargetLabels {
            namespace: key.namespace.clone(),
            target: key.name.clone(),
            class: state.row.class.clone(),
        };
        if let Some(old) = &state.labels
            && *old != labels
        {
            metrics.forget_target(old);
        }
        metrics.target_ready(&labels, ready.then_some(state.row.revision));
        let engine = state.row.engine.as_deref().filter(|_| ready);
        metrics.served_engine(&labels, engine);
        state.labels = Some(labels);
    }

    /// Applies the KilnNode status when it changed, then the pods' gates.
    pub async fn publish(&mut self) {
        let rows: BTreeMap<TargetKey, NodeTargetStatus> = self
            .states
            .iter()
            .map(|(k, s)| (k.clone(), s.row.clone()))
            .collect();
        let status = rows::node_status(self.published.as_ref(), &self.hardware, &rows, now());
        if self.published.as_ref() != Some(&status) {
            let api: Api<KilnNode> = Api::all(self.client.clone());
            let result = match writes::apply_status(&api, &self.node, &status).await {
                // Deleted from under us: create it again and re-apply.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    let owner = self
                        .nodes
                        .state()
                        .first()
                        .and_then(|n| writes::owner_ref(n));
                    match writes::ensure_kiln_node(&api, &self.node, owner).await {
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
}

/// The artifact digests (bare hex, as the cache names them) of every revision `status` lists as
/// known-good, for every class.
fn known_good_digests(status: Option<&CompiledTargetStatus>) -> impl Iterator<Item = String> + '_ {
    status
        .into_iter()
        .flat_map(|s| s.revisions.iter())
        .filter(|r| r.known_good)
        .flat_map(|r| r.artifacts.iter())
        .map(|a| {
            a.digest
                .strip_prefix("sha256:")
                .unwrap_or(&a.digest)
                .to_string()
        })
}
