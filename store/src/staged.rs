//! Verified writes: bytes go to a temp file beside the destination while they are hashed, and
//! the file is fsynced and renamed into place only when its size and sha256 are the expected
//! ones ([`VerifiedWrite`]). The destination never holds a partial or unverified file. The
//! store's pulls and the agent's fetches of sources and fixtures both write this way. This
//! module is also the one copy, for the store and the agent, of the sha256 of a file or bytes,
//! the fsynced write ([`write_synced`]), the staged-directory rename ([`install_dir`]) and the
//! directory fsync ([`sync_dir`]). Touches only the destination's directory.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use crate::error::Mismatch;
use crate::{Error, Result};

/// Buffer size of streaming reads and writes: large enough that the hash, not syscalls,
/// dominates.
pub const CHUNK: usize = 1 << 20;

/// What the bytes must be.
#[derive(Clone, Debug)]
pub struct Expected {
    /// What is being written, for messages (`artifact <digest> from <store>`).
    pub what: String,
    /// sha256, bare hex.
    pub digest: String,
    /// Exact size in bytes, when known; without it only the digest decides.
    pub size: Option<u64>,
}

pub use kiln_crds::compile_key::is_sha256_hex;

/// Prefix of the temp files a verified write makes beside its destination.
pub const PARTIAL_PREFIX: &str = ".kiln-partial-";

/// Removes the partial files in `dir` that no write has touched for `idle`, and returns how
/// many. A process killed mid-write leaves one that nothing else would remove; a live writer
/// touches its file more often than `idle`.
pub fn sweep_partials(dir: &Path, idle: std::time::Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let stale = |e: &std::fs::DirEntry| {
        e.file_name().to_string_lossy().starts_with(PARTIAL_PREFIX)
            && e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= idle)
    };
    entries
        .filter_map(std::result::Result::ok)
        .filter(stale)
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// The file a verified write fills before the rename.
enum Partial {
    /// A temp file, removed if the write is dropped.
    Temp(tempfile::NamedTempFile),
    /// A file named after the object, which outlives the write (and the process) so that a
    /// later write of the same object picks it up ([`VerifiedWrite::resumable`]).
    Kept(std::fs::File, PathBuf),
}

impl Partial {
    fn path(&self) -> &Path {
        match self {
            Self::Temp(f) => f.path(),
            Self::Kept(_, p) => p,
        }
    }

    fn file(&self) -> &std::fs::File {
        match self {
            Self::Temp(f) => f.as_file(),
            Self::Kept(f, _) => f,
        }
    }
}

impl Write for Partial {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Temp(f) => f.write(buf),
            Self::Kept(f, _) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Temp(f) => f.flush(),
            Self::Kept(f, _) => f.flush(),
        }
    }
}

/// A temp file beside `dest` that becomes `dest` only if verified.
pub struct VerifiedWrite {
    out: std::io::BufWriter<Partial>,
    dest: PathBuf,
    hasher: Sha256,
    written: u64,
    /// Bytes taken over from an earlier write of the same object.
    resumed: u64,
    expected: Expected,
}

