//! Signed provenance for stored artifacts: an in-toto Statement (SLSA provenance v1 predicate)
//! naming the compile key, the artifact digest, the digest the entry is stored under, the input
//! digests, the builder image and the class, in a DSSE envelope signed with ECDSA P-256 /
//! SHA-256 (the key type `cosign generate-key-pair` makes; signatures are ASN.1 DER, keys PEM:
//! PKCS#8 private, SubjectPublicKeyInfo public).
//!
//! The trust chain: whoever holds the private key (the compile Jobs' publisher, from a
//! Kubernetes Secret) signs each entry it stores; the operator and the agents hold only the
//! public key and accept an entry only when its statement, signed by that key, names exactly the
//! compile key, manifest digest and artifact digest they are about to use. Rewriting an artifact
//! and its manifest together therefore no longer passes as a cache hit.
//! Pure: bytes in, bytes out; the store implementations keep the envelope beside the entry.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use kiln_crds::BuildManifest;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use serde::{Deserialize, Serialize};

use crate::staged::sha256_bytes;
use crate::{Entry, Error, Result};

/// DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Media type of a DSSE envelope (the OCI layer that carries it).
pub const ENVELOPE_MEDIA_TYPE: &str = "application/vnd.dsse.envelope.v1+json";
/// in-toto Statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// SLSA provenance predicate type.
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
/// kiln's build type inside the provenance.
pub const BUILD_TYPE: &str = "https://kiln.dev/compile/v1";
/// Largest envelope read from a store.
pub const MAX_ENVELOPE_BYTES: u64 = 1 << 20;
/// Subject name of the stored build manifest (the digest agents pull by).
const MANIFEST_SUBJECT: &str = "build-manifest";

/// DER prefix of a P-256 SubjectPublicKeyInfo (id-ecPublicKey, prime256v1, uncompressed point).
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The private key that signs what this process stores.
pub struct Signer {
    pair: EcdsaKeyPair,
    key_id: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// Reads a PKCS#8 PEM ECDSA P-256 private key.
    pub fn from_pem_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| key_error(path, e))?;
        Self::from_pem(&bytes).map_err(|e| key_error(path, e))
    }

    /// Parses a PKCS#8 PEM ECDSA P-256 private key.
    pub fn from_pem(pem: &[u8]) -> std::result::Result<Self, String> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem)
            .map_err(|e| format!("not a PKCS#8 PEM private key ({e})"))?;
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            der.secret_pkcs8_der(),
            &SystemRandom::new(),
        )
        .map_err(|e| format!("not an ECDSA P-256 key ({e})"))?;
        let key_id = key_id(pair.public_key().as_ref());
        Ok(Self { pair, key_id })
    }

    /// A fresh key pair: (PKCS#8 PEM private key, SubjectPublicKeyInfo PEM public key).
    pub fn generate() -> Result<(String, String)> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|e| Error::unavailable("key generation", e))?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|e| Error::unavailable("key generation", e))?;
        Ok((
            pem("PRIVATE KEY", pkcs8.as_ref()),
            pem("PUBLIC KEY", &spki(pair.public_key().as_ref())),
        ))
    }

    /// The verifier of this key's signatures.
    pub fn verifier(&self) -> Verifier {
        Verifier {
            keys: vec![TrustedKey {
                id: self.key_id.clone(),
                point: self.pair.public_key().as_ref().to_vec(),
            }],
        }
    }

    /// Signs `statement` into a DSSE envelope (JSON bytes).
    pub fn sign(&self, statement: &Statement) -> Result<Vec<u8>> {
        let payload = serde_json::to_vec(statement).map_err(|e| Error::unavailable("signer", e))?;
        let sig = self
            .pair
            .sign(&SystemRandom::new(), &pae(PAYLOAD_TYPE, &payload))
            .map_err(|e| Error::unavailable("signer", e))?;
        let envelope = Envelope {
            payload_type: PAYLOAD_TYPE.into(),
            payload: B64.encode(&payload),
            signatures: vec![Signature {
                keyid: self.key_id.clone(),
                sig: B64.encode(sig.as_ref()),
            }],
        };
        serde_json::to_vec(&envelope).map_err(|e| Error::unavailable("signer", e))
    }
}

