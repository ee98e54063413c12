//! The compile step shared by `local` and the compile Job: fetch and verify every input, derive
//! the compile key, reuse what the store holds, otherwise compile, check parity against the
//! fixtures, and store artifact and manifest atomically.
//! Touches the blob cache (through the fetcher), a scratch directory of the store and the
//! store; runs the backend.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_crds::BuildManifest;
use kiln_crds::FailureReason;
use kiln_crds::class::ClassFacts;
use kiln_crds::kiln_node::HardwareFacts;
use kiln_crds::model_artifact::ModelArtifactSpec;
use kiln_crds::model_artifact::ModelFormat;
use kiln_store::attest::model_signing::{self, SourceTrust};
use kiln_store::attest::sigstore::KeylessTrust;
use kiln_store::attest::{Trust, subject};
use kiln_store::{Entry, Store};

use crate::backend::Builder;
use crate::metrics::Metrics;
use crate::pipeline::fetch::{Fetcher, Wanted};
use crate::pipeline::fixtures::FixtureFile;
use crate::pipeline::spec::Spec;
use kiln_node_core::error::{Error, Result};

pub(crate) use crate::pipeline::compile::key_with;
pub use crate::pipeline::compile::{Inputs, Target, compile, compile_isolated};

/// Who may sign model sources: `spec.source.signature`, as `cosign sign-blob --key` makes it or
/// an OpenSSF Model Signing bundle (`model_signing sign key|certificate|sigstore`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SourceTrustArgs {
    /// PEM file of the public keys (P-256, a cosign.pub; several for rotation) and CA
    /// certificates whose signatures on model sources are trusted: keys for cosign signatures
    /// and key-based model signing bundles, CA certificates for certificate-based bundles. A
    /// source with `spec.source.signature` is refused without one.
    #[arg(long, env = "KILN_SOURCE_TRUST_KEY")]
    pub source_trust_key: Option<PathBuf>,
    /// JSON file of the Sigstore trust for keyless model signing bundles (`model_signing sign
    /// sigstore`): `{"trustedRoot": <trusted_root.json>, "identities": [{"issuer": URL,
    /// "subject": EMAIL or URI}]}`. Of this file and --source-trust-key, one that does not
    /// exist counts as not configured when the other does (a trust Secret may hold either).
    #[arg(long, env = "KILN_SOURCE_TRUST_SIGSTORE")]
    pub source_trust_sigstore: Option<PathBuf>,
    /// Refuse a model source that has no `spec.source.signature`.
    #[arg(long, env = "KILN_REQUIRE_SOURCE_SIGNATURE")]
    pub require_source_signature: bool,
}

/// The checked form of [`SourceTrustArgs`].
#[derive(Default)]
pub struct SourcePolicy {
    trust: Option<SourceTrust>,
    required: bool,
}

impl SourceTrustArgs {
    /// Reads the keys, CA certificates and Sigstore trust; a malformed file, or none of those
    /// configured existing, is `SignatureInvalid` naming it.
    pub fn load(&self) -> Result<SourcePolicy> {
        let pem = self.source_trust_key.as_deref();
        let sigstore = self.source_trust_sigstore.as_deref();
        let mut trust = read_trust_file(pem, sigstore)?
            .map(|(p, b)| SourceTrust::from_pem(&b).map_err(|m| untrusted(p, m)))
            .transpose()?;
        if let Some((p, b)) = read_trust_file(sigstore, pem)? {
            let keyless = KeylessTrust::from_json(&b).map_err(|m| untrusted(p, m))?;
            trust.get_or_insert_with(SourceTrust::default).keyless = Some(keyless);
        }
        Ok(SourcePolicy {
            trust,
            required: self.require_source_signature,
        })
    }
}

/// The bytes of trust file `path`, if one is named; one named but absent is an error only when
/// `other` is absent too (a trust Secret may hold either file).
fn read_trust_file<'a>(
    path: Option<&'a Path>,
    other: Option<&Path>,
) -> Result<Option<(&'a Path, Vec<u8>)>> {
    path.filter(|p| p.exists() || !other.is_some_and(Path::exists))
        .map(|p| {
            std::fs::read(p)
                .map(|b| (p, b))
                .map_err(|e| untrusted(p, e.to_string()))
        })
        .transpose()
}

fn untrusted(path: &Path, message: String) -> Error {
    Error::SignatureInvalid {
        what: format!("source trust file {}", path.display()),
        message,
        source: None,
    }
}

