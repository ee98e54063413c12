//! The one call into llama.cpp that `llama-cpp-2` does not wrap: its quantiser,
//! `llama_model_quantize`. Reviewed FFI boundary: the only `unsafe` in kiln-agent.

use std::ffi::CString;
use std::path::Path;

use kiln_crds::llamacpp::Quantization;

/// llama.cpp's file type for a concrete weight type.
fn ftype(q: Quantization) -> Option<llama_cpp_sys_2::llama_ftype> {
    use llama_cpp_sys_2 as sys;
    Some(match q {
        Quantization::Auto => return None,
        Quantization::F32 => sys::LLAMA_FTYPE_ALL_F32,
        Quantization::F16 => sys::LLAMA_FTYPE_MOSTLY_F16,
        Quantization::Q8_0 => sys::LLAMA_FTYPE_MOSTLY_Q8_0,
        Quantization::Q6K => sys::LLAMA_FTYPE_MOSTLY_Q6_K,
        Quantization::Q5KM => sys::LLAMA_FTYPE_MOSTLY_Q5_K_M,
        Quantization::Q4KM => sys::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        Quantization::Q4_0 => sys::LLAMA_FTYPE_MOSTLY_Q4_0,
    })
}

/// Writes `input` requantised to `to` into `output` with `threads` threads (llama.cpp's own
/// quantiser: the type mix per tensor, the k-quant fallbacks for rows it cannot block, exactly
/// as `llama-quantize` does it). The input must have passed [`super::gguf::read`].
pub fn quantize(input: &Path, output: &Path, to: Quantization, threads: i32) -> Result<(), String> {
    let ftype = ftype(to).ok_or("auto is resolved before quantising")?;
    let c = |p: &Path| {
        p.to_str()
            .and_then(|s| CString::new(s).ok())
            .ok_or_else(|| format!("path {} is not valid UTF-8 without NUL", p.display()))
    };
    let (input, output) = (c(input)?, c(output)?);
    // SAFETY: `llama_model_quantize_default_params` returns a plain struct by value whose
    // pointer fields (imatrix, kv_overrides, tt_overrides, prune_layers) are null, which
    // llama.cpp reads as "none"; only scalar fields are changed here. `input` and `output` are
    // NUL-terminated strings that outlive the call, and `params` lives on this stack frame for
    // the whole call, which is synchronous and keeps no pointer to any of them afterwards.
    // llama.cpp reports a bad input as a non-zero return (its C++ exceptions are caught inside
    // `llama_model_quantize`), so no unwinding crosses the boundary.
    #[allow(unsafe_code)]
    let status = unsafe {
        let mut params = llama_cpp_sys_2::llama_model_quantize_default_params();
        params.nthread = threads;
        params.ftype = ftype;
        params.allow_requantize = true;
        llama_cpp_sys_2::llama_model_quantize(input.as_ptr(), output.as_ptr(), &params)
    };
    if status == 0 {
        Ok(())
    } else {
        Err(format!(
            "llama.cpp's quantiser returned {status} (its log says why)"
        ))
    }
}