/// One trusted public key.
#[derive(Clone, Debug)]
struct TrustedKey {
    id: String,
    /// Uncompressed P-256 point.
    point: Vec<u8>,
}

/// The public keys whose signatures are trusted.
#[derive(Clone, Debug)]
pub struct Verifier {
    keys: Vec<TrustedKey>,
}

/// What an entry's statement must name to be accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject<'a> {
    /// The compile key.
    pub compile_key: &'a str,
    /// `sha256:<hex>` the entry is stored (and pulled) under.
    pub manifest_digest: &'a str,
    /// Bare hex sha256 of the artifact.
    pub artifact_digest: &'a str,
}

impl Verifier {
    /// Reads one or more SubjectPublicKeyInfo PEM P-256 public keys from `path` (a file; several
    /// keys may follow each other, for rotation).
    pub fn from_pem_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| key_error(path, e))?;
        Self::from_pem(&bytes).map_err(|e| key_error(path, e))
    }

    /// Parses concatenated SubjectPublicKeyInfo PEM P-256 public keys.
    pub fn from_pem(pem: &[u8]) -> std::result::Result<Self, String> {
        let mut keys = Vec::new();
        for der in SubjectPublicKeyInfoDer::pem_slice_iter(pem) {
            let der = der.map_err(|e| format!("not a PEM public key ({e})"))?;
            let point = der
                .as_ref()
                .strip_prefix(&P256_SPKI_PREFIX[..])
                .filter(|p| p.len() == 65)
                .ok_or("not an ECDSA P-256 public key (SubjectPublicKeyInfo, uncompressed)")?;
            keys.push(TrustedKey {
                id: key_id(point),
                point: point.to_vec(),
            });
        }
        if keys.is_empty() {
            return Err("no PEM public key in it".into());
        }
        Ok(Self { keys })
    }

    /// Checks that `envelope` is a DSSE envelope signed by a trusted key whose statement names
    /// exactly `want`; returns the statement.
    pub fn verify(&self, envelope: &[u8], want: &Subject<'_>) -> Result<Statement> {
        let what = format!(
            "attestation of compile key {} (manifest {})",
            want.compile_key, want.manifest_digest
        );
        let refuse = |message: String| Error::SignatureInvalid {
            what: what.clone(),
            message,
        };
        let envelope: Envelope = serde_json::from_slice(envelope)
            .map_err(|e| refuse(format!("not a DSSE envelope: {e}")))?;
        if envelope.payload_type != PAYLOAD_TYPE {
            return Err(refuse(format!(
                "payloadType {:?}, expected {PAYLOAD_TYPE}",
                envelope.payload_type
            )));
        }
        let payload = B64
            .decode(envelope.payload.as_bytes())
            .map_err(|e| refuse(format!("payload is not base64: {e}")))?;
        let signed = pae(PAYLOAD_TYPE, &payload);
        let trusted = envelope.signatures.iter().any(|s| {
            let Ok(sig) = B64.decode(s.sig.as_bytes()) else {
                return false;
            };
            self.keys.iter().any(|k| {
                UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &k.point)
                    .verify(&signed, &sig)
                    .is_ok()
            })
        });
        if !trusted {
            let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
            return Err(refuse(format!(
                "no signature by a trusted key (trusted key ids {ids:?}); the entry was not stored by a kiln publisher holding the signing key"
            )));
        }
        let statement: Statement = serde_json::from_slice(&payload)
            .map_err(|e| refuse(format!("signed payload is not an in-toto statement: {e}")))?;
        statement.check(want).map_err(refuse)?;
        Ok(statement)
    }
}

impl Verifier {
    /// Checks a `cosign sign-blob --key` signature (`signature_b64`: base64 of an ASN.1 DER
    /// ECDSA P-256 signature over the blob's SHA-256) against the blob's digest, already
    /// verified against its bytes (`sha256_hex`), so a large source is not read twice. Returns
    /// the id of the trusted key that made it.
    pub fn verify_blob(
        &self,
        sha256_hex: &str,
        signature_b64: &str,
    ) -> std::result::Result<&str, String> {
        use p256::ecdsa::signature::hazmat::PrehashVerifier;
        use p256::ecdsa::{Signature, VerifyingKey};
        let digest = hex::decode(sha256_hex)
            .ok()
            .filter(|d| d.len() == 32)
            .ok_or_else(|| format!("{sha256_hex:?} is not a sha256"))?;
        let der = B64
            .decode(signature_b64.trim().as_bytes())
            .map_err(|e| format!("the signature is not base64 ({e})"))?;
        let signature = Signature::from_der(&der)
            .map_err(|_| "the signature is not an ASN.1 DER ECDSA P-256 signature".to_string())?;
        self.keys
            .iter()
            .find(|k| {
                VerifyingKey::from_sec1_bytes(&k.point)
                    .is_ok_and(|key| key.verify_prehash(&digest, &signature).is_ok())
            })
            .map(|k| k.id.as_str())
            .ok_or_else(|| {
                let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
                format!("no trusted source key made this signature (trusted key ids {ids:?})")
            })
    }
}

