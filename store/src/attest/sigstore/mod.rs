//! Sigstore keyless signatures, verified offline against a trusted root and an identity policy,
//! as `cosign verify --certificate-identity --certificate-oidc-issuer` and `model_signing verify
//! sigstore --identity --identity_provider` check them: the DSSE signature is the Fulcio
//! certificate's key's; an RFC 3161 timestamp from a trusted TSA fixes when it was made; at that
//! time the certificate chains to a trusted Fulcio CA for code signing and a trusted CT log saw
//! it; the signature is in a trusted Rekor v2 log (inclusion proof to a signed checkpoint); and
//! the certificate names a trusted identity. Pure: bytes and trust in, the signer or what is
//! wrong out (`root`, `timestamp`, `certificate` and `tlog` hold one check each).

mod certificate;
mod root;
mod timestamp;
mod tlog;

use rustls_pki_types::CertificateDer;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use webpki::ring as algs;

pub use certificate::Identity;
pub use root::TrustedRoot;
pub use tlog::Entry;

/// At most this many timestamps are looked at (sigstore-python's bound too).
const MAX_TIMESTAMPS: usize = 32;

/// Whom keyless signatures are trusted from: a Sigstore trusted root and the identities (OIDC
/// issuer and subject, both exact) that may sign.
#[derive(Clone, Debug)]
pub struct KeylessTrust {
    pub root: TrustedRoot,
    pub identities: Vec<Identity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TrustJson {
    trusted_root: serde_json::Value,
    identities: Vec<IdentityJson>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityJson {
    issuer: String,
    subject: String,
}

impl KeylessTrust {
    /// `{"trustedRoot": <trusted_root.json>, "identities": [{"issuer": URL, "subject": EMAIL or
    /// URI}]}`; at least one identity, and a root with a CA, a CT log, a Rekor log and a TSA.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let t: TrustJson = serde_json::from_slice(bytes).map_err(|e| {
            format!("not a Sigstore trust file ({{\"trustedRoot\": ..., \"identities\": [{{\"issuer\": ..., \"subject\": ...}}]}}): {e}")
        })?;
        let root = TrustedRoot::from_json(t.trusted_root)?;
        let missing = [
            (
                "certificateAuthorities",
                root.certificate_authorities.is_empty(),
            ),
            ("ctlogs", root.ctlogs.is_empty()),
            ("tlogs", root.tlogs.is_empty()),
            (
                "timestampAuthorities",
                root.timestamp_authorities.is_empty(),
            ),
        ];
        if let Some((what, _)) = missing.iter().find(|(_, empty)| *empty) {
            return Err(format!(
                "the trusted root lists no {what}; kiln needs all four to check a keyless signature"
            ));
        }
        if t.identities.is_empty() {
            return Err(
                "no identities: name the OIDC issuer and subject each publisher signs as".into(),
            );
        }
        Ok(Self {
            root,
            identities: t
                .identities
                .into_iter()
                .map(|i| Identity {
                    issuer: i.issuer,
                    subject: i.subject,
                })
                .collect(),
        })
    }
}

/// A keyless signature as the bundle carries it.
pub struct Keyless<'a> {
    /// The Fulcio certificate.
    pub leaf: CertificateDer<'static>,
    pub signature: &'a [u8],
    /// What was signed (the DSSE PAE).
    pub signed: &'a [u8],
    pub entry: Entry,
    /// RFC 3161 TimeStampResp, DER.
    pub timestamps: Vec<Vec<u8>>,
}

