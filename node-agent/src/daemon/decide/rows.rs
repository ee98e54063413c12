//! What this node reports: each target's row in its KilnNode (pending, preparing, served,
//! degraded under a fallback, failed closed) and the KilnNode status around them. Pure: the old
//! row, what happened and the time in, the new row out; no client, no disk, no clock.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::compiled_target::FallbackPolicy;
use kiln_crds::conditions::{self, READY};
use kiln_crds::kiln_node::{HardwareFacts, NodePhase, NodeTargetStatus, WarmupFigures};
use kiln_crds::{FailureReason, KilnNodeStatus};

use super::TargetKey;
use super::pick::Pick;
use kiln_engines::pipeline::warmup::WarmupReport;
use kiln_node_core::cache::KnownGood;

/// What a successful preparation measured.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The artifact that now serves.
    pub pick: Pick,
    /// Bytes pulled (0 when the cached copy re-verified).
    pub pull_bytes: u64,
    /// Seconds the pull (or re-hash) took.
    pub pull_seconds: f64,
    /// Seconds to load the engine.
    pub load_seconds: f64,
    /// The warmup measurements.
    pub warmup: WarmupReport,
    /// The engine that ran it (`None` for a re-verified artifact: nothing was loaded).
    pub engine: Option<String>,
    /// sha256 of the fixture it warmed with (a re-verified artifact: the one its pass recorded),
    /// recorded with the pass for the CSI plugin to mount.
    pub fixture_digest: Option<String>,
}

impl Prepared {
    /// A previous known-good artifact that re-verified: served again without a new load or
    /// warmup, so nothing was measured.
    pub fn reverified(entry: &KnownGood) -> Self {
        Self {
            pick: Pick {
                revision: entry.revision,
                class: entry.class.clone(),
                compile_key: entry.compile_key.clone(),
                digest: entry.digest.clone(),
                manifest_digest: String::new(),
            },
            pull_bytes: 0,
            pull_seconds: 0.0,
            load_seconds: 0.0,
            warmup: WarmupReport::default(),
            engine: None,
            fixture_digest: entry.fixture_digest.clone(),
        }
    }
}

/// Why a fallback serves: the wanted artifact and how it failed.
#[derive(Clone, Debug)]
pub struct Fallback {
    /// The artifact that failed.
    pub wanted: Pick,
    /// The policy that chose the fallback.
    pub policy: FallbackPolicy,
    /// Why the wanted artifact failed.
    pub reason: FailureReason,
    /// The failure's message.
    pub message: String,
}

/// Whether a row serves an artifact (ready, or degraded under a fallback).
pub fn serves(row: &NodeTargetStatus) -> bool {
    matches!(row.phase, NodePhase::Ready | NodePhase::Degraded)
}

/// Whether `row` already serves exactly `pick`'s artifact.
pub fn serves_same(row: &NodeTargetStatus, pick: &Pick) -> bool {
    serves(row)
        && row.revision == pick.revision
        && row.artifact_digest.as_deref() == Some(pick.digest.as_str())
}

/// The row once this node's class for the target is `class` and no longer the class of the
/// artifact `row` serves: readiness is withdrawn (the engine was proved for other hardware, a
/// driver or an operator decision that no longer holds) until `class`'s own artifact is warm.
/// `None` when nothing changes: the row serves nothing, serves `class`, or serves another class
/// on purpose (a `Class` fallback, which its `fallback` field records).
pub fn class_moved(
    row: &NodeTargetStatus,
    key: &TargetKey,
    class: &str,
) -> Option<NodeTargetStatus> {
    (serves(row) && row.fallback.is_none() && !row.class.is_empty() && row.class != class).then(
        || {
            pending(
                key,
                class,
                format!(
                    "this node's class changed from {} to {class}: readiness withdrawn until \
                     {class}'s artifact is verified, loaded and warm",
                    row.class
                ),
            )
        },
    )
}

/// A target with nothing to pick yet; `message` says what is missing.
pub fn pending(key: &TargetKey, class: &str, message: String) -> NodeTargetStatus {
    NodeTargetStatus {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        class: class.to_string(),
        phase: NodePhase::Pending,
        message: Some(message),
        ..NodeTargetStatus::default()
    }
}

