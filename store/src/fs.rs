//! The filesystem store: a content-addressed directory `<root>/artifacts/<key>/{artifact,
//! manifest.json}`, written by rename so readers see a whole entry or none. The manifest digest
//! is the sha256 of `manifest.json` as stored; an entry's attestation is
//! `attestation-<manifest hex>.json` beside it. A publish builds the entry in `tmp/`, renames it
//! to `staged/<manifest hex>/`, writes the attestation into it (temp file, fsync, rename) and only
//! then renames the whole directory to `artifacts/<key>/` (the tag), so a lookup never finds an
//! entry without the attestation its publisher wrote. Touches only its root directory.

use std::path::{Path, PathBuf};

use kiln_crds::BuildManifest;

use crate::staged::{Expected, copy_verified, install_dir, oci_digest, write_synced};
use crate::{ArtifactRef, Entry, Error, RegistryOptions, Result, Store, check_key};

const ARTIFACT: &str = "artifact";
const MANIFEST: &str = "manifest.json";

/// File name of the attestation of the entry stored under `manifest_digest` (`sha256:<hex>`).
fn attestation_name(manifest_digest: &str) -> Result<String> {
    let hex = crate::digest_hex(manifest_digest)?;
    Ok(format!("attestation-{hex}.json"))
}

/// A content-addressed directory on a local (or hostPath) filesystem.
#[derive(Clone, Debug)]
pub struct FsStore {
    /// Root directory.
    root: PathBuf,
    /// Largest artifact a pull accepts.
    max_artifact_bytes: u64,
}

/// Leftovers older than this are swept when a store is opened.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes the entries of `dir` whose name passes `sweep` and that were last modified more than
/// [`STALE_AFTER`] ago; failures are logged, never fatal.
fn sweep_stale(dir: &Path, sweep: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if !stale || !sweep(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => tracing::info!(path = %path.display(), "removed a stale leftover"),
            Err(e) => tracing::warn!(path = %path.display(), %e, "cannot remove a stale leftover"),
        }
    }
}

impl FsStore {
    /// A store at `root`; creates nothing and needs no write access until something is written
    /// (the operator only reads; a store nobody has written to yet simply holds nothing).
    pub fn new(root: &Path, options: &RegistryOptions) -> Self {
        Self {
            root: root.to_path_buf(),
            max_artifact_bytes: options.max_artifact_bytes,
        }
    }

    /// Opens (creating) a store at `root` and proves it is writable.
    pub fn open(root: &Path) -> Result<Self> {
        let store = Self::new(root, &RegistryOptions::default());
        store.prepare()?;
        Ok(store)
    }

    /// Directory of verified source blobs.
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    /// The directory of `key`'s entry.
    pub fn entry_dir(&self, key: &str) -> Result<PathBuf> {
        check_key(&self.location(), key)?;
        Ok(self.root.join("artifacts").join(key))
    }

