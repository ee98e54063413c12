//! The frame of kiln's index at the end of a llamacpp artifact: the compiled GGUF, then the
//! index as JSON, its length (u64 LE) and the magic `KILNGGUF`. llama.cpp reads tensors at the
//! offsets the GGUF header names and ignores bytes after them, so the one file is both what
//! llama.cpp maps and what kiln needs to run it. The llama.cpp backend writes and reads the
//! index (`backend/llamacpp/footer.rs`: what it holds); the CSI node plugin reads the chat
//! template from it, without any engine code. Pure apart from the file I/O.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The media type of a llamacpp artifact.
pub const MEDIA_TYPE: &str = "application/vnd.kiln.llamacpp.gguf.v1";

const MAGIC: &[u8; 8] = b"KILNGGUF";
/// The largest index read back (profiles are a few KB; a chat template at most 256 KiB).
const MAX_INDEX: u64 = 1 << 20;

/// Appends the index `json` to the file at `path`, and syncs it.
pub fn append(path: &Path, json: &[u8]) -> Result<(), String> {
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
pub fn read(path: &Path) -> Result<(Vec<u8>, u64), String> {
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

/// The chat template given beside the source that the artifact at `path` carries (its index's
/// `chatTemplate`), if any.
pub fn chat_template(path: &Path) -> Result<Option<String>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Part {
        chat_template: Option<String>,
    }
    let (json, _) = read(path)?;
    let part: Part = serde_json::from_slice(&json).map_err(|e| format!("kiln index: {e}"))?;
    Ok(part.chat_template)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("a.gguf");
        std::fs::write(&path, b"GGUF-part").expect("write");
        append(&path, br#"{"chatTemplate":"{{ x }}","other":1}"#).expect("append");
        let (json, gguf) = read(&path).expect("read");
        assert_eq!(gguf, 9);
        assert!(json.starts_with(b"{\"chatTemplate\""));
        assert_eq!(
            chat_template(&path).expect("template").as_deref(),
            Some("{{ x }}")
        );
        std::fs::write(&path, b"GGUF-part").expect("write");
        append(&path, b"{}").expect("append");
        assert_eq!(chat_template(&path).expect("none"), None);
        std::fs::write(&path, b"GGUF and nothing else").expect("write");
        assert!(read(&path).expect_err("plain").contains("not a kiln"));
        let mut bad = b"{}".to_vec();
        bad.extend_from_slice(&u64::MAX.to_le_bytes());
        bad.extend_from_slice(MAGIC);
        std::fs::write(&path, &bad).expect("write");
        assert!(read(&path).expect_err("length").contains("corrupt"));
    }
}
