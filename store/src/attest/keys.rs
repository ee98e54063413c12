//! The keys: the ECDSA P-256 private key that signs (PKCS#8 PEM) and the public keys trusted
//! (SubjectPublicKeyInfo PEM, several for rotation), and the check of a `cosign sign-blob`
//! signature over a source's digest. Reads key files; nothing else.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};

use crate::staged::sha256_bytes;
use crate::{Error, Result};

/// DER prefix of a P-256 SubjectPublicKeyInfo (id-ecPublicKey, prime256v1, uncompressed point).
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The private key that signs what this process stores.
pub struct Signer {
    pub(super) pair: EcdsaKeyPair,
    pub(super) key_id: String,
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
}

/// One trusted public key.
#[derive(Clone, Debug)]
pub(super) struct TrustedKey {
    pub(super) id: String,
    /// Uncompressed P-256 point.
    pub(super) point: Vec<u8>,
}

/// The public keys whose signatures are trusted.
#[derive(Clone, Debug)]
pub struct Verifier {
    pub(super) keys: Vec<TrustedKey>,
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

pub(super) fn spki(point: &[u8]) -> Vec<u8> {
    let mut der = P256_SPKI_PREFIX.to_vec();
    der.extend_from_slice(point);
    der
}

/// Key id: sha256 of the SubjectPublicKeyInfo DER.
pub(super) fn key_id(point: &[u8]) -> String {
    sha256_bytes(&spki(point))
}

pub(super) fn pem(label: &str, der: &[u8]) -> String {
    let b64 = B64.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
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
