//! `CompiledTarget`: how and where a model must run — backend, precision, shape profiles, which
//! nodes and how they group into classes, warmup and parity, fallback, rollout.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;
use crate::labels::ClassFacts;
use crate::model_artifact::ModelArtifactSpec;
use crate::reason::FailureReason;

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

/// Engine backend and its version.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.kind != 'exec' || (has(self.image) && has(self.command) && size(self.command) > 0)").message("backend kind exec needs backend.image (the compiler image) and backend.command (what to run in it)"))]
#[x_kube(validation = Rule::new("self.kind == 'exec' || (!has(self.image) && !has(self.command))").message("backend.image and backend.command are for kind exec; drop them or set kind: exec"))]
#[x_kube(validation = Rule::new("!has(self.image) || self.image.matches('^[^@]+@sha256:[0-9a-f]{64}$')").message("pin backend.image by digest (name@sha256:<64 hex>): the compile key must name the exact compiler"))]
#[x_kube(validation = Rule::new("!has(self.optimizationLevel) || self.kind in ['onnxruntime', 'auto']").message("backend.optimizationLevel is for kind onnxruntime or auto; drop it or set kind: onnxruntime"))]
#[x_kube(validation = Rule::new("!has(self.executionProvider) || self.executionProvider == 'cpu' || self.kind == 'onnxruntime'").message("backend.executionProvider cuda and tensorrt need kind onnxruntime; tract and exec run on the CPU"))]
#[x_kube(validation = Rule::new("self.kind != 'auto' || (!has(self.executionProvider) && !has(self.version))").message("kind auto chooses the engine and its provider per class by measurement; drop backend.executionProvider and backend.version, or name one kind"))]
#[x_kube(validation = Rule::new("!has(self.cuda) || self.kind in ['onnxruntime', 'auto']").message("backend.cuda configures ONNX Runtime's CUDA provider; it is for kind onnxruntime or auto"))]
#[x_kube(validation = Rule::new("!has(self.cuda) || !has(self.cuda.cudaGraphs) || self.cuda.cudaGraphs != true || (has(self.cpuFallback) && self.cpuFallback.policy in ['Forbidden', 'Strict'])").message("backend.cuda.cudaGraphs replays one captured CUDA graph, which ONNX Runtime builds only when no compute node runs on the CPU: set backend.cpuFallback.policy Forbidden (shape nodes may stay on the CPU) or Strict"))]
#[x_kube(validation = Rule::new("!has(self.llamacpp) || self.kind == 'llamacpp'").message("backend.llamacpp configures llama.cpp; it is for kind llamacpp"))]
pub struct Backend {
    /// `tract` (built in), `onnxruntime`, `auto` (every engine the class can run is built,
    /// checked and measured on the class's hardware, and the fastest that passes is kept),
    /// `llamacpp` (GGUF language models on llama.cpp, built in), `tensorrt`, or `exec` (any
    /// compiler image).
    pub kind: BackendKind,
    /// Backend version to require; empty takes the agent's built-in version. For `exec` this is
    /// the version of the runtime that loads the result (tract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Compiler image for kind `exec`, pinned by digest (`name@sha256:…`); part of the compile
    /// key. kiln injects `kiln-agent` into it (init container, emptyDir at `/kiln/tools`), which
    /// verifies the inputs, runs `command`, then builds, parity-checks and stores the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Kind `exec`: the compiler command, run in `image` without a shell (argv). It reads (a copy of)
    /// the verified ONNX source at `$KILN_MODEL` and writes an ONNX model to `$KILN_ARTIFACT`; it
    /// also gets `$KILN_WORK` (scratch), `$KILN_PRECISION`, `$KILN_PROFILES` and `$KILN_FLAGS`
    /// (JSON). Output and exit status go to the build manifest and, on failure, to status.
    /// Part of the compile key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub command: Vec<String>,
    /// Backend-specific compile flags; part of the compile key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flags: BTreeMap<String, String>,
    /// Where the engine runs: `cpu`, or for kind `onnxruntime` the `cuda` or `tensorrt`
    /// execution provider. Unset: `cuda` on classes with an NVIDIA GPU for kind `onnxruntime`,
    /// `cpu` otherwise. Part of the compile key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_provider: Option<ExecutionProvider>,
    /// Kind `onnxruntime`: the graph optimisation applied at compile and saved as the artifact:
    /// `disabled`, `basic`, `extended` (the default), `layout` or `all`. `layout` and `all` lay
    /// tensors out for the build machine's instruction set, so such an artifact is bound to its
    /// CPU level and refused elsewhere. Part of the compile key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimization_level: Option<OptimizationLevel>,
    /// Whether graph nodes the requested provider cannot run may fall back to the CPU. Measured
    /// at compile and on every node; absent means `Allowed`. Part of the compile key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_fallback: Option<CpuFallback>,
    /// Kind `onnxruntime` or `auto`: settings of ONNX Runtime's CUDA provider that decide
    /// latency, on classes whose engine runs on it. Part of the compile key there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<CudaSettings>,
    /// Kind `llamacpp`: the quantisation of the compiled GGUF, the context length and threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llamacpp: Option<crate::llamacpp::LlamacppSettings>,
}

