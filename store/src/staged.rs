//! Verified writes: bytes go to a temp file beside the destination while they are hashed, and
//! the file is fsynced and renamed into place only when its size and sha256 are the expected
//! ones. The destination never holds a partial or unverified file.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// What the bytes must be.
#[derive(Clone, Debug)]
pub(crate) struct Expected {
    /// What is being written, for messages ("artifact <digest> from <store>").
    pub what: String,
    /// sha256, bare hex.
    pub digest: String,
    /// Exact size in bytes.
    pub size: u64,
}

/// A temp file beside `dest` that becomes `dest` only if verified.
pub(crate) struct Staged {
    file: tempfile::NamedTempFile,
    dest: PathBuf,
    hasher: Sha256,
    written: u64,
    expected: Expected,
}

impl Staged {
    /// Starts a verified write of `dest` (its directory is created).
    pub fn create(dest: &Path, expected: Expected) -> Result<Self> {
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| Error::store(dir, e))?;
        let file = tempfile::Builder::new()
            .prefix(".kiln-partial-")
            .tempfile_in(dir)
            .map_err(|e| Error::store(dir, e))?;
        Ok(Self {
            file,
            dest: dest.to_path_buf(),
            hasher: Sha256::new(),
            written: 0,
            expected,
        })
    }

    /// Hashes and writes `chunk`; refuses to write past the expected size.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        let total = self.written + chunk.len() as u64;
        if total > self.expected.size {
            return Err(self.mismatch(format!(
                "more than the expected {} bytes arrived; refusing the rest",
                self.expected.size
            )));
        }
        self.hasher.update(chunk);
        self.file
            .write_all(chunk)
            .map_err(|e| Error::store(self.file.path(), e))?;
        self.written = total;
        Ok(())
    }

    /// Checks size and digest, fsyncs, renames into place and fsyncs the directory. On any
    /// mismatch the temp file is removed and `dest` is untouched.
    pub fn finish(self) -> Result<()> {
        if self.written != self.expected.size {
            return Err(self.mismatch(format!(
                "got {} bytes, expected {}; the transfer was cut short or the stored blob is truncated",
                self.written, self.expected.size
            )));
        }
        let got = hex::encode(self.hasher.clone().finalize());
        if !got.eq_ignore_ascii_case(&self.expected.digest) {
            return Err(self.mismatch(format!(
                "sha256 mismatch: expected {}, got {got}; the stored bytes are corrupt",
                self.expected.digest
            )));
        }
        let Self { file, dest, .. } = self;
        file.as_file()
            .sync_all()
            .map_err(|e| Error::store(file.path(), e))?;
        file.persist(&dest)
            .map_err(|e| Error::store(&dest, e.error))?;
        if let Some(dir) = dest.parent() {
            sync_dir(dir);
        }
        Ok(())
    }

    fn mismatch(&self, message: String) -> Error {
        Error::HashMismatch {
            what: self.expected.what.clone(),
            message: format!("{message}; nothing was written to {}", self.dest.display()),
        }
    }
}

/// Streams `chunks` into `dest` through a verified write. Hashing and writing run on a blocking
/// thread while the download continues on this task, so the two overlap. A stream error means
/// the transfer broke off (`Unavailable`); a stream that ends is judged by size and sha256.
pub(crate) async fn stream_verified<S>(mut chunks: S, dest: &Path, expected: Expected) -> Result<()>
where
    S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin,
{
    use futures_util::StreamExt;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let what = expected.what.clone();
    let dest_owned = dest.to_path_buf();
    let writer = tokio::task::spawn_blocking(move || -> Result<Staged> {
        let mut staged = Staged::create(&dest_owned, expected)?;
        let started = std::time::Instant::now();
        let mut reported = 0;
        while let Some(chunk) = rx.blocking_recv() {
            staged.write(&chunk)?;
            // Progress in tenths, for logs of long pulls.
            let tenth = staged.written * 10 / staged.expected.size.max(1);
            if tenth > reported {
                reported = tenth;
                tracing::info!(
                    what = %staged.expected.what,
                    bytes = staged.written,
                    total = staged.expected.size,
                    percent = tenth * 10,
                    seconds = started.elapsed().as_secs_f64(),
                    "pulling"
                );
            }
        }
        Ok(staged)
    });
    let mut failed = None;
    while let Some(item) = chunks.next().await {
        match item {
            Ok(chunk) => {
                if tx.send(chunk).await.is_err() {
                    break; // the writer stopped: its error says why
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let staged = writer
        .await
        .map_err(|e| Error::store(dest, format!("writer failed: {e}")))??;
    if let Some(e) = failed {
        return Err(Error::unavailable(
            "registry",
            format!(
                "download of {what} broke off after {} of {} bytes: {e}; nothing was written to {}",
                staged.written,
                staged.expected.size,
                dest.display()
            ),
        ));
    }
    tokio::task::spawn_blocking(move || staged.finish())
        .await
        .map_err(|e| Error::store(dest, format!("writer failed: {e}")))?
}

/// Copies `src` into `dest` through a verified write.
pub(crate) fn copy_verified(src: &Path, dest: &Path, expected: Expected) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(src).map_err(|e| Error::store(src, e))?;
    let mut staged = Staged::create(dest, expected)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::store(src, e)),
        };
        staged.write(&buf[..n])?;
    }
    staged.finish()
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

/// sha256 of `bytes` as an OCI digest, `sha256:<hex>`.
pub(crate) fn oci_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// fsyncs a directory so a rename inside it survives a crash.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn expected(bytes: &[u8]) -> Expected {
        Expected {
            what: "test".into(),
            digest: hex::encode(Sha256::digest(bytes)),
            size: bytes.len() as u64,
        }
    }

    #[test]
    fn only_verified_bytes_reach_dest() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let mut s = Staged::create(&dest, expected(b"hello")).unwrap();
        s.write(b"hel").unwrap();
        s.write(b"lo").unwrap();
        s.finish().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");

        let other = dir.path().join("other");
        let mut s = Staged::create(&other, expected(b"hello")).unwrap();
        s.write(b"hellO").unwrap();
        let err = s.finish().unwrap_err();
        assert!(err.to_string().contains("sha256 mismatch"), "{err}");
        let mut s = Staged::create(&other, expected(b"hello")).unwrap();
        s.write(b"hell").unwrap();
        assert!(s.finish().unwrap_err().to_string().contains("got 4 bytes"));
        let mut s = Staged::create(&other, expected(b"hello")).unwrap();
        assert!(s.write(b"hello!").is_err(), "oversize refused");
        drop(s);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("out")],
            "no partial files left"
        );
    }
}
