//! Stage 3: per class, where its compile stands: stored (compiled), a Job running, a Job asked
//! for that the cache does not show yet, attempts exhausted, backing off after a failure, or a
//! candidate for a new attempt. Counts attempts (the `kiln.dev/retry` annotation grants more)
//! and picks the Jobs no class wants any more. After compile admission, [`settle`] gives the
//! admitted candidates their Jobs and queues the rest. Reads the target's Jobs, the store's
//! answers and the old status; never the compile slots (that is [`crate::recall::admission`]). Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::compiled_target::{ClassPhase, ClassStatus};
use kiln_crds::{CompiledTarget, CompiledTargetStatus, FailureReason};

use super::Admission;
use super::keyed::Keyed;
use super::{JobState, JobView, NewJob, NodeLabel, Settings, Stored};

/// How often a target with queued compiles looks for a free slot in any case: a finished Job
/// wakes every queued target, a deleted running one (its target gone) does not.
pub const QUEUE_POLL: Duration = Duration::from_secs(30);

/// What a class needs beyond its status row.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Nothing: compiled, compiling, failed, or backing off.
    Nothing,
    /// The Job this operator last asked for, asked for again: the cache does not show it yet
    /// (the create is idempotent by name). Its slot is taken already.
    AskAgain(NewJob),
    /// A new attempt: needs a compile slot.
    Candidate(NewJob),
}

/// Every class's compile state, before admission.
pub struct Schedule {
    /// One status row per class, in class order. A candidate's row has no phase yet.
    pub rows: Vec<ClassStatus>,
    /// What each row's class needs, same order.
    pub next: Vec<Next>,
    /// Jobs of keys no class wants any more (spec changed, class gone).
    pub delete: Vec<String>,
    /// The target's own compile Jobs running for wanted keys (they hold compile slots).
    pub running: usize,
    /// Shortest backoff left, if a class is backing off.
    pub requeue: Option<Duration>,
}

/// What deciding one class reads.
pub struct Ctx<'a> {
    /// Target name (Job names start with it).
    pub name: &'a str,
    /// The node label Jobs are pinned by.
    pub label_key: &'a str,
    /// The target's Jobs.
    pub jobs: &'a [JobView],
    /// Compile key → stored artifact.
    pub stored: &'a BTreeMap<String, Stored>,
    /// The status before this plan.
    pub old: &'a CompiledTargetStatus,
    /// Backoff settings.
    pub settings: &'a Settings,
    /// Attempts per class.
    pub max_attempts: u32,
    /// A new `kiln.dev/retry` value was set: failed classes start counting again.
    pub retry_now: bool,
    /// Now, for backoff.
    pub now: &'a Time,
}

/// One class's row, what it needs, and how long its backoff has left.
struct Step {
    row: ClassStatus,
    next: Next,
    wait: Option<Duration>,
}

impl Step {
    fn only(row: ClassStatus) -> Self {
        Self {
            row,
            next: Next::Nothing,
            wait: None,
        }
    }
}

/// Attempts per class: the target's `compile.maxAttempts`, else the operator's, at least 1.
pub fn max_attempts(target: &CompiledTarget, settings: &Settings) -> u32 {
    target
        .spec
        .compile
        .max_attempts
        .unwrap_or(settings.default_max_attempts)
        .max(1)
}

/// The `kiln.dev/retry` annotation's value when it is new (not yet acted on): it grants every
/// class `max_attempts` more.
pub fn retry_grant(target: &CompiledTarget, old: &CompiledTargetStatus) -> Option<String> {
    let retry = target.metadata.annotations.as_ref()?;
    let retry = retry.get(kiln_crds::labels::RETRY_ANNOTATION)?;
    (old.observed_retry.as_ref() != Some(retry)).then(|| retry.clone())
}

/// Decides every class, in order.
pub fn schedule(cx: &Ctx<'_>, keyed: &[Keyed]) -> Schedule {
    let wanted: BTreeSet<&str> = keyed.iter().map(|k| k.key.as_str()).collect();
    let live = || cx.jobs.iter().filter(|j| !j.deleting);
    let delete = live()
        .filter(|j| !wanted.contains(j.compile_key.as_str()))
        .map(|j| j.name.clone())
        .collect();
    let running = live()
        .filter(|j| j.state == JobState::Active && wanted.contains(j.compile_key.as_str()))
        .count();
    let steps: Vec<Step> = keyed.iter().map(|k| class_step(cx, k)).collect();
    let requeue = steps.iter().filter_map(|s| s.wait).min();
    let (rows, next) = steps.into_iter().map(|s| (s.row, s.next)).unzip();
    Schedule {
        rows,
        next,
        delete,
        running,
        requeue,
    }
}