/// Settings of ONNX Runtime's CUDA execution provider.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CudaSettings {
    /// How cuDNN picks a convolution algorithm: `Exhaustive` (the default: every algorithm is
    /// timed on the first run of each shape — slow once, which warmup absorbs before Ready —
    /// then the fastest is used), `Heuristic` (cuDNN's guess, no search), or `Default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_algo_search: Option<ConvAlgoSearch>,
    /// How the device memory arena grows: `NextPowerOfTwo` (the default) or `SameAsRequested`
    /// (no slack: less device memory, more allocations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arena_extend_strategy: Option<ArenaExtendStrategy>,
    /// CUDA graphs (ONNX Runtime's `enable_cuda_graph`, default off): the engine's kernels are
    /// captured once per shape profile and replayed on every later request, with inputs and
    /// outputs bound at fixed device addresses, so a request costs one graph launch instead of
    /// one launch per kernel. ONNX Runtime takes only a graph whose every compute node runs on
    /// the CUDA provider with no copy between providers (shape nodes may stay on the CPU) and no
    /// control flow (`If`, `Loop`, `Scan`); anything else fails the compile with
    /// `UnsupportedOperator`. It therefore needs `cpuFallback.policy` `Forbidden` or `Strict`,
    /// and a warmup fixture with at least two samples of different inputs: warmup alternates
    /// them and checks every run against its own golden outputs, so a replay that does not read
    /// the new inputs fails `ParityExceeded` before Ready. Part of the compile key when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_graphs: Option<bool>,
}

impl CudaSettings {
    /// Whether CUDA graphs are on (unset: off).
    pub fn graphs(&self) -> bool {
        self.cuda_graphs.unwrap_or(false)
    }
}

/// cuDNN convolution algorithm search.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum ConvAlgoSearch {
    /// Time every algorithm on the first run of a shape; keep the fastest.
    #[default]
    Exhaustive,
    /// cuDNN's heuristic choice.
    Heuristic,
    /// cuDNN's default algorithm.
    Default,
}

impl ConvAlgoSearch {
    /// The name in specs and manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exhaustive => "Exhaustive",
            Self::Heuristic => "Heuristic",
            Self::Default => "Default",
        }
    }
}

/// Growth of ONNX Runtime's device memory arena.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum ArenaExtendStrategy {
    /// Grow to the next power of two.
    #[default]
    NextPowerOfTwo,
    /// Grow by exactly what is asked.
    SameAsRequested,
}

impl ArenaExtendStrategy {
    /// The name in specs and manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NextPowerOfTwo => "NextPowerOfTwo",
            Self::SameAsRequested => "SameAsRequested",
        }
    }
}