impl VerifiedWrite {
    /// Starts a verified write of `dest` (its directory is created).
    pub fn create(dest: &Path, expected: Expected) -> Result<Self> {
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| Error::store(dir, e))?;
        room_for(dir, &expected, 0)?;
        let file = tempfile::Builder::new()
            .prefix(PARTIAL_PREFIX)
            .tempfile_in(dir)
            .map_err(|e| Error::store(dir, e))?;
        Ok(Self {
            out: std::io::BufWriter::with_capacity(CHUNK, Partial::Temp(file)),
            dest: dest.to_path_buf(),
            hasher: Sha256::new(),
            written: 0,
            resumed: 0,
            expected,
        })
    }

    /// Starts a verified write of `dest` that continues where an earlier one of the same object
    /// stopped (a broken download, a killed process): its partial file, named after the digest
    /// beside `dest`, is kept when the write is dropped, and taken up again here. The bytes
    /// already there are hashed now, so the verdict still covers the whole object; a partial
    /// file longer than the object, or one another write holds (a lock), is not used. Without a
    /// well-formed digest this is [`VerifiedWrite::create`].
    pub fn resumable(dest: &Path, expected: Expected) -> Result<Self> {
        use std::io::{Read, Seek};
        let well_formed = is_sha256_hex(&expected.digest);
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !well_formed {
            return Self::create(dest, expected);
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::store(dir, e))?;
        let path = dir.join(format!(
            "{PARTIAL_PREFIX}{}",
            expected.digest.to_ascii_lowercase()
        ));
        let mut file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::store(&path, e))?;
        if file.try_lock().is_err() {
            // Another write of this object is under way: this one goes its own way.
            return Self::create(dest, expected);
        }
        let mut hasher = Sha256::new();
        let mut have = file.metadata().map_err(|e| Error::store(&path, e))?.len();
        if expected.size.is_some_and(|size| have > size) {
            have = 0;
        }
        if let Err(e) = room_for(dir, &expected, have) {
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let mut buf = vec![0u8; CHUNK];
        let mut read = 0u64;
        while read < have {
            let want = usize::try_from((have - read).min(CHUNK as u64)).unwrap_or(CHUNK);
            match file.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    read += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if read < have {
            // Unreadable: start over.
            hasher = Sha256::new();
            read = 0;
        }
        file.set_len(read).map_err(|e| Error::store(&path, e))?;
        file.seek(std::io::SeekFrom::Start(read))
            .map_err(|e| Error::store(&path, e))?;
        Ok(Self {
            out: std::io::BufWriter::with_capacity(CHUNK, Partial::Kept(file, path)),
            dest: dest.to_path_buf(),
            hasher,
            written: read,
            resumed: read,
            expected,
        })
    }

    /// Bytes taken over from an earlier write of the same object ([`VerifiedWrite::resumable`]).
    pub fn resumed(&self) -> u64 {
        self.resumed
    }

    /// Hashes and writes `chunk`; refuses to write past the expected size.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        let total = self.written + chunk.len() as u64;
        if let Some(expected) = self.expected.size
            && total > expected
        {
            return Err(self.refuse(Mismatch::TooLarge { expected }));
        }
        self.hasher.update(chunk);
        if let Err(e) = self.out.write_all(chunk) {
            return Err(self.failed(e));
        }
        self.written = total;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// What the bytes must be.
    pub fn expected(&self) -> &Expected {
        &self.expected
    }

    /// Checks size and digest, fsyncs, renames into place and fsyncs the directory. On any
    /// mismatch the temp file is removed and `dest` is untouched.
    pub fn finish(mut self) -> Result<()> {
        if let Some(expected) = self.expected.size
            && self.written != expected
        {
            return Err(self.refuse(Mismatch::Short {
                got: self.written,
                expected,
            }));
        }
        let got = hex::encode(self.hasher.clone().finalize());
        if !got.eq_ignore_ascii_case(&self.expected.digest) {
            let expected = self.expected.digest.clone();
            return Err(self.refuse(Mismatch::Digest { got, expected }));
        }
        if let Err(e) = self.out.flush() {
            return Err(self.failed(e));
        }
        let Self { out, dest, .. } = self;
        let partial = out
            .into_inner()
            .map_err(|e| Error::store(&dest, e.into_error()))?;
        partial
            .file()
            .sync_all()
            .map_err(|e| Error::store(partial.path(), e))?;
        match partial {
            Partial::Temp(file) => {
                file.persist(&dest)
                    .map_err(|e| Error::store(&dest, e.error))?;
            }
            Partial::Kept(_, path) => {
                std::fs::rename(&path, &dest).map_err(|e| Error::store(&dest, e))?;
            }
        }
        if let Some(dir) = dest.parent() {
            sync_dir(dir);
        }
        Ok(())
    }

    /// A write that failed: a full filesystem is [`Error::InsufficientStorage`] (its partial
    /// file removed, so nothing half-written holds the space), anything else the store's error.
    fn failed(&self, e: std::io::Error) -> Error {
        let path = self.out.get_ref().path().to_path_buf();
        if e.kind() != std::io::ErrorKind::StorageFull {
            return Error::store(&path, e);
        }
        if let Partial::Kept(_, kept) = self.out.get_ref() {
            let _ = std::fs::remove_file(kept);
        }
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Error::InsufficientStorage {
            what: self.expected.what.clone(),
            needed: self
                .expected
                .size
                .unwrap_or(self.written)
                .saturating_sub(self.resumed),
            free: free_bytes(&dir).unwrap_or(0),
            dir,
        }
    }

    fn refuse(&self, mismatch: Mismatch) -> Error {
        // Refused bytes are not worth resuming (a temp file goes with the write).
        if let Partial::Kept(_, path) = self.out.get_ref() {
            let _ = std::fs::remove_file(path);
        }
        Error::Refused {
            what: self.expected.what.clone(),
            mismatch,
            dest: self.dest.clone(),
        }
    }
}