/// Progress of `pick` through `phase`: a row that serves nothing takes the phase; a row that
/// serves an earlier artifact keeps serving it and says what is being prepared.
pub fn preparing(
    old: &NodeTargetStatus,
    key: &TargetKey,
    pick: &Pick,
    phase: NodePhase,
    seen: Option<Time>,
) -> NodeTargetStatus {
    if serves(old) {
        return NodeTargetStatus {
            desired_revision: Some(pick.revision),
            message: Some(format!(
                "preparing revision {} (class {}): {}",
                pick.revision,
                pick.class,
                phase.as_str()
            )),
            ..old.clone()
        };
    }
    NodeTargetStatus {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        revision: pick.revision,
        class: pick.class.clone(),
        phase,
        artifact_digest: Some(pick.digest.clone()),
        revision_seen_at: seen,
        ..NodeTargetStatus::default()
    }
}

/// The row of a served artifact: `Ready`, or `Degraded` when it serves as `fallback` for a
/// failed one. An artifact that already served keeps its `readySince` and `revisionSeenAt`;
/// a new one is ready since `now`. A re-verified previous artifact reports the figures of its
/// own pass only when this agent measured them.
pub fn served(
    old: &NodeTargetStatus,
    key: &TargetKey,
    p: &Prepared,
    seen: Option<Time>,
    fallback: Option<&Fallback>,
    now: Time,
) -> NodeTargetStatus {
    let same = serves_same(old, &p.pick);
    let mut row = NodeTargetStatus {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        revision: p.pick.revision,
        class: p.pick.class.clone(),
        phase: NodePhase::Ready,
        artifact_digest: Some(p.pick.digest.clone()),
        pull_seconds: Some(p.pull_seconds),
        pull_bytes: Some(i64::try_from(p.pull_bytes).unwrap_or(i64::MAX)),
        figures: p.warmup.figures(p.load_seconds),
        engine: p.engine.clone(),
        revision_seen_at: if same {
            old.revision_seen_at.clone()
        } else {
            seen
        },
        ready_since: if same {
            old.ready_since.clone()
        } else {
            Some(now)
        },
        ..NodeTargetStatus::default()
    };
    let Some(f) = fallback else {
        return row;
    };
    row.phase = NodePhase::Degraded;
    row.desired_revision = Some(f.wanted.revision);
    row.fallback = Some(f.policy);
    row.reason = Some(f.reason);
    row.message = Some(format!(
        "revision {} (class {}) failed: {}; serving revision {} (class {}) under fallback {}",
        f.wanted.revision,
        f.wanted.class,
        f.message,
        p.pick.revision,
        p.pick.class,
        f.policy.as_str()
    ));
    if f.policy == FallbackPolicy::PreviousKnownGood {
        // Re-verified, not re-warmed: report the figures of its pass when this agent measured
        // them, none otherwise.
        let mine = |v: Option<f64>| v.filter(|_| same);
        row.figures = if same {
            old.figures.clone()
        } else {
            WarmupFigures::default()
        };
        row.pull_seconds = mine(old.pull_seconds);
        row.pull_bytes = old.pull_bytes.filter(|_| same);
    }
    row
}

/// The row of a target that failed closed: `pick` failed for `reason` and `policy` had nothing
/// to serve instead. When the revision was first seen is kept.
pub fn failed(
    old: &NodeTargetStatus,
    key: &TargetKey,
    pick: &Pick,
    reason: FailureReason,
    message: String,
    policy: FallbackPolicy,
) -> NodeTargetStatus {
    NodeTargetStatus {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        revision: pick.revision,
        class: pick.class.clone(),
        phase: NodePhase::Failed,
        artifact_digest: Some(pick.digest.clone()),
        reason: Some(reason),
        message: Some(message),
        fallback: Some(policy),
        revision_seen_at: old.revision_seen_at.clone(),
        ..NodeTargetStatus::default()
    }
}

