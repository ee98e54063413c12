//! The key a local (filesystem) store is signed with when no key was given: created on first
//! use as `signing.key` in the store's root, mode 0600, atomically (written to a temporary name
//! in the same directory, fsynced, linked into place only if no key is there yet), and read
//! back only when it is a regular file owned by this user and readable by no one else. So a
//! consistent rewrite of an entry (artifact and manifest together) by anyone without the key is
//! refused by its attestation, and so is a key planted by another user. Touches only that file.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::attest::{Signer, Trust};
use crate::{Error, Result};

/// File name of the key in the store's root.
pub const LOCAL_KEY: &str = "signing.key";

/// Where the key of the store at `root` is kept.
pub fn path(root: &Path) -> PathBuf {
    root.join(LOCAL_KEY)
}

/// Why the key file at `meta` may not be used, if it may not (pure: metadata and uid in).
pub fn refusal(meta: &std::fs::Metadata, uid: u32) -> Option<String> {
    if meta.file_type().is_symlink() {
        return Some("is a symbolic link".into());
    }
    if !meta.is_file() {
        return Some("is not a regular file".into());
    }
    if meta.uid() != uid {
        return Some(format!(
            "belongs to uid {}, not this user ({uid})",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Some(format!(
            "has mode {mode:04o}; it must be readable by its owner only (0600)"
        ));
    }
    None
}

/// The trust of the local store at `root`: its key, created on first use.
pub fn trust(root: &Path) -> Result<Trust> {
    let signer = load_or_create(root)?;
    Ok(Trust {
        verifier: Some(signer.verifier()),
        signer: Some(std::sync::Arc::new(signer)),
        ..Trust::default()
    })
}

/// Reads the store's key, creating it first when there is none.
pub fn load_or_create(root: &Path) -> Result<Signer> {
    let key = path(root);
    match std::fs::symlink_metadata(&key) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(root, &key)?,
        Err(e) => return Err(Error::store_hint(&key, e, "pass a writable --store")),
    }
    load(&key)
}

fn load(key: &Path) -> Result<Signer> {
    let meta = std::fs::symlink_metadata(key).map_err(|e| Error::store(key, e))?;
    let uid = rustix::process::geteuid().as_raw();
    if let Some(why) = refusal(&meta, uid) {
        return Err(Error::SignatureInvalid {
            what: format!("local store key {}", key.display()),
            message: format!(
                "{why}; refusing to sign or trust with it (delete it to start over: every entry is then rebuilt)"
            ),
        });
    }
    Signer::from_pem_file(key)
}

/// Writes a fresh key under a temporary name (0600), fsyncs it and links it to `key` unless a
/// key appeared there meanwhile (another process created it first: that one is used).
fn create(root: &Path, key: &Path) -> Result<()> {
    let unwritable = |e: std::io::Error| Error::store_hint(root, e, "pass a writable --store");
    std::fs::create_dir_all(root).map_err(unwritable)?;
    let (private, _) = Signer::generate()?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".signing.key-")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(root)
        .map_err(unwritable)?;
    tmp.write_all(private.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| Error::store(tmp.path(), e))?;
    match tmp.persist_noclobber(key) {
        Ok(_) => {
            crate::staged::sync_dir(root);
            tracing::info!(key = %key.display(), "created the local store's signing key");
            Ok(())
        }
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::store(key, e.error)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn created_once_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let meta = std::fs::metadata(path(dir.path())).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "the same key");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from(LOCAL_KEY)],
            "no temporary left"
        );
    }

    #[test]
    fn a_key_others_can_read_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create(dir.path()).unwrap();
        let key = path(dir.path());
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("mode 0644"), "{err}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::rename(&key, dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), &key).unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let meta = std::fs::symlink_metadata(dir.path().join("real")).unwrap();
        let uid = rustix::process::geteuid().as_raw();
        assert!(refusal(&meta, uid).is_none());
        assert!(refusal(&meta, uid + 1).unwrap().contains("belongs to uid"));
    }
}