/// Bytes an unprivileged writer may still put on the filesystem of `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Refuses, before a byte is written, an object of known size whose remaining bytes (beyond the
/// `have` already on disk) do not fit the free space of `dir`.
fn room_for(dir: &Path, expected: &Expected, have: u64) -> Result<()> {
    let Some(size) = expected.size else {
        return Ok(());
    };
    let needed = size.saturating_sub(have);
    let free = free_bytes(dir).map_err(|e| Error::store(dir, e))?;
    if needed > free {
        return Err(Error::InsufficientStorage {
            what: expected.what.clone(),
            dir: dir.to_path_buf(),
            needed,
            free,
        });
    }
    Ok(())
}

/// A byte stream of an artifact, and the offset of the object its first byte is at.
pub(crate) type Opened<S> = (S, u64);

/// How many times a broken-off download is resumed before the pull fails.
pub const MAX_RESUMES: u32 = 3;

/// Streams the object `open(offset)` serves into `dest` through a verified write. Hashing and
/// writing run on a blocking thread while the download continues on this task, so the two
/// overlap, and every byte is hashed once. A stream that breaks off is reopened at the first
/// byte not yet received (an HTTP range request), up to [`MAX_RESUMES`] times; a server that
/// answers from an earlier offset has the bytes already taken skipped. A stream that ends is
/// judged by size and sha256 of the whole object.
///
/// The bytes received are kept beside `dest` when the pull fails or the process dies
/// ([`VerifiedWrite::resumable`]), and the next pull of the same object into the same place
/// starts after them. Those bytes are hashed again, not trusted: if the whole does not verify,
/// the kept part is thrown away and the object is pulled once more from its first byte.
pub(crate) async fn stream_verified<S, F, Fut>(
    mut open: F,
    dest: &Path,
    expected: Expected,
) -> Result<()>
where
    S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin,
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<Opened<S>>>,
{
    let (result, resumed) = stream_once(&mut open, dest, expected.clone()).await;
    match result {
        Err(Error::Refused { mismatch, .. }) if resumed > 0 => {
            tracing::warn!(what = %expected.what, kept = resumed, %mismatch, "a pull resumed from kept bytes did not verify; pulling the whole object again");
            stream_once(&mut open, dest, expected).await.0
        }
        result => result,
    }
}

