//! The decision: from a CompiledTarget, its ModelArtifact, the nodes, the target's compile Jobs
//! and what the store holds, which Jobs should exist, which node labels to set, what status
//! follows and which Events to emit. Pure: no client, no clock, no store I/O; the controller
//! gathers the inputs and applies the outputs.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::class::ClassFacts;
use kiln_crds::compiled_target::{ClassArtifact, ClassPhase, ClassStatus, Revision};
use kiln_crds::conditions::{
    self, COMPILED, DEGRADED, READY, RECONCILING, STALLED, condition, upsert,
};
use kiln_crds::{
    CompileKeyInput, CompiledTarget, CompiledTargetStatus, FailureReason, ModelArtifact,
    compile_key,
};

use crate::classes::{
    Class, NodeView, class_label_key, group, missing_keys, selector_matches, unreported,
};
use crate::readiness::{self, ClassNodes, NodeReport};

/// Operator-wide settings the plan depends on.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Backend name → version the compile image carries (part of the compile key).
    pub backend_versions: BTreeMap<String, String>,
    /// Attempts per class when the target names none.
    pub default_max_attempts: u32,
    /// Wait after the first failed attempt; doubles per attempt.
    pub backoff_base: Duration,
    /// Longest wait between attempts.
    pub backoff_max: Duration,
    /// Revisions kept in status beyond the target's known-good history.
    pub revision_history: usize,
    /// Compile Jobs running at once across all targets; more wait (phase `Queued`).
    pub max_concurrent_compiles: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            backend_versions: BTreeMap::from([("tract".into(), "0.23.9".into())]),
            default_max_attempts: 3,
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            revision_history: 10,
            max_concurrent_compiles: 4,
        }
    }
}

/// The target's ModelArtifact as the controller found it.
#[derive(Clone, Debug)]
pub enum ModelLookup {
    /// Found in the target's namespace.
    Found(Box<ModelArtifact>),
    /// No ModelArtifact of that name in the namespace.
    Missing,
}

/// What a compile Job has come to.
#[derive(Clone, Debug, PartialEq)]
pub enum JobState {
    /// Pending or running.
    Active,
    /// Exited 0: the artifact should be in the store.
    Succeeded,
    /// Failed, with the classified reason and what the worker (or the kubelet) said.
    Failed {
        reason: FailureReason,
        message: String,
    },
}

/// One compile Job owned by the target.
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    /// Job name.
    pub name: String,
    /// Compile key it builds (annotation).
    pub compile_key: String,
    /// Attempt number, from 1 (annotation).
    pub attempt: u32,
    /// State.
    pub state: JobState,
    /// When it finished, if it did.
    pub finished_at: Option<Time>,
    /// Whether it is already being deleted.
    pub deleting: bool,
}

/// An artifact the store holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// sha256 of the artifact.
    pub digest: String,
    /// Digest of the stored manifest (`sha256:<hex>`), what agents pull by.
    pub manifest_digest: String,
}

/// Everything the plan reads.
pub struct Inputs<'a> {
    /// The target.
    pub target: &'a CompiledTarget,
    /// Its model, when the reference is valid.
    pub model: &'a ModelLookup,
    /// Every node (the plan applies the selector).
    pub nodes: &'a [NodeView],
    /// Jobs owned by the target.
    pub jobs: &'a [JobView],
    /// Compile key → stored artifact, for the keys [`wanted_keys`] returned.
    pub stored: &'a BTreeMap<String, Stored>,
    /// Compile Jobs running for other targets (they share `max_concurrent_compiles`).
    pub compiles_elsewhere: usize,
    /// Settings.
    pub settings: &'a Settings,
    /// Now, for condition transition times and backoff.
    pub now: Time,
}

/// A Job to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    /// Deterministic name: replicas and restarts that decide the same thing collide on it.
    pub name: String,
    /// Class id.
    pub class: String,
    /// Class facts the worker must find on its node.
    pub facts: ClassFacts,
    /// Compile key.
    pub compile_key: String,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// Node label the Job is pinned by: the target's class label key, and the class id.
    pub node_selector: NodeLabel,
}

/// One node label, key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLabel {
    /// Label key.
    pub key: String,
    /// Label value.
    pub value: String,
}

/// A node label to set or remove.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LabelChange {
    /// Node name.
    pub node: String,
    /// Label key.
    pub key: String,
    /// The value to set; `None` removes the label.
    pub value: Option<String>,
}

