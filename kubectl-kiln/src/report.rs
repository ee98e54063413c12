//! What each subcommand says, from the objects the cluster holds: a CompiledTarget, the
//! KilnNodes (every node's agent rows) and Events. Pure: objects in, reports out; `main` reads
//! the API and prints.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::compiled_target::{ClassPhase, FallbackPolicy};
use kiln_crds::conditions::{DEGRADED, READY, STALLED};
use kiln_crds::kiln_node::{NodePhase, NodeTargetStatus};
use kiln_crds::{CompiledTarget, FailureReason, KilnNode};
use serde::Serialize;

/// `kubectl kiln status`: the target, its classes, and every node's row for it.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Whether the target's `Ready` condition is True for its current generation.
    pub ready: bool,
    /// The `Ready` condition's reason and message, or why there is none.
    pub summary: String,
    /// The revision nodes should serve.
    pub revision: Option<i64>,
    /// `spec.rollout.pinnedRevision`.
    pub pinned_revision: Option<i64>,
    /// `status.autoRollback`: the newest revision failed, a known-good one is served.
    pub auto_rollback: Option<kiln_crds::compiled_target::AutoRollback>,
    /// One row per class.
    pub classes: Vec<ClassRow>,
    /// One row per node that reports on the target.
    pub nodes: Vec<NodeRow>,
}

/// One class of the target.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassRow {
    /// Class id.
    pub class: String,
    /// Phase.
    pub phase: ClassPhase,
    /// Nodes in the class.
    pub nodes: i32,
    /// Nodes serving the current revision.
    pub ready_nodes: i32,
    /// Nodes failing it.
    pub failed_nodes: i32,
    /// Failure reason.
    pub reason: Option<FailureReason>,
    /// Message.
    pub message: Option<String>,
    /// The engine the class's artifact runs on.
    pub engine: Option<String>,
    /// `backend.kind: auto`: why the compile kept it.
    pub engine_reason: Option<String>,
}

/// One node's row for the target.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// Node name.
    pub node: String,
    /// Class whose artifact the node uses.
    pub class: String,
    /// Phase.
    pub phase: NodePhase,
    /// Revision served (or being prepared).
    pub revision: i64,
    /// The revision the target asks for, when the node serves another.
    pub desired_revision: Option<i64>,
    /// The fallback policy applied.
    pub fallback: Option<FallbackPolicy>,
    /// Failure reason.
    pub reason: Option<FailureReason>,
    /// Message.
    pub message: Option<String>,
    /// Largest absolute parity error of the warmup.
    pub parity_max_abs_error: Option<f64>,
    /// Seconds to load.
    pub load_seconds: Option<f64>,
    /// Seconds of warmup.
    pub warmup_seconds: Option<f64>,
    /// Steady p50 of the warmup, seconds.
    pub p50_seconds: Option<f64>,
    /// Host memory the engine added at its peak in load and warmup, bytes.
    pub peak_memory_bytes: Option<i64>,
    /// GPU memory the agent's process held at its peak in load and warmup, bytes (absent
    /// where the node measured none).
    pub peak_device_memory_bytes: Option<i64>,
    /// A language model's time to first token and decode rate (warmup medians, the first
    /// request after Ready apart).
    pub generation: Option<kiln_crds::llamacpp::Generation>,
}

/// The target's rows on every node, by node name.
pub fn rows<'a>(
    target: &CompiledTarget,
    nodes: &'a [KilnNode],
) -> Vec<(String, &'a NodeTargetStatus)> {
    let (ns, name) = key(target);
    let mut rows: Vec<(String, &NodeTargetStatus)> = nodes
        .iter()
        .flat_map(|n| {
            let node = n.metadata.name.clone().unwrap_or_default();
            n.status
                .iter()
                .flat_map(|s| s.targets.iter())
                .filter(|r| r.namespace == ns && r.name == name)
                .map(move |r| (node.clone(), r))
        })
        .collect();
    rows.sort_by(|a, b| (&a.0, &a.1.class).cmp(&(&b.0, &b.1.class)));
    rows
}

fn key(target: &CompiledTarget) -> (String, String) {
    (
        target.metadata.namespace.clone().unwrap_or_default(),
        target.metadata.name.clone().unwrap_or_default(),
    )
}

