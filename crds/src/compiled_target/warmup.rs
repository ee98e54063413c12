//! `spec.warmup`: the warmup iterations, parity tolerances and budgets every node checks
//! before it reports ready.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

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
