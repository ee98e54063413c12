//! The CompiledTarget controller. `reconcile` reads like a table of contents: dereference the
//! model and gather nodes, Jobs and store entries (caches and the store; no writes) →
//! `plan::draft` (pure) → compile admission under the slot lock ([`admission`], pure) →
//! `plan::settle` (pure) → [`writes::apply`] (the only place that writes: Jobs, node labels,
//! status, Events).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::CompiledTarget;
use kiln_crds::compiled_target::ClassPhase;
use kiln_store::attest::subject;
use kube::ResourceExt;
use kube::api::{Api, ListParams, LogParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::context::Context;
use crate::error::Error;
use crate::job::observe;
use crate::plan::NodeView;
use crate::plan::{self, Admission, Inputs, ModelLookup, Stored};
use crate::recall::admission;
use crate::recall::lookups;
use crate::recall::memo;
use crate::writes;

/// Reconciles one CompiledTarget.
#[tracing::instrument(skip_all, fields(target = %target.name_any(), ns = target.namespace().unwrap_or_default()))]
pub async fn reconcile(target: Arc<CompiledTarget>, ctx: Arc<Context>) -> Result<Action, Error> {
    // No decision from a partial view: a Job not yet in the cache would be created twice. The
    // caches fill while the controller polls its streams, so this waits only at startup.
    let _ = ctx.synced.clone().wait_for(|synced| *synced).await;
    let started = Instant::now();
    let result = reconcile_inner(&target, &ctx).await;
    ctx.metrics.reconciled(started.elapsed().as_secs_f64());
    result
}

async fn reconcile_inner(target: &CompiledTarget, ctx: &Context) -> Result<Action, Error> {
    if target.metadata.deletion_timestamp.is_some() {
        // Jobs go with the target through their owner reference; stored artifacts stay.
        return Ok(Action::await_change());
    }
    let malformed = |field| Error::Malformed {
        kind: "CompiledTarget",
        field,
    };
    let ns = target.namespace().ok_or_else(|| malformed("namespace"))?;
    let uid = target.uid().ok_or_else(|| malformed("uid"))?;
    // The status this replica last wrote, where the cache still holds the object it replaced.
    let target = &*memo::as_written(target, &uid, &ctx.written);

    // Dereference and gather: caches and the store, no writes.
    let model = model_of(target, ctx, &ns);
    let nodes = node_views(target, ctx, &ns);
    let mut jobs = owned_jobs(target, ctx, &ns, &uid).await;
    jobs.extend(lagging_jobs(ctx, &ns, &uid));
    let empty = BTreeMap::new();
    let mut inputs = Inputs {
        target,
        model: &model,
        nodes: &nodes,
        jobs: &jobs,
        stored: &empty,
        // Counted under the slot lock, for admission after the draft.
        compiles_elsewhere: 0,
        settings: &ctx.settings,
        now: Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let seen = Seen {
        finished: lookups::finished_jobs(&jobs),
        broken: lookups::broken_keys(target, &nodes),
    };
    let stored = match stored(ctx, plan::wanted_keys(&inputs), &seen).await {
        Ok(stored) => stored,
        Err(e) => {
            // Said on the target, not only in the log: `kubectl get` shows why nothing moves.
            let status = plan::store_unreachable(
                &target.status.clone().unwrap_or_default(),
                &e.to_string(),
                target.metadata.generation,
                &inputs.now,
            );
            writes::status_if_changed(target, &ns, &status, ctx).await;
            return Err(e);
        }
    };
    inputs.stored = &stored;

    let plan = decide(&inputs, ctx, &ns, &uid);
    writes::apply(target, &model, plan, ctx, &ns).await
}

/// The target's ModelArtifact, from the cache.
fn model_of(target: &CompiledTarget, ctx: &Context, ns: &str) -> ModelLookup {
    match &target.spec.model_ref.namespace {
        Some(other) if *other != ns => ModelLookup::Missing,
        _ => ctx
            .models
            .get(&ObjectRef::new(&target.spec.model_ref.name).within(ns))
            .map_or(ModelLookup::Missing, |m| {
                ModelLookup::Found(Box::new((*m).clone()))
            }),
    }
}

/// Every node, with its hardware facts and its agent's rows for this target.
fn node_views(target: &CompiledTarget, ctx: &Context, ns: &str) -> Vec<NodeView> {
    let name = target.name_any();
    ctx.nodes
        .state()
        .iter()
        .map(|n| {
            let kiln_node = ctx.kiln_nodes.get(&ObjectRef::new(&n.name_any()));
            let mut view = NodeView::new(n, kiln_node.as_deref());
            view.targets = kiln_node
                .as_ref()
                .and_then(|k| k.status.as_ref())
                .map(|s| {
                    s.targets
                        .iter()
                        .filter(|r| r.namespace == ns && r.name == name)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            view
        })
        .collect()
}

/// The target's Jobs created moments ago that the cache does not show yet (the slot ledger).
fn lagging_jobs(ctx: &Context, ns: &str, uid: &str) -> Vec<plan::JobView> {
    let slots = admission::lock(&ctx.compile_slots);
    admission::created_not_cached(&slots, ns, uid, &ctx.jobs, Instant::now())
}

/// What this reconcile saw that bears on remembered lookups.
struct Seen {
    /// Per compile key, the target's finished Jobs.
    finished: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Keys whose entry a node reports broken.
    broken: std::collections::BTreeSet<String>,
}

/// What the store holds of `keys` (only the keys the plan will ask about): from the lookup
/// cache where it knows ([`lookups`]), else from the store, and remembered.
async fn stored(
    ctx: &Context,
    keys: Vec<String>,
    seen: &Seen,
) -> Result<BTreeMap<String, Stored>, Error> {
    let mut stored = BTreeMap::new();
    let none = std::collections::BTreeSet::new();
    for key in keys {
        let finished = seen.finished.get(&key).unwrap_or(&none);
        let known = {
            let mut cache = ctx.lookups.lock().unwrap_or_else(|p| p.into_inner());
            if seen.broken.contains(&key) {
                cache.forget(&key);
            }
            cache.get(&key, finished, Instant::now())
        };
        match known {
            Some(lookups::Known::Hit(entry)) => {
                stored.insert(key, *entry);
                continue;
            }
            Some(lookups::Known::Miss) => continue,
            None => {}
        }
        let found = lookup_verified(ctx, &key).await?;
        let mut cache = ctx.lookups.lock().unwrap_or_else(|p| p.into_inner());
        match found {
            Some(entry) => {
                cache.hit(&key, entry.clone());
                stored.insert(key, entry);
            }
            None => cache.miss(&key, finished, Instant::now()),
        }
    }
    Ok(stored)
}

/// The verified entry of `key` in the store: `None` when there is none, or when it is corrupt
/// or unsigned (counted; a compile Job rebuilds the key and its publisher replaces it).
async fn lookup_verified(ctx: &Context, key: &str) -> Result<Option<Stored>, Error> {
    let found = match ctx.store.lookup(key).await {
        Ok(found) => found,
        // A corrupt entry (its build manifest does not match its digest) is not stored as far
        // as the plan is concerned, like an unsigned one: the class compiles again and its
        // publisher replaces the entry. Only this class waits; the others go on.
        Err(e) if e.reason() == kiln_crds::FailureReason::HashMismatch => {
            tracing::warn!(compile_key = %key, error = %e, "stored entry corrupt; it will be rebuilt");
            ctx.metrics.untrusted_entry();
            return Ok(None);
        }
        Err(source) => {
            return Err(Error::StoreLookup {
                key: key.to_string(),
                source,
            });
        }
    };
    let Some(entry) = found else {
        return Ok(None);
    };
    // Publishers tag an entry only after its attestation is stored (`Trust::publish`), so an
    // entry without a valid one was not written by a publisher holding the key.
    if let Err(e) = ctx.trust.check(ctx.store.as_ref(), &subject(&entry)).await {
        if e.reason() != kiln_crds::FailureReason::SignatureInvalid {
            return Err(Error::StoreLookup {
                key: key.to_string(),
                source: e,
            });
        }
        tracing::warn!(compile_key = %key, error = %e, "stored entry refused; it will be rebuilt");
        ctx.metrics.untrusted_entry();
        return Ok(None);
    }
    let engine = Some((
        entry.manifest.engine(),
        entry.manifest.selection.as_ref().map(|s| s.reason.clone()),
    ));
    Ok(Some(Stored {
        digest: entry.manifest.artifact_digest,
        manifest_digest: entry.manifest_digest,
        engine,
        placement: entry.manifest.placement,
    }))
}

/// The plan, in one pass: draft, compile admission, settle. Counting the running compiles and
/// taking slots for the new Jobs happen under the slot lock, so that reconciles of other
/// targets (they run at once) cannot take the same free slot; the Jobs are created after it.
fn decide(inputs: &Inputs<'_>, ctx: &Context, ns: &str, uid: &str) -> plan::Plan {
    let draft = plan::draft(inputs);
    if !draft.may_create() {
        return plan::settle(draft, Admission::default());
    }
    let mut slots = admission::lock(&ctx.compile_slots);
    let now = Instant::now();
    let elsewhere = admission::running_elsewhere(&mut slots, uid, &ctx.jobs, now);
    let admission = plan::admit(
        ctx.settings.max_concurrent_compiles,
        elsewhere + draft.running_here(),
        draft.candidates(),
    );
    let plan = plan::settle(draft, admission);
    admission::take(&mut slots, ns, uid, &plan.create, now);
    plan
}

/// The target's Jobs from the cache, with failures classified (reading the pod only for a failure
/// status does not already record).
async fn owned_jobs(
    target: &CompiledTarget,
    ctx: &Context,
    ns: &str,
    uid: &str,
) -> Vec<plan::JobView> {
    let recorded = |name: &str| {
        target.status.as_ref().and_then(|s| {
            s.classes
                .iter()
                .find(|c| {
                    c.job.as_deref() == Some(name)
                        && matches!(c.phase, ClassPhase::Failed | ClassPhase::Retrying)
                })
                .and_then(|c| Some((c.reason?, c.message.clone().unwrap_or_default())))
        })
    };
    let mut views = Vec::new();
    for job in ctx.jobs.state() {
        let owned = job
            .owner_references()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true));
        if !owned || job.namespace().as_deref() != Some(ns) {
            continue;
        }
        let failure = match observe::outcome(&job) {
            Some(Err(job_reason)) => {
                let name = job.name_any();
                match recorded(&name) {
                    Some(known) => Some(known),
                    None => Some(read_failure(ctx, ns, &name, &job_reason, job.labels()).await),
                }
            }
            _ => None,
        };
        if let Some(v) = observe::view(&job, failure) {
            views.push(v);
        }
    }
    views
}

async fn read_failure(
    ctx: &Context,
    ns: &str,
    job: &str,
    job_reason: &str,
    labels: &BTreeMap<String, String>,
) -> (kiln_crds::FailureReason, String) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pod = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .ok()
        .and_then(|l| l.items.into_iter().next());
    let (reason, mut message) = observe::failure_reason(job_reason, pod.as_ref());
    if let Some(pod) = &pod {
        let params = LogParams {
            container: Some("compile".into()),
            tail_lines: Some(4),
            ..Default::default()
        };
        if let Ok(log) = pods.logs(&pod.name_any(), &params).await {
            let tail: Vec<String> = log.lines().map(|l| l.chars().take(240).collect()).collect();
            if !tail.is_empty() && !message.contains("log tail") {
                message = format!("{message}; log tail: {}", tail.join(" | "));
            }
        }
    }
    let class = labels
        .get(kiln_crds::labels::JOB_CLASS)
        .cloned()
        .unwrap_or_default();
    ctx.metrics.job(&class, "failed", reason.as_str());
    (reason, message)
}

/// Removes the readiness labels of targets that no longer exist, and forgets their metrics.
pub async fn sweep(ctx: &Context, targets: &Store<CompiledTarget>) {
    let live: BTreeMap<String, String> = targets
        .state()
        .iter()
        .map(|t| {
            let ns = t.namespace().unwrap_or_default();
            (
                kiln_crds::labels::ready_label(&ns, &t.name_any()),
                format!("{ns}/{}", t.name_any()),
            )
        })
        .collect();
    let nodes: Vec<NodeView> = ctx
        .nodes
        .state()
        .iter()
        .map(|n| NodeView::new(n, None))
        .collect();
    let keys = live.keys().cloned().collect();
    for plan::LabelChange { node, key, .. } in plan::stale_labels(&nodes, &keys) {
        tracing::info!(%node, %key, "removing the readiness label of a deleted target");
        if let Err(err) = writes::set_label(ctx, &node, &key, None).await {
            tracing::warn!(%node, %key, %err, "cannot remove a stale readiness label");
        }
    }
    let names: std::collections::BTreeSet<&String> = live.values().collect();
    let uids: std::collections::BTreeSet<String> =
        targets.state().iter().filter_map(|t| t.uid()).collect();
    ctx.pacer.forget_old(Instant::now());
    if let Ok(mut written) = ctx.written.lock() {
        written.retain(|uid, _| uids.contains(uid));
    }
    if let Ok(mut counts) = ctx.class_counts.lock() {
        let gone: i64 = counts
            .iter()
            .filter(|(k, _)| !names.contains(k))
            .map(|(_, v)| *v)
            .sum();
        counts.retain(|k, _| names.contains(k));
        ctx.metrics.classes(-gone);
    }
    if let Ok(mut counts) = ctx.ready_counts.lock() {
        let gone: Vec<String> = counts
            .keys()
            .filter(|k| !names.contains(k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(before) = counts.remove(&k) {
                writes::ready_deltas(ctx, &before, &BTreeMap::new());
            }
        }
    }
}

/// Logs, counts, and retries a failed reconcile with a fixed delay (no hot loop).
pub fn error_policy(target: Arc<CompiledTarget>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(target = %target.name_any(), category = err.category(), %err, "reconcile failed");
    ctx.metrics.error(err.category());
    Action::requeue(Duration::from_secs(15))
}

/// Targets in `ns` that reference the model `name`.
pub fn targets_of_model(
    targets: &Store<CompiledTarget>,
    ns: &str,
    name: &str,
) -> Vec<ObjectRef<CompiledTarget>> {
    targets
        .state()
        .iter()
        .filter(|t| t.namespace().as_deref() == Some(ns) && t.spec.model_ref.name == name)
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

/// Drains a controller's results, logging what failed (results are never silently dropped).
pub async fn drain<S, T, E>(stream: S)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    stream
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(%e, "controller event");
            }
        })
        .await;
}
