//! ONNX Runtime's words as kiln reads them: its errors as failure reasons, its provider names.
//! Pure; below the session code (`mod.rs`, `engine.rs`, `graphs.rs`) that uses both.

use kiln_crds::compiled_target::ExecutionProvider;

use kiln_node_core::error::Error;

/// An ONNX Runtime error as a failure reason: a missing kernel or a provider that cannot take
/// the graph is `UnsupportedOperator`, a provider that cannot start `IncompatibleRuntime`,
/// anything else `other`.
pub(super) fn classify(e: ort::Error, what: &str, other: fn(String) -> Error) -> Error {
    classify_message(e.to_string(), what, other)
}

/// [`classify`] on ONNX Runtime's message. Pure.
pub(super) fn classify_message(message: String, what: &str, other: fn(String) -> Error) -> Error {
    let lower = message.to_ascii_lowercase();
    // ONNX Runtime refuses to capture a graph with nodes on another provider, copies between
    // providers, or control flow (`If`, `Loop`, `Scan`).
    if lower.contains("graph capture") || lower.contains("cuda graph") {
        return Error::UnsupportedOperator {
            backend: "onnxruntime".into(),
            operators: vec![format!(
                "{what}: {message}; backend.cuda.cudaGraphs needs every compute node on the CUDA provider, no copy between providers and no control flow: turn cudaGraphs off for this model"
            )],
        };
    }
    if lower.contains("could not find an implementation")
        || lower.contains("not implemented")
        || lower.contains("fallback to cpu ep has been explicitly disabled")
    {
        return Error::UnsupportedOperator {
            backend: "onnxruntime".into(),
            operators: vec![message],
        };
    }
    let provider_missing = lower.contains("execution provider")
        && ["not enabled", "not available", "not built", "not supported"]
            .iter()
            .any(|m| lower.contains(m));
    if provider_missing || lower.contains("failed to load library") {
        return Error::IncompatibleRuntime(format!(
            "{what}: {message}; this ONNX Runtime library does not carry the requested execution provider (the GPU providers need the onnxruntime-gpu build and its CUDA libraries)"
        ));
    }
    other(format!("{what}: {message}"))
}

/// The name ONNX Runtime gives a provider.
pub fn provider_name(provider: ExecutionProvider) -> &'static str {
    match provider {
        ExecutionProvider::Cpu => "CPUExecutionProvider",
        ExecutionProvider::Cuda => "CUDAExecutionProvider",
        ExecutionProvider::Tensorrt => "TensorrtExecutionProvider",
    }
}
