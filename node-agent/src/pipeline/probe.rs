//! Hardware probe: CPU architecture, x86-64 level and features, cores, memory, and NVIDIA GPUs
//! through NVML when a driver is present. No driver is a clean "no GPU", not an error.
//! Reads `/proc`, CPU features and NVML; writes nothing.

use std::collections::BTreeMap;

use kiln_crds::kiln_node::{Accelerator, HardwareFacts};

/// Probes this machine. `runtimes` lists the engine backends this binary carries.
pub fn probe(runtimes: BTreeMap<String, String>) -> HardwareFacts {
    let (cpu_level, cpu_features) = cpu();
    let mut facts = HardwareFacts {
        arch: kube_arch(std::env::consts::ARCH).to_string(),
        cpu_level,
        cpu_features,
        cores: std::thread::available_parallelism()
            .map(|n| n.get() as i64)
            .unwrap_or(1),
        memory_bytes: memory_bytes().unwrap_or(0),
        runtimes,
        ..HardwareFacts::default()
    };
    match nvidia() {
        Ok(gpus) => {
            facts.driver_version = Some(gpus.driver);
            facts.cuda_driver_version = Some(gpus.cuda);
            if gpus.devices.is_empty() {
                facts.accelerator_note = Some("NVIDIA driver present, no device visible".into());
            }
            facts.accelerators = gpus.devices;
        }
        Err(note) => facts.accelerator_note = Some(note),
    }
    facts
}

/// This machine's CPU architecture and x86-64 level, which an artifact bound to its build
/// machine's instruction set must match (cheap: no NVML).
pub fn cpu_identity() -> (String, String) {
    (kube_arch(std::env::consts::ARCH).to_string(), cpu().0)
}

/// The node labels this machine would carry: what GPU Feature Discovery and kiln would set.
pub fn labels(facts: &HardwareFacts) -> BTreeMap<String, String> {
    kiln_crds::class::fact_labels(facts)
}

fn kube_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(target_arch = "x86_64")]
fn cpu() -> (String, Vec<String>) {
    macro_rules! detect {
        ($($f:tt),*) => { vec![$((($f), std::arch::is_x86_feature_detected!($f))),*] };
    }
    let v2 = detect!("cmpxchg16b", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3");
    let v3 = detect!(
        "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"
    );
    let v4 = detect!("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl");
    let extra = detect!(
        "sha",
        "aes",
        "avx512vnni",
        "avx512bf16",
        "avx512fp16",
        "avxvnni"
    );
    let all = |set: &[(&str, bool)]| set.iter().all(|(_, on)| *on);
    let level = match (all(&v2), all(&v3), all(&v4)) {
        (true, true, true) => "x86-64-v4",
        (true, true, false) => "x86-64-v3",
        (true, false, _) => "x86-64-v2",
        _ => "x86-64",
    };
    let features = [v2, v3, v4, extra]
        .concat()
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(f, _)| f.to_string())
        .collect();
    (level.to_string(), features)
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu() -> (String, Vec<String>) {
    ("baseline".to_string(), Vec::new())
}

fn memory_bytes() -> Option<i64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

struct Gpus {
    driver: String,
    cuda: String,
    devices: Vec<Accelerator>,
}

/// NVIDIA GPUs through NVML; `Err` says in words why there are none.
fn nvidia() -> Result<Gpus, String> {
    use nvml_wrapper::Nvml;
    let nvml = Nvml::init().map_err(|e| match e {
        nvml_wrapper::error::NvmlError::LibloadingError(_) => {
            "no NVIDIA driver (libnvidia-ml.so not found)".to_string()
        }
        other => format!("NVML unavailable: {other}"),
    })?;
    let driver = nvml
        .sys_driver_version()
        .map_err(|e| format!("NVML driver version: {e}"))?;
    let cuda = nvml
        .sys_cuda_driver_version()
        .map_err(|e| format!("NVML CUDA version: {e}"))?;
    let cuda = format!(
        "{}.{}",
        nvml_wrapper::cuda_driver_version_major(cuda),
        nvml_wrapper::cuda_driver_version_minor(cuda)
    );
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count: {e}"))?;
    let mut devices = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML device {index}: {e}"))?;
        let name = device
            .name()
            .map_err(|e| format!("NVML device {index} name: {e}"))?;
        let cc = device
            .cuda_compute_capability()
            .map_err(|e| format!("NVML device {index} compute capability: {e}"))?;
        let memory = device.memory_info().map(|m| m.total as i64).unwrap_or(0);
        let mig = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        devices.push(Accelerator {
            product: gfd_product(&name),
            compute_major: cc.major,
            compute_minor: cc.minor,
            memory_bytes: memory,
            mig,
        });
    }
    Ok(Gpus {
        driver,
        cuda,
        devices,
    })
}

/// GPU Feature Discovery's product label form: spaces become dashes.
fn gfd_product(name: &str) -> String {
    name.split_whitespace().collect::<Vec<_>>().join("-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::labels::ARCH;

    #[test]
    fn probe_reports_this_machine() {
        let facts = probe(BTreeMap::new());
        assert_eq!(facts.arch, kube_arch(std::env::consts::ARCH));
        assert!(facts.cores >= 1);
        assert!(facts.memory_bytes > 0, "MemTotal read from /proc/meminfo");
        #[cfg(target_arch = "x86_64")]
        {
            assert!(facts.cpu_level.starts_with("x86-64"), "{}", facts.cpu_level);
            // Every x86-64 CPU this runs on has SSE2-era features; v2 needs popcnt.
            assert_eq!(
                facts.cpu_level != "x86-64",
                facts.cpu_features.iter().any(|f| f == "popcnt")
            );
        }
        // Without a driver the probe says so instead of failing.
        if facts.accelerators.is_empty() {
            assert!(facts.accelerator_note.is_some());
        }
        let labels = labels(&facts);
        assert_eq!(labels.get(ARCH), Some(&facts.arch));
    }

    #[test]
    fn product_names_take_gfd_form() {
        assert_eq!(
            gfd_product("NVIDIA H100 80GB HBM3"),
            "NVIDIA-H100-80GB-HBM3"
        );
    }
}