impl Backend {
    /// A backend of `kind` with every setting left to its default.
    pub fn of(kind: BackendKind) -> Self {
        Self {
            kind,
            version: None,
            image: None,
            command: Vec::new(),
            flags: BTreeMap::new(),
            execution_provider: None,
            optimization_level: None,
            cpu_fallback: None,
            cuda: None,
            llamacpp: None,
        }
    }

    /// The execution provider a class's engine runs on: the one the target names; otherwise,
    /// for kind `onnxruntime`, CUDA on a class with an NVIDIA GPU (its class facts name a
    /// `nvidia.com/gpu.product`) and the CPU elsewhere, so one target gets a GPU engine on GPU
    /// classes and a CPU engine on CPU classes; the CPU for other kinds.
    pub fn provider_for(&self, class: &ClassFacts) -> ExecutionProvider {
        self.execution_provider.unwrap_or_else(|| {
            let gpu = class
                .get(crate::labels::GPU_PRODUCT)
                .is_some_and(|p| !p.is_empty());
            if self.kind == BackendKind::Onnxruntime && gpu {
                ExecutionProvider::Cuda
            } else {
                ExecutionProvider::Cpu
            }
        })
    }

    /// The typed backend settings for a class as they enter the compile key: empty for a
    /// `tract` or `exec` backend that sets none (so their keys are unchanged), otherwise every
    /// setting with its default filled in (the provider resolved for the class), so that
    /// spelling out a default gives the same key.
    pub fn options(&self, class: &ClassFacts) -> BTreeMap<String, String> {
        if self.kind == BackendKind::Auto {
            return self.auto_options(class);
        }
        if self.kind == BackendKind::Llamacpp {
            return self.llamacpp.clone().unwrap_or_default().options();
        }
        let ort = self.kind == BackendKind::Onnxruntime;
        let mut options = BTreeMap::new();
        if ort && self.provider_for(class) == ExecutionProvider::Cuda {
            let cuda = self.cuda.clone().unwrap_or_default();
            let search = cuda.conv_algo_search.unwrap_or_default();
            let arena = cuda.arena_extend_strategy.unwrap_or_default();
            options.insert("cuda.convAlgoSearch".into(), search.as_str().into());
            options.insert("cuda.arenaExtendStrategy".into(), arena.as_str().into());
            // Only when on, so the keys of every target made before the setting stay as they
            // were, and `false` spelled out keys like unset.
            if cuda.graphs() {
                options.insert("cuda.cudaGraphs".into(), "true".into());
            }
        }
        if ort || self.execution_provider.is_some() {
            let provider = self.provider_for(class);
            options.insert("executionProvider".into(), provider.as_str().into());
        }
        if ort || self.optimization_level.is_some() {
            let level = self.optimization_level.unwrap_or_default();
            options.insert("optimizationLevel".into(), level.as_str().into());
        }
        if ort || self.cpu_fallback.is_some() {
            let fallback = self.cpu_fallback.clone().unwrap_or_default();
            options.insert("cpuFallback".into(), fallback.describe());
        }
        options
    }

    /// Kind `auto`: the engines a class's compile builds and measures, in the order that
    /// breaks ties (the first passing one is kept unless a later one is clearly faster): tract,
    /// then ONNX Runtime on the CPU, then, on a class with an NVIDIA GPU, ONNX Runtime's CUDA
    /// provider. Each carries the target's ONNX Runtime settings; empty for other kinds.
    pub fn candidates(&self, class: &ClassFacts) -> Vec<Backend> {
        if self.kind != BackendKind::Auto {
            return Vec::new();
        }
        let ort = |provider| Backend {
            execution_provider: Some(provider),
            optimization_level: self.optimization_level,
            cpu_fallback: self.cpu_fallback.clone(),
            cuda: self.cuda.clone(),
            ..Backend::of(BackendKind::Onnxruntime)
        };
        let mut candidates = vec![Backend::of(BackendKind::Tract), ort(ExecutionProvider::Cpu)];
        if Backend::of(BackendKind::Onnxruntime).provider_for(class) == ExecutionProvider::Cuda {
            candidates.push(ort(ExecutionProvider::Cuda));
        }
        candidates
    }

