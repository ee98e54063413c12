//! Node readiness: what each selected node's KilnNode rows say about one target, aggregated per
//! class (ready, failed, first failing nodes, most common reason), the readiness label each node
//! should carry, and which labels belong to no target any more. Pure: rows in, decisions out.

use std::collections::{BTreeMap, BTreeSet};

use kiln_crds::FailureReason;
use kiln_crds::kiln_node::{NodePhase, NodeTargetStatus};
use kiln_crds::labels::is_ready_label;

use crate::plan::classes::{Class, LabelChange, NodeView};

/// How many failing node names a class row lists.
pub const FAILING_NODES_SHOWN: usize = 5;

/// What one node's agent reports for the target.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeState {
    /// Verified, loaded and warmed the current revision with its own class's artifact.
    Ready,
    /// Serves something other than what was asked (the previous known-good revision or another
    /// class's artifact) because the current one failed.
    Fallback {
        reason: Option<FailureReason>,
        message: String,
    },
    /// Serves nothing: the artifact failed (fail-closed).
    Failed {
        reason: Option<FailureReason>,
        message: String,
    },
    /// Pending, pulling, loading or warming; or still on an older revision it has not moved on
    /// from yet.
    Progressing,
    /// No row for this target: no agent, or the agent has not seen the target yet.
    Unreported,
}

/// One node's state and the revision it serves (the readiness label's value), if any.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeReport {
    /// State.
    pub state: NodeState,
    /// Revision the node serves now.
    pub serves: Option<i64>,
}

/// Reads a node's rows for the target. `current` is the revision nodes should serve; `class` the
/// node's class id when known (a row reporting another class's artifact is a fallback, whatever
/// its phase).
pub fn report(rows: &[NodeTargetStatus], current: Option<i64>, class: Option<&str>) -> NodeReport {
    let own_class = |r: &NodeTargetStatus| r.class.is_empty() || class.is_none_or(|c| r.class == c);
    let serving = |r: &&NodeTargetStatus| matches!(r.phase, NodePhase::Ready | NodePhase::Degraded);
    let is_current = |r: &NodeTargetStatus| Some(r.revision) == current;
    if rows
        .iter()
        .any(|r| r.phase == NodePhase::Ready && is_current(r) && own_class(r))
    {
        return NodeReport {
            state: NodeState::Ready,
            serves: current,
        };
    }
    let serves = rows.iter().filter(serving).map(|r| r.revision).max();
    let why = |r: &NodeTargetStatus| (r.reason, r.message.clone().unwrap_or_default());
    let failed = rows
        .iter()
        .filter(|r| r.phase == NodePhase::Failed)
        .max_by_key(|r| (is_current(r), r.revision));
    let fallback = rows
        .iter()
        .find(|r| r.phase == NodePhase::Degraded || (r.phase == NodePhase::Ready && !own_class(r)));
    let state = if let Some(r) = fallback {
        // The Degraded row says why, or the Failed row for the revision asked for does.
        let (reason, message) = match (r.reason, failed) {
            (None, Some(f)) => why(f),
            _ => why(r),
        };
        NodeState::Fallback { reason, message }
    } else if let Some(f) = failed.filter(|f| is_current(f) || !rows.iter().any(is_current)) {
        let (reason, message) = why(f);
        if serves.is_some() {
            NodeState::Fallback { reason, message }
        } else {
            NodeState::Failed { reason, message }
        }
    } else if rows.is_empty() {
        NodeState::Unreported
    } else {
        NodeState::Progressing
    };
    NodeReport { state, serves }
}

/// A class's node counts, as they go into its status row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassNodes {
    /// Nodes ready on the current revision.
    pub ready: usize,
    /// Nodes failed or serving a fallback.
    pub failed: usize,
    /// Nodes serving a fallback.
    pub fallback: usize,
    /// Nodes still working (or not reporting).
    pub waiting: usize,
    /// Nodes with no row for the target.
    pub unreported: usize,
    /// First failing nodes, sorted.
    pub failing: Vec<String>,
    /// Most common failure reason among the failing nodes (ties: the first in the enum's order).
    pub reason: Option<FailureReason>,
    /// The first failing node with that reason, and what it said.
    pub example: Option<FailingNode>,
}

/// A failing node and what its agent said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FailingNode {
    /// Node name.
    pub node: String,
    /// The agent's message.
    pub message: String,
}

impl ClassNodes {
    /// Whether `percent` of the class's `total` nodes are ready.
    pub fn meets(&self, percent: u32, total: usize) -> bool {
        total > 0 && self.ready * 100 >= percent as usize * total
    }
}

/// Aggregates the reports of a class's nodes.
pub fn aggregate(class: &Class, reports: &BTreeMap<String, NodeReport>) -> ClassNodes {
    let mut out = ClassNodes::default();
    let mut reasons: BTreeMap<FailureReason, usize> = BTreeMap::new();
    let mut failing: Vec<(&str, Option<FailureReason>, &str)> = Vec::new();
    for node in &class.nodes {
        let Some(r) = reports.get(node) else {
            out.waiting += 1;
            out.unreported += 1;
            continue;
        };
        match &r.state {
            NodeState::Ready => out.ready += 1,
            NodeState::Progressing => out.waiting += 1,
            NodeState::Unreported => {
                out.waiting += 1;
                out.unreported += 1;
            }
            NodeState::Fallback { reason, message } | NodeState::Failed { reason, message } => {
                out.failed += 1;
                if matches!(r.state, NodeState::Fallback { .. }) {
                    out.fallback += 1;
                }
                if let Some(reason) = reason {
                    *reasons.entry(*reason).or_default() += 1;
                }
                failing.push((node, *reason, message));
            }
        }
    }
    // Class nodes are sorted, so `failing` is too.
    out.failing = failing
        .iter()
        .take(FAILING_NODES_SHOWN)
        .map(|(n, _, _)| (*n).to_string())
        .collect();
    let top = reasons.values().copied().max().unwrap_or(0);
    out.reason = reasons.into_iter().find(|(_, n)| *n == top).map(|(r, _)| r);
    out.example = failing
        .iter()
        .find(|(_, r, _)| *r == out.reason)
        .map(|(n, _, m)| FailingNode {
            node: (*n).to_string(),
            message: (*m).to_string(),
        });
    out
}

