//! The steps between a picked artifact and "ready" on this node: pull it into the node cache
//! verified, re-check it against the real device and this binary, then (in `agent.rs`) load and
//! warm with `pipeline::ready::{load_warm_isolated, judge_warmed}`, the code `local` runs too.
//! Touches the store (read only) and the node cache; counts in the metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use kiln_crds::BuildManifest;
use kiln_crds::class::ClassFacts;
use kiln_store::{ArtifactRef, Store};

use super::decide::pick::Pick;
use kiln_engines::backend::Backend;
use kiln_engines::metrics::Metrics;
use kiln_engines::pipeline::ready::{self, check_compatible};
use kiln_node_core::cache::{Cache, Cached};
use kiln_node_core::error::{Error, Result};

/// A verified artifact in the node cache.
pub struct Pulled {
    /// The artifact file.
    pub path: PathBuf,
    /// Its build manifest.
    pub manifest: BuildManifest,
    /// Bytes pulled now (0 when the cached copy re-verified).
    pub bytes: u64,
    /// Seconds the pull (or the cached copy's re-hash) took.
    pub seconds: f64,
}

/// Puts `pick`'s artifact into the cache, verified. A cached copy is re-hashed first and used
/// when intact; a corrupt one is deleted, counted, and pulled again. The pull itself is the
/// store's: by manifest digest, hashing while streaming, renamed into place only when it matches.
/// A cache filesystem too full for it (`InsufficientStorage`, nothing of it left on disk) makes
/// room ([`Cache::make_room`]: never what `serving` names or a pod links) and pulls once more.
pub async fn pull(
    store: &dyn Store,
    trust: &kiln_store::attest::Trust,
    cache: &mut Cache,
    pick: &Pick,
    serving: &BTreeSet<String>,
    metrics: &Metrics,
) -> Result<Pulled> {
    let started = Instant::now();
    match tokio::task::block_in_place(|| cache.verified(&pick.digest)) {
        Ok(Some(Cached { path, manifest })) => {
            return Ok(Pulled {
                path,
                manifest,
                bytes: 0,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        Ok(None) => {}
        Err(e) => {
            metrics.verify_failure(e.reason());
            tracing::warn!(error = %e, "cached artifact corrupt; pulling it again");
        }
    }
    let staging = cache.pull_dir(&pick.digest)?;
    let r = ArtifactRef {
        compile_key: pick.compile_key.clone(),
        manifest_digest: pick.manifest_digest.clone(),
        artifact_digest: pick.digest.clone(),
        size: None,
    };
    let mut made_room = false;
    let manifest = loop {
        match ready::pull_verified(store, trust, &r, &staging.artifact(), metrics).await {
            Ok(manifest) => break manifest,
            Err(Error::InsufficientStorage {
                needed,
                free,
                message,
            }) if !made_room => {
                made_room = true;
                let freed = tokio::task::block_in_place(|| cache.make_room(needed, serving))?;
                if freed.is_empty() {
                    tracing::warn!(digest = %pick.digest, needed, free, "node cache full; nothing that may go would make the room");
                    staging.tidy();
                    return Err(Error::InsufficientStorage {
                        needed,
                        free,
                        message: format!(
                            "{message}; evicting every cached artifact that neither serves nor is mounted by a pod would not free enough: free space on the node cache's disk, or give it a larger one"
                        ),
                    });
                }
                tracing::warn!(digest = %pick.digest, needed, evicted = ?freed, "node cache full; evicted the least recently passed artifacts to make room");
            }
            Err(e) => {
                staging.tidy();
                return Err(e);
            }
        }
    };
    let path = tokio::task::block_in_place(|| cache.install(staging, &manifest))
        .inspect_err(|e| metrics.verify_failure(e.reason()))?;
    let seconds = started.elapsed().as_secs_f64();
    let bytes = manifest.artifact_size;
    metrics.pulled(bytes, seconds);
    tracing::info!(digest = %pick.digest, bytes, seconds, "artifact pulled and verified into the node cache");
    Ok(Pulled {
        path,
        manifest,
        bytes,
        seconds,
    })
}

/// Re-checks a manifest against this node before anything is loaded: the class the node is
/// labelled as must be what its hardware probes as (for the keys the probe knows), the artifact
/// must be built for that class, and by this binary's backend version. A fallback class's
/// artifact (`fallback`) instead must merely run here: same facts, except that a lower x86-64
/// level runs on a higher one and an engine sized for less host memory on more.
pub fn check(
    manifest: &BuildManifest,
    backend: &dyn Backend,
    labelled: &ClassFacts,
    probed: &BTreeMap<String, String>,
    fallback: bool,
    metrics: &Metrics,
) -> Result<()> {
    let result = if fallback {
        runs_here(&manifest.class, probed)
            .and_then(|()| check_compatible(manifest, backend, &manifest.class))
    } else {
        runs_here(labelled, probed).and_then(|()| check_compatible(manifest, backend, labelled))
    };
    result.inspect_err(|e| metrics.compat_rejection(e.reason()))
}

/// Whether every fact of `class` that the probe knows holds on this machine
/// ([`kiln_engines::host::compat::runs_here`]).
pub fn runs_here(class: &ClassFacts, probed: &BTreeMap<String, String>) -> Result<()> {
    let wrong = kiln_engines::host::compat::runs_here(class, probed);
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Error::IncompatibleHardware(format!(
            "the artifact's class does not hold on this node's hardware ({}); fix the node's labels or the target's classes",
            kiln_engines::host::compat::describe(&wrong)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::labels::CPU_LEVEL;

    fn facts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn class_facts_must_hold_on_the_probed_hardware() {
        let probed = facts(&[("kubernetes.io/arch", "amd64"), (CPU_LEVEL, "x86-64-v3")]);
        runs_here(
            &facts(&[("kubernetes.io/arch", "amd64"), (CPU_LEVEL, "x86-64-v2")]),
            &probed,
        )
        .expect("a v2 build runs on v3");
        // Keys the probe does not know (custom pools) are the labels' business.
        runs_here(&facts(&[("example.com/pool", "a")]), &probed).expect("unprobed key");
        let err = runs_here(&facts(&[(CPU_LEVEL, "x86-64-v4")]), &probed).expect_err("v4 on v3");
        assert_eq!(err.reason(), kiln_crds::FailureReason::IncompatibleHardware);
        let gpu = facts(&[("nvidia.com/gpu.product", "NVIDIA-L4")]);
        let probed_gpu = facts(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]);
        assert!(runs_here(&gpu, &probed_gpu).is_err());
    }
}