    fn prepare(&self) -> Result<()> {
        let root = &self.root;
        for dir in [
            root.join("artifacts"),
            root.join("staged"),
            root.join("tmp"),
            root.join("blobs"),
        ] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::store_hint(&dir, e, "pass a writable --store"))?;
        }
        // Fail now, not after a long compile.
        tempfile::tempfile_in(root.join("tmp")).map_err(|e| {
            let message = format!("not writable: {e}; pass a writable --store");
            Error::store_because(root, message, e)
        })?;
        // What a killed process left: scratch directories, staged models, partial blobs. Other
        // processes may share this store (compile Jobs on one hostPath), so only what nobody
        // has touched for a day goes.
        sweep_stale(&root.join("tmp"), |_| true);
        // Entries staged by a publisher that died before tagging them.
        sweep_stale(&root.join("staged"), |_| true);
        sweep_stale(&root.join("blobs"), |name| {
            name.starts_with(".model-") || name.starts_with(crate::staged::PARTIAL_PREFIX)
        });
        Ok(())
    }

    fn lookup_sync(&self, key: &str) -> Result<Option<Entry>> {
        let path = self.entry_dir(key)?.join(MANIFEST);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let manifest: BuildManifest = serde_json::from_slice(&bytes).map_err(|e| {
                    let message = format!(
                        "unreadable manifest ({e}); delete {} to rebuild",
                        path.parent().unwrap_or(&path).display()
                    );
                    Error::store_because(&path, message, e)
                })?;
                crate::check_manifest_digests(&format!("manifest {}", path.display()), &manifest)?;
                // A manifest moved or rewritten under another key would send every later step
                // to that key's directory.
                if manifest.compile_key != key {
                    return Err(Error::HashMismatch {
                        what: format!("stored manifest {}", path.display()),
                        message: format!(
                            "it describes compile key {}, not {key}; the store was changed or is corrupt, delete {} to rebuild",
                            manifest.compile_key,
                            path.parent().unwrap_or(&path).display()
                        ),
                    });
                }
                Ok(Some(Entry {
                    manifest,
                    manifest_digest: oci_digest(&bytes),
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::store(&path, e)),
        }
    }

    /// Where the entry stored under `manifest_digest` waits for its tag: complete, attested
    /// there, invisible to lookups.
    fn staged_dir(&self, manifest_digest: &str) -> Result<PathBuf> {
        let hex = crate::digest_hex(manifest_digest)?;
        Ok(self.root.join("staged").join(hex))
    }

    /// Builds the entry in a scratch directory (artifact and manifest fsynced) and renames it
    /// whole to `staged/<manifest hex>`: content-addressed, so a directory already there holds
    /// the same entry.
    fn stage_sync(&self, artifact: &Path, manifest: &BuildManifest) -> Result<Entry> {
        self.entry_dir(&manifest.compile_key)?;
        self.prepare()?;
        let scratch = self.scratch_sync()?;
        let staged_artifact = scratch.path().join(ARTIFACT);
        std::fs::rename(artifact, &staged_artifact)
            .or_else(|_| std::fs::copy(artifact, &staged_artifact).map(|_| ()))
            .map_err(|e| Error::store(&staged_artifact, e))?;
        std::fs::File::open(&staged_artifact)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::store(&staged_artifact, e))?;
        let json = serde_json::to_vec_pretty(manifest).map_err(|e| Error::store(&self.root, e))?;
        let manifest_path = scratch.path().join(MANIFEST);
        write_synced(&manifest_path, &json).map_err(|e| Error::store(&manifest_path, e))?;
        let entry = Entry {
            manifest: manifest.clone(),
            manifest_digest: oci_digest(&json),
        };
        let dest = self.staged_dir(&entry.manifest_digest)?;
        if !dest.join(MANIFEST).exists() {
            // A failed rename with the directory there after all: a concurrent publisher staged
            // the same bytes first.
            if let Err(e) = install_dir(scratch.keep(), &dest)
                && !dest.join(MANIFEST).exists()
            {
                return Err(Error::store(&dest, e));
            }
        }
        Ok(entry)
    }

    /// Renames the staged entry onto `artifacts/<key>`: one rename of a whole directory, so a
    /// reader sees the old entry, nothing (while a refused one is moved aside) or the new one
    /// with its attestation already inside.
    fn tag_sync(&self, entry: &Entry, replace: bool) -> Result<Entry> {
        let key = &entry.manifest.compile_key;
        let dest = self.entry_dir(key)?;
        let current = self.lookup_sync(key);
        match &current {
            Ok(Some(found)) if found.manifest_digest == entry.manifest_digest => {
                return Ok(found.clone());
            }
            Ok(Some(found)) if !replace => return Ok(found.clone()),
            _ => {}
        }
        let staged = self.staged_dir(&entry.manifest_digest)?;
        if !staged.join(MANIFEST).exists() {
            // A concurrent publisher of the same bytes may have tagged them just now.
            if let Some(found) = self.lookup_sync(key)?
                && found.manifest_digest == entry.manifest_digest
            {
                return Ok(found);
            }
            return Err(Error::unavailable(
                staged.display(),
                "nothing staged under this digest; stage the entry before tagging it",
            ));
        }
        // The entry being replaced moves aside first (a directory renames only onto nothing),
        // and goes once the new one is in place. So does a directory without a manifest, which
        // no store write leaves and no lookup finds: left there it would refuse every new entry.
        let old = if dest.exists() && (replace || !dest.join(MANIFEST).exists()) {
            let old = self.scratch_sync()?.keep();
            std::fs::rename(&dest, old.join("old")).map_err(|e| Error::store(&dest, e))?;
            Some(old)
        } else {
            None
        };
        crate::staged::sync_dir(&staged);
        let installed = std::fs::rename(&staged, &dest);
        if let Some(parent) = dest.parent() {
            crate::staged::sync_dir(parent);
        }
        if let Some(old) = old {
            let _ = std::fs::remove_dir_all(old);
        }
        match installed {
            Ok(()) => {}
            // Someone tagged the key first (their entry is attested too); keep theirs.
            Err(_) if dest.join(MANIFEST).exists() => {}
            Err(e) => return Err(Error::store(&dest, e)),
        }
        self.lookup_sync(key)?.ok_or_else(|| {
            Error::unavailable(dest.display(), "entry vanished right after it was tagged")
        })
    }

    fn pull_sync(&self, r: &ArtifactRef, dest: &Path) -> Result<BuildManifest> {
        let dir = self.entry_dir(&r.compile_key)?;
        let path = dir.join(MANIFEST);
        let bytes = std::fs::read(&path).map_err(|e| Error::store(&path, e))?;
        let got = oci_digest(&bytes);
        if got != r.manifest_digest {
            return Err(Error::HashMismatch {
                what: format!("stored manifest {}", path.display()),
                message: format!(
                    "digest {got}, expected {}; the store was changed or is corrupt, delete {} to rebuild",
                    r.manifest_digest,
                    dir.display()
                ),
            });
        }
        let manifest: BuildManifest =
            serde_json::from_slice(&bytes).map_err(|e| Error::store(&path, e))?;
        crate::check_manifest_digests(&format!("manifest {}", path.display()), &manifest)?;
        check_manifest(&self.location(), r, &manifest, self.max_artifact_bytes)?;
        let src = dir.join(ARTIFACT);
        // Only the file the entry was stored with: not a link to something else, and a missing
        // one is a broken entry, not an unavailable store.
        let not_a_file = match std::fs::symlink_metadata(&src) {
            Ok(m) if m.is_file() => None,
            Ok(m) if m.is_symlink() => Some("is a symbolic link"),
            Ok(m) if m.is_dir() => Some("is a directory"),
            Ok(_) => Some("is not a file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("is missing"),
            Err(e) => return Err(Error::store(&src, e)),
        };
        if let Some(problem) = not_a_file {
            return Err(Error::HashMismatch {
                what: format!("stored artifact {}", src.display()),
                message: format!(
                    "it {problem}; the store was changed or is corrupt, delete {} to rebuild",
                    dir.display()
                ),
            });
        }
        copy_verified(
            &src,
            dest,
            Expected {
                what: format!("stored artifact {}", src.display()),
                digest: manifest.artifact_digest.clone(),
                size: Some(manifest.artifact_size),
            },
        )
        .map_err(|e| match e {
            Error::Refused {
                what,
                mismatch,
                dest,
            } => Error::HashMismatch {
                what,
                message: format!(
                    "{}; the store is corrupt, delete {} to rebuild",
                    mismatch.refusal(&dest),
                    dir.display()
                ),
            },
            e => e,
        })?;
        Ok(manifest)
    }

    fn put_attestation_sync(
        &self,
        key: &str,
        manifest_digest: &str,
        envelope: &[u8],
    ) -> Result<()> {
        let name = attestation_name(manifest_digest)?;
        let entry_dir = self.entry_dir(key)?;
        let staging = self.scratch_sync()?;
        let staged = staging.path().join("attestation");
        write_synced(&staged, envelope).map_err(|e| Error::store(&staged, e))?;
        // Into the staged entry while it waits for its tag (so the tag brings it along); into
        // the tagged entry once it has one (a publisher that re-signs, or a concurrent one that
        // tagged the same bytes first).
        let waiting = self.staged_dir(manifest_digest)?;
        for dir in [waiting, entry_dir] {
            let dest = dir.join(&name);
            match std::fs::rename(&staged, &dest) {
                Ok(()) => {
                    crate::staged::sync_dir(&dir);
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::store(&dest, e)),
            }
        }
        Err(Error::unavailable(
            self.root.join("staged").display(),
            format!("no entry stored under {manifest_digest} for compile key {key} to attest"),
        ))
    }

    fn attestation_sync(&self, key: &str, manifest_digest: &str) -> Result<Option<Vec<u8>>> {
        use std::io::Read;
        let path = self
            .entry_dir(key)?
            .join(attestation_name(manifest_digest)?);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::store(&path, e)),
        };
        let mut bytes = Vec::new();
        file.take(crate::attest::MAX_ENVELOPE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::store(&path, e))?;
        if bytes.len() as u64 > crate::attest::MAX_ENVELOPE_BYTES {
            return Err(Error::SignatureInvalid {
                what: format!("attestation {}", path.display()),
                message: format!(
                    "larger than {} bytes; not read",
                    crate::attest::MAX_ENVELOPE_BYTES
                ),
            });
        }
        Ok(Some(bytes))
    }

    fn scratch_sync(&self) -> Result<tempfile::TempDir> {
        let tmp = self.root.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(|e| Error::store(&tmp, e))?;
        tempfile::TempDir::new_in(&tmp).map_err(|e| Error::store(&tmp, e))
    }
}

