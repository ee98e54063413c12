//! The decision: from a CompiledTarget, its ModelArtifact, the nodes, the target's compile Jobs
//! and what the store holds, which Jobs should exist, which node labels to set, what status
//! follows and which Events to emit. Pure: no client, no clock, no store I/O, no locks; the
//! controller gathers the inputs and applies the outputs.
//!
//! One pass, in stages, each a pure function in its own module:
//!
//! 1. [`validate`]: can the spec be acted on at all?
//! 2. [`class_keys`]: which classes (grouped by [`classes`]) the selected nodes form, their compile keys and class labels;
//!    why there is nothing to compile for, if so.
//! 3. [`schedule`]: per class, compiled, compiling, retrying, failed, or a compile candidate.
//! 4. [`revisions`]: a new revision once every class is compiled; which one nodes should serve.
//! 5. [`rollout`]: what the nodes report for it, per class; readiness labels; promotion.
//!
//! That is the [`Draft`]. Then compile admission ([`admit`], which the controller runs under
//! the lock of [`crate::recall::admission`]'s slot ledger) says how many candidates get a slot, and
//! [`settle`] finishes:
//!
//! 6. [`schedule::settle`]: admitted candidates get their Job, the rest are queued.
//! 7. [`conditions`]: which conditions follow.
//! 8. [`events`]: the Events for what changed.

mod admit;
mod bounds;
mod class_keys;
mod classes;
mod conditions;
mod events;
mod inputs;
mod keyed;
mod outputs;
mod revisions;
mod rollout;
mod schedule;
mod validate;
mod worker;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::CompiledTargetStatus;

pub use admit::{Admission, admit};
pub use bounds::CompileBounds;
pub use class_keys::{key_for, wanted_keys};
pub use classes::{LabelChange, NodeView};
pub use conditions::store_unreachable;
pub use events::{
    AUTO_ROLLED_BACK, CLASS_COMPILED, COMPILE_JOB_CREATED, RETRY_REQUESTED, REVISION_PROMOTED,
};
pub use inputs::{Inputs, JobState, JobView, ModelLookup, Settings, Stored};
pub use outputs::{Event, NewJob, NodeLabel, Plan};
pub use rollout::reports::stale_labels;
pub use schedule::job_name;
pub use validate::quantity;
pub use worker::{GPU_RESOURCE, Runner, Worker, Workers};

use class_keys::KeyedClasses;
use conditions::{Course, Progress};
use events::{News, Promotion};
use schedule::Next;

/// Decides, in one pass: [`draft`], admission against `inputs.compiles_elsewhere`, [`settle`].
pub fn plan(inputs: &Inputs<'_>) -> Plan {
    let draft = draft(inputs);
    let running = inputs.compiles_elsewhere + draft.running_here();
    let admission = admit(
        inputs.settings.max_concurrent_compiles,
        running,
        draft.candidates(),
    );
    settle(draft, admission)
}

/// Everything decided before compile admission.
pub struct Draft {
    /// The status before this plan.
    old: CompiledTargetStatus,
    /// The status so far: rows (candidates without a phase yet), revisions; old conditions.
    status: CompiledTargetStatus,
    /// What each class row needs, same order.
    next: Vec<Next>,
    /// What the conditions follow from.
    course: Course,
    /// The target's own compile Jobs running (they hold slots).
    running: usize,
    /// Jobs to delete.
    delete: Vec<String>,
    /// Node labels to set or remove.
    node_labels: Vec<LabelChange>,
    /// Shortest backoff left.
    requeue: Option<Duration>,
    /// The revision promoted.
    promoted: Option<Promotion>,
    /// A new `kiln.dev/retry` value, and the attempts it grants.
    retry: Option<(String, u32)>,
    /// The target's generation.
    generation: Option<i64>,
    /// Now.
    now: Time,
}

impl Draft {
    /// Classes that need a compile slot, for [`admit`].
    pub fn candidates(&self) -> usize {
        self.next
            .iter()
            .filter(|n| matches!(n, Next::Candidate(_)))
            .count()
    }

    /// The target's own compile Jobs running (they count against the limit).
    pub fn running_here(&self) -> usize {
        self.running
    }

    /// Whether settling can create Jobs (only then does admission need the slot lock).
    pub fn may_create(&self) -> bool {
        self.next.iter().any(|n| !matches!(n, Next::Nothing))
    }
}

/// The stages before admission.
pub fn draft(inputs: &Inputs<'_>) -> Draft {
    let model = match validate::check(inputs.target, inputs.model, inputs.settings) {
        Ok(model) => model,
        Err(invalid) => {
            let course = Course::Stalled {
                reason: invalid.reason,
                message: invalid.message,
                waiting: "waiting for the spec to be fixed",
            };
            return halted(inputs, course, None, Vec::new());
        }
    };
    let mut classified = class_keys::key_classes(inputs, model);
    match classified.halt.take() {
        Some(course) => halted(inputs, course, Some(0), classified.stale),
        None => with_classes(inputs, classified),
    }
}

