//! OpenSSF Model Signing bundles (PyPI `model-signing` 1.x, what model publishers and KServe's
//! signing proposal use): a Sigstore bundle (v0.3) whose DSSE envelope signs an in-toto statement
//! (predicate `https://model_signing/signature/v1.0`) that lists every file of the model
//! directory by name and sha256. Verified offline: key-based bundles against the trusted ECDSA
//! P-256 public keys, certificate-based ones by a chain from the signing certificate to a trusted
//! CA certificate, valid now, the leaf for code signing (extended key usage `codeSigning`).
//! Sigstore keyless bundles (a Fulcio certificate, a Rekor v2 entry and an RFC 3161 timestamp)
//! against a trusted root and the identities that may sign (`super::sigstore`). Pure: bytes,
//! keys and the time in; the signed file list, or what is wrong, out.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use kiln_crds::model_artifact::ModelArtifactSpec;
pub use rustls_pki_types::UnixTime;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, SubjectPublicKeyInfoDer};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Verifier;
use super::envelope::{PAYLOAD_TYPE, pae};
use super::sigstore::{self, KeylessTrust};
use super::statement::STATEMENT_TYPE;

/// The Sigstore bundle version `model_signing` writes.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The statement's predicate type.
pub const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), the OID's content octets.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// What a verified bundle signs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedFiles {
    /// The statement's subject: the model's name.
    pub model: String,
    /// Who signed: a trusted key's id, or the certificate's digest and its chain.
    pub signer: String,
    /// `(relative path, sha256 hex)` of every file, as listed.
    pub files: Vec<(String, String)>,
}

/// Who may sign model sources: P-256 public keys, CA certificates, or both (one PEM file).
#[derive(Clone, Debug, Default)]
pub struct SourceTrust {
    /// Trusted keys (cosign's signatures and key-based bundles).
    pub keys: Option<Verifier>,
    /// Trusted CA certificates (certificate-based bundles).
    pub roots: Vec<CertificateDer<'static>>,
    /// A Sigstore trusted root and identities (keyless bundles).
    pub keyless: Option<KeylessTrust>,
}

