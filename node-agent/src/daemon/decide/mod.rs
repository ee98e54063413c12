//! What the agent does for a target on a pass, decided from what it remembers about it: skip
//! (already serving what is wanted), back off (it failed recently), wait (nothing to pick yet)
//! or prepare; after a failure [`pick::after_failure`] picks the fallback, and [`rows`] says
//! what the target's KilnNode row reads. Pure: state, the wanted pick and the time in, a
//! decision out; no client, no disk, no clock of its own.
//!
//! [`pick::after_failure`]: pick::after_failure

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::CompiledTarget;
use kiln_crds::kiln_node::NodeTargetStatus;
use kube::ResourceExt;

pub mod pick;
pub mod rows;

use kiln_engines::metrics::TargetLabels;
use pick::Pick;

/// A CompiledTarget by namespace and name: the key of the agent's per-target state and rows.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TargetKey {
    /// The target's namespace.
    pub namespace: String,
    /// The target's name.
    pub name: String,
}

impl TargetKey {
    /// The key of `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a target object.
    pub fn of(target: &CompiledTarget) -> Self {
        Self::new(target.namespace().unwrap_or_default(), target.name_any())
    }
}

/// `namespace/name`, as logs and the node cache index name a target.
impl std::fmt::Display for TargetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The last try of a target's artifact on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The target's generation (its spec) it was tried under.
    pub generation: Option<i64>,
    /// The artifact tried.
    pub pick: Pick,
    /// When the try ended.
    pub at: Instant,
    /// Failures in a row; 0 when the try left the target served.
    pub failures: u32,
}

/// When the current pick was first seen: what the row reports as `revisionSeenAt`, and where
/// the time-to-ready metric starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    /// The pick.
    pub pick: Pick,
    /// Wall-clock time, for the row.
    pub time: Time,
    /// Monotonic time, for the metric.
    pub at: Instant,
}

/// One target on this node.
#[derive(Default)]
pub struct State {
    /// The row reported in the KilnNode.
    pub row: NodeTargetStatus,
    /// The last try, if any.
    pub(super) attempt: Option<Attempt>,
    /// When the current pick was first seen.
    pub(super) seen: Option<Seen>,
    /// Metric labels of the row, to remove them when they change.
    pub(super) labels: Option<TargetLabels>,
}

impl State {
    /// Notes that `pick` is wanted at `time`/`at`, unless it already was.
    pub fn see(&mut self, pick: &Pick, time: Time, at: Instant) {
        if self.seen.as_ref().is_none_or(|s| s.pick != *pick) {
            self.seen = Some(Seen {
                pick: pick.clone(),
                time,
                at,
            });
        }
    }

    /// When the current pick was first seen, for the row.
    pub fn seen_time(&self) -> Option<Time> {
        self.seen.as_ref().map(|s| s.time.clone())
    }
}

/// What a pass does for one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing can be picked yet (`message` says what is missing): the row reads `Pending`,
    /// unless it serves something, which it keeps serving while the operator catches up.
    Wait {
        /// What is missing.
        message: String,
    },
    /// The wanted artifact already serves under this generation.
    Skip,
    /// The wanted artifact failed recently; it is tried again from `until`.
    BackOff {
        /// When the next try may start.
        until: Instant,
    },
    /// Pull, check, load and warm `pick` (after `failures` failures in a row of it).
    Prepare {
        /// The artifact to prepare.
        pick: Pick,
        /// Failures in a row so far.
        failures: u32,
    },
}

/// What to do for a target whose wanted artifact is `wanted` under `generation`, given its last
/// `attempt`, at `now`. A failed artifact waits `backoff` from `retry` before its next try, so
/// a corrupt multi-GiB artifact is not pulled in a loop; a new generation or pick is tried at
/// once.
pub fn next_action(
    attempt: Option<&Attempt>,
    wanted: Result<Pick, String>,
    generation: Option<i64>,
    retry: Duration,
    now: Instant,
) -> Action {
    let pick = match wanted {
        Ok(pick) => pick,
        Err(message) => return Action::Wait { message },
    };
    let failures = match attempt {
        Some(a) if a.generation == generation && a.pick == pick => {
            if a.failures == 0 {
                return Action::Skip;
            }
            let until = a.at + backoff(retry, a.failures);
            if now < until {
                return Action::BackOff { until };
            }
            a.failures
        }
        _ => 0,
    };
    Action::Prepare { pick, failures }
}

