//! The trust a process holds (its signer, its verifier, a memo of what it verified) and the
//! store I/O around them: checking an entry's attestation in a store, signing and publishing
//! an entry in the order that leaves no unattested window.

use std::path::Path;

use kiln_crds::BuildManifest;

use super::keys::{Signer, Verifier};
use super::statement::{Statement, Subject};
use crate::{Entry, Error, Result};

/// The signing and verifying keys a process holds (either may be absent).
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// Signs what this process stores.
    pub signer: Option<std::sync::Arc<Signer>>,
    /// Checks what this process uses; `None` accepts unsigned entries (no keys configured).
    pub verifier: Option<Verifier>,
    /// Subjects already verified (entries are immutable by digest), so a reconcile loop does
    /// not fetch the same attestation again; bounded by [`VERIFIED_MEMO`].
    pub verified: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Verified subjects remembered before the memo starts over.
const VERIFIED_MEMO: usize = 65_536;

impl Trust {
    /// From optional key files; a signer alone also verifies its own signatures.
    pub fn from_files(signing_key: Option<&Path>, trust_keys: Option<&Path>) -> Result<Self> {
        let signer = signing_key
            .map(Signer::from_pem_file)
            .transpose()?
            .map(std::sync::Arc::new);
        let verifier = match (trust_keys, &signer) {
            (Some(path), _) => Some(Verifier::from_pem_file(path)?),
            (None, Some(s)) => Some(s.verifier()),
            (None, None) => None,
        };
        Ok(Self {
            signer,
            verifier,
            verified: Default::default(),
        })
    }

    /// A verifier only, of the keys in `public` (PEM).
    pub fn verifying(verifier: Verifier) -> Self {
        Self {
            signer: None,
            verifier: Some(verifier),
            verified: Default::default(),
        }
    }

    /// Checks the attestation `store` keeps for `want`; `Ok` without a verifier.
    pub async fn check(&self, store: &dyn crate::Store, want: &Subject<'_>) -> Result<()> {
        let Some(verifier) = &self.verifier else {
            return Ok(());
        };
        let memo = format!(
            "{} {} {}",
            want.compile_key, want.manifest_digest, want.artifact_digest
        );
        let lock = || self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if lock().contains(&memo) {
            return Ok(());
        }
        let envelope = store
            .attestation(want.compile_key, want.manifest_digest)
            .await?
            .ok_or_else(|| Error::SignatureInvalid {
                what: format!(
                    "entry of compile key {} (manifest {}) in {}",
                    want.compile_key,
                    want.manifest_digest,
                    store.location()
                ),
                message: "it has no attestation; it was not stored by a kiln publisher holding the signing key".into(),
            })?;
        verifier.verify(&envelope, want)?;
        let mut seen = lock();
        if seen.len() >= VERIFIED_MEMO {
            seen.clear();
        }
        seen.insert(memo);
        Ok(())
    }

    /// Publishes an artifact in the order that leaves no window: blobs and manifest by digest
    /// ([`crate::Store::stage`]), then this process's attestation of them, then the compile-key
    /// tag ([`crate::Store::tag`]). A lookup at any moment finds nothing or an attested entry;
    /// a publisher that dies part-way leaves only unreferenced content. Unless `replace`, an
    /// entry already under the key is returned untouched (the caller checks whose it is).
    pub async fn publish(
        &self,
        store: &dyn crate::Store,
        artifact: &Path,
        manifest: &BuildManifest,
        replace: bool,
        builder_image: Option<&str>,
    ) -> Result<Entry> {
        if !replace && let Some(entry) = store.lookup(&manifest.compile_key).await? {
            return Ok(entry);
        }
        let staged = store.stage(artifact, manifest).await?;
        self.sign(store, &staged, builder_image).await?;
        store.tag(&staged, replace).await
    }

    /// Signs `entry` and stores the attestation beside it; nothing without a signer.
    pub async fn sign(
        &self,
        store: &dyn crate::Store,
        entry: &Entry,
        builder_image: Option<&str>,
    ) -> Result<()> {
        let Some(signer) = &self.signer else {
            return Ok(());
        };
        let envelope = signer.sign(&Statement::for_entry(entry, builder_image))?;
        store
            .put_attestation(
                &entry.manifest.compile_key,
                &entry.manifest_digest,
                &envelope,
            )
            .await
    }
}
