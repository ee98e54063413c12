//! Carrying a plan out: the operator's only writes to the API (compile Jobs, node labels,
//! CompiledTarget status, Events), and the metrics that count what they changed. May write;
//! may not decide (what to write comes from the plan, or from `sweep`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kiln_crds::{CompiledTarget, CompiledTargetStatus, ModelArtifact};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Resource, ResourceExt};

use crate::context::{Context, MANAGER};
use crate::error::Error;
use crate::plan::{self, ModelLookup};
use crate::recall::admission::PendingSlots;
use crate::recall::memo;

/// Carries the plan out: the only writes. Stops at the first failed write (the next reconcile
/// starts over from what then exists); an Event that cannot be recorded fails nothing. A status
/// change within the write interval of the target's last write is held, Events with it, and the
/// target reconciled again when the interval is over ([`crate::recall::pace`]).
pub async fn apply(
    target: &CompiledTarget,
    model: &ModelLookup,
    plan: plan::Plan,
    ctx: &Context,
    ns: &str,
) -> Result<Action, Error> {
    let mut pending = PendingSlots::new(&ctx.compile_slots, ns, &plan.create);
    delete_jobs(ctx, ns, &plan.delete, &mut pending).await?;
    for change in &plan.node_labels {
        set_label(ctx, &change.node, &change.key, change.value.as_deref()).await?;
    }
    if let ModelLookup::Found(model) = model {
        let created = create_jobs(target, model, &plan.create, ctx, ns, &mut pending).await?;
        if created == Created::NamespaceGone {
            return Ok(Action::await_change());
        }
    }
    let old = target.status.clone().unwrap_or_default();
    if plan.status != old {
        let news = crate::recall::pace::is_news(
            !plan.create.is_empty() || !plan.delete.is_empty(),
            old.observed_generation,
            plan.status.observed_generation,
        );
        let uid = target.uid().unwrap_or_default();
        if let Some(wait) = ctx.pacer.wait(&uid, Instant::now(), news) {
            // Written less than the interval ago: this change, its Events and whatever changes
            // meanwhile go out together in one write when the interval is over.
            ctx.metrics.held();
            return Ok(Action::requeue(wait));
        }
    }
    record_metrics(
        ctx,
        &format!("{ns}/{}", target.name_any()),
        &old,
        &plan.status,
    );
    if plan.status != old {
        write_status(target, ns, &plan.status, ctx).await?;
    }
    publish_events(target, &plan.events, ctx).await;
    Ok(match plan.requeue {
        Some(after) => Action::requeue(after + Duration::from_secs(1)),
        // Periodic re-check of the store (another cluster may have filled a key); no writes when
        // nothing changed.
        None => Action::requeue(Duration::from_secs(600)),
    })
}

