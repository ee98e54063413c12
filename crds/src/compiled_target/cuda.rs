//! `spec.backend.cuda`: ONNX Runtime's CUDA provider options.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

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