/// An in-toto Statement v1 with a SLSA provenance v1 predicate.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<ResourceDescriptor>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Provenance,
}

/// An in-toto ResourceDescriptor (name, digest, optional URI).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResourceDescriptor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default)]
    pub digest: BTreeMap<String, String>,
}

/// SLSA provenance v1 (the fields kiln fills).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    pub build_definition: BuildDefinition,
    pub run_details: RunDetails,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BuildDefinition {
    pub build_type: String,
    /// `compileKey` and `class` (label → value).
    pub external_parameters: serde_json::Value,
    /// Backend, version, precision.
    pub internal_parameters: serde_json::Value,
    /// The inputs by digest, and the builder image.
    pub resolved_dependencies: Vec<ResourceDescriptor>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunDetails {
    pub builder: Builder,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Builder {
    pub id: String,
}

impl Statement {
    /// The provenance of `entry`, built by `builder_image` (an image reference; its digest is
    /// recorded when the reference is pinned by one).
    pub fn for_entry(entry: &Entry, builder_image: Option<&str>) -> Self {
        let m: &BuildManifest = &entry.manifest;
        let mut deps: Vec<ResourceDescriptor> = m
            .inputs
            .iter()
            .map(|(name, digest)| ResourceDescriptor {
                name: Some(name.clone()),
                uri: None,
                digest: BTreeMap::from([("sha256".to_string(), digest.clone())]),
            })
            .collect();
        if let Some(image) = builder_image {
            deps.push(ResourceDescriptor {
                name: Some("builder-image".into()),
                uri: Some(format!("oci://{image}")),
                digest: image
                    .split_once("@sha256:")
                    .map(|(_, d)| BTreeMap::from([("sha256".to_string(), d.to_string())]))
                    .unwrap_or_default(),
            });
        }
        Self {
            type_: STATEMENT_TYPE.into(),
            subject: vec![
                ResourceDescriptor {
                    name: Some(m.compile_key.clone()),
                    uri: None,
                    digest: BTreeMap::from([("sha256".to_string(), m.artifact_digest.clone())]),
                },
                ResourceDescriptor {
                    name: Some(MANIFEST_SUBJECT.into()),
                    uri: None,
                    digest: BTreeMap::from([(
                        "sha256".to_string(),
                        bare(&entry.manifest_digest).to_string(),
                    )]),
                },
            ],
            predicate_type: PREDICATE_TYPE.into(),
            predicate: Provenance {
                build_definition: BuildDefinition {
                    build_type: BUILD_TYPE.into(),
                    external_parameters: serde_json::json!({
                        "compileKey": m.compile_key,
                        "class": m.class,
                    }),
                    internal_parameters: serde_json::json!({
                        "backend": m.backend,
                        "backendVersion": m.backend_version,
                        "precision": m.precision,
                        "toolVersion": m.tool_version,
                    }),
                    resolved_dependencies: deps,
                },
                run_details: RunDetails {
                    builder: Builder {
                        id: format!("https://kiln.dev/kiln-agent@{}", m.tool_version),
                    },
                },
            },
        }
    }

    /// The statement must be kiln provenance naming exactly `want`.
    fn check(&self, want: &Subject<'_>) -> std::result::Result<(), String> {
        if self.type_ != STATEMENT_TYPE || self.predicate_type != PREDICATE_TYPE {
            return Err(format!(
                "statement type {} / predicate {}, expected {STATEMENT_TYPE} / {PREDICATE_TYPE}",
                self.type_, self.predicate_type
            ));
        }
        if self.predicate.build_definition.build_type != BUILD_TYPE {
            return Err(format!(
                "build type {}, expected {BUILD_TYPE}",
                self.predicate.build_definition.build_type
            ));
        }
        let sha = |name: &str| {
            self.subject
                .iter()
                .find(|s| s.name.as_deref() == Some(name))
                .and_then(|s| s.digest.get("sha256"))
                .map(String::as_str)
        };
        let key = self
            .predicate
            .build_definition
            .external_parameters
            .get("compileKey")
            .and_then(|k| k.as_str());
        let mismatches: Vec<String> = [
            ("compile key", key, want.compile_key),
            ("artifact", sha(want.compile_key), want.artifact_digest),
            (
                "build manifest",
                sha(MANIFEST_SUBJECT),
                bare(want.manifest_digest),
            ),
        ]
        .into_iter()
        .filter(|(_, got, want)| !got.is_some_and(|g| g.eq_ignore_ascii_case(want)))
        .map(|(what, got, want)| format!("{what}: signed {got:?}, stored {want}"))
        .collect();
        if mismatches.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the signed statement is about something else ({}); the entry was replaced after it was signed",
                mismatches.join("; ")
            ))
        }
    }
}

