//! The subcommands of `kiln-agent`, one module each: the clap arguments (every flag with its
//! environment variable) and the entry point that runs it and turns the outcome into output and
//! an exit code. The work itself is in the library ([`kiln_engines::pipeline`], [`crate::daemon`],
//! [`kiln_engines::golden`], [`crate::bench`]); no subcommand's module calls another's.
//! Only `run` talks to a cluster.

pub mod bench_pull;
pub mod bench_verify;
pub mod compile;
pub mod engine;
pub mod fixtures;
pub mod install;
pub mod keygen;
pub mod local;
pub mod probe;
pub mod run;
pub mod serve;

/// The multi-threaded runtime the pipeline runs on; says why on stderr when it cannot start.
pub(crate) fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .inspect_err(|e| eprintln!("kiln-agent: cannot start the async runtime: {e}"))
        .ok()
}
