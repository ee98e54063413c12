//! Streaming sha256 verification speed against `sha256sum` and `openssl dgst -sha256` on the
//! same file in the same run (`kiln-agent bench-verify` prints it). Touches the file it hashes
//! (or a temp file it makes) and the two tools.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kiln_store::staged::sha256_file;

use kiln_engines::pipeline::fixtures::Seeded;

/// One measured tool.
pub struct Figure {
    /// Tool name.
    pub tool: String,
    /// Best wall time in seconds over the runs.
    pub seconds: f64,
    /// Digest it printed.
    pub digest: String,
}

/// Makes a pseudo-random file of `bytes` (incompressible, so no filesystem shortcut).
pub fn make_file(path: &Path, bytes: u64) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut rng = Seeded::new(1);
    let block: Vec<u8> = (0..(1 << 20)).map(|_| rng.byte()).collect();
    let mut written = 0u64;
    let mut counter = 0u64;
    while written < bytes {
        // Vary each block so no two are equal.
        let mut b = block.clone();
        b[..8].copy_from_slice(&counter.to_le_bytes());
        let n = (bytes - written).min(b.len() as u64) as usize;
        out.write_all(&b[..n])?;
        written += n as u64;
        counter += 1;
    }
    out.flush()
}

fn external(tool: &str, args: &[&str], file: &Path) -> Option<(f64, String)> {
    let started = Instant::now();
    let out = Command::new(tool).args(args).arg(file).output().ok()?;
    let seconds = started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    // `sha256sum`: "<hex>  file"; `openssl dgst`: "SHA2-256(file)= <hex>".
    let digest = text
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 64)?
        .to_string();
    out.status.success().then_some((seconds, digest))
}

/// Measures each tool `runs` times (best of), after one untimed read to warm the page cache.
pub fn run(file: Option<PathBuf>, size: u64, runs: usize) -> std::io::Result<Vec<Figure>> {
    let dir = tempfile::tempdir()?;
    let file = match file {
        Some(f) => f,
        None => {
            let f = dir.path().join("bench.bin");
            make_file(&f, size)?;
            f
        }
    };
    sha256_file(&file)?;
    let mut figures: Vec<Figure> = Vec::new();
    let mut record = |tool: &str, seconds: f64, digest: String| match figures
        .iter_mut()
        .find(|f| f.tool == tool)
    {
        Some(f) => f.seconds = f.seconds.min(seconds),
        None => figures.push(Figure {
            tool: tool.into(),
            seconds,
            digest,
        }),
    };
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let (digest, _) = sha256_file(&file)?;
        record("kiln-agent", started.elapsed().as_secs_f64(), digest);
        if let Some((s, d)) = external("sha256sum", &[], &file) {
            record("sha256sum", s, d);
        }
        if let Some((s, d)) = external("openssl", &["dgst", "-sha256"], &file) {
            record("openssl dgst -sha256", s, d);
        }
    }
    Ok(figures)
}