/// Where one class's compile stands.
fn class_step(cx: &Ctx<'_>, k: &Keyed) -> Step {
    let prev = cx
        .old
        .classes
        .iter()
        .find(|c| c.class == k.class.id && c.compile_key.as_deref() == Some(&k.key));
    let mut row = ClassStatus {
        class: k.class.id.clone(),
        nodes: i32::try_from(k.class.nodes.len()).unwrap_or(i32::MAX),
        compile_key: Some(k.key.clone()),
        attempts: prev.map(|p| p.attempts).unwrap_or(0),
        retry_base: prev.map(|p| p.retry_base).unwrap_or(0),
        ..Default::default()
    };
    let jobs: Vec<&JobView> = cx
        .jobs
        .iter()
        .filter(|j| j.compile_key == k.key && !j.deleting)
        .collect();
    if let Some(stored) = cx.stored.get(&k.key) {
        row.phase = ClassPhase::Compiled;
        row.artifact_digest = Some(stored.digest.clone());
        row.manifest_digest = Some(stored.manifest_digest.clone());
        row.placement.clone_from(&stored.placement);
        if let Some((engine, why)) = &stored.engine {
            row.engine = Some(engine.clone());
            row.engine_reason.clone_from(why);
        }
        return Step::only(row);
    }
    if let Some(active) = jobs.iter().find(|j| j.state == JobState::Active) {
        row.phase = ClassPhase::Compiling;
        row.job = Some(active.name.clone());
        let attempt = i32::try_from(active.attempt).unwrap_or(i32::MAX);
        row.attempts = row.attempts.max(attempt);
        if let Some(p) = prev.filter(|p| p.reason.is_some()) {
            row.reason = p.reason;
            row.message = p.message.clone();
        }
        return Step::only(row);
    }
    // The Job this operator last asked for is not in the cache: under load the watch lags
    // behind the create. Ask for the same Job again rather than count an attempt that never
    // finished.
    if let Some(p) = prev.filter(|p| {
        p.phase == ClassPhase::Compiling
            && p.job
                .as_ref()
                .is_some_and(|asked| !jobs.iter().any(|j| &j.name == asked))
    }) {
        let attempt = u32::try_from(p.attempts).unwrap_or(1).max(1);
        row.phase = ClassPhase::Compiling;
        row.job = p.job.clone();
        row.reason = p.reason;
        row.message = p.message.clone();
        let next = Next::AskAgain(new_job(cx, k, attempt));
        return Step {
            row,
            next,
            wait: None,
        };
    }
    after_attempts(cx, k, row, prev, &jobs)
}

/// A class with no artifact and no Job running: failed for good, backing off, or a candidate
/// for its next attempt.
fn after_attempts(
    cx: &Ctx<'_>,
    k: &Keyed,
    row: ClassStatus,
    prev: Option<&ClassStatus>,
    jobs: &[&JobView],
) -> Step {
    let latest = jobs.iter().max_by_key(|j| j.attempt).copied();
    let mut row = count_attempts(row, prev, latest, &k.key, cx.retry_now);
    let attempts = u32::try_from(row.attempts).unwrap_or(0);
    let base = u32::try_from(row.retry_base).unwrap_or(0);
    if attempts.saturating_sub(base) >= cx.max_attempts {
        row.phase = ClassPhase::Failed;
        row.job = latest.map(|j| j.name.clone());
        return Step::only(row);
    }
    if attempts > base {
        let s = cx.settings;
        let wait = kiln_crds::backoff(s.backoff_base, s.backoff_max, attempts - base);
        let waited = latest
            .and_then(|j| j.finished_at.as_ref())
            .map(|f| elapsed(f, cx.now));
        if let Some(waited) = waited.filter(|w| *w < wait) {
            row.phase = ClassPhase::Retrying;
            row.job = latest.map(|j| j.name.clone());
            return Step {
                row,
                next: Next::Nothing,
                wait: Some(wait - waited),
            };
        }
    }
    let next = Next::Candidate(new_job(cx, k, attempts + 1));
    Step {
        row,
        next,
        wait: None,
    }
}

