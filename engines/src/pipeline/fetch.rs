//! Fetches sources, assets and fixtures into a content-addressed blob cache, hashing while the
//! bytes stream in (kiln-store's verified write, the one the store's pulls use). A blob only
//! ever appears under its final name after its size and sha256 matched and it was fsynced; a
//! failed or interrupted fetch leaves no usable file behind. Every fetch is bounded
//! ([`FetchLimits`]): connect and read timeouts, a minimum transfer rate, redirects (HTTPS to
//! HTTPS only, a few at most), and a size (the declared one, else a configured maximum), and a
//! `file://` source must not be a FIFO, so a hostile or broken source can neither hang the
//! caller nor fill its disk. Touches the blob cache directory and the source (a file or an
//! HTTPS URL); nothing else.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_store::staged::{CHUNK, Expected, Mismatch, VerifiedWrite, sha256_file, sweep_partials};

use crate::metrics::Metrics;
use kiln_node_core::error::{Error, Result, with_causes};

/// Sizes above this report progress on stderr.
const PROGRESS_ABOVE: u64 = 64 << 20;

/// What to fetch and what it must be.
#[derive(Clone, Debug)]
pub struct Wanted<'a> {
    /// What it is, for messages (`model source`, `asset tokenizer`, `fixture v1`).
    pub what: &'a str,
    /// Where it comes from.
    pub uri: &'a str,
    /// Lowercase hex sha256 it must hash to.
    pub sha256: &'a str,
    /// Exact size, when declared.
    pub size: Option<u64>,
}

/// Bounds on every fetch of a source, asset or fixture.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct FetchLimits {
    /// Largest object fetched when the spec declares no size (assets, fixtures); a declared size
    /// is enforced exactly. A server that streams on past it is cut off there. Small by default
    /// (1 GiB): what has no declared size is a tokenizer or a fixture, not weights.
    #[arg(long = "fetch-max-bytes", env = "KILN_FETCH_MAX_BYTES", default_value_t = 1 << 30)]
    pub max_bytes: u64,
    /// Seconds an HTTPS connection may take to establish.
    #[arg(
        long = "fetch-connect-timeout",
        env = "KILN_FETCH_CONNECT_TIMEOUT",
        default_value_t = 15
    )]
    pub connect_timeout_seconds: u64,
    /// Seconds an HTTPS transfer may go without receiving a byte.
    #[arg(
        long = "fetch-read-timeout",
        env = "KILN_FETCH_READ_TIMEOUT",
        default_value_t = 60
    )]
    pub read_timeout_seconds: u64,
    /// Redirects followed at most; each must stay on HTTPS.
    #[arg(
        long = "fetch-max-redirects",
        env = "KILN_FETCH_MAX_REDIRECTS",
        default_value_t = 5
    )]
    pub max_redirects: usize,
    /// Bytes per second an HTTPS transfer must average over every --fetch-read-timeout window
    /// (0: no floor). A server dripping a byte now and then never trips the read timeout; this
    /// cuts it off.
    #[arg(
        long = "fetch-min-rate",
        env = "KILN_FETCH_MIN_RATE",
        default_value_t = 1024
    )]
    pub min_bytes_per_second: u64,
}

impl FetchLimits {
    /// The size a fetch of `wanted` may reach: the declared one, else the maximum.
    fn bound(&self, wanted: &Wanted<'_>) -> u64 {
        wanted.size.unwrap_or(self.max_bytes)
    }

    /// The HTTPS client these limits describe: timeouts, and a redirect policy that follows only
    /// HTTPS, at most `max_redirects` times (a downgrade to plain HTTP would let anyone on the
    /// path choose the bytes; the digest would catch them, but the spec's promise is HTTPS).
    fn client(&self) -> reqwest::Result<reqwest::Client> {
        let max = self.max_redirects;
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.url().scheme() != "https" {
                let to = attempt.url().to_string();
                attempt.error(format!(
                    "refused a redirect to {to}: only https:// is followed"
                ))
            } else if attempt.previous().len() > max {
                attempt.error(format!("more than {max} redirects (--fetch-max-redirects)"))
            } else {
                attempt.follow()
            }
        });
        reqwest::Client::builder()
            .user_agent(concat!("kiln-agent/", env!("CARGO_PKG_VERSION")))
            .https_only(true)
            .redirect(policy)
            .connect_timeout(Duration::from_secs(self.connect_timeout_seconds))
            .read_timeout(Duration::from_secs(self.read_timeout_seconds))
            .build()
    }
}