    /// A candidate's name in manifests, status and metric labels: `tract`, `onnxruntime/cpu`,
    /// `onnxruntime/cuda`.
    pub fn engine_name(&self) -> String {
        let provider = self.execution_provider.unwrap_or_default();
        engine_name(self.kind.as_str(), provider.as_str())
    }

    /// Kind `auto`'s compile-key options: the candidates, and every candidate's options.
    fn auto_options(&self, class: &ClassFacts) -> BTreeMap<String, String> {
        let candidates = self.candidates(class);
        let names: Vec<String> = candidates.iter().map(Backend::engine_name).collect();
        let mut options = BTreeMap::from([("candidates".to_string(), names.join(","))]);
        for c in &candidates {
            for (k, v) in c.options(class) {
                options.insert(format!("{}.{k}", c.engine_name()), v);
            }
        }
        options
    }
}

/// The name of an engine: `tract`, or `onnxruntime/<provider>` (the one backend whose provider
/// varies). Shared by specs ([`Backend::engine_name`]) and build manifests
/// ([`crate::BuildManifest::engine`]).
pub fn engine_name(backend: &str, provider: &str) -> String {
    if backend == BackendKind::Onnxruntime.as_str() {
        format!("{backend}/{provider}")
    } else {
        backend.to_string()
    }
}

/// What kind `auto` names as its backend version in the compile key: every runtime the
/// compile workers carry that can be a candidate (`onnxruntime=1.31.1@sha256:…,tract=0.23.9`;
/// not llama.cpp, which runs GGUF, never an `auto` candidate), in name order, so a new runtime
/// or library is a new key. Computed alike by the operator (from
/// `--backend-version`) and the worker (from what it loaded).
pub fn auto_identity<'a>(runtimes: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let sorted: BTreeMap<&str, &str> = runtimes
        .into_iter()
        .filter(|(name, _)| {
            *name != BackendKind::Auto.as_str() && *name != BackendKind::Llamacpp.as_str()
        })
        .collect();
    let parts: Vec<String> = sorted.iter().map(|(n, v)| format!("{n}={v}")).collect();
    parts.join(",")
}

/// An execution provider: the device and library that runs an engine's nodes.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionProvider {
    /// The CPU.
    #[default]
    Cpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// NVIDIA GPUs through TensorRT.
    Tensorrt,
}

impl ExecutionProvider {
    /// The name in specs, status and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Tensorrt => "tensorrt",
        }
    }
}

/// ONNX Runtime's graph optimisation levels.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
#[serde(rename_all = "lowercase")]
pub enum OptimizationLevel {
    /// No rewrite: the graph as exported.
    Disabled,
    /// Semantics-preserving rewrites (constant folding, redundant node removal).
    Basic,
    /// Basic plus operator fusions.
    #[default]
    Extended,
    /// Extended plus layout transformations for the build machine's instruction set.
    Layout,
    /// Everything ONNX Runtime has, machine-specific layouts included.
    All,
}

impl OptimizationLevel {
    /// The name in specs and manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Basic => "basic",
            Self::Extended => "extended",
            Self::Layout => "layout",
            Self::All => "all",
        }
    }

    /// Whether the saved graph depends on the instruction set of the machine that made it.
    pub fn machine_specific(self) -> bool {
        matches!(self, Self::Layout | Self::All)
    }
}

