//! The DSSE envelope: signing a statement's JSON into one, and verifying one against the
//! trusted keys and the subject it must name. Pure: bytes in, bytes out.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

use super::keys::{Signer, Verifier};
use super::statement::{Statement, Subject};
use crate::{Error, Result};

/// DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Media type of a DSSE envelope (the OCI layer that carries it).
pub const ENVELOPE_MEDIA_TYPE: &str = "application/vnd.dsse.envelope.v1+json";
/// Largest envelope read from a store.
pub const MAX_ENVELOPE_BYTES: u64 = 1 << 20;
impl Signer {
    /// Signs `statement` into a DSSE envelope (JSON bytes).
    pub fn sign(&self, statement: &Statement) -> Result<Vec<u8>> {
        let payload =
            serde_json::to_vec(statement).map_err(|e| Error::unavailable_by("signer", e))?;
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
        serde_json::to_vec(&envelope).map_err(|e| Error::unavailable_by("signer", e))
    }
}

impl Verifier {
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
            B64.decode(s.sig.as_bytes())
                .is_ok_and(|sig| self.signed_by(&signed, &sig).is_some())
        });
        if !trusted {
            return Err(refuse(format!(
                "no signature by a trusted key (trusted key ids {:?}); the entry was not stored by a kiln publisher holding the signing key",
                self.ids()
            )));
        }
        let statement: Statement = serde_json::from_slice(&payload)
            .map_err(|e| refuse(format!("signed payload is not an in-toto statement: {e}")))?;
        statement.check(want).map_err(refuse)?;
        Ok(statement)
    }
}

impl Verifier {
    /// The id of the trusted key whose ECDSA P-256 / SHA-256 signature (DER) `sig` is over
    /// `signed`, if one made it.
    pub fn signed_by(&self, signed: &[u8], sig: &[u8]) -> Option<&str> {
        self.keys
            .iter()
            .find(|k| {
                UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &k.point)
                    .verify(signed, sig)
                    .is_ok()
            })
            .map(|k| k.id.as_str())
    }

    /// The trusted keys' ids, for messages.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
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
pub(super) fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use kiln_crds::BuildManifest;

    use super::*;
    use crate::Entry;
    use crate::attest::subject;

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
}
