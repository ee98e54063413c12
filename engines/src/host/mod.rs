//! Facts of the machine the agent runs on, and the limits it holds itself to there: the hardware
//! probe ([`probe`]: CPU, memory, NVIDIA GPUs), whether a class's facts hold on it ([`compat`]),
//! the heap ceiling ([`memory`], the binary's global allocator), the GPU memory a process holds
//! ([`device_memory`]) and the host pid NVML names it by ([`pid`]). Reads `/proc`, the cgroup
//! and NVML; writes nothing, and knows nothing of engines, the pipeline or the cluster.

pub mod compat;
pub mod device_memory;
pub mod memory;
pub mod pid;
pub mod probe;
