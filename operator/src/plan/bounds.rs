//! Upper bounds on what a tenant may ask of a compile Job, from the operator's flags: read by
//! validation (memory, CPU, tolerations) and by the worker choice (GPU claim). Only the type.

/// Upper bounds on the tenant-chosen parts of a compile Job (`spec.compile.resources` and
/// `spec.compile.tolerations`), from the operator's flags (chart `compile.bounds`).
#[derive(Clone, Debug)]
pub struct CompileBounds {
    /// Largest memory request or limit, bytes.
    pub max_memory_bytes: u64,
    /// Largest CPU request or limit, millicores.
    pub max_cpu_millis: u64,
    /// Largest `nvidia.com/gpu` request or limit.
    pub max_gpus: u64,
    /// Toleration keys a target may use (a toleration without a key tolerates every taint and
    /// is allowed only with `*` here).
    pub toleration_keys: Vec<String>,
}

impl Default for CompileBounds {
    fn default() -> Self {
        Self {
            max_memory_bytes: 64 << 30,
            max_cpu_millis: 32_000,
            max_gpus: 1,
            toleration_keys: vec!["nvidia.com/gpu".into()],
        }
    }
}
