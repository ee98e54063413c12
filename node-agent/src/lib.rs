//! kiln-agent: the node side of kiln. `local` runs the whole pipeline on one machine; the same
//! pipeline serves the compile Job and the DaemonSet.
//!
//! * [`cmd`] — one module per subcommand: its flags and its entry point (printing, exit codes).
//! * [`pipeline`] — the library every subcommand shares: fetch and verify, compile, load, warm
//!   with parity, probe the hardware.
//! * [`run`] — the DaemonSet's loop (watches, decisions, KilnNode status, pod gates).
//! * [`backend`] — the engine backends (tract, a foreign compiler via `exec`).
//! * [`memory`] — the heap ceiling (the binary's global allocator).

pub mod backend;
pub mod cmd;
pub mod device_memory;
pub mod error;
pub mod memory;
pub mod metrics;
pub mod pipeline;
pub mod run;
