//! Helpers shared by the store's integration tests: artifacts with known digests and the build
//! manifests that describe them.

#![allow(dead_code)]

pub mod publish;

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
        ..Default::default()
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

/// The trust chain on any store: a signed entry verifies; the same key's entry rewritten whole by
/// someone without the signing key (artifact and manifest consistent with each other) is found by
/// lookup but refused by the check, as is an entry with no attestation at all; a `replace` put
/// by the publisher restores a signed entry.
pub async fn poisoning_is_refused_and_replaced(store: &dyn kiln_store::Store, dir: &Path) {
    use kiln_crds::FailureReason;
    use kiln_store::attest::{Signer, Trust, Verifier, subject};
    let (private, public) = Signer::generate().unwrap();
    let publisher = Trust {
        signer: Some(std::sync::Arc::new(
            Signer::from_pem(private.as_bytes()).unwrap(),
        )),
        ..Trust::default()
    };
    let node = Trust::verifying(Verifier::from_pem(public.as_bytes()).unwrap());
    let (path, manifest) = artifact(dir, "signed", 100_000, 41);
    let entry = store.put(&path, &manifest, false).await.unwrap();
    // Stored but not yet signed: refused.
    let err = node.check(store, &subject(&entry)).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::SignatureInvalid, "{err}");
    assert!(err.to_string().contains("no attestation"), "{err}");
    publisher
        .sign(store, &entry, Some("agent@sha256:1234"))
        .await
        .unwrap();
    node.check(store, &subject(&entry)).await.unwrap();

    // The attacker writes another artifact under the same key, with a manifest that matches it.
    let (evil, _) = artifact(dir, "evil", 100_000, 42);
    let evil_manifest = self::manifest(&manifest.compile_key, &std::fs::read(&evil).unwrap());
    let poisoned = store.put(&evil, &evil_manifest, true).await.unwrap();
    let found = store.lookup(&manifest.compile_key).await.unwrap().unwrap();
    assert_eq!(found, poisoned, "lookup alone trusts what is stored");
    let err = node.check(store, &subject(&found)).await.unwrap_err();
    assert_eq!(err.reason(), FailureReason::SignatureInvalid, "{err}");
    // Also refused when it borrows the old attestation: it names another manifest digest.
    let old = store
        .attestation(&manifest.compile_key, &entry.manifest_digest)
        .await
        .unwrap();
    if let Some(old) = old {
        store
            .put_attestation(&manifest.compile_key, &poisoned.manifest_digest, &old)
            .await
            .unwrap();
        let err = node.check(store, &subject(&found)).await.unwrap_err();
        assert!(err.to_string().contains("something else"), "{err}");
    }

    // The publisher replaces the refused entry and signs it again.
    let (again, _) = artifact(dir, "signed-again", 100_000, 41);
    let restored = store.put(&again, &manifest, true).await.unwrap();
    assert_eq!(restored.manifest.artifact_digest, manifest.artifact_digest);
    publisher.sign(store, &restored, None).await.unwrap();
    let found = store.lookup(&manifest.compile_key).await.unwrap().unwrap();
    node.check(store, &subject(&found)).await.unwrap();
}
