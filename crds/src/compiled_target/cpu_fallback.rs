//! `spec.backend.cpuFallback`: how much of a graph may run on the CPU when another execution
//! provider was asked for.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

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
}