impl SourcePolicy {
    /// Checks the signature of `model`'s source, whose bytes already hashed to its sha256;
    /// returns who signed it (`None`: unsigned, and allowed). A model signing bundle must sign
    /// exactly the source and every asset, by their declared digests.
    pub fn check(&self, model: &ModelArtifactSpec) -> Result<Option<String>> {
        let source = &model.source;
        let refuse = |message: String| Error::SignatureInvalid {
            what: format!("model source {}", source.uri),
            message,
            source: None,
        };
        let Some(signature) = &source.signature else {
            return if self.required {
                Err(refuse(
                    "spec.source.signature is required here (--require-source-signature); sign the \
                     source with cosign sign-blob --key (or the model with model_signing) and put \
                     the signature in the ModelArtifact"
                        .into(),
                ))
            } else {
                Ok(None)
            };
        };
        let trust = self.trust.as_ref().ok_or_else(|| {
            refuse(
                "spec.source.signature is set but no trusted source key is configured to check \
                 it (--source-trust-key / KILN_SOURCE_TRUST_KEY, or --source-trust-sigstore for \
                 keyless bundles)"
                    .into(),
            )
        })?;
        if let Some(bundle) = model_signing::bundle_of(signature) {
            let now = model_signing::UnixTime::now();
            let signed = model_signing::verify(&bundle, trust, now)
                .map_err(|m| refuse(format!("the model signing bundle does not verify: {m}")))?;
            model_signing::covers(&signed, model).map_err(refuse)?;
            return Ok(Some(signed.signer));
        }
        let keys = trust.keys.as_ref().ok_or_else(|| {
            refuse("a cosign signature needs a trusted PUBLIC KEY in --source-trust-key".into())
        })?;
        keys.verify_blob(&source.sha256, signature)
            .map(|id| Some(format!("key {id}")))
            .map_err(|m| refuse(format!("spec.source.signature does not verify: {m}")))
    }
}

/// Fetches and verifies the source, every asset and the warmup fixture; fails closed. `sources`
/// checks the source's signature (`None`: not checked here — an `exec` Job's compiler container,
/// whose result the publisher rebuilds its trust on).
pub async fn fetch_inputs(
    spec: &Spec,
    fetcher: &Fetcher,
    sources: Option<&SourcePolicy>,
) -> Result<Inputs> {
    let m = &spec.model.spec;
    // Every backend but llamacpp reads the source as ONNX (exec's compiler gets it as
    // model.onnx, and its declared interface is checked against it), llamacpp as GGUF, iree
    // also as MLIR: bytes declared as anything else are not built as if they were either.
    kiln_crds::formats::accepts(spec.target.spec.backend.kind, m.format)
        .map_err(Error::InvalidSpec)?;
    let Some(staged_name) = staged_name(m.format) else {
        let format = m.format.as_str();
        return Err(Error::InvalidSpec(format!(
            "spec.format is {format}, but kiln-agent builds ONNX, GGUF and MLIR (StableHLO) sources only; export the model to ONNX and declare format: onnx"
        )));
    };
    let model = fetcher
        .fetch(&Wanted {
            what: "model source",
            uri: &m.source.uri,
            sha256: &m.source.sha256,
            size: u64::try_from(m.source.size).ok(),
        })
        .await?;
    if let Some(policy) = sources
        && let Some(signer) = policy.check(m)?
    {
        tracing::info!(uri = %m.source.uri, signer, "model source signature verified");
    }
    let mut assets = BTreeMap::new();
    for asset in &m.assets {
        let what = format!("asset {}", asset.name);
        let path = fetcher
            .fetch(&Wanted {
                what: &what,
                uri: &asset.uri,
                sha256: &asset.sha256,
                size: asset.size.and_then(|s| u64::try_from(s).ok()),
            })
            .await?;
        assets.insert(asset.name.clone(), path);
    }
    let VerifiedFixture {
        file: fixture,
        sha256: fixture_digest,
        path: fixture_path,
    } = fetch_fixture(spec, fetcher).await?;
    let staged = stage_model(fetcher.cache_dir(), &model, staged_name, &assets)?;
    Ok(Inputs {
        model: staged.path().join(staged_name),
        _staged: Some(staged),
        assets,
        fixture,
        fixture_digest,
        fixture_path,
    })
}