/// The condition `type_` of the target, when it describes the current generation.
fn condition<'a>(
    target: &'a CompiledTarget,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let generation = target.metadata.generation;
    target
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .filter(|c| generation.is_none() || c.observed_generation == generation)
}

/// Whether the target is Ready for its current generation.
pub fn is_ready(target: &CompiledTarget) -> bool {
    condition(target, READY).is_some_and(|c| c.status == "True")
}

/// `kubectl kiln status`.
pub fn status(target: &CompiledTarget, nodes: &[KilnNode]) -> Status {
    let (namespace, name) = key(target);
    let st = target.status.clone().unwrap_or_default();
    let summary = match condition(target, READY) {
        Some(c) => format!("{}: {}", c.reason, c.message),
        None if target.status.is_none() => "no status yet: is kiln-operator running?".into(),
        None => "the operator has not observed the current generation yet".into(),
    };
    Status {
        namespace,
        name,
        ready: is_ready(target),
        summary,
        revision: st.revision,
        pinned_revision: target.spec.rollout.pinned_revision,
        auto_rollback: target.status.as_ref().and_then(|s| s.auto_rollback.clone()),
        classes: st
            .classes
            .iter()
            .map(|c| ClassRow {
                class: c.class.clone(),
                phase: c.phase,
                nodes: c.nodes,
                ready_nodes: c.ready_nodes,
                failed_nodes: c.failed_nodes,
                reason: c.reason,
                message: c.message.clone(),
                engine: c.engine.clone(),
                engine_reason: c.engine_reason.clone(),
            })
            .collect(),
        nodes: rows(target, nodes)
            .into_iter()
            .map(|(node, r)| NodeRow {
                node,
                class: r.class.clone(),
                phase: r.phase,
                revision: r.revision,
                desired_revision: r.desired_revision,
                fallback: r.fallback,
                reason: r.reason,
                message: r.message.clone(),
                parity_max_abs_error: r.figures.parity_max_abs_error,
                load_seconds: r.figures.load_seconds,
                warmup_seconds: r.figures.warmup_seconds,
                p50_seconds: r.figures.p50_seconds,
                peak_memory_bytes: r.figures.peak_memory_bytes,
                peak_device_memory_bytes: r.figures.peak_device_memory_bytes,
                generation: r.figures.generation,
            })
            .collect(),
    }
}

/// One revision in `kubectl kiln history`.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryRow {
    /// Revision number.
    pub number: i64,
    /// Target generation that produced it.
    pub generation: i64,
    /// Known-good: enough nodes passed it for it to be a fallback or a rollback.
    pub known_good: bool,
    /// Whether nodes should serve it now (the pin, else the newest).
    pub current: bool,
    /// When the operator recorded it.
    pub created_at: Option<Time>,
    /// Per class: compile key and artifact digest.
    pub artifacts: Vec<HistoryArtifact>,
    /// Nodes whose row serves it now (Ready or Degraded on it).
    pub served_by: Vec<String>,
}

/// One class's artifact of a revision.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryArtifact {
    /// Class id.
    pub class: String,
    /// Compile key.
    pub compile_key: String,
    /// Artifact digest.
    pub digest: String,
}

/// `kubectl kiln history`: newest first.
pub fn history(target: &CompiledTarget, nodes: &[KilnNode]) -> Vec<HistoryRow> {
    let st = target.status.clone().unwrap_or_default();
    let rows = rows(target, nodes);
    let mut served: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (node, r) in &rows {
        if matches!(r.phase, NodePhase::Ready | NodePhase::Degraded) {
            served.entry(r.revision).or_default().push(node.clone());
        }
    }
    let mut out: Vec<HistoryRow> = st
        .revisions
        .iter()
        .map(|r| HistoryRow {
            number: r.number,
            generation: r.generation,
            known_good: r.known_good,
            current: st.revision == Some(r.number),
            created_at: r.created_at.clone(),
            artifacts: r
                .artifacts
                .iter()
                .map(|a| HistoryArtifact {
                    class: a.class.clone(),
                    compile_key: a.compile_key.clone(),
                    digest: a.digest.clone(),
                })
                .collect(),
            served_by: served.remove(&r.number).unwrap_or_default(),
        })
        .collect();
    out.reverse();
    out
}

