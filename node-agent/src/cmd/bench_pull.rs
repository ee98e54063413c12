//! `kiln-agent bench-pull`: a verified pull of a large artifact from a real local registry
//! (Debian's docker-registry) into a cache directory, against the physical limit measured in the
//! same run, best of N each: the slower of (a) `curl -o` of the same blob to the same disk with
//! an fsync and (b) sha256 of as many bytes in memory. Prints the ratio and the process's peak
//! resident memory (the pull streams: 10 GiB need no 10 GiB of memory).
//! Touches a temp directory under `--dir`, a docker-registry it starts and stops and `curl`;
//! never a real store.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::bench::pull::run;

/// Flags of `bench-pull`.
#[derive(clap::Args)]
pub struct Args {
    /// Artifact size in MiB.
    #[arg(long, env = "KILN_BENCH_SIZE_MIB", default_value_t = 1024)]
    size_mib: u64,
    /// Runs per side (best of).
    #[arg(long, env = "KILN_BENCH_RUNS", default_value_t = 3)]
    runs: usize,
    /// Directory for the registry's storage, the cache and curl's file (on disk).
    #[arg(long, env = "KILN_BENCH_DIR", default_value = "/var/tmp")]
    dir: PathBuf,
    /// The distribution registry binary (Debian package docker-registry).
    #[arg(
        long,
        env = "KILN_BENCH_REGISTRY",
        default_value = "/usr/bin/docker-registry"
    )]
    registry: PathBuf,
}

/// Measures both sides and prints the figures and their ratio.
pub fn main(args: Args) -> ExitCode {
    let Some(runtime) = super::runtime() else {
        return ExitCode::FAILURE;
    };
    let (dir, runs) = (&args.dir, args.runs);
    let f = match runtime.block_on(run(dir, &args.registry, args.size_mib << 20, runs)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "kiln-agent bench-pull: {}",
                kiln_node_core::error::with_causes(e.as_ref())
            );
            return ExitCode::FAILURE;
        }
    };
    let gb = f.bytes as f64 / 1e9;
    println!(
        "verified pull of {:.2} GiB from docker-registry at {} into {} (best of {runs})",
        f.bytes as f64 / f64::from(1u32 << 30),
        f.registry,
        dir.display()
    );
    let row = |what: &str, s: f64| println!("  {what:<58} {s:>7.3} s  {:>5.2} GB/s", gb / s);
    row(
        "kiln-agent pull (range, hash once, write, fsync, rename)",
        f.agent,
    );
    row("(a) curl -o of the same blob + fsync", f.download);
    row("(b) sha256 of as many bytes in memory", f.hash);
    println!(
        "  limit = slower of (a) and (b): {:.3} s; kiln-agent at {:.2}x the limit's speed (goal >= 0.9)",
        f.limit(),
        f.limit() / f.agent
    );
    println!(
        "  peak resident memory of the process: {}",
        kiln_engines::host::memory::human(f.peak_rss as usize)
    );
    ExitCode::SUCCESS
}
