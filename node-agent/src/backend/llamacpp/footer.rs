//! The llamacpp artifact: the compiled GGUF file, then kiln's index (profiles, context length,
//! weight type: only what the compile key decides, so one key gives one digest) as JSON, its length (u64 LE) and the magic `KILNGGUF`. llama.cpp reads tensors
//! at the offsets the GGUF header names and ignores bytes after them, so the one file is both
//! what llama.cpp maps and what kiln needs to run it, and the artifact stays a single blob the
//! store and the node cache verify by digest. Pure apart from reading and appending the file.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::Shapes;

const MAGIC: &[u8; 8] = b"KILNGGUF";
/// The largest index read back (profiles of a few inputs each are a few KB).
const MAX_INDEX: u64 = 1 << 20;

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
}

/// Appends `index` to the GGUF file at `path`.
pub fn append(path: &Path, index: &Index) -> Result<(), String> {
    let json = serde_json::to_vec(index).map_err(|e| e.to_string())?;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(&json)
        .and_then(|()| f.write_all(&(json.len() as u64).to_le_bytes()))
        .and_then(|()| f.write_all(MAGIC))
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads the index back, refusing a file that does not end in one.
pub fn read(path: &Path) -> Result<Index, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len < 16 {
        return Err("too short for a kiln llamacpp artifact".into());
    }
    let mut tail = [0u8; 16];
    f.seek(SeekFrom::Start(len - 16))
        .and_then(|_| f.read_exact(&mut tail))
        .map_err(|e| e.to_string())?;
    if &tail[8..] != MAGIC {
        return Err("no kiln index at its end: not a kiln llamacpp artifact".into());
    }
    let n = u64::from_le_bytes(tail[..8].try_into().map_err(|_| "short tail".to_string())?);
    if n > MAX_INDEX || n > len - 16 {
        return Err(format!(
            "kiln index of {n} bytes in a file of {len}: corrupt"
        ));
    }
    let mut json = vec![0u8; usize::try_from(n).map_err(|e| e.to_string())?];
    f.seek(SeekFrom::Start(len - 16 - n))
        .and_then(|_| f.read_exact(&mut json))
        .map_err(|e| e.to_string())?;
    let index: Index = serde_json::from_slice(&json).map_err(|e| format!("kiln index: {e}"))?;
    if index.gguf_bytes != len - 16 - n {
        return Err(format!(
            "kiln index says the GGUF part is {} bytes, the file holds {}: corrupt",
            index.gguf_bytes,
            len - 16 - n
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
        };
        append(&path, &index).expect("append");
        assert_eq!(read(&path).expect("read"), index);
        // Bytes before the index change the GGUF size it records.
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.insert(0, b'x');
        std::fs::write(&path, &bytes).expect("write");
        assert!(read(&path).expect_err("size").contains("corrupt"));
        // A plain GGUF has no index.
        std::fs::write(&path, b"GGUF and nothing else").expect("write");
        assert!(read(&path).expect_err("plain").contains("not a kiln"));
        // A length past the file.
        let mut bad = b"{}".to_vec();
        bad.extend_from_slice(&u64::MAX.to_le_bytes());
        bad.extend_from_slice(MAGIC);
        std::fs::write(&path, &bad).expect("write");
        assert!(read(&path).expect_err("length").contains("corrupt"));
    }
}