impl SourceTrust {
    /// Reads `PUBLIC KEY` (P-256) and `CERTIFICATE` blocks; at least one must be there.
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let has_keys = SubjectPublicKeyInfoDer::pem_slice_iter(pem)
            .next()
            .is_some();
        let keys = has_keys.then(|| Verifier::from_pem(pem)).transpose()?;
        let roots = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("a CERTIFICATE block is not PEM ({e})"))?;
        if keys.is_none() && roots.is_empty() {
            return Err("no PEM public key or CA certificate in it".into());
        }
        Ok(Self {
            keys,
            roots,
            keyless: None,
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    verification_material: Material,
    dsse_envelope: Option<Envelope>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Material {
    public_key: Option<serde_json::Value>,
    x509_certificate_chain: Option<Chain>,
    certificate: Option<RawCertificate>,
    #[serde(default)]
    tlog_entries: Vec<serde_json::Value>,
    timestamp_verification_data: Option<TimestampData>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TimestampData {
    #[serde(default)]
    rfc3161_timestamps: Vec<SignedTimestamp>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedTimestamp {
    signed_timestamp: String,
}

#[derive(Deserialize)]
struct Chain {
    certificates: Vec<RawCertificate>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCertificate {
    raw_bytes: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
    signatures: Vec<Signature>,
}

#[derive(Deserialize)]
struct Signature {
    sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    kind: String,
    subject: Vec<Subject>,
    predicate_type: String,
    predicate: Predicate,
}

#[derive(Deserialize)]
struct Subject {
    name: String,
    digest: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Predicate {
    serialization: Serialization,
    resources: Vec<Resource>,
}

/// Unknown fields are refused: they could change what the digests mean.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Serialization {
    method: String,
    hash_type: String,
    #[serde(default)]
    #[allow(dead_code)]
    allow_symlinks: bool,
    #[serde(default)]
    #[allow(dead_code)]
    ignore_paths: Vec<String>,
}

#[derive(Deserialize)]
struct Resource {
    name: String,
    algorithm: String,
    digest: String,
}

/// How a bundle is signed.
enum Signing {
    Key,
    Certificates(Vec<CertificateDer<'static>>),
    /// The Fulcio certificate, the Rekor entry and the RFC 3161 timestamps.
    Keyless(CertificateDer<'static>, Box<sigstore::Entry>, Vec<Vec<u8>>),
}

/// Verifies a bundle against `trust` at `now`; returns what it signs.
pub fn verify(bundle: &[u8], trust: &SourceTrust, now: UnixTime) -> Result<SignedFiles, String> {
    let bundle: Bundle = serde_json::from_slice(bundle)
        .map_err(|e| format!("not a Sigstore bundle as model_signing writes it: {e}"))?;
    if bundle.media_type != BUNDLE_MEDIA_TYPE {
        return Err(format!(
            "bundle mediaType {:?}, expected {BUNDLE_MEDIA_TYPE} (model-signing 1.x)",
            bundle.media_type
        ));
    }
    let material = material(bundle.verification_material)?;
    let envelope = bundle.dsse_envelope.ok_or(
        "the bundle holds no DSSE envelope (a message signature is not a model signature)",
    )?;
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(format!(
            "payloadType {:?}, expected {PAYLOAD_TYPE}",
            envelope.payload_type
        ));
    }
    let [signature] = envelope.signatures.as_slice() else {
        return Err(format!(
            "{} signatures in the envelope; a model signature has exactly one",
            envelope.signatures.len()
        ));
    };
    let payload = B64
        .decode(envelope.payload.as_bytes())
        .map_err(|e| format!("the payload is not base64 ({e})"))?;
    let sig = B64
        .decode(signature.sig.as_bytes())
        .map_err(|e| format!("the signature is not base64 ({e})"))?;
    let signed = pae(PAYLOAD_TYPE, &payload);
    let signer = match material {
        Signing::Key => signed_by_key(trust, &signed, &sig)?,
        Signing::Certificates(chain) => signed_by_certificate(trust, &chain, &signed, &sig, now)?,
        Signing::Keyless(leaf, entry, timestamps) => {
            let keyless = trust.keyless.as_ref().ok_or(
                "the bundle is signed keyless (Sigstore), and no Sigstore trust is configured (--source-trust-sigstore: a trusted root and the identities that may sign)",
            )?;
            let k = sigstore::Keyless {
                leaf,
                signature: &sig,
                signed: &signed,
                entry: *entry,
                timestamps,
            };
            sigstore::verify(&k, keyless)?
        }
    };
    let (model, files) = files(&payload)?;
    Ok(SignedFiles {
        model,
        signer,
        files,
    })
}

/// Which way the bundle is signed.
fn material(m: Material) -> Result<Signing, String> {
    if let Some(leaf) = m.certificate {
        return keyless(leaf, m.tlog_entries, m.timestamp_verification_data);
    }
    if !m.tlog_entries.is_empty() {
        return Err("the bundle has a transparency log entry but no Fulcio certificate: kiln checks logged signatures made keyless only".into());
    }
    match (m.public_key, m.x509_certificate_chain) {
        (Some(_), None) => Ok(Signing::Key),
        (None, Some(chain)) => {
            let certificates = chain
                .certificates
                .iter()
                .map(|c| B64.decode(c.raw_bytes.as_bytes()).map(CertificateDer::from))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("a certificate of the chain is not base64 ({e})"))?;
            if certificates.is_empty() {
                return Err("the certificate chain is empty".into());
            }
            Ok(Signing::Certificates(certificates))
        }
        _ => Err("the bundle must name either a public key or a certificate chain".into()),
    }
}

/// A keyless bundle's parts: one Rekor entry, its certificate, its timestamps.
fn keyless(
    leaf: RawCertificate,
    entries: Vec<serde_json::Value>,
    timestamps: Option<TimestampData>,
) -> Result<Signing, String> {
    let leaf = B64
        .decode(leaf.raw_bytes.as_bytes())
        .map_err(|e| format!("the certificate is not base64 ({e})"))?;
    let [entry] = <[serde_json::Value; 1]>::try_from(entries).map_err(|e| {
        format!(
            "{} transparency log entries; a keyless bundle has exactly one",
            e.len()
        )
    })?;
    let entry: sigstore::Entry = serde_json::from_value(entry)
        .map_err(|e| format!("the transparency log entry does not parse: {e}"))?;
    let timestamps = timestamps
        .map(|t| t.rfc3161_timestamps)
        .unwrap_or_default()
        .iter()
        .map(|t| B64.decode(t.signed_timestamp.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("a signed timestamp is not base64 ({e})"))?;
    Ok(Signing::Keyless(leaf.into(), Box::new(entry), timestamps))
}

fn signed_by_key(trust: &SourceTrust, signed: &[u8], sig: &[u8]) -> Result<String, String> {
    let keys = trust.keys.as_ref().ok_or(
        "the bundle is signed with a key, and no trusted source key is configured (a PUBLIC KEY in --source-trust-key)",
    )?;
    keys.signed_by(signed, sig)
        .map(|id| format!("key {id}"))
        .ok_or_else(|| {
            format!(
                "no trusted key made this signature (trusted key ids {:?})",
                keys.ids()
            )
        })
}

fn signed_by_certificate(
    trust: &SourceTrust,
    chain: &[CertificateDer<'static>],
    signed: &[u8],
    sig: &[u8],
    now: UnixTime,
) -> Result<String, String> {
    use webpki::ring as algs;
    if trust.roots.is_empty() {
        return Err("the bundle is signed with a certificate, and no trusted CA certificate is configured (a CERTIFICATE in --source-trust-key)".into());
    }
    let anchors = trust
        .roots
        .iter()
        .map(webpki::anchor_from_trusted_cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("a trusted CA certificate cannot be used: {e}"))?;
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or("the certificate chain is empty")?;
    let leaf_cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| format!("the signing certificate is not a certificate: {e}"))?;
    let supported = [
        algs::ECDSA_P256_SHA256,
        algs::ECDSA_P256_SHA384,
        algs::ECDSA_P384_SHA256,
        algs::ECDSA_P384_SHA384,
        algs::ED25519,
        algs::RSA_PKCS1_2048_8192_SHA256,
        algs::RSA_PKCS1_2048_8192_SHA384,
        algs::RSA_PKCS1_2048_8192_SHA512,
        algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
    ];
    leaf_cert
        .verify_for_usage(
            &supported,
            &anchors,
            intermediates,
            now,
            webpki::KeyUsage::required(CODE_SIGNING),
            None,
            None,
        )
        .map_err(|e| {
            format!(
                "the signing certificate does not chain to a trusted CA for code signing now: {e}"
            )
        })?;
    // The statement is signed with the leaf's key, hashed as its curve says.
    [algs::ECDSA_P256_SHA256, algs::ECDSA_P384_SHA384]
        .iter()
        .any(|alg| leaf_cert.verify_signature(*alg, signed, sig).is_ok())
        .then(|| {
            format!(
                "certificate sha256:{}",
                hex::encode(&Sha256::digest(leaf.as_ref())[..8])
            )
        })
        .ok_or_else(|| {
            "the signature is not the signing certificate's (ECDSA P-256 or P-384)".into()
        })
}

/// The statement's subject name and files, once it is the one model_signing writes and its
/// subject digest is the digest of the listed files' digests.
fn files(payload: &[u8]) -> Result<(String, Vec<(String, String)>), String> {
    let s: Statement = serde_json::from_slice(payload)
        .map_err(|e| format!("the signed payload is not a model signing statement: {e}"))?;
    if s.kind != STATEMENT_TYPE || s.predicate_type != PREDICATE_TYPE {
        return Err(format!(
            "statement {:?} with predicate {:?}; expected {STATEMENT_TYPE} with {PREDICATE_TYPE}",
            s.kind, s.predicate_type
        ));
    }
    let ser = &s.predicate.serialization;
    if ser.method != "files" || ser.hash_type != "sha256" {
        return Err(format!(
            "serialization {:?} hashed with {:?}: kiln checks files hashed with sha256 (model_signing's default); sign again without shards or another hash",
            ser.method, ser.hash_type
        ));
    }
    let [subject] = s.subject.as_slice() else {
        return Err(format!(
            "{} subjects; expected one, the model",
            s.subject.len()
        ));
    };
    let mut of_digests = Sha256::new();
    let mut files: Vec<(String, String)> = Vec::new();
    for r in &s.predicate.resources {
        let raw = hex::decode(&r.digest)
            .ok()
            .filter(|d| d.len() == 32 && r.digest == hex::encode(d))
            .ok_or_else(|| format!("file {:?}: digest {:?} is not sha256 hex", r.name, r.digest))?;
        if r.algorithm != "sha256" {
            return Err(format!(
                "file {:?} is hashed with {:?}, not sha256",
                r.name, r.algorithm
            ));
        }
        if files.iter().any(|(n, _)| *n == r.name) {
            return Err(format!("file {:?} is listed twice", r.name));
        }
        of_digests.update(&raw);
        files.push((r.name.clone(), r.digest.clone()));
    }
    if files.is_empty() {
        return Err("the statement lists no files".into());
    }
    if subject.digest.get("sha256").map(String::as_str) != Some(&hex::encode(of_digests.finalize()))
    {
        return Err("the subject's digest is not the digest of the listed files' digests".into());
    }
    Ok((subject.name.clone(), files))
}

/// The bundle in `spec.source.signature`: the base64 of a JSON object (`base64 -w0 model.sig`);
/// `None` for anything else (a cosign signature).
pub fn bundle_of(signature: &str) -> Option<Vec<u8>> {
    B64.decode(signature.trim().as_bytes())
        .ok()
        .filter(|b| b.first() == Some(&b'{'))
}

/// Whether `signed` lists exactly the files `model` declares: the source (by its digest; its
/// name in the signed directory is the publisher's) and every asset by name and digest. A listed
/// file the spec does not declare could not be checked; a declared one the bundle does not list
/// is not signed.
pub fn covers(signed: &SignedFiles, model: &ModelArtifactSpec) -> Result<(), String> {
    let mut source = false;
    let mut assets: BTreeMap<&str, (&str, bool)> = model
        .assets
        .iter()
        .map(|a| (a.name.as_str(), (a.sha256.as_str(), false)))
        .collect();
    for (name, digest) in &signed.files {
        if *digest == model.source.sha256 {
            source = true;
            continue;
        }
        let base = name.rsplit('/').next().unwrap_or(name);
        match assets.get_mut(base) {
            Some((declared, seen)) if declared == digest => *seen = true,
            Some((declared, _)) => {
                return Err(format!(
                    "{name} is signed with sha256 {digest}, but spec.assets[{base}] declares {declared}: the file changed since it was signed"
                ));
            }
            None => {
                return Err(format!(
                    "the bundle signs {name} (sha256 {digest}), which the ModelArtifact does not declare: declare it as an asset by that digest, or sign only the model's files"
                ));
            }
        }
    }
    if !source {
        return Err(format!(
            "the model source (sha256 {}) is not among the {} files the bundle signs for {:?}: the source changed since it was signed, or the bundle is another model's",
            model.source.sha256,
            signed.files.len(),
            signed.model
        ));
    }
    match assets.iter().find(|(_, (_, seen))| !seen) {
        Some((name, _)) => Err(format!(
            "spec.assets[{name}] is not among the files the bundle signs: every file of a signed model must be signed"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::attest::Signer;
    use serde_json::json;

    fn hex_of(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// A key-based bundle as model_signing 1.1.1 writes it, over `statement`, by a new key.
    fn bundle(statement: &serde_json::Value) -> (Vec<u8>, SourceTrust) {
        let (private, public) = Signer::generate().unwrap();
        let signer = Signer::from_pem(private.as_bytes()).unwrap();
        let payload = serde_json::to_vec(statement).unwrap();
        let sig = signer
            .pair
            .sign(
                &ring::rand::SystemRandom::new(),
                &pae(PAYLOAD_TYPE, &payload),
            )
            .unwrap();
        let bundle = json!({
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": "x"}, "tlogEntries": []},
            "dsseEnvelope": {"payload": B64.encode(&payload), "payloadType": PAYLOAD_TYPE,
                "signatures": [{"sig": B64.encode(sig.as_ref()), "keyid": ""}]},
        });
        let trust = SourceTrust::from_pem(public.as_bytes()).unwrap();
        (serde_json::to_vec(&bundle).unwrap(), trust)
    }

    fn statement(files: &[(&str, &[u8])]) -> serde_json::Value {
        let digests: Vec<Vec<u8>> = files
            .iter()
            .map(|(_, b)| Sha256::digest(b).to_vec())
            .collect();
        json!({
            "_type": STATEMENT_TYPE,
            "subject": [{"name": "m", "digest": {"sha256": hex_of(&digests.concat())}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": false, "ignore_paths": [".git"]},
                "resources": files.iter().map(|(n, b)| json!({"name": n, "algorithm": "sha256", "digest": hex_of(b)})).collect::<Vec<_>>(),
            }
        })
    }

    fn model(source: &[u8], assets: &[(&str, &[u8])]) -> ModelArtifactSpec {
        serde_json::from_value(json!({
            "source": {"uri": "file://m.onnx", "sha256": hex_of(source), "size": source.len()},
            "format": "onnx",
            "inputs": [{"name": "x", "dtype": "f32", "dims": [{"size": 1}]}],
            "assets": assets.iter().map(|(n, b)| json!({"name": n, "kind": "other", "uri": "file://a", "sha256": hex_of(b)})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    #[test]
    fn a_bundle_signs_exactly_the_source_and_every_asset() {
        let (b, trust) = bundle(&statement(&[("m.onnx", b"model"), ("w.bin", b"weights")]));
        let signed = verify(&b, &trust, UnixTime::now()).unwrap();
        assert_eq!(signed.files.len(), 2);
        assert!(signed.signer.starts_with("key "), "{}", signed.signer);
        covers(&signed, &model(b"model", &[("w.bin", b"weights")])).unwrap();
        for (spec, says) in [
            (
                model(b"model", &[("w.bin", b"other")]),
                "changed since it was signed",
            ),
            (model(b"model", &[]), "does not declare"),
            (
                model(b"model", &[("w.bin", b"weights"), ("t.json", b"{}")]),
                "spec.assets[t.json] is not among",
            ),
            (
                model(b"another", &[("w.bin", b"weights")]),
                "does not declare",
            ),
        ] {
            let e = covers(&signed, &spec).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let only = verify(
            &bundle(&statement(&[("w.bin", b"weights")])).0,
            &bundle(&statement(&[])).1,
            UnixTime::now(),
        );
        assert!(only.unwrap_err().contains("no trusted key"), "another key");
    }

    #[test]
    fn statements_model_signing_would_not_write_are_refused() {
        let mut shards = statement(&[("m", b"m")]);
        shards["predicate"]["serialization"]["method"] = json!("shards");
        let mut blake = statement(&[("m", b"m")]);
        blake["predicate"]["serialization"]["hash_type"] = json!("blake2");
        let mut extra = statement(&[("m", b"m")]);
        extra["predicate"]["serialization"]["shard_size"] = json!(1);
        let mut subject = statement(&[("m", b"m")]);
        subject["subject"][0]["digest"]["sha256"] = json!(hex_of(b"x"));
        for (s, says) in [
            (shards, "sha256"),
            (blake, "sha256"),
            (extra, "unknown field"),
            (subject, "subject's digest"),
            (statement(&[("m", b"m"), ("m", b"m")]), "listed twice"),
            (statement(&[]), "no files"),
        ] {
            let (b, trust) = bundle(&s);
            let e = verify(&b, &trust, UnixTime::now()).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn keyless_without_its_trust_and_foreign_bundles_are_refused_saying_what_to_use() {
        let (b, trust) = bundle(&statement(&[("m", b"m")]));
        let mut v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        let entry = json!({"logIndex": "1", "logId": {"keyId": "AA=="},
            "kindVersion": {"kind": "hashedrekord", "version": "0.0.2"}, "canonicalizedBody": ""});
        v["verificationMaterial"]["tlogEntries"] = json!([entry]);
        let e = verify(&serde_json::to_vec(&v).unwrap(), &trust, UnixTime::now()).unwrap_err();
        assert!(e.contains("no Fulcio certificate"), "{e}");
        v["verificationMaterial"]["certificate"] = json!({"rawBytes": "MAA="});
        let e = verify(&serde_json::to_vec(&v).unwrap(), &trust, UnixTime::now()).unwrap_err();
        assert!(e.contains("no Sigstore trust is configured"), "{e}");
        v["verificationMaterial"]["tlogEntries"] = json!([entry, entry]);
        let e = verify(&serde_json::to_vec(&v).unwrap(), &trust, UnixTime::now()).unwrap_err();
        assert!(e.contains("2 transparency log entries"), "{e}");
        v["mediaType"] = json!("application/vnd.dev.sigstore.bundle+json;version=0.1");
        let e = verify(&serde_json::to_vec(&v).unwrap(), &trust, UnixTime::now()).unwrap_err();
        assert!(e.contains("mediaType"), "{e}");
        assert_eq!(
            bundle_of("MEUCIQC35ahUUBdIncsLMP+tdJAXIjWF"),
            None,
            "a cosign signature"
        );
        assert!(bundle_of(&B64.encode(b"{\"mediaType\":1}")).is_some());
    }
}
