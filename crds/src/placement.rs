//! Partition evidence: which execution provider ran which part of a graph, how many provider
//! boundaries there are, how much of the run's kernel time the CPU took, which of its nodes only
//! computed shapes, and what crossed between providers. Written into the build manifest by a
//! compile, into the CompiledTarget's class row by the operator and into the KilnNode row by the
//! agent after warmup, with the same fields for every backend (tract: one provider, one
//! partition, no fallback, no kernel times) so dashboards need no special case. Pure.
//!
//! A CPU node is a *shape* node when its operator is `Shape` or `Size` (they read only a
//! tensor's dimensions), or when the run gave the shape of every input and output it has and
//! each of them has rank ≤ 1 and at most [`MAX_SHAPE_ELEMENTS`] elements. Such a node touches at
//! most a few hundred numbers, which is what ONNX Runtime's GPU providers leave on the CPU on
//! purpose (`Shape` → `Gather` → `Unsqueeze` → `Concat` on int64 shape vectors, whose length is a
//! tensor's rank) and what no model's real work (convolutions, matrix products, anything over an
//! activation) fits in. Every other CPU node is a *compute* node, including one whose shapes the
//! run did not report. The `MemcpyToHost` / `MemcpyFromHost` nodes ONNX Runtime inserts at
//! partition boundaries are *transfers*, counted apart and never fallback.

use std::collections::BTreeMap;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// How many nodes each list of a [`Placement`] names; the counts are always complete.
pub const MAX_NAMED_FALLBACK_NODES: usize = 32;

/// The most elements a rank ≤ 1 tensor of a shape node may hold (see the module docs).
pub const MAX_SHAPE_ELEMENTS: i64 = 64;

/// The operators ONNX Runtime inserts to copy tensors between providers.
pub const TRANSFER_OPS: [&str; 2] = ["MemcpyToHost", "MemcpyFromHost"];

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
    /// Nodes the CPU ran although another provider was requested (shape and compute nodes;
    /// transfers are not counted).
    #[serde(default)]
    pub fallback_node_count: i64,
    /// The first of those nodes (at most 32), in execution order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_nodes: Vec<PlacedNode>,
    /// `fallbackNodeCount` / all nodes: 0 when the CPU was what was requested.
    #[serde(default)]
    pub fallback_share: f64,
    /// Short provider name → kernel time of its nodes in the measured run, in seconds
    /// (ONNX Runtime's profile; empty where the backend measures none, as with tract).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_seconds: BTreeMap<String, f64>,
    /// The CPU fallback nodes' share of all kernel time: 0 when the CPU was requested; the
    /// node share (`fallbackShare`) when the run measured no kernel time.
    #[serde(default)]
    pub fallback_time_share: f64,
    /// Fallback nodes that only compute shapes: operator `Shape` or `Size`, or every input and
    /// output tensor of rank ≤ 1 with at most 64 elements. `cpuFallback: Forbidden` allows them.
    #[serde(default)]
    pub shape_node_count: i64,
    /// The first of the shape nodes (at most 32), in execution order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shape_nodes: Vec<PlacedNode>,
    /// Fallback nodes that are not shape nodes, including any whose tensor shapes the run did
    /// not report. `cpuFallback: Forbidden` refuses them.
    #[serde(default)]
    pub compute_node_count: i64,
    /// The first of the compute nodes (at most 32), in execution order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compute_nodes: Vec<PlacedNode>,
    /// Copies between providers (`MemcpyToHost` / `MemcpyFromHost` nodes) in the measured run.
    #[serde(default)]
    pub transfer_count: i64,
    /// Kernel time of those copies, in seconds.
    #[serde(default)]
    pub transfer_seconds: f64,
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

/// What a node's work is, as CPU fallback is judged (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Arithmetic on tensor shapes.
    Shape,
    /// Anything else.
    Compute,
    /// A copy between providers.
    Transfer,
}

impl Work {
    /// The work of a node of `op_type` whose input and output tensors had `shapes` (`None`
    /// when the run did not report them).
    pub fn of(op_type: &str, shapes: Option<&[Vec<i64>]>) -> Self {
        if TRANSFER_OPS.contains(&op_type) {
            return Self::Transfer;
        }
        if matches!(op_type, "Shape" | "Size") {
            return Self::Shape;
        }
        let small = |dims: &Vec<i64>| {
            dims.len() <= 1 && dims.iter().all(|d| (0..=MAX_SHAPE_ELEMENTS).contains(d))
        };
        match shapes {
            Some(shapes) if !shapes.is_empty() && shapes.iter().all(small) => Self::Shape,
            _ => Self::Compute,
        }
    }

    /// The work of a node seen twice (a loop body): shape only if both runs were.
    pub fn and(self, other: Self) -> Self {
        if self == other { self } else { Self::Compute }
    }
}

