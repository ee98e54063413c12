//! `CompiledTarget`: how and where a model must run — backend, precision, shape profiles, which
//! nodes and how they group into classes, warmup and parity, fallback, rollout.
//!
//! The spec's top level lives here; each part it names has a file of its own: `backend`
//! (kind, version, provider, precision), `cuda` and `cpu_fallback` (backend settings; the
//! llama.cpp ones are [`crate::llamacpp`]), `profile` (shape profiles and their binding to the
//! model's inputs), `warmup`, `rollout` (fallback and rollout) and `status`. Every type is
//! re-exported here, so `kiln_crds::compiled_target::X` names each. Pure data and pure
//! decisions; nothing here does I/O.

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

mod backend;
mod cpu_fallback;
mod cuda;
mod profile;
mod rollout;
mod status;
mod warmup;

pub use backend::{
    Backend, BackendKind, ExecutionProvider, OptimizationLevel, Precision, auto_identity,
    engine_name,
};
pub use cpu_fallback::{CpuFallback, CpuFallbackPolicy};
pub use cuda::{ArenaExtendStrategy, ConvAlgoSearch, CudaSettings};
pub use profile::{ProfileError, ShapeProfile};
pub use rollout::{Fallback, FallbackPolicy, Rollout};
pub use status::{
    AutoRollback, ClassArtifact, ClassPhase, ClassStatus, CompiledTargetStatus, Revision,
};
pub use warmup::{OutputTolerance, Tolerance, Warmup};

/// How and where a ModelArtifact must run.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kiln.dev",
    version = "v1alpha1",
    kind = "CompiledTarget",
    namespaced,
    status = "CompiledTargetStatus",
    shortname = "ct",
    category = "kiln",
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".spec.modelRef.name"}"#,
    printcolumn = r#"{"name":"Backend","type":"string","jsonPath":".spec.backend.kind"}"#,
    printcolumn = r#"{"name":"Revision","type":"integer","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Classes","type":"integer","jsonPath":".status.classCount"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.precision in ['fp32', 'tf32']").message("no kiln backend compiles precision fp16, bf16 or int8 yet (tract: fp32; onnxruntime and auto: fp32, and tf32 on the CUDA provider); set precision: fp32, or tf32 to allow TensorFloat-32 matrix products on NVIDIA GPUs"))]
#[x_kube(validation = Rule::new("self.fallback.policy != 'NextCandidate' || self.backend.kind == 'auto'").message("fallback policy NextCandidate serves another engine candidate of backend.kind auto; set backend.kind: auto or choose another policy"))]
#[x_kube(validation = Rule::new("!has(self.backend.llamacpp) || !has(self.backend.llamacpp.quantization) || self.backend.llamacpp.quantization != 'auto' || has(self.warmup.memoryBudget) || (has(self.classLabelKeys) && 'kiln.dev/memory-gib' in self.classLabelKeys)").message("backend.llamacpp.quantization auto picks the largest type that fits the memory the engine may use: set warmup.memoryBudget, or add kiln.dev/memory-gib to classLabelKeys (each node size its own type), or name a type (F16, Q8_0, Q4_K_M, ...)"))]
#[x_kube(validation = Rule::new("self.precision != 'tf32' || self.backend.kind in ['onnxruntime', 'auto']").message("precision tf32 is for kind onnxruntime or auto (ONNX Runtime's CUDA provider); tract and exec compute exact fp32: set precision: fp32"))]
pub struct CompiledTargetSpec {
    /// The ModelArtifact to compile.
    pub model_ref: ModelRef,
    /// Which engine backend compiles and runs the model.
    pub backend: Backend,
    /// Numeric precision of the compiled engine: `fp32` (the default) computes in exact IEEE
    /// fp32 on every provider (TensorFloat-32 is switched off on NVIDIA GPUs); `tf32` keeps fp32
    /// inputs and outputs but lets matrix products and convolutions use TensorFloat-32 where
    /// the provider has it (ONNX Runtime's CUDA provider on Ampere and later), exact fp32
    /// elsewhere. `fp16`, `bf16` and `int8` are refused at admission: no kiln backend compiles
    /// them yet.
    #[serde(default)]
    pub precision: Precision,
    /// Concrete values for the model's symbolic dims; one artifact per profile set and class.
    #[schemars(length(min = 1), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub profiles: Vec<ShapeProfile>,
    /// Which nodes serve the model. Empty selects every node with a kiln agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Node label keys whose values define a hardware class. Defaults to the GPU Feature
    /// Discovery keys plus `kubernetes.io/arch` and `kiln.dev/cpu-level`. `kiln.dev/memory-gib`
    /// (the node's memory in steps, which kiln's agent reports) gives each node size its own
    /// class, for `backend.llamacpp.quantization: auto`.
    #[serde(default = "crate::labels::default_class_keys")]
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 317)))]
    pub class_label_keys: Vec<String>,
    /// Warmup and parity checks every node runs before it reports ready.
    pub warmup: Warmup,
    /// What a node does when its artifact fails verification, load or warmup.
    #[serde(default)]
    pub fallback: Fallback,
    /// Revision pinning and known-good history.
    #[serde(default)]
    pub rollout: Rollout,
    /// Settings for the compile Jobs.
    #[serde(default)]
    pub compile: CompileSettings,
}

/// A reference to a ModelArtifact.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ModelRef {
    /// ModelArtifact name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Namespace; only the CompiledTarget's own namespace is allowed, and it is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Compile Job settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompileSettings {
    /// Attempts per class before the target goes Stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 20))]
    pub max_attempts: Option<u32>,
    /// Deadline of one compile Job, in seconds; also bounds an `exec` compiler (killed with
    /// everything it started: `Timeout`), in `local` mode too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// Resources of the compile container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Tolerations passed to compile Jobs (for tainted GPU nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}
