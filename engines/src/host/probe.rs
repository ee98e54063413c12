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

/// What NVML says, as it says it: the values [`normalise`] turns into facts. Kept apart from the
/// NVML calls so the normalisation is tested on readings recorded from real GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct NvmlReading {
    /// `nvmlSystemGetDriverVersion` (`580.65.06`).
    pub driver: String,
    /// `nvmlSystemGetCudaDriverVersion`: 1000 × major + 10 × minor (`13000`).
    pub cuda: i32,
    /// Every device, in index order.
    pub devices: Vec<NvmlDevice>,
}

/// One device as NVML reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct NvmlDevice {
    /// `nvmlDeviceGetName` (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `nvmlDeviceGetCudaComputeCapability`.
    pub compute: (i32, i32),
    /// `nvmlDeviceGetMemoryInfo().total`, bytes.
    pub memory_total: u64,
    /// `nvmlDeviceGetMigMode().current == NVML_DEVICE_MIG_ENABLE`.
    pub mig: bool,
}

/// The facts a reading gives, normalised as GPU Feature Discovery labels them: the product name
/// with spaces as dashes, the CUDA version `major.minor`, the driver version as written.
fn normalise(r: &NvmlReading) -> Gpus {
    Gpus {
        driver: r.driver.trim().to_string(),
        cuda: format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(r.cuda),
            nvml_wrapper::cuda_driver_version_minor(r.cuda)
        ),
        devices: r
            .devices
            .iter()
            .map(|d| Accelerator {
                product: gfd_product(&d.name),
                compute_major: d.compute.0,
                compute_minor: d.compute.1,
                memory_bytes: i64::try_from(d.memory_total).unwrap_or(i64::MAX),
                mig: d.mig,
            })
            .collect(),
    }
}

/// NVIDIA GPUs through NVML; `Err` says in words why there are none.
fn nvidia() -> Result<Gpus, String> {
    read_nvml().map(|r| normalise(&r))
}

/// The compute capability of the first GPU NVML lists (the device llama.cpp's CUDA backend
/// calls 0 where the container sees one GPU); why there is none.
pub fn first_gpu_compute() -> Result<(u32, u32), String> {
    let reading = read_nvml()?;
    let d = reading.devices.first().ok_or("NVML lists no GPU")?;
    let part =
        |v: i32| u32::try_from(v).map_err(|_| format!("NVML: compute capability {:?}", d.compute));
    Ok((part(d.compute.0)?, part(d.compute.1)?))
}

/// Reads NVML.
fn read_nvml() -> Result<NvmlReading, String> {
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
        devices.push(NvmlDevice {
            name,
            compute: (cc.major, cc.minor),
            memory_total: device.memory_info().map(|m| m.total).unwrap_or(0),
            mig: device.mig_mode().map(|m| m.current == 1).unwrap_or(false),
        });
    }
    Ok(NvmlReading {
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

    /// NVML readings of real GPU models (names, compute capabilities and memory as NVML and
    /// nvidia-smi report them for these models; not read on a GPU in this repository's tests),
    /// and the labels GPU Feature Discovery puts on such nodes.
    #[test]
    fn recorded_nvml_readings_normalise_to_gpu_feature_discovery_labels() {
        use kiln_crds::labels::*;
        let mib = 1024 * 1024;
        let cases = [
            // H100 SXM on driver 580 (CUDA 13.0), the driver of the GPU machines kiln is lent.
            (
                NvmlReading {
                    driver: "580.65.06".into(),
                    cuda: 13000,
                    devices: vec![NvmlDevice {
                        name: "NVIDIA H100 80GB HBM3".into(),
                        compute: (9, 0),
                        memory_total: 81559 * mib,
                        mig: false,
                    }],
                },
                [
                    (GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
                    (GPU_COMPUTE_MAJOR, "9"),
                    (GPU_COMPUTE_MINOR, "0"),
                    (GPU_MEMORY, "81559"),
                    (DRIVER_MAJOR, "580"),
                    (DRIVER_REVISION, "06"),
                    (CUDA_RUNTIME_FULL, "13.0"),
                ],
            ),
            // L4 on driver 535.129.03 (CUDA 12.2), as in GFD's documented output.
            (
                NvmlReading {
                    driver: "535.129.03".into(),
                    cuda: 12020,
                    devices: vec![NvmlDevice {
                        name: "NVIDIA L4".into(),
                        compute: (8, 9),
                        memory_total: 23034 * mib,
                        mig: false,
                    }],
                },
                [
                    (GPU_PRODUCT, "NVIDIA-L4"),
                    (GPU_COMPUTE_MAJOR, "8"),
                    (GPU_COMPUTE_MINOR, "9"),
                    (GPU_MEMORY, "23034"),
                    (DRIVER_MAJOR, "535"),
                    (DRIVER_REVISION, "03"),
                    (CUDA_RUNTIME_FULL, "12.2"),
                ],
            ),
        ];
        for (reading, want) in cases {
            let gpus = normalise(&reading);
            let facts = HardwareFacts {
                arch: "amd64".into(),
                cpu_level: "x86-64-v3".into(),
                driver_version: Some(gpus.driver),
                cuda_driver_version: Some(gpus.cuda),
                accelerators: gpus.devices,
                ..Default::default()
            };
            let got = labels(&facts);
            for (k, v) in want {
                assert_eq!(
                    got.get(k).map(String::as_str),
                    Some(v),
                    "{k} of {reading:?}"
                );
            }
            assert_eq!(got.get(GPU_COUNT).map(String::as_str), Some("1"));
        }
        // MIG mode is carried as a fact; the product name NVML gives a MIG-enabled GPU is the
        // parent's, so the class does not split.
        let mig = normalise(&NvmlReading {
            driver: "550.54.15".into(),
            cuda: 12040,
            devices: vec![NvmlDevice {
                name: "NVIDIA A100-SXM4-80GB".into(),
                compute: (8, 0),
                memory_total: 81920 * mib,
                mig: true,
            }],
        });
        assert!(mig.devices[0].mig);
        assert_eq!(mig.devices[0].product, "NVIDIA-A100-SXM4-80GB");
        assert_eq!(mig.cuda, "12.4");
    }

    #[test]
    fn product_names_take_gfd_form() {
        assert_eq!(
            gfd_product("NVIDIA H100 80GB HBM3"),
            "NVIDIA-H100-80GB-HBM3"
        );
    }
}
