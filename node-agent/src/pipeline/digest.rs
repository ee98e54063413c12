//! Streaming sha256: bytes are hashed as they pass, so verification costs no second read.

use std::io::{self, Read, Write};

use sha2::{Digest, Sha256};

/// Buffer size for streaming copies: large enough that the hash, not syscalls, dominates.
pub const CHUNK: usize = 1 << 20;

/// The digest and length of everything read from `reader`.
pub fn sha256_reader(mut reader: impl Read) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

/// The digest and length of a file.
pub fn sha256_file(path: &std::path::Path) -> io::Result<(String, u64)> {
    sha256_reader(std::fs::File::open(path)?)
}

/// Lowercase hex sha256 of a byte slice.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A writer that hashes and counts what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The inner writer, the hex digest and the byte count.
    pub fn finish(self) -> (W, String, u64) {
        (
            self.inner,
            hex::encode(self.hasher.finalize()),
            self.written,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // FIPS 180-2 test vector.
        assert_eq!(
            sha256_bytes(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let (d, n) = sha256_reader(&b"abc"[..]).expect("read");
        assert_eq!(
            (d.as_str(), n),
            (
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                3
            )
        );
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"ab").expect("write");
        w.write_all(b"c").expect("write");
        let (inner, d, n) = w.finish();
        assert_eq!(
            (inner.as_slice(), d.as_str(), n),
            (&b"abc"[..], sha256_bytes(b"abc").as_str(), 3)
        );
    }
}