/// One node of a measured run: who ran it, for how long (summed over its runs), and its work.
#[derive(Clone, Debug, PartialEq)]
pub struct RanNode {
    /// The runtime's provider name.
    pub provider: String,
    /// The node.
    pub node: PlacedNode,
    /// Kernel time, microseconds.
    pub kernel_micros: i64,
    /// Shape, compute or transfer.
    pub work: Work,
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

/// Pushes `node` to `list` while it names fewer than [`MAX_NAMED_FALLBACK_NODES`].
fn name_bounded(list: &mut Vec<PlacedNode>, node: &PlacedNode) {
    if list.len() < MAX_NAMED_FALLBACK_NODES {
        list.push(node.clone());
    }
}

impl Placement {
    /// The placement of `ran` (each node once, in execution order) when `requested` was asked
    /// for. Nodes not on the requested provider but on the CPU are the fallback, unless they
    /// are transfers.
    pub fn measure(requested: &str, ran: impl IntoIterator<Item = RanNode>) -> Self {
        let requested = short_provider(requested).to_string();
        let mut placement = Self {
            requested: requested.clone(),
            ..Self::default()
        };
        let mut last: Option<&'static str> = None;
        let (mut total_micros, mut fallback_micros) = (0i64, 0i64);
        for ran in ran {
            let provider = short_provider(&ran.provider);
            *placement.nodes.entry(provider.to_string()).or_default() += 1;
            *placement
                .kernel_seconds
                .entry(provider.to_string())
                .or_default() += ran.kernel_micros as f64 / 1e6;
            total_micros += ran.kernel_micros;
            if last != Some(provider) {
                placement.partitions += 1;
                last = Some(provider);
            }
            if ran.work == Work::Transfer {
                placement.transfer_count += 1;
                placement.transfer_seconds += ran.kernel_micros as f64 / 1e6;
            } else if provider == "cpu" && requested != "cpu" {
                fallback_micros += ran.kernel_micros;
                placement.fall_back(&ran);
            }
        }
        let total = placement.total();
        if total > 0 {
            placement.fallback_share = placement.fallback_node_count as f64 / total as f64;
        }
        placement.fallback_time_share = if total_micros > 0 {
            fallback_micros as f64 / total_micros as f64
        } else {
            placement.fallback_share
        };
        placement
    }

