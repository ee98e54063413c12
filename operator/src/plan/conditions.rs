//! Stage 7: which conditions follow from how the target stands. [`select`] decides each
//! condition's status, reason and message (in the order they are set, which is the order a new
//! target lists them in); [`apply`] puts them into the list, keeping transition times. Reads
//! the course of the plan and the final class rows, after admission. Pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kiln_crds::FailureReason;
use kiln_crds::compiled_target::{ClassPhase, ClassStatus};
use kiln_crds::conditions::{
    COMPILED, DEGRADED, READY, RECONCILING, STALLED, condition, reasons, upsert,
};

use super::rollout::{Summary, failing_message};

/// How the target stands: what its conditions follow from.
pub enum Course {
    /// Nothing can be compiled until the spec or the nodes change.
    Stalled {
        /// Condition reason.
        reason: &'static str,
        /// What to fix.
        message: String,
        /// What progress waits for (the Reconciling message).
        waiting: &'static str,
    },
    /// Selected nodes have no class yet; their agents report within seconds (not stalled).
    WaitingForNodeFacts {
        /// Which nodes, and what gives them a class.
        message: String,
    },
    /// Classes compile and roll out.
    Classes(Progress),
}

/// What the conditions of a target with classes read, besides the class rows.
pub struct Progress {
    /// Attempts per class.
    pub max_attempts: u32,
    /// `rollout.promoteAtReadyPercent`.
    pub percent: u32,
    /// The revision nodes should serve.
    pub current: Option<i64>,
    /// Whether any revision exists (a failed spec change still serves the previous one).
    pub has_revision: bool,
    /// The rollout.
    pub rollout: Summary,
    /// Why some selected nodes have no class yet, appended to Ready's message.
    pub awaiting_note: Option<String>,
    /// `rollout.autoRollback` serves `current` instead of the failed newest revision.
    pub rolled_back: Option<kiln_crds::compiled_target::AutoRollback>,
}

/// One condition to set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// Condition type.
    pub type_: &'static str,
    /// True or False.
    pub ok: bool,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

fn want(type_: &'static str, ok: bool, reason: &str, message: &str) -> Want {
    Want {
        type_,
        ok,
        reason: reason.to_string(),
        message: message.to_string(),
    }
}

/// kstatus: a stalled target is neither ready nor reconciling; `why` says what stopped it.
fn stalled(reason: &str, message: &str, why: &str) -> [Want; 3] {
    [
        want(READY, false, reason, message),
        want(STALLED, true, reason, message),
        want(RECONCILING, false, reason, why),
    ]
}

/// Still moving towards ready: not ready, not stalled, reconciling.
fn moving(reason: &str, message: &str) -> [Want; 3] {
    [
        want(READY, false, reason, message),
        want(STALLED, false, reason, ""),
        want(RECONCILING, true, reason, message),
    ]
}

/// The conditions to set, in order.
pub fn select(course: &Course, rows: &[ClassStatus]) -> Vec<Want> {
    let mut wants = Vec::new();
    match course {
        Course::Stalled {
            reason,
            message,
            waiting,
        } => {
            wants.extend(stalled(reason, message, waiting));
            wants.push(want(COMPILED, false, reason, message));
            wants.push(want(DEGRADED, false, reasons::AS_SPECIFIED, ""));
        }
        Course::WaitingForNodeFacts { message } => {
            let reason = reasons::WAITING_FOR_NODE_FACTS;
            wants.extend(moving(reason, message));
            wants.push(want(COMPILED, false, reason, message));
            wants.push(want(DEGRADED, false, reasons::AS_SPECIFIED, ""));
        }
        Course::Classes(p) => {
            let compiled = rows.iter().filter(|r| r.artifact_digest.is_some()).count();
            wants = if rows.iter().any(|r| r.phase == ClassPhase::Failed) {
                failed(p, rows)
            } else if compiled == rows.len() {
                rolling_out(p, rows.len())
            } else {
                compiling(p, rows, compiled)
            };
            // Nodes without a class yet do not hold the classified ones back; Ready names them.
            if let Some(note) = &p.awaiting_note
                && let Some(ready) = wants.iter_mut().find(|w| w.type_ == READY)
            {
                ready.message = format!("{}; {note}", ready.message);
            }
        }
    }
    wants
}

/// Degraded: nodes serving a fallback, or as specified.
fn degraded(p: &Progress) -> Want {
    let fallbacks = p.rollout.fallbacks;
    if fallbacks == 0 {
        return want(DEGRADED, false, reasons::AS_SPECIFIED, "");
    }
    let message = format!(
        "{fallbacks} node(s) serve a fallback instead of revision {}",
        p.current.unwrap_or_default()
    );
    want(DEGRADED, true, reasons::FALLBACK, &message)
}

