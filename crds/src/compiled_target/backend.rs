//! `spec.backend`: which engine compiles and runs the model (its kind, version, execution
//! provider, optimisation level, a foreign compiler's image and command), and the precision it
//! computes in. Pure data and the pure decisions over it.

use std::collections::BTreeMap;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::cpu_fallback::CpuFallback;
use super::cuda::CudaSettings;
use crate::labels::ClassFacts;

/// Engine backend and its version.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.kind != 'exec' || (has(self.image) && has(self.command) && size(self.command) > 0)").message("backend kind exec needs backend.image (the compiler image) and backend.command (what to run in it)"))]
#[x_kube(validation = Rule::new("self.kind == 'exec' || (!has(self.image) && !has(self.command))").message("backend.image and backend.command are for kind exec; drop them or set kind: exec"))]
#[x_kube(validation = Rule::new("!has(self.image) || self.image.matches('^[^@]+@sha256:[0-9a-f]{64}$')").message("pin backend.image by digest (name@sha256:<64 hex>): the compile key must name the exact compiler"))]
#[x_kube(validation = Rule::new("!has(self.optimizationLevel) || self.kind in ['onnxruntime', 'auto']").message("backend.optimizationLevel is for kind onnxruntime or auto; drop it or set kind: onnxruntime"))]
#[x_kube(validation = Rule::new("!has(self.executionProvider) || self.executionProvider == 'cpu' || self.kind == 'onnxruntime' || (self.kind in ['llamacpp', 'iree'] && self.executionProvider == 'cuda')").message("backend.executionProvider cuda needs kind onnxruntime, llamacpp or iree, tensorrt kind onnxruntime; tract and exec run on the CPU"))]
#[x_kube(validation = Rule::new("self.kind != 'auto' || (!has(self.executionProvider) && !has(self.version))").message("kind auto chooses the engine and its provider per class by measurement; drop backend.executionProvider and backend.version, or name one kind"))]
#[x_kube(validation = Rule::new("!has(self.cuda) || self.kind in ['onnxruntime', 'auto']").message("backend.cuda configures ONNX Runtime's CUDA provider; it is for kind onnxruntime or auto"))]
#[x_kube(validation = Rule::new("!has(self.cuda) || !has(self.cuda.cudaGraphs) || self.cuda.cudaGraphs != true || (has(self.cpuFallback) && self.cpuFallback.policy in ['Forbidden', 'Strict'])").message("backend.cuda.cudaGraphs replays one captured CUDA graph, which ONNX Runtime builds only when no compute node runs on the CPU: set backend.cpuFallback.policy Forbidden (shape nodes may stay on the CPU) or Strict"))]
#[x_kube(validation = Rule::new("!has(self.llamacpp) || self.kind == 'llamacpp'").message("backend.llamacpp configures llama.cpp; it is for kind llamacpp"))]
pub struct Backend {
    /// `tract` (built in), `onnxruntime`, `auto` (every engine the class can run is built,
    /// checked and measured on the class's hardware, and the fastest that passes is kept),
    /// `llamacpp` (GGUF language models on llama.cpp, built in), `iree` (ONNX compiled to
    /// machine code for each class's CPU level by IREE, runtime built in), `tensorrt`, or `exec`
    /// (any compiler image).
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
    /// `cpu` otherwise. Kind `iree` with `cuda` compiles for the class's compute capability
    /// (refused where IREE has no code generator for it, e.g. 9.0). Part of the compile key.
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
    /// for kinds `onnxruntime` and `llamacpp`, CUDA on a class with an NVIDIA GPU (its class
    /// facts name a `nvidia.com/gpu.product`) and the CPU elsewhere, so one target gets a GPU
    /// engine on GPU classes and a CPU engine on CPU classes; the CPU for other kinds.
    pub fn provider_for(&self, class: &ClassFacts) -> ExecutionProvider {
        self.execution_provider.unwrap_or_else(|| {
            let gpu = class
                .get(crate::labels::GPU_PRODUCT)
                .is_some_and(|p| !p.is_empty());
            let has_gpu_engine =
                matches!(self.kind, BackendKind::Onnxruntime | BackendKind::Llamacpp);
            if has_gpu_engine && gpu {
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
            let mut options = self.llamacpp.clone().unwrap_or_default().options();
            // Only off the CPU, so the keys of CPU targets stay as they were.
            let provider = self.provider_for(class);
            if provider != ExecutionProvider::Cpu {
                options.insert("executionProvider".into(), provider.as_str().into());
            }
            return options;
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

    /// The settings of a built artifact, read back from its build manifest's backend options
    /// (what [`Backend::options`] wrote, with `kind` the manifest's backend): the execution
    /// provider, the optimisation level, ONNX Runtime's CUDA settings and llama.cpp's weight type
    /// and context length. A key that is absent or does not parse stays unset (its default). The
    /// CPU-fallback policy is the target's, not the artifact's, and is not read back.
    pub fn from_options(kind: BackendKind, options: &BTreeMap<String, String>) -> Self {
        fn parse<T: serde::de::DeserializeOwned>(
            o: &BTreeMap<String, String>,
            k: &str,
        ) -> Option<T> {
            let v = o.get(k)?.clone();
            serde_json::from_value(serde_json::Value::String(v)).ok()
        }
        let mut b = Self::of(kind);
        b.execution_provider = parse(options, "executionProvider");
        b.optimization_level = parse(options, "optimizationLevel");
        let cuda_keys = [
            "cuda.convAlgoSearch",
            "cuda.arenaExtendStrategy",
            "cuda.cudaGraphs",
        ];
        if cuda_keys.iter().any(|k| options.contains_key(*k)) {
            b.cuda = Some(CudaSettings {
                conv_algo_search: parse(options, "cuda.convAlgoSearch"),
                arena_extend_strategy: parse(options, "cuda.arenaExtendStrategy"),
                cuda_graphs: options.get("cuda.cudaGraphs").map(|v| v == "true"),
            });
        }
        if kind == BackendKind::Llamacpp {
            b.llamacpp = Some(crate::llamacpp::LlamacppSettings::from_options(options));
        }
        b
    }

    /// Kind `auto`: the engines a class's compile builds and measures, in the order that
    /// breaks ties (the first passing one is kept unless a later one is clearly faster): tract,
    /// then ONNX Runtime on the CPU, then IREE on an amd64 class, then, on a class with an
    /// NVIDIA GPU, ONNX Runtime's CUDA provider. Each carries the target's ONNX Runtime settings; empty for other kinds.
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
        // IREE compiles x86-64 code for the class's level (on any amd64 class, the CPU of a GPU
        // node too).
        if class.get(crate::labels::ARCH).is_none_or(|a| a == "amd64") {
            candidates.push(Backend::of(BackendKind::Iree));
        }
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
    /// IREE: the ONNX source compiled through MLIR to machine code for each class's CPU (its
    /// x86-64 level), run by IREE's runtime built into kiln-agent.
    Iree,
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
            Self::Iree => "iree",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiled_target::cuda::{ArenaExtendStrategy, ConvAlgoSearch};
    use crate::llamacpp::{LlamacppSettings, Quantization};

    fn gpu_class() -> ClassFacts {
        ClassFacts::from([(crate::labels::GPU_PRODUCT.to_string(), "H100".to_string())])
    }

    /// Every option a backend writes is read back to the same settings, so a server that loads
    /// an artifact by its manifest runs it as the compile did.
    #[test]
    fn options_round_trip_through_from_options() {
        let cuda = Backend {
            execution_provider: Some(ExecutionProvider::Cuda),
            optimization_level: Some(OptimizationLevel::All),
            cuda: Some(CudaSettings {
                conv_algo_search: Some(ConvAlgoSearch::Heuristic),
                arena_extend_strategy: Some(ArenaExtendStrategy::SameAsRequested),
                cuda_graphs: Some(true),
            }),
            ..Backend::of(BackendKind::Onnxruntime)
        };
        let llama = Backend {
            execution_provider: Some(ExecutionProvider::Cuda),
            llamacpp: Some(LlamacppSettings {
                quantization: Some(Quantization::Q4KM),
                context_length: Some(2048),
                ..LlamacppSettings::default()
            }),
            ..Backend::of(BackendKind::Llamacpp)
        };
        let source = Backend {
            llamacpp: Some(LlamacppSettings::default()),
            ..Backend::of(BackendKind::Llamacpp)
        };
        let cpu = Backend::of(BackendKind::Onnxruntime);
        for (b, class) in [
            (&cuda, gpu_class()),
            (&llama, gpu_class()),
            (&source, ClassFacts::new()),
            (&cpu, ClassFacts::new()),
            (&Backend::of(BackendKind::Tract), ClassFacts::new()),
        ] {
            let written = b.options(&class);
            let read = Backend::from_options(b.kind, &written);
            assert_eq!(read.options(&class), written, "{b:?}");
        }
        let read = Backend::from_options(BackendKind::Llamacpp, &llama.options(&gpu_class()));
        assert_eq!(read.llamacpp, llama.llamacpp);
        assert_eq!(read.execution_provider, Some(ExecutionProvider::Cuda));
        let read = Backend::from_options(BackendKind::Onnxruntime, &cuda.options(&gpu_class()));
        assert_eq!(
            (read.cuda, read.optimization_level),
            (cuda.cuda.clone(), cuda.optimization_level)
        );
    }

    #[test]
    fn from_options_leaves_what_does_not_parse_unset() {
        let garbage = BTreeMap::from([
            ("executionProvider".to_string(), "quantum".to_string()),
            ("llamacpp.contextLength".to_string(), "-3".to_string()),
            ("llamacpp.quantization".to_string(), "Q1_Z".to_string()),
        ]);
        let b = Backend::from_options(BackendKind::Llamacpp, &garbage);
        assert_eq!(b.execution_provider, None);
        assert_eq!(b.llamacpp, Some(LlamacppSettings::default()));
    }
}
