//! The OCI registry store: one image manifest per compile key, tagged with the key, whose config
//! blob is the build manifest and whose one layer is the artifact (layer digest = the artifact's
//! sha256). Lookups go by tag; pulls go by manifest digest only, and stream the layer into a
//! verified write (hash while downloading; nothing partial ever lands at the destination).
//! Touches the registry over HTTP(S) and, on a pull, the destination path.

use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use kiln_crds::BuildManifest;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::attest::{ENVELOPE_MEDIA_TYPE, MAX_ENVELOPE_BYTES, PAYLOAD_TYPE, PREDICATE_TYPE};
use crate::fs::check_manifest;
use crate::staged::{Expected, oci_digest, stream_verified};
use crate::{ArtifactRef, Entry, Error, RegistryOptions, Result, Store, check_key};

pub mod mirror;
pub mod source;

use crate::MirrorSkip;
use mirror::Endpoint;

/// `artifactType` of every kiln manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.kiln.artifact.v1";
/// Media type of the config blob: the build manifest JSON.
pub const BUILD_MANIFEST_MEDIA_TYPE: &str = "application/vnd.kiln.build-manifest.v1+json";
/// Media type of the layer: the compiled artifact.
pub const ENGINE_MEDIA_TYPE: &str = "application/vnd.kiln.engine.v1.tar";
/// The layer annotation by which cosign knows a signature layer.
const COSIGN_SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// Media type of the empty config of an attestation manifest.
const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// Largest build manifest (config blob) or image manifest accepted.
const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Read size when streaming an artifact file to the registry.
const PUSH_READ_BYTES: usize = 4 << 20;
/// How often a request that lost a race with a concurrent publisher's link rewrite is made again
/// (`blob_present`, `push_manifest_bytes`), 100 ms more apart each time.
const REGISTRY_RACE_RETRIES: u64 = 4;

/// An OCI registry repository, e.g. `oci://10.201.0.2:5000/kiln`.
pub struct OciStore {
    client: Client,
    auth: RegistryAuth,
    registry: String,
    repository: String,
    insecure: bool,
    user: Option<String>,
    max_artifact_bytes: u64,
    /// Mirrors of this registry, tried in order before it (`mirror.rs`); none in a mirror.
    mirrors: Vec<Mirror>,
    /// Why mirrors were passed over since the last [`Store::take_mirror_skips`].
    skips: std::sync::Mutex<Vec<MirrorSkip>>,
}

