//! Label and annotation keys that the operator, the agent and users share, and the class facts
//! made of them (here, below both `class` and `compiled_target`, so each can read them).

/// Class facts: label key → normalised value, for the keys a node has.
pub type ClassFacts = std::collections::BTreeMap<String, String>;

/// GPU Feature Discovery: GPU product name (may carry `-MIG-…` / `-SHARED` suffixes).
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// GPU Feature Discovery: CUDA compute capability, major.
pub const GPU_COMPUTE_MAJOR: &str = "nvidia.com/gpu.compute.major";
/// GPU Feature Discovery: CUDA compute capability, minor.
pub const GPU_COMPUTE_MINOR: &str = "nvidia.com/gpu.compute.minor";
/// GPU Feature Discovery: the NVIDIA driver's major version (`580` for driver 580.65.06; GFD
/// files it under `cuda.`, but it is the driver's version, not CUDA's).
pub const DRIVER_MAJOR: &str = "nvidia.com/cuda.driver-version.major";
/// GPU Feature Discovery: the NVIDIA driver's minor version (`65`).
pub const DRIVER_MINOR: &str = "nvidia.com/cuda.driver-version.minor";
/// GPU Feature Discovery: the NVIDIA driver's revision, as written (`06`).
pub const DRIVER_REVISION: &str = "nvidia.com/cuda.driver-version.revision";
/// GPU Feature Discovery: the NVIDIA driver's version (`580.65.06`).
pub const DRIVER_FULL: &str = "nvidia.com/cuda.driver-version.full";
/// GPU Feature Discovery: the newest CUDA version the driver supports, major (`13`).
pub const CUDA_RUNTIME_MAJOR: &str = "nvidia.com/cuda.runtime-version.major";
/// GPU Feature Discovery: the newest CUDA version the driver supports, minor (`0`).
pub const CUDA_RUNTIME_MINOR: &str = "nvidia.com/cuda.runtime-version.minor";
/// GPU Feature Discovery: the newest CUDA version the driver supports (`13.0`).
pub const CUDA_RUNTIME_FULL: &str = "nvidia.com/cuda.runtime-version.full";
/// GPU Feature Discovery: memory of one GPU in MiB (`81559`).
pub const GPU_MEMORY: &str = "nvidia.com/gpu.memory";
/// GPU Feature Discovery: how many GPUs the node has.
pub const GPU_COUNT: &str = "nvidia.com/gpu.count";
/// Well-known Kubernetes CPU architecture label.
pub const ARCH: &str = "kubernetes.io/arch";
/// kiln's CPU level label: `x86-64-v2`, `x86-64-v3`, `x86-64-v4`, or `baseline` elsewhere.
pub const CPU_LEVEL: &str = "kiln.dev/cpu-level";
/// kiln's host memory label: the node's memory in whole GiB, rounded down to a step
/// (`kiln_crds::class::memory_gib`), so nodes of one size share a class. Not a default class key;
/// a target whose compile depends on memory (`llamacpp` quantisation `auto`) lists it.
pub const MEMORY_GIB: &str = "kiln.dev/memory-gib";
/// The node-class id the operator puts on each node: the key for the default class keys,
/// `kiln.dev/class-<hash>` for a target's own keys (the operator's `class_label_key`).
pub const NODE_CLASS: &str = "kiln.dev/class";
/// Label on a compile Job (and its pods): the class id it compiles for. Always this key, whatever
/// the target's class keys; the same string as [`NODE_CLASS`], on another kind of object.
pub const JOB_CLASS: &str = NODE_CLASS;

/// The class label keys a CompiledTarget uses when it names none.
pub const DEFAULT_CLASS_KEYS: [&str; 6] = [
    GPU_PRODUCT,
    GPU_COMPUTE_MAJOR,
    GPU_COMPUTE_MINOR,
    DRIVER_MAJOR,
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
/// Pod annotation: how the agent talks to the pod's server (`oip-v2`, `llama-server`).
pub const PROTOCOL_ANNOTATION: &str = "kiln.dev/protocol";
/// Pod annotation: the server's port.
pub const PORT_ANNOTATION: &str = "kiln.dev/port";
/// Pod annotation: the model name the server knows (default: the target's name).
pub const MODEL_NAME_ANNOTATION: &str = "kiln.dev/model-name";
/// Pod annotation: `NAME` or `NAME/KEY`, a Secret of the pod's namespace whose key (default
/// `api-key`) holds the bearer token the pod's server wants; the agent reads it (only the
/// Secrets the chart's `agent.servingSecrets` lists) and sends it with every check's request.
pub const API_KEY_SECRET_ANNOTATION: &str = "kiln.dev/api-key-secret";

/// CompiledTarget annotation: setting it to a new value (any) clears `Stalled` after exhausted
/// compile attempts and grants `compile.maxAttempts` more.
pub const RETRY_ANNOTATION: &str = "kiln.dev/retry";

/// Domain of the per-target node readiness labels: `<namespace>.ready.kiln.dev/<name>`.
pub const READY_DOMAIN: &str = "ready.kiln.dev";

/// The node label that says a node serves CompiledTarget `namespace/name`; its value is the
/// revision served. The operator sets it from KilnNode reports; serving pods require it with node
/// affinity (`Exists`, or `In` a revision). A name over 63 characters (the label name limit) is
/// replaced by `t-<first 12 hex of sha256(name)>`.
pub fn ready_label(namespace: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    if name.len() <= 63 {
        format!("{namespace}.{READY_DOMAIN}/{name}")
    } else {
        let hash = hex::encode(Sha256::digest(name.as_bytes()));
        format!("{namespace}.{READY_DOMAIN}/t-{}", &hash[..12])
    }
}

/// Whether `key` is a readiness label of some target ([`ready_label`]'s shape).
pub fn is_ready_label(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix.ends_with(&format!(".{READY_DOMAIN}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_label_is_a_valid_label_key_for_any_target_name() {
        assert_eq!(
            ready_label("ml", "squeezenet"),
            "ml.ready.kiln.dev/squeezenet"
        );
        let long = "a".repeat(64);
        let key = ready_label("ml", &long);
        // sha256("a" * 64) starts with ffe054fe7ae0.
        assert_eq!(key, "ml.ready.kiln.dev/t-ffe054fe7ae0");
        let exactly = "b".repeat(63);
        assert_eq!(
            ready_label("ml", &exactly),
            format!("ml.ready.kiln.dev/{exactly}")
        );
        assert!(is_ready_label(&key) && is_ready_label("ml.ready.kiln.dev/x"));
        assert!(!is_ready_label(NODE_CLASS) && !is_ready_label("ready.kiln.dev/x"));
    }
}
