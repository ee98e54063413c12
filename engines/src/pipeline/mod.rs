//! The pipeline from a declared model to a warmed engine, shared by `local`, the compile Job and
//! the DaemonSet: read the spec, fetch and verify inputs, compile (or reuse) into the store, pull
//! verified, load, warm with parity. Touches the filesystem (blob caches, the store) and runs
//! engines; never the apiserver.

pub mod build;
pub mod candidates;
pub mod compile;
pub mod fetch;
pub mod fixtures;
pub mod interface;
pub mod isolate;
pub mod ready;
pub mod schema;
pub mod spec;
pub mod text;
pub mod warmup;