/// The signing and verifying keys a process holds (either may be absent).
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// Signs what this process stores.
    pub signer: Option<std::sync::Arc<Signer>>,
    /// Checks what this process uses; `None` accepts unsigned entries (no keys configured).
    pub verifier: Option<Verifier>,
    /// Subjects already verified (entries are immutable by digest), so a reconcile loop does
    /// not fetch the same attestation again; bounded by [`VERIFIED_MEMO`].
    pub verified: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Verified subjects remembered before the memo starts over.
const VERIFIED_MEMO: usize = 65_536;

impl Trust {
    /// From optional key files; a signer alone also verifies its own signatures.
    pub fn from_files(signing_key: Option<&Path>, trust_keys: Option<&Path>) -> Result<Self> {
        let signer = signing_key
            .map(Signer::from_pem_file)
            .transpose()?
            .map(std::sync::Arc::new);
        let verifier = match (trust_keys, &signer) {
            (Some(path), _) => Some(Verifier::from_pem_file(path)?),
            (None, Some(s)) => Some(s.verifier()),
            (None, None) => None,
        };
        Ok(Self {
            signer,
            verifier,
            verified: Default::default(),
        })
    }

    /// A verifier only, of the keys in `public` (PEM).
    pub fn verifying(verifier: Verifier) -> Self {
        Self {
            signer: None,
            verifier: Some(verifier),
            verified: Default::default(),
        }
    }

    /// Checks the attestation `store` keeps for `want`; `Ok` without a verifier.
    pub async fn check(&self, store: &dyn crate::Store, want: &Subject<'_>) -> Result<()> {
        let Some(verifier) = &self.verifier else {
            return Ok(());
        };
        let memo = format!(
            "{} {} {}",
            want.compile_key, want.manifest_digest, want.artifact_digest
        );
        let lock = || self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if lock().contains(&memo) {
            return Ok(());
        }
        let envelope = store
            .attestation(want.compile_key, want.manifest_digest)
            .await?
            .ok_or_else(|| Error::SignatureInvalid {
                what: format!(
                    "entry of compile key {} (manifest {}) in {}",
                    want.compile_key,
                    want.manifest_digest,
                    store.location()
                ),
                message: "it has no attestation; it was not stored by a kiln publisher holding the signing key".into(),
            })?;
        verifier.verify(&envelope, want)?;
        let mut seen = lock();
        if seen.len() >= VERIFIED_MEMO {
            seen.clear();
        }
        seen.insert(memo);
        Ok(())
    }

    /// Publishes an artifact in the order that leaves no window: blobs and manifest by digest
    /// ([`crate::Store::stage`]), then this process's attestation of them, then the compile-key
    /// tag ([`crate::Store::tag`]). A lookup at any moment finds nothing or an attested entry;
    /// a publisher that dies part-way leaves only unreferenced content. Unless `replace`, an
    /// entry already under the key is returned untouched (the caller checks whose it is).
    pub async fn publish(
        &self,
        store: &dyn crate::Store,
        artifact: &Path,
        manifest: &BuildManifest,
        replace: bool,
        builder_image: Option<&str>,
    ) -> Result<Entry> {
        if !replace && let Some(entry) = store.lookup(&manifest.compile_key).await? {
            return Ok(entry);
        }
        let staged = store.stage(artifact, manifest).await?;
        self.sign(store, &staged, builder_image).await?;
        store.tag(&staged, replace).await
    }