/// The KilnNode status for `rows`: the hardware, the rows in key order, and the kstatus
/// conditions: `Ready` true only when every target is served (else false with the first one
/// that is not); `Reconciling` true while some target is pending, pulling, loading or warming;
/// `Stalled` true when some target failed and none is still on its way (nothing changes until
/// a target, its artifact or the node does). Conditions carry over from `previous`, whose
/// transition time stays while a status does not change, so an unchanged node yields an
/// identical status and no write.
pub fn node_status(
    previous: Option<&KilnNodeStatus>,
    hardware: &HardwareFacts,
    rows: &BTreeMap<TargetKey, NodeTargetStatus>,
    now: Time,
) -> KilnNodeStatus {
    let mut conds = previous.map(|s| s.conditions.clone()).unwrap_or_default();
    let not_served: Vec<&NodeTargetStatus> = rows.values().filter(|r| !serves(r)).collect();
    let ready = match not_served.first() {
        None => conditions::condition(
            READY,
            true,
            "Ready",
            format!("{} target(s) served on this node", rows.len()),
            None,
            now.clone(),
        ),
        Some(r) => conditions::condition(
            READY,
            false,
            r.reason.map(|r| r.as_str()).unwrap_or("Preparing"),
            format!(
                "{} of {} target(s) not served; first: {}/{} {:?}",
                not_served.len(),
                rows.len(),
                r.namespace,
                r.name,
                r.phase
            ),
            None,
            now.clone(),
        ),
    };
    let working: Vec<&NodeTargetStatus> = not_served
        .iter()
        .copied()
        .filter(|r| r.phase != NodePhase::Failed)
        .collect();
    let reconciling = match working.first() {
        Some(r) => conditions::condition(
            conditions::RECONCILING,
            true,
            "Preparing",
            format!(
                "{} target(s) on their way; first: {}/{} {:?}",
                working.len(),
                r.namespace,
                r.name,
                r.phase
            ),
            None,
            now.clone(),
        ),
        None => conditions::condition(
            conditions::RECONCILING,
            false,
            "Settled",
            String::new(),
            None,
            now.clone(),
        ),
    };
    let stalled = if working.is_empty()
        && let Some(r) = not_served.first()
    {
        conditions::condition(
            conditions::STALLED,
            true,
            r.reason.map_or("Failed", |r| r.as_str()),
            ready.message.clone(),
            None,
            now,
        )
    } else {
        conditions::condition(
            conditions::STALLED,
            false,
            "NotStalled",
            String::new(),
            None,
            now,
        )
    };
    for c in [ready, reconciling, stalled] {
        conditions::upsert(&mut conds, c);
    }
    KilnNodeStatus {
        observed_generation: None,
        conditions: conds,
        hardware: Some(hardware.clone()),
        targets: rows.values().cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_change_withdraws_readiness_unless_the_other_class_is_a_fallback() {
        let key = TargetKey {
            namespace: "ml".into(),
            name: "t".into(),
        };
        let ready = NodeTargetStatus {
            namespace: "ml".into(),
            name: "t".into(),
            revision: 3,
            class: "cpu-v4".into(),
            phase: NodePhase::Ready,
            artifact_digest: Some("d".into()),
            ..NodeTargetStatus::default()
        };
        let moved = class_moved(&ready, &key, "cpu-v1").expect("withdrawn");
        assert_eq!(moved.phase, NodePhase::Pending);
        assert!(!serves(&moved));
        assert_eq!(moved.class, "cpu-v1");
        assert!(
            moved
                .message
                .as_deref()
                .unwrap_or_default()
                .contains("from cpu-v4 to cpu-v1")
        );
        assert_eq!(class_moved(&ready, &key, "cpu-v4"), None, "same class");
        let degraded = NodeTargetStatus {
            phase: NodePhase::Degraded,
            fallback: Some(FallbackPolicy::Class),
            ..ready.clone()
        };
        assert_eq!(
            class_moved(&degraded, &key, "cpu-v1"),
            None,
            "a Class fallback on purpose"
        );
        let pending_row = NodeTargetStatus {
            phase: NodePhase::Pending,
            ..ready
        };
        assert_eq!(
            class_moved(&pending_row, &key, "cpu-v1"),
            None,
            "serves nothing"
        );
    }

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("timestamp"))
    }

    fn key() -> TargetKey {
        TargetKey::new("ns", "sq")
    }

    fn pick(revision: i64, class: &str) -> Pick {
        Pick {
            revision,
            class: class.into(),
            compile_key: format!("k{revision}{class}"),
            digest: format!("d{revision}{class}"),
            manifest_digest: format!("sha256:m{revision}{class}"),
        }
    }

    fn prepared(pick: Pick) -> Prepared {
        Prepared {
            pick,
            pull_bytes: 1000,
            pull_seconds: 1.5,
            load_seconds: 0.25,
            warmup: WarmupReport {
                total_seconds: 0.5,
                parity_max_abs_error: 1e-6,
                ..WarmupReport::default()
            },
            engine: Some("onnxruntime/cpu".into()),
            fixture_digest: None,
        }
    }

    #[test]
    fn a_served_row_reports_device_memory_only_when_measured() {
        let now = at(1_700_000_000);
        let mut p = prepared(pick(3, "gpu"));
        p.warmup.peak_memory_bytes = Some(1 << 20);
        p.warmup.peak_device_memory_bytes = Some(3 << 30);
        let row = served(
            &NodeTargetStatus::default(),
            &key(),
            &p,
            None,
            None,
            now.clone(),
        );
        assert_eq!(
            (
                row.figures.peak_memory_bytes,
                row.figures.peak_device_memory_bytes
            ),
            (Some(1 << 20), Some(3 << 30))
        );
        let unmeasured = served(&row, &key(), &prepared(pick(4, "gpu")), None, None, now);
        assert_eq!(
            unmeasured.figures.peak_device_memory_bytes, None,
            "absent, never 0"
        );
    }

    /// A fresh row serving `revision` of class cpu, ready since `now`.
    fn serving(revision: i64, now: Time) -> NodeTargetStatus {
        let p = prepared(pick(revision, "cpu"));
        served(&NodeTargetStatus::default(), &key(), &p, None, None, now)
    }

    fn fallback(wanted: Pick, policy: FallbackPolicy) -> Fallback {
        Fallback {
            wanted,
            policy,
            reason: FailureReason::ParityExceeded,
            message: "output y off by 0.5".into(),
        }
    }

    #[test]
    fn a_new_artifact_is_ready_since_now_and_an_unchanged_one_keeps_its_times() {
        let first = served(
            &NodeTargetStatus::default(),
            &key(),
            &prepared(pick(2, "cpu")),
            Some(at(5)),
            None,
            at(10),
        );
        assert_eq!(first.phase, NodePhase::Ready);
        assert_eq!(
            (first.namespace.as_str(), first.name.as_str()),
            ("ns", "sq")
        );
        assert_eq!(first.artifact_digest.as_deref(), Some("d2cpu"));
        assert_eq!(
            (first.ready_since.clone(), first.revision_seen_at.clone()),
            (Some(at(10)), Some(at(5)))
        );
        assert_eq!(
            (first.pull_bytes, first.figures.load_seconds),
            (Some(1000), Some(0.25))
        );
        // The next pass re-proves the same artifact: the times stay.
        let again = served(
            &first,
            &key(),
            &prepared(pick(2, "cpu")),
            Some(at(50)),
            None,
            at(60),
        );
        assert_eq!(
            (again.ready_since, again.revision_seen_at),
            (Some(at(10)), Some(at(5)))
        );
        // Revision 3: ready anew.
        let next = served(
            &first,
            &key(),
            &prepared(pick(3, "cpu")),
            Some(at(70)),
            None,
            at(80),
        );
        assert_eq!(
            (next.ready_since, next.revision_seen_at),
            (Some(at(80)), Some(at(70)))
        );
    }

    #[test]
    fn a_fallback_is_degraded_and_says_what_failed_and_what_serves() {
        let old = NodeTargetStatus::default();
        let wanted = pick(3, "gpu");
        let row = served(
            &old,
            &key(),
            &prepared(pick(3, "cpu")),
            None,
            Some(&fallback(wanted, FallbackPolicy::Class)),
            at(10),
        );
        assert_eq!(row.phase, NodePhase::Degraded);
        assert_eq!(
            (row.desired_revision, row.fallback, row.reason),
            (
                Some(3),
                Some(FallbackPolicy::Class),
                Some(FailureReason::ParityExceeded)
            )
        );
        assert_eq!(
            row.message.as_deref(),
            Some(
                "revision 3 (class gpu) failed: output y off by 0.5; serving revision 3 (class cpu) under fallback Class"
            )
        );
        // A class fallback was loaded and warmed here: its figures are reported.
        assert_eq!(row.figures.load_seconds, Some(0.25));
    }

    #[test]
    fn a_previous_known_good_reports_only_figures_this_agent_measured() {
        let entry = KnownGood {
            revision: 2,
            class: "cpu".into(),
            compile_key: "k2cpu".into(),
            digest: "d2cpu".into(),
            passed_at: 1,
            generation: Some(1),
            fixture_digest: None,
        };
        let p = Prepared::reverified(&entry);
        let pkg = fallback(pick(3, "cpu"), FallbackPolicy::PreviousKnownGood);
        // This agent served revision 2 and measured it: its figures stay.
        let serving = serving(2, at(1));
        let row = served(&serving, &key(), &p, None, Some(&pkg), at(10));
        assert_eq!(row.phase, NodePhase::Degraded);
        assert_eq!(
            (
                row.figures.load_seconds,
                row.pull_bytes,
                row.ready_since.clone()
            ),
            (Some(0.25), Some(1000), Some(at(1)))
        );
        // After a restart the row served something else: no figures rather than zeros.
        let row = served(
            &NodeTargetStatus::default(),
            &key(),
            &p,
            None,
            Some(&pkg),
            at(10),
        );
        assert_eq!(
            (
                row.figures.load_seconds,
                row.figures.warmup_seconds,
                row.pull_bytes
            ),
            (None, None, None)
        );
        assert_eq!(row.ready_since, Some(at(10)));
    }

    #[test]
    fn progress_shows_on_an_idle_row_and_as_a_message_on_a_serving_one() {
        let row = preparing(
            &NodeTargetStatus::default(),
            &key(),
            &pick(2, "cpu"),
            NodePhase::Pulling,
            Some(at(5)),
        );
        assert_eq!(
            (row.phase, row.revision, row.revision_seen_at),
            (NodePhase::Pulling, 2, Some(at(5)))
        );
        let serving = serving(2, at(1));
        let row = preparing(
            &serving,
            &key(),
            &pick(3, "cpu"),
            NodePhase::Warming,
            Some(at(5)),
        );
        assert_eq!(
            (row.phase, row.revision, row.desired_revision),
            (NodePhase::Ready, 2, Some(3))
        );
        assert_eq!(
            row.message.as_deref(),
            Some("preparing revision 3 (class cpu): Warming")
        );
    }

    #[test]
    fn failing_closed_keeps_when_the_revision_was_seen() {
        let old = preparing(
            &NodeTargetStatus::default(),
            &key(),
            &pick(2, "cpu"),
            NodePhase::Loading,
            Some(at(5)),
        );
        let row = failed(
            &old,
            &key(),
            &pick(2, "cpu"),
            FailureReason::LoadFailed,
            "bad".into(),
            FallbackPolicy::FailClosed,
        );
        assert_eq!(
            (row.phase, row.reason, row.revision_seen_at.clone()),
            (
                NodePhase::Failed,
                Some(FailureReason::LoadFailed),
                Some(at(5))
            )
        );
        assert_eq!(
            (row.message.as_deref(), row.fallback),
            (Some("bad"), Some(FallbackPolicy::FailClosed))
        );
        assert!(!serves(&row));
        let row = pending(&key(), "cpu", "waiting".into());
        assert_eq!(
            (row.phase, row.message.as_deref()),
            (NodePhase::Pending, Some("waiting"))
        );
    }

    #[test]
    fn the_node_is_ready_only_when_every_target_serves() {
        let hw = HardwareFacts::default();
        let serving = serving(2, at(1));
        let mut rows = BTreeMap::from([(key(), serving)]);
        let ready = node_status(None, &hw, &rows, at(10));
        assert!(conditions::is_true(&ready.conditions, READY));
        assert_eq!(ready.targets.len(), 1);
        // Unchanged a pass later: identical status (no write).
        assert_eq!(node_status(Some(&ready), &hw, &rows, at(20)), ready);
        let other = TargetKey::new("a", "first");
        rows.insert(
            other.clone(),
            failed(
                &NodeTargetStatus::default(),
                &other,
                &pick(1, "cpu"),
                FailureReason::HashMismatch,
                "x".into(),
                FallbackPolicy::FailClosed,
            ),
        );
        let not = node_status(Some(&ready), &hw, &rows, at(30));
        let c = &not.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "HashMismatch")
        );
        assert_eq!(
            c.message,
            "1 of 2 target(s) not served; first: a/first Failed"
        );
        assert_eq!(c.last_transition_time, at(30));
        assert_eq!(not.targets[0].name, "first", "rows in key order");
        // kstatus: failed and nothing else on its way is Stalled, not Reconciling.
        let cond = |s: &KilnNodeStatus, t: &str| conditions::is_true(&s.conditions, t);
        assert!(!cond(&ready, conditions::RECONCILING) && !cond(&ready, conditions::STALLED));
        assert!(cond(&not, conditions::STALLED) && !cond(&not, conditions::RECONCILING));
        let third = TargetKey::new("a", "second");
        rows.insert(third.clone(), pending(&third, "cpu", "waiting".into()));
        let working = node_status(Some(&not), &hw, &rows, at(40));
        assert!(cond(&working, conditions::RECONCILING) && !cond(&working, conditions::STALLED));
        assert!(!cond(&working, READY));
    }
}
