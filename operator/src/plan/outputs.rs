//! What the plan decides: the Jobs to create and delete, the node labels to set, the status,
//! the Events and when to look again. Types only; the controller carries them out.

use std::time::Duration;

use kiln_crds::CompiledTargetStatus;
use kiln_crds::class::ClassFacts;

use super::Runner;
use crate::plan::classes::LabelChange;

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
    /// The image that runs it, whether it claims a GPU, its RuntimeClass.
    pub runner: Runner,
}

/// One node label, key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLabel {
    /// Label key.
    pub key: String,
    /// Label value.
    pub value: String,
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
