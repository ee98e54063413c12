//! kiln-agent: the node side of kiln. `local` runs the whole pipeline on one machine; the same
//! modules serve the compile Job and the DaemonSet.

pub mod backend;
pub mod bench;
pub mod bench_pull;
pub mod compile;
pub mod digest;
pub mod error;
pub mod example;
pub mod fetch;
pub mod fixtures;
pub mod install;
pub mod local;
pub mod make_fixtures;
pub mod metrics;
pub mod probe;
pub mod ready;
pub mod run;
pub mod spec;
pub mod store;
pub mod tensor;
pub mod warmup;
pub mod worker;
