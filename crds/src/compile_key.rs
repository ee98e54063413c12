//! The content-addressed compile key: the sha256 of a canonical encoding of everything that can
//! change the bytes of a compiled artifact. Same inputs, same key, on any machine, forever.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Everything that determines an artifact. Maps are ordered, so the encoding is canonical no
/// matter in what order a YAML file listed them.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CompileKeyInput {
    /// sha256 of the model source.
    pub model_digest: String,
    /// The source's signature when it has one (absent from the encoding otherwise, so keys of
    /// unsigned sources are unchanged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_signature: Option<String>,
    /// Asset name → sha256.
    pub asset_digests: BTreeMap<String, String>,
    /// sha256 of the fixture file used for compile-time parity.
    pub fixture_digest: String,
    /// Backend name.
    pub backend: String,
    /// Backend version; for a runtime loaded at run time (ONNX Runtime) it names the library's
    /// bytes too (`1.31.1@sha256:<hex>`), so a swapped library is another key.
    pub backend_version: String,
    /// Digest of the compiler image, for foreign backends.
    pub compiler_image: Option<String>,
    /// Compiler command in that image (absent from the encoding when empty, so keys of
    /// built-in backends are unchanged).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compiler_command: Vec<String>,
    /// Precision.
    pub precision: String,
    /// Profile name → symbol → value.
    pub profiles: BTreeMap<String, BTreeMap<String, i64>>,
    /// Class label key → value.
    pub class: BTreeMap<String, String>,
    /// Backend flags.
    pub flags: BTreeMap<String, String>,
    /// Typed backend settings (execution provider, optimisation level, CPU fallback policy;
    /// absent from the encoding when empty, so keys of targets that set none are unchanged).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub backend_options: BTreeMap<String, String>,
    /// For a source that names no tensors (an MLIR function: `format: stablehlo` or `mlir`), its
    /// format, which picks the compiler's input type, and the declared inputs and outputs bound
    /// to the function in order, which the artifact calls it by (`in bytes i32 [1,2048]`);
    /// empty, and absent from the encoding, for ONNX and GGUF, whose files name their tensors,
    /// so their keys are unchanged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub declared_interface: Vec<String>,
}

impl CompileKeyInput {
    /// What `target` compiles for a class with the given backend version: the one derivation
    /// the operator (which names the Job) and the compile worker (which checks it) share.
    pub fn for_target(
        model: &crate::ModelArtifactSpec,
        target: &crate::CompiledTargetSpec,
        class: &crate::class::ClassFacts,
        backend_version: &str,
    ) -> Self {
        Self {
            model_digest: model.source.sha256.clone(),
            source_signature: model.source.signature.clone(),
            asset_digests: model
                .assets
                .iter()
                .map(|a| (a.name.clone(), a.sha256.clone()))
                .collect(),
            fixture_digest: model
                .fixture(&target.warmup.fixture_version)
                .map(|f| f.sha256.clone())
                .unwrap_or_default(),
            backend: target.backend.kind.as_str().to_string(),
            backend_version: backend_version.to_string(),
            compiler_image: target.backend.image.clone(),
            compiler_command: target.backend.command.clone(),
            precision: target.precision.as_str().to_string(),
            profiles: target
                .profiles
                .iter()
                .map(|p| (p.name.clone(), p.dims.clone()))
                .collect(),
            class: class.clone(),
            flags: target.backend.flags.clone(),
            backend_options: keyed_options(target, class),
            declared_interface: declared_interface(model),
        }
    }
}