    /// Counts and names a CPU fallback node.
    fn fall_back(&mut self, ran: &RanNode) {
        self.fallback_node_count += 1;
        name_bounded(&mut self.fallback_nodes, &ran.node);
        if ran.work == Work::Shape {
            self.shape_node_count += 1;
            name_bounded(&mut self.shape_nodes, &ran.node);
        } else {
            self.compute_node_count += 1;
            name_bounded(&mut self.compute_nodes, &ran.node);
        }
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

    /// Kernel time of the run on every provider, seconds. Folded from +0.0: `sum()` of no
    /// floats is -0.0, which prints as "-0.00 ms".
    pub fn total_kernel_seconds(&self) -> f64 {
        self.kernel_seconds.values().fold(0.0, |total, s| total + s)
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

    fn run_on(provider: &str, name: &str, micros: i64, work: Work) -> RanNode {
        RanNode {
            provider: provider.into(),
            node: node(name),
            kernel_micros: micros,
            work,
        }
    }

    #[test]
    fn counts_providers_boundaries_and_fallback() {
        let ran = [
            run_on("CUDAExecutionProvider", "a", 10, Work::Compute),
            run_on("CUDAExecutionProvider", "b", 10, Work::Compute),
            run_on("CPUExecutionProvider", "c", 20, Work::Compute),
            run_on("CUDAExecutionProvider", "d", 10, Work::Compute),
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
        // 20 of 50 µs on the CPU.
        assert!((p.fallback_time_share - 0.4).abs() < 1e-12);
        assert!((p.kernel_seconds["cpu"] - 20e-6).abs() < 1e-15);
        assert_eq!((p.compute_node_count, p.shape_node_count), (1, 0));
    }

    #[test]
    fn shape_compute_and_transfers_are_apart() {
        let ran = [
            run_on("CUDAExecutionProvider", "conv", 900, Work::Compute),
            run_on("CPUExecutionProvider", "shape", 5, Work::Shape),
            run_on("CPUExecutionProvider", "gather", 5, Work::Shape),
            run_on("CUDAExecutionProvider", "copy", 40, Work::Transfer),
            run_on("CPUExecutionProvider", "nms", 50, Work::Compute),
        ];
        let p = Placement::measure("cuda", ran);
        assert_eq!(p.fallback_node_count, 3);
        assert_eq!(p.shape_node_count, 2);
        assert_eq!(p.shape_nodes, vec![node("shape"), node("gather")]);
        assert_eq!(
            (p.compute_node_count, p.compute_nodes.clone()),
            (1, vec![node("nms")])
        );
        assert_eq!(p.transfer_count, 1);
        assert!((p.transfer_seconds - 40e-6).abs() < 1e-15);
        assert!(
            (p.fallback_time_share - 0.06).abs() < 1e-12,
            "60 of 1000 µs"
        );
        // A transfer on the CPU is still a transfer, not fallback.
        let p = Placement::measure(
            "cuda",
            [run_on("CPUExecutionProvider", "c", 1, Work::Transfer)],
        );
        assert_eq!((p.fallback_node_count, p.transfer_count), (0, 1));
    }

    #[test]
    fn a_node_is_shape_work_only_when_all_its_tensors_are_small_vectors() {
        let shapes = |s: &[&[i64]]| s.iter().map(|d| d.to_vec()).collect::<Vec<_>>();
        assert_eq!(
            Work::of("Shape", None),
            Work::Shape,
            "reads dimensions only"
        );
        assert_eq!(
            Work::of("Size", Some(&shapes(&[&[1, 3, 640, 640], &[]]))),
            Work::Shape
        );
        let gather = shapes(&[&[4], &[], &[]]);
        assert_eq!(Work::of("Gather", Some(&gather)), Work::Shape);
        assert_eq!(
            Work::of("Concat", Some(&shapes(&[&[1], &[1], &[2]]))),
            Work::Shape
        );
        assert_eq!(Work::of("Add", Some(&shapes(&[&[64], &[64]]))), Work::Shape);
        assert_eq!(
            Work::of("Add", Some(&shapes(&[&[65], &[65]]))),
            Work::Compute
        );
        assert_eq!(
            Work::of("Reshape", Some(&shapes(&[&[1, 8400], &[2], &[8400]]))),
            Work::Compute
        );
        assert_eq!(
            Work::of("NonZero", None),
            Work::Compute,
            "no shapes: compute"
        );
        assert_eq!(
            Work::of("Cast", Some(&[])),
            Work::Compute,
            "no shapes: compute"
        );
        assert_eq!(Work::of("Cast", Some(&shapes(&[&[-1]]))), Work::Compute);
        assert_eq!(Work::of("MemcpyFromHost", None), Work::Transfer);
        assert_eq!(Work::Shape.and(Work::Shape), Work::Shape);
        assert_eq!(Work::Shape.and(Work::Compute), Work::Compute);
    }

    #[test]
    fn cpu_requested_is_never_fallback() {
        let ran = [
            run_on("CPUExecutionProvider", "a", 3, Work::Compute),
            run_on("CPUExecutionProvider", "b", 0, Work::Shape),
        ];
        let p = Placement::measure("CPUExecutionProvider", ran);
        assert_eq!((p.partitions, p.fallback_node_count), (1, 0));
        assert_eq!((p.fallback_share, p.fallback_time_share), (0.0, 0.0));
        assert_eq!((p.shape_node_count, p.compute_node_count), (0, 0));
        assert!(p.total_kernel_seconds() > 0.0);
    }

    #[test]
    fn no_kernel_time_is_positive_zero() {
        let total = Placement::default().total_kernel_seconds();
        assert!(total == 0.0 && total.is_sign_positive(), "{total:?}");
        assert_eq!(format!("{:.2}", total * 1000.0), "0.00");
    }

    #[test]
    fn names_are_bounded_counts_are_not() {
        let names: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
        let ran = names
            .iter()
            .map(|n| run_on("CPUExecutionProvider", n, 0, Work::Compute));
        let p = Placement::measure("cuda", ran);
        assert_eq!(p.fallback_node_count, 100);
        assert_eq!(p.compute_node_count, 100);
        assert_eq!(p.fallback_nodes.len(), MAX_NAMED_FALLBACK_NODES);
        assert_eq!(p.compute_nodes.len(), MAX_NAMED_FALLBACK_NODES);
        assert_eq!(p.fallback_share, 1.0);
        assert_eq!(
            p.fallback_time_share, 1.0,
            "no time measured: the node share"
        );
    }

    #[test]
    fn unknown_providers_share_one_label() {
        assert_eq!(short_provider("MyVendorExecutionProvider"), "other");
        assert_eq!(short_provider("NvTensorRTRTXExecutionProvider"), "tensorrt");
        let p = Placement::single("tract", 7);
        assert_eq!((p.total(), p.partitions, p.fallback_share), (7, 1, 0.0));
        assert!(p.kernel_seconds.is_empty());
    }

    #[test]
    fn old_placements_still_read() {
        let old: Placement = serde_json::from_value(serde_json::json!({
            "requested": "cuda", "nodes": {"cuda": 3}, "partitions": 1,
            "fallbackNodeCount": 0, "fallbackShare": 0.0
        }))
        .expect("a placement written before kernel times");
        assert_eq!((old.compute_node_count, old.transfer_count), (0, 0));
    }
}