/// What share of an engine may run on the CPU when another provider was requested.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.policy == 'UpToShare') == has(self.maxSharePercent)").message("cpuFallback.maxSharePercent is required with policy UpToShare and not allowed otherwise"))]
pub struct CpuFallback {
    /// `Forbidden` (no compute node on the CPU: shape nodes — `Shape`, `Size`, or every input
    /// and output tensor of rank ≤ 1 with at most 64 elements, as the first run's profile
    /// reports them — may run there and are listed in the placement; otherwise the compile and
    /// the node fail closed with `UnsupportedOperator` naming the compute nodes), `Strict` (no
    /// node at all on the CPU: ONNX Runtime's `disable_cpu_ep_fallback`, refused naming the
    /// nodes), `Allowed` (the default), or `UpToShare` (refused when the CPU took more than
    /// `maxSharePercent` of the run's kernel time).
    #[serde(default)]
    pub policy: CpuFallbackPolicy,
    /// With `UpToShare`: the largest percentage of the first run's kernel time the CPU may
    /// take (the node share where the run measured no time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_share_percent: Option<u32>,
}

impl CpuFallback {
    /// The policy in one word, as it enters the compile key (`UpToShare:10`).
    pub fn describe(&self) -> String {
        match (self.policy, self.max_share_percent) {
            (CpuFallbackPolicy::UpToShare, Some(p)) => format!("{}:{p}", self.policy.as_str()),
            (policy, _) => policy.as_str().to_string(),
        }
    }
}

/// CPU fallback policies.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum CpuFallbackPolicy {
    /// No compute node on the CPU; shape nodes may run there.
    Forbidden,
    /// Whatever the runtime places on the CPU, measured and reported.
    #[default]
    Allowed,
    /// At most `maxSharePercent` of the kernel time on the CPU.
    UpToShare,
    /// Every node on the requested provider, shape nodes included.
    Strict,
}

impl CpuFallbackPolicy {
    /// Every variant, in declaration order.
    pub const ALL: [Self; 4] = [
        Self::Forbidden,
        Self::Allowed,
        Self::UpToShare,
        Self::Strict,
    ];

    /// The name in specs, status, messages and metric labels (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forbidden => "Forbidden",
            Self::Allowed => "Allowed",
            Self::UpToShare => "UpToShare",
            Self::Strict => "Strict",
        }
    }
}

/// Backends kiln can drive.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// tract, pure Rust, built into kiln-agent.
    Tract,
    /// ONNX Runtime with an execution provider.
    Onnxruntime,
    /// Every engine the class can run, built, checked and measured; the fastest that passes.
    Auto,
    /// llama.cpp, built into kiln-agent: GGUF language models.
    Llamacpp,
    /// TensorRT engine built with NVIDIA's tools.
    Tensorrt,
    /// Any compiler image driven through kiln-agent.
    Exec,
}

impl BackendKind {
    /// The lowercase name used in manifests and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tract => "tract",
            Self::Onnxruntime => "onnxruntime",
            Self::Auto => "auto",
            Self::Llamacpp => "llamacpp",
            Self::Tensorrt => "tensorrt",
            Self::Exec => "exec",
        }
    }

    /// The runtime that loads this backend's artifacts on a node: a foreign (`exec`) compiler
    /// emits ONNX that kiln builds and serves with tract; `auto` needs at least tract, the one
    /// runtime every worker carries.
    pub fn runtime(self) -> Self {
        match self {
            Self::Exec | Self::Auto => Self::Tract,
            other => other,
        }
    }
}

/// Numeric precision.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit float, exact: TensorFloat-32 off on every provider.
    #[default]
    Fp32,
    /// fp32 inputs and outputs; matrix products may use TensorFloat-32 where the provider has it.
    Tf32,
    /// 16-bit float.
    Fp16,
    /// bfloat16.
    Bf16,
    /// 8-bit integer.
    Int8,
}

impl Precision {
    /// The lowercase name used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Tf32 => "tf32",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

/// Concrete values for symbolic dims.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShapeProfile {
    /// Profile name, unique within the target.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Symbol → value; every symbol of the model must be bound within its bounds.
    #[serde(default)]
    pub dims: BTreeMap<String, i64>,
}