/// Some class exhausted its compile attempts: Stalled with the first one's reason.
fn failed(p: &Progress, rows: &[ClassStatus]) -> Vec<Want> {
    let failed: Vec<&ClassStatus> = rows
        .iter()
        .filter(|r| r.phase == ClassPhase::Failed)
        .collect();
    let Some(first) = failed.first() else {
        return Vec::new();
    };
    let reason = first
        .reason
        .unwrap_or(FailureReason::CompileFailed)
        .as_str();
    let message = format!(
        "{} of {} class(es) failed after {} attempt(s); {}: {}: {}. Fix the cause, then change the spec or set annotation kiln.dev/retry to a new value",
        failed.len(),
        rows.len(),
        p.max_attempts,
        first.class,
        reason,
        first.message.as_deref().unwrap_or("no message")
    );
    let mut wants = Vec::from(stalled(
        reason,
        &message,
        "stopped: compile attempts exhausted",
    ));
    wants.push(want(COMPILED, false, reason, &message));
    wants.push(if p.has_revision {
        want(
            DEGRADED,
            true,
            reasons::PREVIOUS_REVISION,
            "serving the previous revision; the current spec does not compile",
        )
    } else {
        degraded(p)
    });
    wants
}

/// Every class compiled: Ready once each meets the threshold; until then warming, or stalled
/// when every node has settled and too few are ready. Rolled back automatically: stalled and
/// degraded, whatever the known-good revision does, since the spec's revision failed.
fn rolling_out(p: &Progress, total: usize) -> Vec<Want> {
    if let Some(back) = &p.rolled_back {
        return auto_rolled_back(p, back, total);
    }
    let r = &p.rollout;
    let revision = p.current.unwrap_or_default();
    let mut wants = vec![
        want(
            COMPILED,
            true,
            reasons::COMPILED,
            &format!("{total} class(es) compiled; revision {revision}"),
        ),
        degraded(p),
    ];
    let summary = format!(
        "revision {revision} ready on {} of {} node(s); each class needs {}%",
        r.ready_nodes, r.selected, p.percent
    );
    if r.unmet.is_empty() {
        wants.extend([
            want(READY, true, reasons::READY, &summary),
            want(STALLED, false, reasons::READY, ""),
            want(RECONCILING, false, reasons::READY, ""),
        ]);
        return wants;
    }
    let detail: Vec<String> = r
        .unmet
        .iter()
        .take(3)
        .map(|u| {
            let mut s = format!("{}: {} of {} ready", u.class, u.nodes.ready, u.total);
            if u.nodes.failed > 0 {
                s = format!("{s}, {}", failing_message(&u.nodes, u.total));
            }
            s
        })
        .collect();
    let message = format!("{summary}; {}", detail.join("; "));
    if r.waiting > 0 {
        // Still moving: agents pulling, loading, warming, or not reporting yet.
        let reason = if r.unmet.iter().all(|u| u.nodes.unreported == u.total) {
            reasons::WAITING_FOR_NODES
        } else {
            reasons::WARMING
        };
        wants.extend(moving(reason, &message));
    } else {
        // Every node has settled and too few are ready: nothing changes until someone acts.
        let reason = top_node_reason(p);
        wants.extend(stalled(
            reason,
            &message,
            "stopped: nodes failed the artifact",
        ));
    }
    wants
}

/// Rolled back by `rollout.autoRollback`: not Ready (the revision the spec produced failed),
/// Stalled (nothing changes until the spec or the model does), Degraded with the failure.
fn auto_rolled_back(
    p: &Progress,
    back: &kiln_crds::compiled_target::AutoRollback,
    total: usize,
) -> Vec<Want> {
    let r = &p.rollout;
    let reason = reasons::AUTO_ROLLED_BACK;
    let message = format!(
        "revision {} failed on class {} ({}: {}); rolled back to known-good revision {}, ready on {} of {} node(s). Fix the cause and change the spec or the model (a new revision), or pin a revision",
        back.from_revision,
        back.class,
        back.reason.map_or("unknown reason", |x| x.as_str()),
        back.message,
        back.to_revision,
        r.ready_nodes,
        r.selected
    );
    let mut wants = vec![
        want(
            COMPILED,
            true,
            reasons::COMPILED,
            &format!(
                "{total} class(es) compiled; revision {}",
                back.from_revision
            ),
        ),
        want(DEGRADED, true, reason, &message),
    ];
    wants.extend(stalled(
        reason,
        &message,
        "stopped: rolled back to a known-good revision",
    ));
    wants
}

