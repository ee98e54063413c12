//! Engine candidates of `backend.kind: auto`: what a compile built, checked and measured for each
//! engine a class can run, and which one it kept and why. Written into the build manifest by the
//! compile, shown in the class row (`engine`, `engineReason`), `kiln-agent local --output json`
//! and `kubectl kiln status`. Pure types.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::placement::Placement;
use crate::reason::FailureReason;

/// One engine a class's compile tried: compiled or not and why, parity, timings, placement.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EngineCandidate {
    /// `tract`, `onnxruntime/cpu`, `onnxruntime/cuda`.
    pub engine: String,
    /// Compiled, within tolerance on the fixture, within the precision and the CPU-fallback
    /// policy, and measured: eligible to be chosen.
    pub passed: bool,
    /// Why it did not pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailureReason>,
    /// What the failure said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Largest absolute output error against the fixture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parity_max_abs_error: Option<f64>,
    /// Seconds to compile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_seconds: Option<f64>,
    /// Seconds to load the compiled engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_seconds: Option<f64>,
    /// Latency of the first (cold) fixture run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seconds: Option<f64>,
    /// Median latency over the warmup iterations after the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_seconds: Option<f64>,
    /// 99th percentile latency over the same iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_seconds: Option<f64>,
    /// Which provider ran which nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// A passing candidate other than the kept one, stored as its own entry (under the compile
    /// key a target naming that engine would have): its key, for `fallback.policy:
    /// NextCandidate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_key: Option<String>,
    /// Its artifact's sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_digest: Option<String>,
    /// Its stored build manifest's digest (`sha256:<hex>`), what a node pulls it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
}

/// Which candidate a compile kept, and the rule's words for why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EngineSelection {
    /// The engine kept (`onnxruntime/cpu`).
    pub engine: String,
    /// Why, with the figures that decided it.
    pub reason: String,
    /// Every candidate, in the order they were tried.
    #[serde(default)]
    pub candidates: Vec<EngineCandidate>,
}
