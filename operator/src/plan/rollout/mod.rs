//! Stage 5: what the selected nodes report for the current revision. Per class: node counts,
//! and the class phase once its artifact is stored; per node: the target's readiness label;
//! overall: how far the rollout is from its threshold. Reads the node views (with the agents'
//! rows for this target) and the class rows; never the Jobs. Pure.

pub mod reports;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::compiled_target::{AutoRollback, ClassPhase, ClassStatus, Revision, Rollout};

use crate::plan::classes::selector_matches;
use crate::plan::keyed::Keyed;
use crate::plan::{Inputs, LabelChange};
use reports::{ClassNodes, NodeReport};

/// A class short of `rollout.promoteAtReadyPercent` ready nodes.
pub struct Unmet {
    /// Class id.
    pub class: String,
    /// Its node counts.
    pub nodes: ClassNodes,
    /// Nodes in the class.
    pub total: usize,
}

/// The rollout across classes.
#[derive(Default)]
pub struct Summary {
    /// Nodes ready on the current revision.
    pub ready_nodes: usize,
    /// Nodes in some class.
    pub selected: usize,
    /// Nodes serving a fallback.
    pub fallbacks: usize,
    /// Nodes of unmet classes still working (or not reporting).
    pub waiting: usize,
    /// Classes short of the threshold, in class order.
    pub unmet: Vec<Unmet>,
}

/// What every node the target selects reports for it, keyed by node name. With classes, a row
/// is read against its node's class (another class's artifact is a fallback).
pub fn node_reports(
    inputs: &Inputs<'_>,
    classes: Option<&[Keyed]>,
    current: Option<i64>,
) -> BTreeMap<String, NodeReport> {
    let view = |name: &str| inputs.nodes.iter().find(|n| n.name == name);
    match classes {
        Some(classes) => classes
            .iter()
            .flat_map(|k| k.class.nodes.iter().map(move |n| (n, k.class.id.as_str())))
            .filter_map(|(n, class)| {
                let rows = &view(n)?.targets;
                Some((n.clone(), reports::report(rows, current, Some(class))))
            })
            .collect(),
        None => inputs
            .nodes
            .iter()
            .filter(|n| {
                inputs
                    .target
                    .spec
                    .node_selector
                    .as_ref()
                    .is_none_or(|s| selector_matches(s, &n.labels))
            })
            .map(|n| (n.name.clone(), reports::report(&n.targets, current, None)))
            .collect(),
    }
}

/// The target's readiness label on every node: the served revision where a node serves one.
pub fn readiness_labels(
    inputs: &Inputs<'_>,
    reports: &BTreeMap<String, NodeReport>,
) -> Vec<LabelChange> {
    let t = &inputs.target.metadata;
    let key = kiln_crds::labels::ready_label(
        t.namespace.as_deref().unwrap_or_default(),
        t.name.as_deref().unwrap_or_default(),
    );
    reports::label_changes(&key, inputs.nodes, reports)
}

/// The rows with their node counts (and, for stored artifacts, phases), and the summary.
pub fn assess(
    rows: Vec<ClassStatus>,
    keyed: &[Keyed],
    reports: &BTreeMap<String, NodeReport>,
    percent: u32,
) -> (Vec<ClassStatus>, Summary) {
    let mut summary = Summary::default();
    let rows = rows
        .into_iter()
        .zip(keyed)
        .map(|(mut row, k)| {
            let a = reports::aggregate(&k.class, reports);
            let n = k.class.nodes.len();
            row.ready_nodes = i32::try_from(a.ready).unwrap_or(i32::MAX);
            row.failed_nodes = i32::try_from(a.failed).unwrap_or(i32::MAX);
            row.failing_nodes = a.failing.clone();
            summary.ready_nodes += a.ready;
            summary.selected += n;
            summary.fallbacks += a.fallback;
            let meets = a.meets(percent, n);
            if row.artifact_digest.is_some() {
                row.phase = class_phase(&a, n, meets);
                if a.failed > 0 {
                    row.reason = a.reason;
                    row.message = Some(failing_message(&a, n));
                }
            }
            if !meets {
                summary.waiting += a.waiting;
                summary.unmet.push(Unmet {
                    class: row.class.clone(),
                    nodes: a,
                    total: n,
                });
            }
            row
        })
        .collect();
    (rows, summary)
}

