//! A Sigstore trusted root (`trusted_root.json`, protobuf-specs `TrustedRoot` v0.1 in its JSON
//! form, as Sigstore's TUF repository, `cosign trusted-root create` and model_signing's
//! `--trust_config` carry it): the certificate authorities (Fulcio), the transparency logs
//! (Rekor), the CT logs and the timestamp authorities, each with the window it was valid for.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use der::Decode as _;
use ring::signature::{self as sig, UnparsedPublicKey, VerificationAlgorithm};
use rustls_pki_types::CertificateDer;
use serde::Deserialize;
use spki::SubjectPublicKeyInfoRef;

/// The media type prefix of a trusted root (any minor version of its JSON form).
pub const TRUSTED_ROOT_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.trustedroot+json";

/// Seconds since the Unix epoch.
pub type Seconds = u64;

/// `[start, end)` in seconds; `end` absent: still valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: Seconds,
    pub end: Option<Seconds>,
}

impl Window {
    pub fn contains(&self, t: Seconds) -> bool {
        self.start <= t && self.end.is_none_or(|end| t < end)
    }
}

/// A log's (Rekor's or a CT log's) key.
#[derive(Clone, Debug)]
pub struct LogKey {
    /// What the log's entries and checkpoints name it by.
    pub id: Vec<u8>,
    pub key: PublicKey,
    pub window: Window,
}

/// A certificate authority (Fulcio) or timestamp authority: its chain, leaf-most first, the last
/// certificate the root.
#[derive(Clone, Debug)]
pub struct Authority {
    pub chain: Vec<CertificateDer<'static>>,
    pub window: Window,
}

/// What a trusted root trusts.
#[derive(Clone, Debug, Default)]
pub struct TrustedRoot {
    pub tlogs: Vec<LogKey>,
    pub ctlogs: Vec<LogKey>,
    pub certificate_authorities: Vec<Authority>,
    pub timestamp_authorities: Vec<Authority>,
}

/// A public key and the one signature algorithm it is used with.
#[derive(Clone, Debug)]
pub struct PublicKey {
    algorithm: &'static dyn VerificationAlgorithm,
    /// The SubjectPublicKeyInfo's key bits.
    point: Vec<u8>,
}

impl PublicKey {
    /// `spki_der` with the algorithm protobuf-specs' `PublicKeyDetails` names.
    pub fn from_spki(spki_der: &[u8], details: &str) -> Result<Self, String> {
        let algorithm: &'static dyn VerificationAlgorithm = match details {
            "PKIX_ECDSA_P256_SHA_256" => &sig::ECDSA_P256_SHA256_ASN1,
            "PKIX_ECDSA_P384_SHA_384" => &sig::ECDSA_P384_SHA384_ASN1,
            "PKIX_ED25519" => &sig::ED25519,
            other => {
                return Err(format!(
                    "key type {other:?}: kiln checks PKIX_ECDSA_P256_SHA_256, PKIX_ECDSA_P384_SHA_384 and PKIX_ED25519 keys"
                ));
            }
        };
        let spki = SubjectPublicKeyInfoRef::from_der(spki_der)
            .map_err(|e| format!("not a DER SubjectPublicKeyInfo: {e}"))?;
        let point = spki
            .subject_public_key
            .as_bytes()
            .ok_or("the public key's bit string is not whole bytes")?
            .to_vec();
        Ok(Self { algorithm, point })
    }

    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(self.algorithm, &self.point)
            .verify(message, signature)
            .is_ok()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RootJson {
    media_type: String,
    #[serde(default)]
    tlogs: Vec<LogJson>,
    #[serde(default)]
    certificate_authorities: Vec<AuthorityJson>,
    #[serde(default)]
    ctlogs: Vec<LogJson>,
    #[serde(default)]
    timestamp_authorities: Vec<AuthorityJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogJson {
    public_key: KeyJson,
    log_id: LogIdJson,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyJson {
    raw_bytes: String,
    key_details: String,
    valid_for: Option<WindowJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogIdJson {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthorityJson {
    cert_chain: ChainJson,
    valid_for: Option<WindowJson>,
}

#[derive(Deserialize)]
struct ChainJson {
    certificates: Vec<RawJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawJson {
    raw_bytes: String,
}

#[derive(Deserialize)]
struct WindowJson {
    start: Option<String>,
    end: Option<String>,
}

impl TrustedRoot {
    /// Parses the JSON form; every key and certificate must decode.
    pub fn from_json(value: serde_json::Value) -> Result<Self, String> {
        let root: RootJson = serde_json::from_value(value)
            .map_err(|e| format!("not a Sigstore trusted root: {e}"))?;
        if !root.media_type.starts_with(TRUSTED_ROOT_MEDIA_TYPE) {
            return Err(format!(
                "mediaType {:?}, expected {TRUSTED_ROOT_MEDIA_TYPE};version=0.1",
                root.media_type
            ));
        }
        let logs = |logs: Vec<LogJson>, what: &str| {
            logs.into_iter()
                .enumerate()
                .map(|(i, l)| log_key(l).map_err(|e| format!("{what}[{i}]: {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        let authorities = |list: Vec<AuthorityJson>, what: &str| {
            list.into_iter()
                .enumerate()
                .map(|(i, a)| authority(a).map_err(|e| format!("{what}[{i}]: {e}")))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            tlogs: logs(root.tlogs, "tlogs")?,
            ctlogs: logs(root.ctlogs, "ctlogs")?,
            certificate_authorities: authorities(
                root.certificate_authorities,
                "certificateAuthorities",
            )?,
            timestamp_authorities: authorities(root.timestamp_authorities, "timestampAuthorities")?,
        })
    }
}

fn log_key(l: LogJson) -> Result<LogKey, String> {
    let der = B64
        .decode(l.public_key.raw_bytes.as_bytes())
        .map_err(|e| format!("publicKey.rawBytes is not base64 ({e})"))?;
    let id = B64
        .decode(l.log_id.key_id.as_bytes())
        .map_err(|e| format!("logId.keyId is not base64 ({e})"))?;
    Ok(LogKey {
        id,
        key: PublicKey::from_spki(&der, &l.public_key.key_details)?,
        window: window(l.public_key.valid_for)?,
    })
}

fn authority(a: AuthorityJson) -> Result<Authority, String> {
    let chain = a
        .cert_chain
        .certificates
        .iter()
        .map(|c| B64.decode(c.raw_bytes.as_bytes()).map(CertificateDer::from))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("a certificate is not base64 ({e})"))?;
    if chain.is_empty() {
        return Err("certChain holds no certificate".into());
    }
    Ok(Authority {
        chain,
        window: window(a.valid_for)?,
    })
}

fn window(w: Option<WindowJson>) -> Result<Window, String> {
    let w = w.ok_or("no validFor")?;
    let start = w.start.ok_or("validFor has no start")?;
    Ok(Window {
        start: seconds(&start)?,
        end: w.end.as_deref().map(seconds).transpose()?,
    })
}

/// An RFC 3339 time (protobuf's JSON Timestamp) as Unix seconds.
fn seconds(text: &str) -> Result<Seconds, String> {
    let t: jiff::Timestamp = text
        .parse()
        .map_err(|e| format!("{text:?} is not an RFC 3339 time ({e})"))?;
    Seconds::try_from(t.as_second()).map_err(|_| format!("{text:?} is before 1970"))
}
