//! The path from a stored artifact to "ready": pull and verify the bytes, re-check
//! compatibility with this machine and this binary, load, warm with parity. The same code serves
//! `local` and the node agent; any error means not ready. Load and warmup run in the engine's own
//! process ([`crate::pipeline::isolate`]); this side judges what it measured. Touches the store (pull), the
//! destination path and the engine it loads; never the apiserver.

use std::path::Path;
use std::time::Duration;

use kiln_crds::BuildManifest;
use kiln_crds::class::ClassFacts;
use kiln_store::attest::{Subject, Trust};
use kiln_store::{ArtifactRef, Store};

use crate::backend::Backend;
use crate::host::device_memory::{device_budget, within_device_budget};
use crate::host::memory::human;
use crate::metrics::{Metrics, TargetLabels};
use crate::pipeline::isolate::task::{FixtureRef, LoadWarm, Outcome, Task, Warmed};
use crate::pipeline::warmup::WarmupReport;
use kiln_node_core::error::{Error, Result};

/// What a successful readiness check measured.
#[derive(Clone, Debug)]
pub struct Ready {
    /// Seconds to load (and optimise) the engine.
    pub load_seconds: f64,
    /// The warmup measurements.
    pub warmup: WarmupReport,
}

/// Checks the manifest against this machine's class and CPU and this binary's backend.
pub fn check_compatible(
    manifest: &BuildManifest,
    backend: &dyn Backend,
    class: &ClassFacts,
) -> Result<()> {
    check_against(
        manifest,
        backend,
        class,
        &crate::host::probe::cpu_identity(),
    )
}

/// [`check_compatible`] against a given CPU (architecture, x86-64 level). Pure.
pub fn check_against(
    manifest: &BuildManifest,
    backend: &dyn Backend,
    class: &ClassFacts,
    (arch, cpu_level): &(String, String),
) -> Result<()> {
    if manifest.backend != backend.name() || manifest.backend_version != backend.version() {
        return Err(Error::IncompatibleRuntime(format!(
            "artifact built by {} {}, this agent runs {} {}",
            manifest.backend,
            manifest.backend_version,
            backend.name(),
            backend.version()
        )));
    }
    if manifest.runtime_digest.is_some() && manifest.runtime_digest != backend.runtime_digest() {
        return Err(Error::IncompatibleRuntime(format!(
            "artifact built with the {} library of sha256 {}, this agent loaded sha256 {}; install the same library build on every node",
            manifest.backend,
            manifest.runtime_digest.as_deref().unwrap_or_default(),
            backend.runtime_digest().unwrap_or_default()
        )));
    }
    gpu_fits(&manifest.class, class)?;
    if &manifest.class != class {
        return Err(Error::IncompatibleHardware(format!(
            "artifact built for class {:?}, this machine is {:?}",
            manifest.class, class
        )));
    }
    if let Some(bound) = &manifest.bound_to
        && (&bound.arch != arch || &bound.cpu_level != cpu_level)
    {
        return Err(Error::IncompatibleHardware(format!(
            "artifact is bound to {} {} ({}), this machine probes {arch} {cpu_level}; add {} to the target's classLabelKeys so each CPU level gets its own build, or use a lower optimizationLevel",
            bound.arch,
            bound.cpu_level,
            bound.why,
            kiln_crds::labels::CPU_LEVEL
        )));
    }
    Ok(())
}

