//! kiln-engines: the engines and the pipeline they serve, the part of kiln that runs models.
//! From the top down (a module uses only those below it):
//!
//! * [`golden`] — a fixture's golden outputs, made by a reference engine (`kiln-agent fixtures`,
//!   and the engine's process that runs the reference).
//! * [`pipeline`] — what `local`, the compile Job, the DaemonSet and `serve` share: fetch and
//!   verify, compile, load, warm with parity, the engine's own process.
//! * [`backend`] — the engine backends (tract, ONNX Runtime, llama.cpp, a foreign compiler via
//!   `exec`) and their vocabulary: the host tensor every engine takes and returns
//!   ([`backend::tensor`]) and whether a measured placement is allowed
//!   ([`backend::cpu_fallback`]).
//! * [`host`] — facts of this machine: the hardware probe, class compatibility, the heap
//!   ceiling, GPU memory, the host pid.
//! * [`metrics`] — the agent's metrics.
//!
//! May use: kiln-node-core, kiln-crds, kiln-store. Must not use a Kubernetes client, the CSI
//! plugin, the server or the agent (`crds/tests/boundaries.rs`).

pub mod backend;
pub mod golden;
pub mod host;
pub mod metrics;
pub mod pipeline;