/// Readiness label changes for one target: the served revision to set, `None` to remove.
/// Selected nodes carry the label while they serve a revision; every other node loses it.
pub fn label_changes(
    key: &str,
    nodes: &[NodeView],
    reports: &BTreeMap<String, NodeReport>,
) -> Vec<LabelChange> {
    let mut out = Vec::new();
    for node in nodes {
        let want = reports
            .get(&node.name)
            .and_then(|r| r.serves)
            .map(|r| r.to_string());
        if node.labels.get(key) != want.as_ref() {
            out.push(LabelChange {
                node: node.name.clone(),
                key: key.to_string(),
                value: want,
            });
        }
    }
    out
}

/// Readiness labels on `nodes` whose key is none of `live` (their target is gone), to remove.
pub fn stale_labels(nodes: &[NodeView], live: &BTreeSet<String>) -> Vec<LabelChange> {
    nodes
        .iter()
        .flat_map(|n| {
            n.labels
                .keys()
                .filter(|k| is_ready_label(k) && !live.contains(*k))
                .map(|k| LabelChange {
                    node: n.name.clone(),
                    key: k.clone(),
                    value: None,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(revision: i64, phase: NodePhase, reason: Option<FailureReason>) -> NodeTargetStatus {
        NodeTargetStatus {
            namespace: "ml".into(),
            name: "t".into(),
            revision,
            class: "c".into(),
            phase,
            reason,
            message: reason.map(|r| format!("{} here", r.as_str())),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_is_ready_only_on_the_current_revision_with_its_own_class() {
        let ready = report(&[row(2, NodePhase::Ready, None)], Some(2), Some("c"));
        assert_eq!((ready.state, ready.serves), (NodeState::Ready, Some(2)));
        // Still on revision 1 while 2 is pulled: serving 1, progressing, not a fallback.
        let rolling = report(
            &[
                row(1, NodePhase::Ready, None),
                row(2, NodePhase::Pulling, None),
            ],
            Some(2),
            Some("c"),
        );
        assert_eq!(
            (rolling.state, rolling.serves),
            (NodeState::Progressing, Some(1))
        );
        let mut other = row(2, NodePhase::Ready, None);
        other.class = "cpu".into();
        let r = report(&[other], Some(2), Some("c"));
        assert!(matches!(r.state, NodeState::Fallback { .. }) && r.serves == Some(2));
    }

    #[test]
    fn failures_are_fail_closed_or_fallback_with_their_reason() {
        let closed = report(
            &[row(2, NodePhase::Failed, Some(FailureReason::HashMismatch))],
            Some(2),
            Some("c"),
        );
        assert_eq!(closed.serves, None);
        assert!(matches!(
            closed.state,
            NodeState::Failed {
                reason: Some(FailureReason::HashMismatch),
                ..
            }
        ));
        // PreviousKnownGood: the agent reports the revision it serves as Degraded.
        let kept = report(
            &[row(
                1,
                NodePhase::Degraded,
                Some(FailureReason::ParityExceeded),
            )],
            Some(2),
            Some("c"),
        );
        assert_eq!(kept.serves, Some(1));
        assert!(matches!(
            kept.state,
            NodeState::Fallback {
                reason: Some(FailureReason::ParityExceeded),
                ..
            }
        ));
        assert_eq!(report(&[], Some(2), Some("c")).state, NodeState::Unreported);
    }

    #[test]
    fn aggregation_counts_and_picks_the_most_common_reason() {
        let class = Class {
            id: "c".into(),
            facts: Default::default(),
            nodes: (0..8).map(|i| format!("n{i}")).collect(),
        };
        let fail = |r| NodeReport {
            state: NodeState::Failed {
                reason: Some(r),
                message: "m".into(),
            },
            serves: None,
        };
        let mut reports = BTreeMap::new();
        reports.insert("n0".to_string(), fail(FailureReason::ParityExceeded));
        for n in ["n1", "n2", "n4", "n5", "n6"] {
            reports.insert(n.to_string(), fail(FailureReason::HashMismatch));
        }
        reports.insert(
            "n3".to_string(),
            NodeReport {
                state: NodeState::Ready,
                serves: Some(1),
            },
        );
        let a = aggregate(&class, &reports);
        assert_eq!((a.ready, a.failed, a.waiting), (1, 6, 1));
        assert_eq!(a.failing, ["n0", "n1", "n2", "n4", "n5"]);
        assert_eq!(a.reason, Some(FailureReason::HashMismatch));
        assert_eq!(a.example.as_ref().map(|e| e.node.as_str()), Some("n1"));
        assert!(a.meets(12, 8) && !a.meets(13, 8));
    }
}
