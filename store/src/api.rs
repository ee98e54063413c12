//! What every store is and speaks: the [`Store`] trait, the entry and reference types, the
//! registry options, and the checks of keys and digests every implementation runs before a
//! value names a path or a tag. Below `lib.rs` (which opens one), the implementations (`fs.rs`,
//! `oci.rs`) and `attest/`, so none of them reaches up to another. Re-exported at the crate
//! root.

use std::path::{Path, PathBuf};

use kiln_crds::BuildManifest;

use crate::error::{Error, Result};
use crate::staged;

/// Default cap on one artifact's size (a pull refuses anything larger before writing a byte).
pub const DEFAULT_MAX_ARTIFACT_BYTES: u64 = 256 << 30;

/// How to reach a registry (from [`crate::RegistryArgs`]). Ignored by the filesystem store
/// except for the size cap.
#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// Plain HTTP instead of HTTPS.
    pub insecure: bool,
    /// Basic-auth user name, if the registry needs one.
    pub username: Option<String>,
    /// Basic-auth password.
    pub password: Option<String>,
    /// Largest artifact a pull accepts.
    pub max_artifact_bytes: u64,
    /// Mirrors of the registry, a JSON list (`oci/mirror.rs`), or none.
    pub mirrors: Option<String>,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            insecure: false,
            username: None,
            password: None,
            max_artifact_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
            mirrors: None,
        }
    }
}

/// Why a mirror was passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorSkip {
    /// The mirror's `HOST[:PORT]`.
    pub mirror: String,
    /// `unavailable`, `not_found`, `hash_mismatch` or `invalid`: a bounded metric label.
    pub reason: &'static str,
    /// What it did.
    pub message: String,
}

/// Everything needed to pull one class's artifact by digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactRef {
    /// Compile key (64 hex); must match the pulled manifest's.
    pub compile_key: String,
    /// Digest of the stored manifest, `sha256:<hex>`; the pull verifies the manifest against it.
    pub manifest_digest: String,
    /// sha256 (bare hex) of the artifact bytes.
    pub artifact_digest: String,
    /// Artifact size in bytes, when the caller knows it; the verified manifest's size rules.
    pub size: Option<u64>,
}

/// A stored entry: the build manifest and the digest it is stored under.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The build manifest.
    pub manifest: BuildManifest,
    /// Digest of the stored manifest, `sha256:<hex>` (what agents pull by).
    pub manifest_digest: String,
}

impl Entry {
    /// The reference an agent pulls this entry by.
    pub fn artifact_ref(&self) -> ArtifactRef {
        ArtifactRef {
            compile_key: self.manifest.compile_key.clone(),
            manifest_digest: self.manifest_digest.clone(),
            artifact_digest: self.manifest.artifact_digest.clone(),
            size: Some(self.manifest.artifact_size),
        }
    }
}

