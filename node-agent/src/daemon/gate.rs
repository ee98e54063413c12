//! The `kiln.dev/warm` pod readiness gate: which condition a serving pod on this node should
//! carry, given this node's target rows, and since when. Pure; the patch is in `writes.rs`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::conditions::gate_reasons;
use kiln_crds::kiln_node::{NodePhase, NodeTargetStatus};
use kiln_crds::labels::{TARGET_ANNOTATION, WARM_CONDITION};

use super::decide::TargetKey;

/// The condition a pod should have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateCondition {
    /// True only while the target is served on this node.
    pub status: bool,
    /// `Ready`, `Degraded` (a fallback is served), a phase, or a failure reason.
    pub reason: String,
    /// For `kubectl describe pod`.
    pub message: String,
}

/// Whether the pod declares the gate.
pub fn declares_gate(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.condition_type == WARM_CONDITION))
}

/// The condition a pod that declares the gate should carry; `None` for pods that do not.
/// `rows` are this node's target rows.
pub fn desired(pod: &Pod, rows: &BTreeMap<TargetKey, NodeTargetStatus>) -> Option<GateCondition> {
    if !declares_gate(pod) {
        return None;
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let Some(target) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TARGET_ANNOTATION))
    else {
        return Some(GateCondition {
            status: false,
            reason: gate_reasons::INVALID_SPEC.into(),
            message: format!(
                "the pod declares the {WARM_CONDITION} readiness gate but has no {TARGET_ANNOTATION} annotation naming a CompiledTarget"
            ),
        });
    };
    let Some(row) = rows.get(&TargetKey::new(namespace.clone(), target.clone())) else {
        return Some(GateCondition {
            status: false,
            reason: gate_reasons::NOT_SELECTED.into(),
            message: format!(
                "CompiledTarget {namespace}/{target} does not exist or does not select this node"
            ),
        });
    };
    let digest = row.artifact_digest.as_deref().unwrap_or("?");
    let warm = match row.phase {
        NodePhase::Ready => GateCondition {
            status: true,
            reason: gate_reasons::READY.into(),
            message: format!(
                "revision {} (class {}, sha256:{digest}) verified, loaded and warmed on this node",
                row.revision, row.class
            ),
        },
        NodePhase::Degraded => GateCondition {
            status: true,
            reason: gate_reasons::DEGRADED.into(),
            message: row.message.clone().unwrap_or_default(),
        },
        NodePhase::Failed => GateCondition {
            status: false,
            reason: row
                .reason
                .map(|r| r.as_str().to_string())
                .unwrap_or_else(|| "Failed".into()),
            message: row.message.clone().unwrap_or_default(),
        },
        phase => GateCondition {
            status: false,
            reason: phase.as_str().to_string(),
            message: row.message.clone().unwrap_or_else(|| {
                format!(
                    "revision {} is {} on this node",
                    row.revision,
                    phase.as_str()
                )
            }),
        },
    };
    Some(warm)
}

/// The pod's `kiln.dev/warm` condition, if it has one.
fn current(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == WARM_CONDITION))
}

/// Whether the pod's current condition differs from `want` (status, reason or message).
pub fn differs(pod: &Pod, want: &GateCondition) -> bool {
    match current(pod) {
        None => true,
        Some(c) => {
            c.status != if want.status { "True" } else { "False" }
                || c.reason.as_deref() != Some(want.reason.as_str())
                || c.message.as_deref().unwrap_or_default() != want.message
        }
    }
}

/// The `lastTransitionTime` for `want`: the current one while the status stays, else `now`.
pub fn transition_time(pod: &Pod, want: &GateCondition, now: Time) -> Time {
    match current(pod) {
        Some(c) if (c.status == "True") == want.status => {
            c.last_transition_time.clone().unwrap_or(now)
        }
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::FailureReason;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).expect("pod fixture")
    }

    const GATED: &str = r#"
metadata:
  name: server
  namespace: ns
  annotations: {kiln.dev/target: sq}
spec:
  containers: [{name: c, image: x}]
  readinessGates: [{conditionType: kiln.dev/warm}]