/// Which revision `kubectl kiln rollback` pins: `to`, else the newest known-good revision older
/// than the one nodes should serve now. `Err` says why none may be pinned.
pub fn rollback_to(target: &CompiledTarget, to: Option<i64>, force: bool) -> Result<i64, String> {
    let st = target.status.clone().unwrap_or_default();
    let listed: Vec<String> = st
        .revisions
        .iter()
        .map(|r| {
            format!(
                "{}{}",
                r.number,
                if r.known_good { " (known-good)" } else { "" }
            )
        })
        .collect();
    let listed = if listed.is_empty() {
        "none".to_string()
    } else {
        listed.join(", ")
    };
    match to {
        Some(n) => match st.revisions.iter().find(|r| r.number == n) {
            None => Err(format!(
                "revision {n} is not in the target's history (revisions: {listed})"
            )),
            Some(r) if !r.known_good && !force => Err(format!(
                "revision {n} is not known-good: no class's nodes passed it; --force pins it anyway (revisions: {listed})"
            )),
            Some(_) => Ok(n),
        },
        None => {
            let now = st.revision.ok_or_else(|| {
                "the target has no revision yet: nothing to roll back".to_string()
            })?;
            st.revisions
                .iter()
                .filter(|r| r.known_good && r.number < now)
                .map(|r| r.number)
                .max()
                .ok_or_else(|| {
                    format!(
                        "no known-good revision older than the current {now} (revisions: {listed}); name one with --to"
                    )
                })
        }
    }
}

/// Whether every node that reports on the target serves revision `n` and is Ready on it (and
/// at least one does): the end of `rollback --wait`.
pub fn serves(target: &CompiledTarget, nodes: &[KilnNode], n: i64) -> bool {
    let rows = rows(target, nodes);
    !rows.is_empty()
        && rows
            .iter()
            .all(|(_, r)| r.revision == n && r.phase == NodePhase::Ready)
}

/// An Event, as `why` shows it.
#[derive(Debug, Serialize, PartialEq, Clone)]
#[serde(rename_all = "camelCase")]
pub struct EventLine {
    /// When it last happened.
    pub time: Option<Time>,
    /// Normal or Warning.
    pub type_: String,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// `kubectl kiln why`: what is wrong, per node row or class, and the latest Events.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    /// `Node` or `CompiledTarget`, and its name.
    pub subject: String,
    /// Nothing to explain.
    pub ready: bool,
    /// One line per problem: where, the step that failed, reason and message.
    pub problems: Vec<Problem>,
    /// The newest Events about the subject, newest first.
    pub events: Vec<EventLine>,
}

/// One problem `why` found.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// Where: `node N, target ns/name` or `class C` or `condition T`.
    pub at: String,
    /// The step that failed (compile, fetch, verify, check, load, warmup, …).
    pub step: String,
    /// Reason.
    pub reason: Option<FailureReason>,
    /// What went wrong and what to fix.
    pub message: String,
}

/// The step a failure reason belongs to.
pub fn step(reason: Option<FailureReason>, phase: &str) -> String {
    use FailureReason as R;
    match reason {
        Some(R::SourceUnavailable) => "fetch the source, an asset or a fixture",
        Some(R::HashMismatch) => "verify the bytes (sha256)",
        Some(R::SignatureInvalid) => "verify the signature",
        Some(R::StoreUnavailable) => "read or write the artifact store",
        Some(R::InsufficientStorage) => "pull into the node cache (disk space)",
        Some(R::IncompatibleHardware | R::IncompatibleRuntime) => {
            "check the artifact against this node"
        }
        Some(R::UnsupportedOperator | R::CompileFailed) => "compile",
        Some(R::LoadFailed) => "load the engine",
        Some(R::WarmupFailed | R::ParityExceeded) => "warm up with the fixture (parity)",
        Some(R::TokenizerMismatch | R::ChatTemplateMismatch) => {
            "check the fixture's text against the model's tokenizer and chat template"
        }
        Some(R::LatencyBudgetExceeded) => "warm up (latency budget)",
        Some(R::MemoryBudgetExceeded) => "load and warm up (memory budget)",
        Some(R::Timeout) => "a step past its deadline",
        Some(R::EngineCrashed) => "run the engine (its process crashed)",
        Some(R::InvalidSpec) => "read the spec",
        None => return format!("phase {phase}"),
    }
    .to_string()
}