/// A verified manifest must be the one the reference names, and small enough to pull.
pub(crate) fn check_manifest(
    location: &str,
    r: &ArtifactRef,
    m: &BuildManifest,
    max_bytes: u64,
) -> Result<()> {
    if m.compile_key != r.compile_key || !m.artifact_digest.eq_ignore_ascii_case(&r.artifact_digest)
    {
        return Err(Error::HashMismatch {
            what: format!("manifest {} in {location}", r.manifest_digest),
            message: format!(
                "it describes key {} artifact {}, but key {} artifact {} was asked for",
                m.compile_key, m.artifact_digest, r.compile_key, r.artifact_digest
            ),
        });
    }
    if let Some(size) = r.size
        && size != m.artifact_size
    {
        return Err(Error::HashMismatch {
            what: format!("manifest {} in {location}", r.manifest_digest),
            message: format!("artifact size {} but {size} was asked for", m.artifact_size),
        });
    }
    if m.artifact_size > max_bytes {
        return Err(Error::HashMismatch {
            what: format!("artifact {} in {location}", m.artifact_digest),
            message: format!(
                "{} bytes is over the {max_bytes}-byte limit; refusing to pull it",
                m.artifact_size
            ),
        });
    }
    Ok(())
}

#[async_trait::async_trait]
impl Store for FsStore {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    async fn check_writable(&self) -> Result<()> {
        let s = self.clone();
        blocking(move || s.prepare()).await
    }

