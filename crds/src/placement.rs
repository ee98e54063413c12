//! Partition evidence: which execution provider ran which part of a graph, how many provider
//! boundaries there are, and how much fell back to the CPU. Written into the build manifest by a
//! compile, into the CompiledTarget's class row by the operator and into the KilnNode row by the
//! agent after warmup, with the same fields for every backend (tract: one provider, one
//! partition, no fallback) so dashboards need no special case. Pure.

use std::collections::BTreeMap;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// How many CPU-fallback nodes a [`Placement`] names; the count is always complete.
pub const MAX_NAMED_FALLBACK_NODES: usize = 32;

/// Which provider ran which nodes of one engine, measured on a real run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The provider the target asked for, short name: `cpu`, `cuda`, `tensorrt`, `tract`.
    pub requested: String,
    /// Short provider name → nodes it ran.
    #[serde(default)]
    pub nodes: BTreeMap<String, i64>,
    /// Runs of consecutive nodes on one provider, in execution order (1 when one provider
    /// ran everything).
    #[serde(default)]
    pub partitions: i64,
    /// Nodes the CPU ran although another provider was requested.
    #[serde(default)]
    pub fallback_node_count: i64,
    /// The first of those nodes (at most 32), in execution order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_nodes: Vec<PlacedNode>,
    /// `fallbackNodeCount` / all nodes: 0 when the CPU was what was requested.
    #[serde(default)]
    pub fallback_share: f64,
}

/// One graph node as the runtime ran it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PlacedNode {
    /// Node name (after the runtime's graph optimisation, e.g. a fused node).
    pub name: String,
    /// Operator type.
    pub op_type: String,
}

/// The short provider names used in status and as metric label values; anything else reads as
/// `other`, so label sets stay bounded whatever a runtime reports.
pub const PROVIDERS: [&str; 5] = ["cpu", "cuda", "tensorrt", "tract", "other"];

/// The short name of a runtime's provider name (`CUDAExecutionProvider` → `cuda`).
pub fn short_provider(name: &str) -> &'static str {
    match name {
        "CPUExecutionProvider" | "cpu" => "cpu",
        "CUDAExecutionProvider" | "cuda" => "cuda",
        "TensorrtExecutionProvider" | "NvTensorRTRTXExecutionProvider" | "tensorrt" => "tensorrt",
        "tract" => "tract",
        _ => "other",
    }
}

impl Placement {
    /// The placement of `ran` (provider and node, in execution order) when `requested` was
    /// asked for. Nodes not on the requested provider but on the CPU are the fallback.
    pub fn measure<'a>(
        requested: &str,
        ran: impl IntoIterator<Item = (&'a str, PlacedNode)>,
    ) -> Self {
        let requested = short_provider(requested).to_string();
        let mut placement = Self {
            requested: requested.clone(),
            ..Self::default()
        };
        let mut last: Option<&'static str> = None;
        let mut total = 0i64;
        for (provider, node) in ran {
            let provider = short_provider(provider);
            total += 1;
            *placement.nodes.entry(provider.to_string()).or_default() += 1;
            if last != Some(provider) {
                placement.partitions += 1;
                last = Some(provider);
            }
            if provider == "cpu" && requested != "cpu" {
                placement.fallback_node_count += 1;
                if placement.fallback_nodes.len() < MAX_NAMED_FALLBACK_NODES {
                    placement.fallback_nodes.push(node);
                }
            }
        }
        if total > 0 {
            placement.fallback_share = placement.fallback_node_count as f64 / total as f64;
        }
        placement
    }

    /// Every node on one provider (tract's engines): one partition, no fallback.
    pub fn single(provider: &str, nodes: i64) -> Self {
        let provider = short_provider(provider).to_string();
        Self {
            requested: provider.clone(),
            nodes: BTreeMap::from([(provider, nodes)]),
            partitions: i64::from(nodes > 0),
            ..Self::default()
        }
    }

    /// All nodes, on every provider.
    pub fn total(&self) -> i64 {
        self.nodes.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> PlacedNode {
        PlacedNode {
            name: name.into(),
            op_type: "Op".into(),
        }
    }

    #[test]
    fn counts_providers_boundaries_and_fallback() {
        let ran = [
            ("CUDAExecutionProvider", node("a")),
            ("CUDAExecutionProvider", node("b")),
            ("CPUExecutionProvider", node("c")),
            ("CUDAExecutionProvider", node("d")),
        ];
        let p = Placement::measure("CUDAExecutionProvider", ran);
        assert_eq!(p.requested, "cuda");
        assert_eq!(
            p.nodes,
            BTreeMap::from([("cuda".into(), 3), ("cpu".into(), 1)])
        );
        assert_eq!(p.partitions, 3);
        assert_eq!(p.fallback_node_count, 1);
        assert_eq!(p.fallback_nodes, vec![node("c")]);
        assert!((p.fallback_share - 0.25).abs() < 1e-12);
    }

    #[test]
    fn cpu_requested_is_never_fallback() {
        let ran = [
            ("CPUExecutionProvider", node("a")),
            ("CPUExecutionProvider", node("b")),
        ];
        let p = Placement::measure("CPUExecutionProvider", ran);
        assert_eq!((p.partitions, p.fallback_node_count), (1, 0));
        assert_eq!(p.fallback_share, 0.0);
    }

    #[test]
    fn names_are_bounded_counts_are_not() {
        let ran = (0..100).map(|i| ("CPUExecutionProvider", node(&format!("n{i}"))));
        let p = Placement::measure("cuda", ran);
        assert_eq!(p.fallback_node_count, 100);
        assert_eq!(p.fallback_nodes.len(), MAX_NAMED_FALLBACK_NODES);
        assert_eq!(p.fallback_share, 1.0);
    }

    #[test]
    fn unknown_providers_share_one_label() {
        assert_eq!(short_provider("MyVendorExecutionProvider"), "other");
        assert_eq!(short_provider("NvTensorRTRTXExecutionProvider"), "tensorrt");
        let p = Placement::single("tract", 7);
        assert_eq!((p.total(), p.partitions, p.fallback_share), (7, 1, 0.0));
    }
}
