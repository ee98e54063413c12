//! A Rekor v2 entry as a Sigstore bundle carries it (`tlogEntries[0]`): the entry body must be
//! the `hashedrekord` 0.0.2 record of this very signature (Rekor v2 logs a DSSE envelope as the
//! digest of its PAE, signed by the certificate), the body must be in the log by its RFC 6962
//! inclusion proof, and the proof's root must be the one a trusted log signed in its checkpoint
//! (a C2SP signed note).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::root::{LogKey, Seconds};

/// The entry, as protobuf-specs' `TransparencyLogEntry` JSON writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    log_id: LogId,
    kind_version: KindVersion,
    inclusion_proof: Option<InclusionProof>,
    canonicalized_body: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogId {
    key_id: String,
}

#[derive(Deserialize)]
struct KindVersion {
    kind: String,
    version: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InclusionProof {
    log_index: String,
    root_hash: String,
    tree_size: String,
    #[serde(default)]
    hashes: Vec<String>,
    checkpoint: Option<Checkpoint>,
}

#[derive(Deserialize)]
struct Checkpoint {
    envelope: String,
}

/// What the entry must record: the signature, its signing certificate (DER) and the digest of
/// what was signed.
pub struct Signed<'a> {
    pub signature: &'a [u8],
    pub certificate: &'a [u8],
    pub pae_sha256: [u8; 32],
}

/// Checks `entry` against `signed` and the trusted logs at `time`; returns the log's index.
pub fn verify(
    entry: &Entry,
    signed: &Signed<'_>,
    logs: &[LogKey],
    time: Seconds,
) -> Result<u64, String> {
    let kv = &entry.kind_version;
    if (kv.kind.as_str(), kv.version.as_str()) != ("hashedrekord", "0.0.2") {
        return Err(format!(
            "the transparency log entry is {}/{}: kiln checks Rekor v2 entries (hashedrekord/0.0.2); a Rekor v1 entry needs its signed entry timestamp, which kiln does not check yet",
            kv.kind, kv.version
        ));
    }
    let body = b64(&entry.canonicalized_body, "canonicalizedBody")?;
    same_signature(&body, signed)?;
    let id = b64(&entry.log_id.key_id, "logId.keyId")?;
    let log = logs
        .iter()
        .find(|l| l.id == id)
        .ok_or_else(|| format!("the entry's log {} is not a trusted tlog", hex::encode(&id)))?;
    if !log.window.contains(time) {
        return Err(format!(
            "the log {} was not trusted at the signing time {time}",
            hex::encode(&id)
        ));
    }
    let proof = entry
        .inclusion_proof
        .as_ref()
        .ok_or("the entry has no inclusion proof")?;
    included(&body, proof)?;
    let checkpoint = proof
        .checkpoint
        .as_ref()
        .ok_or("the inclusion proof has no checkpoint")?;
    let (size, root) = signed_checkpoint(&checkpoint.envelope, log)?;
    if size != number(&proof.tree_size, "treeSize")? || root != b64(&proof.root_hash, "rootHash")? {
        return Err(
            "the checkpoint the log signed is not the tree the inclusion proof is for".into(),
        );
    }
    number(&proof.log_index, "logIndex")
}