impl OciStore {
    /// A store for `oci://HOST[:PORT]/REPOSITORY`. Contacts nothing yet.
    pub fn new(url: &str, options: &RegistryOptions) -> Result<Self> {
        let invalid = |message: &str| Error::InvalidUrl {
            url: url.into(),
            message: message.into(),
        };
        let (registry, repository) = split_url(url).map_err(invalid)?;
        // Validate the name the way the registry will.
        Reference::try_from(format!("{registry}/{repository}:probe"))
            .map_err(|e| invalid(&format!("not a valid repository: {e}")))?;
        let auth = match (&options.username, &options.password) {
            (Some(u), Some(p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            (Some(_), None) | (None, Some(_)) => {
                return Err(invalid(
                    "KILN_REGISTRY_USERNAME and KILN_REGISTRY_PASSWORD must be set together",
                ));
            }
            (None, None) => RegistryAuth::Anonymous,
        };
        // reqwest is built without a default crypto provider; kiln uses ring. Harmless when the
        // binary already installed it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mirrors = match options.mirrors.as_deref() {
            Some(json) => mirror::parse(json, registry)
                .map_err(|m| invalid(&format!("KILN_REGISTRY_MIRRORS: {m}")))?,
            None => Vec::new(),
        };
        let mirrors = mirrors
            .into_iter()
            .map(|endpoint| {
                let store = Self {
                    client: client(endpoint.http, &endpoint.host)?,
                    auth: RegistryAuth::Anonymous,
                    registry: endpoint.host.clone(),
                    repository: repository.to_string(),
                    insecure: endpoint.http,
                    user: None,
                    max_artifact_bytes: options.max_artifact_bytes,
                    mirrors: Vec::new(),
                    skips: Default::default(),
                };
                Ok(Mirror { endpoint, store })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            client: client(options.insecure, registry)?,
            auth,
            registry: registry.to_string(),
            repository: repository.to_string(),
            insecure: options.insecure,
            user: options.username.clone(),
            max_artifact_bytes: options.max_artifact_bytes,
            mirrors,
            skips: Default::default(),
        })
    }

    fn tagged(&self, key: &str) -> Reference {
        Reference::with_tag(
            self.registry.clone(),
            self.repository.clone(),
            key.to_string(),
        )
    }

    /// Where the attestation of the manifest `digest` is tagged (`sha256-<hex>.att`).
    fn attestation_tag(&self, digest: &str) -> Result<Reference> {
        let hex = crate::digest_hex(digest)?;
        Ok(Reference::with_tag(
            self.registry.clone(),
            self.repository.clone(),
            format!("sha256-{hex}.att"),
        ))
    }

    fn by_digest(&self, digest: &str) -> Reference {
        Reference::with_digest(
            self.registry.clone(),
            self.repository.clone(),
            digest.to_string(),
        )
    }

    /// Streams `layer` of the manifest at `reference` into a verified write of `dest`.
    /// A range request from byte 0 (and from where it broke off, when a download is resumed):
    /// the registry answers 206 and the client leaves the digest to us, so every byte is hashed
    /// once. A registry that answers 200 gets the client's own digest check too; ours is the
    /// verdict (it also names what arrived), so its complaint just ends the stream.
    async fn pull_layer(
        &self,
        reference: &Reference,
        layer: &OciDescriptor,
        dest: &Path,
        expected: Expected,
    ) -> Result<()> {
        let open = |offset: u64| async move {
            let response = self
                .client
                .pull_blob_stream_partial(reference, layer, offset, None)
                .await
                .map_err(|e| self.error(&format!("pulling blob {}", layer.digest), e))?;
            let (stream, at) = match response {
                oci_client::client::BlobResponse::Full(s) => (s.stream, 0),
                oci_client::client::BlobResponse::Partial(s) => (s.stream, offset),
            };
            let chunks = stream.scan((), |(), item| {
                std::future::ready(match item {
                    Err(e) if is_digest_error(&e) => None,
                    item => Some(item),
                })
            });
            Ok((Box::pin(chunks), at))
        };
        stream_verified(open, dest, expected)
            .await
            .map_err(|e| match e {
                Error::Unavailable {
                    message, source, ..
                } => Error::Unavailable {
                    location: self.location().to_string(),
                    message,
                    source,
                },
                e => e,
            })
    }

    /// The attestation of `key`'s entry, from this registry only.
    async fn attestation_here(&self, key: &str, manifest_digest: &str) -> Result<Option<Vec<u8>>> {
        check_key(&self.location(), key)?;
        let reference = self.attestation_tag(manifest_digest)?;
        let doing = format!("reading the attestation of {manifest_digest}");
        let Some(bytes) = self.manifest_bytes(&reference, &doing).await? else {
            return Ok(None);
        };
        let refuse = |message: String| Error::SignatureInvalid {
            what: format!("attestation {reference}"),
            message,
        };
        let image: OciImageManifest = serde_json::from_slice(&bytes)
            .map_err(|e| refuse(format!("not an OCI image manifest: {e}")))?;
        let [layer] = image.layers.as_slice() else {
            return Err(refuse(format!("{} layers, expected 1", image.layers.len())));
        };
        if layer.media_type != ENVELOPE_MEDIA_TYPE
            || u64::try_from(layer.size).map_or(true, |s| s > MAX_ENVELOPE_BYTES)
        {
            return Err(refuse(format!(
                "layer {} of {} bytes; expected one {ENVELOPE_MEDIA_TYPE} of at most {MAX_ENVELOPE_BYTES}",
                layer.media_type, layer.size
            )));
        }
        let mut envelope = Vec::new();
        self.client
            .pull_blob(&reference, layer, &mut envelope)
            .await
            .map_err(|e| self.error(&doing, e))?;
        if oci_digest(&envelope) != layer.digest {
            return Err(Error::HashMismatch {
                what: format!("attestation {reference}"),
                message: format!(
                    "the registry served bytes with digest {}",
                    oci_digest(&envelope)
                ),
            });
        }
        Ok(Some(envelope))
    }

    /// The artifact of `r`, from this registry only.
    async fn pull_here(&self, r: &ArtifactRef, dest: &Path) -> Result<BuildManifest> {
        let (reference, layer, expected, m) = self.resolve_here(r).await?;
        self.pull_layer(&reference, &layer, dest, expected).await?;
        Ok(m)
    }

    /// The verified manifest of `r` from this registry only: the reference it is pulled by, its
    /// layer, what that layer must be, and the build manifest.
    async fn resolve_here(
        &self,
        r: &ArtifactRef,
    ) -> Result<(Reference, OciDescriptor, Expected, BuildManifest)> {
        check_key(&self.location(), &r.compile_key)?;
        let doing = format!("pulling manifest {}", r.manifest_digest);
        let reference = self.by_digest(&r.manifest_digest);
        let bytes = self
            .manifest_bytes(&reference, &doing)
            .await?
            .ok_or_else(|| {
                Error::unavailable(
                    self.location(),
                    format!("{doing}: the registry has no such manifest (garbage-collected or never pushed here); the operator will rebuild when the key is missing"),
                )
            })?;
        if oci_digest(&bytes) != r.manifest_digest {
            return Err(Error::HashMismatch {
                what: format!("manifest {} from {}", r.manifest_digest, self.location()),
                message: format!(
                    "the registry served bytes with digest {}",
                    oci_digest(&bytes)
                ),
            });
        }
        let (entry, layer) = self.entry(&bytes, &doing).await?;
        check_manifest(
            &self.location(),
            r,
            &entry.manifest,
            self.max_artifact_bytes,
        )?;
        let m = entry.manifest;
        let expected = Expected {
            what: format!(
                "artifact sha256:{} from {}",
                m.artifact_digest,
                self.location()
            ),
            digest: m.artifact_digest.clone(),
            size: Some(m.artifact_size),
        };
        Ok((reference, layer, expected, m))
    }

    /// Reads the artifact of `r` from this registry to its end, hashing it, and writes nothing:
    /// what makes a pull-through cache fetch and keep it ([`Store::preheat`]) without a second
    /// copy of a many-gigabyte artifact on the publisher's disk.
    async fn read_through_here(&self, r: &ArtifactRef) -> Result<()> {
        use sha2::Digest as _;
        let (reference, layer, expected, _) = self.resolve_here(r).await?;
        let doing = format!("reading blob {}", layer.digest);
        let mut stream = self
            .client
            .pull_blob_stream(&reference, &layer)
            .await
            .map_err(|e| self.error(&doing, e))?;
        let (mut hash, mut size) = (sha2::Sha256::new(), 0u64);
        // The client's own digest check ends the stream; ours is the verdict (as in pull_layer).
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Err(e) if is_digest_error(&e) => break,
                chunk => chunk
                    .map_err(|e| Error::unavailable(self.location(), format!("{doing}: {e}")))?,
            };
            hash.update(&chunk);
            size += chunk.len() as u64;
            if expected.size.is_some_and(|want| size > want) {
                break;
            }
        }
        let got = hex::encode(hash.finalize());
        if got != expected.digest || Some(size) != expected.size {
            return Err(Error::HashMismatch {
                what: expected.what,
                message: format!("the registry served {size} bytes with sha256 {got}"),
            });
        }
        Ok(())
    }

    /// Turns a client error into a store error that names the registry and says what to fix.
    fn error(&self, doing: &str, err: OciDistributionError) -> Error {
        let location = self.location();
        let scheme = if self.insecure { "http" } else { "https" };
        let auth_hint = match &self.user {
            Some(u) => format!(
                "the registry refused user {u:?}; check KILN_REGISTRY_USERNAME / KILN_REGISTRY_PASSWORD (or the --registry-secret)"
            ),
            None => "the registry requires credentials; set KILN_REGISTRY_USERNAME / KILN_REGISTRY_PASSWORD (or the --registry-secret)".to_string(),
        };
        let message = match &err {
            OciDistributionError::RequestError(e) if e.is_connect() || e.is_timeout() => format!(
                "cannot reach registry {} over {scheme} while {doing} ({}); is it running, and is the store URL right?",
                self.registry,
                source_chain(e)
            ),
            OciDistributionError::RequestError(e) => {
                format!(
                    "{doing}: request to registry {} failed: {}",
                    self.registry,
                    source_chain(e)
                )
            }
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => {
                format!("{doing}: {auth_hint} ({err})")
            }
            OciDistributionError::RegistryError { envelope, .. }
                if envelope.errors.iter().any(|e| {
                    matches!(e.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)
                }) =>
            {
                format!("{doing}: {auth_hint} ({err})")
            }
            OciDistributionError::DigestError(e) => {
                return Error::HashMismatch {
                    what: format!("{doing} from {location}"),
                    message: e.to_string(),
                };
            }
            _ => format!("{doing}: {err}"),
        };
        Error::unavailable_because(location, message, err)
    }

    /// Pushes a blob unless the repository already has it. Blobs are content-addressed, and
    /// publishers of different classes push the same ones at the same time (the empty config of
    /// every attestation, an engine two classes built alike): a push that loses such a race fails
    /// at the registry, while the blob is there — which is all that was wanted.
    async fn push_blob_once(
        &self,
        reference: &Reference,
        bytes: Vec<u8>,
        digest: &str,
    ) -> oci_client::errors::Result<()> {
        if self.blob_present(reference, digest).await? {
            return Ok(());
        }
        let pushed = self.client.push_blob(reference, bytes, digest).await;
        self.pushed_or_present(pushed, reference, digest).await
    }

    /// Whether the blob `digest` is in the repository. A registry rewriting the blob's link for a
    /// concurrent publisher answers 500 for a moment (distribution's filesystem driver truncates
    /// and rewrites it), so an error is asked again, a bounded number of times.
    async fn blob_present(
        &self,
        reference: &Reference,
        digest: &str,
    ) -> oci_client::errors::Result<bool> {
        let mut retries = 0u64;
        loop {
            match self.client.blob_exists(reference, digest).await {
                Err(e) if retries < REGISTRY_RACE_RETRIES => {
                    retries += 1;
                    tracing::info!(digest, error = %e, retries, "asking again whether a blob is present");
                    tokio::time::sleep(std::time::Duration::from_millis(100 * retries)).await;
                }
                answer => return answer,
            }
        }
    }

    /// A failed push of a content-addressed blob is a success when the blob is there after all
    /// (another publisher pushed the same bytes concurrently).
    async fn pushed_or_present<T>(
        &self,
        pushed: oci_client::errors::Result<T>,
        reference: &Reference,
        digest: &str,
    ) -> oci_client::errors::Result<()> {
        match pushed {
            Ok(_) => Ok(()),
            Err(e) => match self.blob_present(reference, digest).await {
                Ok(true) => {
                    tracing::info!(digest, error = %e, "a concurrent push stored this blob first");
                    Ok(())
                }
                _ => Err(e),
            },
        }
    }

    /// Pushes `image` as the manifest at `reference`; returns its digest.
    async fn push_image(
        &self,
        reference: &Reference,
        image: &OciImageManifest,
        doing: &str,
    ) -> Result<String> {
        let bytes =
            serde_json::to_vec(image).map_err(|e| Error::unavailable_by(self.location(), e))?;
        let digest = oci_digest(&bytes);
        self.push_manifest_bytes(reference, bytes, doing).await?;
        Ok(digest)
    }

    /// Puts the manifest `bytes` at `reference` (a tag, or their own digest).
    ///
    /// distribution's filesystem driver rewrites a blob's repository link in place (truncate,
    /// then write) when a concurrent publisher pushes the same blob, so a manifest checked in that
    /// moment is refused as `MANIFEST_BLOB_UNKNOWN` although every blob is there. Such a refusal
    /// is retried, a bounded number of times, only while each blob it names is present.
    async fn push_manifest_bytes(
        &self,
        reference: &Reference,
        bytes: Vec<u8>,
        doing: &str,
    ) -> Result<()> {
        let mut retries = 0u64;
        loop {
            let pushed = self
                .client
                .push_manifest_raw(
                    reference,
                    bytes.clone(),
                    http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
                )
                .await;
            let Err(e) = pushed else { return Ok(()) };
            let text = e.to_string();
            let blob_race =
                text.contains("MANIFEST_BLOB_UNKNOWN") || text.contains("DIGEST_INVALID");
            if retries >= REGISTRY_RACE_RETRIES
                || !blob_race
                || !self.blobs_present(reference, &bytes).await
            {
                return Err(self.error(doing, e));
            }
            retries += 1;
            tracing::info!(error = %e, retries, "retrying a manifest whose blobs are all present");
            tokio::time::sleep(std::time::Duration::from_millis(100 * retries)).await;
        }
    }

    /// Whether every blob the image manifest `bytes` names is in the repository.
    async fn blobs_present(&self, reference: &Reference, bytes: &[u8]) -> bool {
        let Ok(image) = serde_json::from_slice::<OciImageManifest>(bytes) else {
            return false;
        };
        for blob in std::iter::once(&image.config).chain(&image.layers) {
            if !matches!(self.blob_present(reference, &blob.digest).await, Ok(true)) {
                return false;
            }
        }
        true
    }

    /// The raw manifest at `reference`, or `None` if the registry does not know it.
    async fn manifest_bytes(&self, reference: &Reference, doing: &str) -> Result<Option<Vec<u8>>> {
        match self
            .client
            .pull_manifest_raw(reference, &self.auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await
        {
            Ok((bytes, _)) => {
                if bytes.len() as u64 > MAX_MANIFEST_BYTES {
                    return Err(Error::unavailable(
                        self.location(),
                        format!("{doing}: manifest of {} bytes is too large", bytes.len()),
                    ));
                }
                Ok(Some(bytes.to_vec()))
            }
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(self.error(doing, e)),
        }
    }

    /// Parses and checks a kiln image manifest, then fetches and verifies its build manifest.
    async fn entry(&self, bytes: &[u8], doing: &str) -> Result<(Entry, OciDescriptor)> {
        let manifest_digest = oci_digest(bytes);
        let image: OciImageManifest = serde_json::from_slice(bytes).map_err(|e| {
            let message =
                format!("{doing}: manifest {manifest_digest} is not an OCI image manifest: {e}");
            Error::unavailable_because(self.location(), message, e)
        })?;
        if image.artifact_type.as_deref() != Some(ARTIFACT_TYPE)
            || image.config.media_type != BUILD_MANIFEST_MEDIA_TYPE
            || image.layers.len() != 1
            || image.layers[0].media_type != ENGINE_MEDIA_TYPE
        {
            return Err(Error::unavailable(
                self.location(),
                format!(
                    "{doing}: manifest {manifest_digest} is not a kiln artifact (artifactType {:?}, config {}, {} layer(s)); something else pushed to this repository",
                    image.artifact_type,
                    image.config.media_type,
                    image.layers.len()
                ),
            ));
        }
        let config = &image.config;
        let size = u64::try_from(config.size).unwrap_or(u64::MAX);
        if size > MAX_MANIFEST_BYTES {
            return Err(Error::unavailable(
                self.location(),
                format!("{doing}: build manifest of {size} bytes is too large"),
            ));
        }
        let mut json = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        let reference = self.by_digest(&manifest_digest);
        self.client
            .pull_blob(&reference, config, &mut json)
            .await
            .map_err(|e| self.error(&format!("{doing}: build manifest {}", config.digest), e))?;
        if oci_digest(&json) != config.digest {
            return Err(Error::HashMismatch {
                what: format!("build manifest {} in {}", config.digest, self.location()),
                message: format!(
                    "the registry served bytes with digest {}",
                    oci_digest(&json)
                ),
            });
        }
        let manifest: BuildManifest = serde_json::from_slice(&json).map_err(|e| {
            let message = format!("{doing}: build manifest {} unreadable: {e}", config.digest);
            Error::unavailable_because(self.location(), message, e)
        })?;
        crate::check_manifest_digests(&format!("build manifest {}", config.digest), &manifest)?;
        let layer = image.layers[0].clone();
        if layer.digest != format!("sha256:{}", manifest.artifact_digest)
            || u64::try_from(layer.size).ok() != Some(manifest.artifact_size)
        {
            return Err(Error::HashMismatch {
                what: format!("manifest {manifest_digest} in {}", self.location()),
                message: format!(
                    "its layer is {} ({} bytes) but its build manifest says sha256:{} ({} bytes)",
                    layer.digest, layer.size, manifest.artifact_digest, manifest.artifact_size
                ),
            });
        }
        Ok((
            Entry {
                manifest,
                manifest_digest,
            },
            layer,
        ))
    }
}

