//! Whether a measured placement is allowed by the target's CPU fallback policy: `Forbidden`
//! refuses any node the CPU ran although another provider was requested, naming them;
//! `UpToShare` refuses a share above the limit, stating the measured share; `Allowed` takes
//! anything. The same decision at compile (on the parity run) and on every node (on the warmup's
//! first run). Pure.

use kiln_crds::compiled_target::{CpuFallback, CpuFallbackPolicy};
use kiln_crds::placement::Placement;

use crate::error::{Error, Result};

/// Checks `placement` against `policy`; a refusal is `UnsupportedOperator`.
pub fn check(backend: &str, policy: &CpuFallback, placement: &Placement) -> Result<()> {
    if placement.fallback_node_count == 0 {
        return Ok(());
    }
    let share = placement.fallback_share * 100.0;
    let refused = match (policy.policy, policy.max_share_percent) {
        (CpuFallbackPolicy::Allowed, _) => return Ok(()),
        (CpuFallbackPolicy::Forbidden, _) => format!(
            "cpuFallback is Forbidden, but {} of {} nodes ran on the CPU instead of {}",
            placement.fallback_node_count,
            placement.total(),
            placement.requested
        ),
        (CpuFallbackPolicy::UpToShare, Some(max)) if share <= f64::from(max) => return Ok(()),
        (CpuFallbackPolicy::UpToShare, max) => format!(
            "{share:.1}% of the nodes ({} of {}) ran on the CPU instead of {}, over cpuFallback.maxSharePercent {}",
            placement.fallback_node_count,
            placement.total(),
            placement.requested,
            max.unwrap_or(0)
        ),
    };
    let mut operators = vec![refused];
    operators.extend(
        placement
            .fallback_nodes
            .iter()
            .map(|n| format!("{} ({})", n.name, n.op_type)),
    );
    let unnamed = placement.fallback_node_count - placement.fallback_nodes.len() as i64;
    if unnamed > 0 {
        operators.push(format!("and {unnamed} more"));
    }
    Err(Error::UnsupportedOperator {
        backend: backend.to_string(),
        operators,
    })
}

#[cfg(test)]
mod tests {
    use kiln_crds::FailureReason;
    use kiln_crds::placement::PlacedNode;

    use super::*;

    fn placement(cuda: usize, cpu: usize) -> Placement {
        let ran = (0..cuda)
            .map(|i| ("CUDAExecutionProvider", format!("gpu{i}"), "Conv"))
            .chain((0..cpu).map(|i| ("CPUExecutionProvider", format!("cpu{i}"), "NonZero")));
        let ran: Vec<_> = ran.collect();
        Placement::measure(
            "CUDAExecutionProvider",
            ran.iter().map(|(p, n, o)| {
                (
                    *p,
                    PlacedNode {
                        name: n.clone(),
                        op_type: (*o).into(),
                    },
                )
            }),
        )
    }

    fn policy(policy: CpuFallbackPolicy, max: Option<u32>) -> CpuFallback {
        CpuFallback {
            policy,
            max_share_percent: max,
        }
    }

    #[test]
    fn forbidden_names_every_fallback_node() {
        let err = check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::Forbidden, None),
            &placement(8, 2),
        )
        .expect_err("two nodes fell back");
        assert_eq!(err.reason(), FailureReason::UnsupportedOperator);
        let text = err.to_string();
        assert!(
            text.contains("2 of 10 nodes ran on the CPU instead of cuda"),
            "{text}"
        );
        assert!(
            text.contains("cpu0 (NonZero)") && text.contains("cpu1 (NonZero)"),
            "{text}"
        );
        // Nothing on the CPU: allowed whatever the policy.
        check(
            "onnxruntime",
            &policy(CpuFallbackPolicy::Forbidden, None),
            &placement(10, 0),
        )
        .expect("all on the GPU");
    }

    #[test]
    fn up_to_share_compares_the_measured_share() {
        let at_limit = policy(CpuFallbackPolicy::UpToShare, Some(20));
        check("onnxruntime", &at_limit, &placement(8, 2)).expect("20% is within 20%");
        let err = check("onnxruntime", &at_limit, &placement(7, 3)).expect_err("30% > 20%");
        assert!(
            err.to_string().contains("30.0% of the nodes (3 of 10)")
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
