//! Helpers shared by the store's integration tests: artifacts with known digests and the build
//! manifests that describe them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kiln_crds::BuildManifest;
use kiln_crds::manifest::MANIFEST_VERSION;
use sha2::{Digest, Sha256};

/// A deterministic pseudo-random artifact of `len` bytes written to `dir/name`, with the
/// manifest that describes it under compile key `sha256(seed)`.
pub fn artifact(dir: &Path, name: &str, len: usize, seed: u8) -> (PathBuf, BuildManifest) {
    let mut bytes = Vec::with_capacity(len);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(seed);
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(len);
    let path = dir.join(name);
    std::fs::write(&path, &bytes).unwrap();
    let key = hex::encode(Sha256::digest([seed, b'k']));
    (path, manifest(&key, &bytes))
}

/// A build manifest for `bytes` under `key`.
pub fn manifest(key: &str, bytes: &[u8]) -> BuildManifest {
    BuildManifest {
        manifest_version: MANIFEST_VERSION,
        compile_key: key.into(),
        artifact_digest: hex::encode(Sha256::digest(bytes)),
        artifact_size: bytes.len() as u64,
        media_type: "application/vnd.kiln.tract.nnef.v1.tar".into(),
        backend: "tract".into(),
        backend_version: "0.23.9".into(),
        tool_version: "test".into(),
        precision: "fp32".into(),
        profiles: Default::default(),
        class: [("kubernetes.io/arch".to_string(), "amd64".to_string())].into(),
        host: Default::default(),
        flags: Default::default(),
        inputs: Default::default(),
        outputs: vec!["y".into()],
        unsupported_operators: vec![],
        parity_max_abs_error: Some(0.0),
        compile_seconds: 1.5,
        converter_log: vec![],
    }
}

/// Names in `dir` (sorted), to prove no partial file was left behind.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