/// The body must record exactly this signature, certificate and PAE digest.
fn same_signature(body: &[u8], signed: &Signed<'_>) -> Result<(), String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Body {
        kind: String,
        api_version: String,
        spec: Spec,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        hashed_rekord_v002: Record,
    }
    #[derive(Deserialize)]
    struct Record {
        data: Data,
        signature: Signature,
    }
    #[derive(Deserialize)]
    struct Data {
        algorithm: String,
        digest: String,
    }
    #[derive(Deserialize)]
    struct Signature {
        content: String,
        verifier: Verifier,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Verifier {
        x509_certificate: Raw,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Raw {
        raw_bytes: String,
    }
    let b: Body = serde_json::from_slice(body)
        .map_err(|e| format!("the entry body is not a hashedrekord 0.0.2 record: {e}"))?;
    let r = &b.spec.hashed_rekord_v002;
    let same = b.kind == "hashedrekord"
        && b.api_version == "0.0.2"
        && r.data.algorithm == "SHA2_256"
        && b64(&r.data.digest, "data.digest")? == signed.pae_sha256
        && b64(&r.signature.content, "signature.content")? == signed.signature
        && b64(&r.signature.verifier.x509_certificate.raw_bytes, "rawBytes")? == signed.certificate;
    same.then_some(()).ok_or_else(|| {
        "the transparency log entry records another signature, certificate or payload than the bundle's".into()
    })
}

/// RFC 6962 (RFC 9162 §2.1.3.2): the leaf hash of `body` and the proof's path give its root.
fn included(body: &[u8], proof: &InclusionProof) -> Result<(), String> {
    let index = number(&proof.log_index, "logIndex")?;
    let size = number(&proof.tree_size, "treeSize")?;
    let path = proof
        .hashes
        .iter()
        .map(|h| b64(h, "hashes"))
        .collect::<Result<Vec<_>, _>>()?;
    let leaf = hash(&[&[0], body]);
    let root = root_from_path(index, size, leaf, &path)
        .ok_or("the inclusion proof does not lead from the entry to a root")?;
    (root.as_slice() == b64(&proof.root_hash, "rootHash")?)
        .then_some(())
        .ok_or_else(|| "the inclusion proof does not lead to its root hash".into())
}

/// RFC 9162's verification of an inclusion proof, returning the root it computes.
pub fn root_from_path(index: u64, size: u64, leaf: [u8; 32], path: &[Vec<u8>]) -> Option<[u8; 32]> {
    if index >= size {
        return None;
    }
    let (mut f, mut s, mut r) = (index, size - 1, leaf);
    for p in path {
        if s == 0 || p.len() != 32 {
            return None;
        }
        if f & 1 == 1 || f == s {
            r = hash(&[&[1], p, &r]);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = hash(&[&[1], &r, p]);
        }
        f >>= 1;
        s >>= 1;
    }
    (s == 0).then_some(r)
}

/// The checkpoint's tree size and root hash, once `log`'s key signed its note. The signature
/// line's key hint is the first four bytes of the log id.
fn signed_checkpoint(note: &str, log: &LogKey) -> Result<(u64, Vec<u8>), String> {
    let split = note
        .find("\n\n")
        .ok_or("the checkpoint is not a signed note (no blank line)")?;
    let (text, signatures) = (&note[..=split], &note[split + 2..]);
    let mut lines = text.lines();
    let (Some(_origin), Some(size), Some(root)) = (lines.next(), lines.next(), lines.next()) else {
        return Err("the checkpoint has fewer than three lines".into());
    };
    let signed = signatures
        .lines()
        .filter_map(|line| line.strip_prefix("\u{2014} "))
        .filter_map(|line| line.split_once(' '))
        .filter_map(|(_, sig)| B64.decode(sig).ok())
        .any(|sig| {
            sig.len() > 4
                && sig[..4] == log.id[..4.min(log.id.len())]
                && log.key.verifies(text.as_bytes(), &sig[4..])
        });
    if !signed {
        return Err(format!(
            "no signature of the trusted log {} on the checkpoint",
            hex::encode(&log.id)
        ));
    }
    Ok((
        number(size, "checkpoint size")?,
        b64(root, "checkpoint root")?,
    ))
}

fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn b64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    B64.decode(text.as_bytes())
        .map_err(|e| format!("{what} is not base64 ({e})"))
}

fn number(text: &str, what: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{what} {text:?} is not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A four-leaf tree: every leaf's proof leads to the root, and a wrong index or size does not.
    #[test]
    fn inclusion_proofs_lead_to_the_root_only_from_their_leaf() {
        let leaves: Vec<[u8; 32]> = (0u8..5).map(|i| hash(&[&[0], &[i]])).collect();
        let node = |a: &[u8; 32], b: &[u8; 32]| hash(&[&[1], a, b]);
        let (h01, h23) = (node(&leaves[0], &leaves[1]), node(&leaves[2], &leaves[3]));
        let h0123 = node(&h01, &h23);
        let root5 = node(&h0123, &leaves[4]);
        let v = |x: &[u8; 32]| x.to_vec();
        assert_eq!(
            root_from_path(2, 5, leaves[2], &[v(&leaves[3]), v(&h01), v(&leaves[4])]),
            Some(root5)
        );
        assert_eq!(root_from_path(4, 5, leaves[4], &[v(&h0123)]), Some(root5));
        assert_eq!(
            root_from_path(0, 4, leaves[0], &[v(&leaves[1]), v(&h23)]),
            Some(h0123)
        );
        assert_ne!(
            root_from_path(1, 4, leaves[0], &[v(&leaves[1]), v(&h23)]),
            Some(h0123)
        );
        assert_eq!(root_from_path(4, 4, leaves[4], &[]), None);
        assert_eq!(root_from_path(0, 4, leaves[0], &[v(&leaves[1])]), None);
    }
}
