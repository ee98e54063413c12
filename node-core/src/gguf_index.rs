//! kiln's index at the end of a llamacpp artifact, and its frame: the compiled GGUF, then the
//! index as JSON ([`Index`]: profiles, context length, weight type, provider, chat template, only
//! what the compile key decides, so one key gives one digest), its length (u64 LE) and the magic
//! `KILNGGUF`. llama.cpp reads tensors at the offsets the GGUF header names and ignores bytes
//! after them, so the one file is both what llama.cpp maps and what kiln needs to run it, and
//! stays a single blob the store and the node cache verify by digest. The llama.cpp backend
//! writes and reads it; the CSI node plugin reads the chat template from it, through the same
//! reader, without any engine code. Pure apart from the file I/O.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What kiln appends to a compiled GGUF.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Index {
    /// Profile name → input shapes (input name → dims), as compiled.
    pub profiles: Vec<(String, BTreeMap<String, Vec<usize>>)>,
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

/// The media type of a llamacpp artifact.
pub const MEDIA_TYPE: &str = "application/vnd.kiln.llamacpp.gguf.v1";

const MAGIC: &[u8; 8] = b"KILNGGUF";
/// The largest index read back (profiles are a few KB; a chat template at most 256 KiB).
const MAX_INDEX: u64 = 1 << 20;

/// Appends `index` to the GGUF file at `path`, and syncs it.
pub fn append(path: &Path, index: &Index) -> Result<(), String> {
    let json = serde_json::to_vec(index).map_err(|e| e.to_string())?;
    append_frame(path, &json)
}

/// Reads the index back, refusing a file that does not end in one, an index that does not parse
/// or names a field kiln does not know, and one whose GGUF size is not the file's.
pub fn read(path: &Path) -> Result<Index, String> {
    let (json, gguf_bytes) = read_frame(path)?;
    let index: Index = serde_json::from_slice(&json).map_err(|e| format!("kiln index: {e}"))?;
    if index.gguf_bytes != gguf_bytes {
        return Err(format!(
            "kiln index says the GGUF part is {} bytes, the file holds {gguf_bytes}: corrupt",
            index.gguf_bytes
        ));
    }
    Ok(index)
}

/// The chat template given beside the source that the artifact at `path` carries (its index's
/// `chatTemplate`), if any.
pub fn chat_template(path: &Path) -> Result<Option<String>, String> {
    read(path).map(|index| index.chat_template)
}

/// Appends the frame of `json` to the file at `path`, and syncs it.
fn append_frame(path: &Path, json: &[u8]) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(json)
        .and_then(|()| f.write_all(&(json.len() as u64).to_le_bytes()))
        .and_then(|()| f.write_all(MAGIC))
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The index's JSON and the size of the GGUF part before it, refusing a file that does not end
/// in a frame or whose frame cannot be (too long, past the file's start).
fn read_frame(path: &Path) -> Result<(Vec<u8>, u64), String> {
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
    Ok((json, len - 16 - n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> Index {
        Index {
            profiles: vec![("p8".into(), BTreeMap::from([("prompt".into(), vec![8])]))],
            context_length: 512,
            quantization: "Q8_0".into(),
            gguf_bytes: 9,
            chat_template: None,
            provider: None,
        }
    }

    #[test]
    fn an_index_round_trips_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.gguf");
        std::fs::write(&path, b"GGUF-part").expect("write");
        let index = index();
        append(&path, &index).expect("append");
        assert_eq!(read(&path).expect("read"), index);
        assert_eq!(chat_template(&path).expect("none"), None);
        // A CPU index writes no provider (its bytes are as before GPU engines); a GPU one does.
        let json = |i: &Index| serde_json::to_string(i).expect("json");
        assert!(!json(&index).contains("provider"));
        let gpu = Index {
            provider: Some(kiln_crds::compiled_target::ExecutionProvider::Cuda),
            chat_template: Some("{{ x }}".into()),
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
        assert_eq!(
            chat_template(&gpu_path).expect("template").as_deref(),
            Some("{{ x }}")
        );
        // Bytes before the index change the GGUF size it records.
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.insert(0, b'x');
        std::fs::write(&path, &bytes).expect("write");
        assert!(read(&path).expect_err("size").contains("corrupt"));
        // A plain GGUF has no index.
        std::fs::write(&path, b"GGUF and nothing else").expect("write");
        assert!(read(&path).expect_err("plain").contains("not a kiln"));
    }

    #[test]
    fn a_damaged_frame_or_a_field_kiln_does_not_know_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.gguf");
        let mut bad = b"{}".to_vec();
        bad.extend_from_slice(&u64::MAX.to_le_bytes());
        bad.extend_from_slice(MAGIC);
        std::fs::write(&path, &bad).expect("write");
        assert!(read(&path).expect_err("length").contains("corrupt"));
        std::fs::write(&path, b"GGUF-part").expect("write");
        let mut json = serde_json::to_value(index()).expect("json");
        json["other"] = 1.into();
        append_frame(&path, json.to_string().as_bytes()).expect("frame");
        assert!(read(&path).expect_err("unknown").contains("other"));
        assert!(chat_template(&path).is_err());
    }
}