/// How `oci://` sources reach their registries: the one registry these options (plain HTTP,
/// credentials) are for — a compile Job's store registry, or `kiln-agent local
/// --source-registry` — and anonymous HTTPS for every other, so no credential reaches a registry
/// it was not given for.
#[derive(Clone, Debug, Default)]
pub struct SourceRegistry {
    /// `HOST[:PORT]` the options are for.
    pub host: Option<String>,
    /// Its options.
    pub options: kiln_store::RegistryOptions,
}

/// The flags that make a [`SourceRegistry`] where no store names one (`kiln-agent local`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SourceRegistryArgs {
    /// `HOST[:PORT]` of the registry `oci://` sources are pulled from with the --registry-*
    /// flags (plain HTTP, credentials); a source on any other registry is pulled anonymously
    /// over HTTPS.
    #[arg(long, env = "KILN_SOURCE_REGISTRY")]
    pub source_registry: Option<String>,
    #[command(flatten)]
    pub registry: kiln_store::RegistryArgs,
}

impl SourceRegistryArgs {
    /// The registry these flags name.
    pub fn registry(&self) -> SourceRegistry {
        SourceRegistry {
            host: self.source_registry.clone(),
            options: self.registry.options(),
        }
    }
}

impl SourceRegistry {
    /// A compile Job's: its store's registry (`oci://HOST[:PORT]/REPOSITORY`) with the store's
    /// options, its mirrors included (a source in it is pulled through them as an artifact
    /// is); a filesystem store names none.
    pub fn of_store(url: &str, options: &kiln_store::RegistryOptions) -> Self {
        match kiln_store::registry_of(url) {
            Some(host) => Self {
                host: Some(host.to_string()),
                options: options.clone(),
            },
            None => Self {
                host: None,
                options: kiln_store::RegistryOptions {
                    mirrors: options.mirrors.clone(),
                    ..Default::default()
                },
            },
        }
    }

    /// The options a pull from `registry` uses: the store registry's own, credentials and all;
    /// any other gets no credentials and only the mirrors keyed by registry
    /// (`kiln_store::mirror::parse`), never the store registry's list.
    fn options_for(&self, registry: &str) -> kiln_store::RegistryOptions {
        if self.host.as_deref() == Some(registry) {
            return self.options.clone();
        }
        let keyed = self.options.mirrors.as_deref();
        kiln_store::RegistryOptions {
            mirrors: keyed
                .filter(|m| kiln_store::mirror::keyed_by_registry(m))
                .map(str::to_string),
            ..Default::default()
        }
    }
}

/// Fetches blobs into `<cache>/<sha256>`.
pub struct Fetcher {
    /// Directory holding verified blobs by digest.
    cache: PathBuf,
    /// HTTP client for `https://` URIs, built on first use: loading the system's root
    /// certificates can fail in a minimal image, and `file://` work must not depend on it.
    http: std::sync::OnceLock<reqwest::Client>,
    /// Where fetch bytes and verification failures are counted.
    metrics: Metrics,
    /// Bounds on every fetch.
    limits: FetchLimits,
    /// How `oci://` sources are pulled.
    registry: SourceRegistry,
}

impl Fetcher {
    /// A fetcher whose verified blobs live in `cache`, bounded by `limits`. Partial files that a
    /// killed process left in `cache` go first (those idle for two read timeouts: another
    /// process sharing the cache may be writing the others).
    pub fn new(cache: PathBuf, metrics: Metrics, limits: FetchLimits) -> Result<Self> {
        std::fs::create_dir_all(&cache).map_err(|e| Error::store(&cache, e))?;
        let idle = Duration::from_secs(limits.read_timeout_seconds.saturating_mul(2));
        let swept = sweep_partials(&cache, idle);
        if swept > 0 {
            tracing::info!(swept, dir = %cache.display(), "removed partial files of interrupted fetches");
        }
        Ok(Self {
            cache,
            http: std::sync::OnceLock::new(),
            metrics,
            limits,
            registry: SourceRegistry::default(),
        })
    }