    async fn lookup(&self, key: &str) -> Result<Option<Entry>> {
        let (s, key) = (self.clone(), key.to_string());
        blocking(move || s.lookup_sync(&key)).await
    }

    async fn stage(&self, artifact: &Path, manifest: &BuildManifest) -> Result<Entry> {
        let (s, artifact, manifest) = (self.clone(), artifact.to_path_buf(), manifest.clone());
        blocking(move || s.stage_sync(&artifact, &manifest)).await
    }

    async fn tag(&self, entry: &Entry, replace: bool) -> Result<Entry> {
        let (s, entry) = (self.clone(), entry.clone());
        blocking(move || s.tag_sync(&entry, replace)).await
    }

    async fn put_attestation(
        &self,
        key: &str,
        manifest_digest: &str,
        envelope: &[u8],
    ) -> Result<()> {
        let (s, key, digest, envelope) = (
            self.clone(),
            key.to_string(),
            manifest_digest.to_string(),
            envelope.to_vec(),
        );
        blocking(move || s.put_attestation_sync(&key, &digest, &envelope)).await
    }

    async fn attestation(&self, key: &str, manifest_digest: &str) -> Result<Option<Vec<u8>>> {
        let (s, key, digest) = (self.clone(), key.to_string(), manifest_digest.to_string());
        blocking(move || s.attestation_sync(&key, &digest)).await
    }

    async fn pull(&self, r: &ArtifactRef, dest: &Path) -> Result<BuildManifest> {
        let (s, r, dest) = (self.clone(), r.clone(), dest.to_path_buf());
        blocking(move || s.pull_sync(&r, &dest)).await
    }

    fn scratch(&self) -> Result<tempfile::TempDir> {
        self.scratch_sync()
    }

    fn blob_cache(&self) -> Option<PathBuf> {
        Some(self.blobs())
    }
}

/// Runs filesystem work off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        Error::unavailable_because("filesystem store", format!("worker failed: {e}"), e)
    })?
}
