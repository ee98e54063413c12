//! May a target's artifact be mounted on this node now (pure): only what the node's own row
//! says serves, `Ready` or `Degraded` (a fallback the policy allowed), and only by the row's
//! digest. Every refusal names the target, node, phase and revision, because the kubelet shows it
//! to the user in the pod's Events.

use kiln_crds::kiln_node::{NodePhase, NodeTargetStatus};

/// What the row allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Mount this artifact.
    Mount(Serving),
    /// Do not mount; say why.
    Refuse(Refusal),
}

/// The artifact the node's row says serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Serving {
    /// The revision served.
    pub revision: i64,
    /// The class whose artifact serves.
    pub class: String,
    /// sha256 of the artifact.
    pub digest: String,
    /// The engine that serves it, as the row names it.
    pub engine: Option<String>,
    /// `Ready`, or `Degraded` when a fallback serves.
    pub phase: NodePhase,
}

/// Why not, with the gRPC code the kubelet gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `FAILED_PRECONDITION` (the row says no) or `UNAVAILABLE` (no KilnNode to read yet).
    pub code: tonic::Code,
    /// A bounded label for logs and metrics.
    pub reason: &'static str,
    /// What the pod's Event says.
    pub message: String,
}

/// The verdict for `namespace/target` on `node`, from the node's KilnNode rows (`None`: no
/// KilnNode of the node).
pub fn admit(
    node: &str,
    namespace: &str,
    target: &str,
    rows: Option<&[NodeTargetStatus]>,
) -> Admission {
    let what = format!("CompiledTarget {namespace}/{target}");
    let Some(rows) = rows else {
        return refuse(
            tonic::Code::Unavailable,
            "NoKilnNode",
            format!(
                "node {node} has no KilnNode yet (is kiln-agent running on it?): {what} is not \
                 mounted until its row there is Ready"
            ),
        );
    };
    let Some(row) = rows
        .iter()
        .find(|r| r.namespace == namespace && r.name == target)
    else {
        return refuse(
            tonic::Code::FailedPrecondition,
            "NotOnNode",
            format!(
                "{what} has no row on node {node}: it does not exist in namespace {namespace}, \
                 does not select this node, or kiln-agent has not reached it yet; not mounted \
                 until it is Ready here"
            ),
        );
    };
    let at = format!(
        "{what} is {} on node {node} (revision {})",
        row.phase.as_str(),
        row.revision
    );
    match (row.phase, &row.artifact_digest) {
        (NodePhase::Ready | NodePhase::Degraded, Some(digest)) => Admission::Mount(Serving {
            revision: row.revision,
            class: row.class.clone(),
            digest: digest.clone(),
            engine: row.engine.clone(),
            phase: row.phase,
        }),
        (NodePhase::Ready | NodePhase::Degraded, None) => refuse(
            tonic::Code::FailedPrecondition,
            "NoDigest",
            format!("{at} but names no artifact digest: not mounted"),
        ),
        (NodePhase::Failed, _) => {
            let why = match (&row.reason, &row.message) {
                (Some(r), Some(m)) => format!(": {r}: {m}"),
                (Some(r), None) => format!(": {r}"),
                (None, Some(m)) => format!(": {m}"),
                (None, None) => String::new(),
            };
            refuse(
                tonic::Code::FailedPrecondition,
                "Failed",
                format!("{at}{why}; nothing is served here, so nothing is mounted"),
            )
        }
        _ => refuse(
            tonic::Code::FailedPrecondition,
            "NotReady",
            format!("{at}: not mounted until it is Ready"),
        ),
    }
}

fn refuse(code: tonic::Code, reason: &'static str, message: String) -> Admission {
    Admission::Refuse(Refusal {
        code,
        reason,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, phase: NodePhase, digest: Option<&str>) -> NodeTargetStatus {
        NodeTargetStatus {
            namespace: "serving".into(),
            name: name.into(),
            revision: 3,
            class: "cpu-x86".into(),
            phase,
            artifact_digest: digest.map(str::to_string),
            engine: Some("tract".into()),
            ..Default::default()
        }
    }

    fn refusal(v: Admission) -> Refusal {
        match v {
            Admission::Refuse(r) => r,
            Admission::Mount(m) => panic!("mounted {m:?}"),
        }
    }

    #[test]
    fn only_a_ready_or_degraded_row_mounts_and_by_its_digest() {
        for phase in [NodePhase::Ready, NodePhase::Degraded] {
            let rows = [
                row("other", NodePhase::Ready, Some("d0")),
                row("m", phase, Some("d3")),
            ];
            let v = admit("n1", "serving", "m", Some(&rows[..]));
            assert_eq!(
                v,
                Admission::Mount(Serving {
                    revision: 3,
                    class: "cpu-x86".into(),
                    digest: "d3".into(),
                    engine: Some("tract".into()),
                    phase,
                })
            );
        }
    }

    #[test]
    fn every_other_phase_is_refused_with_what_and_where() {
        for phase in [
            NodePhase::Pending,
            NodePhase::Pulling,
            NodePhase::Loading,
            NodePhase::Warming,
        ] {
            let rows = [row("m", phase, Some("d3"))];
            let r = refusal(admit("n1", "serving", "m", Some(&rows[..])));
            assert_eq!(r.code, tonic::Code::FailedPrecondition);
            assert_eq!(
                r.message,
                format!(
                    "CompiledTarget serving/m is {phase:?} on node n1 (revision 3): not mounted \
                     until it is Ready"
                )
            );
        }
        let mut failed = row("m", NodePhase::Failed, None);
        failed.reason = Some(kiln_crds::FailureReason::ParityExceeded);
        failed.message = Some("output y off by 0.5".into());
        let r = refusal(admit("n1", "serving", "m", Some(&[failed][..])));
        assert_eq!(r.reason, "Failed");
        assert!(
            r.message
                .contains("is Failed on node n1 (revision 3): ParityExceeded: output y off"),
            "{}",
            r.message
        );
        let r = refusal(admit(
            "n1",
            "serving",
            "m",
            Some(&[row("m", NodePhase::Ready, None)][..]),
        ));
        assert_eq!(r.reason, "NoDigest");
    }

    #[test]
    fn a_target_is_looked_up_in_the_pods_namespace_only() {
        let mut elsewhere = row("m", NodePhase::Ready, Some("d3"));
        elsewhere.namespace = "other".into();
        let r = refusal(admit("n1", "serving", "m", Some(&[elsewhere][..])));
        assert_eq!(r.reason, "NotOnNode");
        assert!(r.message.contains("has no row on node n1"), "{}", r.message);
        let r = refusal(admit("n1", "serving", "m", None));
        assert_eq!((r.code, r.reason), (tonic::Code::Unavailable, "NoKilnNode"));
    }
}