/// Wait before the next try of an artifact that failed `failures` times in a row: `retry`,
/// doubling, at most ten minutes (or `retry` when that is longer), so a corrupt multi-GiB
/// artifact is not pulled in a loop. The shared [`kiln_crds::backoff`], as compile retries use.
fn backoff(retry: Duration, failures: u32) -> Duration {
    kiln_crds::backoff(retry, Duration::from_secs(600).max(retry), failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_ten_minutes() {
        let r = Duration::from_secs(60);
        assert_eq!(backoff(r, 1), r);
        assert_eq!(backoff(r, 2), r * 2);
        assert_eq!(backoff(r, 4), r * 8);
        assert_eq!(backoff(r, 30), Duration::from_secs(600));
        assert_eq!(backoff(Duration::from_secs(5), 2), Duration::from_secs(10));
    }

    fn pick(revision: i64) -> Pick {
        Pick {
            revision,
            class: "cpu".into(),
            compile_key: format!("k{revision}"),
            digest: format!("d{revision}"),
            manifest_digest: format!("sha256:m{revision}"),
        }
    }

    fn attempt(revision: i64, at: Instant, failures: u32) -> Attempt {
        Attempt {
            generation: Some(1),
            pick: pick(revision),
            at,
            failures,
        }
    }

    const RETRY: Duration = Duration::from_secs(60);

    #[test]
    fn nothing_to_pick_waits_with_the_reason() {
        let t0 = Instant::now();
        assert_eq!(
            next_action(None, Err("no status yet".into()), Some(1), RETRY, t0),
            Action::Wait {
                message: "no status yet".into()
            }
        );
    }

    #[test]
    fn a_new_target_generation_or_pick_is_prepared_at_once() {
        let t0 = Instant::now();
        let prepare = |failures| Action::Prepare {
            pick: pick(2),
            failures,
        };
        assert_eq!(
            next_action(None, Ok(pick(2)), Some(1), RETRY, t0),
            prepare(0)
        );
        // Revision 1 failed a moment ago: revision 2 does not wait for that.
        let failed = attempt(1, t0, 3);
        assert_eq!(
            next_action(Some(&failed), Ok(pick(2)), Some(1), RETRY, t0),
            prepare(0)
        );
        // Revision 2 failed under generation 1; the spec changed (generation 2): try now.
        let failed = attempt(2, t0, 3);
        assert_eq!(
            next_action(Some(&failed), Ok(pick(2)), Some(2), RETRY, t0),
            prepare(0)
        );
    }

    #[test]
    fn what_serves_is_skipped() {
        let t0 = Instant::now();
        let served = attempt(2, t0, 0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(
            next_action(Some(&served), Ok(pick(2)), Some(1), RETRY, later),
            Action::Skip
        );
    }

    #[test]
    fn a_failure_backs_off_doubling_then_tries_again_counting_on() {
        let t0 = Instant::now();
        let once = attempt(2, t0, 1);
        let secs = |s| t0 + Duration::from_secs(s);
        assert_eq!(
            next_action(Some(&once), Ok(pick(2)), Some(1), RETRY, secs(59)),
            Action::BackOff { until: secs(60) }
        );
        assert_eq!(
            next_action(Some(&once), Ok(pick(2)), Some(1), RETRY, secs(60)),
            Action::Prepare {
                pick: pick(2),
                failures: 1
            }
        );
        let thrice = attempt(2, t0, 3);
        assert_eq!(
            next_action(Some(&thrice), Ok(pick(2)), Some(1), RETRY, secs(200)),
            Action::BackOff { until: secs(240) }
        );
    }

    /// The agent's decision over what one node sees of a target, event after event: a load
    /// (`Prepare`) for a new revision or a new generation (the warmup spec changed), and none
    /// for the operator's status writes that follow the node's own report, a promotion to
    /// known-good, or an annotation (same generation, same status).
    #[test]
    fn a_target_is_loaded_once_per_revision_unless_its_spec_changes() {
        use super::pick::wanted;
        use kiln_crds::CompiledTargetStatus;
        let status =
            |yaml: &str| -> CompiledTargetStatus { serde_saphyr::from_str(yaml).expect("status") };
        let class = |rev: i64, ready: i32| {
            format!(
                "{{class: cpu, compileKey: k{rev}, artifactDigest: 'sha256:d{rev}', manifestDigest: 'sha256:m{rev}', readyNodes: {ready}}}"
            )
        };
        let listed = |rev: i64, good: bool| {
            format!(
                "{{number: {rev}, knownGood: {good}, artifacts: [{{class: cpu, compileKey: k{rev}, digest: d{rev}, manifestDigest: 'sha256:m{rev}'}}]}}"
            )
        };
        let events = [
            // 0: the operator publishes revision 1.
            (1, format!("{{revision: 1, classes: [{}]}}", class(1, 0))),
            // 1: it counts this node ready, and says so in conditions.
            (
                1,
                format!(
                    "{{revision: 1, classes: [{}], conditions: [{{type: Ready, status: 'True', reason: Ready, message: ok, lastTransitionTime: '2026-11-23T12:00:00Z'}}]}}",
                    class(1, 1)
                ),
            ),
            // 2: revision 1 is promoted to known-good (the pick now comes from the list).
            (
                1,
                format!(
                    "{{revision: 1, classes: [{}], revisions: [{}]}}",
                    class(1, 1),
                    listed(1, true)
                ),
            ),
            // 3: an annotation or a label: generation and status unchanged.
            (
                1,
                format!(
                    "{{revision: 1, classes: [{}], revisions: [{}]}}",
                    class(1, 1),
                    listed(1, true)
                ),
            ),
            // 4: a new model: revision 2.
            (
                1,
                format!(
                    "{{revision: 2, classes: [{}], revisions: [{}, {}]}}",
                    class(2, 0),
                    listed(1, true),
                    listed(2, false)
                ),
            ),
            // 5: the warmup spec changes (generation 2), same artifact: warmed again.
            (
                2,
                format!(
                    "{{revision: 2, classes: [{}], revisions: [{}, {}]}}",
                    class(2, 0),
                    listed(1, true),
                    listed(2, false)
                ),
            ),
            // 6: the operator counts the node ready again.
            (
                2,
                format!(
                    "{{revision: 2, classes: [{}], revisions: [{}, {}]}}",
                    class(2, 1),
                    listed(1, true),
                    listed(2, true)
                ),
            ),
        ];
        let t0 = Instant::now();
        let mut last: Option<Attempt> = None;
        let mut loads = Vec::new();
        for (i, (generation, yaml)) in events.iter().enumerate() {
            let wanted = wanted(Some(&status(yaml)), None, "cpu");
            match next_action(last.as_ref(), wanted, Some(*generation), RETRY, t0) {
                Action::Prepare { pick, .. } => {
                    loads.push(i);
                    last = Some(Attempt {
                        generation: Some(*generation),
                        pick,
                        at: t0,
                        failures: 0,
                    });
                }
                Action::Skip => {}
                other => panic!("event {i}: {other:?}"),
            }
        }
        assert_eq!(loads, [0, 4, 5], "loads at these events only");
    }

    #[test]
    fn seen_keeps_the_first_time_of_a_pick() {
        let t0 = Instant::now();
        let time = |s| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"));
        let mut state = State::default();
        state.see(&pick(2), time(10), t0);
        state.see(&pick(2), time(20), t0 + Duration::from_secs(10));
        assert_eq!(state.seen_time(), Some(time(10)));
        state.see(&pick(3), time(30), t0 + Duration::from_secs(20));
        assert_eq!(state.seen_time(), Some(time(30)));
    }

    #[test]
    fn keys_order_by_namespace_then_name_and_print_as_a_path() {
        let a = TargetKey::new("a", "z");
        let b = TargetKey::new("b", "a");
        assert!(a < b);
        assert_eq!(a.to_string(), "a/z");
    }
}
