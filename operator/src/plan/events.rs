//! Stage 8: the Events for what this plan changes: a promoted revision, a retry granted, Jobs
//! created, conditions that turned, classes that compiled or changed phase. Reads the old and
//! the new status and what the other stages decided; emits nothing itself. Pure.

use kiln_crds::CompiledTargetStatus;
use kiln_crds::compiled_target::ClassPhase;
use kiln_crds::conditions::{self, DEGRADED, READY, STALLED};

use super::{Event, NewJob};

/// Event reason: a revision became known-good.
pub const REVISION_PROMOTED: &str = "RevisionPromoted";
/// Event reason: a new `kiln.dev/retry` value granted failed classes more attempts.
pub const RETRY_REQUESTED: &str = "RetryRequested";
/// Event reason: a compile Job was created.
pub const COMPILE_JOB_CREATED: &str = "CompileJobCreated";
/// Event reason: a class's artifact is stored.
pub const CLASS_COMPILED: &str = "ClassCompiled";

/// Event reason: `rollout.autoRollback` moved the nodes back to a known-good revision.
pub const AUTO_ROLLED_BACK: &str = "AutoRolledBack";

/// Events are cut to this many characters.
const MAX_NOTE: usize = 1024;

/// A revision promoted to known-good, and the rollout that did it.
pub struct Promotion {
    /// Revision number.
    pub number: i64,
    /// Nodes ready on it.
    pub ready_nodes: usize,
    /// Nodes selected.
    pub selected: usize,
    /// `rollout.promoteAtReadyPercent`.
    pub percent: u32,
}

/// What the other stages decided that makes news.
#[derive(Default)]
pub struct News<'a> {
    /// The revision promoted, if one was.
    pub promoted: Option<Promotion>,
    /// A new `kiln.dev/retry` value, and the attempts it grants.
    pub retry: Option<(&'a str, u32)>,
    /// The Jobs to create.
    pub created: &'a [NewJob],
}

/// Every Event, in order: promotion, retry, Jobs, conditions, classes.
pub fn events(old: &CompiledTargetStatus, new: &CompiledTargetStatus, news: &News) -> Vec<Event> {
    let mut out: Vec<Event> = news.promoted.iter().map(promoted).collect();
    if let Some((value, attempts)) = news.retry
        && old.classes.iter().any(|c| c.phase == ClassPhase::Failed)
    {
        out.push(normal(
            RETRY_REQUESTED,
            format!(
                "annotation kiln.dev/retry={value}: failed classes get {attempts} more attempt(s)"
            ),
        ));
    }
    out.extend(rolled_back(old, new));
    out.extend(jobs_created(old, news.created));
    out.extend(conditions_turned(old, new));
    out.extend(classes_changed(old, new));
    out
}

fn normal(reason: &str, note: String) -> Event {
    Event {
        warning: false,
        reason: reason.to_string(),
        note,
    }
}

fn promoted(p: &Promotion) -> Event {
    normal(
        REVISION_PROMOTED,
        format!(
            "revision {} is known-good: ready on {} of {} node(s) (each class at least {}%)",
            p.number, p.ready_nodes, p.selected, p.percent
        ),
    )
}

/// A new automatic rollback (a warning: the newest revision failed).
fn rolled_back(old: &CompiledTargetStatus, new: &CompiledTargetStatus) -> Option<Event> {
    let r = new.auto_rollback.as_ref()?;
    let same = |o: &kiln_crds::compiled_target::AutoRollback| {
        (o.from_revision, o.to_revision) == (r.from_revision, r.to_revision)
    };
    if old.auto_rollback.as_ref().is_some_and(same) {
        return None;
    }
    Some(Event {
        warning: true,
        reason: AUTO_ROLLED_BACK.to_string(),
        note: cut(format!(
            "revision {} failed on class {} ({}), so nodes serve known-good revision {}: {}",
            r.from_revision,
            r.class,
            r.reason.map_or("unknown reason", |x| x.as_str()),
            r.to_revision,
            r.message
        )),
    })
}

/// Jobs not asked for before (a Job asked for again while the cache lags is not news).
fn jobs_created(old: &CompiledTargetStatus, created: &[NewJob]) -> Vec<Event> {
    let asked_before = |j: &NewJob| {
        old.classes
            .iter()
            .any(|c| c.job.as_deref() == Some(j.name.as_str()))
    };
    created
        .iter()
        .filter(|j| !asked_before(j))
        .map(|j| {
            normal(
                COMPILE_JOB_CREATED,
                format!(
                    "Job {} compiles class {} (attempt {})",
                    j.name, j.class, j.attempt
                ),
            )
        })
        .collect()
}

/// Ready, Stalled and Degraded whose status or reason changed: `Ready`, `ReadyFalse`, ….
fn conditions_turned(old: &CompiledTargetStatus, new: &CompiledTargetStatus) -> Vec<Event> {
    let stalled = conditions::is_true(&new.conditions, STALLED);
    new.conditions
        .iter()
        .filter(|c| c.type_ == READY || c.type_ == STALLED || c.type_ == DEGRADED)
        .filter_map(|c| {
            let before = old.conditions.iter().find(|o| o.type_ == c.type_);
            let true_ = c.status == "True";
            // A new target starting out not ready, not stalled and not degraded is not news: its
            // status says so, and 10,000 targets applied at once made 10,000 such Events, as
            // many writes as their statuses. Starting out stalled (a spec to fix) is.
            let quiet_start = before.is_none() && !true_ && (c.type_ != READY || !stalled);
            let same = before.map(|b| (&b.status, &b.reason)) == Some((&c.status, &c.reason));
            if quiet_start || same {
                return None;
            }
            // Going Stalled (and the not-Ready that comes with it) or Degraded is a warning;
            // the rest is news.
            let bad = stalled && !true_ || (c.type_ == STALLED || c.type_ == DEGRADED) && true_;
            Some(Event {
                warning: bad,
                reason: format!("{}{}", c.type_, if true_ { "" } else { "False" }),
                note: cut(format!("{}: {}", c.reason, c.message)),
            })
        })
        .collect()
}

