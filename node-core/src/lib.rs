//! kiln-node-core: what every node-side crate shares, and nothing that runs a model.
//!
//! * [`error`] — the agent's error, classified once into a `FailureReason`.
//! * [`cache`](mod@cache) — the node cache on disk: the agent writes it ([`cache::Cache`]), the
//!   CSI plugin reads it ([`cache::View`]).
//! * [`gguf_index`] — the frame of kiln's index at the end of a llamacpp artifact, which the
//!   llama.cpp backend writes and the CSI plugin reads (its chat template) without engine code.
//!
//! May use: kiln-crds, kiln-store. Must not use an engine, a server, a Kubernetes client or any
//! other node crate (`crds/tests/boundaries.rs`).

pub mod cache;
pub mod error;
pub mod gguf_index;

/// What the node crates' unit tests share (feature `test-support`, dev-dependencies only).
#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
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
