//! Whether a class's hardware facts hold on a machine: the one place that decides it. Pure: facts
//! in (label key → value, as `kiln_crds::class::class_facts` makes them), mismatches out; the
//! callers turn a mismatch into their own error and message.
//!
//! Two rules over the same facts, each for a reason:
//! * [`matches_class`], a compile Job's: the node must be exactly the class it was pinned to, for
//!   every hardware key kiln probes (a key the probe lacks is a mismatch: a GPU class on a node
//!   without one), because the artifact it builds is that class's for every node of it.
//! * [`runs_here`], an agent's: every fact the probe knows must hold, a CPU level and host memory
//!   as floors (a `x86-64-v2` build runs on a `x86-64-v3` machine, a `kiln.dev/memory-gib` 16
//!   build on a 32); keys the probe does not know (a node pool) are the labels' business.
//!
//! And [`gpu_gap`], what a GPU build demands of a node's class, said plainly before a caller
//! compares whole classes: that GPU, its compute capability, a driver at least as new.

use kiln_crds::class::ClassFacts;
use kiln_crds::labels::{
    CPU_LEVEL, DEFAULT_CLASS_KEYS, DRIVER_MAJOR, GPU_COMPUTE_MAJOR, GPU_COMPUTE_MINOR, GPU_PRODUCT,
    MEMORY_GIB,
};

/// One fact of a class that does not hold on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The label key.
    pub key: String,
    /// What the class says.
    pub want: String,
    /// What this machine probes as (`None`: the probe found nothing for the key).
    pub have: Option<String>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let have = self.have.as_deref().unwrap_or("nothing");
        write!(
            f,
            "{}: class says {:?}, this node probes {have:?}",
            self.key, self.want
        )
    }
}

