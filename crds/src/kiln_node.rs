//! `KilnNode`: one per node, written only by that node's agent — probed hardware facts and the
//! per-target state on that node. Keeps thousands of agents off the shared CompiledTarget.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::compiled_target::FallbackPolicy;
use crate::conditions::Condition;
use crate::reason::FailureReason;

/// A node as its kiln agent sees it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kiln.dev",
    version = "v1alpha1",
    kind = "KilnNode",
    status = "KilnNodeStatus",
    shortname = "kn",
    category = "kiln",
    printcolumn = r#"{"name":"Accelerator","type":"string","jsonPath":".status.hardware.accelerators[0].product"}"#,
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".status.hardware.cpuLevel"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KilnNodeSpec {
    /// Settings for this node's agent; the object's name is the node's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_size_bytes: Option<i64>,
}

/// What the agent found and did on its node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KilnNodeStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// kstatus conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Probed hardware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<HardwareFacts>,
    /// One row per target revision this node serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<NodeTargetStatus>,
}

/// Hardware and runtime facts of a machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HardwareFacts {
    /// CPU architecture as in `kubernetes.io/arch` (`amd64`, `arm64`).
    pub arch: String,
    /// `x86-64-v2`/`v3`/`v4` on x86-64, `baseline` otherwise.
    pub cpu_level: String,
    /// CPU features relevant to kernels (`avx2`, `avx512f`, `fma`, `sha`, …).
    #[serde(default)]
    pub cpu_features: Vec<String>,
    /// Logical CPUs.
    pub cores: i64,
    /// Total memory in bytes.
    pub memory_bytes: i64,
    /// NVIDIA driver version, when a driver is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// CUDA driver API version (`12.8`), when a driver is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<String>,
    /// Accelerators, in device order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accelerators: Vec<Accelerator>,
    /// Why no accelerator was found, in words (no driver, no device, NVML error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_note: Option<String>,
    /// Runtime name → version available on the node (`tract` → `0.23.9`).
    #[serde(default)]
    pub runtimes: BTreeMap<String, String>,
}

/// One GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Accelerator {
    /// Product name in GPU Feature Discovery's form (`NVIDIA-H100-80GB-HBM3`).
    pub product: String,
    /// Compute capability major.
    pub compute_major: i32,
    /// Compute capability minor.
    pub compute_minor: i32,
    /// Device memory in bytes.
    pub memory_bytes: i64,
    /// Whether MIG mode is enabled.
    #[serde(default)]
    pub mig: bool,
}

/// Phases of a target on a node.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum NodePhase {
    /// Waiting for an artifact.
    #[default]
    Pending,
    /// Downloading and verifying.
    Pulling,
    /// Loading the engine.
    Loading,
    /// Running warmup fixtures.
    Warming,
    /// Verified, loaded, warmed.
    Ready,
    /// Serving a fallback.
    Degraded,
    /// Not serving; see reason.
    Failed,
}

impl NodePhase {
    /// Every variant, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::Pending,
        Self::Pulling,
        Self::Loading,
        Self::Warming,
        Self::Ready,
        Self::Degraded,
        Self::Failed,
    ];

    /// The name in specs, status, messages and metric labels (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Pulling => "Pulling",
            Self::Loading => "Loading",
            Self::Warming => "Warming",
            Self::Ready => "Ready",
            Self::Degraded => "Degraded",
            Self::Failed => "Failed",
        }
    }
}

/// One target revision on one node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeTargetStatus {
    /// CompiledTarget namespace.
    pub namespace: String,
    /// CompiledTarget name.
    pub name: String,
    /// Revision served (or being prepared).
    #[serde(default)]
    pub revision: i64,
    /// Class whose artifact is used.
    #[serde(default)]
    pub class: String,
    /// Phase.
    #[serde(default)]
    pub phase: NodePhase,
    /// sha256 of the loaded artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_digest: Option<String>,
    /// Failure reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailureReason>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What loading and warming the served artifact measured on this node.
    #[serde(flatten)]
    pub figures: WarmupFigures,
    /// The revision the target asks for, when the node serves another one (a fallback) or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_revision: Option<i64>,
    /// The fallback policy applied, when the row is `Degraded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackPolicy>,
    /// Seconds to pull and verify the artifact into the node cache (0 when it was cached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_seconds: Option<f64>,
    /// Bytes pulled for the artifact (0 when it was cached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_bytes: Option<i64>,
    /// When the agent first saw the desired revision's artifact for its class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_seen_at: Option<Time>,
    /// When the served artifact became ready on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_since: Option<Time>,
    /// The engine that serves here (`tract`, `onnxruntime/cpu`, `onnxruntime/cuda`), from the
    /// served artifact's build manifest: under `fallback.policy: NextCandidate` another than
    /// the class's kept engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// What loading and warming an artifact measured on a node: a [`NodeTargetStatus`]'s figures,
/// flattened into it (the field names are the row's own).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WarmupFigures {
    /// Seconds to load the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_seconds: Option<f64>,
    /// Seconds of warmup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_seconds: Option<f64>,
    /// Median latency of the steady warmup runs (all but the first), in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_seconds: Option<f64>,
    /// Latency of the first fixture run after warmup, in seconds: what the first request after
    /// Ready finds (the goal is within 1.2x `p50Seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_request_seconds: Option<f64>,
    /// Largest absolute error of any output against its golden value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parity_max_abs_error: Option<f64>,
    /// Which execution provider ran which nodes in this node's warmup, and how much fell back
    /// to the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::placement::Placement>,
    /// Resident memory the engine added at its peak during load and warmup, in bytes (the
    /// agent's peak resident set above its resident set before the load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<i64>,
    /// GPU memory this agent's process held at its peak (after load, after warmup), in bytes,
    /// as NVML accounts it per process (CUDA context included). Absent where nothing was
    /// measured (no GPU or no NVML), never 0 for that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_device_memory_bytes: Option<i64>,
    /// A language model's (`backend.kind: llamacpp`) prefill time (time to first token) and
    /// decode tokens per second: the median over the warmup iterations, the first request after
    /// Ready apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<crate::llamacpp::Generation>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_phases_serialise_as_their_names() {
        crate::test_support::serde_names(&NodePhase::ALL, |p| p.as_str());
    }

    #[test]
    fn warmup_figures_are_the_rows_own_fields() {
        let row = NodeTargetStatus {
            name: "t".into(),
            figures: WarmupFigures {
                load_seconds: Some(0.25),
                p50_seconds: Some(0.5),
                peak_device_memory_bytes: Some(7),
                ..WarmupFigures::default()
            },
            engine: Some("tract".into()),
            ..NodeTargetStatus::default()
        };
        let json = serde_json::to_value(&row).expect("serialise");
        assert_eq!(json["loadSeconds"], 0.25);
        assert_eq!(json["p50Seconds"], 0.5);
        assert_eq!(json["peakDeviceMemoryBytes"], 7);
        assert!(json.get("figures").is_none() && json.get("warmupSeconds").is_none());
        let back: NodeTargetStatus = serde_json::from_value(json).expect("read back");
        assert_eq!(back, row);
        let yaml = "{namespace: n, name: t, loadSeconds: 1, generation: {promptTokens: 3, generatedTokens: 4, prefillSeconds: 0.5, decodeTokensPerSecond: 20}}";
        let read: NodeTargetStatus =
            serde_saphyr::from_str(yaml).expect("a row as the apiserver has it");
        assert_eq!(read.figures.load_seconds, Some(1.0));
        assert!(read.figures.generation.is_some());
    }
}