/// A class whose artifact is new, and a class that turned Ready, Degraded, Failing, Failed or
/// Retrying (Compiling, Queued, Warming and Compiled are steps on the way, not news).
fn classes_changed(old: &CompiledTargetStatus, new: &CompiledTargetStatus) -> Vec<Event> {
    let mut out = Vec::new();
    for row in &new.classes {
        let before = old.classes.iter().find(|o| o.class == row.class);
        let note = |what: String| cut(format!("class {}: {what}", row.class));
        if let Some(d) = &row.artifact_digest
            && before.and_then(|b| b.artifact_digest.as_ref()) != Some(d)
        {
            out.push(normal(CLASS_COMPILED, note(format!("artifact sha256:{d}"))));
        }
        let newsworthy = matches!(
            row.phase,
            ClassPhase::Ready
                | ClassPhase::Degraded
                | ClassPhase::Failing
                | ClassPhase::Failed
                | ClassPhase::Retrying
        );
        if !newsworthy || before.map(|b| b.phase) == Some(row.phase) {
            continue;
        }
        let ready = row.phase == ClassPhase::Ready;
        let what = match &row.reason {
            Some(r) if !ready => format!("{r}: {}", row.message.as_deref().unwrap_or("")),
            _ => format!("{} of {} node(s) ready", row.ready_nodes, row.nodes),
        };
        out.push(Event {
            warning: !ready,
            reason: format!("Class{}", row.phase),
            note: note(what),
        });
    }
    out
}

fn cut(note: String) -> String {
    note.chars().take(MAX_NOTE).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::compiled_target::ClassStatus;
    use kiln_crds::conditions::condition;

    fn at() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"),
        )
    }

    fn status(
        conditions: &[(&str, bool, &str)],
        classes: &[(&str, ClassPhase)],
    ) -> CompiledTargetStatus {
        CompiledTargetStatus {
            conditions: conditions
                .iter()
                .map(|(t, ok, r)| condition(t, *ok, r, "m", Some(1), at()))
                .collect(),
            classes: classes
                .iter()
                .map(|(c, phase)| ClassStatus {
                    class: c.to_string(),
                    phase: *phase,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn reasons(events: &[Event]) -> Vec<(bool, &str)> {
        events
            .iter()
            .map(|e| (e.warning, e.reason.as_str()))
            .collect()
    }

    #[test]
    fn only_turns_are_news_and_going_stalled_warns() {
        let news = News::default();
        // A new target on its way: Ready=False, Stalled=False and Degraded=False are no news.
        let start = status(
            &[
                (READY, false, "Compiling"),
                (STALLED, false, "Compiling"),
                (DEGRADED, false, "AsSpecified"),
            ],
            &[("a", ClassPhase::Compiling)],
        );
        assert!(events(&CompiledTargetStatus::default(), &start, &news).is_empty());
        // Same status and reason again: nothing.
        assert!(super::events(&start, &start, &news).is_empty());
        let stalled = status(
            &[
                (READY, false, "HashMismatch"),
                (STALLED, true, "HashMismatch"),
                (DEGRADED, false, "AsSpecified"),
            ],
            &[("a", ClassPhase::Failed)],
        );
        let events = super::events(&start, &stalled, &news);
        assert_eq!(
            reasons(&events),
            [
                (true, "ReadyFalse"),
                (true, "Stalled"),
                (true, "ClassFailed")
            ]
        );
        // A new target stalled from the start (a spec to fix) is news at once.
        let fresh = super::events(&CompiledTargetStatus::default(), &stalled, &news);
        assert_eq!(reasons(&fresh), reasons(&events));
    }

    #[test]
    fn a_retry_is_news_only_for_failed_classes_and_jobs_asked_again_are_not() {
        let job = |name: &str| NewJob {
            name: name.into(),
            class: "a".into(),
            facts: Default::default(),
            compile_key: "k".into(),
            attempt: 2,
            node_selector: crate::plan::NodeLabel {
                key: "kiln.dev/class".into(),
                value: "a".into(),
            },
            runner: Default::default(),
        };
        let mut old = status(&[], &[("a", ClassPhase::Failed)]);
        old.classes[0].job = Some("t-k-1".into());
        let created = [job("t-k-1"), job("t-k-2")];
        let news = News {
            promoted: None,
            retry: Some(("now", 3)),
            created: &created,
        };
        let new = status(&[], &[("a", ClassPhase::Compiling)]);
        let events = events(&old, &new, &news);
        assert_eq!(
            reasons(&events),
            [(false, RETRY_REQUESTED), (false, COMPILE_JOB_CREATED)]
        );
        assert_eq!(events[1].note, "Job t-k-2 compiles class a (attempt 2)");
        let compiling = status(&[], &[("a", ClassPhase::Compiling)]);
        assert!(
            super::events(&compiling, &new, &news)
                .iter()
                .all(|e| e.reason != RETRY_REQUESTED)
        );
    }
}