/// The mismatches, joined for a message.
pub fn describe(mismatches: &[Mismatch]) -> String {
    mismatches
        .iter()
        .map(Mismatch::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A compile Job's rule: every hardware fact of `class` (the keys kiln probes itself: GPU product,
/// compute capability, driver, architecture, CPU level) equals the probed one. Other class keys
/// (a node pool) say how the node is labelled, not what it is; facts the node has beyond the class
/// do not matter.
pub fn matches_class(class: &ClassFacts, probed: &ClassFacts) -> Vec<Mismatch> {
    class
        .iter()
        .filter(|(k, _)| DEFAULT_CLASS_KEYS.contains(&k.as_str()))
        .filter(|(k, want)| probed.get(*k) != Some(*want))
        .map(|(k, want)| mismatch(k, want, probed.get(k)))
        .collect()
}

/// An agent's rule: every fact of `class` that the probe knows holds on this machine, a CPU level
/// and host memory as floors (a lower x86-64 level runs on a higher one, an engine sized for
/// 16 GiB on a node of 32).
pub fn runs_here(class: &ClassFacts, probed: &ClassFacts) -> Vec<Mismatch> {
    class
        .iter()
        .filter_map(|(k, want)| {
            let have = probed.get(k)?;
            let fits = if k == CPU_LEVEL {
                cpu_level_rank(have) >= cpu_level_rank(want)
            } else if k == MEMORY_GIB {
                at_least(have, want)
            } else {
                have == want
            };
            (!fits).then(|| mismatch(k, want, Some(have)))
        })
        .collect()
}

/// Whether whole number `have` is at least `want` (anything else: no).
fn at_least(have: &str, want: &str) -> bool {
    matches!((have.parse::<u64>(), want.parse::<u64>()), (Ok(h), Ok(w)) if h >= w)
}

/// Order of x86-64 levels; anything unknown is the baseline.
pub fn cpu_level_rank(value: &str) -> u8 {
    match value {
        "x86-64-v4" => 4,
        "x86-64-v3" => 3,
        "x86-64-v2" => 2,
        _ => 1,
    }
}

/// What keeps a GPU build (class `built`) off a node of class `here`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuGap {
    /// Built for a GPU; the node's class names none.
    NoGpu {
        /// The GPU it was built for.
        product: String,
    },
    /// Built for another compute capability (`major.minor`): its kernels are that device's.
    ComputeCapability {
        /// The build's.
        want: String,
        /// The node's.
        have: String,
    },
    /// Built under a newer NVIDIA driver than the node runs: its kernels may need what the
    /// older driver lacks.
    OlderDriver {
        /// The build's driver major version.
        want: u32,
        /// The node's.
        have: u32,
    },
}

/// The first thing a GPU build for `built` lacks on a node of class `here`, in the order a reader
/// fixes them: no GPU, another compute capability, an older driver. `None` when nothing (a CPU
/// build asks nothing of the GPU).
pub fn gpu_gap(built: &ClassFacts, here: &ClassFacts) -> Option<GpuGap> {
    if let Some(product) = built.get(GPU_PRODUCT)
        && !here.contains_key(GPU_PRODUCT)
    {
        return Some(GpuGap::NoGpu {
            product: product.clone(),
        });
    }
    let cc = |f: &ClassFacts| {
        f.get(GPU_COMPUTE_MAJOR)
            .zip(f.get(GPU_COMPUTE_MINOR))
            .map(|(a, b)| format!("{a}.{b}"))
    };
    if let (Some(want), Some(have)) = (cc(built), cc(here))
        && want != have
    {
        return Some(GpuGap::ComputeCapability { want, have });
    }
    let major = |f: &ClassFacts| f.get(DRIVER_MAJOR).and_then(|d| d.parse::<u32>().ok());
    if let (Some(want), Some(have)) = (major(built), major(here))
        && want > have
    {
        return Some(GpuGap::OlderDriver { want, have });
    }
    None
}

fn mismatch(key: &str, want: &str, have: Option<&String>) -> Mismatch {
    Mismatch {
        key: key.to_string(),
        want: want.to_string(),
        have: have.cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::labels::ARCH;

    fn facts(pairs: &[(&str, &str)]) -> ClassFacts {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    /// Which keys each rule finds wrong for one (class, probe) pair.
    fn both(class: &ClassFacts, probed: &ClassFacts) -> (Vec<String>, Vec<String>) {
        let keys = |m: Vec<Mismatch>| m.into_iter().map(|m| m.key).collect();
        (
            keys(matches_class(class, probed)),
            keys(runs_here(class, probed)),
        )
    }

    #[test]
    fn the_two_rules_side_by_side() {
        let probed = facts(&[(ARCH, "amd64"), (CPU_LEVEL, "x86-64-v3")]);
        let none = (vec![], vec![]);
        // The node's own class: both hold; facts beyond the class do not matter to either.
        assert_eq!(both(&probed, &probed), none);
        assert_eq!(both(&facts(&[(ARCH, "amd64")]), &probed), none);
        // A pool label is no hardware: the Job's selector matched it, the probe cannot see it.
        assert_eq!(both(&facts(&[("example.com/pool", "a")]), &probed), none);
        // Where they differ: a lower CPU level is a floor an agent accepts, a Job is not that class.
        let v2 = facts(&[(ARCH, "amd64"), (CPU_LEVEL, "x86-64-v2")]);
        assert_eq!(both(&v2, &probed), (vec![CPU_LEVEL.to_string()], vec![]));
        // A higher one: neither.
        let v4 = facts(&[(CPU_LEVEL, "x86-64-v4")]);
        let cpu = vec![CPU_LEVEL.to_string()];
        assert_eq!(both(&v4, &probed), (cpu.clone(), cpu));
        // Host memory is a floor for an agent; a Job builds what its class facts say, whatever
        // its own node's memory (the key is no default hardware key).
        let mem = |gib: &str| facts(&[(ARCH, "amd64"), (MEMORY_GIB, gib)]);
        let probed_24 = mem("24");
        assert_eq!(both(&mem("16"), &probed_24), none);
        assert_eq!(both(&mem("24"), &probed_24), none);
        let memory = vec![MEMORY_GIB.to_string()];
        assert_eq!(both(&mem("32"), &probed_24), (vec![], memory.clone()));
        assert_eq!(both(&mem("lots"), &probed_24), (vec![], memory));
        // A GPU class on a node whose probe found no GPU: the Job's rule refuses it, the agent's
        // leaves an unprobed key to the labels (its GPU demands are `gpu_gap`'s, on the classes).
        let l4 = facts(&[(GPU_PRODUCT, "NVIDIA-L4")]);
        assert_eq!(both(&l4, &probed), (vec![GPU_PRODUCT.to_string()], vec![]));
        // Another GPU than the probed one: both.
        let h100 = facts(&[(GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3")]);
        let gpu = vec![GPU_PRODUCT.to_string()];
        assert_eq!(both(&l4, &h100), (gpu.clone(), gpu));
        // A probed key outside the default hardware keys is compared by the agent only.
        let pool_b = facts(&[("example.com/pool", "b")]);
        let pool = vec!["example.com/pool".to_string()];
        assert_eq!(
            both(&facts(&[("example.com/pool", "a")]), &pool_b),
            (vec![], pool)
        );
    }

    #[test]
    fn a_mismatch_names_the_key_and_both_values() {
        let m = &matches_class(&facts(&[(GPU_PRODUCT, "NVIDIA-L4")]), &facts(&[]))[0];
        assert_eq!(
            m.to_string(),
            "nvidia.com/gpu.product: class says \"NVIDIA-L4\", this node probes \"nothing\""
        );
        let v4 = facts(&[(CPU_LEVEL, "x86-64-v4")]);
        let wrong = runs_here(&v4, &facts(&[(CPU_LEVEL, "x86-64-v3")]));
        assert!(describe(&wrong).contains("\"x86-64-v3\""), "{wrong:?}");
        assert!(cpu_level_rank("baseline") < cpu_level_rank("x86-64-v2"));
    }

    #[test]
    fn a_gpu_build_needs_that_gpu_its_compute_capability_and_a_driver_as_new() {
        let h100 = facts(&[
            (GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
            (GPU_COMPUTE_MAJOR, "9"),
            (GPU_COMPUTE_MINOR, "0"),
            (DRIVER_MAJOR, "580"),
        ]);
        assert_eq!(gpu_gap(&h100, &h100), None);
        let mut old_driver = h100.clone();
        old_driver.insert(DRIVER_MAJOR.into(), "550".into());
        let older = GpuGap::OlderDriver {
            want: 580,
            have: 550,
        };
        assert_eq!(gpu_gap(&h100, &old_driver), Some(older));
        assert_eq!(gpu_gap(&old_driver, &h100), None, "an older driver's build");
        let mut l4 = h100.clone();
        l4.insert(GPU_COMPUTE_MAJOR.into(), "8".into());
        l4.insert(GPU_COMPUTE_MINOR.into(), "9".into());
        l4.insert(DRIVER_MAJOR.into(), "535".into());
        let cc = GpuGap::ComputeCapability {
            want: "9.0".into(),
            have: "8.9".into(),
        };
        assert_eq!(gpu_gap(&h100, &l4), Some(cc), "capability before driver");
        let cpu = facts(&[(ARCH, "amd64")]);
        let no_gpu = GpuGap::NoGpu {
            product: "NVIDIA-H100-80GB-HBM3".into(),
        };
        assert_eq!(gpu_gap(&h100, &cpu), Some(no_gpu));
        assert_eq!(gpu_gap(&cpu, &h100), None, "a CPU build");
        // The exact rule compares drivers too, but as equality: a newer node driver is another
        // class to a compile Job, and no gap to a GPU build.
        assert_eq!(matches_class(&old_driver, &h100).len(), 1);
        assert_eq!(gpu_gap(&old_driver, &h100), None);
    }
}