/// An Event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Warning rather than Normal.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// What happened.
    pub note: String,
}

/// What the controller should do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The status to apply (the controller skips the write when it equals the current one).
    pub status: CompiledTargetStatus,
    /// Jobs to create.
    pub create: Vec<NewJob>,
    /// Jobs to delete (stale keys or classes, replaced attempts).
    pub delete: Vec<String>,
    /// Node labels to set or remove: class labels and the target's readiness label
    /// ([`kiln_crds::labels::ready_label`]).
    pub node_labels: Vec<LabelChange>,
    /// Events for transitions.
    pub events: Vec<Event>,
    /// Reconcile again after this long (backoff), if set.
    pub requeue: Option<Duration>,
}

/// How often a target with queued compiles looks for a free slot in any case: a finished Job
/// wakes every queued target, a deleted running one (its target gone) does not.
const QUEUE_POLL: Duration = Duration::from_secs(30);

/// A class with its compile key.
struct Keyed {
    class: Class,
    key: String,
}

/// Why the spec cannot be acted on, in words that say what to fix.
fn invalid(
    target: &CompiledTarget,
    model: &ModelLookup,
    settings: &Settings,
) -> Option<(&'static str, String)> {
    let t = &target.spec;
    let ns = target.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(other) = t.model_ref.namespace.as_deref().filter(|m| *m != ns) {
        return Some((
            "ModelInOtherNamespace",
            format!(
                "spec.modelRef.namespace is {other:?}, but a CompiledTarget may only use a ModelArtifact in its own namespace {ns:?}; copy the ModelArtifact into {ns:?} and drop modelRef.namespace"
            ),
        ));
    }
    let model = match model {
        ModelLookup::Found(m) => m,
        ModelLookup::Missing => {
            return Some((
                "ModelNotFound",
                format!(
                    "ModelArtifact {ns}/{} does not exist; create it or fix spec.modelRef.name",
                    t.model_ref.name
                ),
            ));
        }
    };
    // A foreign (`exec`) compiler's output is built and served by the built-in runtime.
    let backend = t.backend.kind.as_str();
    let runtime = t.backend.kind.runtime().as_str();
    if !settings.backend_versions.contains_key(runtime) {
        return Some((
            "BackendUnavailable",
            format!(
                "backend {backend:?} is not available to this operator's compile workers (available: {}, and exec with a compiler image); use one of those",
                settings
                    .backend_versions
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if model.spec.fixture(&t.warmup.fixture_version).is_none() {
        return Some((
            "FixtureNotFound",
            format!(
                "spec.warmup.fixtureVersion {:?} is not among ModelArtifact {}'s fixtures {:?}; add the fixture or pick a listed version",
                t.warmup.fixture_version,
                t.model_ref.name,
                model
                    .spec
                    .fixtures
                    .iter()
                    .map(|f| &f.version)
                    .collect::<Vec<_>>()
            ),
        ));
    }
    for p in &t.profiles {
        if let Err(e) = p.bind(&model.spec) {
            return Some(("InvalidProfile", e.to_string()));
        }
    }
    None
}

/// The compile key of `target` for a class, as the compile worker computes it.
pub fn key_for(
    model: &ModelArtifact,
    target: &CompiledTarget,
    facts: &ClassFacts,
    settings: &Settings,
) -> String {
    let t = &target.spec;
    let backend_version = t
        .backend
        .version
        .clone()
        .or_else(|| {
            settings
                .backend_versions
                .get(t.backend.kind.runtime().as_str())
                .cloned()
        })
        .unwrap_or_default();
    compile_key(&CompileKeyInput::for_target(
        &model.spec,
        t,
        facts,
        &backend_version,
    ))
}

fn keyed(inputs: &Inputs<'_>) -> Option<Vec<Keyed>> {
    let t = inputs.target;
    if invalid(t, inputs.model, inputs.settings).is_some() {
        return None;
    }
    let ModelLookup::Found(model) = inputs.model else {
        return None;
    };
    let classes = group(
        t.spec.node_selector.as_ref(),
        &t.spec.class_label_keys,
        inputs.nodes,
    );
    Some(
        classes
            .into_iter()
            .map(|class| Keyed {
                key: key_for(model, t, &class.facts, inputs.settings),
                class,
            })
            .collect(),
    )
}

/// The compile keys whose store entries the plan needs: the controller looks these up first.
pub fn wanted_keys(inputs: &Inputs<'_>) -> Vec<String> {
    keyed(inputs)
        .unwrap_or_default()
        .into_iter()
        .map(|k| k.key)
        .collect()
}

/// Deterministic Job name: `<target, cut to 40>-<12 hex of the key>-<attempt>` (≤ 56 chars, so
/// the `job-name` label on its pods stays valid).
pub fn job_name(target: &str, key: &str, attempt: u32) -> String {
    let target: String = target.chars().take(40).collect();
    let target = target.trim_end_matches(['-', '.']);
    format!("{target}-{}-{attempt}", key.get(..12).unwrap_or(key))
}

fn backoff(settings: &Settings, attempts: u32) -> Duration {
    kiln_crds::backoff(settings.backoff_base, settings.backoff_max, attempts)
}

fn elapsed(since: &Time, now: &Time) -> Duration {
    let secs = now.0.as_second() - since.0.as_second();
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// What every node the target selects reports for it, keyed by node name. With classes, a row
/// is read against its node's class (another class's artifact is a fallback).
fn node_reports(
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
                Some((n.clone(), readiness::report(rows, current, Some(class))))
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
            .map(|n| (n.name.clone(), readiness::report(&n.targets, current, None)))
            .collect(),
    }
}

/// The target's readiness label on every node: the served revision where a node serves one.
fn readiness_labels(inputs: &Inputs<'_>, reports: &BTreeMap<String, NodeReport>, out: &mut Plan) {
    let t = &inputs.target.metadata;
    let key = kiln_crds::labels::ready_label(
        t.namespace.as_deref().unwrap_or_default(),
        t.name.as_deref().unwrap_or_default(),
    );
    out.node_labels
        .extend(readiness::label_changes(&key, inputs.nodes, reports));
}

/// Why `nodes` have no class yet, and what gives them one.
fn awaiting_message(nodes: &[String], keys: &[&str]) -> String {
    let mut named = nodes.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if nodes.len() > 5 {
        named.push_str(", …");
    }
    format!(
        "{} selected node(s) ({named}) have no class yet: their kiln-agent has not reported their hardware (no KilnNode) and they lack the class label(s) {}; they are classified once the agent DaemonSet runs on them",
        nodes.len(),
        keys.join(", ")
    )
}

/// "3 of 4 node(s) failing: HashMismatch on node-a: <message>".
fn failing_message(a: &ClassNodes, total: usize) -> String {
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

/// Decides.
pub fn plan(inputs: &Inputs<'_>) -> Plan {
    let t = inputs.target;
    let old = t.status.clone().unwrap_or_default();
    let generation = t.metadata.generation;
    let now = inputs.now.clone();
    let mut out = Plan::default();
    let mut status = CompiledTargetStatus {
        observed_generation: generation,
        conditions: old.conditions.clone(),
        observed_retry: old.observed_retry.clone(),
        revision: old.revision,
        class_count: None,
        classes: Vec::new(),
        revisions: old.revisions.clone(),
    };
    let set =
        |status: &mut CompiledTargetStatus, type_: &str, ok: bool, reason: &str, msg: &str| {
            upsert(
                &mut status.conditions,
                condition(type_, ok, reason, msg, generation, now.clone()),
            );
        };
    // kstatus: a stalled target is neither ready nor reconciling; `why` says what stopped it.
    let set_stalled =
        |status: &mut CompiledTargetStatus, reason: &str, message: &str, why: &str| {
            set(status, READY, false, reason, message);
            set(status, STALLED, true, reason, message);
            set(status, RECONCILING, false, reason, why);
        };
    // Nothing can be compiled: no Jobs (every existing one is stale) and Stalled with the reason.
    let stall = |status: &mut CompiledTargetStatus,
                 out: &mut Plan,
                 reason: &str,
                 message: &str,
                 waiting: &str| {
        out.delete = inputs
            .jobs
            .iter()
            .filter(|j| !j.deleting)
            .map(|j| j.name.clone())
            .collect();
        set_stalled(status, reason, message, waiting);
        set(status, COMPILED, false, reason, message);
        set(status, DEGRADED, false, "AsSpecified", "");
    };

    if let Some((reason, message)) = invalid(t, inputs.model, inputs.settings) {
        stall(
            &mut status,
            &mut out,
            reason,
            &message,
            "waiting for the spec to be fixed",
        );
        readiness_labels(inputs, &node_reports(inputs, None, old.revision), &mut out);
        finish(&old, status, &mut out);
        return out;
    }
    let keyed = keyed(inputs).unwrap_or_default();
    let t_spec = &t.spec;
    let missing = missing_keys(
        t_spec.node_selector.as_ref(),
        &t_spec.class_label_keys,
        inputs.nodes,
    );
    let (awaiting, awaited_keys) = unreported(
        t_spec.node_selector.as_ref(),
        &t_spec.class_label_keys,
        inputs.nodes,
    );
    let awaiting_note = (!awaiting.is_empty()).then(|| awaiting_message(&awaiting, &awaited_keys));
    let label_key = class_label_key(&t_spec.class_label_keys);
    // A class label on a node whose class is unknown again (its KilnNode went) is stale.
    for node in inputs
        .nodes
        .iter()
        .filter(|n| n.labels.contains_key(&label_key) && awaiting.contains(&n.name))
    {
        out.node_labels.push(LabelChange {
            node: node.name.clone(),
            key: label_key.clone(),
            value: None,
        });
    }
    if keyed.is_empty()
        && let Some(message) = &awaiting_note
    {
        // Not stalled: agents report within seconds of starting. No class, so no Job yet.
        let reason = "WaitingForNodeFacts";
        out.delete = inputs
            .jobs
            .iter()
            .filter(|j| !j.deleting)
            .map(|j| j.name.clone())
            .collect();
        set(&mut status, READY, false, reason, message);
        set(&mut status, STALLED, false, reason, "");
        set(&mut status, RECONCILING, true, reason, message);
        set(&mut status, COMPILED, false, reason, message);
        set(&mut status, DEGRADED, false, "AsSpecified", "");
        status.class_count = Some(0);
        readiness_labels(inputs, &node_reports(inputs, None, old.revision), &mut out);
        finish(&old, status, &mut out);
        return out;
    }
    let stall_for_nodes = if keyed.is_empty() {
        Some((
            "NoMatchingNodes",
            "spec.nodeSelector matches no node; fix the selector or label the nodes that should serve this model".to_string(),
        ))
    } else if !missing.is_empty() {
        Some((
            "ClassKeyNotFound",
            format!(
                "class label key(s) {} are on none of the {} selected node(s); fix spec.classLabelKeys or label the nodes",
                missing.join(", "),
                keyed.iter().map(|k| k.class.nodes.len()).sum::<usize>()
            ),
        ))
    } else {
        None
    };
    if let Some((reason, message)) = stall_for_nodes {
        stall(
            &mut status,
            &mut out,
            reason,
            &message,
            "waiting for matching nodes",
        );
        status.class_count = Some(0);
        readiness_labels(inputs, &node_reports(inputs, None, old.revision), &mut out);
        finish(&old, status, &mut out);
        return out;
    }

    let max_attempts = t_spec
        .compile
        .max_attempts
        .unwrap_or(inputs.settings.default_max_attempts)
        .max(1);
    let name = t.metadata.name.as_deref().unwrap_or_default();
    let wanted: BTreeMap<&str, &Keyed> = keyed.iter().map(|k| (k.key.as_str(), k)).collect();
    // Jobs for keys no class wants any more (spec changed, class gone) go.
    for j in inputs
        .jobs
        .iter()
        .filter(|j| !j.deleting && !wanted.contains_key(j.compile_key.as_str()))
    {
        out.delete.push(j.name.clone());
    }

    let (mut compiled, mut compiling, mut stalled, mut retrying, mut queued) =
        (0usize, Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // A new value of the retry annotation grants every class `max_attempts` more.
    let retry = t
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(kiln_crds::labels::RETRY_ANNOTATION));
    let retry_now = retry.is_some() && retry != old.observed_retry.as_ref();
    if retry_now {
        status.observed_retry = retry.cloned();
    }
    let max_running = inputs.settings.max_concurrent_compiles.max(1);
    let mut running = inputs.compiles_elsewhere
        + inputs
            .jobs
            .iter()
            // Jobs of keys no class wants are deleted in this plan.
            .filter(|j| {
                j.state == JobState::Active
                    && !j.deleting
                    && wanted.contains_key(j.compile_key.as_str())
            })
            .count();
    for k in &keyed {
        for node in &k.class.nodes {
            let current = inputs
                .nodes
                .iter()
                .find(|n| &n.name == node)
                .and_then(|n| n.labels.get(&label_key));
            if current != Some(&k.class.id) {
                out.node_labels.push(LabelChange {
                    node: node.clone(),
                    key: label_key.clone(),
                    value: Some(k.class.id.clone()),
                });
            }
        }
        let prev = old
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
        let jobs: Vec<&JobView> = inputs
            .jobs
            .iter()
            .filter(|j| j.compile_key == k.key && !j.deleting)
            .collect();
        if let Some(stored) = inputs.stored.get(&k.key) {
            row.phase = ClassPhase::Compiled;
            row.artifact_digest = Some(stored.digest.clone());
            row.manifest_digest = Some(stored.manifest_digest.clone());
            compiled += 1;
            status.classes.push(row);
            continue;
        }
        if let Some(active) = jobs.iter().find(|j| j.state == JobState::Active) {
            row.phase = ClassPhase::Compiling;
            row.job = Some(active.name.clone());
            row.attempts = row
                .attempts
                .max(i32::try_from(active.attempt).unwrap_or(i32::MAX));
            if let Some(p) = prev.filter(|p| p.reason.is_some()) {
                row.reason = p.reason;
                row.message = p.message.clone();
            }
            compiling.push(k.class.id.clone());
            status.classes.push(row);
            continue;
        }
        // The Job this operator last asked for is not in the cache: under load the watch lags
        // behind the create. Ask for the same Job again (the create is idempotent by name)
        // rather than counting an attempt that never finished.
        if let Some(p) = prev.filter(|p| p.phase == ClassPhase::Compiling)
            && let Some(pending) = p.job.as_ref()
            && !jobs.iter().any(|j| &j.name == pending)
        {
            let attempt = u32::try_from(p.attempts).unwrap_or(1).max(1);
            out.create.push(NewJob {
                name: job_name(name, &k.key, attempt),
                class: k.class.id.clone(),
                facts: k.class.facts.clone(),
                compile_key: k.key.clone(),
                attempt,
                node_selector: NodeLabel {
                    key: label_key.clone(),
                    value: k.class.id.clone(),
                },
            });
            row.phase = ClassPhase::Compiling;
            row.job = p.job.clone();
            row.reason = p.reason;
            row.message = p.message.clone();
            compiling.push(k.class.id.clone());
            status.classes.push(row);
            continue;
        }
        // Finished attempts for this key: the newest says why the last one failed.
        let latest = jobs.iter().max_by_key(|j| j.attempt);
        let mut attempts = u32::try_from(row.attempts).unwrap_or(0);
        if let Some(j) = latest {
            attempts = attempts.max(j.attempt);
            let (reason, message) = match &j.state {
                JobState::Failed { reason, message } => (*reason, message.clone()),
                _ => (
                    FailureReason::StoreUnavailable,
                    format!(
                        "Job {} succeeded but the store has no artifact for key {}; operator and compile Jobs must share one store",
                        j.name, k.key
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
        let base = u32::try_from(row.retry_base).unwrap_or(0);
        if attempts.saturating_sub(base) >= max_attempts {
            row.phase = ClassPhase::Failed;
            row.job = latest.map(|j| j.name.clone());
            stalled.push(row.clone());
            status.classes.push(row);
            continue;
        }
        if attempts > base {
            let wait = backoff(inputs.settings, attempts - base);
            let waited = latest
                .and_then(|j| j.finished_at.as_ref())
                .map(|f| elapsed(f, &now));
            if let Some(waited) = waited.filter(|w| *w < wait) {
                row.phase = ClassPhase::Retrying;
                row.job = latest.map(|j| j.name.clone());
                let left = wait - waited;
                out.requeue = Some(out.requeue.map_or(left, |r| r.min(left)));
                retrying.push(row.clone());
                status.classes.push(row);
                continue;
            }
        }
        if running >= max_running {
            row.phase = ClassPhase::Queued;
            // Not the live count: a queued row is rewritten only when its own state changes, not
            // whenever some other target's compile starts or ends.
            row.message = Some(format!(
                "waiting for a compile slot: all {max_running} concurrent compiles are running (--max-concurrent-compiles)"
            ));
            out.requeue = Some(out.requeue.map_or(QUEUE_POLL, |r| r.min(QUEUE_POLL)));
            queued.push(k.class.id.clone());
            status.classes.push(row);
            continue;
        }
        running += 1;
        let attempt = attempts + 1;
        let job = job_name(name, &k.key, attempt);
        out.create.push(NewJob {
            name: job.clone(),
            class: k.class.id.clone(),
            facts: k.class.facts.clone(),
            compile_key: k.key.clone(),
            attempt,
            node_selector: NodeLabel {
                key: label_key.clone(),
                value: k.class.id.clone(),
            },
        });
        row.phase = ClassPhase::Compiling;
        row.job = Some(job);
        row.attempts = i32::try_from(attempt).unwrap_or(i32::MAX);
        compiling.push(k.class.id.clone());
        status.classes.push(row);
    }
    status.class_count = Some(i32::try_from(keyed.len()).unwrap_or(i32::MAX));

    if compiled == keyed.len() {
        let artifacts: Vec<ClassArtifact> = status
            .classes
            .iter()
            .map(|c| ClassArtifact {
                class: c.class.clone(),
                compile_key: c.compile_key.clone().unwrap_or_default(),
                digest: c.artifact_digest.clone().unwrap_or_default(),
                manifest_digest: c.manifest_digest.clone().unwrap_or_default(),
            })
            .collect();
        if status.revisions.last().map(|r| &r.artifacts) != Some(&artifacts) {
            let number = status.revisions.last().map_or(1, |r| r.number + 1);
            status.revisions.push(Revision {
                number,
                generation: generation.unwrap_or_default(),
                known_good: false,
                artifacts,
            });
            let keep = inputs
                .settings
                .revision_history
                .max(t_spec.rollout.known_good_history as usize + 1);
            let drop = status.revisions.len().saturating_sub(keep);
            status.revisions.drain(..drop);
        }
    }
    let newest = status.revisions.last().map(|r| r.number);
    status.revision = match t_spec.rollout.pinned_revision {
        Some(pin) if status.revisions.iter().any(|r| r.number == pin) => Some(pin),
        _ => newest,
    };
    let total = keyed.len();

    // Nodes: what their agents report for the current revision, per class.
    let current = status.revision;
    let percent = t_spec.rollout.promote_at_ready_percent;
    let reports = node_reports(inputs, Some(&keyed), current);
    readiness_labels(inputs, &reports, &mut out);
    let mut unmet = Vec::new();
    let (mut ready_nodes, mut selected, mut fallbacks, mut waiting) = (0, 0, 0, 0);
    for (row, k) in status.classes.iter_mut().zip(&keyed) {
        let a = readiness::aggregate(&k.class, &reports);
        let n = k.class.nodes.len();
        row.ready_nodes = i32::try_from(a.ready).unwrap_or(i32::MAX);
        row.failed_nodes = i32::try_from(a.failed).unwrap_or(i32::MAX);
        row.failing_nodes = a.failing.clone();
        (ready_nodes, selected, fallbacks) =
            (ready_nodes + a.ready, selected + n, fallbacks + a.fallback);
        let meets = a.meets(percent, n);
        if row.artifact_digest.is_some() {
            row.phase = if meets {
                ClassPhase::Ready
            } else if a.fallback > 0 {
                ClassPhase::Degraded
            } else if a.failed > 0 && a.waiting == 0 {
                ClassPhase::Failing
            } else if a.unreported == n {
                ClassPhase::Compiled
            } else {
                ClassPhase::Warming
            };
            if a.failed > 0 {
                row.reason = a.reason;
                row.message = Some(failing_message(&a, n));
            }
        }
        if !meets {
            waiting += a.waiting;
            unmet.push((row.class.clone(), a, n));
        }
    }
    // Promotion: every class has the threshold of its nodes ready on the current revision.
    if unmet.is_empty()
        && let Some(r) = status
            .revisions
            .iter_mut()
            .find(|r| Some(r.number) == current && !r.known_good)
    {
        r.known_good = true;
        out.events.push(Event {
            warning: false,
            reason: "RevisionPromoted".into(),
            note: format!(
                "revision {} is known-good: ready on {ready_nodes} of {selected} node(s) (each class at least {percent}%)",
                r.number
            ),
        });
    }
    let (degraded_reason, degraded_message) = if fallbacks > 0 {
        (
            "Fallback",
            format!(
                "{fallbacks} node(s) serve a fallback instead of revision {}",
                current.unwrap_or_default()
            ),
        )
    } else {
        ("AsSpecified", String::new())
    };

    if !stalled.is_empty() {
        let first = &stalled[0];
        let reason = first.reason.map_or("CompileFailed", |r| r.as_str());
        let message = format!(
            "{} of {total} class(es) failed after {max_attempts} attempt(s); {}: {}: {}. Fix the cause, then change the spec or set annotation kiln.dev/retry to a new value",
            stalled.len(),
            first.class,
            reason,
            first.message.as_deref().unwrap_or("no message")
        );
        set_stalled(
            &mut status,
            reason,
            &message,
            "stopped: compile attempts exhausted",
        );
        set(&mut status, COMPILED, false, reason, &message);
        if newest.is_some() {
            set(
                &mut status,
                DEGRADED,
                true,
                "PreviousRevision",
                "serving the previous revision; the current spec does not compile",
            );
        } else {
            set(
                &mut status,
                DEGRADED,
                fallbacks > 0,
                degraded_reason,
                &degraded_message,
            );
        }
    } else if compiled == total {
        let revision = current.unwrap_or_default();
        set(
            &mut status,
            COMPILED,
            true,
            "Compiled",
            &format!("{total} class(es) compiled; revision {revision}"),
        );
        set(
            &mut status,
            DEGRADED,
            fallbacks > 0,
            degraded_reason,
            &degraded_message,
        );
        let summary = format!(
            "revision {revision} ready on {ready_nodes} of {selected} node(s); each class needs {percent}%"
        );
        if unmet.is_empty() {
            set(&mut status, READY, true, "Ready", &summary);
            set(&mut status, STALLED, false, "Ready", "");
            set(&mut status, RECONCILING, false, "Ready", "");
        } else {
            let detail: Vec<String> = unmet
                .iter()
                .take(3)
                .map(|(class, a, n)| {
                    let mut s = format!("{class}: {} of {n} ready", a.ready);
                    if a.failed > 0 {
                        s = format!("{s}, {}", failing_message(a, *n));
                    }
                    s
                })
                .collect();
            let message = format!("{summary}; {}", detail.join("; "));
            if waiting > 0 {
                // Still moving: agents pulling, loading, warming, or not reporting yet.
                let reason = if unmet.iter().all(|(_, a, n)| a.unreported == *n) {
                    "WaitingForNodes"
                } else {
                    "Warming"
                };
                set(&mut status, READY, false, reason, &message);
                set(&mut status, STALLED, false, reason, "");
                set(&mut status, RECONCILING, true, reason, &message);
            } else {
                // Every node has settled and too few are ready: nothing changes until someone acts.
                let mut counts: BTreeMap<FailureReason, usize> = BTreeMap::new();
                for (_, a, _) in &unmet {
                    if let Some(r) = a.reason {
                        *counts.entry(r).or_default() += a.failed;
                    }
                }
                let top = counts.values().copied().max().unwrap_or(0);
                let reason = counts
                    .iter()
                    .find(|(_, n)| **n == top)
                    .map_or("NodesFailed", |(r, _)| r.as_str());
                set_stalled(
                    &mut status,
                    reason,
                    &message,
                    "stopped: nodes failed the artifact",
                );
            }
        }
    } else {
        let (reason, message) = if let Some(r) = retrying.first() {
            (
                "Retrying",
                format!(
                    "{compiled} of {total} class(es) compiled; {} retrying after attempt {}/{max_attempts} failed: {}: {}",
                    r.class,
                    r.attempts,
                    r.reason.map_or("CompileFailed", |x| x.as_str()),
                    r.message.as_deref().unwrap_or("")
                ),
            )
        } else if compiling.is_empty() {
            (
                "Queued",
                format!(
                    "{compiled} of {total} class(es) compiled; {} queued: {}",
                    queued.join(", "),
                    status
                        .classes
                        .iter()
                        .find_map(|c| c.message.clone().filter(|_| c.phase == ClassPhase::Queued))
                        .unwrap_or_default()
                ),
            )
        } else {
            let waiting = if queued.is_empty() {
                String::new()
            } else {
                format!("; queued (compile slots full): {}", queued.join(", "))
            };
            (
                "Compiling",
                format!(
                    "{compiled} of {total} class(es) compiled; compiling {}{waiting}",
                    compiling.join(", ")
                ),
            )
        };
        set(&mut status, READY, false, reason, &message);
        set(&mut status, STALLED, false, reason, "");
        set(&mut status, RECONCILING, true, reason, &message);
        set(&mut status, COMPILED, false, reason, &message);
        set(
            &mut status,
            DEGRADED,
            fallbacks > 0,
            degraded_reason,
            &degraded_message,
        );
    }
    if retry_now && old.classes.iter().any(|c| c.phase == ClassPhase::Failed) {
        out.events.push(Event {
            warning: false,
            reason: "RetryRequested".into(),
            note: format!(
                "annotation kiln.dev/retry={}: failed classes get {max_attempts} more attempt(s)",
                retry.map(String::as_str).unwrap_or_default()
            ),
        });
    }
    let asked_before = |j: &NewJob| {
        old.classes
            .iter()
            .any(|c| c.job.as_deref() == Some(j.name.as_str()))
    };
    for j in out.create.iter().filter(|j| !asked_before(j)) {
        out.events.push(Event {
            warning: false,
            reason: "CompileJobCreated".into(),
            note: format!(
                "Job {} compiles class {} (attempt {})",
                j.name, j.class, j.attempt
            ),
        });
    }
    // Nodes without a class yet do not hold the classified ones back; Ready names them.
    if let Some(note) = &awaiting_note
        && let Some(ready) = status.conditions.iter_mut().find(|c| c.type_ == READY)
    {
        ready.message = format!("{}; {note}", ready.message);
    }
    finish(&old, status, &mut out);
    out
}

/// Events for condition and class-phase transitions, then the status.
fn finish(old: &CompiledTargetStatus, status: CompiledTargetStatus, out: &mut Plan) {
    for c in &status.conditions {
        if c.type_ != READY && c.type_ != STALLED && c.type_ != DEGRADED {
            continue;
        }
        let before = old.conditions.iter().find(|o| o.type_ == c.type_);
        // A new target starting out not stalled and not degraded is not news.
        let quiet_start = before.is_none() && c.type_ != READY && c.status != "True";
        if !quiet_start && before.map(|b| (&b.status, &b.reason)) != Some((&c.status, &c.reason)) {
            // Going Stalled (and the not-Ready that comes with it) or Degraded is a warning; the
            // rest is news.
            let bad = conditions::is_true(&status.conditions, STALLED) && c.status != "True"
                || (c.type_ == STALLED || c.type_ == DEGRADED) && c.status == "True";
            out.events.push(Event {
                warning: bad,
                reason: format!(
                    "{}{}",
                    c.type_,
                    if c.status == "True" { "" } else { "False" }
                ),
                note: format!("{}: {}", c.reason, c.message)
                    .chars()
                    .take(1024)
                    .collect(),
            });
        }
    }
    for row in &status.classes {
        let before = old.classes.iter().find(|o| o.class == row.class);
        let note = |what: String| -> String {
            format!("class {}: {what}", row.class)
                .chars()
                .take(1024)
                .collect()
        };
        if let Some(d) = &row.artifact_digest
            && before.and_then(|b| b.artifact_digest.as_ref()) != Some(d)
        {
            out.events.push(Event {
                warning: false,
                reason: "ClassCompiled".into(),
                note: note(format!("artifact sha256:{d}")),
            });
        }
        // Compiling, Warming and Compiled are steps on the way, not news.
        let newsworthy = matches!(
            row.phase,
            ClassPhase::Ready
                | ClassPhase::Degraded
                | ClassPhase::Failing
                | ClassPhase::Failed
                | ClassPhase::Retrying
        );
        if before.map(|b| b.phase) != Some(row.phase) && newsworthy {
            out.events.push(Event {
                warning: row.phase != ClassPhase::Ready,
                reason: format!("Class{}", row.phase),
                note: note(match &row.reason {
                    Some(r) if row.phase != ClassPhase::Ready => {
                        format!("{r}: {}", row.message.as_deref().unwrap_or(""))
                    }
                    _ => format!("{} of {} node(s) ready", row.ready_nodes, row.nodes),
                }),
            });
        }
    }
    out.status = status;
}