/// Where compiled artifacts live.
#[async_trait::async_trait]
pub trait Store: Send + Sync {
    /// The store's location, for logs and messages (a path or a registry URL, no credentials).
    fn location(&self) -> String;
    /// Proves the store can be written, before a long compile rather than after it.
    async fn check_writable(&self) -> Result<()>;
    /// The entry stored under `key`, if any. An entry is only visible together with its
    /// complete artifact.
    async fn lookup(&self, key: &str) -> Result<Option<Entry>>;
    /// The first steps of a publish: stores the artifact and its manifest by digest (blobs, then
    /// the manifest), complete and durable, but not yet under `manifest.compile_key`, so
    /// [`Store::lookup`] does not see it. Returns the entry (its manifest digest is what the
    /// attestation names). Staging the same manifest twice is harmless.
    async fn stage(&self, artifact: &Path, manifest: &BuildManifest) -> Result<Entry>;
    /// The last step of a publish, after the attestation ([`Store::put_attestation`]): makes the
    /// staged `entry` the one `lookup` finds under its compile key, atomically. An entry already
    /// under the key is kept (and returned) unless `replace` (the caller refused it, say for a
    /// bad attestation), when this one takes its place. A lookup therefore sees nothing, or an
    /// entry whose attestation was stored before it became visible.
    async fn tag(&self, entry: &Entry, replace: bool) -> Result<Entry>;
    /// Stages and tags in one go, with no attestation in between (unsigned stores, tests); a
    /// signing publisher uses [`crate::attest::Trust::publish`]. Unless `replace`, an entry already
    /// under the key is kept and nothing is written.
    async fn put(&self, artifact: &Path, manifest: &BuildManifest, replace: bool) -> Result<Entry> {
        if !replace && let Some(entry) = self.lookup(&manifest.compile_key).await? {
            return Ok(entry);
        }
        let staged = self.stage(artifact, manifest).await?;
        self.tag(&staged, replace).await
    }
    /// Keeps `envelope` (a DSSE envelope, see [`crate::attest`]) as the attestation of the entry of
    /// `key` stored under `manifest_digest`, replacing any earlier one.
    async fn put_attestation(
        &self,
        key: &str,
        manifest_digest: &str,
        envelope: &[u8],
    ) -> Result<()>;
    /// The attestation kept for `key`'s entry under `manifest_digest`, if any (at most
    /// [`crate::attest::MAX_ENVELOPE_BYTES`]).
    async fn attestation(&self, key: &str, manifest_digest: &str) -> Result<Option<Vec<u8>>>;
    /// Pulls the artifact of `r` into `dest`: verifies the manifest by digest, streams the bytes
    /// while hashing into a temp file beside `dest`, and renames it into place only when size
    /// and sha256 match. `dest` never holds a partial or unverified file. Returns the manifest.
    async fn pull(&self, r: &ArtifactRef, dest: &Path) -> Result<BuildManifest>;
    /// A scratch directory for building an artifact before `put` (on the store's filesystem for
    /// a filesystem store, so `put` is a rename).
    fn scratch(&self) -> Result<tempfile::TempDir>;
    /// A directory on the store's filesystem where verified source blobs may be kept across
    /// compiles; `None` for a remote store.
    fn blob_cache(&self) -> Option<PathBuf>;
    /// Why registry mirrors were passed over since the last call (and forgets them); none for a
    /// store without mirrors.
    fn take_mirror_skips(&self) -> Vec<MirrorSkip> {
        Vec::new()
    }
    /// Fills the registry's mirrors with the entry of `r` right after it is published: each pull
    /// mirror serves the artifact once, verified, its bytes dropped, and each resolve mirror the
    /// attestation. A pull-through cache then fetches every blob from the registry once, now,
    /// instead of once for each node that asks while it is still cold (no cache makes a second
    /// client wait for a blob in flight). Returns why a mirror could not be filled (its nodes
    /// fill it as they pull); none for a store without mirrors.
    async fn preheat(&self, _r: &ArtifactRef) -> Vec<MirrorSkip> {
        Vec::new()
    }
}

/// Checks that `key` is a compile key (64 lowercase or uppercase hex digits).
pub(crate) fn check_key(location: &str, key: &str) -> Result<()> {
    if !staged::is_sha256_hex(key) {
        return Err(Error::unavailable(
            location,
            format!("{key:?} is not a compile key"),
        ));
    }
    Ok(())
}

/// Checks that a build manifest read from a store names its compile key and artifact digest as
/// 64 hex digits: both become path components and tags, so a manifest whose digest holds a path
/// (`../../x`) is refused before anything touches a path.
pub fn check_manifest_digests(what: &str, m: &BuildManifest) -> Result<()> {
    for (field, value) in [
        ("compileKey", &m.compile_key),
        ("artifactDigest", &m.artifact_digest),
    ] {
        if !staged::is_sha256_hex(value) {
            return Err(Error::HashMismatch {
                what: what.to_string(),
                message: format!(
                    "its {field} {value:?} is not 64 hex digits; the entry is refused"
                ),
            });
        }
    }
    Ok(())
}

/// The hex of a `sha256:<64 hex>` digest; anything else is refused (it becomes a file name or
/// a tag).
pub(crate) fn digest_hex(digest: &str) -> Result<&str> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| staged::is_sha256_hex(h))
        .ok_or_else(|| Error::HashMismatch {
            what: format!("digest {digest:?}"),
            message: "not of the form sha256:<64 hex digits>".into(),
        })
}