    /// Signs `entry` and stores the attestation beside it; nothing without a signer.
    pub async fn sign(
        &self,
        store: &dyn crate::Store,
        entry: &Entry,
        builder_image: Option<&str>,
    ) -> Result<()> {
        let Some(signer) = &self.signer else {
            return Ok(());
        };
        let envelope = signer.sign(&Statement::for_entry(entry, builder_image))?;
        store
            .put_attestation(
                &entry.manifest.compile_key,
                &entry.manifest_digest,
                &envelope,
            )
            .await
    }
}

impl<'a> From<&'a crate::ArtifactRef> for Subject<'a> {
    /// What the attestation of the entry a node pulls by `r` must name.
    fn from(r: &'a crate::ArtifactRef) -> Self {
        Self {
            compile_key: &r.compile_key,
            manifest_digest: &r.manifest_digest,
            artifact_digest: &r.artifact_digest,
        }
    }
}

/// What the attestation of `entry` must name.
pub fn subject(entry: &Entry) -> Subject<'_> {
    Subject {
        compile_key: &entry.manifest.compile_key,
        manifest_digest: &entry.manifest_digest,
        artifact_digest: &entry.manifest.artifact_digest,
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload_type: String,
    payload: String,
    signatures: Vec<Signature>,
}

#[derive(Serialize, Deserialize)]
struct Signature {
    #[serde(default)]
    keyid: String,
    sig: String,
}

/// DSSE pre-authentication encoding.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

fn spki(point: &[u8]) -> Vec<u8> {
    let mut der = P256_SPKI_PREFIX.to_vec();
    der.extend_from_slice(point);
    der
}