/// Attempt accounting for a class whose Jobs all finished: the newest finished Job (if any)
/// counts and says why it failed; a new retry value moves the base that `max_attempts` counts
/// from.
fn count_attempts(
    mut row: ClassStatus,
    prev: Option<&ClassStatus>,
    latest: Option<&JobView>,
    key: &str,
    retry_now: bool,
) -> ClassStatus {
    let mut attempts = u32::try_from(row.attempts).unwrap_or(0);
    if let Some(j) = latest {
        attempts = attempts.max(j.attempt);
        let (reason, message) = match &j.state {
            JobState::Failed { reason, message } => (*reason, message.clone()),
            _ => (
                FailureReason::StoreUnavailable,
                format!(
                    "Job {} succeeded but the store has no trusted artifact for key {key}; operator and compile Jobs must share one store, and the Jobs' signing key must match the operator's --trust-key",
                    j.name
                ),
            ),
        };
        row.reason = Some(reason);
        row.message = Some(message);
    } else if let Some(p) = prev {
        row.reason = p.reason;
        row.message = p.message.clone();
    }
    row.attempts = i32::try_from(attempts).unwrap_or(i32::MAX);
    if retry_now {
        row.retry_base = row.attempts;
    }
    row
}

fn new_job(cx: &Ctx<'_>, k: &Keyed, attempt: u32) -> NewJob {
    NewJob {
        name: job_name(cx.name, &k.key, attempt),
        class: k.class.id.clone(),
        facts: k.class.facts.clone(),
        compile_key: k.key.clone(),
        attempt,
        node_selector: NodeLabel {
            key: cx.label_key.to_string(),
            value: k.class.id.clone(),
        },
        runner: k.runner.clone(),
    }
}

/// Deterministic Job name: `<target, cut to 40>-<12 hex of the key>-<attempt>` (≤ 56 chars, so
/// the `job-name` label on its pods stays valid).
pub fn job_name(target: &str, key: &str, attempt: u32) -> String {
    let target: String = target.chars().take(40).collect();
    let target = target.trim_end_matches(['-', '.']);
    format!("{target}-{}-{attempt}", key.get(..12).unwrap_or(key))
}