/// `why NODE`: the node's rows that do not serve what their target asks.
pub fn why_node(node: &KilnNode, events: Vec<EventLine>) -> Why {
    let name = node.metadata.name.clone().unwrap_or_default();
    let problems: Vec<Problem> = node
        .status
        .iter()
        .flat_map(|s| s.targets.iter())
        .filter(|r| r.phase != NodePhase::Ready)
        .map(|r| Problem {
            at: format!("target {}/{} revision {}", r.namespace, r.name, r.revision),
            step: step(r.reason, r.phase.as_str()),
            reason: r.reason,
            message: r.message.clone().unwrap_or_else(|| match r.phase {
                NodePhase::Degraded => format!(
                    "serving a fallback ({}) instead of revision {}",
                    r.fallback.map_or("unnamed", FallbackPolicy::as_str),
                    r.desired_revision.unwrap_or(r.revision)
                ),
                phase => phase.as_str().to_string(),
            }),
        })
        .collect();
    Why {
        subject: format!("Node {name}"),
        ready: problems.is_empty(),
        problems,
        events,
    }
}

/// `why TARGET`: its conditions that are not fine, failing classes, and failing node rows.
pub fn why_target(target: &CompiledTarget, nodes: &[KilnNode], events: Vec<EventLine>) -> Why {
    let (ns, name) = key(target);
    let mut problems = Vec::new();
    if target.status.is_none() {
        problems.push(Problem {
            at: "status".into(),
            step: "reconcile".into(),
            reason: None,
            message: "no status yet: is kiln-operator running, and does it watch this namespace?"
                .into(),
        });
    }
    for (type_, bad) in [(STALLED, "True"), (DEGRADED, "True"), (READY, "False")] {
        if let Some(c) = condition(target, type_).filter(|c| c.status == bad) {
            problems.push(Problem {
                at: format!("condition {type_}={bad}"),
                step: c.reason.clone(),
                reason: FailureReason::ALL
                    .iter()
                    .copied()
                    .find(|r| r.as_str() == c.reason),
                message: c.message.clone(),
            });
        }
    }
    for c in target.status.iter().flat_map(|s| s.classes.iter()) {
        if matches!(
            c.phase,
            ClassPhase::Failed | ClassPhase::Retrying | ClassPhase::Failing | ClassPhase::Degraded
        ) {
            let failing = if c.failing_nodes.is_empty() {
                String::new()
            } else {
                format!(" (nodes: {})", c.failing_nodes.join(", "))
            };
            problems.push(Problem {
                at: format!("class {} {}{failing}", c.class, c.phase),
                step: step(c.reason, c.phase.as_str()),
                reason: c.reason,
                message: c.message.clone().unwrap_or_default(),
            });
        }
    }
    for (node, r) in rows(target, nodes) {
        if matches!(r.phase, NodePhase::Failed | NodePhase::Degraded) {
            problems.push(Problem {
                at: format!("node {node} revision {}", r.revision),
                step: step(r.reason, r.phase.as_str()),
                reason: r.reason,
                message: r.message.clone().unwrap_or_default(),
            });
        }
    }
    Why {
        subject: format!("CompiledTarget {ns}/{name}"),
        ready: is_ready(target) && problems.is_empty(),
        problems,
        events,
    }
}

/// The newest `n` of `events`, newest first.
pub fn newest(mut events: Vec<EventLine>, n: usize) -> Vec<EventLine> {
    events.sort_by(|a, b| b.time.cmp(&a.time));
    events.truncate(n);
    events
}

/// Text tables: columns padded to the widest cell, as `kubectl get` prints.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                let pad = widths[i].saturating_sub(c.chars().count()) + 3;
                out.push_str(c);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| (*h).to_string()).collect());
    for r in rows {
        out.push_str(&line(r.clone()));
    }
    out
}

/// A digest or key shortened for tables (the full one is in `-o json`).
pub fn short(s: &str) -> String {
    let s = s.strip_prefix("sha256:").unwrap_or(s);
    s.chars().take(12).collect()
}

/// Seconds as milliseconds with two decimals, or `-`.
pub fn ms(s: Option<f64>) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{:.2}", s * 1000.0))
}