/// Key id: sha256 of the SubjectPublicKeyInfo DER.
fn key_id(point: &[u8]) -> String {
    sha256_bytes(&spki(point))
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = B64.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn bare(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

fn key_error(path: &Path, err: impl std::fmt::Display) -> Error {
    Error::SignatureInvalid {
        what: format!("key file {}", path.display()),
        message: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry() -> Entry {
        let manifest = BuildManifest {
            manifest_version: kiln_crds::manifest::MANIFEST_VERSION,
            compile_key: "ab".repeat(32),
            artifact_digest: "cd".repeat(32),
            artifact_size: 3,
            media_type: "x".into(),
            backend: "tract".into(),
            backend_version: "1".into(),
            tool_version: "0.1.0".into(),
            precision: "fp32".into(),
            profiles: Default::default(),
            class: [("kubernetes.io/arch".to_string(), "amd64".to_string())].into(),
            host: Default::default(),
            flags: Default::default(),
            inputs: [("model".to_string(), "ef".repeat(32))].into(),
            outputs: vec![],
            unsupported_operators: vec![],
            parity_max_abs_error: None,
            compile_seconds: 1.0,
            converter_log: vec![],
            ..Default::default()
        };
        Entry {
            manifest,
            manifest_digest: format!("sha256:{}", "12".repeat(32)),
        }
    }

    fn keys() -> (Signer, Verifier) {
        let (private, public) = Signer::generate().unwrap();
        (
            Signer::from_pem(private.as_bytes()).unwrap(),
            Verifier::from_pem(public.as_bytes()).unwrap(),
        )
    }

    /// A blob signed as `cosign sign-blob --key` signs it (ECDSA P-256 over the SHA-256 of the
    /// bytes, ASN.1 DER, base64), by ring here; verified from the digest alone by p256.
    fn cosign_signed(blob: &[u8]) -> (Verifier, String, String) {
        use sha2::Digest;
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let public = pem("PUBLIC KEY", &spki(pair.public_key().as_ref()));
        let sig = B64.encode(pair.sign(&rng, blob).unwrap().as_ref());
        let digest = hex::encode(sha2::Sha256::digest(blob));
        (Verifier::from_pem(public.as_bytes()).unwrap(), digest, sig)
    }

    #[test]
    fn a_cosign_blob_signature_verifies_from_the_digest_only() {
        use sha2::Digest;
        let (verifier, digest, sig) = cosign_signed(b"model bytes");
        let id = verifier.verify_blob(&digest, &sig).expect("verifies");
        assert_eq!(id, verifier.keys[0].id);
        // Another blob's digest, another key, a flipped signature, junk: refused.
        let other = hex::encode(sha2::Sha256::digest(b"model bytez"));
        assert!(
            verifier
                .verify_blob(&other, &sig)
                .unwrap_err()
                .contains("no trusted source key")
        );
        let (stranger, _, _) = cosign_signed(b"model bytes");
        assert!(stranger.verify_blob(&digest, &sig).is_err());
        let mut raw = B64.decode(&sig).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        assert!(verifier.verify_blob(&digest, &B64.encode(&raw)).is_err());
        assert!(
            verifier
                .verify_blob(&digest, "!!")
                .unwrap_err()
                .contains("base64")
        );
        assert!(
            verifier
                .verify_blob(&digest, "AAAA")
                .unwrap_err()
                .contains("DER")
        );
        assert!(
            verifier
                .verify_blob("abc", &sig)
                .unwrap_err()
                .contains("not a sha256")
        );
    }

    #[test]
    fn a_signed_statement_verifies_only_for_its_own_subject_and_key() {
        let (signer, verifier) = keys();
        let e = entry();
        let envelope = signer
            .sign(&Statement::for_entry(&e, Some("r/agent@sha256:99")))
            .unwrap();
        let st = verifier.verify(&envelope, &subject(&e)).unwrap();
        assert!(
            st.predicate
                .build_definition
                .resolved_dependencies
                .iter()
                .any(|d| d.digest.get("sha256").map(String::as_str) == Some("99")),
            "builder image digest recorded"
        );
        // The same verifier derived from the private key agrees.
        assert!(signer.verifier().verify(&envelope, &subject(&e)).is_ok());

        let other_artifact = "ff".repeat(32);
        for want in [
            Subject {
                artifact_digest: &other_artifact,
                ..subject(&e)
            },
            Subject {
                manifest_digest: "sha256:00",
                ..subject(&e)
            },
            Subject {
                compile_key: &other_artifact,
                ..subject(&e)
            },
        ] {
            let err = verifier.verify(&envelope, &want).unwrap_err();
            assert_eq!(err.reason(), kiln_crds::FailureReason::SignatureInvalid);
            assert!(err.to_string().contains("something else"), "{err}");
        }
        let (_, stranger) = keys();
        let err = stranger.verify(&envelope, &subject(&e)).unwrap_err();
        assert!(
            err.to_string().contains("no signature by a trusted key"),
            "{err}"
        );
    }

    #[test]
    fn tampered_envelopes_are_refused() {
        let (signer, verifier) = keys();
        let e = entry();
        let envelope = signer.sign(&Statement::for_entry(&e, None)).unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&envelope).unwrap();
        // A payload re-encoded with another artifact digest keeps the old signature.
        let payload = B64.decode(v["payload"].as_str().unwrap()).unwrap();
        let forged = String::from_utf8(payload)
            .unwrap()
            .replace(&"cd".repeat(32), &"ee".repeat(32));
        v["payload"] = B64.encode(forged).into();
        let err = verifier
            .verify(&serde_json::to_vec(&v).unwrap(), &subject(&e))
            .unwrap_err();
        assert!(
            err.to_string().contains("no signature by a trusted key"),
            "{err}"
        );
        for junk in [
            &b"{}"[..],
            b"not json",
            b"{\"payloadType\":\"x\",\"payload\":\"\",\"signatures\":[]}",
        ] {
            assert_eq!(
                verifier.verify(junk, &subject(&e)).unwrap_err().reason(),
                kiln_crds::FailureReason::SignatureInvalid
            );
        }
    }

    #[test]
    fn keys_must_be_p256_pem() {
        assert!(Verifier::from_pem(b"").is_err());
        assert!(
            Signer::from_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
                .is_err()
        );
        let (_, a) = Signer::generate().unwrap();
        let (_, b) = Signer::generate().unwrap();
        let both = Verifier::from_pem(format!("{a}{b}").as_bytes()).unwrap();
        assert_eq!(both.keys.len(), 2, "rotation: several keys in one file");
    }
}