"#;

    fn rows(
        phase: NodePhase,
        reason: Option<FailureReason>,
    ) -> BTreeMap<TargetKey, NodeTargetStatus> {
        BTreeMap::from([(
            TargetKey::new("ns", "sq"),
            NodeTargetStatus {
                namespace: "ns".into(),
                name: "sq".into(),
                revision: 2,
                class: "cpu".into(),
                phase,
                artifact_digest: Some("ab".into()),
                reason,
                message: Some("why".into()),
                ..Default::default()
            },
        )])
    }

    #[test]
    fn true_only_when_served() {
        let p = pod(GATED);
        let ready = desired(&p, &rows(NodePhase::Ready, None)).expect("gated");
        assert!(ready.status && ready.reason == "Ready" && ready.message.contains("sha256:ab"));
        let degraded = desired(
            &p,
            &rows(NodePhase::Degraded, Some(FailureReason::ParityExceeded)),
        )
        .expect("gated");
        assert!(degraded.status && degraded.reason == "Degraded");
        let failed = desired(
            &p,
            &rows(NodePhase::Failed, Some(FailureReason::HashMismatch)),
        )
        .expect("gated");
        assert_eq!(
            (failed.status, failed.reason.as_str()),
            (false, "HashMismatch")
        );
        for phase in [
            NodePhase::Pending,
            NodePhase::Pulling,
            NodePhase::Loading,
            NodePhase::Warming,
        ] {
            let w = desired(&p, &rows(phase, None)).expect("gated");
            assert_eq!((w.status, w.reason), (false, format!("{phase:?}")));
        }
        let none = desired(&p, &BTreeMap::new()).expect("gated");
        assert_eq!((none.status, none.reason.as_str()), (false, "NotSelected"));
    }

    #[test]
    fn pods_without_the_gate_are_left_alone_and_a_missing_annotation_is_explained() {
        let plain =
            pod("metadata: {name: p, namespace: ns}\nspec: {containers: [{name: c, image: x}]}");
        assert!(desired(&plain, &rows(NodePhase::Ready, None)).is_none());
        let unnamed = pod(&GATED.replace("annotations: {kiln.dev/target: sq}", "annotations: {}"));
        let w = desired(&unnamed, &rows(NodePhase::Ready, None)).expect("gated");
        assert_eq!((w.status, w.reason.as_str()), (false, "InvalidSpec"));
    }

    #[test]
    fn only_a_change_needs_a_patch() {
        let mut p = pod(GATED);
        let want = desired(&p, &rows(NodePhase::Ready, None)).expect("gated");
        assert!(differs(&p, &want));
        p.status = Some(
            serde_json::from_value(serde_json::json!({"conditions": [{
                "type": WARM_CONDITION, "status": "True", "reason": "Ready", "message": want.message
            }]}))
            .expect("status"),
        );
        assert!(!differs(&p, &want));
        let failed = desired(
            &p,
            &rows(NodePhase::Failed, Some(FailureReason::HashMismatch)),
        )
        .expect("gated");
        assert!(differs(&p, &failed));
    }

    #[test]
    fn the_transition_time_stays_while_the_status_does() {
        let at = |s| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"));
        let mut p = pod(GATED);
        let ready = desired(&p, &rows(NodePhase::Ready, None)).expect("gated");
        assert_eq!(
            transition_time(&p, &ready, at(10)),
            at(10),
            "no condition yet"
        );
        p.status = Some(
            serde_json::from_value(serde_json::json!({"conditions": [{
                "type": WARM_CONDITION, "status": "True", "reason": "Ready", "message": "old",
                "lastTransitionTime": "1970-01-01T00:00:05Z"
            }]}))
            .expect("status"),
        );
        let degraded = desired(&p, &rows(NodePhase::Degraded, None)).expect("gated");
        assert_eq!(transition_time(&p, &degraded, at(10)), at(5), "still True");
        let failed = desired(&p, &rows(NodePhase::Failed, None)).expect("gated");
        assert_eq!(
            transition_time(&p, &failed, at(10)),
            at(10),
            "True to False"
        );
    }
}
