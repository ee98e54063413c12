//! `CompiledTarget` status: the revision, the per-class rows and their phases, the artifacts
//! per class and the revision history.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;
use crate::reason::FailureReason;

/// Observed state of a CompiledTarget.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompiledTargetStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// kstatus conditions (`Ready`, `Reconciling`, `Stalled`) and `Compiled`, `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The value of the `kiln.dev/retry` annotation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_retry: Option<String>,
    /// The revision nodes should serve now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// How many node classes the target spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_count: Option<i32>,
    /// One row per node class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["class"]))]
    pub classes: Vec<ClassStatus>,
    /// Numbered revisions, newest last, with their artifacts per class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["number"]))]
    pub revisions: Vec<Revision>,
    /// Set by `rollout.autoRollback`: the newest revision failed on nodes, so nodes serve an
    /// older known-good one (`revision` names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_rollback: Option<AutoRollback>,
}

/// An automatic rollback: which revision failed where, and which one is served instead.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoRollback {
    /// The revision that failed (the newest).
    pub from_revision: i64,
    /// The known-good revision served instead.
    pub to_revision: i64,
    /// The first class with failing nodes.
    pub class: String,
    /// The failure reason its nodes report most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailureReason>,
    /// What the failing nodes said.
    #[serde(default)]
    pub message: String,
    /// When the operator rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// State of one node class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassStatus {
    /// Class id (readable name plus short hash).
    pub class: String,
    /// Nodes in the class.
    #[serde(default)]
    pub nodes: i32,
    /// Where the class stands: `Queued` (waiting for a compile slot), `Compiling`, `Retrying`
    /// (after a failed attempt), `Failed` (compile attempts exhausted), then, with the artifact
    /// stored: `Compiled` (no node reported yet), `Warming`, `Failing` (nodes failed it and none
    /// is still working), `Degraded` (nodes serve a fallback), `Ready`
    /// (`rollout.promoteAtReadyPercent` of the class's nodes ready on the current revision).
    /// `Pending` is never written: a row without a phase reads so.
    #[serde(default)]
    pub phase: ClassPhase,
    /// Compile key of the class's artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_key: Option<String>,
    /// Compile Job, while one exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// sha256 of the class's artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_digest: Option<String>,
    /// Digest (`sha256:<hex>`) of the stored manifest that agents pull the artifact by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// Which execution provider ran which nodes in the compile's parity run (from the build
    /// manifest), and how much fell back to the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::placement::Placement>,
    /// The engine the class's artifact runs on (`tract`, `onnxruntime/cpu`,
    /// `onnxruntime/cuda`), from the build manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// `backend.kind: auto`: why the compile kept that engine, with every candidate's figures
    /// or reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_reason: Option<String>,
    /// Nodes whose agent reports the current revision ready (verified, loaded, warmed).
    #[serde(default)]
    pub ready_nodes: i32,
    /// Nodes whose agent reports a failure (fail-closed, or serving a fallback).
    #[serde(default)]
    pub failed_nodes: i32,
    /// The first five failing nodes, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing_nodes: Vec<String>,
    /// Failure reason, when failing: the compile's, or the most common among failing nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailureReason>,
    /// What went wrong and what to fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Compile attempts made for the current key.
    #[serde(default)]
    pub attempts: i32,
    /// Attempts made before the last `kiln.dev/retry`; only later ones count against
    /// `compile.maxAttempts`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_base: i32,
}

/// Where one node class stands. Before its artifact is stored, the compile decides the phase
/// (`Queued`, `Compiling`, `Retrying`, `Failed`); once it is stored, the class's nodes do
/// (`Compiled`, `Warming`, `Failing`, `Degraded`, `Ready`). Serialised as the variant name.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash,
)]
pub enum ClassPhase {
    /// Needs a compile, but all `--max-concurrent-compiles` compile slots are taken; the
    /// operator looks again when a compile Job ends, and every 30 s.
    Queued,
    /// A compile Job is running (or was just created) for the class's compile key.
    Compiling,
    /// The last compile attempt failed; the next starts after the backoff.
    Retrying,
    /// Compile attempts exhausted (`compile.maxAttempts`); the target is Stalled until the spec
    /// changes or the `kiln.dev/retry` annotation gets a new value.
    Failed,
    /// The artifact is stored; no node of the class has reported on it yet.
    Compiled,
    /// The artifact is stored; nodes are pulling, loading or warming it.
    Warming,
    /// Nodes of the class failed the artifact, and none is still working on it.
    Failing,
    /// Nodes of the class serve a fallback (the previous known-good revision or another
    /// class's artifact) instead of the current revision.
    Degraded,
    /// `rollout.promoteAtReadyPercent` of the class's nodes serve the current revision.
    Ready,
    /// Nothing decided yet. The operator never writes it: it is what a row without a phase (or
    /// with one this version does not know, such as the empty string a row could carry when
    /// the phase was a free string) reads as, so such a row cannot break a watch.
    #[default]
    #[serde(other)]
    Pending,
}

impl ClassPhase {
    /// Every phase.
    pub const ALL: [ClassPhase; 10] = [
        Self::Queued,
        Self::Compiling,
        Self::Retrying,
        Self::Failed,
        Self::Compiled,
        Self::Warming,
        Self::Failing,
        Self::Degraded,
        Self::Ready,
        Self::Pending,
    ];

    /// The serialised name, as in status and `kubectl get`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "Queued",
            Self::Compiling => "Compiling",
            Self::Retrying => "Retrying",
            Self::Failed => "Failed",
            Self::Compiled => "Compiled",
            Self::Warming => "Warming",
            Self::Failing => "Failing",
            Self::Degraded => "Degraded",
            Self::Ready => "Ready",
            Self::Pending => "Pending",
        }
    }
}

impl std::fmt::Display for ClassPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the serialised name, for code that still holds phases as strings.
impl PartialEq<str> for ClassPhase {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ClassPhase {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A numbered set of artifacts, one per class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// Revision number, from 1.
    pub number: i64,
    /// Generation of the target that produced it.
    #[serde(default)]
    pub generation: i64,
    /// Whether enough nodes passed warmup for it to be a fallback.
    #[serde(default)]
    pub known_good: bool,
    /// When the operator recorded it: the moment every class's artifact was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Artifacts per class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ClassArtifact>,
}

/// One class's artifact in a revision.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClassArtifact {
    /// Class id.
    pub class: String,
    /// Compile key.
    pub compile_key: String,
    /// sha256 of the artifact.
    pub digest: String,
    /// Digest (`sha256:<hex>`) of the stored manifest that agents pull the artifact by.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub manifest_digest: String,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_phases_serialise_as_their_names_and_unknown_ones_read_as_pending() {
        for p in ClassPhase::ALL {
            let json = serde_json::to_value(p).expect("serialise");
            assert_eq!(json, serde_json::json!(p.as_str()));
            assert_eq!(serde_json::from_value::<ClassPhase>(json).expect("read"), p);
            assert!(p == p.as_str() && p == *p.as_str());
        }
        for old in ["", "Bogus"] {
            let row: ClassStatus =
                serde_json::from_value(serde_json::json!({"class": "c", "phase": old}))
                    .expect("a row with an unknown phase still reads");
            assert_eq!(row.phase, ClassPhase::Pending);
        }
        let row: ClassStatus =
            serde_json::from_value(serde_json::json!({"class": "c"})).expect("no phase");
        assert_eq!(row.phase, ClassPhase::default());
    }
}