    /// This fetcher, pulling `oci://` sources from `registry` with its options.
    pub fn with_registry(mut self, registry: SourceRegistry) -> Self {
        self.registry = registry;
        self
    }

    /// The directory verified blobs are kept in.
    pub fn cache_dir(&self) -> &std::path::Path {
        &self.cache
    }

    /// A verified local copy of `wanted`: from the cache when a re-hash proves it intact,
    /// otherwise fetched, verified while streaming, and moved into place.
    pub async fn fetch(&self, wanted: &Wanted<'_>) -> Result<PathBuf> {
        let final_path = self.cache.join(wanted.sha256);
        if final_path.exists() {
            let (digest, size) =
                tokio::task::block_in_place(|| sha256_file(&final_path)).map_err(|e| {
                    Error::store_hint(
                        &final_path,
                        e,
                        "a cached blob is a file, delete this to fetch it again",
                    )
                })?;
            if digest == wanted.sha256 && wanted.size.is_none_or(|s| s == size) {
                tracing::debug!(what = wanted.what, path = %final_path.display(), "blob cache hit, re-verified");
                return Ok(final_path);
            }
            // A cached blob that no longer hashes right is discarded, never used.
            tracing::warn!(what = wanted.what, path = %final_path.display(), "cached blob corrupt; fetching again");
            let _ = std::fs::remove_file(&final_path);
        }
        let result = if matches!(scheme(wanted.uri), Some(("oci", _))) {
            self.pull(wanted, &final_path).await
        } else {
            self.copy_or_download(wanted, &final_path).await
        };
        match result {
            Ok(()) => Ok(final_path),
            Err(err) => {
                if matches!(err, Error::HashMismatch { .. }) {
                    self.metrics.verify_failure(err.reason());
                }
                Err(err)
            }
        }
    }

    /// A `file://` or `https://` blob into a verified write of `final_path`.
    async fn copy_or_download(&self, wanted: &Wanted<'_>, final_path: &Path) -> Result<()> {
        let out = VerifiedWrite::create(
            final_path,
            Expected {
                what: format!("{} {}", wanted.what, wanted.uri),
                digest: wanted.sha256.to_string(),
                size: wanted.size,
            },
        )?;
        match scheme(wanted.uri) {
            Some(("file", path)) => {
                let (path, wanted_owned) = (PathBuf::from(path), Owned::from(wanted));
                let (metrics, bound) = (self.metrics.clone(), self.limits.bound(wanted));
                tokio::task::spawn_blocking(move || {
                    copy_file(&path, out, &wanted_owned, bound, &metrics)
                })
                .await
                .map_err(|e| Error::source_unavailable(wanted.uri, e))?
            }
            Some(("https", _)) => self.download(wanted, out).await,
            _ => Err(Error::InvalidSpec(format!(
                "{} URI {:?} has an unsupported scheme; use file://, https:// or oci://",
                wanted.what, wanted.uri
            ))),
        }
    }

    /// An `oci://` file, pulled by its artifact's manifest digest into `final_path`
    /// (`kiln_store::source`): a registry that cannot be reached is the source's, not the store's.
    async fn pull(&self, wanted: &Wanted<'_>, final_path: &Path) -> Result<()> {
        let source = kiln_store::SourceRef::parse(wanted.uri).map_err(|m| {
            Error::InvalidSpec(format!("{} URI {:?}: {m}", wanted.what, wanted.uri))
        })?;
        let store = kiln_store::OciStore::new(
            &source.repository_url(),
            &self.registry.options_for(&source.registry),
        )?;
        let expected = Expected {
            what: format!("{} {}", wanted.what, wanted.uri),
            digest: wanted.sha256.to_string(),
            size: wanted.size,
        };
        match store
            .pull_file(&source, final_path, expected, self.limits.bound(wanted))
            .await
        {
            Ok(written) => {
                self.metrics.fetched(written);
                Ok(())
            }
            Err(kiln_store::Error::Unavailable {
                message, source, ..
            }) => Err(Error::SourceUnavailable {
                uri: wanted.uri.into(),
                message,
                source,
            }),
            Err(kiln_store::Error::Refused { mismatch: m, .. }) => Err(mismatch(wanted, m)),
            Err(e) => Err(e.into()),
        }
    }

