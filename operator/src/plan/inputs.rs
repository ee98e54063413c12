//! What the plan reads: the target, its model, the nodes, the target's Jobs, what the store
//! holds, the operator's settings and the time. Types only; the controller fills them from its
//! caches and the store.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::{CompiledTarget, FailureReason, ModelArtifact};

use super::bounds::CompileBounds;
use super::worker::{Worker, Workers};
use crate::plan::NodeView;

/// Operator-wide settings the plan depends on.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The images compile Jobs run and the backend versions each carries (part of the compile
    /// key): the agent image, and the GPU agent image for classes with an NVIDIA GPU.
    pub workers: Workers,
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
    /// What a target may ask of its compile Jobs.
    pub compile_bounds: CompileBounds,
    /// Model sources must carry `spec.source.signature` (checked by the compile Jobs against
    /// the trusted source keys; refused here so that no stored artifact is reused for one).
    pub require_source_signature: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            workers: Workers {
                agent: Worker {
                    image: "ghcr.io/kiln-dev/kiln-agent:latest".into(),
                    backend_versions: BTreeMap::from([("tract".into(), "0.23.9".into())]),
                    runtime_class: None,
                },
                gpu: None,
            },
            default_max_attempts: 3,
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            revision_history: 10,
            max_concurrent_compiles: 4,
            compile_bounds: CompileBounds::default(),
            require_source_signature: false,
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
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// sha256 of the artifact.
    pub digest: String,
    /// Digest of the stored manifest (`sha256:<hex>`), what agents pull by.
    pub manifest_digest: String,
    /// Which provider ran which nodes in the compile's parity run (from the build manifest).
    pub placement: Option<kiln_crds::placement::Placement>,
    /// The engine the artifact runs on, and for `backend.kind: auto` why it was kept.
    pub engine: Option<(String, Option<String>)>,
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
    /// Compile key → stored artifact, for the keys [`super::wanted_keys`] returned.
    pub stored: &'a BTreeMap<String, Stored>,
    /// Compile Jobs running for other targets (they share `max_concurrent_compiles`), for
    /// [`super::plan`]. [`super::draft`] ignores it: the controller counts them under the slot
    /// lock and passes the admission to [`super::settle`].
    pub compiles_elsewhere: usize,
    /// Settings.
    pub settings: &'a Settings,
    /// Now, for condition transition times and backoff.
    pub now: Time,
}