/// Bytes in decimal megabytes or gigabytes with one decimal, or `-`.
pub fn bytes(b: Option<i64>) -> String {
    match b {
        None => "-".into(),
        Some(b) if b >= 1_000_000_000 => format!("{:.1} GB", b as f64 / 1e9),
        Some(b) => format!("{:.1} MB", b as f64 / 1e6),
    }
}

/// An optional value, or `-`.
pub fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A target with `status` (YAML, indented by two), for these tests and `render`'s.
    pub(crate) fn target(status: &str) -> CompiledTarget {
        let yaml = format!(
            r#"
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {{name: t, namespace: ml, generation: 4}}
spec:
  modelRef: {{name: m}}
  backend: {{kind: tract}}
  profiles: []
  warmup: {{fixtureVersion: v1}}
status:
{status}
"#
        );
        serde_saphyr::from_str(&yaml).expect("target")
    }

    /// A status with three revisions, a failing class and a fallback.
    pub(crate) const HISTORY: &str = r#"
  revision: 3
  conditions:
    - {type: Ready, status: "False", reason: NodesFailed, message: "1 of 2 nodes failed revision 3", observedGeneration: 4, lastTransitionTime: "2026-11-23T12:00:00Z"}
    - {type: Degraded, status: "True", reason: Fallback, message: "node b serves revision 2", observedGeneration: 4, lastTransitionTime: "2026-11-23T12:00:00Z"}
  classes:
    - {class: cpu, nodes: 2, phase: Failing, readyNodes: 1, failedNodes: 1, failingNodes: [b], reason: ParityExceeded, message: "output y off by 0.5", engine: onnxruntime/cpu, engineReason: "onnxruntime/cpu kept: p50 6.100 ms; tract p50 16.000 ms (2.62x)"}
  revisions:
    - {number: 1, generation: 1, knownGood: true, createdAt: "2026-11-20T10:00:00Z", artifacts: [{class: cpu, compileKey: k1, digest: d1}]}
    - {number: 2, generation: 2, knownGood: true, artifacts: [{class: cpu, compileKey: k2, digest: d2}]}
    - {number: 3, generation: 4, knownGood: false, artifacts: [{class: cpu, compileKey: k3, digest: d3}]}
