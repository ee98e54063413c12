//! The limits an engine's process runs under, and the environment it inherits. Deciding them is
//! pure ([`Limits::for_step`], [`passes_env`]); [`apply`] is what the child calls on itself
//! before it touches the model.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What bounds one engine step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// `RLIMIT_DATA`, bytes: the process's private writable memory (`--memory-limit`);
    /// `None`: no limit was set for kiln-agent.
    pub memory_bytes: Option<u64>,
    /// `RLIMIT_CPU` (soft), seconds of CPU time over all threads; the hard limit is a few
    /// seconds above it.
    pub cpu_seconds: u64,
    /// Wall-clock deadline; the parent kills the process group when it passes.
    pub deadline: Duration,
}

/// Seconds between the soft CPU limit (`SIGXCPU`) and the hard one (`SIGKILL`).
const CPU_GRACE_SECONDS: u64 = 5;

impl Limits {
    /// The limits of a step with `deadline` on a machine with `cores` CPUs and `memory`
    /// (`--memory-limit`): CPU time is the deadline on every core, a backstop that holds even
    /// when the parent is gone. Pure.
    pub fn for_step(deadline: Duration, cores: usize, memory: Option<usize>) -> Self {
        let cores = u64::try_from(cores.max(1)).unwrap_or(1);
        Self {
            memory_bytes: memory.and_then(|m| u64::try_from(m).ok()),
            cpu_seconds: deadline.as_secs().max(1).saturating_mul(cores),
            deadline,
        }
    }
}

/// Whether the child inherits the environment variable `name`: what loads the runtimes, picks
/// the devices and sets up logging; never credentials (registry, kube, cloud). Pure.
pub fn passes_env(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "PATH",
        "TMPDIR",
        "TZ",
        "LANG",
        "RUST_LOG",
        "RUST_BACKTRACE",
        "ORT_DYLIB_PATH",
        "KILN_IREE_BIN",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_MODULE_LOADING",
        "OMP_NUM_THREADS",
    ];
    const PREFIXES: &[&str] = &["NVIDIA_", "LC_"];
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Applies `limits` to this process (the child, first thing): `RLIMIT_DATA`, `RLIMIT_CPU`, and
/// `SIGKILL` when the parent dies. A limit that cannot be set is an error: the child must not run
/// an engine unbounded.
pub fn apply(limits: &Limits) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    if let Some(bytes) = limits.memory_bytes {
        setrlimit(
            Resource::Data,
            Rlimit {
                current: Some(bytes),
                maximum: Some(bytes),
            },
        )?;
    }
    setrlimit(
        Resource::Cpu,
        Rlimit {
            current: Some(limits.cpu_seconds),
            maximum: Some(limits.cpu_seconds.saturating_add(CPU_GRACE_SECONDS)),
        },
    )?;
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_the_deadline_on_every_core() {
        let l = Limits::for_step(Duration::from_secs(600), 4, Some(2 << 30));
        assert_eq!(l.cpu_seconds, 2400);
        assert_eq!(l.memory_bytes, Some(2 << 30));
        let l = Limits::for_step(Duration::from_millis(10), 0, None);
        assert_eq!(l.cpu_seconds, 1, "at least a second, at least one core");
        assert_eq!(l.memory_bytes, None);
    }

    #[test]
    fn credentials_do_not_reach_the_engine() {
        for name in [
            "KILN_REGISTRY_PASSWORD",
            "KILN_REGISTRY_USERNAME",
            "KUBERNETES_SERVICE_HOST",
            "AWS_SECRET_ACCESS_KEY",
            "HOME",
            "KILN_MEMORY_LIMIT",
        ] {
            assert!(!passes_env(name), "{name}");
        }
        for name in [
            "ORT_DYLIB_PATH",
            "KILN_IREE_BIN",
            "LD_LIBRARY_PATH",
            "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES",
            "RUST_LOG",
        ] {
            assert!(passes_env(name), "{name}");
        }
    }
}