/// Warmup and parity settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Warmup {
    /// How many times the fixtures run; the first run is reported apart as the cold one.
    #[serde(default = "default_iterations")]
    #[schemars(range(min = 1, max = 10000))]
    pub iterations: u32,
    /// Fixture version of the ModelArtifact to run.
    #[schemars(length(min = 1))]
    pub fixture_version: String,
    /// Tolerance for outputs without an entry in `outputs`.
    #[serde(default)]
    pub default_tolerance: Tolerance,
    /// Per-output tolerances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub outputs: Vec<OutputTolerance>,
    /// Graph outputs that parity does not check (e.g. a debug or state output with no stable
    /// value). Every other output the model produces must have a golden value in the fixture,
    /// so that parity cannot pass by checking nothing; a name here the model does not produce
    /// is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub exclude_outputs: Vec<String>,
    /// Steady-state p99 latency a node must meet, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub latency_budget_p99_ms: Option<f64>,
    /// Memory the engine may take on a node, as a byte quantity (`512Mi`, `2Gi`, `1500M`): a
    /// node with less memory (its agent's limit or the machine's) refuses the target before
    /// loading (`IncompatibleHardware`), and an engine whose resident memory peaks higher in
    /// load and warmup fails (`MemoryBudgetExceeded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-9][0-9]{0,17}(Ki|Mi|Gi|Ti|k|M|G|T)?$"))]
    pub memory_budget: Option<String>,
    /// GPU memory the engine may hold on a node, as a byte quantity (`8Gi`): the agent's own
    /// process's device memory (NVML per-process accounting, CUDA context included) after load
    /// and after warmup; above it the node fails before serving (`MemoryBudgetExceeded`).
    /// Unset, the budget is the memory of one of the class's GPUs (`nvidia.com/gpu.memory`).
    /// Applies only on classes with an NVIDIA GPU. Where the agent cannot read its device
    /// memory there (no NVML, an agent outside the host's PID namespace, whose NVML lists other
    /// process ids) nothing is measured: an explicit budget then fails closed (`WarmupFailed`),
    /// the default one is not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[1-9][0-9]{0,17}(Ki|Mi|Gi|Ti|k|M|G|T)?$"))]
    pub device_memory_budget: Option<String>,
}

fn default_iterations() -> u32 {
    10
}

/// `|actual - golden| <= atol + rtol * |golden|`, element-wise.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Tolerance {
    /// Absolute tolerance.
    #[schemars(range(min = 0.0))]
    pub atol: f64,
    /// Relative tolerance.
    #[schemars(range(min = 0.0))]
    pub rtol: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Self {
            atol: 1e-5,
            rtol: 1e-4,
        }
    }
}

/// The tolerance for one named output.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OutputTolerance {
    /// Output name as in the model graph.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Absolute tolerance.
    #[schemars(range(min = 0.0))]
    pub atol: f64,
    /// Relative tolerance.
    #[schemars(range(min = 0.0))]
    pub rtol: f64,
    /// Whether the fixture's golden values for this output may be NaN or ±Inf. Off by
    /// default: a non-finite golden value is refused, since NaN would match NaN and Inf makes
    /// the tolerance meaningless. When on, a golden NaN matches only NaN and a golden Inf only
    /// the same-signed Inf.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_non_finite: bool,
    /// Check only the first this many elements (of the flattened output): a language model's
    /// greedy `tokens` must match the golden ones for the first K positions (with `atol` and
    /// `rtol` 0), after which a continuation that went another way is another text, not an
    /// error. Unset: every element.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub first_elements: Option<u32>,
}

impl Warmup {
    /// Whether golden values of `output` may be NaN or ±Inf.
    pub fn allows_non_finite(&self, output: &str) -> bool {
        self.outputs
            .iter()
            .any(|o| o.name == output && o.allow_non_finite)
    }

