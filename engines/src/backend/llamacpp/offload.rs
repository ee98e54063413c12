//! llama.cpp's parameters for a [`Device`], and what is checked before a model goes onto a GPU:
//! this build has kernels for it, llama.cpp lists it, and it has the memory free.

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::model::params::LlamaModelParams;

use super::device::{self, Device};
use kiln_node_core::error::{Error, Result};

/// Model parameters for `device`, for an engine of about `need` bytes: on the CPU, no layer on
/// a GPU (a CUDA build of llama.cpp would offload them all by default); on CUDA, every layer
/// and the output layer on the CUDA device [`cuda_device`] picks.
pub fn model_params(device: Device, need: u64) -> Result<LlamaModelParams> {
    match device {
        Device::Cpu => Ok(LlamaModelParams::default().with_n_gpu_layers(0)),
        Device::Cuda(architectures) => {
            let index = cuda_device(architectures, need)?;
            let params = LlamaModelParams::default()
                .with_devices(&[index])
                .map_err(|e| {
                    Error::IncompatibleHardware(format!("llama.cpp's device {index}: {e}"))
                })?;
            // More than the model has: llama.cpp offloads min(this, layers + 1).
            Ok(params.with_n_gpu_layers(u32::MAX))
        }
    }
}

/// Context parameters for `device` over `base`: on the CPU the KV cache and every operation
/// stay there (llama.cpp would otherwise move a large batch's work to a GPU it sees); on CUDA
/// the KV cache goes with the layers.
pub fn context_params(device: Device, base: LlamaContextParams) -> LlamaContextParams {
    match device {
        Device::Cpu => base.with_offload_kqv(false).with_op_offload(false),
        Device::Cuda(_) => base.with_offload_kqv(true),
    }
}

/// The llama.cpp device index of the GPU an engine of `need` bytes goes on, once the build's
/// `architectures` are known to run on it (NVML's compute capability of the first GPU),
/// llama.cpp lists a CUDA device, and that device has `need` bytes free. Every refusal is
/// `IncompatibleHardware`, naming what was found.
fn cuda_device(architectures: &str, need: u64) -> Result<usize> {
    let compute = crate::host::probe::first_gpu_compute().map_err(|e| {
        Error::IncompatibleHardware(format!("a CUDA engine needs an NVIDIA GPU: {e}"))
    })?;
    device::has_kernels(architectures, compute).map_err(Error::IncompatibleHardware)?;
    super::runtime::backend().map_err(Error::LoadFailed)?;
    let devices = llama_cpp_2::list_llama_ggml_backend_devices();
    let Some(gpu) = devices.iter().find(|d| d.backend == "CUDA") else {
        let seen: Vec<String> = devices
            .iter()
            .map(|d| format!("{} ({})", d.name, d.backend))
            .collect();
        return Err(Error::IncompatibleHardware(format!(
            "llama.cpp lists no CUDA device, only {}: is the GPU visible to this container (NVIDIA_VISIBLE_DEVICES, the nvidia.com/gpu claim)?",
            seen.join(", ")
        )));
    };
    let free = u64::try_from(gpu.memory_free).unwrap_or(u64::MAX);
    if need > free {
        return Err(Error::IncompatibleHardware(format!(
            "the engine needs about {need} bytes on {} ({}), which has {free} of {} free",
            gpu.name, gpu.description, gpu.memory_total
        )));
    }
    Ok(gpu.index)
}