"#;

    fn node(name: &str, rows: &str) -> KilnNode {
        serde_saphyr::from_str(&format!(
            "apiVersion: kiln.dev/v1alpha1\nkind: KilnNode\nmetadata: {{name: {name}}}\nspec: {{}}\nstatus:\n  targets: {rows}\n"
        ))
        .expect("node")
    }

    /// Two nodes: `a` serves revision 3, `b` falls back to 2.
    pub(crate) fn nodes() -> Vec<KilnNode> {
        vec![
            node(
                "a",
                "[{namespace: ml, name: t, revision: 3, class: cpu, phase: Ready, loadSeconds: 0.1, peakMemoryBytes: 52428800, peakDeviceMemoryBytes: 1288490188, generation: {promptTokens: 9, generatedTokens: 8, prefillSeconds: 0.0125, decodeTokensPerSecond: 41.26, runs: 3, firstRequestPrefillSeconds: 0.5}}, {namespace: other, name: t, revision: 9, class: cpu, phase: Ready}]",
            ),
            node(
                "b",
                "[{namespace: ml, name: t, revision: 2, class: cpu, phase: Degraded, desiredRevision: 3, fallback: PreviousKnownGood, reason: ParityExceeded, message: 'revision 3: output y off by 0.5'}]",
            ),
        ]
    }

    #[test]
    fn status_is_the_targets_rows_only_and_not_ready_says_why() {
        let t = target(HISTORY);
        let s = status(&t, &nodes());
        assert!(!s.ready);
        assert_eq!(s.summary, "NodesFailed: 1 of 2 nodes failed revision 3");
        assert_eq!(s.revision, Some(3));
        let names: Vec<(&str, i64)> = s
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.revision))
            .collect();
        assert_eq!(
            names,
            [("a", 3), ("b", 2)],
            "another namespace's row is not this target's"
        );
        assert_eq!(s.nodes[1].fallback, Some(FallbackPolicy::PreviousKnownGood));
        assert_eq!(s.classes[0].phase, ClassPhase::Failing);
        assert_eq!(s.classes[0].engine.as_deref(), Some("onnxruntime/cpu"));
        // Host and GPU memory per node (shown by `render::status`); none measured is none, not 0.
        assert_eq!(s.nodes[0].peak_device_memory_bytes, Some(1288490188));
        assert_eq!(s.nodes[1].peak_device_memory_bytes, None);
    }

    #[test]
    fn a_condition_of_an_older_generation_is_not_ready() {
        let t = target(
            r#"
  conditions:
    - {type: Ready, status: "True", reason: Ready, message: ok, observedGeneration: 3, lastTransitionTime: "2026-11-23T12:00:00Z"}
"#,
        );
        assert!(!is_ready(&t), "Ready for generation 3, the spec is at 4");
    }

    #[test]
    fn history_is_newest_first_with_the_nodes_serving_each() {
        let h = history(&target(HISTORY), &nodes());
        let numbers: Vec<i64> = h.iter().map(|r| r.number).collect();
        assert_eq!(numbers, [3, 2, 1]);
        assert_eq!(h[0].served_by, ["a"]);
        assert_eq!(h[1].served_by, ["b"], "Degraded on 2 serves 2");
        assert!(h[2].served_by.is_empty());
        assert!(h[0].current && !h[1].current);
        assert!(h[2].created_at.is_some() && h[1].created_at.is_none());
    }

    #[test]
    fn rollback_picks_the_newest_older_known_good_and_refuses_what_it_must() {
        let t = target(HISTORY);
        assert_eq!(rollback_to(&t, None, false), Ok(2));
        assert_eq!(rollback_to(&t, Some(1), false), Ok(1));
        let e = rollback_to(&t, Some(3), false).expect_err("not known-good");
        assert!(e.contains("not known-good") && e.contains("--force"), "{e}");
        assert_eq!(rollback_to(&t, Some(3), true), Ok(3));
        let e = rollback_to(&t, Some(7), true).expect_err("not listed");
        assert!(
            e.contains("not in the target's history") && e.contains("1 (known-good)"),
            "{e}"
        );
        let first = target(
            "  revision: 1\n  revisions:\n    - {number: 1, knownGood: true, artifacts: []}\n",
        );
        let e = rollback_to(&first, None, false).expect_err("nothing older");
        assert!(
            e.contains("no known-good revision older than the current 1"),
            "{e}"
        );
    }

    #[test]
    fn the_fleet_serves_a_revision_when_every_row_is_ready_on_it() {
        let t = target(HISTORY);
        let mut fleet = nodes();
        assert!(!serves(&t, &fleet, 3), "b is on 2");
        fleet[1] = node(
            "b",
            "[{namespace: ml, name: t, revision: 3, class: cpu, phase: Ready}]",
        );
        assert!(serves(&t, &fleet, 3));
        assert!(!serves(&t, &fleet, 2));
        assert!(!serves(&t, &[], 3), "no node reports: not served");
    }

    #[test]
    fn why_names_the_failing_step_class_and_nodes() {
        let w = why_target(&target(HISTORY), &nodes(), Vec::new());
        assert!(!w.ready);
        let at: Vec<&str> = w.problems.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            at,
            [
                "condition Degraded=True",
                "condition Ready=False",
                "class cpu Failing (nodes: b)",
                "node b revision 2"
            ]
        );
        assert_eq!(w.problems[2].step, "warm up with the fixture (parity)");
        let n = why_node(&nodes()[1], Vec::new());
        assert_eq!(n.problems.len(), 1);
        assert_eq!(n.problems[0].at, "target ml/t revision 2");
        assert!(why_node(&nodes()[0], Vec::new()).ready);
        // A fallback without a message is named as specs and metrics name it.
        let quiet = node(
            "c",
            "[{namespace: ml, name: t, revision: 2, class: cpu, phase: Degraded, desiredRevision: 3, fallback: PreviousKnownGood}]",
        );
        assert_eq!(
            why_node(&quiet, Vec::new()).problems[0].message,
            "serving a fallback (PreviousKnownGood) instead of revision 3"
        );
    }

    #[test]
    fn tables_pad_columns() {
        let t = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(t, "A     BB\nxxx   y\nz     w\n");
    }
}
