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
//!
//! Split along its seams: `keys` (parses keys; reads key files), `statement` (what is
//! signed; pure), `envelope` (DSSE signing and verification; pure) and `trust` (a process's
//! keys and the store I/O: checking an entry's attestation in a store, signing and publishing
//! an entry). The store implementations keep the envelope beside the entry.

mod envelope;
mod keys;
pub mod model_signing;
pub mod sigstore;
mod statement;
mod trust;

pub use envelope::{ENVELOPE_MEDIA_TYPE, MAX_ENVELOPE_BYTES, PAYLOAD_TYPE};
pub use keys::{Signer, Verifier};
pub use statement::{
    BUILD_TYPE, BuildDefinition, Builder, PREDICATE_TYPE, Provenance, ResourceDescriptor,
    RunDetails, STATEMENT_TYPE, Statement, Subject, subject,
};
pub use trust::Trust;