/// One verified pull; also returns how many bytes it took over from an earlier one. Steps: open
/// the verified write (resuming kept bytes), start its writer thread, download into it, then
/// judge how the download ended and the whole object.
async fn stream_once<S, F, Fut>(open: &mut F, dest: &Path, expected: Expected) -> (Result<()>, u64)
where
    S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin,
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<Opened<S>>>,
{
    let what = expected.what.clone();
    let size = expected.size;
    let staged = match open_write(dest, expected).await {
        Ok(staged) => staged,
        Err(e) => return (Err(e), 0),
    };
    let resumed = staged.resumed();
    if resumed > 0 {
        tracing::info!(what = %what, bytes = resumed, "resuming a pull from the bytes an earlier one kept");
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let writer = spawn_writer(staged, rx);
    let (ended, resumes) = download(open, &tx, resumed, size, &what).await;
    drop(tx);
    let written = writer.await;
    let broke_off = match ended {
        Ended::NotOpened(e) => return (Err(e), resumed),
        Ended::Complete => None,
        Ended::BrokeOff(e) => Some(e),
    };
    let staged = match written {
        Ok(Ok(staged)) => staged,
        Ok(Err(e)) => return (Err(e), resumed),
        Err(e) => {
            return (
                Err(Error::store_because(dest, format!("writer failed: {e}"), e)),
                resumed,
            );
        }
    };
    if let Some(e) = broke_off {
        let message = format!(
            "download of {what} broke off after {} of {} bytes: {e}; nothing was written to {} (the bytes received are kept for the next pull to resume from)",
            staged.written,
            size.map_or_else(|| "?".to_string(), |s| s.to_string()),
            dest.display()
        );
        return (Err(Error::unavailable("registry", message)), resumed);
    }
    if resumes > 0 {
        tracing::info!(what = %what, resumes, "download resumed by range; verifying the whole object");
    }
    let finished = tokio::task::spawn_blocking(move || staged.finish())
        .await
        .map_err(|e| Error::store_because(dest, format!("writer failed: {e}"), e))
        .and_then(|r| r);
    (finished, resumed)
}

/// [`VerifiedWrite::resumable`] of `dest`, on a blocking thread.
async fn open_write(dest: &Path, expected: Expected) -> Result<VerifiedWrite> {
    let owned = dest.to_path_buf();
    match tokio::task::spawn_blocking(move || VerifiedWrite::resumable(&owned, expected)).await {
        Ok(result) => result,
        Err(e) => Err(Error::store_because(dest, format!("writer failed: {e}"), e)),
    }
}

/// The writer thread: writes and hashes every chunk that arrives, logging progress in tenths
/// (for logs of long pulls), until the sender is dropped; returns the write to be judged.
fn spawn_writer(
    mut staged: VerifiedWrite,
    mut rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
) -> tokio::task::JoinHandle<Result<VerifiedWrite>> {
    tokio::task::spawn_blocking(move || -> Result<VerifiedWrite> {
        let started = std::time::Instant::now();
        let mut reported = 0;
        while let Some(chunk) = rx.blocking_recv() {
            staged.write(&chunk)?;
            let Some(total) = staged.expected.size else {
                continue;
            };
            let tenth = staged.written * 10 / total.max(1);
            if tenth > reported {
                reported = tenth;
                tracing::info!(
                    what = %staged.expected.what,
                    bytes = staged.written,
                    total,
                    percent = tenth * 10,
                    seconds = started.elapsed().as_secs_f64(),
                    "pulling"
                );
            }
        }
        Ok(staged)
    })
}

/// How a download ended.
enum Ended {
    /// Every byte was sent (or the writer stopped: its error says why).
    Complete,
    /// The first open failed: nothing was sent.
    NotOpened(Error),
    /// The stream broke off, or could not be reopened, after some bytes; why.
    BrokeOff(String),
}

/// Sends the object from byte `sent` on to the writer, reopening a stream that breaks off at the
/// first byte not yet sent, up to [`MAX_RESUMES`] times. Returns how it ended and how many
/// times it resumed.
async fn download<S, F, Fut>(
    open: &mut F,
    tx: &tokio::sync::mpsc::Sender<bytes::Bytes>,
    mut sent: u64,
    size: Option<u64>,
    what: &str,
) -> (Ended, u32)
where
    S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin,
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<Opened<S>>>,
{
    let mut resumes = 0;
    let ended = loop {
        if size == Some(sent) && sent > 0 {
            break Ended::Complete; // all kept already: only the verdict is left
        }
        let (chunks, at) = match open(sent).await {
            Ok(opened) => opened,
            Err(e) if resumes > 0 => break Ended::BrokeOff(e.to_string()),
            Err(e) => break Ended::NotOpened(e),
        };
        let Some(e) = forward(chunks, at, &mut sent, tx).await else {
            break Ended::Complete;
        };
        if resumes >= MAX_RESUMES {
            break Ended::BrokeOff(format!("{e} (after {resumes} resumed attempts)"));
        }
        resumes += 1;
        tracing::warn!(what = %what, bytes = sent, error = %e, attempt = resumes, "download broke off; resuming from the next byte");
    };
    (ended, resumes)
}

/// Sends what `chunks` yields (the object from byte `at` on) to the writer, counting `sent`.
/// Returns the error the stream broke off with; `None` when it ended or the writer stopped.
async fn forward<S>(
    mut chunks: S,
    mut at: u64,
    sent: &mut u64,
    tx: &tokio::sync::mpsc::Sender<bytes::Bytes>,
) -> Option<std::io::Error>
where
    S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin,
{
    use futures_util::StreamExt;
    loop {
        match chunks.next().await {
            Some(Ok(mut chunk)) => {
                // Bytes before `sent` (a server that ignored the range) were taken already.
                if at < *sent {
                    let skip = (*sent - at).min(chunk.len() as u64);
                    at += skip;
                    chunk = chunk.slice(skip as usize..);
                    if chunk.is_empty() {
                        continue;
                    }
                }
                let n = chunk.len() as u64;
                if tx.send(chunk).await.is_err() {
                    return None; // the writer stopped: its error says why
                }
                at += n;
                *sent += n;
            }
            Some(Err(e)) => return Some(e),
            None => return None,
        }
    }
}

/// Copies `src` into `dest` through a verified write.
pub(crate) fn copy_verified(src: &Path, dest: &Path, expected: Expected) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(src).map_err(|e| Error::store(src, e))?;
    let mut staged = VerifiedWrite::create(dest, expected)?;
    let mut buf = vec![0u8; CHUNK];
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

/// The sha256 (bare hex) and length of a file, streamed.
pub fn sha256_file(path: &Path) -> std::io::Result<(String, u64)> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
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

/// How a file's inode stands: what a later `stat` compares to tell whether the bytes under it
/// may have changed since they were hashed, without reading them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The filesystem's device number.
    pub dev: u64,
    /// The inode number.
    pub ino: u64,
    /// The size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch: moved by every write (the file's owner
    /// or root can set it back).
    pub mtime_ns: i64,
    /// Change time, nanoseconds since the epoch: moved by every write, chmod, link and unlink;
    /// only the kernel sets it.
    pub ctime_ns: i64,
}

