//! The build manifest a compile writes beside its artifact: enough to re-check compatibility on
//! the node and to explain to a human how the artifact was made.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::kiln_node::HardwareFacts;
use crate::placement::Placement;

/// Schema version of [`BuildManifest`].
pub const MANIFEST_VERSION: u32 = 1;

/// How an artifact was made.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BuildManifest {
    /// Schema version.
    pub manifest_version: u32,
    /// Compile key the artifact is stored under.
    pub compile_key: String,
    /// sha256 of the artifact bytes.
    pub artifact_digest: String,
    /// Artifact size in bytes.
    pub artifact_size: u64,
    /// Artifact media type (`application/vnd.kiln.tract.nnef.v1.tar`).
    pub media_type: String,
    /// Backend name.
    pub backend: String,
    /// Backend version that built it.
    pub backend_version: String,
    /// kiln-agent version that built it.
    pub tool_version: String,
    /// Precision.
    pub precision: String,
    /// Profile name → input name → concrete shape.
    pub profiles: BTreeMap<String, BTreeMap<String, Vec<usize>>>,
    /// Class label values the artifact targets.
    pub class: BTreeMap<String, String>,
    /// Facts of the machine that built it.
    pub host: HardwareFacts,
    /// Backend flags.
    pub flags: BTreeMap<String, String>,
    /// Digests of everything that went in: `model`, `asset/<name>`, `fixture/<version>`.
    pub inputs: BTreeMap<String, String>,
    /// Output names of the compiled graph, in order.
    pub outputs: Vec<String>,
    /// Operators the backend could not handle (empty for a successful compile).
    pub unsupported_operators: Vec<String>,
    /// Largest absolute error of the compiled engine against the source on the fixtures.
    pub parity_max_abs_error: Option<f64>,
    /// Seconds the compile took.
    pub compile_seconds: f64,
    /// What the converter said.
    pub converter_log: Vec<String>,
    /// Typed backend settings that shaped the artifact, as in the compile key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backend_options: BTreeMap<String, String>,
    /// sha256 of the runtime library that built it, for a runtime loaded at run time (ONNX
    /// Runtime); a node must load the same bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_digest: Option<String>,
    /// Set when the artifact depends on the build machine's instruction set (ONNX Runtime's
    /// layout optimisations): a node must match it to load the artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_to: Option<MachineBinding>,
    /// Which provider ran which nodes in the compile's parity run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// `backend.kind: auto`: every engine candidate the compile tried and which one it kept
    /// (`backend` and `backendOptions` above are the kept one's, which is what a node loads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<crate::engine::EngineSelection>,
}

impl BuildManifest {
    /// The engine the artifact runs on: `tract`, or `onnxruntime/<provider>`.
    pub fn engine(&self) -> String {
        match self.backend_options.get("executionProvider") {
            Some(provider) => crate::compiled_target::engine_name(&self.backend, provider),
            None => self.backend.clone(),
        }
    }
}

/// The machine an artifact is bound to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MachineBinding {
    /// CPU architecture (`amd64`).
    pub arch: String,
    /// x86-64 level (`x86-64-v4`) or `baseline`.
    pub cpu_level: String,
    /// Why it is bound, for the refusal message.
    pub why: String,
}
