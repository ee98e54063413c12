//! The engines a server runs requests on, and how many ([`size`], pure). A shareable engine
//! (tract: a run keeps its state to itself and uses one core) is loaded once and runs as many
//! requests at once as the pod has cores. Any other engine runs one request at a time on all
//! the cores or on the device, so one instance already uses them; more (`--instances`) are
//! loaded only when asked and only while they fit in half the memory the pod may still take.

use kiln_engines::backend::Engine;
use std::sync::Mutex;

/// How many engines, and how many requests run at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// Engines loaded.
    pub instances: usize,
    /// Requests that run at once (the gate's workers).
    pub workers: usize,
}

/// What sizing depends on.
#[derive(Clone, Copy, Debug)]
pub struct Facts {
    /// Whether one engine runs requests at once ([`Engine::shareable`]).
    pub shareable: bool,
    /// The cores the process may use (its CPU limit, rounded up).
    pub cores: usize,
    /// The artifact's bytes: about what each further engine instance costs in memory.
    pub artifact_bytes: u64,
    /// The memory the process may still take (the cgroup's limit less its usage, or the
    /// machine's available memory), when known.
    pub memory_available: Option<u64>,
}

/// The sizing for `facts`, with `--instances` (`asked`) when given: for a shareable engine the
/// requests that run at once, else the engines loaded. Refused with what to change when the
/// asked instances do not fit in half the available memory. Pure.
pub fn size(facts: Facts, asked: Option<usize>) -> Result<Sizing, String> {
    let cores = facts.cores.max(1);
    if facts.shareable {
        let workers = asked.unwrap_or(cores).max(1);
        return Ok(Sizing {
            instances: 1,
            workers,
        });
    }
    let instances = asked.unwrap_or(1).max(1);
    if instances > 1
        && let Some(free) = facts.memory_available
    {
        let extra = facts.artifact_bytes.saturating_mul(instances as u64 - 1);
        if extra > free / 2 {
            return Err(format!(
                "--instances {instances}: {} more engines of {} MiB each need {} MiB, more than half the {} MiB this pod may still take; ask for fewer or raise the memory limit",
                instances - 1,
                facts.artifact_bytes >> 20,
                extra >> 20,
                free >> 20
            ));
        }
    }
    Ok(Sizing {
        instances,
        workers: instances,
    })
}

/// The memory this process may still take: the cgroup v2 limit less its usage where there is a
/// limit, else the machine's `MemAvailable`. `None` when neither can be read.
pub fn memory_available() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .and_then(|m| m.trim().parse::<u64>().ok())
        .zip(read("/sys/fs/cgroup/memory.current").and_then(|c| c.trim().parse::<u64>().ok()))
        .map(|(max, used)| max.saturating_sub(used));
    let machine = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib << 10)
    });
    match (cgroup, machine) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (c, m) => c.or(m),
    }
}

/// Loaded engines and which are free. Callers hold one of the gate's workers
/// ([`crate::admission::Gate`], opened with [`Pool::workers`]) while they run, so a free
/// engine is always there.
pub struct Pool {
    engines: Vec<Box<dyn Engine>>,
    free: Mutex<Vec<usize>>,
    workers: usize,
}

impl Pool {
    /// A pool of `engines` running `workers` requests at once: one shareable engine, or one
    /// request per engine.
    pub fn new(engines: Vec<Box<dyn Engine>>, workers: usize) -> Self {
        let free = Mutex::new((0..engines.len()).collect());
        Pool {
            engines,
            free,
            workers,
        }
    }

    /// Requests that run at once.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Engines loaded.
    pub fn instances(&self) -> usize {
        self.engines.len()
    }

    /// Any engine, for what every instance shares (profiles, types).
    pub fn first(&self) -> &dyn Engine {
        self.engines[0].as_ref()
    }

    /// Runs `f` on a free engine (the shareable one, or one nobody else runs), and frees it
    /// again, also when `f` panics. `Err` only when no engine is free: a caller without a worker.
    pub fn with<R>(&self, f: impl FnOnce(&dyn Engine) -> R) -> Result<R, String> {
        if self.engines.len() == 1 && self.engines[0].shareable() {
            return Ok(f(self.engines[0].as_ref()));
        }
        let taken = self
            .free
            .lock()
            .map_err(|_| "the engine pool is poisoned".to_string())?
            .pop()
            .ok_or("no engine is free: a run without a worker")?;
        struct Give<'a>(&'a Mutex<Vec<usize>>, usize);
        impl Drop for Give<'_> {
            fn drop(&mut self) {
                if let Ok(mut free) = self.0.lock() {
                    free.push(self.1);
                }
            }
        }
        let _give = Give(&self.free, taken);
        Ok(f(self.engines[taken].as_ref()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn facts(shareable: bool) -> Facts {
        Facts {
            shareable,
            cores: 8,
            artifact_bytes: 1 << 30,
            memory_available: Some(6 << 30),
        }
    }

    #[test]
    fn a_shareable_engine_runs_one_request_per_core_on_one_instance() {
        assert_eq!(
            size(facts(true), None),
            Ok(Sizing {
                instances: 1,
                workers: 8
            })
        );
        assert_eq!(size(facts(true), Some(3)).map(|s| s.workers), Ok(3));
    }

    #[test]
    fn another_engine_is_one_instance_unless_more_are_asked_and_fit() {
        assert_eq!(
            size(facts(false), None),
            Ok(Sizing {
                instances: 1,
                workers: 1
            })
        );
        assert_eq!(size(facts(false), Some(4)).map(|s| s.instances), Ok(4));
        let refused = size(facts(false), Some(5)).unwrap_err();
        assert!(
            refused.contains("--instances 5") && refused.contains("fewer"),
            "{refused}"
        );
        let unknown = Facts {
            memory_available: None,
            ..facts(false)
        };
        assert_eq!(size(unknown, Some(5)).map(|s| s.workers), Ok(5));
    }
}