/// What an artifact's GPU facts demand of this node ([`crate::host::compat::gpu_gap`]), said plainly
/// before the whole class is compared: a GPU build on a node without that GPU or with another
/// compute capability is `IncompatibleHardware`; one built under a newer NVIDIA driver than the
/// node runs is `IncompatibleRuntime` (its kernels may need what the older driver lacks). Pure.
pub fn gpu_fits(built: &ClassFacts, here: &ClassFacts) -> Result<()> {
    use crate::host::compat::GpuGap;
    match crate::host::compat::gpu_gap(built, here) {
        None => Ok(()),
        Some(GpuGap::NoGpu { product }) => Err(Error::IncompatibleHardware(format!(
            "artifact built for GPU {product}, this node has no GPU in its class"
        ))),
        Some(GpuGap::ComputeCapability { want, have }) => {
            Err(Error::IncompatibleHardware(format!(
                "artifact built for compute capability {want}, this GPU is {have}; it needs its own class's build"
            )))
        }
        Some(GpuGap::OlderDriver { want, have }) => Err(Error::IncompatibleRuntime(format!(
            "artifact built under NVIDIA driver {want}, this node runs driver {have}; upgrade the node's driver or let its class compile on its own nodes"
        ))),
    }
}

/// Pulls the artifact of `r` from the store into `dest`: its attestation first (when `trust`
/// has keys: signed by one of them, naming exactly `r`), then the bytes, verified by manifest
/// digest, size and sha256 while they stream; a failure is counted by reason and leaves nothing
/// at `dest`.
pub async fn pull_verified(
    store: &dyn Store,
    trust: &Trust,
    r: &ArtifactRef,
    dest: &Path,
    metrics: &Metrics,
) -> Result<BuildManifest> {
    let pulled = async {
        trust.check(store, &Subject::from(r)).await?;
        store.pull(r, dest).await
    }
    .await;
    for skip in store.take_mirror_skips() {
        metrics.mirror_skipped(&skip);
    }
    pulled
        .map_err(Error::from)
        .inspect_err(|e| metrics.verify_failure(e.reason()))
}

