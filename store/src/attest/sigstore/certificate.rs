//! The Fulcio certificate of a keyless signature: it chains to a trusted certificate authority
//! for code signing at the signing time, carries a signed certificate timestamp from a trusted
//! CT log (RFC 6962 precertificate SCT), and names who signed: the subject alternative name
//! (an email address or a URI) and the OIDC issuer that vouched for it (Fulcio's extension
//! 1.3.6.1.4.1.57264.1.8, or the older 1.3.6.1.4.1.57264.1.1).

use der::asn1::Utf8StringRef;
use der::{Decode as _, Encode as _, oid::ObjectIdentifier};
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest, Sha256};
use webpki::ring as algs;
use x509_cert::Certificate;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::sct::SignedCertificateTimestampList;

use super::root::{Authority, LogKey, Seconds};

const SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const SCT_LIST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.11129.2.4.2");
const ISSUER_V2: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.8");
const ISSUER_V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.1");
/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), the OID's content octets.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// Who a Fulcio certificate says signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The OIDC issuer's URL.
    pub issuer: String,
    /// The subject alternative name: an email address or a URI.
    pub subject: String,
}

/// The identity `leaf` names.
pub fn identity(leaf: &[u8]) -> Result<Identity, String> {
    let cert = Certificate::from_der(leaf).map_err(|e| format!("not a certificate: {e}"))?;
    let extension = |oid| {
        cert.tbs_certificate
            .extensions
            .iter()
            .flatten()
            .find(|e| e.extn_id == oid)
            .map(|e| e.extn_value.as_bytes())
    };
    let issuer = match (extension(ISSUER_V2), extension(ISSUER_V1)) {
        (Some(v2), _) => Utf8StringRef::from_der(v2)
            .map(|s| s.as_str().to_owned())
            .map_err(|e| format!("the OIDC issuer extension is not a UTF8String: {e}"))?,
        (None, Some(v1)) => String::from_utf8(v1.to_vec())
            .map_err(|_| "the OIDC issuer extension is not UTF-8".to_string())?,
        (None, None) => {
            return Err("the certificate names no OIDC issuer (not issued by Fulcio)".into());
        }
    };
    let san = extension(SAN).ok_or("the certificate has no subject alternative name")?;
    let names = SubjectAltName::from_der(san)
        .map_err(|e| format!("the subject alternative name does not decode: {e}"))?;
    let subject = names
        .0
        .iter()
        .find_map(|n| match n {
            GeneralName::Rfc822Name(email) => Some(email.as_str().to_owned()),
            GeneralName::UniformResourceIdentifier(uri) => Some(uri.as_str().to_owned()),
            _ => None,
        })
        .ok_or("the subject alternative name is neither an email address nor a URI")?;
    Ok(Identity { issuer, subject })
}

/// `leaf` chains to one of `cas` for code signing at `time`, within that CA's window; returns
/// the certificate that issued it (the first of that CA's chain).
pub fn chains<'a>(
    leaf: &CertificateDer<'_>,
    cas: &'a [Authority],
    time: Seconds,
) -> Result<&'a CertificateDer<'static>, String> {
    let cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| format!("the signing certificate is not a certificate: {e}"))?;
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(time));
    let mut why = Vec::new();
    for ca in cas.iter().filter(|ca| ca.window.contains(time)) {
        let (root, intermediates) = ca.chain.split_last().ok_or("empty chain")?;
        let anchor = webpki::anchor_from_trusted_cert(root).map_err(|e| e.to_string())?;
        match cert.verify_for_usage(
            &[
                algs::ECDSA_P256_SHA256,
                algs::ECDSA_P384_SHA384,
                algs::ECDSA_P256_SHA384,
                algs::ECDSA_P384_SHA256,
            ],
            &[anchor],
            intermediates,
            at,
            webpki::KeyUsage::required(CODE_SIGNING),
            None,
            None,
        ) {
            Ok(_) => return Ok(&ca.chain[0]),
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(format!(
        "the signing certificate does not chain to a trusted Fulcio CA for code signing at the signing time {time} ({})",
        if why.is_empty() {
            "no CA was valid then".into()
        } else {
            why.join("; ")
        }
    ))
}

/// One of the SCTs embedded in `leaf` is a trusted CT log's, over the precertificate that
/// `issuer` (the certificate that issued `leaf`) signed.
pub fn logged(leaf: &[u8], issuer: &[u8], ctlogs: &[LogKey]) -> Result<(), String> {
    let cert = Certificate::from_der(leaf).map_err(|e| format!("not a certificate: {e}"))?;
    let issuer = Certificate::from_der(issuer)
        .map_err(|e| format!("the issuer is not a certificate: {e}"))?;
    let issuer_key_hash: [u8; 32] = Sha256::digest(
        issuer
            .tbs_certificate
            .subject_public_key_info
            .to_der()
            .map_err(|e| e.to_string())?,
    )
    .into();
    let mut tbs = cert.tbs_certificate.clone();
    let extensions = tbs.extensions.get_or_insert_with(Vec::new);
    let list = extensions
        .iter()
        .position(|e| e.extn_id == SCT_LIST)
        .map(|i| extensions.remove(i))
        .ok_or("the certificate embeds no signed certificate timestamp (no CT log saw it)")?;
    let precert = tbs.to_der().map_err(|e| e.to_string())?;
    let scts = SignedCertificateTimestampList::from_der(list.extn_value.as_bytes())
        .map_err(|e| format!("the SCT list does not decode: {e}"))?
        .parse_timestamps()
        .map_err(|e| format!("the SCT list does not decode: {e:?}"))?;
    for serialized in scts {
        let Ok(sct) = serialized.parse_timestamp() else {
            continue;
        };
        let Some(log) = ctlogs.iter().find(|l| l.id == sct.log_id.key_id) else {
            continue;
        };
        let signed = precert_signed_data(
            sct.timestamp,
            &issuer_key_hash,
            &precert,
            sct.extensions.as_slice(),
        );
        if log.window.contains(sct.timestamp / 1000)
            && log
                .key
                .verifies(&signed, sct.signature.signature.as_slice())
        {
            return Ok(());
        }
    }
    Err("no SCT in the certificate is a trusted CT log's".into())
}

/// RFC 6962 §3.2's digitally-signed struct for a precertificate entry.
fn precert_signed_data(
    timestamp: u64,
    issuer_key_hash: &[u8; 32],
    tbs: &[u8],
    extensions: &[u8],
) -> Vec<u8> {
    let mut s = vec![0u8, 0u8]; // v1, certificate_timestamp
    s.extend_from_slice(&timestamp.to_be_bytes());
    s.extend_from_slice(&1u16.to_be_bytes()); // precert_entry
    s.extend_from_slice(issuer_key_hash);
    s.extend_from_slice(&(tbs.len() as u32).to_be_bytes()[1..]);
    s.extend_from_slice(tbs);
    s.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    s.extend_from_slice(extensions);
    s
}
