//! What the watch caches keep of each object: only what the plan and the triggers read. Every
//! object of a watched kind stays in memory for the process's life (10,000 targets, 1,000
//! KilnNodes), so a field nobody reads is memory paid per object, and a change to such a field
//! would wake reconciles that decide nothing new. Pure: an object in, the same object trimmed.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kiln_crds::kiln_node::NodeTargetStatus;
use kiln_crds::{CompiledTarget, KilnNode, ModelArtifact};
use kube::ResourceExt;

/// The client-side `kubectl apply` annotation: the whole object again, as JSON.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A CompiledTarget less its managed fields (a second copy of every field path of the spec and
/// the status, larger in memory than the status itself) and `kubectl apply`'s copy of itself.
/// Spec, status and every other annotation (`kiln.dev/retry`) stay.
pub fn target(t: &mut CompiledTarget) {
    t.managed_fields_mut().clear();
    t.annotations_mut().remove(LAST_APPLIED);
}

/// A Node as classes are made of it: name and labels (what selectors match, what class keys
/// read, what the operator patches). Status, spec, managed fields and annotations go.
pub fn node(n: &mut Node) {
    n.managed_fields_mut().clear();
    n.annotations_mut().clear();
    n.status = None;
    n.spec = None;
}

/// A KilnNode less its conditions, and its rows less what the plan never reads (timings,
/// placement, memory peaks, digests: the node's own evidence, shown on the KilnNode itself). A
/// row keeps who it is about, revision, class, phase, reason, message and the revision the agent
/// works towards ([`row`]).
pub fn kiln_node(k: &mut KilnNode) {
    k.managed_fields_mut().clear();
    k.annotations_mut().remove(LAST_APPLIED);
    if let Some(s) = k.status.as_mut() {
        s.conditions.clear();
        for r in &mut s.targets {
            row(r);
        }
    }
}

/// One KilnNode row as `readiness` and `lookups` read it.
fn row(r: &mut NodeTargetStatus) {
    *r = NodeTargetStatus {
        namespace: std::mem::take(&mut r.namespace),
        name: std::mem::take(&mut r.name),
        revision: r.revision,
        class: std::mem::take(&mut r.class),
        phase: r.phase,
        reason: r.reason,
        message: r.message.take(),
        desired_revision: r.desired_revision,
        ..Default::default()
    };
}

/// A ModelArtifact less its managed fields and `kubectl apply`'s copy of itself.
pub fn model(m: &mut ModelArtifact) {
    m.managed_fields_mut().clear();
    m.annotations_mut().remove(LAST_APPLIED);
}

/// A compile Job less its managed fields and its pod template (the plan reads the Job's labels,
/// annotations, owner and status).
pub fn job(j: &mut Job) {
    j.managed_fields_mut().clear();
    if let Some(s) = j.spec.as_mut() {
        s.template = Default::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_keeps_spec_status_and_its_own_annotations() {
        let mut t: CompiledTarget = serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1",
            "kind": "CompiledTarget",
            "metadata": {"name": "t", "namespace": "ml",
                "annotations": {LAST_APPLIED: "{}", "kiln.dev/retry": "1"},
                "managedFields": [{"manager": "kiln-operator", "operation": "Apply",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]},
            "spec": {"modelRef": {"name": "m"}, "backend": {"kind": "tract"}, "profiles": [],
                     "warmup": {"fixtureVersion": "v1"}},
            "status": {"classes": [{"class": "c", "nodes": 1, "phase": "Queued"}]},
        }))
        .expect("target");
        let before = t.clone();
        target(&mut t);
        assert!(
            t.metadata
                .managed_fields
                .as_deref()
                .unwrap_or_default()
                .is_empty()
        );
        assert_eq!(
            t.annotations().keys().collect::<Vec<_>>(),
            ["kiln.dev/retry"]
        );
        assert_eq!(t.spec, before.spec);
        assert_eq!(t.status, before.status);
    }

    #[test]
    fn a_kiln_node_row_keeps_what_readiness_reads_and_nothing_else() {
        let full = serde_json::json!({
            "namespace": "ml", "name": "t", "revision": 2, "class": "c", "phase": "Failed",
            "reason": "ParityExceeded", "message": "off by 1", "desiredRevision": 3,
            "artifactDigest": "abc", "pullSeconds": 1.5, "pullBytes": 10, "loadSeconds": 0.2,
            "warmupSeconds": 0.3, "p50Seconds": 0.01, "engine": "tract",
        });
        let mut k: KilnNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1", "kind": "KilnNode",
            "metadata": {"name": "n1"}, "spec": {},
            "status": {"targets": [full],
                       "conditions": [{"type": "Ready", "status": "True", "reason": "R",
                                       "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .expect("kiln node");
        kiln_node(&mut k);
        let status = k.status.expect("status");
        assert!(status.conditions.is_empty());
        assert_eq!(
            serde_json::to_value(&status.targets[0]).expect("json"),
            serde_json::json!({
                "namespace": "ml", "name": "t", "revision": 2, "class": "c", "phase": "Failed",
                "reason": "ParityExceeded", "message": "off by 1", "desiredRevision": 3,
            })
        );
    }
}