    async fn download(&self, wanted: &Wanted<'_>, mut out: VerifiedWrite) -> Result<()> {
        let unavailable = |message: String| Error::SourceUnavailable {
            uri: wanted.uri.into(),
            message,
            source: None,
        };
        let http = match self.http.get() {
            Some(client) => client,
            None => {
                let client = self.limits.client().map_err(|e| {
                    let message = format!("cannot set up the HTTPS client: {e}");
                    Error::source_failed(wanted.uri, message, e)
                })?;
                self.http.get_or_init(|| client)
            }
        };
        let mut response = http
            .get(wanted.uri)
            .send()
            .await
            .map_err(|e| Error::source_failed(wanted.uri, with_causes(&e), e))?;
        if !response.status().is_success() {
            return Err(unavailable(format!("HTTP {}", response.status())));
        }
        let bound = self.limits.bound(wanted);
        // A declared length past the bound is refused before a byte is written.
        if let Some(length) = response.content_length() {
            over(wanted, bound, length)?;
        }
        let mut progress = Progress::new(wanted);
        let mut rate = RateFloor::new(&self.limits);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| Error::source_failed(wanted.uri, with_causes(&e), e))?
        {
            over(wanted, bound, out.written() + chunk.len() as u64)?;
            out.write(&chunk).map_err(|e| refused(wanted, e))?;
            progress.update(out.written());
            rate.update(chunk.len() as u64).map_err(unavailable)?;
        }
        self.metrics.fetched(out.written());
        tokio::task::block_in_place(|| out.finish()).map_err(|e| refused(wanted, e))
    }
}

/// An owned copy of [`Wanted`] for blocking tasks.
struct Owned {
    what: String,
    uri: String,
    sha256: String,
    size: Option<u64>,
}

impl From<&Wanted<'_>> for Owned {
    fn from(w: &Wanted<'_>) -> Self {
        Self {
            what: w.what.into(),
            uri: w.uri.into(),
            sha256: w.sha256.into(),
            size: w.size,
        }
    }
}

impl Owned {
    fn wanted(&self) -> Wanted<'_> {
        Wanted {
            what: &self.what,
            uri: &self.uri,
            sha256: &self.sha256,
            size: self.size,
        }
    }
}

/// A transfer whose average rate over a read-timeout window falls below the floor is cut off:
/// the read timeout alone lets a byte every few seconds keep a fetch alive for days.
struct RateFloor {
    window: Duration,
    min_bytes_per_second: u64,
    started: Instant,
    bytes: u64,
}

impl RateFloor {
    fn new(limits: &FetchLimits) -> Self {
        Self {
            window: Duration::from_secs(limits.read_timeout_seconds.max(1)),
            min_bytes_per_second: limits.min_bytes_per_second,
            started: Instant::now(),
            bytes: 0,
        }
    }

    fn update(&mut self, received: u64) -> std::result::Result<(), String> {
        self.bytes += received;
        let elapsed = self.started.elapsed();
        if elapsed < self.window {
            return Ok(());
        }
        let rate = self.bytes as f64 / elapsed.as_secs_f64();
        if rate < self.min_bytes_per_second as f64 {
            return Err(format!(
                "the transfer stalled: {} bytes in {:.1} s, below --fetch-min-rate {} bytes/s",
                self.bytes,
                elapsed.as_secs_f64(),
                self.min_bytes_per_second
            ));
        }
        (self.started, self.bytes) = (Instant::now(), 0);
        Ok(())
    }
}