/// Verifies `k` against `trust`; returns who signed and where it is logged.
pub fn verify(k: &Keyless<'_>, trust: &KeylessTrust) -> Result<String, String> {
    let root = &trust.root;
    let cert = webpki::EndEntityCert::try_from(&k.leaf)
        .map_err(|e| format!("the signing certificate is not a certificate: {e}"))?;
    [algs::ECDSA_P256_SHA256, algs::ECDSA_P384_SHA384]
        .iter()
        .any(|alg| cert.verify_signature(*alg, k.signed, k.signature).is_ok())
        .then_some(())
        .ok_or("the signature is not the signing certificate's (ECDSA P-256 or P-384)")?;
    if k.timestamps.len() > MAX_TIMESTAMPS {
        return Err(format!(
            "{} timestamps; at most {MAX_TIMESTAMPS}",
            k.timestamps.len()
        ));
    }
    let mut times = Vec::new();
    let mut why = Vec::new();
    for ts in &k.timestamps {
        match timestamp::verify(ts, k.signature, &root.timestamp_authorities) {
            Ok(t) => times.push(t),
            Err(e) => why.push(e),
        }
    }
    if times.is_empty() {
        return Err(format!(
            "no timestamp from a trusted timestamp authority fixes when it was signed ({})",
            if why.is_empty() {
                "the bundle carries none".into()
            } else {
                why.join("; ")
            }
        ));
    }
    let mut issuer = None;
    for &t in &times {
        issuer = Some(certificate::chains(
            &k.leaf,
            &root.certificate_authorities,
            t,
        )?);
    }
    let issuer = issuer.expect("one time at least");
    certificate::logged(&k.leaf, issuer, &root.ctlogs)?;
    let signed = tlog::Signed {
        signature: k.signature,
        certificate: &k.leaf,
        pae_sha256: Sha256::digest(k.signed).into(),
    };
    let index = tlog::verify(&k.entry, &signed, &root.tlogs, times[0])?;
    let who = certificate::identity(&k.leaf)?;
    if !trust.identities.contains(&who) {
        return Err(format!(
            "signed by {} (issuer {}), who is not among the trusted identities {:?}",
            who.subject,
            who.issuer,
            trust
                .identities
                .iter()
                .map(|i| format!("{} (issuer {})", i.subject, i.issuer))
                .collect::<Vec<_>>()
        ));
    }
    Ok(format!(
        "sigstore {} (issuer {}), Rekor entry {index}",
        who.subject, who.issuer
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    /// A root with one of each part; the key and certificate bytes are checked for base64 and
    /// (keys) DER here, not for what they sign.
    fn root() -> serde_json::Value {
        // A P-256 SubjectPublicKeyInfo (a throwaway key; nothing is verified with it here).
        let spki = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEiHyK9k+ngNd94Ke71Fsa3zLNkSBnVjsT0yCKZMA8jcPDbo73XPzgIGDZPKBQ/RVuKYbwAr7Q79ofLhOGZWlDiw==";
        let log = json!({"baseUrl": "http://log", "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": spki, "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                "validFor": {"start": "2026-01-01T00:00:00Z"}},
            "logId": {"keyId": "AAAA"}});
        let authority = json!({"certChain": {"certificates": [{"rawBytes": "MAA="}]},
            "validFor": {"start": "2026-01-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"}});
        json!({"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [log], "ctlogs": [log],
            "certificateAuthorities": [authority], "timestampAuthorities": [authority]})
    }

    fn trust(
        root: serde_json::Value,
        identities: serde_json::Value,
    ) -> Result<KeylessTrust, String> {
        KeylessTrust::from_json(
            json!({"trustedRoot": root, "identities": identities})
                .to_string()
                .as_bytes(),
        )
    }

    #[test]
    fn a_trust_file_needs_every_part_of_the_root_and_an_identity() {
        let who = json!([{"issuer": "https://issuer", "subject": "a@example.com"}]);
        let t = trust(root(), who.clone()).unwrap();
        assert_eq!(t.identities[0].subject, "a@example.com");
        let w = t.root.certificate_authorities[0].window;
        assert!(w.contains(1_780_000_000) && !w.contains(1_800_000_000) && !w.contains(0));
        for part in [
            "tlogs",
            "ctlogs",
            "certificateAuthorities",
            "timestampAuthorities",
        ] {
            let mut r = root();
            r[part] = json!([]);
            let e = trust(r, who.clone()).unwrap_err();
            assert!(e.contains(&format!("lists no {part}")), "{e}");
        }
        let e = trust(root(), json!([])).unwrap_err();
        assert!(e.contains("no identities"), "{e}");
        let mut r = root();
        r["tlogs"][0]["publicKey"]["keyDetails"] = json!("PKIX_RSA_PKCS1V15_2048_SHA256");
        let e = trust(r, who.clone()).unwrap_err();
        assert!(
            e.contains("tlogs[0]: key type") && e.contains("PKIX_ED25519"),
            "{e}"
        );
        let mut r = root();
        r["timestampAuthorities"][0]["validFor"] = json!({"start": "yesterday"});
        let e = trust(r, who.clone()).unwrap_err();
        assert!(
            e.contains("timestampAuthorities[0]") && e.contains("RFC 3339"),
            "{e}"
        );
        let mut r = root();
        r["mediaType"] = json!("application/json");
        assert!(trust(r, who.clone()).unwrap_err().contains("mediaType"));
        let e = KeylessTrust::from_json(b"{\"trustedRoot\": {}, \"identities\": [], \"x\": 1}")
            .unwrap_err();
        assert!(e.contains("not a Sigstore trust file"), "{e}");
    }
}
