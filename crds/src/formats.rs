//! Which backend kinds take which model format: a pure rule over the two objects, checked alike
//! by the operator's validation and by the agent (`kiln-agent local` and the compile), since the
//! CEL rules of a CompiledTarget cannot see its ModelArtifact.

use crate::compiled_target::BackendKind;
use crate::model_artifact::ModelFormat;

/// Whether a backend kind can take a model of `format`, and why not: GGUF runs only on
/// llama.cpp, and llama.cpp runs only GGUF; StableHLO and other MLIR only IREE compiles; the
/// other kinds take ONNX. Checked alike by the operator and by `kiln-agent local`, since the two
/// objects' CEL rules cannot see each other.
pub fn accepts(kind: BackendKind, format: ModelFormat) -> Result<(), String> {
    match (kind, format) {
        (BackendKind::Llamacpp, ModelFormat::Gguf) => Ok(()),
        (BackendKind::Iree, ModelFormat::Stablehlo | ModelFormat::Mlir) => Ok(()),
        (BackendKind::Auto, ModelFormat::Stablehlo | ModelFormat::Mlir) => Err(format!(
            "backend.kind auto measures engines that read ONNX, and the model is {}; MLIR is compiled by IREE: set backend.kind: iree",
            format.as_str()
        )),
        (kind, ModelFormat::Stablehlo | ModelFormat::Mlir) => Err(format!(
            "backend.kind {} does not read {} (MLIR); IREE compiles it: set backend.kind: iree",
            kind.as_str(),
            format.as_str()
        )),
        (BackendKind::Llamacpp, other) => Err(format!(
            "backend.kind llamacpp runs GGUF language models, and the model's format is {}; use another backend kind or a GGUF model",
            other.as_str()
        )),
        (BackendKind::Auto, ModelFormat::Gguf) => Err(
            "backend.kind auto measures ONNX engines (tract, ONNX Runtime); a GGUF model runs on llama.cpp: set backend.kind: llamacpp".into(),
        ),
        (kind, ModelFormat::Gguf) => Err(format!(
            "backend.kind {} takes ONNX models, and the model is GGUF: set backend.kind: llamacpp",
            kind.as_str()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_and_llamacpp_go_together_and_auto_refuses_gguf() {
        assert!(accepts(BackendKind::Llamacpp, ModelFormat::Gguf).is_ok());
        assert!(accepts(BackendKind::Tract, ModelFormat::Onnx).is_ok());
        for kind in [
            BackendKind::Tract,
            BackendKind::Onnxruntime,
            BackendKind::Exec,
            BackendKind::Auto,
        ] {
            let err = accepts(kind, ModelFormat::Gguf).expect_err("gguf on an onnx engine");
            assert!(err.contains("llamacpp"), "{err}");
        }
        let err = accepts(BackendKind::Llamacpp, ModelFormat::Onnx).expect_err("onnx on llama");
        assert!(err.contains("onnx"), "{err}");
    }

    #[test]
    fn mlir_goes_to_iree_only() {
        for format in [ModelFormat::Stablehlo, ModelFormat::Mlir] {
            assert!(accepts(BackendKind::Iree, format).is_ok());
            for kind in [
                BackendKind::Tract,
                BackendKind::Onnxruntime,
                BackendKind::Llamacpp,
                BackendKind::Exec,
                BackendKind::Auto,
            ] {
                let err = accepts(kind, format).expect_err("mlir on another engine");
                assert!(err.contains("set backend.kind: iree"), "{err}");
                assert!(err.contains(format.as_str()), "{err}");
            }
        }
        assert!(accepts(BackendKind::Iree, ModelFormat::Onnx).is_ok());
        assert!(accepts(BackendKind::Iree, ModelFormat::Gguf).is_err());
    }
}
