//! kiln's artifact store: compiled artifacts and their build manifests by compile key. The trait
//! is what the operator (which only asks "is this key stored, under which manifest digest?"), the
//! compile worker (which puts) and the agent (which pulls by digest) use. [`open`] picks the
//! implementation from the store URL: a path or `file:///path` is a [`FsStore`] (local mode, a
//! hostPath shared by operator and compile Jobs, tests); `oci://HOST[:PORT]/REPOSITORY` is an OCI
//! registry. No ML runtime: the operator links this crate.

pub mod attest;
mod error;
mod fs;
pub mod local_key;
mod oci;
pub mod staged;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_crds::BuildManifest;

pub use error::{Error, Result};
pub use fs::{FsStore, STALE_AFTER};
pub use oci::{ARTIFACT_TYPE, BUILD_MANIFEST_MEDIA_TYPE, ENGINE_MEDIA_TYPE, OciStore};

/// Default cap on one artifact's size (a pull refuses anything larger before writing a byte).
pub const DEFAULT_MAX_ARTIFACT_BYTES: u64 = 256 << 30;

/// How to reach a registry (from [`RegistryArgs`]). Ignored by the filesystem store except for
/// the size cap.
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
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            insecure: false,
            username: None,
            password: None,
            max_artifact_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
        }
    }
}

/// The registry flags both binaries take, each also read from its environment variable (the
/// names the chart and the compile Jobs set).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RegistryArgs {
    /// Talk plain HTTP to the registry (test clusters only).
    #[arg(long, env = "KILN_REGISTRY_INSECURE")]
    pub registry_insecure: bool,
    /// Registry user name.
    #[arg(long, env = "KILN_REGISTRY_USERNAME")]
    pub registry_username: Option<String>,
    /// Registry password.
    #[arg(long, env = "KILN_REGISTRY_PASSWORD", hide_env_values = true)]
    pub registry_password: Option<String>,
}

impl RegistryArgs {
    /// The options these flags give (an empty user name or password means none).
    pub fn options(&self) -> RegistryOptions {
        RegistryOptions {
            insecure: self.registry_insecure,
            username: self.registry_username.clone().filter(|u| !u.is_empty()),
            password: self.registry_password.clone().filter(|p| !p.is_empty()),
            ..RegistryOptions::default()
        }
    }
}

/// The attestation keys a binary takes (files; the chart mounts them from a Secret).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TrustArgs {
    /// PKCS#8 PEM ECDSA P-256 private key: sign every artifact this process stores (compile
    /// Jobs; `local`). Also trusts its own signatures.
    #[arg(long, env = "KILN_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
    /// PEM public key(s) (P-256, as `cosign generate-key-pair` or `kiln-agent keygen` writes;
    /// several may follow each other): use only artifacts whose attestation one of them signed.
    /// Without it (and without --signing-key) unsigned artifacts are accepted.
    #[arg(long, env = "KILN_TRUST_KEY")]
    pub trust_key: Option<PathBuf>,
}

impl TrustArgs {
    /// Reads the keys; a file that is missing or not a P-256 PEM key is `SignatureInvalid`.
    pub fn load(&self) -> Result<attest::Trust> {
        attest::Trust::from_files(self.signing_key.as_deref(), self.trust_key.as_deref())
    }
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
    /// signing publisher uses [`attest::Trust::publish`]. Unless `replace`, an entry already
    /// under the key is kept and nothing is written.
    async fn put(&self, artifact: &Path, manifest: &BuildManifest, replace: bool) -> Result<Entry> {
        if !replace && let Some(entry) = self.lookup(&manifest.compile_key).await? {
            return Ok(entry);
        }
        let staged = self.stage(artifact, manifest).await?;
        self.tag(&staged, replace).await
    }
    /// Keeps `envelope` (a DSSE envelope, see [`attest`]) as the attestation of the entry of
    /// `key` stored under `manifest_digest`, replacing any earlier one.
    async fn put_attestation(
        &self,
        key: &str,
        manifest_digest: &str,
        envelope: &[u8],
    ) -> Result<()>;
    /// The attestation kept for `key`'s entry under `manifest_digest`, if any (at most
    /// [`attest::MAX_ENVELOPE_BYTES`]).
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
}

/// Opens the store named by `url`: a path or `file:///path` ([`FsStore`], nothing created until
/// [`Store::check_writable`] or a write) or `oci://HOST[:PORT]/REPOSITORY`.
pub fn open(url: &str, options: &RegistryOptions) -> Result<Arc<dyn Store>> {
    let url = url.trim();
    if url.is_empty() {
        return Err(Error::InvalidUrl {
            url: url.into(),
            message: "empty; pass a directory, file:///dir or oci://host/repository".into(),
        });
    }
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(Error::InvalidUrl {
                url: url.into(),
                message: "a file:// store needs an absolute path (file:///var/lib/kiln/store)"
                    .into(),
            });
        }
        return Ok(Arc::new(FsStore::new(Path::new(path), options)));
    }
    if url.starts_with("oci://") {
        return Ok(Arc::new(OciStore::new(url, options)?));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        return Err(Error::InvalidUrl {
            url: url.into(),
            message: format!(
                "unknown scheme {scheme:?}; pass a directory, file:///dir or oci://host/repository"
            ),
        });
    }
    Ok(Arc::new(FsStore::new(Path::new(url), options)))
}

/// Whether `url` names a filesystem store (its path), so callers can mount it.
pub fn fs_path(url: &str) -> Option<PathBuf> {
    let url = url.trim();
    match url.strip_prefix("file://") {
        Some(p) => Some(PathBuf::from(p)),
        None if !url.contains("://") && !url.is_empty() => Some(PathBuf::from(url)),
        None => None,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_the_store() {
        let o = RegistryOptions::default();
        assert_eq!(
            open("/var/lib/kiln/store", &o).unwrap().location(),
            "/var/lib/kiln/store"
        );
        assert_eq!(
            open("file:///srv/kiln", &o).unwrap().location(),
            "/srv/kiln"
        );
        assert!(open("file://relative", &o).is_err());
        let err = open("s3://bucket/x", &o).err().unwrap();
        assert!(err.to_string().contains("unknown scheme"), "{err}");
        assert_eq!(fs_path("file:///a"), Some(PathBuf::from("/a")));
        assert_eq!(fs_path("oci://r:5000/kiln"), None);
        assert_eq!(fs_path("rel/dir"), Some(PathBuf::from("rel/dir")));
    }
}