/// [`CompileKeyInput::declared_interface`] of `model`.
fn declared_interface(model: &crate::ModelArtifactSpec) -> Vec<String> {
    use crate::model_artifact::ModelFormat;
    if !matches!(model.format, ModelFormat::Stablehlo | ModelFormat::Mlir) {
        return Vec::new();
    }
    let tensor = |side: &str, t: &crate::model_artifact::TensorSpec| {
        let dims: Vec<String> = t
            .dims
            .iter()
            .map(|d| match (&d.size, &d.symbol) {
                (Some(size), _) => size.to_string(),
                (None, Some(symbol)) => {
                    format!("{symbol}:{}..{}", d.min.unwrap_or(0), d.max.unwrap_or(0))
                }
                (None, None) => "?".into(),
            })
            .collect();
        format!(
            "{side} {} {} [{}]",
            t.name,
            t.dtype.as_str(),
            dims.join(",")
        )
    };
    std::iter::once(format!("format {}", model.format.as_str()))
        .chain(model.inputs.iter().map(|t| tensor("in", t)))
        .chain(model.outputs.iter().map(|t| tensor("out", t)))
        .collect()
}

/// The typed backend settings as keyed: [`crate::compiled_target::Backend::options`], and with
/// `llamacpp` quantisation `auto` the `warmup.memoryBudget` it fits, as written (another
/// spelling of one size is another key: a compile more, never a wrong hit). The class's memory
/// facts it also fits are in the key's class.
fn keyed_options(
    target: &crate::CompiledTargetSpec,
    class: &crate::class::ClassFacts,
) -> BTreeMap<String, String> {
    let mut options = target.backend.options(class);
    let auto = target.backend.kind == crate::compiled_target::BackendKind::Llamacpp
        && target
            .backend
            .llamacpp
            .as_ref()
            .and_then(|l| l.quantization)
            == Some(crate::llamacpp::Quantization::Auto);
    if let Some(budget) = target.warmup.memory_budget.as_deref().filter(|_| auto) {
        options.insert("llamacpp.autoMemoryBudget".into(), budget.to_string());
    }
    options
}

/// Version of the encoding; bump it when [`CompileKeyInput`] changes meaning.
const KEY_SCHEME: &str = "kiln.dev/compile-key/v1";

