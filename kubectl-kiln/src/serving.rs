//! Serving pods in the reports: which pods serve a target, on which node, which revision that
//! node serves, and their `kiln.dev/warm` gate (`status`); why one pod is cold (`why pod/NAME`).
//! Pure: objects in, reports out.

use k8s_openapi::api::core::v1::Pod;
use kiln_crds::KilnNode;
use kiln_crds::kiln_node::NodePhase;
use kiln_crds::labels::{PROTOCOL_ANNOTATION, TARGET_ANNOTATION, WARM_CONDITION};
use serde::Serialize;

use crate::report::{EventLine, Problem, Why, or_dash, table};

/// One serving pod of a target.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServingPod {
    /// Pod name.
    pub pod: String,
    /// Its node (empty while unscheduled).
    pub node: String,
    /// The revision its node's row serves.
    pub revision: Option<i64>,
    /// The pod's `Ready` condition.
    pub ready: bool,
    /// Its `kiln.dev/warm` condition: True, False, or absent.
    pub warm: Option<bool>,
    /// The gate's reason.
    pub reason: String,
    /// The gate's message (a failed check names the first differing token or text there).
    pub message: String,
    /// How the agent talks to the pod's server (`kiln.dev/protocol`: `oip-v2`, `llama-server`,
    /// `openai`); absent when the pod names none (gated on its node's row only).
    pub protocol: Option<String>,
    /// When the gate last changed (the check's end, or the row's).
    pub last_check: Option<String>,
    /// The last passed check's first request through the server, milliseconds.
    pub first_ms: Option<f64>,
    /// Its median request, milliseconds.
    pub p50_ms: Option<f64>,
}

/// A figure of the gate's message (`…; first 34.6 ms, p50 28.6 ms, …`, as the agent writes a
/// passed check): the number after `label` and before ` ms`.
fn figure(message: &str, label: &str) -> Option<f64> {
    let rest = &message[message.find(label)? + label.len()..];
    rest.split_once(" ms")?.0.trim().parse().ok()
}

fn condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
}

fn target_of(pod: &Pod) -> Option<&String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TARGET_ANNOTATION))
}

/// The pod's `kiln.dev/protocol`, when it names its server.
fn protocol_of(pod: &Pod) -> Option<&String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROTOCOL_ANNOTATION))
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The row of `namespace/target` on `node`.
fn row<'a>(
    nodes: &'a [KilnNode],
    node: &str,
    namespace: &str,
    target: &str,
) -> Option<&'a kiln_crds::kiln_node::NodeTargetStatus> {
    nodes
        .iter()
        .filter(|n| n.metadata.name.as_deref() == Some(node))
        .flat_map(|n| n.status.iter().flat_map(|s| s.targets.iter()))
        .find(|r| r.namespace == namespace && r.name == target)
}

/// The pods of `namespace` that declare `target` (annotation `kiln.dev/target`), by name.
pub fn serving_pods(
    namespace: &str,
    target: &str,
    pods: &[Pod],
    nodes: &[KilnNode],
) -> Vec<ServingPod> {
    let mut out: Vec<ServingPod> = pods
        .iter()
        .filter(|p| target_of(p).is_some_and(|t| t == target))
        .map(|p| {
            let node = node_of(p);
            let warm = condition(p, WARM_CONDITION);
            let message = warm.and_then(|c| c.message.clone()).unwrap_or_default();
            let passed = warm.is_some_and(|c| c.status == "True");
            ServingPod {
                protocol: protocol_of(p).cloned(),
                last_check: warm
                    .and_then(|c| c.last_transition_time.as_ref())
                    .map(|t| t.0.to_string()),
                first_ms: passed.then(|| figure(&message, "; first ")).flatten(),
                p50_ms: passed.then(|| figure(&message, ", p50 ")).flatten(),
                pod: p.metadata.name.clone().unwrap_or_default(),
                revision: row(nodes, &node, namespace, target).map(|r| r.revision),
                node,
                ready: condition(p, "Ready").is_some_and(|c| c.status == "True"),
                warm: warm.map(|c| c.status == "True"),
                reason: warm.and_then(|c| c.reason.clone()).unwrap_or_default(),
                message,
            }
        })
        .collect();
    out.sort_by(|a, b| a.pod.cmp(&b.pod));
    out
}

/// `why pod/NAME`: what keeps a serving pod from Ready: not scheduled, its node's row, its
/// containers (a refused mount keeps them creating), its `kiln.dev/warm` gate.
pub fn why_pod(pod: &Pod, nodes: &[KilnNode], events: Vec<EventLine>) -> Why {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let node = node_of(pod);
    let mut problems = Vec::new();
    let problem = |problems: &mut Vec<Problem>, at: String, step: &str, message: String| {
        problems.push(Problem {
            at,
            step: step.into(),
            reason: None,
            message,
        })
    };
    match target_of(pod) {
        None => problem(
            &mut problems,
            "annotations".into(),
            "declare",
            format!("no {TARGET_ANNOTATION} annotation: kiln does not gate or serve this pod"),
        ),
        Some(t) if !node.is_empty() => match row(nodes, &node, &ns, t) {
            None => problem(
                &mut problems,
                format!("node {node}"),
                "select",
                format!(
                    "the node has no row for CompiledTarget {ns}/{t}: the target does not exist or does not select the node"
                ),
            ),
            Some(r) if !matches!(r.phase, NodePhase::Ready | NodePhase::Degraded) => {
                problems.push(Problem {
                    at: format!("node {node}, target {ns}/{t} revision {}", r.revision),
                    step: r.phase.as_str().into(),
                    reason: r.reason,
                    message: r.message.clone().unwrap_or_default(),
                })
            }
            Some(_) => {}
        },
        Some(_) => {}
    }
    if node.is_empty() {
        let why = condition(pod, "PodScheduled")
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        problem(
            &mut problems,
            "scheduling".into(),
            "schedule",
            format!("not scheduled: {why}"),
        );
    }
    for c in pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
    {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            problem(
                &mut problems,
                format!("container {}", c.name),
                "start",
                format!(
                    "{}: {} (a refused csi.kiln.dev mount shows in the events below)",
                    w.reason.clone().unwrap_or_default(),
                    w.message.clone().unwrap_or_default()
                ),
            );
        }
    }
    if let Some(c) = condition(pod, WARM_CONDITION).filter(|c| c.status != "True") {
        problem(
            &mut problems,
            match protocol_of(pod) {
                Some(p) => format!(
                    "condition {WARM_CONDITION}=False (checked through its server, {p}, {})",
                    c.last_transition_time
                        .as_ref()
                        .map_or("-".into(), |t| t.0.to_string())
                ),
                None => format!("condition {WARM_CONDITION}=False"),
            },
            c.reason.as_deref().unwrap_or_default(),
            c.message.clone().unwrap_or_default(),
        );
    }
    let ready = condition(pod, "Ready").is_some_and(|c| c.status == "True");
    Why {
        subject: format!("Pod {ns}/{name}"),
        ready: ready && problems.is_empty(),
        problems,
        events,
    }
}