/// Deletes Jobs no class wants; a deleted Job gives its compile slot back.
async fn delete_jobs(
    ctx: &Context,
    ns: &str,
    names: &[String],
    pending: &mut PendingSlots<'_>,
) -> Result<(), Error> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    for name in names {
        pending.deleted(name);
        match jobs.delete(name, &DeleteParams::background()).await {
            Ok(_) => ctx.metrics.write("delete"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(Error::DeleteJob {
                    namespace: ns.to_string(),
                    name: name.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// How creating the Jobs ended.
#[derive(PartialEq, Eq)]
enum Created {
    /// Each exists now (created here or before).
    All,
    /// The namespace is being deleted, and the target with it: nothing more to do.
    NamespaceGone,
}

/// Creates the compile Jobs; a created Job keeps its slot until the cache shows it.
async fn create_jobs(
    target: &CompiledTarget,
    model: &ModelArtifact,
    create: &[plan::NewJob],
    ctx: &Context,
    ns: &str,
    pending: &mut PendingSlots<'_>,
) -> Result<Created, Error> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    for new in create {
        let job = crate::job::build(target, model, new, &ctx.job_settings);
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => {
                ctx.metrics.write("job");
                ctx.metrics.job(&new.class, "created", "");
            }
            // Another replica, or this one before a restart, already made it: same name, same Job.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("being terminated") => {
                return Ok(Created::NamespaceGone);
            }
            Err(source) => {
                return Err(Error::CreateJob {
                    namespace: ns.to_string(),
                    name: new.name.clone(),
                    source,
                });
            }
        }
        pending.created(&new.name);
    }
    Ok(Created::All)
}

/// Job results, cache hits, promotions, and the class and ready-node gauges of target `key`.
fn record_metrics(
    ctx: &Context,
    key: &str,
    old: &CompiledTargetStatus,
    new: &CompiledTargetStatus,
) {
    for row in &new.classes {
        let was = old.classes.iter().find(|c| c.class == row.class);
        let had_artifact = was.is_some_and(|w| w.artifact_digest == row.artifact_digest);
        if row.artifact_digest.is_some() && !had_artifact {
            if was.and_then(|w| w.job.as_ref()).is_some() {
                ctx.metrics.job(&row.class, "succeeded", "");
            } else {
                ctx.metrics.cache_hit();
            }
        }
    }
    for r in new.revisions.iter().filter(|r| r.known_good) {
        if !old
            .revisions
            .iter()
            .any(|o| o.number == r.number && o.known_good)
        {
            ctx.metrics.promoted();
        }
    }
    let count = i64::from(new.class_count.unwrap_or(0));
    if let Ok(mut counts) = ctx.class_counts.lock() {
        let before = counts.insert(key.to_string(), count).unwrap_or(0);
        ctx.metrics.classes(count - before);
    }
    // Only classes with ready nodes: a missing class counts 0, and 10,000 targets with nothing
    // ready yet keep no map entry per class.
    let ready: BTreeMap<String, i64> = new
        .classes
        .iter()
        .filter(|c| c.ready_nodes != 0)
        .map(|c| (c.class.clone(), i64::from(c.ready_nodes)))
        .collect();
    if let Ok(mut counts) = ctx.ready_counts.lock() {
        let before = if ready.is_empty() {
            counts.remove(key)
        } else {
            counts.insert(key.to_string(), ready.clone())
        }
        .unwrap_or_default();
        ready_deltas(ctx, &before, &ready);
    }
}

/// Applies the target's status (server-side apply, the operator's field manager).
/// Writes `status` when it differs from the target's; a failed write is logged, not returned
/// (the caller is already failing for another reason and will retry).
pub async fn status_if_changed(
    target: &CompiledTarget,
    ns: &str,
    status: &CompiledTargetStatus,
    ctx: &Context,
) {
    if target.status.as_ref() == Some(status) {
        return;
    }
    if let Err(e) = write_status(target, ns, status, ctx).await {
        tracing::warn!(target = %target.name_any(), %e, "cannot record the failure on the target");
    }
}

async fn write_status(
    target: &CompiledTarget,
    ns: &str,
    status: &CompiledTargetStatus,
    ctx: &Context,
) -> Result<(), Error> {
    let api: Api<CompiledTarget> = Api::namespaced(ctx.client.clone(), ns);
    let body = kiln_crds::status_apply::<CompiledTarget>(status);
    let params = PatchParams::apply(MANAGER).force();
    api.patch_status(&target.name_any(), &params, &Patch::Apply(&body))
        .await
        .map_err(|source| Error::ApplyStatus {
            kind: "CompiledTarget",
            namespace: ns.to_string(),
            name: target.name_any(),
            source,
        })?;
    ctx.metrics.write("status");
    memo::wrote_status(&ctx.written, target, status);
    if let Some(uid) = target.uid() {
        ctx.pacer.wrote(&uid, Instant::now());
    }
    Ok(())
}

/// Records the plan's Events on the target.
async fn publish_events(target: &CompiledTarget, events: &[plan::Event], ctx: &Context) {
    let reference = target.object_ref(&());
    for e in events {
        let event = KubeEvent {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.clone(),
            note: Some(e.note.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        // An Event that cannot be recorded must not fail the reconcile that caused it.
        match ctx.recorder.publish(&event, &reference).await {
            Ok(()) => ctx.metrics.write("event"),
            Err(err) => tracing::warn!(%err, "cannot record event"),
        }
    }
}

/// Sets (`Some`) or removes (`None`) one node label, unless this replica already wrote that
/// value recently (the cache may not show it yet).
pub async fn set_label(
    ctx: &Context,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), Error> {
    // Claim the write before patching, so that concurrent reconciles of targets sharing the
    // node do not all patch it; a failed patch gives the claim back.
    if !memo::claim_label(&ctx.labelled, node, key, value) {
        return Ok(());
    }
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    match nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            ctx.metrics.write("node");
            Ok(())
        }
        // The node is gone, and its labels with it: nothing was written, so nothing to
        // remember (a node that registers again under the name starts without them).
        Err(kube::Error::Api(e)) if e.code == 404 => {
            memo::release_label(&ctx.labelled, node, key);
            Ok(())
        }
        Err(source) => {
            memo::release_label(&ctx.labelled, node, key);
            Err(Error::PatchNodeLabel {
                node: node.to_string(),
                key: key.to_string(),
                source,
            })
        }
    }
}

/// Moves the ready-nodes gauge from one target's `before` counts per class to `after`.
pub fn ready_deltas(ctx: &Context, before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) {
    let classes: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for class in classes {
        let delta = after.get(class).unwrap_or(&0) - before.get(class).unwrap_or(&0);
        if delta != 0 {
            ctx.metrics.ready_nodes(class, delta);
        }
    }
}