/// The name a source of `format` is staged under, which the backends read it by: `model.onnx`
/// for ONNX and GGUF (as before MLIR was taken), `model.mlir` and `model.stablehlo` for what
/// IREE compiles (`backend::iree::source`); `None` for a format kiln does not build.
fn staged_name(format: ModelFormat) -> Option<&'static str> {
    match format {
        ModelFormat::Onnx | ModelFormat::Gguf => Some("model.onnx"),
        ModelFormat::Mlir => Some(crate::backend::iree::source::MLIR),
        ModelFormat::Stablehlo => Some(crate::backend::iree::source::STABLEHLO),
        ModelFormat::TorchExport | ModelFormat::Safetensors => None,
    }
}

/// A private directory holding the model under `name` and each asset under its declared name
/// (hard links into the blob cache where possible, copies otherwise).
fn stage_model(
    cache: &Path,
    model: &Path,
    name: &str,
    assets: &BTreeMap<String, PathBuf>,
) -> Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(".model-")
        .tempdir_in(cache)
        .map_err(|e| Error::store(cache, e))?;
    let place = |from: &Path, name: &str| {
        let to = dir.path().join(name);
        std::fs::hard_link(from, &to)
            .or_else(|_| std::fs::copy(from, &to).map(|_| ()))
            .map_err(|e| Error::store(&to, e))
    };
    place(model, name)?;
    for (asset, path) in assets {
        let single = Path::new(asset)
            .components()
            .eq([std::path::Component::Normal(asset.as_ref())]);
        if !single || asset == name {
            return Err(Error::InvalidSpec(format!(
                "spec.assets[{asset}]: an asset name must be a plain file name other than {name} (the model's external data refers to assets by it)"
            )));
        }
        place(path, asset)?;
    }
    Ok(dir)
}

/// A warmup fixture, fetched and verified.
#[derive(Clone, Debug)]
pub struct VerifiedFixture {
    /// The parsed file.
    pub file: FixtureFile,
    /// Its sha256, as the ModelArtifact declares it.
    pub sha256: String,
    /// The verified file in the blob cache.
    pub path: PathBuf,
}

/// Fetches, verifies and parses the warmup fixture version the target names. The node agent
/// runs exactly this before every warmup.
pub async fn fetch_fixture(spec: &Spec, fetcher: &Fetcher) -> Result<VerifiedFixture> {
    let m = &spec.model.spec;
    let version = &spec.target.spec.warmup.fixture_version;
    let declared = m
        .fixture(version)
        .ok_or_else(|| Error::InvalidSpec(format!("no fixture version {version:?}")))?;
    let what = format!("fixture {version}");
    let path = fetcher
        .fetch(&Wanted {
            what: &what,
            uri: &declared.uri,
            sha256: &declared.sha256,
            size: None,
        })
        .await?;
    let bytes = std::fs::read(&path).map_err(|e| Error::store(&path, e))?;
    let fixture = FixtureFile::parse(&bytes).map_err(|m| {
        Error::InvalidSpec(format!(
            "{what} ({}): {m}; make fixture files with kiln-agent fixtures",
            declared.uri
        ))
    })?;
    if &fixture.version != version {
        return Err(Error::InvalidSpec(format!(
            "fixture file {} says version {:?}, the ModelArtifact lists it as {version:?}",
            declared.uri, fixture.version
        )));
    }
    Ok(VerifiedFixture {
        file: fixture,
        sha256: declared.sha256.clone(),
        path,
    })
}

/// The compile key of `spec` for a class.
pub fn key_for(spec: &Spec, builder: &Builder, class: &ClassFacts) -> String {
    key_with(spec, &builder.identity(), class)
}

/// An artifact in the store, with whether this run found it there.
#[derive(Clone, Debug)]
pub struct Built {
    /// The stored entry.
    pub entry: Entry,
    /// The store already held the key; nothing was compiled.
    pub reused: bool,
}

/// Who signs what this run stores and which signatures it trusts, and the builder image it
/// records in the provenance.
#[derive(Clone, Debug, Default)]
pub struct Publish {
    /// Keys.
    pub trust: Trust,
    /// The image this compile runs in (from the Task), if known.
    pub builder_image: Option<String>,
}

