//! Label and annotation keys that the operator, the agent and users share.

/// GPU Feature Discovery: GPU product name (may carry `-MIG-…` / `-SHARED` suffixes).
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// GPU Feature Discovery: CUDA compute capability, major.
pub const GPU_COMPUTE_MAJOR: &str = "nvidia.com/gpu.compute.major";
/// GPU Feature Discovery: CUDA compute capability, minor.
pub const GPU_COMPUTE_MINOR: &str = "nvidia.com/gpu.compute.minor";
/// GPU Feature Discovery: CUDA driver major version.
pub const CUDA_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver-version.major";
/// Well-known Kubernetes CPU architecture label.
pub const ARCH: &str = "kubernetes.io/arch";
/// kiln's CPU level label: `x86-64-v2`, `x86-64-v3`, `x86-64-v4`, or `baseline` elsewhere.
pub const CPU_LEVEL: &str = "kiln.dev/cpu-level";
/// The node-class id the operator puts on each node.
pub const NODE_CLASS: &str = "kiln.dev/class";

/// The class label keys a CompiledTarget uses when it names none.
pub const DEFAULT_CLASS_KEYS: [&str; 6] = [
    GPU_PRODUCT,
    GPU_COMPUTE_MAJOR,
    GPU_COMPUTE_MINOR,
    CUDA_DRIVER_MAJOR,
    ARCH,
    CPU_LEVEL,
];

/// The default class keys, owned, for serde defaults.
pub fn default_class_keys() -> Vec<String> {
    DEFAULT_CLASS_KEYS
        .iter()
        .map(|k| (*k).to_string())
        .collect()
}

/// The pod readiness gate and condition type the agent sets on serving pods.
pub const WARM_CONDITION: &str = "kiln.dev/warm";
/// Pod annotation naming the CompiledTarget (same namespace) a serving pod waits for.
pub const TARGET_ANNOTATION: &str = "kiln.dev/target";