#[async_trait::async_trait]
impl Store for OciStore {
    fn location(&self) -> String {
        format!("oci://{}/{}", self.registry, self.repository)
    }

    async fn check_writable(&self) -> Result<()> {
        // A write needs the registry up and the credentials accepted; /v2/ answers both (push
        // permission itself is only known when pushing).
        let reference = self.tagged(&"0".repeat(64));
        match self
            .client
            .pull_manifest_raw(&reference, &self.auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(self.error("checking the registry", e)),
        }
    }

    async fn lookup(&self, key: &str) -> Result<Option<Entry>> {
        check_key(&self.location(), key)?;
        let doing = format!("looking up compile key {key}");
        let Some(bytes) = self.manifest_bytes(&self.tagged(key), &doing).await? else {
            return Ok(None);
        };
        let (entry, _) = self.entry(&bytes, &doing).await?;
        if entry.manifest.compile_key != key {
            return Err(Error::unavailable(
                self.location(),
                format!(
                    "tag {key} points at a build of key {}; the repository was tampered with",
                    entry.manifest.compile_key
                ),
            ));
        }
        Ok(Some(entry))
    }

    async fn stage(&self, artifact: &Path, manifest: &BuildManifest) -> Result<Entry> {
        let key = &manifest.compile_key;
        check_key(&self.location(), key)?;
        let doing = format!("pushing compile key {key}");
        let reference = self.tagged(key);
        let layer_digest = format!("sha256:{}", manifest.artifact_digest);
        // Only some client calls take credentials; the others use what was stored.
        self.client
            .store_auth_if_needed(&self.registry, &self.auth)
            .await;
        let exists = self
            .blob_present(&reference, &layer_digest)
            .await
            .map_err(|e| self.error(&doing, e))?;
        if !exists {
            let file = tokio::fs::File::open(artifact)
                .await
                .map_err(|e| Error::store(artifact, e))?;
            let size = file
                .metadata()
                .await
                .map_err(|e| Error::store(artifact, e))?
                .len();
            if size != manifest.artifact_size {
                return Err(Error::unavailable(
                    artifact.display(),
                    format!(
                        "is {size} bytes, the build manifest says {}",
                        manifest.artifact_size
                    ),
                ));
            }
            let pushed = self
                .client
                .push_blob_stream(&reference, file_stream(file), &layer_digest, Some(size))
                .await;
            self.pushed_or_present(pushed, &reference, &layer_digest)
                .await
                .map_err(|e| self.error(&format!("{doing}: artifact {layer_digest}"), e))?;
        }
        let json = serde_json::to_vec_pretty(manifest)
            .map_err(|e| Error::unavailable_by(self.location(), e))?;
        let config = OciDescriptor {
            media_type: BUILD_MANIFEST_MEDIA_TYPE.into(),
            digest: oci_digest(&json),
            size: i64::try_from(json.len()).unwrap_or(i64::MAX),
            ..Default::default()
        };
        self.push_blob_once(&reference, json, &config.digest)
            .await
            .map_err(|e| self.error(&format!("{doing}: build manifest"), e))?;
        let image = OciImageManifest {
            schema_version: 2,
            media_type: Some(OCI_IMAGE_MEDIA_TYPE.into()),
            config,
            layers: vec![OciDescriptor {
                media_type: ENGINE_MEDIA_TYPE.into(),
                digest: layer_digest,
                size: i64::try_from(manifest.artifact_size).unwrap_or(i64::MAX),
                ..Default::default()
            }],
            subject: None,
            artifact_type: Some(ARTIFACT_TYPE.into()),
            annotations: Some([("dev.kiln.compile-key".to_string(), key.clone())].into()),
        };
        // By digest: the registry holds it, no tag points at it yet.
        let bytes =
            serde_json::to_vec(&image).map_err(|e| Error::unavailable_by(self.location(), e))?;
        let manifest_digest = oci_digest(&bytes);
        self.push_manifest_bytes(
            &self.by_digest(&manifest_digest),
            bytes,
            &format!("{doing}: manifest"),
        )
        .await?;
        Ok(Entry {
            manifest: manifest.clone(),
            manifest_digest,
        })
    }

