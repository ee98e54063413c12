//! kiln-agent: the node agent binary's library, what runs in the DaemonSet and the compile Job
//! and behind `serve` and `local`. From the top down (a module uses only those below it):
//!
//! * [`cmd`] — one module per subcommand: its flags and its entry point (printing, exit codes);
//!   nothing else.
//! * [`daemon`] — the node daemon, `kiln-agent run` (the DaemonSet's loop: watches, decisions,
//!   KilnNode status, pod gates).
//! * [`pod_check`] — checks a serving pod's own endpoint against the golden answers.
//! * [`bench`](mod@bench) — what the benchmark subcommands measure.
//! * [`secrets`] — credentials out of the environment and command line before any child starts.
//!
//! Below it, in crates of their own: the server and its protocol (kiln-server), the engines
//! and the pipeline (kiln-engines), what every node crate shares (kiln-node-core). The CSI
//! plugin is kiln-csi, a binary of its own that this crate must not use
//! (`crds/tests/boundaries.rs`).

pub mod bench;
pub mod cmd;
pub mod daemon;
pub mod pod_check;
pub mod secrets;
