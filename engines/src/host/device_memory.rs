//! The GPU memory a process of this agent holds, as NVML accounts it per process (by host
//! pid, [`crate::host::pid`]), and the device memory budget an engine is held to. Reading opens
//! NVML (no GPU here to test it); the budget and the decision are pure and unit-tested.

use crate::host::memory::human;
use kiln_node_core::error::{Error, Result};

/// Bytes of GPU memory this process holds on every GPU NVML lists; `None` where it cannot be
/// known (the reason is logged): [`process_bytes_of`] for this process.
pub fn process_bytes() -> Option<u64> {
    process_bytes_of(None)
        .map_err(|why| tracing::debug!(%why, "GPU memory of the agent's process unknown"))
        .ok()
}

/// Bytes of GPU memory the process `pid` (a pid in this agent's namespace; this process when
/// `None`) holds on every GPU NVML lists, its CUDA context included: the sum of
/// `used_gpu_memory` of NVML's compute processes whose pid is its host pid
/// ([`crate::host::pid`]: NVML names processes by host pid). An error says why nothing can be
/// read — no NVML or GPU, a host pid that cannot be known, no CUDA context of that process —
/// never 0 for "unknown".
pub fn process_bytes_of(pid: Option<u32>) -> std::result::Result<u64, String> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?;
    let pid = crate::host::pid::host_pid(pid)?;
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let mut held = None;
    for index in 0..count {
        let Ok(processes) = nvml
            .device_by_index(index)
            .and_then(|d| d.running_compute_processes())
        else {
            continue;
        };
        for p in processes.iter().filter(|p| p.pid == pid) {
            if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                held = Some(held.unwrap_or(0) + bytes);
            }
        }
    }
    held.ok_or_else(|| {
        format!("NVML lists no compute process with host pid {pid} and a known memory use")
    })
}

/// The device memory an engine may hold on a node, and whether the target set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBudget {
    /// Bytes.
    pub bytes: u64,
    /// `warmup.deviceMemoryBudget` set (else: the GPU's memory).
    pub explicit: bool,
}

/// `warmup.deviceMemoryBudget` in bytes, else `gpu_memory` (the memory of one of the node's
/// GPUs); `None` on a node without a GPU, where the budget does not apply. Pure.
pub fn device_budget(
    warmup: &kiln_crds::compiled_target::Warmup,
    gpu_memory: Option<u64>,
) -> Result<Option<DeviceBudget>> {
    let Some(gpu_memory) = gpu_memory else {
        return Ok(None);
    };
    let Some(quantity) = warmup.device_memory_budget.as_deref() else {
        return Ok(Some(DeviceBudget {
            bytes: gpu_memory,
            explicit: false,
        }));
    };
    let bytes = crate::host::memory::parse_bytes(quantity)
        .map_err(|m| Error::InvalidSpec(format!("warmup.deviceMemoryBudget: {m}")))?;
    Ok(Some(DeviceBudget {
        bytes: bytes as u64,
        explicit: true,
    }))
}

/// Whether the GPU memory held at the peak (`None`: not measured) fits `budget`: above it is
/// `MemoryBudgetExceeded` naming both figures; an explicit budget that cannot be checked fails
/// closed; the default one (the GPU's memory) passes unmeasured. Pure.
pub fn within_device_budget(budget: Option<DeviceBudget>, peak: Option<u64>) -> Result<()> {
    match (budget, peak) {
        (None, _) => Ok(()),
        (Some(b), None) if b.explicit => Err(Error::WarmupFailed(
            "warmup.deviceMemoryBudget is set but this agent cannot read the GPU memory its process holds (no NVML, no CUDA context, or no host pid for it: an agent in a PID namespace of its own needs the node's /proc at /host/proc, chart agent.gpu.hostProc); remove the budget or give the agent the host's procfs".into(),
        )),
        (Some(_), None) => Ok(()),
        (Some(b), Some(peak)) if peak > b.bytes => {
            let budget = if b.explicit {
                format!("warmup.deviceMemoryBudget {}", human(b.bytes as usize))
            } else {
                format!(
                    "the GPU's memory {} (warmup.deviceMemoryBudget unset)",
                    human(b.bytes as usize)
                )
            };
            Err(Error::MemoryBudgetExceeded(format!(
                "the agent's process held {} of GPU memory ({peak} bytes, CUDA context included) after load and warmup, over {budget} ({} bytes)",
                human(peak as usize),
                b.bytes
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::FailureReason;

    const GI: u64 = 1 << 30;

    fn warmup(budget: Option<&str>) -> kiln_crds::compiled_target::Warmup {
        serde_json::from_value(serde_json::json!({
            "fixtureVersion": "v1",
            "deviceMemoryBudget": budget,
        }))
        .expect("warmup")
    }

    #[test]
    fn the_budget_is_the_spec_s_else_the_gpu_s_and_none_without_a_gpu() {
        let explicit = device_budget(&warmup(Some("2Gi")), Some(80 * GI)).expect("parse");
        assert_eq!(
            explicit,
            Some(DeviceBudget {
                bytes: 2 * GI,
                explicit: true
            })
        );
        let default = device_budget(&warmup(None), Some(80 * GI)).expect("default");
        assert_eq!(
            default.map(|b| (b.bytes, b.explicit)),
            Some((80 * GI, false))
        );
        assert_eq!(
            device_budget(&warmup(Some("2Gi")), None).expect("cpu"),
            None
        );
        let err = device_budget(&warmup(Some("lots")), Some(GI)).expect_err("not a quantity");
        assert_eq!(err.reason(), FailureReason::InvalidSpec);
    }

    #[test]
    fn an_engine_fits_or_exceeds_naming_both_figures() {
        let two = Some(DeviceBudget {
            bytes: 2 * GI,
            explicit: true,
        });
        within_device_budget(two, Some(2 * GI)).expect("at the budget fits");
        let err = within_device_budget(two, Some(3 * GI)).expect_err("over");
        assert_eq!(err.reason(), FailureReason::MemoryBudgetExceeded);
        let text = err.to_string();
        assert!(
            text.contains("held 3.2 GB of GPU memory (3221225472 bytes")
                && text.contains("over warmup.deviceMemoryBudget 2.1 GB (2147483648 bytes)"),
            "{text}"
        );
        let gpu = Some(DeviceBudget {
            bytes: 80 * GI,
            explicit: false,
        });
        let err = within_device_budget(gpu, Some(81 * GI)).expect_err("over the GPU");
        assert!(
            err.to_string()
                .contains("(warmup.deviceMemoryBudget unset)"),
            "{err}"
        );
    }

    #[test]
    fn no_reading_fails_only_an_explicit_budget() {
        let explicit = Some(DeviceBudget {
            bytes: GI,
            explicit: true,
        });
        let err = within_device_budget(explicit, None).expect_err("cannot check");
        assert_eq!(err.reason(), FailureReason::WarmupFailed);
        let default = Some(DeviceBudget {
            bytes: GI,
            explicit: false,
        });
        within_device_budget(default, None).expect("the GPU's own size, unmeasured");
        within_device_budget(None, None).expect("no GPU");
        within_device_budget(None, Some(100 * GI)).expect("no budget applies");
    }
}