    /// How many leading elements of `output` parity checks (`None`: all).
    pub fn first_elements(&self, output: &str) -> Option<usize> {
        self.outputs
            .iter()
            .find(|o| o.name == output)
            .and_then(|o| o.first_elements)
            .and_then(|k| usize::try_from(k).ok())
    }

    /// Whether parity skips `output`.
    pub fn excludes(&self, output: &str) -> bool {
        self.exclude_outputs.iter().any(|o| o == output)
    }

    /// The tolerance that applies to `output`.
    pub fn tolerance(&self, output: &str) -> Tolerance {
        self.outputs
            .iter()
            .find(|o| o.name == output)
            .map(|o| Tolerance {
                atol: o.atol,
                rtol: o.rtol,
            })
            .unwrap_or(self.default_tolerance)
    }
}

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

fn is_zero(n: &i32) -> bool {
    *n == 0
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

/// Why a profile cannot be bound to a model.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    /// A symbol of the model has no value in the profile.
    #[error(
        "profile {profile:?} does not bind symbol {symbol:?} (input {input:?}); add it under profiles[].dims"
    )]
    Unbound {
        profile: String,
        symbol: String,
        input: String,
    },
    /// A value is outside the symbol's bounds.
    #[error(
        "profile {profile:?} binds {symbol}={value}, outside [{min}, {max}] declared on input {input:?}"
    )]
    OutOfBounds {
        profile: String,
        symbol: String,
        value: i64,
        min: i64,
        max: i64,
        input: String,
    },
    /// The profile binds a symbol the model does not have.
    #[error("profile {profile:?} binds {symbol:?}, which no input of the model declares")]
    Unknown { profile: String, symbol: String },
}

impl ShapeProfile {
    /// Concrete shapes of every model input under this profile, checked against the bounds.
    pub fn bind(
        &self,
        model: &ModelArtifactSpec,
    ) -> Result<BTreeMap<String, Vec<usize>>, ProfileError> {
        let symbols = model.symbols();
        if let Some(extra) = self.dims.keys().find(|k| !symbols.contains(k.as_str())) {
            return Err(ProfileError::Unknown {
                profile: self.name.clone(),
                symbol: extra.clone(),
            });
        }
        let mut shapes = BTreeMap::new();
        for input in &model.inputs {
            let mut shape = Vec::with_capacity(input.dims.len());
            for dim in &input.dims {
                let value = match (&dim.size, &dim.symbol) {
                    (Some(size), _) => *size,
                    (None, Some(symbol)) => {
                        let value =
                            *self.dims.get(symbol).ok_or_else(|| ProfileError::Unbound {
                                profile: self.name.clone(),
                                symbol: symbol.clone(),
                                input: input.name.clone(),
                            })?;
                        let (min, max) = (dim.min.unwrap_or(0), dim.max.unwrap_or(i64::MAX));
                        if value < min || value > max {
                            return Err(ProfileError::OutOfBounds {
                                profile: self.name.clone(),
                                symbol: symbol.clone(),
                                value,
                                min,
                                max,
                                input: input.name.clone(),
                            });
                        }
                        value
                    }
                    (None, None) => 0,
                };
                shape.push(usize::try_from(value).unwrap_or(0));
            }
            shapes.insert(input.name.clone(), shape);
        }
        Ok(shapes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_fallback_policies_serialise_as_their_names() {
        crate::test_support::serde_names(&CpuFallbackPolicy::ALL, |p| p.as_str());
        for p in CpuFallbackPolicy::ALL {
            let cpu = CpuFallback {
                policy: p,
                max_share_percent: Some(10),
            };
            let share = (p == CpuFallbackPolicy::UpToShare).then_some(":10");
            assert_eq!(
                cpu.describe(),
                format!("{}{}", p.as_str(), share.unwrap_or_default())
            );
        }
    }

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
