//! The artifact an ONNX Runtime compile writes: a tar of the optimised graph and the session
//! configuration that produced it, read back by name (never extracted).

use std::path::Path;

use kiln_crds::compiled_target::{
    CpuFallback, CudaSettings, ExecutionProvider, OptimizationLevel, Precision,
};
use serde::{Deserialize, Serialize};

use crate::backend::archive::config_and_payload;

pub(super) const CONFIG: &str = "kiln-onnxruntime.json";
pub(super) const MODEL: &str = "model.onnx";

/// The configuration an artifact was made with, stored in it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(super) struct ArtifactConfig {
    pub(super) runtime_version: String,
    pub(super) runtime_sha256: String,
    pub(super) execution_provider: ExecutionProvider,
    pub(super) optimization_level: OptimizationLevel,
    pub(super) cpu_fallback: CpuFallback,
    /// `fp32` or `tf32`: whether the CUDA provider may use TensorFloat-32 (absent in artifacts
    /// made before it was recorded: exact fp32).
    #[serde(default)]
    pub(super) precision: Precision,
    /// The CUDA provider's settings (unused on other providers).
    #[serde(default)]
    pub(super) cuda: CudaSettings,
    pub(super) profiles: Vec<ProfileEntry>,
    pub(super) outputs: Vec<String>,
}

pub(super) use crate::backend::archive::ProfileEntry;

/// The configuration and the graph of an artifact, read by name (never extracted).
pub(super) fn read_artifact(
    artifact: &Path,
) -> std::result::Result<(ArtifactConfig, Vec<u8>), String> {
    config_and_payload(artifact, CONFIG, MODEL, "onnxruntime")
}
