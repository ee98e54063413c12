//! The llamacpp artifact: the compiled GGUF file, then kiln's index (profiles, context length,
//! weight type, provider, chat template: only what the compile key decides, so one key gives
//! one digest) in the frame of [`crate::gguf_index`], so the artifact stays a single blob the
//! store and the node cache verify by digest. Pure apart from reading and appending the file.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::Shapes;
use crate::gguf_index;

/// What kiln appends to a compiled GGUF.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Index {
    /// Profile name → input shapes, as compiled.
    pub profiles: Vec<(String, Shapes)>,
    /// Tokens of context the engine allocates.
    pub context_length: u32,
    /// The weight type the compile chose (`F16`, `Q8_0`, or `source`).
    pub quantization: String,
    /// Size of the GGUF part, in bytes.
    pub gguf_bytes: u64,
    /// The chat template given beside the source (a `chatTemplate` asset), which replaces the
    /// GGUF's own; absent when none was given (the artifact's bytes then stay as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// Where the engine runs when not on the CPU (`cuda`: every layer on the GPU); absent for
    /// the CPU, so the CPU artifacts' bytes stay as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<kiln_crds::compiled_target::ExecutionProvider>,
}

/// Appends `index` to the GGUF file at `path`.
pub fn append(path: &Path, index: &Index) -> Result<(), String> {
    let json = serde_json::to_vec(index).map_err(|e| e.to_string())?;
    gguf_index::append(path, &json)
}

/// Reads the index back, refusing a file that does not end in one.
pub fn read(path: &Path) -> Result<Index, String> {
    let (json, gguf_bytes) = gguf_index::read(path)?;
    let index: Index = serde_json::from_slice(&json).map_err(|e| format!("kiln index: {e}"))?;
    if index.gguf_bytes != gguf_bytes {
        return Err(format!(
            "kiln index says the GGUF part is {} bytes, the file holds {gguf_bytes}: corrupt",
            index.gguf_bytes
        ));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_round_trips_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.gguf");
        std::fs::write(&path, b"GGUF-part").expect("write");
        let index = Index {
            profiles: vec![("p8".into(), Shapes::from([("prompt".into(), vec![8])]))],
            context_length: 512,
            quantization: "Q8_0".into(),
            gguf_bytes: 9,
            chat_template: None,
            provider: None,
        };
        append(&path, &index).expect("append");
        assert_eq!(read(&path).expect("read"), index);
        // A CPU index writes no provider (its bytes are as before GPU engines); a GPU one does.
        let json = |i: &Index| serde_json::to_string(i).expect("json");
        assert!(!json(&index).contains("provider"));
        let gpu = Index {
            provider: Some(kiln_crds::compiled_target::ExecutionProvider::Cuda),
            ..index.clone()
        };
        assert!(
            json(&gpu).contains(r#""provider":"cuda""#),
            "{}",
            json(&gpu)
        );
        let gpu_path = dir.path().join("g.gguf");
        std::fs::write(&gpu_path, b"GGUF-part").expect("write");
        append(&gpu_path, &gpu).expect("append");
        assert_eq!(read(&gpu_path).expect("read"), gpu);
        // Bytes before the index change the GGUF size it records.
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.insert(0, b'x');
        std::fs::write(&path, &bytes).expect("write");
        assert!(read(&path).expect_err("size").contains("corrupt"));
        // A plain GGUF has no index.
        std::fs::write(&path, b"GGUF and nothing else").expect("write");
        assert!(read(&path).expect_err("plain").contains("not a kiln"));
        // A length past the file.
    }
}
