//! An RFC 3161 timestamp over the bundle's signature, from a trusted timestamp authority: the
//! time the Fulcio certificate (valid for minutes) is checked at. The response is granted, its
//! token a CMS SignedData over a TSTInfo whose message imprint is the digest of the signature,
//! signed (over its signed attributes, which name that TSTInfo by digest) by the leaf of a
//! trusted TSA chain that may stamp time (extended key usage `timeStamping`), at that time.

use cms::content_info::ContentInfo;
use cms::signed_data::{SignedData, SignerInfo};
use der::asn1::OctetString;
use der::{Decode as _, Encode as _, oid::ObjectIdentifier};
use rustls_pki_types::UnixTime;
use sha2::{Digest, Sha256, Sha384, Sha512};
use webpki::ring as algs;
use x509_tsp::{TimeStampResp, TstInfo};

use super::root::{Authority, Seconds};

const SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const TST_INFO: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.16.1.4");
const CONTENT_TYPE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
const MESSAGE_DIGEST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");
/// id-kp-timeStamping (1.3.6.1.5.5.7.3.8), the OID's content octets.
const TIME_STAMPING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x08];

/// The time `response` (a DER TimeStampResp) vouches `signature` existed at, once it verifies
/// against one of `authorities`.
pub fn verify(
    response: &[u8],
    signature: &[u8],
    authorities: &[Authority],
) -> Result<Seconds, String> {
    let resp = TimeStampResp::from_der(response)
        .map_err(|e| format!("not an RFC 3161 TimeStampResp: {e}"))?;
    // PKIStatus granted (0) or grantedWithMods (1).
    if resp.status.status as u8 > 1 {
        return Err(format!(
            "the timestamp was not granted ({:?})",
            resp.status.status
        ));
    }
    let token: ContentInfo = resp.time_stamp_token.ok_or("the response holds no token")?;
    if token.content_type != SIGNED_DATA {
        return Err("the timestamp token is not CMS SignedData".into());
    }
    let data: SignedData = token
        .content
        .decode_as()
        .map_err(|e| format!("the timestamp token is not CMS SignedData: {e}"))?;
    let econtent = data
        .encap_content_info
        .econtent
        .as_ref()
        .filter(|_| data.encap_content_info.econtent_type == TST_INFO)
        .ok_or("the timestamp token does not hold a TSTInfo")?
        .decode_as::<OctetString>()
        .map_err(|e| format!("the TSTInfo is not an OCTET STRING: {e}"))?;
    let tst = TstInfo::from_der(econtent.as_bytes()).map_err(|e| format!("not a TSTInfo: {e}"))?;
    let imprint = &tst.message_imprint;
    if digest(imprint.hash_algorithm.oid, signature)?.as_slice()
        != imprint.hashed_message.as_bytes()
    {
        return Err("the timestamp is over other bytes than the bundle's signature".into());
    }
    let time = tst.gen_time.to_unix_duration().as_secs();
    let [signer] = data.signer_infos.0.as_slice() else {
        return Err("the timestamp token has not exactly one signer".into());
    };
    let signed_attrs = signed_attributes(signer, econtent.as_bytes())?;
    let mut why = Vec::new();
    for a in authorities {
        match signed_by(a, &signed_attrs, signer, time) {
            Ok(()) if a.window.contains(time) => return Ok(time),
            Ok(()) => why.push(format!("signed by an authority not trusted at {time}")),
            Err(e) => why.push(e),
        }
    }
    Err(format!(
        "no trusted timestamp authority signed the timestamp at {time} ({why:?})"
    ))
}

/// The DER of `signer`'s signed attributes (what it signs), once they name the TSTInfo
/// `econtent` by content type and digest.
fn signed_attributes(signer: &SignerInfo, econtent: &[u8]) -> Result<Vec<u8>, String> {
    let attrs = signer
        .signed_attrs
        .as_ref()
        .ok_or("the timestamp's signer signs no attributes")?;
    let value = |oid: ObjectIdentifier| {
        attrs
            .iter()
            .find(|a| a.oid == oid)
            .and_then(|a| a.values.get(0))
    };
    let content_type = value(CONTENT_TYPE)
        .and_then(|v| v.decode_as::<ObjectIdentifier>().ok())
        .ok_or("the signed attributes name no content type")?;
    let message_digest = value(MESSAGE_DIGEST)
        .and_then(|v| v.decode_as::<OctetString>().ok())
        .ok_or("the signed attributes name no message digest")?;
    if content_type != TST_INFO
        || message_digest.as_bytes() != digest(signer.digest_alg.oid, econtent)?.as_slice()
    {
        return Err("the timestamp's signed attributes are not over its TSTInfo".into());
    }
    attrs
        .to_der()
        .map_err(|e| format!("the signed attributes do not encode: {e}"))
}

/// Whether `authority`'s leaf made `signer`'s signature over `signed_attrs`, and chains to the
/// authority's root for timestamping at `time`.
fn signed_by(
    authority: &Authority,
    signed_attrs: &[u8],
    signer: &SignerInfo,
    time: Seconds,
) -> Result<(), String> {
    let (leaf, rest) = authority.chain.split_first().ok_or("empty chain")?;
    let cert = webpki::EndEntityCert::try_from(leaf).map_err(|e| e.to_string())?;
    if let Some((root, intermediates)) = rest.split_last() {
        let anchor = webpki::anchor_from_trusted_cert(root).map_err(|e| e.to_string())?;
        cert.verify_for_usage(
            &[
                algs::ECDSA_P256_SHA256,
                algs::ECDSA_P384_SHA384,
                algs::ECDSA_P256_SHA384,
                algs::ECDSA_P384_SHA256,
                algs::RSA_PKCS1_2048_8192_SHA256,
                algs::RSA_PKCS1_2048_8192_SHA384,
            ],
            &[anchor],
            intermediates,
            UnixTime::since_unix_epoch(std::time::Duration::from_secs(time)),
            webpki::KeyUsage::required(TIME_STAMPING),
            None,
            None,
        )
        .map_err(|e| format!("the TSA certificate does not chain for timestamping: {e}"))?;
    }
    let oid = signer.signature_algorithm.oid.to_string();
    let candidates = match oid.as_str() {
        "1.2.840.10045.4.3.2" => [algs::ECDSA_P256_SHA256, algs::ECDSA_P384_SHA256],
        "1.2.840.10045.4.3.3" => [algs::ECDSA_P384_SHA384, algs::ECDSA_P256_SHA384],
        "1.2.840.113549.1.1.11" => [algs::RSA_PKCS1_2048_8192_SHA256; 2],
        "1.2.840.113549.1.1.12" => [algs::RSA_PKCS1_2048_8192_SHA384; 2],
        other => return Err(format!("signature algorithm {other} is not checked")),
    };
    let sig = signer.signature.as_bytes();
    candidates
        .iter()
        .any(|alg| cert.verify_signature(*alg, signed_attrs, sig).is_ok())
        .then_some(())
        .ok_or_else(|| "not signed by this authority".into())
}

fn digest(algorithm: ObjectIdentifier, bytes: &[u8]) -> Result<Vec<u8>, String> {
    Ok(match algorithm.to_string().as_str() {
        "2.16.840.1.101.3.4.2.1" => Sha256::digest(bytes).to_vec(),
        "2.16.840.1.101.3.4.2.2" => Sha384::digest(bytes).to_vec(),
        "2.16.840.1.101.3.4.2.3" => Sha512::digest(bytes).to_vec(),
        other => return Err(format!("digest algorithm {other} is not SHA-2")),
    })
}