/// Whether `hex` is a bare sha256 (64 hex digits, either case): what a digest or compile key
/// must be before it names a file, a directory or a tag.
pub fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The compile key: lowercase hex sha256.
pub fn compile_key(input: &CompileKeyInput) -> String {
    // serde_json writes struct fields in declaration order and BTreeMaps sorted: canonical.
    let encoded = serde_json::to_vec(input).unwrap_or_default();
    let mut hasher = Sha256::new();
    hasher.update(KEY_SCHEME.as_bytes());
    hasher.update([0u8]);
    hasher.update(&encoded);
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CompileKeyInput {
        CompileKeyInput {
            model_digest: "a".repeat(64),
            source_signature: None,
            asset_digests: BTreeMap::from([
                ("tok".into(), "b".repeat(64)),
                ("pre".into(), "c".repeat(64)),
            ]),
            fixture_digest: "d".repeat(64),
            backend: "tract".into(),
            backend_version: "0.23.9".into(),
            compiler_image: None,
            compiler_command: Vec::new(),
            precision: "fp32".into(),
            profiles: BTreeMap::from([("p1".into(), BTreeMap::from([("batch".into(), 1)]))]),
            class: BTreeMap::from([
                ("kubernetes.io/arch".into(), "amd64".into()),
                ("kiln.dev/cpu-level".into(), "x86-64-v3".into()),
            ]),
            flags: BTreeMap::from([("opt".into(), "1".into())]),
            backend_options: BTreeMap::new(),
            declared_interface: Vec::new(),
        }
    }

    #[test]
    fn key_is_stable_under_map_order() {
        // Built from YAML with the keys in another order: same key.
        let yaml = r#"
flags: {opt: "1"}
class: {kiln.dev/cpu-level: x86-64-v3, kubernetes.io/arch: amd64}
profiles: {p1: {batch: 1}}
assetDigests: {pre: cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc, tok: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb}
"#;
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Maps {
            flags: BTreeMap<String, String>,
            class: BTreeMap<String, String>,
            profiles: BTreeMap<String, BTreeMap<String, i64>>,
            asset_digests: BTreeMap<String, String>,
        }
        let maps: Maps = serde_saphyr::from_str(yaml).expect("yaml");
        let mut other = sample();
        other.flags = maps.flags;
        other.class = maps.class;
        other.profiles = maps.profiles;
        other.asset_digests = maps.asset_digests;
        assert_eq!(compile_key(&sample()), compile_key(&other));
        assert_eq!(compile_key(&sample()).len(), 64);
    }

    #[test]
    fn mlir_keys_name_the_format_and_the_declaration_and_onnx_keys_do_not() {
        let spec = |format: &str, output: &str| -> crate::ModelArtifactSpec {
            serde_saphyr::from_str(&format!(
                r#"
source: {{uri: "file://m", sha256: "{}", size: 1}}
format: {format}
inputs: [{{name: bytes, dtype: i32, dims: [{{symbol: batch, min: 1, max: 8}}, {{size: 2048}}]}}]
outputs: [{{name: {output}, dtype: f32, dims: [{{size: 1}}, {{size: 214}}]}}]
fixtures: [{{version: v1, uri: "file://f", sha256: "{}"}}]
"#,
                "a".repeat(64),
                "b".repeat(64)
            ))
            .expect("spec")
        };
        let onnx = declared_interface(&spec("onnx", "scores"));
        assert!(onnx.is_empty(), "{onnx:?}");
        let encoded = serde_json::to_string(&sample()).expect("encode");
        assert!(!encoded.contains("declaredInterface"), "{encoded}");
        let stablehlo = declared_interface(&spec("stablehlo", "scores"));
        assert_eq!(
            stablehlo,
            vec![
                "format stablehlo",
                "in bytes i32 [batch:1..8,2048]",
                "out scores f32 [1,214]"
            ]
        );
        assert_ne!(stablehlo, declared_interface(&spec("mlir", "scores")));
        assert_ne!(stablehlo, declared_interface(&spec("stablehlo", "probs")));
    }

    #[test]
    fn built_in_backends_encode_no_compiler_command() {
        // Keys stored before `exec` existed must stay valid: the field is left out when empty.
        let encoded = serde_json::to_string(&sample()).expect("encode");
        assert!(!encoded.contains("compilerCommand"), "{encoded}");
        let mut exec = sample();
        exec.compiler_command = vec!["cp".into()];
        let encoded = serde_json::to_string(&exec).expect("encode");
        assert!(encoded.contains(r#""compilerCommand":["cp"]"#), "{encoded}");
    }

    #[test]
    fn key_changes_when_any_input_changes() {
        let base = compile_key(&sample());
        type Edit = Box<dyn Fn(&mut CompileKeyInput)>;
        let edits: Vec<(&str, Edit)> = vec![
            ("model", Box::new(|i| i.model_digest = "e".repeat(64))),
            (
                "asset",
                Box::new(|i| {
                    i.asset_digests.insert("tok".into(), "f".repeat(64));
                }),
            ),
            (
                "asset added",
                Box::new(|i| {
                    i.asset_digests.insert("tmpl".into(), "f".repeat(64));
                }),
            ),
            ("fixture", Box::new(|i| i.fixture_digest = "0".repeat(64))),
            ("backend", Box::new(|i| i.backend = "onnxruntime".into())),
            (
                "backend version",
                Box::new(|i| i.backend_version = "0.23.10".into()),
            ),
            (
                "compiler image",
                Box::new(|i| i.compiler_image = Some("sha256:1".into())),
            ),
            (
                "compiler command",
                Box::new(|i| i.compiler_command = vec!["onnxsim".into()]),
            ),
            (
                "compiler argument",
                Box::new(|i| i.compiler_command = vec!["onnxsim".into(), "--fold".into()]),
            ),
            ("precision", Box::new(|i| i.precision = "fp16".into())),
            (
                "profile value",
                Box::new(|i| {
                    i.profiles
                        .insert("p1".into(), BTreeMap::from([("batch".into(), 2)]));
                }),
            ),
            (
                "profile added",
                Box::new(|i| {
                    i.profiles
                        .insert("p2".into(), BTreeMap::from([("batch".into(), 1)]));
                }),
            ),
            (
                "class",
                Box::new(|i| {
                    i.class
                        .insert("kiln.dev/cpu-level".into(), "x86-64-v4".into());
                }),
            ),
            (
                "flags",
                Box::new(|i| {
                    i.flags.insert("opt".into(), "2".into());
                }),
            ),
            (
                "runtime library bytes",
                Box::new(|i| i.backend_version = format!("0.23.9@sha256:{}", "1".repeat(64))),
            ),
            (
                "execution provider",
                Box::new(|i| {
                    i.backend_options
                        .insert("executionProvider".into(), "cuda".into());
                }),
            ),
            (
                "declared interface",
                Box::new(|i| i.declared_interface = vec!["format mlir".into()]),
            ),
            (
                "optimisation level",
                Box::new(|i| {
                    i.backend_options
                        .insert("optimizationLevel".into(), "all".into());
                }),
            ),
            (
                "cpu fallback policy",
                Box::new(|i| {
                    i.backend_options
                        .insert("cpuFallback".into(), "UpToShare:10".into());
                }),
            ),
        ];
        let mut seen = std::collections::BTreeSet::from([base.clone()]);
        for (what, edit) in edits {
            let mut input = sample();
            edit(&mut input);
            let key = compile_key(&input);
            assert_ne!(key, base, "changing {what} must change the key");
            assert!(
                seen.insert(key),
                "changing {what} collided with another edit"
            );
        }
    }

    #[test]
    fn backend_options_fill_defaults_and_stay_out_of_tract_keys() {
        use crate::compiled_target::{
            Backend, BackendKind, CpuFallback, CpuFallbackPolicy, ExecutionProvider,
            OptimizationLevel,
        };
        let backend = Backend::of;
        // A tract target that sets nothing keeps the key it had before these settings existed.
        let cpu = BTreeMap::from([("kubernetes.io/arch".to_string(), "amd64".to_string())]);
        assert!(backend(BackendKind::Tract).options(&cpu).is_empty());
        let encoded = serde_json::to_string(&sample()).expect("encode");
        assert!(!encoded.contains("backendOptions"), "{encoded}");
        // ONNX Runtime: spelling out the defaults gives the same options as leaving them out.
        let implicit = backend(BackendKind::Onnxruntime);
        let mut explicit = implicit.clone();
        explicit.execution_provider = Some(ExecutionProvider::Cpu);
        explicit.optimization_level = Some(OptimizationLevel::Extended);
        explicit.cpu_fallback = Some(CpuFallback {
            policy: CpuFallbackPolicy::Allowed,
            max_share_percent: None,
        });
        assert_eq!(implicit.options(&cpu), explicit.options(&cpu));
        assert_eq!(
            implicit.options(&cpu),
            BTreeMap::from([
                ("cpuFallback".into(), "Allowed".into()),
                ("executionProvider".into(), "cpu".into()),
                ("optimizationLevel".into(), "extended".into()),
            ])
        );
        explicit.cpu_fallback = Some(CpuFallback {
            policy: CpuFallbackPolicy::UpToShare,
            max_share_percent: Some(10),
        });
        assert_eq!(explicit.options(&cpu)["cpuFallback"], "UpToShare:10");
        // The words in existing keys stay as they were; the strict policy gets its own.
        for (policy, word) in [
            (CpuFallbackPolicy::Forbidden, "Forbidden"),
            (CpuFallbackPolicy::Allowed, "Allowed"),
            (CpuFallbackPolicy::Strict, "Strict"),
        ] {
            explicit.cpu_fallback = Some(CpuFallback {
                policy,
                max_share_percent: None,
            });
            assert_eq!(explicit.options(&cpu)["cpuFallback"], word);
        }
        // Unset, the provider follows the class: CUDA where the class has an NVIDIA GPU.
        let mut gpu = cpu.clone();
        gpu.insert(
            "nvidia.com/gpu.product".into(),
            "NVIDIA-H100-80GB-HBM3".into(),
        );
        assert_eq!(implicit.options(&gpu)["executionProvider"], "cuda");
        assert_eq!(
            explicit.options(&gpu)["executionProvider"],
            "cpu",
            "named: kept"
        );
        assert!(backend(BackendKind::Tract).options(&gpu).is_empty());
    }

    #[test]
    fn llamacpp_keys_name_the_gpu_only_on_gpu_classes() {
        use crate::compiled_target::{Backend, BackendKind, ExecutionProvider};
        let cpu = BTreeMap::from([("kubernetes.io/arch".to_string(), "amd64".to_string())]);
        let mut gpu = cpu.clone();
        gpu.insert("nvidia.com/gpu.product".into(), "NVIDIA-H200".into());
        let implicit = Backend::of(BackendKind::Llamacpp);
        let mut cpu_named = implicit.clone();
        cpu_named.execution_provider = Some(ExecutionProvider::Cpu);
        // The keys CPU targets had before GPU engines existed, named or not.
        let before = BTreeMap::from([
            ("llamacpp.contextLength".to_string(), "512".to_string()),
            ("llamacpp.quantization".to_string(), "source".to_string()),
        ]);
        assert_eq!(implicit.options(&cpu), before);
        assert_eq!(cpu_named.options(&cpu), before);
        assert_eq!(
            cpu_named.options(&gpu),
            before,
            "named cpu: kept on a GPU class"
        );
        assert_eq!(implicit.provider_for(&gpu), ExecutionProvider::Cuda);
        assert_eq!(implicit.options(&gpu)["executionProvider"], "cuda");
        assert_ne!(implicit.options(&gpu), before);
    }

    #[test]
    fn cuda_graphs_key_only_cuda_classes_and_only_when_on() {
        use crate::compiled_target::{Backend, BackendKind, CudaSettings};
        let cpu = BTreeMap::from([("kubernetes.io/arch".to_string(), "amd64".to_string())]);
        let mut gpu = cpu.clone();
        gpu.insert(
            "nvidia.com/gpu.product".into(),
            "NVIDIA-H100-80GB-HBM3".into(),
        );
        let with = |graphs: Option<bool>| Backend {
            cuda: Some(CudaSettings {
                cuda_graphs: graphs,
                ..CudaSettings::default()
            }),
            ..Backend::of(BackendKind::Onnxruntime)
        };
        let key = |b: &Backend, class: &BTreeMap<String, String>| {
            let mut input = sample();
            input.backend_options = b.options(class);
            compile_key(&input)
        };
        let (unset, off, on) = (with(None), with(Some(false)), with(Some(true)));
        // On a CUDA class the setting is part of the key; off keys like unset (and like every
        // key made before the setting existed).
        assert_ne!(key(&on, &gpu), key(&off, &gpu));
        assert_eq!(key(&off, &gpu), key(&unset, &gpu));
        assert_eq!(
            key(&unset, &gpu),
            key(&Backend::of(BackendKind::Onnxruntime), &gpu)
        );
        assert_eq!(on.options(&gpu)["cuda.cudaGraphs"], "true");
        // On a CPU class the CUDA settings do not apply and do not key.
        assert_eq!(key(&on, &cpu), key(&off, &cpu));
        // kind auto keys its CUDA candidate's setting.
        let auto = |b: &Backend| Backend {
            kind: BackendKind::Auto,
            ..b.clone()
        };
        assert_ne!(key(&auto(&on), &gpu), key(&auto(&off), &gpu));
    }

    #[test]
    fn moving_a_value_between_fields_changes_the_key() {
        // The encoding separates fields, so "ab"+"c" is not "a"+"bc".
        let mut a = sample();
        a.backend = "tractx".into();
        a.backend_version = "0.23.9".into();
        let mut b = sample();
        b.backend = "tract".into();
        b.backend_version = "x0.23.9".into();
        assert_ne!(compile_key(&a), compile_key(&b));
    }
}
