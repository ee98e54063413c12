//! The subcommands of `kiln-agent`, one module each: the clap arguments (every flag with its
//! environment variable) and the entry point that runs it and turns the outcome into output and
//! an exit code. The work itself is in [`crate::pipeline`] and [`crate::run`].

pub mod bench_pull;
pub mod bench_verify;
pub mod compile;
pub mod fixtures;
pub mod install;
pub mod local;