/// The failure reason most failing nodes of unmet classes share (ties: the first in the enum's
/// order), else `NodesFailed`.
fn top_node_reason(p: &Progress) -> &'static str {
    let mut counts: BTreeMap<FailureReason, usize> = BTreeMap::new();
    for u in &p.rollout.unmet {
        if let Some(r) = u.nodes.reason {
            *counts.entry(r).or_default() += u.nodes.failed;
        }
    }
    let top = counts.values().copied().max().unwrap_or(0);
    counts
        .iter()
        .find(|(_, n)| **n == top)
        .map_or(reasons::NODES_FAILED, |(r, _)| r.as_str())
}

/// Classes still compiling, retrying or queued for a slot.
fn compiling(p: &Progress, rows: &[ClassStatus], compiled: usize) -> Vec<Want> {
    let total = rows.len();
    let named = |phase: ClassPhase| -> Vec<&str> {
        rows.iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.class.as_str())
            .collect()
    };
    let (compiling, queued) = (named(ClassPhase::Compiling), named(ClassPhase::Queued));
    let progress = format!("{compiled} of {total} class(es) compiled");
    let (reason, message) = if let Some(r) = rows.iter().find(|r| r.phase == ClassPhase::Retrying) {
        let message = format!(
            "{progress}; {} retrying after attempt {}/{} failed: {}: {}",
            r.class,
            r.attempts,
            p.max_attempts,
            r.reason.unwrap_or(FailureReason::CompileFailed).as_str(),
            r.message.as_deref().unwrap_or("")
        );
        (reasons::RETRYING, message)
    } else if compiling.is_empty() {
        let why = rows
            .iter()
            .find_map(|c| c.message.clone().filter(|_| c.phase == ClassPhase::Queued))
            .unwrap_or_default();
        let message = format!("{progress}; {} queued: {why}", queued.join(", "));
        (reasons::QUEUED, message)
    } else {
        let waiting = if queued.is_empty() {
            String::new()
        } else {
            format!("; queued (compile slots full): {}", queued.join(", "))
        };
        let message = format!("{progress}; compiling {}{waiting}", compiling.join(", "));
        (reasons::COMPILING, message)
    };
    let mut wants = Vec::from(moving(reason, &message));
    wants.push(want(COMPILED, false, reason, &message));
    wants.push(degraded(p));
    wants
}

/// `conditions` with `wants` set, in order (a condition keeps its transition time while its
/// status stays).
pub fn apply(
    mut conditions: Vec<Condition>,
    wants: Vec<Want>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    for w in wants {
        let new = condition(w.type_, w.ok, &w.reason, w.message, generation, now.clone());
        upsert(&mut conditions, new);
    }
    conditions
}