fn elapsed(since: &Time, now: &Time) -> Duration {
    let secs = now.0.as_second() - since.0.as_second();
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// The rows after admission, the Jobs to create, and when a queued class looks again.
pub struct Settled {
    /// Every row with its phase.
    pub rows: Vec<ClassStatus>,
    /// Jobs to create, in class order: those asked for again and the admitted candidates.
    pub create: Vec<NewJob>,
    /// [`QUEUE_POLL`] when a class is queued.
    pub requeue: Option<Duration>,
}

/// Gives the first `admission.admitted` candidates their Job; the rest are queued.
pub fn settle(rows: Vec<ClassStatus>, next: Vec<Next>, admission: Admission) -> Settled {
    let (mut create, mut admitted, mut queued) = (Vec::new(), 0, false);
    let rows = rows
        .into_iter()
        .zip(next)
        .map(|(mut row, next)| {
            match next {
                Next::Nothing => {}
                Next::AskAgain(job) => create.push(job),
                Next::Candidate(job) if admitted < admission.admitted => {
                    admitted += 1;
                    row.phase = ClassPhase::Compiling;
                    row.job = Some(job.name.clone());
                    row.attempts = i32::try_from(job.attempt).unwrap_or(i32::MAX);
                    create.push(job);
                }
                Next::Candidate(_) => {
                    row.phase = ClassPhase::Queued;
                    row.message = Some(queued_message(admission.limit));
                    queued = true;
                }
            }
            row
        })
        .collect();
    Settled {
        rows,
        create,
        requeue: queued.then_some(QUEUE_POLL),
    }
}

/// Not the live count: a queued row is rewritten only when its own state changes, not
/// whenever some other target's compile starts or ends.
fn queued_message(limit: usize) -> String {
    format!(
        "waiting for a compile slot: all {limit} concurrent compiles are running (--max-concurrent-compiles)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::classes::Class;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + secs).expect("time"))
    }

    fn keyed() -> Keyed {
        Keyed {
            class: Class {
                id: "cpu-1".into(),
                facts: Default::default(),
                nodes: vec!["n".into()],
            },
            key: "k".repeat(64),
            runner: Default::default(),
        }
    }

    fn failed(attempt: u32, finished: i64) -> JobView {
        JobView {
            name: format!("t-kkkkkkkkkkkk-{attempt}"),
            compile_key: "k".repeat(64),
            attempt,
            state: JobState::Failed {
                reason: FailureReason::CompileFailed,
                message: format!("attempt {attempt} failed"),
            },
            finished_at: Some(at(finished)),
            deleting: false,
        }
    }

    /// Decides the one class with `jobs`, `prev` as its old row, at `now`.
    fn decide(jobs: &[JobView], prev: Option<ClassStatus>, retry_now: bool, now: i64) -> Step {
        let old = CompiledTargetStatus {
            classes: prev.into_iter().collect(),
            ..Default::default()
        };
        let (stored, settings, now) = (BTreeMap::new(), Settings::default(), at(now));
        let cx = Ctx {
            name: "t",
            label_key: "kiln.dev/class",
            jobs,
            stored: &stored,
            old: &old,
            settings: &settings,
            max_attempts: 3,
            retry_now,
            now: &now,
        };
        class_step(&cx, &keyed())
    }

    fn candidate_attempt(s: &Step) -> Option<u32> {
        match &s.next {
            Next::Candidate(j) => Some(j.attempt),
            _ => None,
        }
    }

    #[test]
    fn a_failed_attempt_backs_off_doubling_then_becomes_a_candidate_for_the_next() {
        // Attempt 1 failed at 100: 10 s backoff (Settings::default()).
        let s = decide(&[failed(1, 100)], None, false, 104);
        assert_eq!(s.row.phase, ClassPhase::Retrying);
        assert_eq!(s.wait, Some(Duration::from_secs(6)));
        assert_eq!(s.row.message.as_deref(), Some("attempt 1 failed"));
        let s = decide(&[failed(1, 100)], None, false, 110);
        assert_eq!(candidate_attempt(&s), Some(2));
        assert_eq!((s.row.phase, s.row.attempts), (ClassPhase::Pending, 1));
        // Attempt 2 failed: 20 s.
        let s = decide(&[failed(1, 100), failed(2, 200)], None, false, 219);
        assert_eq!(s.wait, Some(Duration::from_secs(1)));
        // Attempt 3 failed: exhausted, whatever the time.
        let jobs = [failed(1, 100), failed(2, 200), failed(3, 300)];
        let s = decide(&jobs, None, false, 100_000);
        assert_eq!((s.row.phase, s.row.attempts), (ClassPhase::Failed, 3));
        assert_eq!(s.row.job.as_deref(), Some("t-kkkkkkkkkkkk-3"));
    }

    #[test]
    fn a_new_retry_value_counts_attempts_from_the_current_one() {
        let prev = ClassStatus {
            class: "cpu-1".into(),
            compile_key: Some("k".repeat(64)),
            phase: ClassPhase::Failed,
            attempts: 3,
            ..Default::default()
        };
        // Jobs of finished attempts are gone (TTL); the row remembers them.
        let s = decide(&[], Some(prev.clone()), true, 0);
        assert_eq!((s.row.retry_base, candidate_attempt(&s)), (3, Some(4)));
        assert_eq!(
            decide(&[], Some(prev), false, 0).row.phase,
            ClassPhase::Failed
        );
    }

    #[test]
    fn a_job_asked_for_but_not_in_the_cache_is_asked_for_again() {
        let prev = ClassStatus {
            class: "cpu-1".into(),
            compile_key: Some("k".repeat(64)),
            phase: ClassPhase::Compiling,
            job: Some("t-kkkkkkkkkkkk-2".into()),
            attempts: 2,
            ..Default::default()
        };
        let s = decide(&[failed(1, 100)], Some(prev), false, 101);
        let Next::AskAgain(job) = &s.next else {
            panic!("{:?}", s.next);
        };
        assert_eq!((job.name.as_str(), job.attempt), ("t-kkkkkkkkkkkk-2", 2));
        assert_eq!(s.row.phase, ClassPhase::Compiling);
    }

    #[test]
    fn settling_admits_candidates_in_order_and_queues_the_rest() {
        let job = |name: &str| NewJob {
            name: name.into(),
            class: name.into(),
            facts: Default::default(),
            compile_key: name.into(),
            attempt: 1,
            node_selector: NodeLabel {
                key: "kiln.dev/class".into(),
                value: name.into(),
            },
            runner: Default::default(),
        };
        let next = vec![
            Next::Candidate(job("a")),
            Next::AskAgain(job("b")),
            Next::Nothing,
            Next::Candidate(job("c")),
        ];
        let rows = vec![ClassStatus::default(); 4];
        let admission = Admission {
            admitted: 1,
            limit: 4,
        };
        let s = settle(rows, next, admission);
        let names: Vec<&str> = s.create.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "asking again needs no slot");
        assert_eq!(
            s.rows.iter().map(|r| r.phase).collect::<Vec<_>>(),
            [
                ClassPhase::Compiling,
                ClassPhase::Pending,
                ClassPhase::Pending,
                ClassPhase::Queued
            ]
        );
        assert!(
            s.rows[3]
                .message
                .as_deref()
                .is_some_and(|m| m.contains("all 4 concurrent"))
        );
        assert_eq!(s.requeue, Some(QUEUE_POLL));
    }
}