    /// Points the compile-key tag at the manifest pushed by digest: the same bytes, read back
    /// by digest and checked, put under the tag in one request.
    async fn tag(&self, entry: &Entry, replace: bool) -> Result<Entry> {
        let key = &entry.manifest.compile_key;
        check_key(&self.location(), key)?;
        if !replace && let Some(found) = self.lookup(key).await? {
            return Ok(found);
        }
        let doing = format!("tagging compile key {key}");
        let bytes = self
            .manifest_bytes(&self.by_digest(&entry.manifest_digest), &doing)
            .await?
            .ok_or_else(|| {
                Error::unavailable(
                    self.location(),
                    format!(
                        "{doing}: manifest {} is not in the registry; stage it first",
                        entry.manifest_digest
                    ),
                )
            })?;
        if oci_digest(&bytes) != entry.manifest_digest {
            return Err(Error::HashMismatch {
                what: format!(
                    "manifest {} from {}",
                    entry.manifest_digest,
                    self.location()
                ),
                message: format!(
                    "the registry served bytes with digest {}",
                    oci_digest(&bytes)
                ),
            });
        }
        self.client
            .store_auth_if_needed(&self.registry, &self.auth)
            .await;
        self.push_manifest_bytes(&self.tagged(key), bytes, &doing)
            .await?;
        Ok(entry.clone())
    }

