//! `ModelArtifact`: what a model is — its bytes by digest, its tensors, the assets and fixtures
//! bound to it. Content fields are immutable: a new model version is a new object.

use std::collections::BTreeSet;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;
use crate::schema::{SHA256_PATTERN, URI_PATTERN};

/// What a model is: source by digest, tensors, bound assets, versioned warmup fixtures.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kiln.dev",
    version = "v1alpha1",
    kind = "ModelArtifact",
    namespaced,
    status = "ModelArtifactStatus",
    shortname = "ma",
    category = "kiln",
    printcolumn = r#"{"name":"Format","type":"string","jsonPath":".spec.format"}"#,
    printcolumn = r#"{"name":"Sha256","type":"string","jsonPath":".spec.source.sha256","priority":1}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ModelArtifactSpec {
    /// Where the model bytes come from, with the digest they must hash to. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.source is immutable: create a new ModelArtifact for a new model version"))]
    pub source: Source,
    /// Serialisation format of the source. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.format is immutable"))]
    pub format: ModelFormat,
    /// Format version, e.g. the ONNX opset (`"17"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format_version: Option<String>,
    /// The model's inputs, in order, with dtypes and shapes; symbolic dims carry bounds. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.inputs is immutable"))]
    #[schemars(length(min = 1, max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub inputs: Vec<TensorSpec>,
    /// The model's outputs, when they should be checked against the graph (optional).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub outputs: Vec<TensorSpec>,
    /// Auxiliary files bound to this model (tokenizer, preprocessor, chat template), each by
    /// digest: a stale tokenizer changes outputs while the weights stay identical. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.assets is immutable"))]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub assets: Vec<Asset>,
    /// Versioned warmup fixtures. New versions may be added; an existing version never changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("oldSelf.all(f, self.exists(g, g.version == f.version && g.sha256 == f.sha256 && g.uri == f.uri))").message("fixture versions are immutable: add a new version instead of changing or removing one"))]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["version"]))]
    pub fixtures: Vec<Fixture>,
    /// SPDX licence identifier or licence name of the model weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// Where the model came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

/// A blob by URI, digest and size.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// `https://`, `file://` (local mode) or `oci://HOST[:PORT]/REPOSITORY@sha256:<manifest>[#FILE]`
    /// URI: a file of a CNCF ModelPack or other OCI artifact, by the manifest's digest (never a
    /// tag) and the file's annotated name (needed when the artifact has several files).
    #[schemars(regex(pattern = URI_PATTERN), length(max = 2048))]
    pub uri: String,
    /// Lowercase hex sha256 of the bytes; anything else is refused.
    #[schemars(regex(pattern = SHA256_PATTERN), length(min = 64, max = 64))]
    pub sha256: String,
    /// Size in bytes; a truncated or padded download is refused before hashing ends.
    #[schemars(range(min = 1))]
    pub size: i64,
    /// Signature of the source: what `cosign sign-blob --key` prints (base64 of an ECDSA P-256
    /// signature over the bytes' SHA-256), or an OpenSSF Model Signing bundle made by
    /// `model_signing sign key|certificate` over the model's directory, base64 (`base64 -w0
    /// model.sig`), which must sign exactly the source and every asset. Compile workers verify
    /// it against their trusted source keys and CA certificates (`--source-trust-key`) before
    /// anything is built; a signed source without a configured key, or with a signature no
    /// trusted key or CA made, is refused (`SignatureInvalid`). Part of the compile key, so an
    /// artifact built from a signed source was built after that check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[A-Za-z0-9+/]+={0,2}$"),
        length(min = 8, max = 16384)
    )]
    pub signature: Option<String>,
}

/// Serialisation formats kiln knows.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ModelFormat {
    /// ONNX protobuf.
    Onnx,
    /// `torch.export` program.
    TorchExport,
    /// Safetensors weights.
    Safetensors,
    /// GGUF.
    Gguf,
    /// StableHLO (`jax.export`, `torch_xla`, TensorFlow), MLIR text or bytecode (a portable
    /// artifact too): compiled by IREE only.
    Stablehlo,
    /// MLIR in any input dialect IREE's compiler takes (torch, TOSA, linalg), text or
    /// bytecode: compiled by IREE only.
    Mlir,
}

impl ModelFormat {
    /// Every variant, in declaration order.
    pub const ALL: [Self; 6] = [
        Self::Onnx,
        Self::TorchExport,
        Self::Safetensors,
        Self::Gguf,
        Self::Stablehlo,
        Self::Mlir,
    ];

    /// The name in specs, status, messages and metric labels (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Onnx => "onnx",
            Self::TorchExport => "torch-export",
            Self::Safetensors => "safetensors",
            Self::Gguf => "gguf",
            Self::Stablehlo => "stablehlo",
            Self::Mlir => "mlir",
        }
    }
}

