//! Whether a measured placement is allowed by the target's CPU fallback policy: `Forbidden`
//! refuses any compute node the CPU ran although another provider was requested (shape nodes,
//! see [`kiln_crds::placement`], are allowed), naming the compute nodes; `Strict` refuses any
//! node at all on the CPU, naming them; `UpToShare` refuses a kernel-time share above the
//! limit, stating the measured share; `Allowed` takes anything. The same decision at compile (on
//! the parity run) and on every node (on the warmup's first run). Pure.

use kiln_crds::compiled_target::{CpuFallback, CpuFallbackPolicy};
use kiln_crds::placement::{PlacedNode, Placement};

use kiln_node_core::error::{Error, Result};

/// Checks `placement` against `policy`; a refusal is `UnsupportedOperator`.
pub fn check(backend: &str, policy: &CpuFallback, placement: &Placement) -> Result<()> {
    if placement.fallback_node_count == 0 {
        return Ok(());
    }
    let p = placement;
    let share = p.fallback_time_share * 100.0;
    let (refused, named, count) = match (policy.policy, policy.max_share_percent) {
        (CpuFallbackPolicy::Allowed, _) => return Ok(()),
        (CpuFallbackPolicy::Forbidden, _) if p.compute_node_count == 0 => return Ok(()),
        (CpuFallbackPolicy::Forbidden, _) => (
            format!(
                "cpuFallback is Forbidden, but {} of {} nodes that compute ran on the CPU instead of {} (besides {} shape nodes, which are allowed)",
                p.compute_node_count,
                p.total(),
                p.requested,
                p.shape_node_count
            ),
            &p.compute_nodes,
            p.compute_node_count,
        ),
        (CpuFallbackPolicy::Strict, _) => (
            format!(
                "cpuFallback is Strict, but {} of {} nodes ran on the CPU instead of {} ({} of them shape nodes)",
                p.fallback_node_count,
                p.total(),
                p.requested,
                p.shape_node_count
            ),
            &p.fallback_nodes,
            p.fallback_node_count,
        ),
        (CpuFallbackPolicy::UpToShare, Some(max)) if share <= f64::from(max) => return Ok(()),
        (CpuFallbackPolicy::UpToShare, max) => (
            format!(
                "{share:.1}% of the kernel time ({} of {} nodes) ran on the CPU instead of {}, over cpuFallback.maxSharePercent {}",
                p.fallback_node_count,
                p.total(),
                p.requested,
                max.unwrap_or(0)
            ),
            &p.fallback_nodes,
            p.fallback_node_count,
        ),
    };
    Err(Error::UnsupportedOperator {
        backend: backend.to_string(),
        operators: named_list(refused, named, count),
    })
}

/// The refusal, then each named node, then how many more there are.
fn named_list(refused: String, named: &[PlacedNode], count: i64) -> Vec<String> {
    let mut operators = vec![refused];
    operators.extend(named.iter().map(|n| format!("{} ({})", n.name, n.op_type)));
    let unnamed = count - named.len() as i64;
    if unnamed > 0 {
        operators.push(format!("and {unnamed} more"));
    }
    operators
}

#[cfg(test)]
mod tests {
    use kiln_crds::FailureReason;
    use kiln_crds::placement::{RanNode, Work};

    use super::*;

    /// `cuda` nodes on the GPU, then `cpu` compute and `shape` shape nodes on the CPU, 10 µs each.
    fn mixed(cuda: usize, cpu: usize, shape: usize) -> Placement {
        let on = |provider: &str, name: String, op: &str, work| RanNode {
            provider: provider.into(),
            node: PlacedNode {
                name,
                op_type: op.into(),
            },
            kernel_micros: 10,
            work,
        };
        let ran = (0..cuda)
            .map(|i| {
                on(
                    "CUDAExecutionProvider",
                    format!("gpu{i}"),
                    "Conv",
                    Work::Compute,
                )
            })
            .chain((0..cpu).map(|i| {
                on(
                    "CPUExecutionProvider",
                    format!("cpu{i}"),
                    "NonZero",
                    Work::Compute,
                )
            }))
            .chain((0..shape).map(|i| {
                on(
                    "CPUExecutionProvider",
                    format!("shape{i}"),
                    "Gather",
                    Work::Shape,
                )
            }));
        Placement::measure("CUDAExecutionProvider", ran.collect::<Vec<_>>())
    }

    fn placement(cuda: usize, cpu: usize) -> Placement {
        mixed(cuda, cpu, 0)
    }

    fn policy(policy: CpuFallbackPolicy, max: Option<u32>) -> CpuFallback {
        CpuFallback {
            policy,
            max_share_percent: max,
        }
    }

    #[test]
    fn forbidden_names_every_compute_node_and_allows_shape_nodes() {
        let forbidden = policy(CpuFallbackPolicy::Forbidden, None);
        let err = check("onnxruntime", &forbidden, &mixed(8, 2, 3)).expect_err("two compute nodes");
        assert_eq!(err.reason(), FailureReason::UnsupportedOperator);
        let text = err.to_string();
        assert!(
            text.contains("2 of 13 nodes that compute ran on the CPU instead of cuda")
                && text.contains("besides 3 shape nodes"),
            "{text}"
        );
        assert!(
            text.contains("cpu0 (NonZero)") && text.contains("cpu1 (NonZero)"),
            "{text}"
        );
        assert!(!text.contains("shape0"), "{text}");
        check("onnxruntime", &forbidden, &mixed(8, 0, 3)).expect("shape nodes only");
        check("onnxruntime", &forbidden, &placement(10, 0)).expect("all on the GPU");
    }

    #[test]
    fn strict_refuses_shape_nodes_too() {
        let strict = policy(CpuFallbackPolicy::Strict, None);
        let err = check("onnxruntime", &strict, &mixed(8, 0, 2)).expect_err("shape nodes");
        assert!(
            err.to_string().contains(
                "Strict, but 2 of 10 nodes ran on the CPU instead of cuda (2 of them shape nodes)"
            ) && err.to_string().contains("shape1 (Gather)"),
            "{err}"
        );
        check("onnxruntime", &strict, &placement(10, 0)).expect("all on the GPU");
    }

    #[test]
    fn up_to_share_compares_the_measured_time_share() {
        let at_limit = policy(CpuFallbackPolicy::UpToShare, Some(20));
        check("onnxruntime", &at_limit, &placement(8, 2)).expect("20% is within 20%");
        let err = check("onnxruntime", &at_limit, &placement(7, 3)).expect_err("30% > 20%");
        assert!(
            err.to_string()
                .contains("30.0% of the kernel time (3 of 10 nodes)")
                && err.to_string().contains("maxSharePercent 20"),
            "{err}"
        );
        let zero = policy(CpuFallbackPolicy::UpToShare, Some(0));
        assert!(check("onnxruntime", &zero, &placement(99, 1)).is_err());
    }

    #[test]
    fn allowed_takes_everything_and_long_lists_are_cut() {
        check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::Allowed, None),
            &placement(0, 100),
        )
        .expect("allowed");
        let err = check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::Forbidden, None),
            &placement(0, 40),
        )
        .expect_err("forbidden");
        assert!(err.to_string().contains("and 8 more"), "{err}");
    }
}