impl Stamp {
    /// `path`'s stamp now (the file itself, not a symlink's).
    pub fn of(path: &Path) -> std::io::Result<Self> {
        Ok(Self::from_metadata(&std::fs::metadata(path)?))
    }

    /// The stamp in `meta`.
    pub fn from_metadata(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The same inode, size and modification time: no write since, unless its owner or root set
    /// the time back. The change time may differ (a link or unlink moves it).
    pub fn same_content(&self, other: &Self) -> bool {
        (self.dev, self.ino, self.size, self.mtime_ns)
            == (other.dev, other.ino, other.size, other.mtime_ns)
    }
}

/// sha256 of `bytes`, bare lowercase hex.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// sha256 of `bytes` as an OCI digest, `sha256:<hex>`.
pub(crate) fn oci_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_bytes(bytes))
}

/// Writes `bytes` to `path` and fsyncs the file, for a file that is renamed into place
/// afterwards (alone, or inside a staging directory renamed whole).
pub fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Moves `staged`, a directory whose files are written and fsynced, into place as `dest`:
/// fsyncs it, renames it, and fsyncs `dest`'s parent. On failure the staged copy is removed
/// and `dest` is as it was (the caller decides whether an existing `dest` counts as done).
pub fn install_dir(staged: PathBuf, dest: &Path) -> std::io::Result<()> {
    sync_dir(&staged);
    let result = std::fs::rename(&staged, dest);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staged);
    }
    if let Some(parent) = dest.parent() {
        sync_dir(parent);
    }
    result
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
            digest: sha256_bytes(bytes),
            size: Some(bytes.len() as u64),
        }
    }

    #[test]
    fn only_verified_bytes_reach_dest() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let mut s = VerifiedWrite::create(&dest, expected(b"hello")).unwrap();
        s.write(b"hel").unwrap();
        s.write(b"lo").unwrap();
        s.finish().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");

        let other = dir.path().join("other");
        let mut s = VerifiedWrite::create(&other, expected(b"hello")).unwrap();
        s.write(b"hellO").unwrap();
        let err = s.finish().unwrap_err();
        assert!(err.to_string().contains("sha256 mismatch"), "{err}");
        let mut s = VerifiedWrite::create(&other, expected(b"hello")).unwrap();
        s.write(b"hell").unwrap();
        assert!(s.finish().unwrap_err().to_string().contains("got 4 bytes"));
        let mut s = VerifiedWrite::create(&other, expected(b"hello")).unwrap();
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

    #[test]
    fn known_vector() {
        // FIPS 180-2 test vector.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_bytes(b"abc"), abc);
        assert_eq!(oci_digest(b"abc"), format!("sha256:{abc}"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        write_synced(&path, b"abc").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), (abc.to_string(), 3));
    }

    #[test]
    fn an_object_larger_than_the_free_space_is_refused_before_a_byte_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("artifact");
        let huge = Expected {
            size: Some(u64::MAX / 2),
            ..expected(b"abc")
        };
        for resumable in [false, true] {
            let opened = if resumable {
                VerifiedWrite::resumable(&dest, huge.clone())
            } else {
                VerifiedWrite::create(&dest, huge.clone())
            };
            let Err(err) = opened else {
                panic!("a write larger than the disk was started")
            };
            assert_eq!(err.reason(), kiln_crds::FailureReason::InsufficientStorage);
            let message = err.to_string();
            assert!(
                message.contains(&format!("needs {} more bytes", u64::MAX / 2))
                    && message.contains("free on the filesystem"),
                "{message}"
            );
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
            assert!(left.is_empty(), "nothing half-written: {left:?}");
        }
        // What fits is written as before.
        let mut w = VerifiedWrite::create(&dest, expected(b"abc")).unwrap();
        w.write(b"abc").unwrap();
        w.finish().unwrap();
    }

    #[test]
    fn a_stamp_moves_with_every_write_and_a_link_moves_only_its_change_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_synced(&path, b"abc").unwrap();
        let first = Stamp::of(&path).unwrap();
        assert_eq!(first.size, 3);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::hard_link(&path, dir.path().join("g")).unwrap();
        let linked = Stamp::of(&path).unwrap();
        assert!(first.same_content(&linked), "a link writes nothing");
        assert_ne!(
            first.ctime_ns, linked.ctime_ns,
            "a link moves the change time"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        // One byte flipped in place, same size.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"x"))
            .unwrap();
        let written = Stamp::of(&path).unwrap();
        assert_eq!(written.size, 3);
        assert!(
            !linked.same_content(&written),
            "a write moves the modification time"
        );
        assert_ne!(linked.ctime_ns, written.ctime_ns);
    }

    #[test]
    fn sweep_removes_only_partial_files_idle_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(format!("{PARTIAL_PREFIX}old"));
        let fresh = dir.path().join(format!("{PARTIAL_PREFIX}fresh"));
        let blob = dir.path().join("0123");
        for p in [&old, &fresh, &blob] {
            std::fs::write(p, b"x").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for p in [&old, &blob] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        }
        assert_eq!(
            sweep_partials(dir.path(), std::time::Duration::from_secs(120)),
            1
        );
        assert!(!old.exists(), "an idle partial file goes");
        assert!(fresh.exists(), "a partial file being written stays");
        assert!(blob.exists(), "a blob is never swept");
    }

    #[test]
    fn without_a_size_the_digest_alone_decides() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("blob");
        let unsized_ = |bytes: &[u8]| Expected {
            size: None,
            ..expected(bytes)
        };
        let mut s = VerifiedWrite::create(&dest, unsized_(b"hello")).unwrap();
        s.write(b"hello, world").unwrap();
        match s.finish().unwrap_err() {
            Error::Refused {
                mismatch: Mismatch::Digest { got, expected },
                ..
            } => assert_eq!(
                (got, expected),
                (sha256_bytes(b"hello, world"), sha256_bytes(b"hello"))
            ),
            e => panic!("{e}"),
        }
        assert!(!dest.exists());
        let mut s = VerifiedWrite::create(&dest, unsized_(b"hello")).unwrap();
        s.write(b"hello").unwrap();
        assert_eq!(s.written(), 5);
        s.finish().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
    }
}
