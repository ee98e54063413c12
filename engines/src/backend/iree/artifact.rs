//! The artifact an IREE compile writes: a tar of the compiled module (`module.vmfb`) and what
//! kiln needs to call it (`kiln-iree.json`: the compiler and target it was made with, the
//! function, the inputs in call order with their types, the outputs in return order), read back
//! by name, never extracted.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::archive::config_and_payload;

pub(super) const CONFIG: &str = "kiln-iree.json";
pub(super) const MODULE: &str = "module.vmfb";

/// How an artifact was made and how its function is called, stored in it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(super) struct ArtifactConfig {
    /// `iree-compile --version`'s version.
    pub(super) compiler_version: String,
    /// What the module was compiled for (`x86-64-v3`).
    pub(super) target_cpu: String,
    /// Every flag `iree-compile` got.
    pub(super) compiler_flags: Vec<String>,
    /// The exported function (`main` is called as `module.main`).
    pub(super) function: String,
    /// The compiled module's name where the source named its module (an MLIR source: `main` of
    /// `@jit__lambda` is called as `jit__lambda.main`); absent: `module`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) module: Option<String>,
    /// Inputs in call order, with their element types.
    pub(super) inputs: Vec<(String, safetensors::Dtype)>,
    /// Outputs in return order.
    pub(super) outputs: Vec<String>,
    /// The profiles the target declared (the module takes any shape they bind).
    pub(super) profiles: Vec<ProfileEntry>,
}

pub(super) use crate::backend::archive::ProfileEntry;

/// The configuration and the module of an artifact.
pub(super) fn read_artifact(
    artifact: &Path,
) -> std::result::Result<(ArtifactConfig, Vec<u8>), String> {
    config_and_payload(artifact, CONFIG, MODULE, "iree")
}
