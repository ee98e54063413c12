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

use crate::admission::PendingSlots;
use crate::controller::{Context, MANAGER};
use crate::error::Error;
use crate::plan::{self, ModelLookup};

/// (node, label key) → the value this replica wrote there, and when.
pub type LabelMemo = BTreeMap<(String, String), Written>;

/// A node label value this replica wrote.
pub struct Written {
    /// The value (`None`: removed).
    value: Option<String>,
    /// When.
    at: Instant,
}

/// Target uid → the status this replica wrote on it, and the resourceVersion of the object that
/// status replaced.
pub type StatusMemo = std::collections::HashMap<String, (String, CompiledTargetStatus)>;

/// `target` as this replica last wrote it. A reconcile that starts before the watch delivers the
/// target's own status write (a node label or a Job woke it) would see the old status, and write
/// the same status and publish the same Events again: on 1,000 new targets, 1.9 status writes
/// and Events each. While the cache still holds the resourceVersion the write replaced, the
/// written status stands in for the cached one; any other version (the echo, or somebody
/// else's write) ends the memo.
pub fn as_written<'a>(
    target: &'a CompiledTarget,
    uid: &str,
    written: &std::sync::Mutex<StatusMemo>,
) -> std::borrow::Cow<'a, CompiledTarget> {
    let Ok(mut memo) = written.lock() else {
        return std::borrow::Cow::Borrowed(target);
    };
    match memo.get(uid) {
        Some((replaced, status)) if target.metadata.resource_version.as_ref() == Some(replaced) => {
            let mut fresher = target.clone();
            fresher.status = Some(status.clone());
            std::borrow::Cow::Owned(fresher)
        }
        Some(_) => {
            memo.remove(uid);
            std::borrow::Cow::Borrowed(target)
        }
        None => std::borrow::Cow::Borrowed(target),
    }
}

/// How long a node label this replica set is trusted over a cache that does not show it yet.
const LABEL_MEMO: Duration = Duration::from_secs(30);

/// Carries the plan out: the only writes. Stops at the first failed write (the next reconcile
/// starts over from what then exists); an Event that cannot be recorded fails nothing.
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
    let ready: BTreeMap<String, i64> = new
        .classes
        .iter()
        .map(|c| (c.class.clone(), i64::from(c.ready_nodes)))
        .collect();
    if let Ok(mut counts) = ctx.ready_counts.lock() {
        let before = counts
            .insert(key.to_string(), ready.clone())
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
    if let (Some(uid), Some(replaced), Ok(mut memo)) = (
        target.uid(),
        target.metadata.resource_version.clone(),
        ctx.written.lock(),
    ) {
        memo.insert(uid, (replaced, status.clone()));
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

/// Whether this replica set `node`'s label `key` to `value` (`None`: removed it) within the
/// memo's window: a Node event showing it is the echo of that write.
pub fn wrote_label(
    labelled: &std::sync::Mutex<LabelMemo>,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> bool {
    labelled.lock().is_ok_and(|m| {
        m.get(&(node.to_string(), key.to_string()))
            .is_some_and(|w| w.at.elapsed() < LABEL_MEMO && w.value.as_deref() == value)
    })
}

/// Forgets what this replica wrote on `node`, which was deleted: a Node registering again under
/// that name starts without those labels, and the memo must not stand in for them.
pub fn forget_node(labelled: &std::sync::Mutex<LabelMemo>, node: &str) {
    if let Ok(mut m) = labelled.lock() {
        m.retain(|(n, _), _| n != node);
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
    let memo = (node.to_string(), key.to_string());
    let want = value.map(str::to_string);
    // Claim the write before patching, so that concurrent reconciles of targets sharing the
    // node do not all patch it; a failed patch gives the claim back.
    let claimed = ctx
        .labelled
        .lock()
        .map(|mut m| {
            m.retain(|_, w| w.at.elapsed() < LABEL_MEMO);
            let fresh = m.get(&memo).is_some_and(|w| w.value == want);
            if !fresh {
                let written = Written {
                    value: want.clone(),
                    at: Instant::now(),
                };
                m.insert(memo.clone(), written);
            }
            !fresh
        })
        .unwrap_or(true);
    if !claimed {
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
            if let Ok(mut m) = ctx.labelled.lock() {
                m.remove(&memo);
            }
            Ok(())
        }
        Err(source) => {
            if let Ok(mut m) = ctx.labelled.lock() {
                m.remove(&memo);
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn target(resource_version: &str, revision: i64) -> CompiledTarget {
        let mut t: CompiledTarget = serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1",
            "kind": "CompiledTarget",
            "metadata": {"name": "t", "namespace": "ml", "uid": "u",
                         "resourceVersion": resource_version},
            "spec": {"modelRef": {"name": "m"}, "backend": {"kind": "tract"}, "profiles": [],
                     "warmup": {"fixtureVersion": "v1"}},
        }))
        .expect("target");
        t.status = Some(CompiledTargetStatus {
            revision: Some(revision),
            ..Default::default()
        });
        t
    }

    #[test]
    fn a_written_status_stands_in_until_the_cache_moves_past_what_it_replaced() {
        let written = Mutex::new(StatusMemo::new());
        let cached = target("10", 1);
        // Nothing written: the cache is the truth.
        assert_eq!(as_written(&cached, "u", &written).status, cached.status);
        let mine = CompiledTargetStatus {
            revision: Some(2),
            ..Default::default()
        };
        written
            .lock()
            .expect("memo")
            .insert("u".into(), ("10".into(), mine.clone()));
        // The cache still holds version 10, which the write replaced: the write stands in.
        assert_eq!(
            as_written(&cached, "u", &written).status.as_ref(),
            Some(&mine)
        );
        // Another uid is not this target.
        assert_eq!(as_written(&cached, "v", &written).status, cached.status);
        // The echo (or anybody's later write) arrives: the cache wins and the memo ends.
        let echoed = target("11", 2);
        assert_eq!(as_written(&echoed, "u", &written).status, echoed.status);
        assert!(written.lock().expect("memo").is_empty());
        assert_eq!(as_written(&cached, "u", &written).status, cached.status);
    }

    #[test]
    fn only_a_value_this_replica_wrote_recently_is_an_echo() {
        let labelled = Mutex::new(LabelMemo::new());
        let key = |n: &str| (n.to_string(), "kiln.dev/class".to_string());
        labelled.lock().expect("memo").insert(
            key("n1"),
            Written {
                value: Some("a".into()),
                at: Instant::now(),
            },
        );
        labelled.lock().expect("memo").insert(
            key("n2"),
            Written {
                value: None,
                at: Instant::now(),
            },
        );
        assert!(wrote_label(&labelled, "n1", "kiln.dev/class", Some("a")));
        assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", Some("b")));
        assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", None));
        assert!(!wrote_label(&labelled, "n1", "other", Some("a")));
        assert!(wrote_label(&labelled, "n2", "kiln.dev/class", None));
        // A deleted node's labels went with it: nothing it had is an echo any more, and the
        // other nodes' memos stay.
        forget_node(&labelled, "n1");
        assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", Some("a")));
        assert!(wrote_label(&labelled, "n2", "kiln.dev/class", None));
        assert!(!wrote_label(&labelled, "n3", "kiln.dev/class", Some("a")));
        // Past the memo's window it is nobody's echo.
        if let Some(old) = Instant::now().checked_sub(LABEL_MEMO) {
            labelled.lock().expect("memo").insert(
                key("n1"),
                Written {
                    value: Some("a".into()),
                    at: old,
                },
            );
            assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", Some("a")));
        }
    }
}