fn copy_file(
    src: &Path,
    mut out: VerifiedWrite,
    wanted: &Owned,
    bound: u64,
    metrics: &Metrics,
) -> Result<()> {
    let wanted = wanted.wanted();
    let unavailable = |message: String| Error::SourceUnavailable {
        uri: wanted.uri.into(),
        message,
        source: None,
    };
    // Only regular files: opening a FIFO blocks until something writes to it, and a device
    // (/dev/zero, /dev/urandom) streams until a size bound cuts it off. Opened without blocking
    // and checked on the open descriptor, so something swapped in after a path check cannot slip
    // through; for regular files the flag changes nothing.
    let mut input = {
        use std::os::unix::fs::OpenOptionsExt;
        let input = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(src)
            .map_err(|e| Error::source_unavailable(wanted.uri, e))?;
        let kind = input
            .metadata()
            .map_err(|e| Error::source_unavailable(wanted.uri, e))?
            .file_type();
        if !kind.is_file() {
            return Err(unavailable(format!(
                "{} is a {}, not a regular file; a file:// URI must name a regular file",
                src.display(),
                file_kind(&kind)
            )));
        }
        input
    };
    let mut buf = vec![0u8; CHUNK];
    let mut progress = Progress::new(&wanted);
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Error::source_unavailable(wanted.uri, e));
            }
        };
        over(&wanted, bound, out.written() + n as u64)?;
        out.write(&buf[..n]).map_err(|e| refused(&wanted, e))?;
        progress.update(out.written());
    }
    metrics.fetched(out.written());
    out.finish().map_err(|e| refused(&wanted, e))
}

/// What a non-regular file is, for the refusal.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// Refuses a fetch that would reach `length` bytes, past its `bound`. A declared size is the
/// spec's (the exact-size check words it); only the configured maximum is this function's.
fn over(wanted: &Wanted<'_>, bound: u64, length: u64) -> Result<()> {
    if length <= bound {
        return Ok(());
    }
    if let Some(expected) = wanted.size {
        return Err(mismatch(wanted, Mismatch::TooLarge { expected }));
    }
    Err(Error::SourceUnavailable {
        uri: wanted.uri.into(),
        message: format!(
            "{} is larger than {bound} bytes, the most fetched without a declared size (--fetch-max-bytes); declare its size (spec.source.size, spec.assets[].size) or raise the limit",
            wanted.what
        ),
        source: None,
    })
}

/// A refused write in the terms of the spec that declared the blob (what to fix is the spec's
/// size or sha256, or the source); other store errors as they are.
fn refused(wanted: &Wanted<'_>, err: kiln_store::Error) -> Error {
    match err {
        kiln_store::Error::Refused { mismatch: m, .. } => mismatch(wanted, m),
        other => other.into(),
    }
}

/// Bytes that are not what the spec declared, in the spec's terms.
fn mismatch(wanted: &Wanted<'_>, mismatch: Mismatch) -> Error {
    let message = match mismatch {
        Mismatch::TooLarge { expected } => {
            format!("larger than the declared size of {expected} bytes; check spec size and sha256")
        }
        Mismatch::Short { got, expected } => {
            format!("truncated: got {got} of the declared {expected} bytes")
        }
        Mismatch::Digest { got, expected } => {
            format!("sha256 is {got}, the spec declares {expected}")
        }
    };
    Error::HashMismatch {
        what: format!("{} {}", wanted.what, wanted.uri),
        message,
        source: None,
    }
}

/// `(scheme, rest)` of a URI.
fn scheme(uri: &str) -> Option<(&str, &str)> {
    uri.split_once("://")
}

/// Progress lines on stderr for large transfers, every 10%.
struct Progress {
    what: String,
    total: Option<u64>,
    next_decile: u64,
    started: Instant,
}

impl Progress {
    fn new(wanted: &Wanted<'_>) -> Self {
        let total = wanted.size.filter(|s| *s > PROGRESS_ABOVE);
        Self {
            what: wanted.what.to_string(),
            total,
            next_decile: 1,
            started: Instant::now(),
        }
    }

    fn update(&mut self, done: u64) {
        let Some(total) = self.total else { return };
        if done * 10 >= total * self.next_decile {
            let secs = self.started.elapsed().as_secs_f64().max(1e-9);
            tracing::info!(
                what = %self.what,
                percent = self.next_decile * 10,
                bytes = done,
                mb_per_s = format!("{:.0}", done as f64 / secs / 1e6),
                "fetching"
            );
            self.next_decile = done * 10 / total + 1;
        }
    }
}