/// The phase of a class whose artifact is stored, from its `total` nodes' counts.
pub fn class_phase(a: &ClassNodes, total: usize, meets: bool) -> ClassPhase {
    if meets {
        ClassPhase::Ready
    } else if a.fallback > 0 {
        ClassPhase::Degraded
    } else if a.failed > 0 && a.waiting == 0 {
        ClassPhase::Failing
    } else if a.unreported == total {
        ClassPhase::Compiled
    } else {
        ClassPhase::Warming
    }
}

/// "3 of 4 node(s) failing (a, b, c): HashMismatch on a: <message>".
pub fn failing_message(a: &ClassNodes, total: usize) -> String {
    let (node, said) = a
        .example
        .as_ref()
        .map_or(("", ""), |e| (e.node.as_str(), e.message.as_str()));
    format!(
        "{} of {total} node(s) failing ({}): {} on {node}: {said}",
        a.failed,
        a.failing.join(", "),
        a.reason.map_or("unknown reason", |r| r.as_str()),
    )
}

/// `rollout.autoRollback`: the record to keep or make. `old` is the current record; `revisions`
/// the history after this pass's recording. A record holds while its failed revision is still
/// the newest and its known-good one is still listed; a new one is made when the newest
/// revision, never known-good, failed on a node of some class (the node's row is about that
/// revision and says Failed or serves a fallback) and an older revision is known-good. None
/// with the option off or a listed pin (the pin wins).
pub fn auto_rollback(
    spec: &Rollout,
    old: Option<&AutoRollback>,
    revisions: &[Revision],
    inputs: &Inputs<'_>,
    classes: &[Keyed],
    now: &Time,
) -> Option<AutoRollback> {
    let pinned = spec
        .pinned_revision
        .is_some_and(|p| revisions.iter().any(|r| r.number == p));
    if !spec.auto_rollback || pinned {
        return None;
    }
    let newest = revisions.last()?;
    let good = |n: i64| revisions.iter().any(|r| r.number == n && r.known_good);
    if let Some(old) = old
        && old.from_revision == newest.number
        && good(old.to_revision)
    {
        return Some(old.clone());
    }
    if newest.known_good {
        return None;
    }
    let to = revisions
        .iter()
        .rev()
        .find(|r| r.known_good && r.number < newest.number)?;
    let n = newest.number;
    let about_newest = |rows: &[kiln_crds::kiln_node::NodeTargetStatus]| {
        rows.iter()
            .any(|r| r.revision == n || r.desired_revision == Some(n))
    };
    // The same reports the rollout reads, kept only for nodes whose rows are about the newest
    // revision (a failure of an older one is no verdict on it).
    let mut reports = node_reports(inputs, Some(classes), Some(n));
    reports.retain(|node, _| {
        inputs
            .nodes
            .iter()
            .find(|v| &v.name == node)
            .is_some_and(|v| about_newest(&v.targets))
    });
    classes.iter().find_map(|k| {
        let a = reports::aggregate(&k.class, &reports);
        (a.failed > 0).then(|| AutoRollback {
            from_revision: n,
            to_revision: to.number,
            class: k.class.id.clone(),
            reason: a.reason,
            message: failing_message(&a, k.class.nodes.len()),
            at: Some(now.clone()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_class_is_ready_degraded_failing_compiled_or_warming_in_that_order() {
        let counts = |ready, failed, fallback, waiting, unreported| ClassNodes {
            ready,
            failed,
            fallback,
            waiting,
            unreported,
            ..Default::default()
        };
        // Ready wins over a fallback elsewhere in the class.
        let a = counts(3, 1, 1, 0, 0);
        assert_eq!(class_phase(&a, 4, a.meets(75, 4)), ClassPhase::Ready);
        assert_eq!(class_phase(&a, 4, a.meets(100, 4)), ClassPhase::Degraded);
        // Failed and nobody still working: Failing; someone still working: Warming.
        assert_eq!(
            class_phase(&counts(1, 1, 0, 0, 0), 2, false),
            ClassPhase::Failing
        );
        assert_eq!(
            class_phase(&counts(0, 1, 0, 1, 0), 2, false),
            ClassPhase::Warming
        );
        // No node reported: Compiled (the artifact exists, nothing more is known).
        assert_eq!(
            class_phase(&counts(0, 0, 0, 2, 2), 2, false),
            ClassPhase::Compiled
        );
    }
}