/// The status to record when the artifact store cannot be read, so nothing can be decided:
/// `Reconciling=True` with reason `StoreUnavailable` and what failed; every other condition and
/// field stays as it was (nodes keep serving what they verified). The next reconcile that reads
/// the store replaces it with the plan's own.
pub fn store_unreachable(
    old: &kiln_crds::CompiledTargetStatus,
    error: &str,
    generation: Option<i64>,
    now: &Time,
) -> kiln_crds::CompiledTargetStatus {
    let message = format!(
        "cannot read the artifact store, so nothing is compiled, reused or rolled out until it \
         answers (retried every 15 s): {error}"
    );
    let mut status = old.clone();
    upsert(
        &mut status.conditions,
        condition(
            RECONCILING,
            true,
            FailureReason::StoreUnavailable.as_str(),
            message,
            generation,
            now.clone(),
        ),
    );
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::rollout::Unmet;
    use crate::plan::rollout::reports::ClassNodes;

    #[test]
    fn an_unreadable_store_is_said_and_nothing_else_moves() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let ready = condition(
            READY,
            true,
            reasons::READY,
            "all ready",
            Some(3),
            now.clone(),
        );
        let old = kiln_crds::CompiledTargetStatus {
            revision: Some(2),
            conditions: vec![
                ready.clone(),
                condition(
                    RECONCILING,
                    false,
                    reasons::READY,
                    "done",
                    Some(3),
                    now.clone(),
                ),
            ],
            ..Default::default()
        };
        let later = Time(k8s_openapi::jiff::Timestamp::from_second(60).expect("time"));
        let new = store_unreachable(&old, "connection refused", Some(4), &later);
        assert_eq!(new.revision, Some(2));
        assert_eq!(new.conditions[0], ready, "Ready is left alone");
        let r = &new.conditions[1];
        assert_eq!((r.type_.as_str(), r.status.as_str()), (RECONCILING, "True"));
        assert_eq!(r.reason, "StoreUnavailable");
        assert!(r.message.contains("connection refused"), "{}", r.message);
        assert_eq!(r.observed_generation, Some(4));
        // The same failure again writes nothing new.
        assert_eq!(
            store_unreachable(&new, "connection refused", Some(4), &later),
            new
        );
    }

    fn progress(unmet: Vec<Unmet>, waiting: usize) -> Progress {
        Progress {
            max_attempts: 3,
            percent: 100,
            current: Some(1),
            has_revision: true,
            rollout: Summary {
                ready_nodes: 1,
                selected: 3,
                fallbacks: 0,
                waiting,
                unmet,
            },
            awaiting_note: Some("1 selected node(s) (x) have no class yet".into()),
            rolled_back: None,
        }
    }

    fn row(class: &str, phase: ClassPhase, stored: bool) -> ClassStatus {
        ClassStatus {
            class: class.into(),
            phase,
            artifact_digest: stored.then(|| "d".to_string()),
            ..Default::default()
        }
    }

    fn of<'a>(wants: &'a [Want], type_: &str) -> &'a Want {
        wants.iter().find(|w| w.type_ == type_).expect("condition")
    }

    #[test]
    fn a_failed_class_stalls_before_anything_else_and_keeps_serving_the_previous_revision() {
        let rows = [
            row("a", ClassPhase::Compiling, false),
            row("b", ClassPhase::Failed, false),
        ];
        let wants = select(&Course::Classes(progress(Vec::new(), 0)), &rows);
        let types: Vec<&str> = wants.iter().map(|w| w.type_).collect();
        assert_eq!(types, [READY, STALLED, RECONCILING, COMPILED, DEGRADED]);
        let stalled = of(&wants, STALLED);
        assert!(stalled.ok && stalled.reason == "CompileFailed");
        assert!(
            stalled
                .message
                .starts_with("1 of 2 class(es) failed after 3 attempt(s); b:")
        );
        assert_eq!(of(&wants, DEGRADED).reason, reasons::PREVIOUS_REVISION);
        assert!(
            of(&wants, READY).message.ends_with("have no class yet"),
            "awaiting note"
        );
    }

    #[test]
    fn compiled_targets_wait_warm_or_stall_on_their_nodes() {
        let unmet = |failed, unreported| Unmet {
            class: "a".into(),
            nodes: ClassNodes {
                failed,
                unreported,
                waiting: unreported,
                reason: (failed > 0).then_some(FailureReason::HashMismatch),
                ..Default::default()
            },
            total: 2,
        };
        let rows = [row("a", ClassPhase::Compiled, true)];
        let reason = |p| {
            of(&select(&Course::Classes(p), &rows), READY)
                .reason
                .clone()
        };
        assert_eq!(reason(progress(vec![unmet(0, 2)], 2)), "WaitingForNodes");
        assert_eq!(reason(progress(vec![unmet(1, 1)], 1)), "Warming");
        // Every node settled: the nodes' own reason, Stalled.
        let wants = select(&Course::Classes(progress(vec![unmet(2, 0)], 0)), &rows);
        let types: Vec<&str> = wants.iter().map(|w| w.type_).collect();
        assert_eq!(types, [COMPILED, DEGRADED, READY, STALLED, RECONCILING]);
        assert_eq!(of(&wants, STALLED).reason, "HashMismatch");
        assert_eq!(reason(progress(Vec::new(), 0)), "Ready");
    }

    #[test]
    fn compiling_names_the_retrying_class_first_then_queued_alone_then_compiling() {
        let p = || Course::Classes(progress(Vec::new(), 0));
        let mut queued = row("q", ClassPhase::Queued, false);
        queued.message = Some("waiting for a compile slot".into());
        let rows = [row("c", ClassPhase::Compiling, false), queued.clone()];
        let ready = of(&select(&p(), &rows), READY).clone();
        assert_eq!(ready.reason, "Compiling");
        assert!(
            ready.message.starts_with(
                "0 of 2 class(es) compiled; compiling c; queued (compile slots full): q"
            )
        );
        let ready = of(&select(&p(), &[queued.clone()]), READY).clone();
        assert_eq!(ready.reason, "Queued");
        assert!(
            ready
                .message
                .contains("q queued: waiting for a compile slot")
        );
        let rows = [queued, row("r", ClassPhase::Retrying, false)];
        assert_eq!(of(&select(&p(), &rows), RECONCILING).reason, "Retrying");
    }
}
