//! kiln's artifact store: compiled artifacts and their build manifests by compile key. The trait
//! is what the operator (which only asks "is this key stored, and with what manifest?"), the
//! compile worker and the agent use; the filesystem store serves local mode, a hostPath shared by
//! operator and compile Jobs on one node, and tests. The OCI registry store comes in behind the
//! same trait, so the swap is a configuration change. Only std, serde and sha2: the operator links
//! this crate and must never link an ML runtime.

use std::path::{Path, PathBuf};

use kiln_crds::{BuildManifest, FailureReason};
use sha2::{Digest, Sha256};

/// Result alias for store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in a store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store could not be read or written.
    #[error("store {path} unavailable: {message}", path = path.display())]
    Unavailable { path: PathBuf, message: String },
    /// A stored artifact does not match its manifest.
    #[error("{what}: {message}")]
    HashMismatch { what: String, message: String },
}

impl Error {
    /// A store error at `path`.
    pub fn store(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        Self::Unavailable {
            path: path.into(),
            message: err.to_string(),
        }
    }

    /// The shared failure reason for status, Events and metric labels.
    pub fn reason(&self) -> FailureReason {
        match self {
            Self::Unavailable { .. } => FailureReason::StoreUnavailable,
            Self::HashMismatch { .. } => FailureReason::HashMismatch,
        }
    }
}

/// Where compiled artifacts live.
pub trait Store: Send + Sync {
    /// The manifest stored under `key`, if any. A manifest is only ever visible together with
    /// its complete artifact.
    fn manifest(&self, key: &str) -> Result<Option<BuildManifest>>;
    /// Stores the artifact at `artifact` with its manifest under `manifest.compile_key`,
    /// atomically: readers see all of it or nothing.
    fn put(&self, artifact: &Path, manifest: &BuildManifest) -> Result<()>;
    /// A local path to the artifact under `key`, verified against the manifest's digest and size
    /// before it is returned: a corrupt artifact is never handed to a loader.
    fn verified_artifact(&self, manifest: &BuildManifest) -> Result<PathBuf>;
    /// A scratch directory on the same filesystem, for building an artifact before `put`.
    fn scratch(&self) -> Result<tempfile::TempDir>;
}

/// A content-addressed directory: `<root>/artifacts/<key>/{artifact,manifest.json}`.
pub struct FsStore {
    /// Root directory.
    root: PathBuf,
}

const ARTIFACT: &str = "artifact";
const MANIFEST: &str = "manifest.json";

impl FsStore {
    /// Opens (creating) a store at `root` and proves it is writable.
    pub fn open(root: &Path) -> Result<Self> {
        for dir in [root.join("artifacts"), root.join("tmp"), root.join("blobs")] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::store(&dir, format!("{e}; pass a writable --store")))?;
        }
        // Fail now, not after a long compile.
        tempfile::tempfile_in(root.join("tmp")).map_err(|e| {
            Error::store(root, format!("not writable: {e}; pass a writable --store"))
        })?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    /// Opens a store for reading: creates nothing and needs no write access. The operator only
    /// asks which keys are stored; a store nobody has written to yet simply holds none, and its
    /// directories are left for the writers to create with their own ownership.
    pub fn open_read_only(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// Directory of verified source blobs.
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    fn dir(&self, key: &str) -> Result<PathBuf> {
        if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::store(
                &self.root,
                format!("{key:?} is not a compile key"),
            ));
        }
        Ok(self.root.join("artifacts").join(key))
    }
}

impl Store for FsStore {
    fn manifest(&self, key: &str) -> Result<Option<BuildManifest>> {
        let path = self.dir(key)?.join(MANIFEST);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                Error::store(
                    &path,
                    format!(
                        "unreadable manifest ({e}); delete {} to rebuild",
                        path.display()
                    ),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::store(&path, e)),
        }
    }

    fn put(&self, artifact: &Path, manifest: &BuildManifest) -> Result<()> {
        let dest = self.dir(&manifest.compile_key)?;
        let staging = self.scratch()?;
        let staged_artifact = staging.path().join(ARTIFACT);
        std::fs::rename(artifact, &staged_artifact)
            .or_else(|_| std::fs::copy(artifact, &staged_artifact).map(|_| ()))
            .map_err(|e| Error::store(&staged_artifact, e))?;
        let json = serde_json::to_vec_pretty(manifest).map_err(|e| Error::store(&dest, e))?;
        let manifest_path = staging.path().join(MANIFEST);
        write_synced(&manifest_path, &json)?;
        std::fs::File::open(&staged_artifact)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::store(&staged_artifact, e))?;
        sync_dir(staging.path());
        let staged = staging.keep();
        match std::fs::rename(&staged, &dest) {
            Ok(()) => {}
            // Someone stored the same key first: same inputs, same artifact; keep theirs.
            Err(_) if dest.join(MANIFEST).exists() => {
                let _ = std::fs::remove_dir_all(&staged);
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staged);
                return Err(Error::store(&dest, e));
            }
        }
        sync_dir(&self.root.join("artifacts"));
        Ok(())
    }

    fn verified_artifact(&self, manifest: &BuildManifest) -> Result<PathBuf> {
        let path = self.dir(&manifest.compile_key)?.join(ARTIFACT);
        let (digest, size) = sha256_file(&path).map_err(|e| Error::store(&path, e))?;
        if digest != manifest.artifact_digest || size != manifest.artifact_size {
            return Err(Error::HashMismatch {
                what: format!("stored artifact {}", path.display()),
                message: format!(
                    "sha256 {digest} ({size} bytes) but the build manifest says {} ({} bytes); the store is corrupt, delete {} to rebuild",
                    manifest.artifact_digest,
                    manifest.artifact_size,
                    path.parent().unwrap_or(&path).display()
                ),
            });
        }
        Ok(path)
    }

    fn scratch(&self) -> Result<tempfile::TempDir> {
        let tmp = self.root.join("tmp");
        tempfile::TempDir::new_in(&tmp).map_err(|e| Error::store(&tmp, e))
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| Error::store(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::store(path, e))
}

/// The digest and length of a file, streamed.
pub fn sha256_file(path: &Path) -> std::io::Result<(String, u64)> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

/// fsyncs a directory so a rename inside it survives a crash.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
