//! Native engines run in a child process of kiln-agent. ONNX Runtime (and anything linked from
//! C or C++ later) can segfault, abort, or allocate past the heap ceiling the `cap` allocator
//! keeps (native code does not allocate through Rust); tract is pure Rust but a hostile graph can
//! still overflow a stack or abort on a refused allocation. Every backend's compile, load and
//! warmup therefore runs in `kiln-agent engine` (this binary re-executed from `/proc/self/exe`,
//! a hidden subcommand), one child per step, which:
//!
//! * gets its [`task::Task`] as one JSON document on stdin (bounded), paths to verified files it
//!   only reads (and the scratch path a compile writes), an allow-listed environment
//!   ([`limits::passes_env`]: no registry password, no kube token), no store handle;
//! * sets its own kernel limits before it touches the model ([`limits::apply`]):
//!   `RLIMIT_DATA` = `--memory-limit` (since Linux 4.7 it counts private writable mappings, so
//!   ONNX Runtime's `malloc`/`mmap` are refused at the limit, while CUDA's `PROT_NONE` address
//!   reservations are not counted as `RLIMIT_AS` would), `RLIMIT_CPU` from the deadline, and
//!   death with its parent;
//! * answers with one JSON document on stdout (bounded; [`task::Answer`]);
//! * runs in its own process group, which the parent kills whole when the deadline passes and
//!   after the child ends (so nothing it spawned outlives it).
//!
//! [`exit`] (pure) turns what came back into the result: the answer, or `EngineCrashed`
//! (signal or exit status in the message), `MemoryBudgetExceeded` (the limit in the message),
//! `Timeout`. An error the child hit crosses as its reason and its whole text
//! ([`kiln_node_core::error::Error::InEngine`]): a typed cause (an `ort::Error`, a tract error) cannot
//! cross a process, so the child's `#[source]` chain ends at the boundary and what it said is
//! kept in the message. The child loads, warms and exits: nothing stays loaded, as before (the agent
//! proves an engine and drops it; serving pods load their own copy).

// The child's side, which runs the pipeline, is `kiln-agent engine` (`kiln_agent::cmd::engine`), not
// here: this module is what the pipeline calls, so it depends on nothing that calls it; `main`
// hands `cmd::engine::execute` to `parent` for the in-process measurement mode.
pub mod exit;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod limits;
pub mod parent;
pub mod task;
