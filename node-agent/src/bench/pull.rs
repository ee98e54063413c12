//! A verified pull of a large artifact from a real local registry (Debian's docker-registry)
//! into a cache directory, against the physical limit measured in the same run, best of N each
//! (`kiln-agent bench-pull` prints it): the slower of (a) `curl -o` of the same blob to the same
//! disk with an fsync and (b) sha256 of as many bytes in memory, and the process's peak resident
//! memory. Touches a temp directory, a docker-registry it starts and stops and `curl`; never a
//! real store.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln_crds::BuildManifest;
use kiln_crds::manifest::MANIFEST_VERSION;
use kiln_store::staged::{sha256_bytes, sha256_file};
use kiln_store::{ArtifactRef, RegistryOptions};

use super::verify::make_file;

/// What one bench-pull run measured (best of the runs, seconds).
pub struct PullFigures {
    /// Artifact size in bytes.
    pub bytes: u64,
    /// `Store::pull`: download, hash, write, fsync, rename.
    pub agent: f64,
    /// (a) of the limit: `curl -o` of the same blob to the same disk, then fsync of the file.
    pub download: f64,
    /// (b) of the limit: sha256 of as many bytes, in memory.
    pub hash: f64,
    /// Peak resident memory of this process (the pulls run in it), bytes.
    pub peak_rss: u64,
    /// Registry address used.
    pub registry: SocketAddr,
}

impl PullFigures {
    /// The limit: the slower of the plain download with fsync and the in-memory hash.
    pub fn limit(&self) -> f64 {
        self.download.max(self.hash)
    }
}

/// A docker-registry serving a temp directory; killed on drop.
struct LocalRegistry {
    child: Child,
    addr: SocketAddr,
}

impl LocalRegistry {
    fn start(binary: &Path, dir: &Path) -> std::io::Result<Self> {
        let addr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n  secret: kiln-bench\n",
                dir.join("registry").display()
            ),
        )?;
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log"))?)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run {} ({e}); install Debian's docker-registry (scripts/ensure-packages.sh)",
                        binary.display()
                    ),
                )
            })?;
        let mut registry = Self { child, addr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline || registry.child.try_wait()?.is_some() {
                return Err(std::io::Error::other(format!(
                    "docker-registry did not listen on {addr}; see {}",
                    dir.join("registry.log").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pushes a pseudo-random artifact of `size` bytes to a fresh local registry under `work`, then
/// times `runs` verified pulls and `runs` curl + sha256sum pairs, alternating.
pub async fn run(
    work: &Path,
    registry_binary: &Path,
    size: u64,
    runs: usize,
) -> anyhow::Result<PullFigures> {
    let dir = tempfile::Builder::new()
        .prefix("kiln-bench-pull-")
        .tempdir_in(work)?;
    let artifact = dir.path().join("artifact");
    make_file(&artifact, size)?;
    let (digest, bytes) = sha256_file(&artifact)?;
    let registry = LocalRegistry::start(registry_binary, dir.path())?;
    let store = kiln_store::open(
        &format!("oci://{}/kiln/bench", registry.addr),
        &RegistryOptions {
            insecure: true,
            ..Default::default()
        },
    )?;
    let key = sha256_bytes(format!("bench-pull {bytes}").as_bytes());
    let entry = store
        .put(&artifact, &manifest(&key, &digest, bytes), false)
        .await?;
    std::fs::remove_file(&artifact)?;
    let reference = ArtifactRef {
        compile_key: key,
        manifest_digest: entry.manifest_digest.clone(),
        artifact_digest: digest.clone(),
        size: Some(bytes),
    };
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache)?;
    let url = format!(
        "http://{}/v2/kiln/bench/blobs/sha256:{digest}",
        registry.addr
    );
    let (mut agent, mut download, mut hash) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..runs.max(1) {
        let dest = cache.join(&digest);
        let started = Instant::now();
        store.pull(&reference, &dest).await?;
        agent = agent.min(started.elapsed().as_secs_f64());
        std::fs::remove_file(&dest)?;

        let file = cache.join("curl.out");
        let started = Instant::now();
        let status = Command::new("curl")
            .args(["-fsS", "-o"])
            .arg(&file)
            .arg(&url)
            .status()?;
        anyhow::ensure!(status.success(), "curl {url} failed: {status}");
        std::fs::File::open(&file)?.sync_all()?;
        download = download.min(started.elapsed().as_secs_f64());
        anyhow::ensure!(
            std::fs::metadata(&file)?.len() == bytes,
            "curl wrote another size"
        );
        std::fs::remove_file(&file)?;

        hash = hash.min(hash_in_memory(bytes));
    }
    Ok(PullFigures {
        bytes,
        agent,
        download,
        hash,
        peak_rss: kiln_engines::host::memory::peak_rss().unwrap_or(0),
        registry: registry.addr,
    })
}

/// Seconds to sha256 `bytes` bytes held in memory: a 64 MiB buffer hashed over and over (the
/// hash rate does not depend on the data), so 10 GiB need no 10 GiB of memory.
fn hash_in_memory(bytes: u64) -> f64 {
    use sha2::Digest;
    let buffer: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i * 2_654_435_761) as u8)
        .collect();
    let started = Instant::now();
    let mut hasher = sha2::Sha256::new();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        hasher.update(&buffer[..n]);
        left -= n as u64;
    }
    std::hint::black_box(hasher.finalize());
    started.elapsed().as_secs_f64()
}

fn manifest(key: &str, digest: &str, size: u64) -> BuildManifest {
    BuildManifest {
        manifest_version: MANIFEST_VERSION,
        compile_key: key.into(),
        artifact_digest: digest.into(),
        artifact_size: size,
        media_type: "application/octet-stream".into(),
        backend: "bench".into(),
        backend_version: "0".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        precision: "none".into(),
        profiles: Default::default(),
        class: Default::default(),
        host: Default::default(),
        flags: Default::default(),
        inputs: Default::default(),
        outputs: Vec::new(),
        unsupported_operators: Vec::new(),
        parity_max_abs_error: None,
        compile_seconds: 0.0,
        converter_log: Vec::new(),
        ..Default::default()
    }
}