/// The status a plan starts from: the old one, less its class rows, for this generation.
fn start(inputs: &Inputs<'_>) -> (CompiledTargetStatus, CompiledTargetStatus) {
    let old = inputs.target.status.clone().unwrap_or_default();
    let status = CompiledTargetStatus {
        observed_generation: inputs.target.metadata.generation,
        conditions: old.conditions.clone(),
        observed_retry: old.observed_retry.clone(),
        revision: old.revision,
        class_count: None,
        classes: Vec::new(),
        revisions: old.revisions.clone(),
        auto_rollback: old.auto_rollback.clone(),
    };
    (old, status)
}

/// Nothing to compile: every Job goes, no class rows; readiness labels follow what the
/// selected nodes serve of the last revision.
fn halted(
    inputs: &Inputs<'_>,
    course: Course,
    class_count: Option<i32>,
    mut node_labels: Vec<LabelChange>,
) -> Draft {
    let (old, mut status) = start(inputs);
    status.class_count = class_count;
    let reports = rollout::node_reports(inputs, None, old.revision);
    node_labels.extend(rollout::readiness_labels(inputs, &reports));
    let delete = inputs
        .jobs
        .iter()
        .filter(|j| !j.deleting)
        .map(|j| j.name.clone())
        .collect();
    Draft {
        old,
        status,
        next: Vec::new(),
        course,
        running: 0,
        delete,
        node_labels,
        requeue: None,
        promoted: None,
        retry: None,
        generation: inputs.target.metadata.generation,
        now: inputs.now.clone(),
    }
}

/// Classes to compile and roll out: stages 3 to 5.
fn with_classes(inputs: &Inputs<'_>, classes: KeyedClasses) -> Draft {
    let t = inputs.target;
    let (old, mut status) = start(inputs);
    let generation = t.metadata.generation;
    let retry = schedule::retry_grant(t, &old);
    let max_attempts = schedule::max_attempts(t, inputs.settings);
    let cx = schedule::Ctx {
        name: t.metadata.name.as_deref().unwrap_or_default(),
        label_key: &classes.label_key,
        jobs: inputs.jobs,
        stored: inputs.stored,
        old: &old,
        settings: inputs.settings,
        max_attempts,
        retry_now: retry.is_some(),
        now: &inputs.now,
    };
    let schedule = schedule::schedule(&cx, &classes.keyed);

    let rollout_spec = &t.spec.rollout;
    let keep = (inputs.settings.revision_history).max(rollout_spec.known_good_history as usize + 1);
    let revisions = revisions::record(
        status.revisions,
        &schedule.rows,
        generation,
        keep,
        &inputs.now,
    );
    let rolled_back = rollout::auto_rollback(
        rollout_spec,
        old.auto_rollback.as_ref(),
        &revisions,
        inputs,
        &classes.keyed,
        &inputs.now,
    );
    let current = rolled_back
        .as_ref()
        .map(|r| r.to_revision)
        .or_else(|| revisions::current(&revisions, rollout_spec.pinned_revision));
    let percent = rollout_spec.promote_at_ready_percent;
    let reports = rollout::node_reports(inputs, Some(&classes.keyed), current);
    let (rows, summary) = rollout::assess(schedule.rows, &classes.keyed, &reports, percent);
    let (revisions, promoted) = revisions::promote(revisions, current, summary.unmet.is_empty());

    let mut node_labels = classes.stale;
    node_labels.extend(class_keys::class_labels(
        &classes.keyed,
        inputs.nodes,
        &classes.label_key,
    ));
    node_labels.extend(rollout::readiness_labels(inputs, &reports));
    let promoted = promoted.map(|number| Promotion {
        number,
        ready_nodes: summary.ready_nodes,
        selected: summary.selected,
        percent,
    });
    status.observed_retry = retry.clone().or(status.observed_retry);
    status.class_count = Some(i32::try_from(rows.len()).unwrap_or(i32::MAX));
    status.classes = rows;
    status.revision = current;
    let course = Course::Classes(Progress {
        max_attempts,
        percent,
        current,
        has_revision: !revisions.is_empty(),
        rollout: summary,
        awaiting_note: classes.awaiting_note,
        rolled_back: rolled_back.clone(),
    });
    status.auto_rollback = rolled_back;
    status.revisions = revisions;
    Draft {
        old,
        status,
        next: schedule.next,
        course,
        running: schedule.running,
        delete: schedule.delete,
        node_labels,
        requeue: schedule.requeue,
        promoted,
        retry: retry.map(|value| (value, max_attempts)),
        generation,
        now: inputs.now.clone(),
    }
}

/// The stages after admission: Jobs or queued rows, conditions, Events.
pub fn settle(draft: Draft, admission: Admission) -> Plan {
    let settled = schedule::settle(draft.status.classes, draft.next, admission);
    let wants = conditions::select(&draft.course, &settled.rows);
    let conditions =
        conditions::apply(draft.status.conditions, wants, draft.generation, &draft.now);
    let status = CompiledTargetStatus {
        conditions,
        classes: settled.rows,
        ..draft.status
    };
    let news = News {
        promoted: draft.promoted,
        retry: draft.retry.as_ref().map(|(v, n)| (v.as_str(), *n)),
        created: &settled.create,
    };
    let events = events::events(&draft.old, &status, &news);
    let requeue = [draft.requeue, settled.requeue].into_iter().flatten().min();
    Plan {
        status,
        create: settled.create,
        delete: draft.delete,
        node_labels: draft.node_labels,
        events,
        requeue,
    }
}