/// Loads and warms the verified artifact at `artifact` (from [`pull_verified`]) in the
/// engine's own process, within `deadline`; `gpu_memory` ([`gpu_memory`] of the probed
/// hardware) is the default device memory budget.
#[allow(clippy::too_many_arguments)]
pub fn load_warm(
    manifest: &BuildManifest,
    artifact: &Path,
    backend: &dyn Backend,
    class: &ClassFacts,
    fixture: FixtureRef,
    target: &kiln_crds::CompiledTarget,
    labels: &TargetLabels,
    gpu_memory: Option<u64>,
    deadline: Duration,
    metrics: &Metrics,
) -> Result<Ready> {
    check_compatible(manifest, backend, class)?;
    fits_node(&target.spec.warmup, crate::host::memory::available())?;
    let job = LoadWarm {
        backend: target.spec.backend.clone(),
        manifest: manifest.clone(),
        artifact: artifact.to_path_buf(),
        fixture,
        warmup: target.spec.warmup.clone(),
    };
    let name = [labels.namespace.as_str(), labels.target.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/");
    let what = format!("loading and warming target {name}");
    let warmed = load_warm_isolated(job, &what, deadline, || {})?;
    judge_warmed(warmed, &target.spec, labels, gpu_memory, metrics)
}

/// Runs `job` in the engine's process ([`crate::pipeline::isolate`]): its measurements, or why it failed
/// (including `EngineCrashed`, `MemoryBudgetExceeded` at the process's limit, `Timeout`);
/// `loaded` is called once the engine is loaded and warmup begins.
pub fn load_warm_isolated(
    job: LoadWarm,
    what: &str,
    deadline: Duration,
    loaded: impl FnOnce() + Send + 'static,
) -> Result<Warmed> {
    let job = Task::LoadWarm(Box::new(job));
    match crate::pipeline::isolate::parent::run_with(job, what, deadline, loaded)?.outcome {
        Outcome::Warmed(w) => Ok(*w),
        _ => Err(Error::EngineAnswer(format!(
            "{what}: the answer is not a warmup's"
        ))),
    }
}

/// What the agent concludes from the engine process's measurements: counted in the metrics,
/// the placement held to the target's CPU fallback policy, peak host and GPU memory to its
/// budgets. `gpu_memory`: one of the node's GPUs' memory, the default device budget.
pub fn judge_warmed(
    warmed: Warmed,
    target: &kiln_crds::CompiledTargetSpec,
    labels: &TargetLabels,
    gpu_memory: Option<u64>,
    metrics: &Metrics,
) -> Result<Ready> {
    let Warmed {
        load_seconds,
        device_after_load,
        mut report,
    } = warmed;
    metrics.load(&labels.class, load_seconds);
    if let Some(p) = &report.placement {
        metrics.placement(labels, p);
        crate::backend::cpu_fallback::check(
            target.backend.kind.runtime().as_str(),
            &target.backend.cpu_fallback.clone().unwrap_or_default(),
            p,
        )?;
    }
    if let Some(g) = &report.generation {
        metrics.generation(labels, g);
    }
    metrics.warmup(
        &labels.class,
        report.total_seconds,
        &report.latencies,
        report.parity_max_abs_error,
    );
    account_memory(
        device_after_load,
        &mut report,
        &target.warmup,
        gpu_memory,
        labels,
        metrics,
    )?;
    Ok(Ready {
        load_seconds,
        warmup: report,
    })
}

/// `warmup.memoryBudget` in bytes.
pub fn memory_budget(warmup: &kiln_crds::compiled_target::Warmup) -> Result<Option<u64>> {
    warmup
        .memory_budget
        .as_deref()
        .map(|q| {
            crate::host::memory::parse_bytes(q)
                .map(|b| b as u64)
                .map_err(|m| Error::InvalidSpec(format!("warmup.memoryBudget: {m}")))
        })
        .transpose()
}

/// Refuses, before anything is loaded, a node whose memory (`available`: the agent's cgroup
/// limit or the machine's) is below the target's memory budget. Pure.
pub fn fits_node(
    warmup: &kiln_crds::compiled_target::Warmup,
    available: Option<u64>,
) -> Result<()> {
    match (memory_budget(warmup)?, available) {
        (Some(budget), Some(have)) if budget > have => Err(Error::IncompatibleHardware(format!(
            "warmup.memoryBudget {} ({}) does not fit this node: the agent may use {}; schedule the target on nodes with more memory (nodeSelector) or raise the agent's memory limit",
            warmup.memory_budget.as_deref().unwrap_or_default(),
            human(budget as usize),
            human(have as usize)
        ))),
        _ => Ok(()),
    }
}

/// Records the engine's peak memory (measured by its process, in `report`) and the GPU memory
/// that process held at its peak (after load: `device_after_load`; after warmup: already in
/// `report`) in `report` and the metrics, and holds both to the target's budgets: over one is
/// `MemoryBudgetExceeded`; a host budget that cannot be checked on this node fails closed, a
/// device budget as [`within_device_budget`] says. `gpu_memory`: one of the node's GPUs' memory,
/// the default device budget.
pub fn account_memory(
    device_after_load: Option<u64>,
    report: &mut WarmupReport,
    warmup: &kiln_crds::compiled_target::Warmup,
    gpu_memory: Option<u64>,
    labels: &TargetLabels,
    metrics: &Metrics,
) -> Result<()> {
    report.peak_device_memory_bytes = report.peak_device_memory_bytes.max(device_after_load);
    if let Some(peak) = report.peak_memory_bytes {
        metrics.peak_memory(labels, peak);
    }
    if let Some(peak) = report.peak_device_memory_bytes {
        metrics.peak_device_memory(labels, peak);
    }
    within_budget(memory_budget(warmup)?, report.peak_memory_bytes)?;
    within_device_budget(
        device_budget(warmup, gpu_memory)?,
        report.peak_device_memory_bytes,
    )
}

/// The memory of the first of `facts`' GPUs, bytes: the default device memory budget.
pub fn gpu_memory(facts: &kiln_crds::kiln_node::HardwareFacts) -> Option<u64> {
    facts
        .accelerators
        .first()
        .and_then(|a| u64::try_from(a.memory_bytes).ok())
}

/// Whether a measured peak is within the budget. Pure.
pub fn within_budget(budget: Option<u64>, peak: Option<u64>) -> Result<()> {
    match (budget, peak) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(Error::WarmupFailed(
            "warmup.memoryBudget is set but this node cannot measure the engine's peak memory (/proc/self/clear_refs and VmHWM); remove the budget or run the agent on Linux with its own /proc".into(),
        )),
        (Some(budget), Some(peak)) if peak > budget => Err(Error::MemoryBudgetExceeded(format!(
            "the engine's resident memory peaked {} above the agent's baseline in load and warmup, over warmup.memoryBudget {}",
            human(peak as usize),
            human(budget as usize)
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warmup(budget: Option<&str>) -> kiln_crds::compiled_target::Warmup {
        serde_json::from_value(serde_json::json!({
            "fixtureVersion": "v1",
            "memoryBudget": budget,
        }))
        .expect("warmup")
    }

    #[test]
    fn a_budget_refuses_small_nodes_and_big_engines() {
        let gi = 1u64 << 30;
        fits_node(&warmup(Some("2Gi")), Some(4 * gi)).expect("fits");
        fits_node(&warmup(None), Some(1)).expect("no budget");
        let err = fits_node(&warmup(Some("8Gi")), Some(4 * gi)).expect_err("too small");
        assert_eq!(err.reason(), kiln_crds::FailureReason::IncompatibleHardware);
        assert!(
            err.to_string().contains("8Gi (8.6 GB) does not fit"),
            "{err}"
        );
        within_budget(Some(gi), Some(gi)).expect("at the budget");
        let err = within_budget(Some(gi), Some(gi + 1)).expect_err("over");
        assert_eq!(err.reason(), kiln_crds::FailureReason::MemoryBudgetExceeded);
        assert_eq!(
            within_budget(Some(gi), None)
                .expect_err("unmeasured")
                .reason(),
            kiln_crds::FailureReason::WarmupFailed
        );
        within_budget(None, None).expect("nothing asked");
    }

    #[test]
    fn a_gpu_build_for_another_device_or_a_newer_driver_is_refused_before_load() {
        use kiln_crds::FailureReason::{IncompatibleHardware, IncompatibleRuntime};
        use kiln_crds::labels::{DRIVER_MAJOR, GPU_COMPUTE_MAJOR, GPU_COMPUTE_MINOR, GPU_PRODUCT};
        let facts = |pairs: &[(&str, &str)]| -> ClassFacts {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        let h100 = facts(&[
            (GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
            (GPU_COMPUTE_MAJOR, "9"),
            (GPU_COMPUTE_MINOR, "0"),
            (DRIVER_MAJOR, "580"),
        ]);
        gpu_fits(&h100, &h100).expect("its own class");
        let mut newer_driver = h100.clone();
        newer_driver.insert(DRIVER_MAJOR.into(), "550".into());
        let err = gpu_fits(&h100, &newer_driver).expect_err("built under 580, node on 550");
        assert_eq!(err.reason(), IncompatibleRuntime);
        assert!(
            err.to_string()
                .contains("driver 580, this node runs driver 550"),
            "{err}"
        );
        // An older driver's build runs on a newer driver as far as this check goes (the class
        // comparison after it still wants the node's own class).
        gpu_fits(&newer_driver, &h100).expect("older driver's build");
        let l4 = facts(&[
            (GPU_PRODUCT, "NVIDIA-L4"),
            (GPU_COMPUTE_MAJOR, "8"),
            (GPU_COMPUTE_MINOR, "9"),
            (DRIVER_MAJOR, "580"),
        ]);
        let err = gpu_fits(&h100, &l4).expect_err("sm90 build on sm89");
        assert_eq!(err.reason(), IncompatibleHardware);
        assert!(
            err.to_string()
                .contains("compute capability 9.0, this GPU is 8.9"),
            "{err}"
        );
        let cpu = facts(&[("kubernetes.io/arch", "amd64")]);
        let err = gpu_fits(&h100, &cpu).expect_err("GPU build on a CPU node");
        assert_eq!(err.reason(), IncompatibleHardware);
        gpu_fits(&cpu, &h100).expect("a CPU build asks nothing of the GPU");
    }
}