/// The serving pods as a table under the status (nothing when there are none).
pub fn render(pods: &[ServingPod]) -> String {
    if pods.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            vec![
                p.pod.clone(),
                or_dash((!p.node.is_empty()).then_some(&p.node)),
                or_dash(p.revision),
                if p.ready { "True" } else { "False" }.into(),
                or_dash(p.warm.map(|w| if w { "True" } else { "False" })),
                or_dash(p.protocol.as_ref()),
                or_dash(p.last_check.as_ref()),
                or_dash(p.first_ms.map(|v| format!("{v:.1} ms"))),
                or_dash(p.p50_ms.map(|v| format!("{v:.1} ms"))),
                or_dash((!p.reason.is_empty()).then_some(&p.reason)),
            ]
        })
        .collect();
    format!(
        "\nserving pods:\n{}",
        table(
            &[
                "POD",
                "NODE",
                "NODE REVISION",
                "READY",
                "WARM",
                "PROTOCOL",
                "LAST CHECK",
                "FIRST",
                "P50",
                "REASON",
            ],
            &rows
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(warm: &str, reason: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"kiln.dev/target": "sq"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": if warm == "True" { "True" } else { "False" }},
                {"type": "kiln.dev/warm", "status": warm, "reason": reason, "message": "m"}
            ]}
        }))
        .expect("pod")
    }

    fn node(phase: &str) -> KilnNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1", "kind": "KilnNode",
            "metadata": {"name": "n1"}, "spec": {},
            "status": {"targets": [{"namespace": "ns", "name": "sq", "revision": 3, "class": "c", "phase": phase}]}
        }))
        .expect("node")
    }

    #[test]
    fn status_shows_each_pods_protocol_last_check_and_figures() {
        let mut p = pod("True", "Ready");
        p.metadata
            .annotations
            .get_or_insert_default()
            .insert("kiln.dev/protocol".into(), "openai".into());
        if let Some(c) = p
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.get_mut(1))
        {
            c.message = Some("revision 3 (class c, sha256:ab) verified, loaded and warmed on this node: 20 requests through the server within tolerance (max |error| 1.0e-4); first 34.6 ms, p50 28.6 ms, first after warm 27.2 ms".into());
        }
        let rows = serving_pods("ns", "sq", &[p], &[node("Ready")]);
        assert_eq!(rows[0].protocol.as_deref(), Some("openai"));
        assert_eq!((rows[0].first_ms, rows[0].p50_ms), (Some(34.6), Some(28.6)));
        let table = render(&rows);
        assert!(
            table.contains("openai") && table.contains("34.6 ms") && table.contains("28.6 ms"),
            "{table}"
        );
        // A failed check has no figures; its message (the first differing token) stays.
        let cold = serving_pods(
            "ns",
            "sq",
            &[pod("False", "ServingParityExceeded")],
            &[node("Ready")],
        );
        assert_eq!(
            (
                cold[0].first_ms,
                cold[0].p50_ms,
                cold[0].protocol.as_deref()
            ),
            (None, None, None)
        );
        assert_eq!(figure("no figures here", "; first "), None);
    }

    #[test]
    fn status_lists_the_targets_pods_with_their_gate_and_the_nodes_revision() {
        let other: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "o"}})).expect("pod");
        let rows = serving_pods(
            "ns",
            "sq",
            &[pod("False", "ServingParityExceeded"), other],
            &[node("Ready")],
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (
                rows[0].revision,
                rows[0].warm,
                rows[0].reason.as_str(),
                rows[0].ready
            ),
            (Some(3), Some(false), "ServingParityExceeded", false)
        );
    }

    #[test]
    fn why_names_the_serving_check_and_the_nodes_row() {
        let w = why_pod(
            &pod("False", "ServingParityExceeded"),
            &[node("Ready")],
            Vec::new(),
        );
        assert!(!w.ready);
        assert_eq!(w.problems.len(), 1, "{:?}", w.problems);
        assert_eq!(w.problems[0].step, "ServingParityExceeded");
        let w = why_pod(&pod("False", "Warming"), &[node("Warming")], Vec::new());
        assert!(
            w.problems
                .iter()
                .any(|p| p.at.contains("node n1") && p.step == "Warming"),
            "{:?}",
            w.problems
        );
        let w = why_pod(&pod("True", "Ready"), &[node("Ready")], Vec::new());
        assert!(w.ready && w.problems.is_empty());
    }
}
