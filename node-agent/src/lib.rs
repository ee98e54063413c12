//! kiln-agent: the node side of kiln. `local` runs the whole pipeline on one machine; the same
//! pipeline serves the compile Job and the DaemonSet. From the top down (a module uses only
//! those below it):
//!
//! * [`cmd`] — one module per subcommand: its flags and its entry point (printing, exit codes);
//!   nothing else.
//! * [`daemon`] — the node daemon, `kiln-agent run` (the DaemonSet's loop: watches, decisions,
//!   KilnNode status, pod gates).
//! * [`csi`] — the CSI node plugin `csi.kiln.dev`, `kiln-agent csi`: mounts what the node cache
//!   holds verified into serving pods, read-only (never imports `daemon`).
//! * [`cache`](mod@cache) — the node cache both of them read (the daemon writes it).
//! * [`golden`], [`bench`](mod@bench) — making a fixture's golden outputs (`fixtures`, and the engine's
//!   process that runs the reference); what the benchmark subcommands measure.
//! * [`pipeline`] — the library every subcommand shares: fetch and verify, compile, load, warm
//!   with parity, the engine's process.
//! * [`backend`] — the engine backends (tract, ONNX Runtime, llama.cpp, a foreign compiler via
//!   `exec`) and their vocabulary: the host tensor every engine takes and returns
//!   ([`backend::tensor`]) and whether a measured placement is allowed
//!   ([`backend::cpu_fallback`]).
//! * [`host`] — facts of this machine: the hardware probe, class compatibility, the heap
//!   ceiling, GPU memory, the host pid.
//! * [`metrics`], [`error`], [`secrets`] — shared by all: the agent's metrics, its error and
//!   failure reasons, credentials out of the environment and command line before any child
//!   starts.
//! * [`gguf_index`] — the frame of kiln's index at the end of a llamacpp artifact, which the
//!   llama.cpp backend writes and the CSI plugin reads (its chat template) without engine code.

pub mod backend;
pub mod bench;
pub mod cache;
pub mod cmd;
pub mod csi;
pub mod daemon;
pub mod error;
pub mod gguf_index;
pub mod golden;
pub mod host;
pub mod metrics;
pub mod oip;
pub mod pipeline;
pub mod secrets;
pub mod server;
pub mod warmer;

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
