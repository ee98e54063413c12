//! Where a llama.cpp engine runs: on the CPU, or on a CUDA GPU with every layer offloaded; and
//! whether this build of llama.cpp can run there at all: its CUDA backend is in the GPU agent's
//! build only (feature `cuda`, `scripts/build-agent-cuda.sh`), with kernels for the GPU
//! architectures it was built for. Pure.

use kiln_crds::compiled_target::ExecutionProvider;

/// The GPU architectures this kiln-agent's llama.cpp has kernels for: the CMake
/// `CUDA_ARCHITECTURES` list it was built with (`90-real`, `80-virtual;90-real`, …). `None`: a
/// build without llama.cpp's CUDA backend (the CPU agent).
pub const CUDA_ARCHITECTURES: Option<&str> = built_for();

const fn built_for() -> Option<&'static str> {
    #[cfg(feature = "cuda")]
    {
        Some(env!(
            "KILN_CUDA_ARCHITECTURES",
            "feature cuda needs KILN_CUDA_ARCHITECTURES: build it with scripts/build-agent-cuda.sh"
        ))
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// Where an engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Every layer, the KV cache and every operation on the CPU.
    Cpu,
    /// Every layer and the KV cache on the first CUDA GPU llama.cpp sees, in a build with
    /// kernels for these CUDA architectures ([`CUDA_ARCHITECTURES`]).
    Cuda(&'static str),
}

impl Device {
    /// The provider's name, as the artifact's index and the compile key write it.
    pub fn provider(self) -> ExecutionProvider {
        match self {
            Self::Cpu => ExecutionProvider::Cpu,
            Self::Cuda(_) => ExecutionProvider::Cuda,
        }
    }
}

/// The device for `provider` in a build with the CUDA kernels `built` (`None`: no CUDA
/// backend); why not, in words that say what to change.
pub fn for_provider(
    provider: ExecutionProvider,
    built: Option<&'static str>,
) -> Result<Device, String> {
    match (provider, built) {
        (ExecutionProvider::Cpu, _) => Ok(Device::Cpu),
        (ExecutionProvider::Cuda, Some(list)) => Ok(Device::Cuda(list)),
        (ExecutionProvider::Cuda, None) => Err("this kiln-agent's llama.cpp has no CUDA backend: a GPU class's engines run in the GPU agent image (built by scripts/build-agent-cuda.sh; the chart's agent.gpu), or set backend.executionProvider: cpu".into()),
        (ExecutionProvider::Tensorrt, _) => Err("llama.cpp has no TensorRT backend: set backend.executionProvider to cuda or cpu".into()),
    }
}

/// One entry of a CUDA architecture list: compute capability `major.minor`, whether the build
/// holds machine code for it (`real`), PTX (`virtual`) and whether it is arch-specific (`a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Arch {
    major: u32,
    minor: u32,
    real: bool,
    virtual_: bool,
    specific: bool,
}

/// Parses CMake's list (`80-virtual;90-real;120a-real`; a bare `90` is both real and virtual).
fn parse(list: &str) -> Result<Vec<Arch>, String> {
    list.split(';')
        .map(|entry| {
            let (number, kind) = entry.split_once('-').unwrap_or((entry, ""));
            let (number, specific) = match number.strip_suffix(['a', 'f']) {
                Some(n) => (n, number.ends_with('a')),
                None => (number, false),
            };
            let n: u32 = number
                .parse()
                .map_err(|_| format!("{entry:?} in CUDA architectures {list:?} is not like 90-real"))?;
            let (real, virtual_) = match kind {
                "" => (true, true),
                "real" => (true, false),
                "virtual" => (false, true),
                _ => return Err(format!("{entry:?} in CUDA architectures {list:?}: -{kind} is neither -real nor -virtual")),
            };
            Ok(Arch { major: n / 10, minor: n % 10, real, virtual_, specific })
        })
        .collect()
}

/// Whether a build with the CUDA architectures `list` has kernels a GPU of compute capability
/// `(major, minor)` runs: machine code of the same major version and a minor at most the GPU's
/// (exactly the GPU's for an arch-specific `a` build), or PTX of a capability at most the GPU's,
/// which the driver compiles when the engine loads. Why not, naming the list and the GPU.
pub fn has_kernels(list: &str, (major, minor): (u32, u32)) -> Result<(), String> {
    let archs = parse(list)?;
    let gpu = (major, minor);
    let runs = archs.iter().any(|a| {
        let own = (a.major, a.minor);
        let machine = a.real
            && a.major == major
            && if a.specific {
                own == gpu
            } else {
                a.minor <= minor
            };
        let ptx = a.virtual_ && if a.specific { own == gpu } else { own <= gpu };
        machine || ptx
    });
    if runs {
        Ok(())
    } else {
        Err(format!(
            "this kiln-agent's llama.cpp has CUDA kernels for {list}, none of which runs on this GPU (compute capability {major}.{minor}): build the GPU agent with KILN_CUDA_ARCHITECTURES including {major}{minor}-real (scripts/build-agent-cuda.sh)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_code_runs_on_its_major_version_from_its_minor_up() {
        assert!(has_kernels("90-real", (9, 0)).is_ok());
        assert!(
            has_kernels("80-real", (8, 6)).is_ok(),
            "sm_80 code runs on 8.6"
        );
        assert!(has_kernels("80-real;90-real", (8, 9)).is_ok());
        let e = has_kernels("90-real", (8, 0)).expect_err("A100 on an H100 build");
        assert!(
            e.contains("compute capability 8.0") && e.contains("80-real"),
            "{e}"
        );
        assert!(
            has_kernels("86-real", (8, 0)).is_err(),
            "not below its minor"
        );
        assert!(
            has_kernels("90-real", (10, 0)).is_err(),
            "not across majors"
        );
    }

    #[test]
    fn ptx_is_compiled_for_any_newer_gpu_and_arch_specific_code_only_for_its_own() {
        assert!(has_kernels("80-virtual", (9, 0)).is_ok());
        assert!(has_kernels("80-virtual", (12, 0)).is_ok());
        assert!(has_kernels("90-virtual", (8, 9)).is_err());
        assert!(
            has_kernels("90", (10, 0)).is_ok(),
            "a bare entry carries PTX too"
        );
        assert!(has_kernels("120a-real", (12, 0)).is_ok());
        assert!(
            has_kernels("120a-real", (12, 1)).is_err(),
            "arch-specific: exact only"
        );
        assert!(has_kernels("90a-virtual", (10, 0)).is_err());
    }

    #[test]
    fn a_list_that_is_no_cuda_architecture_list_is_refused_by_name() {
        for bad in ["", "sm_90", "90-fast", "90;;80"] {
            let e = has_kernels(bad, (9, 0)).expect_err(bad);
            assert!(e.contains("CUDA architectures"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_provider_picks_the_device_and_a_cpu_build_refuses_cuda_by_saying_what_runs_it() {
        use ExecutionProvider::{Cpu, Cuda, Tensorrt};
        assert_eq!(for_provider(Cpu, None), Ok(Device::Cpu));
        assert_eq!(for_provider(Cpu, Some("90-real")), Ok(Device::Cpu));
        assert_eq!(
            for_provider(Cuda, Some("90-real")),
            Ok(Device::Cuda("90-real"))
        );
        let e = for_provider(Cuda, None).expect_err("CPU build");
        assert!(
            e.contains("GPU agent image") && e.contains("executionProvider: cpu"),
            "{e}"
        );
        assert!(for_provider(Tensorrt, Some("90-real")).is_err());
        assert_eq!(Device::Cuda("90-real").provider(), Cuda);
    }
}
