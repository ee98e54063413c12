//! kiln-agent: the node side of kiln. `local` runs the whole pipeline on one machine; the same
//! pipeline serves the compile Job and the DaemonSet.
//!
//! * [`cmd`] — one module per subcommand: its flags and its entry point (printing, exit codes).
//! * [`pipeline`] — the library every subcommand shares: fetch and verify, compile, load, warm
//!   with parity, probe the hardware.
//! * [`run`] — the DaemonSet's loop (watches, decisions, KilnNode status, pod gates).
//! * [`backend`] — the engine backends (tract, a foreign compiler via `exec`).
//! * [`compat`] — whether a class's hardware facts hold on a machine (pure).
//! * [`tensor`], [`placement`] — the host tensor every engine takes and returns, and whether a
//!   measured placement is allowed: below both the pipeline and the backends.
//! * [`memory`] — the heap ceiling (the binary's global allocator).
//! * [`secrets`] — credentials out of the environment and command line before any child starts.

pub mod backend;
pub mod cmd;
pub mod compat;
pub mod device_memory;
pub mod error;
pub mod host_pid;
pub mod memory;
pub mod metrics;
pub mod pipeline;
pub mod placement;
pub mod run;
pub mod secrets;
pub mod tensor;

/// What unit tests of several modules share.
#[cfg(test)]
pub(crate) mod test_support {
    /// A build manifest with every required field, `fields` (a JSON object) set over them.
    pub fn manifest(fields: serde_json::Value) -> kiln_crds::BuildManifest {
        let mut m = serde_json::json!({
            "manifestVersion": 1, "compileKey": "0".repeat(64), "artifactDigest": "0".repeat(64),
            "artifactSize": 1, "mediaType": "x", "backend": "tract", "backendVersion": "0",
            "toolVersion": "0", "precision": "fp32", "profiles": {}, "class": {},
            "host": {"arch": "amd64", "cpuLevel": "x", "cores": 1, "memoryBytes": 1},
            "flags": {}, "inputs": {}, "outputs": [], "unsupportedOperators": [],
            "parityMaxAbsError": null, "compileSeconds": 0.0, "converterLog": []
        });
        if let (Some(m), Some(f)) = (m.as_object_mut(), fields.as_object()) {
            m.extend(f.clone());
        }
        serde_json::from_value(m).expect("manifest")
    }
}