    /// As cosign keeps attestations: an image manifest tagged `sha256-<hex>.att` (the digest of
    /// the entry it is about) whose one layer is the DSSE envelope.
    async fn put_attestation(
        &self,
        key: &str,
        manifest_digest: &str,
        envelope: &[u8],
    ) -> Result<()> {
        check_key(&self.location(), key)?;
        let reference = self.attestation_tag(manifest_digest)?;
        let doing = format!("pushing the attestation of {manifest_digest}");
        self.client
            .store_auth_if_needed(&self.registry, &self.auth)
            .await;
        // cosign reads a layer as a signature only when it carries this annotation (empty on
        // its own attestations); `predicateType` as `cosign attest` writes it.
        let layer = OciDescriptor {
            media_type: ENVELOPE_MEDIA_TYPE.into(),
            digest: oci_digest(envelope),
            size: i64::try_from(envelope.len()).unwrap_or(i64::MAX),
            annotations: Some(
                [
                    (COSIGN_SIGNATURE_ANNOTATION.to_string(), String::new()),
                    ("predicateType".to_string(), PREDICATE_TYPE.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        self.push_blob_once(&reference, envelope.to_vec(), &layer.digest)
            .await
            .map_err(|e| self.error(&doing, e))?;
        let config = b"{}".to_vec();
        let config_desc = OciDescriptor {
            media_type: EMPTY_CONFIG_MEDIA_TYPE.into(),
            digest: oci_digest(&config),
            size: 2,
            ..Default::default()
        };
        self.push_blob_once(&reference, config, &config_desc.digest)
            .await
            .map_err(|e| self.error(&doing, e))?;
        let image = OciImageManifest {
            schema_version: 2,
            media_type: Some(OCI_IMAGE_MEDIA_TYPE.into()),
            config: config_desc,
            layers: vec![layer],
            subject: None,
            artifact_type: Some(PAYLOAD_TYPE.into()),
            annotations: Some([("dev.kiln.compile-key".to_string(), key.to_string())].into()),
        };
        self.push_image(&reference, &image, &doing).await?;
        Ok(())
    }

    async fn attestation(&self, key: &str, manifest_digest: &str) -> Result<Option<Vec<u8>>> {
        self.attestation_mirrored(key, manifest_digest).await
    }

    async fn pull(&self, r: &ArtifactRef, dest: &Path) -> Result<BuildManifest> {
        self.pull_mirrored(r, dest).await
    }

    async fn preheat(&self, r: &ArtifactRef) -> Vec<MirrorSkip> {
        self.preheat_mirrors(r).await
    }

    fn take_mirror_skips(&self) -> Vec<MirrorSkip> {
        std::mem::take(
            &mut *self
                .skips
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn scratch(&self) -> Result<tempfile::TempDir> {
        let tmp = std::env::temp_dir();
        tempfile::TempDir::new_in(&tmp).map_err(|e| Error::store(&tmp, e))
    }

    fn blob_cache(&self) -> Option<PathBuf> {
        None
    }
}

/// A mirror in use: its endpoint and a registry client of its own.
pub struct Mirror {
    pub(super) endpoint: Endpoint,
    pub(super) store: OciStore,
}

/// Pulls through the mirrors (`mirror.rs`): each tried in order, the registry last.
impl OciStore {
    pub(super) fn skip(&self, mirror: &Mirror, reason: &'static str, message: String) {
        tracing::warn!(mirror = %mirror.endpoint.host, reason, %message, "registry mirror passed over; trying the next");
        self.skips
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(MirrorSkip {
                mirror: mirror.endpoint.host.clone(),
                reason,
                message,
            });
    }

    /// The artifact of `r` from the first pull mirror that serves it verified, else the origin.
    pub(super) async fn pull_mirrored(
        &self,
        r: &ArtifactRef,
        dest: &Path,
    ) -> Result<BuildManifest> {
        for m in self.mirrors.iter().filter(|m| m.endpoint.pull) {
            match m.store.pull_here(r, dest).await {
                Ok(manifest) => return Ok(manifest),
                Err(e) => self.skip(m, mirror::reason(&e), e.to_string()),
            }
        }
        self.pull_here(r, dest).await
    }

    /// [`Store::preheat`]: the artifact read through every pull mirror once (verified like any
    /// pull, written nowhere), the attestation asked of every resolve mirror.
    async fn preheat_mirrors(&self, r: &ArtifactRef) -> Vec<MirrorSkip> {
        let mut failed = Vec::new();
        let mut fail = |m: &Mirror, e: &Error| {
            failed.push(MirrorSkip {
                mirror: m.endpoint.host.clone(),
                reason: mirror::reason(e),
                message: e.to_string(),
            });
        };
        for m in self.mirrors.iter().filter(|m| m.endpoint.pull) {
            match m.store.read_through_here(r).await {
                Ok(_) => {
                    tracing::info!(mirror = %m.endpoint.host, manifest = %r.manifest_digest, "registry mirror preheated")
                }
                Err(e) => fail(m, &e),
            }
        }
        for m in self.mirrors.iter().filter(|m| m.endpoint.resolve) {
            if let Err(e) = m
                .store
                .attestation_here(&r.compile_key, &r.manifest_digest)
                .await
            {
                fail(m, &e);
            }
        }
        failed
    }

    /// The attestation from the first resolve mirror that has it, else the origin. It is only
    /// bytes here; the caller verifies its signature.
    pub(super) async fn attestation_mirrored(
        &self,
        key: &str,
        manifest_digest: &str,
    ) -> Result<Option<Vec<u8>>> {
        for m in self.mirrors.iter().filter(|m| m.endpoint.resolve) {
            match m.store.attestation_here(key, manifest_digest).await {
                Ok(Some(envelope)) => return Ok(Some(envelope)),
                Ok(None) => self.skip(
                    m,
                    "not_found",
                    format!("no attestation of {manifest_digest}"),
                ),
                Err(e) => self.skip(m, mirror::reason(&e), e.to_string()),
            }
        }
        self.attestation_here(key, manifest_digest).await
    }
}

/// `(HOST[:PORT], REPOSITORY)` of `oci://HOST[:PORT]/REPOSITORY`, or what is wrong with it.
fn split_url(url: &str) -> std::result::Result<(&str, &str), &'static str> {
    let rest = url
        .strip_prefix("oci://")
        .ok_or("expected oci://HOST[:PORT]/REPOSITORY")?;
    let (registry, repository) = rest
        .split_once('/')
        .ok_or("no repository; expected oci://HOST[:PORT]/REPOSITORY")?;
    let repository = repository.trim_end_matches('/');
    if registry.is_empty() || repository.is_empty() {
        return Err("expected oci://HOST[:PORT]/REPOSITORY");
    }
    Ok((registry, repository))
}

/// `HOST[:PORT]` of an `oci://HOST[:PORT]/REPOSITORY` store URL; `None` for any other store.
pub fn registry_of(url: &str) -> Option<&str> {
    split_url(url.trim()).ok().map(|(registry, _)| registry)
}

/// A registry client speaking plain HTTP or HTTPS to `registry`.
fn client(http: bool, registry: &str) -> Result<Client> {
    let config = ClientConfig {
        protocol: if http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        connect_timeout: Some(std::time::Duration::from_secs(10)),
        ..Default::default()
    };
    Client::try_from(config).map_err(|e| {
        let message = format!("cannot build the HTTP client: {e}");
        Error::unavailable_because(format!("oci://{registry}"), message, e)
    })
}

/// Whether a stream error is the client's own end-of-blob digest check.
fn is_digest_error(err: &std::io::Error) -> bool {
    err.get_ref().is_some_and(|e| {
        e.downcast_ref::<oci_client::errors::DigestError>()
            .is_some()
    })
}

/// Whether the registry said "no such manifest/tag/repository".
fn not_found(err: &OciDistributionError) -> bool {
    match err {
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown
                    | OciErrorCode::NameUnknown
                    | OciErrorCode::NotFound
                    | OciErrorCode::BlobUnknown
            )
        }),
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::ServerError { code, .. } => *code == 404,
        _ => false,
    }
}

/// The error and its causes on one line ("error sending request: … : Connection refused").
fn source_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A file as a stream of chunks for a streaming push.
fn file_stream(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = oci_client::errors::Result<bytes::Bytes>> + Send + 'static {
    futures_util::stream::try_unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = bytes::BytesMut::with_capacity(PUSH_READ_BYTES);
        while buf.len() < PUSH_READ_BYTES {
            if file.read_buf(&mut buf).await? == 0 {
                break;
            }
        }
        if buf.is_empty() {
            Ok(None)
        } else {
            Ok(Some((buf.freeze(), file)))
        }
    })
}