/// Compiles unless the store already holds the key under a trusted attestation, and stores (and
/// signs) the result. A stored entry whose attestation does not verify is never reused: it is
/// compiled again and replaced. The compile itself runs on this thread via `block_in_place`
/// (a multi-threaded runtime is required).
#[allow(clippy::too_many_arguments)]
pub async fn compile_or_reuse(
    spec: &Spec,
    inputs: &Inputs,
    builder: &Builder,
    class: &ClassFacts,
    host: &HardwareFacts,
    store: &dyn Store,
    publish: &Publish,
    metrics: &Metrics,
) -> Result<Built> {
    let key = key_for(spec, builder, class);
    let mut replace = false;
    let found = match store.lookup(&key).await {
        Ok(found) => found,
        // A stored entry whose build manifest does not match its digest (flipped or truncated
        // in the registry's storage) is no entry: build the key again and replace it.
        Err(e) if e.reason() == FailureReason::HashMismatch => {
            tracing::warn!(compile_key = %key, error = %e, "the stored entry is corrupt; compiling and replacing it");
            metrics.verify_failure(e.reason());
            replace = true;
            None
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(entry) = found {
        match publish.trust.check(store, &subject(&entry)).await {
            Ok(()) => {
                tracing::info!(compile_key = %key, digest = %entry.manifest.artifact_digest, manifest = %entry.manifest_digest, store = %store.location(), "artifact already in store; not compiling");
                metrics.compile(builder.name(), "cached", None);
                return Ok(Built {
                    entry,
                    reused: true,
                });
            }
            Err(e) if e.reason() == FailureReason::SignatureInvalid => {
                tracing::warn!(compile_key = %key, error = %e, "refusing the stored entry; compiling and replacing it");
                metrics.verify_failure(e.reason());
                replace = true;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let started = Instant::now();
    let scratch = store.scratch()?;
    let out = scratch.path().join("artifact");
    let target = Target {
        class,
        host,
        out: &out,
        key: &key,
    };
    let result = tokio::task::block_in_place(|| match builder {
        Builder::One(backend) => compile_isolated(spec, inputs, backend.as_ref(), &target, false)
            .map(|(m, _)| (m, vec![])),
        Builder::Auto(auto) => {
            crate::pipeline::candidates::compile_auto(spec, inputs, auto, &target)
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    match &result {
        Ok(_) => metrics.compile(builder.name(), "success", Some(seconds)),
        Err(_) => metrics.compile(builder.name(), "failure", Some(seconds)),
    }
    let (mut manifest, alternates) = result?;
    publish_alternates(&mut manifest, alternates, store, publish).await;
    let entry = publish_entry(&out, &manifest, replace, store, publish).await?;
    for skip in store.preheat(&entry.artifact_ref()).await {
        tracing::warn!(mirror = %skip.mirror, reason = skip.reason, message = %skip.message, "registry mirror not preheated; its nodes fill it as they pull");
    }
    Ok(Built {
        entry,
        reused: false,
    })
}

/// Stores an artifact and its manifest, signed, in the order that leaves no window (blobs and
/// manifest by digest, attestation, tag: `Trust::publish`); when another compile of the key
/// stored first, its entry is used only if its attestation holds.
async fn publish_entry(
    artifact: &Path,
    manifest: &BuildManifest,
    replace: bool,
    store: &dyn Store,
    publish: &Publish,
) -> Result<Entry> {
    let entry = publish
        .trust
        .publish(
            store,
            artifact,
            manifest,
            replace,
            publish.builder_image.as_deref(),
        )
        .await?;
    // Another compile of the key stored first: its entry is used only if its attestation holds.
    if entry.manifest != *manifest {
        publish.trust.check(store, &subject(&entry)).await?;
    }
    tracing::info!(compile_key = %manifest.compile_key, digest = %entry.manifest.artifact_digest, manifest = %entry.manifest_digest, store = %store.location(), signed = publish.trust.signer.is_some(), "stored artifact");
    Ok(entry)
}

/// `backend.kind: auto`: stores every passing candidate besides the kept one as its own entry
/// (under the key a target naming that engine would have) and records where in the kept
/// manifest's selection, for `fallback.policy: NextCandidate`. One that cannot be stored is
/// left out (logged): the class's own artifact does not depend on it.
async fn publish_alternates(
    manifest: &mut BuildManifest,
    alternates: Vec<crate::pipeline::candidates::Alternate>,
    store: &dyn Store,
    publish: &Publish,
) {
    for alt in alternates {
        match publish_entry(&alt.artifact, &alt.manifest, false, store, publish).await {
            Ok(entry) => {
                if let Some(c) = manifest
                    .selection
                    .as_mut()
                    .and_then(|s| s.candidates.get_mut(alt.index))
                {
                    c.compile_key = Some(entry.manifest.compile_key.clone());
                    c.artifact_digest = Some(entry.manifest.artifact_digest.clone());
                    c.manifest_digest = Some(entry.manifest_digest.clone());
                }
            }
            Err(e) => {
                tracing::warn!(compile_key = %alt.manifest.compile_key, error = %e, "an engine candidate could not be stored; NextCandidate will not offer it")
            }
        }
    }
}
