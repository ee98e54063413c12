//! What a serving pod's `csi.kiln.dev` volume holds: the layout the node plugin writes and
//! `kiln-agent serve` (or any other server) reads. The contract between the two, so it lives
//! here, below both. Pure.
//!
//! ```text
//! <mount>/
//!   artifact             the engine, byte for byte the digest the node's agent verified
//!   manifest.json        its build manifest (engine, provider settings, precision, profiles)
//!   fixture.safetensors  the warmup fixture the node's pass used (absent when none is recorded)
//!   chat-template.jinja  a GGUF target's chat template given beside the model (a `chatTemplate`
//!                        asset, carried in the artifact), for a server that takes it as a file
//!                        (llama-server's --chat-template-file); absent otherwise
//!   kiln.json            this file's `MountedModel`: target, revision, class, digest, engine,
//!                        and the artifact's seal
//! ```
//!
//! The seal is how `artifact`'s inode stood when the plugin last proved its bytes (its inode
//! number, size and modification time). A server that finds the volume mounted read-only and the
//! artifact still standing so may take the plugin's hash instead of reading the whole file again:
//! nothing can write through a read-only mount, and a write on the host moves the modification
//! time (resetting it takes the file's owner or root, and the plugin's own check at the next
//! mount compares the change time too, which nobody can set).

use serde::{Deserialize, Serialize};

/// The engine file.
pub const ARTIFACT: &str = "artifact";
/// The build manifest.
pub const MANIFEST: &str = "manifest.json";
/// The warmup fixture.
pub const FIXTURE: &str = "fixture.safetensors";
/// The chat template given beside a GGUF model.
pub const CHAT_TEMPLATE: &str = "chat-template.jinja";
/// [`MountedModel`] as JSON.
pub const KILN_JSON: &str = "kiln.json";

/// `kiln.json`: what the volume serves and for whom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountedModel {
    /// The CompiledTarget's namespace (the pod's).
    pub namespace: String,
    /// The CompiledTarget's name.
    pub target: String,
    /// The revision the node's row serves.
    pub revision: i64,
    /// The node class whose artifact it is.
    pub class: String,
    /// sha256 of `artifact`, bare hex.
    pub digest: String,
    /// The engine (`tract`, `onnxruntime/cpu`, `llamacpp`: the KilnNode row's `engine`).
    pub engine: Option<String>,
    /// The artifact's media type.
    pub media_type: String,
    /// sha256 of `fixture.safetensors`, bare hex, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixture: Option<String>,
    /// sha256 of `chat-template.jinja`, bare hex, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// The node that verified it.
    pub node: String,
    /// The pod it was mounted for (`namespace/name`).
    pub pod: String,
    /// How `artifact` stood when the plugin proved it (absent in volumes from before seals:
    /// a server hashes those).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<Seal>,
}

/// An artifact's inode as the plugin proved it: what a server compares with its own `stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Seal {
    /// The inode number.
    pub inode: u64,
    /// The size in bytes.
    pub size: u64,
    /// The modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
}

impl MountedModel {
    /// Parses `kiln.json`, every field checked: names non-empty, digests 64 hex characters.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let m: Self = serde_json::from_slice(bytes).map_err(|e| format!("{KILN_JSON}: {e}"))?;
        let hex = crate::compile_key::is_sha256_hex;
        if m.target.is_empty() || m.namespace.is_empty() {
            return Err(format!("{KILN_JSON} names no target"));
        }
        if !hex(&m.digest) {
            return Err(format!(
                "{KILN_JSON}: digest {:?} is not 64 hex characters",
                m.digest
            ));
        }
        for (what, digest) in [("fixture", &m.fixture), ("chat template", &m.chat_template)] {
            if let Some(d) = digest
                && !hex(d)
            {
                return Err(format!(
                    "{KILN_JSON}: {what} digest {d:?} is not 64 hex characters"
                ));
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> MountedModel {
        MountedModel {
            namespace: "ns".into(),
            target: "sq".into(),
            revision: 3,
            class: "cpu-x86-64-v3".into(),
            digest: "ab".repeat(32),
            engine: Some("onnxruntime/cpu".into()),
            media_type: "application/x-onnx".into(),
            fixture: Some("cd".repeat(32)),
            chat_template: None,
            node: "n1".into(),
            pod: "ns/server-0".into(),
            seal: Some(Seal {
                inode: 42,
                size: 9,
                mtime_ns: 1_795_000_000_123_456_789,
            }),
        }
    }

    #[test]
    fn round_trips_and_refuses_what_it_cannot_trust() {
        let m = model();
        let bytes = serde_json::to_vec(&m).expect("json");
        assert_eq!(MountedModel::parse(&bytes).expect("parses"), m);
        let bad = MountedModel {
            digest: "../etc".into(),
            ..m.clone()
        };
        let err = MountedModel::parse(&serde_json::to_vec(&bad).expect("json")).expect_err("bad");
        assert!(err.contains("64 hex"), "{err}");
        let bad_template = MountedModel {
            chat_template: Some("x".into()),
            ..m.clone()
        };
        let err = MountedModel::parse(&serde_json::to_vec(&bad_template).expect("json"))
            .expect_err("bad template digest");
        assert!(err.contains("chat template digest"), "{err}");
        let nameless = MountedModel {
            target: String::new(),
            ..m
        };
        assert!(MountedModel::parse(&serde_json::to_vec(&nameless).expect("json")).is_err());
        assert!(MountedModel::parse(b"{").is_err());
    }

    #[test]
    fn a_volume_from_before_seals_parses_without_one() {
        let mut m = model();
        m.seal = None;
        let bytes = serde_json::to_vec(&m).expect("json");
        assert!(!String::from_utf8_lossy(&bytes).contains("seal"));
        assert_eq!(MountedModel::parse(&bytes).expect("parses").seal, None);
        let sealed = serde_json::to_string(&model()).expect("json");
        assert!(
            sealed.contains(r#""seal":{"inode":42,"size":9,"mtimeNs":1795000000123456789}"#),
            "{sealed}"
        );
    }
}
