//! kiln's artifact store: compiled artifacts and their build manifests by compile key. The trait
//! is what the operator (which only asks "is this key stored, under which manifest digest?"), the
//! compile worker (which puts) and the agent (which pulls by digest) use. [`open`] picks the
//! implementation from the store URL: a path or `file:///path` is a [`FsStore`] (local mode, a
//! hostPath shared by operator and compile Jobs, tests); `oci://HOST[:PORT]/REPOSITORY` is an OCI
//! registry. No ML runtime: the operator links this crate.

mod api;
pub mod attest;
mod error;
mod fs;
pub mod local_key;
mod oci;
pub mod staged;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use api::{
    ArtifactRef, DEFAULT_MAX_ARTIFACT_BYTES, Entry, MirrorSkip, RegistryOptions, Store,
    check_manifest_digests,
};
pub(crate) use api::{check_key, digest_hex};
pub use error::{Error, Result};
pub use fs::{FsStore, STALE_AFTER};
pub use oci::source::SourceRef;
pub use oci::{
    ARTIFACT_TYPE, BUILD_MANIFEST_MEDIA_TYPE, ENGINE_MEDIA_TYPE, OciStore, mirror, registry_of,
    source,
};

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
    /// Mirrors of the registry, tried in order before it for pulls, as containerd's hosts.toml
    /// names them: a JSON list of `{"host": "https://HOST[:PORT]", "capabilities": ["pull",
    /// "resolve"]}` (capabilities default to both). No credentials are sent to a mirror, and
    /// what it serves is verified like the registry's.
    #[arg(long, env = "KILN_REGISTRY_MIRRORS")]
    pub registry_mirrors: Option<String>,
}

impl RegistryArgs {
    /// The options these flags give (an empty user name or password means none).
    pub fn options(&self) -> RegistryOptions {
        RegistryOptions {
            insecure: self.registry_insecure,
            username: self.registry_username.clone().filter(|u| !u.is_empty()),
            password: self.registry_password.clone().filter(|p| !p.is_empty()),
            mirrors: self
                .registry_mirrors
                .clone()
                .filter(|m| !m.trim().is_empty()),
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
