//! The embedded example: SqueezeNet (light variant from the ONNX project's backend test data),
//! its fixture and its YAML, so `kiln-agent local` runs with no file at all.

use std::path::{Path, PathBuf};

const YAML: &str = include_str!("../../examples/squeezenet/kiln.yaml");
const MODEL: &[u8] = include_bytes!("../../examples/squeezenet/model.onnx");
const FIXTURE: &[u8] = include_bytes!("../../examples/squeezenet/fixture-v1.safetensors");

/// Writes the example into `<store>/example/` and returns the YAML's path.
pub fn unpack(store: &Path) -> std::io::Result<PathBuf> {
    let dir = store.join("example");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("model.onnx"), MODEL)?;
    std::fs::write(dir.join("fixture-v1.safetensors"), FIXTURE)?;
    let yaml = dir.join("kiln.yaml");
    std::fs::write(&yaml, YAML)?;
    Ok(yaml)
}