/// Element types of tensors.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    Bf16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit signed integer.
    I8,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean.
    Bool,
}

impl DType {
    /// Every variant, in declaration order.
    pub const ALL: [Self; 8] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::I64,
        Self::I32,
        Self::I8,
        Self::U8,
        Self::Bool,
    ];

    /// The name in specs, status, messages and metric labels (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::I64 => "i64",
            Self::I32 => "i32",
            Self::I8 => "i8",
            Self::U8 => "u8",
            Self::Bool => "bool",
        }
    }
}

/// A named tensor with its dtype and shape.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TensorSpec {
    /// Tensor name as in the model graph.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    #[schemars(length(max = 16))]
    pub dims: Vec<Dim>,
}

/// One dimension: a fixed `size`, or a `symbol` with inclusive bounds that shape profiles bind.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.size) != has(self.symbol)").message("a dim has either size or symbol, not both"))]
#[x_kube(validation = Rule::new("!has(self.symbol) || (has(self.min) && has(self.max) && self.min <= self.max)").message("a symbolic dim needs min and max with min <= max"))]
#[x_kube(validation = Rule::new("has(self.symbol) || (!has(self.min) && !has(self.max))").message("min and max belong to symbolic dims only"))]
pub struct Dim {
    /// Fixed extent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub size: Option<i64>,
    /// Symbol name (e.g. `batch`), bound by a CompiledTarget shape profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[A-Za-z_][A-Za-z0-9_]*$"), length(max = 63))]
    pub symbol: Option<String>,
    /// Smallest value a profile may bind to the symbol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min: Option<i64>,
    /// Largest value a profile may bind to the symbol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max: Option<i64>,
}

/// Kinds of bound auxiliary asset.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum AssetKind {
    /// Tokenizer definition.
    Tokenizer,
    /// Input preprocessor configuration.
    Preprocessor,
    /// Chat template.
    ChatTemplate,
    /// Anything else the serving side reads.
    Other,
}

impl AssetKind {
    /// Every variant, in declaration order.
    pub const ALL: [Self; 4] = [
        Self::Tokenizer,
        Self::Preprocessor,
        Self::ChatTemplate,
        Self::Other,
    ];

    /// The name in specs, status, messages and metric labels (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tokenizer => "tokenizer",
            Self::Preprocessor => "preprocessor",
            Self::ChatTemplate => "chatTemplate",
            Self::Other => "other",
        }
    }
}

/// A file bound to the model by digest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Asset {
    /// Name, unique within the model.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// What the asset is.
    pub kind: AssetKind,
    /// Where it comes from.
    #[schemars(regex(pattern = URI_PATTERN), length(max = 2048))]
    pub uri: String,
    /// Lowercase hex sha256 of the file.
    #[schemars(regex(pattern = SHA256_PATTERN), length(min = 64, max = 64))]
    pub sha256: String,
    /// Size in bytes: a download of another size is refused before hashing ends. Required for a
    /// file larger than the fetch limit of undeclared sizes (`--fetch-max-bytes`, 1 GiB), such
    /// as the ONNX external data of a model over 2 GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub size: Option<i64>,
}

/// A versioned fixture file: named inputs and golden outputs in one safetensors file.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Fixture {
    /// Version that a CompiledTarget's warmup names.
    #[schemars(length(min = 1, max = 63))]
    pub version: String,
    /// Where the safetensors file comes from.
    #[schemars(regex(pattern = URI_PATTERN), length(max = 2048))]
    pub uri: String,
    /// Lowercase hex sha256 of the file.
    #[schemars(regex(pattern = SHA256_PATTERN), length(min = 64, max = 64))]
    pub sha256: String,
}

/// Where the model came from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    /// Revision of the source (commit, release, package version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_revision: Option<String>,
    /// What produced the file (exporter, training job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// Human-readable origin (project page, paper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// Observed state of a ModelArtifact.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelArtifactStatus {
    /// The generation these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// kstatus conditions: `Ready`, `Reconciling`, `Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl ModelArtifactSpec {
    /// The input with that name.
    pub fn input(&self, name: &str) -> Option<&TensorSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// The fixture with that version.
    pub fn fixture(&self, version: &str) -> Option<&Fixture> {
        self.fixtures.iter().find(|f| f.version == version)
    }

    /// Every symbol named by any input dim.
    pub fn symbols(&self) -> BTreeSet<&str> {
        self.inputs
            .iter()
            .flat_map(|i| i.dims.iter().filter_map(|d| d.symbol.as_deref()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::serde_names;

    #[test]
    fn formats_dtypes_and_asset_kinds_serialise_as_their_names() {
        serde_names(&ModelFormat::ALL, |f| f.as_str());
        serde_names(&DType::ALL, |d| d.as_str());
        serde_names(&AssetKind::ALL, |k| k.as_str());
    }
}
