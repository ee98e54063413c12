//! llama.cpp's process-wide state, below the backend and its engine (both use it).

use std::sync::OnceLock;

use llama_cpp_2::llama_backend::LlamaBackend;

/// llama.cpp's process-wide state, initialised once (its logs go to tracing).
pub(super) fn backend() -> std::result::Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| format!("llama.cpp: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}
