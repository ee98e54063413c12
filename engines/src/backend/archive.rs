//! The tar archives the built-in backends store their artifacts as: written deterministically
//! (fixed mtime and mode, so the same compile gives the same bytes) and read back by entry name
//! into memory, never extracted, so a name with `..` or a leading `/` reaches nothing.
//! Reads only the artifact path it is given.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use kiln_node_core::error::{Error, Result};

/// Fixed mtime so the same model compiles to the same bytes.
const MTIME: u64 = 315_532_800;

/// Appends `bytes` as the file `path`.
pub fn append(builder: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8]) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(MTIME);
    header.set_cksum();
    builder
        .append_data(&mut header, path, bytes)
        .map_err(|e| Error::CompileFailed(format!("archiving {path}: {e}")))
}

/// Every entry of the archive at `artifact`, by name; the error says what is wrong with it.
pub fn entries(artifact: &Path) -> std::result::Result<BTreeMap<String, Vec<u8>>, String> {
    let file = std::fs::File::open(artifact).map_err(|e| e.to_string())?;
    let mut archive = tar::Archive::new(file);
    let not_tar = |e: std::io::Error| format!("not a readable tar archive: {e}");
    let mut files = BTreeMap::new();
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        let path = entry
            .path()
            .map_err(not_tar)?
            .to_string_lossy()
            .into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(not_tar)?;
        files.insert(path, bytes);
    }
    Ok(files)
}

/// One compiled profile as an artifact's configuration records it: its name and each input's
/// shape.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
pub struct ProfileEntry {
    /// The profile's name.
    pub name: String,
    /// Input name and concrete shape.
    pub inputs: Vec<(String, Vec<usize>)>,
}

/// The two entries of a built-in backend's artifact, `config` (JSON, parsed as `T`) and
/// `payload`, read by name; any other entry, or one missing, is an error naming the `kind` of
/// artifact expected.
pub fn config_and_payload<T: serde::de::DeserializeOwned>(
    artifact: &Path,
    config: &str,
    payload: &str,
    kind: &str,
) -> std::result::Result<(T, Vec<u8>), String> {
    let mut files = entries(artifact)?;
    if let Some(other) = files.keys().find(|k| *k != config && *k != payload) {
        return Err(format!(
            "unexpected entry {other:?}: not a kiln {kind} artifact"
        ));
    }
    let mut take = |name: &str| {
        files
            .remove(name)
            .ok_or_else(|| format!("no {name}: not a kiln {kind} artifact"))
    };
    let (json, payload) = (take(config)?, take(payload)?);
    let parsed = serde_json::from_slice(&json).map_err(|e| format!("{config}: {e}"))?;
    Ok((parsed, payload))
}
