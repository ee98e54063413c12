//! `spec.fallback` and `spec.rollout`: what a node serves when its artifact fails, and how
//! revisions are pinned, promoted and kept.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// What a node does when its artifact fails.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.policy == 'Class') == has(self.class)").message("fallback.class is required with policy Class and not allowed otherwise"))]
pub struct Fallback {
    /// `FailClosed` (not ready; the default), `PreviousKnownGood` (newest cached revision that
    /// passed), `Class` (serve the artifact of the class named in `class`, e.g. a CPU build), or
    /// with `backend.kind: auto` `NextCandidate` (serve the next engine candidate that passed at
    /// the class's compile, in the candidates' order: when the kept engine fails on a node —
    /// its load, its parity, a provider missing there).
    #[serde(default)]
    pub policy: FallbackPolicy,
    /// Class to fall back to with policy `Class`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// Fallback policies.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum FallbackPolicy {
    /// Not ready until the asked-for artifact passes.
    #[default]
    FailClosed,
    /// Keep or return to the newest cached revision that passed, after re-verifying it.
    PreviousKnownGood,
    /// Use another class's artifact.
    Class,
    /// `backend.kind: auto`: the next engine candidate that passed at the class's compile.
    NextCandidate,
}

impl FallbackPolicy {
    /// The name in specs, status, messages and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailClosed => "FailClosed",
            Self::PreviousKnownGood => "PreviousKnownGood",
            Self::Class => "Class",
            Self::NextCandidate => "NextCandidate",
        }
    }
}

/// Revision pinning and history.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Serve this revision instead of the newest (rollback in seconds when it is still stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub pinned_revision: Option<i64>,
    /// How many known-good revisions nodes keep cached.
    #[serde(default = "default_history")]
    #[schemars(range(min = 1, max = 100))]
    pub known_good_history: u32,
    /// Percentage of a class's nodes that must be ready before a revision is known-good.
    #[serde(default = "default_promote")]
    #[schemars(range(min = 1, max = 100))]
    pub promote_at_ready_percent: u32,
    /// When the newest revision fails on any node of any class (fail-closed or serving a
    /// fallback) while an older revision is known-good, serve the newest known-good one
    /// instead, recorded in `status.autoRollback` with the failure and announced by an
    /// `AutoRolledBack` Event. It lasts until a newer revision appears (a spec or model
    /// change), `pinnedRevision` is set (the pin wins), or this is turned off. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_rollback: bool,
}

fn default_history() -> u32 {
    3
}

fn default_promote() -> u32 {
    100
}

impl Default for Rollout {
    fn default() -> Self {
        Self {
            pinned_revision: None,
            known_good_history: default_history(),
            promote_at_ready_percent: default_promote(),
            auto_rollback: false,
        }
    }
}
