//! `kiln-agent bench-verify`: streaming sha256 verification speed against `sha256sum` and
//! `openssl dgst -sha256` on the same file in the same run, printed as figures and ratios.
//! Touches the file it hashes (or a temp file it makes) and the two tools.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::bench::verify::run;

/// Flags of `bench-verify`.
#[derive(clap::Args)]
pub struct Args {
    /// File to hash; default: a fresh pseudo-random file of --size-mib.
    #[arg(long, env = "KILN_BENCH_FILE")]
    file: Option<PathBuf>,
    /// Size of the generated file in MiB.
    #[arg(long, env = "KILN_BENCH_SIZE_MIB", default_value_t = 1024)]
    size_mib: u64,
    /// Runs per tool (best of).
    #[arg(long, env = "KILN_BENCH_RUNS", default_value_t = 3)]
    runs: usize,
}

/// Measures and prints one line per tool; fails when the tools disagree on the digest.
pub fn main(args: Args) -> ExitCode {
    let runs = args.runs;
    let bytes = match &args.file {
        Some(f) => std::fs::metadata(f).map(|m| m.len()).unwrap_or(0),
        None => args.size_mib << 20,
    };
    let figures = match run(args.file, args.size_mib << 20, runs) {
        Ok(figures) => figures,
        Err(e) => {
            eprintln!("kiln-agent bench-verify: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "streaming sha256 over {:.2} GiB (page cache warm, best of {runs})",
        bytes as f64 / f64::from(1u32 << 30)
    );
    let ours = figures
        .iter()
        .find(|f| f.tool == "kiln-agent")
        .map(|f| f.seconds)
        .unwrap_or(f64::NAN);
    for f in &figures {
        println!(
            "  {:<22} {:>7.3} s  {:>6.2} GB/s  speed kiln/this {:.2}x  {}",
            f.tool,
            f.seconds,
            bytes as f64 / f.seconds / 1e9,
            f.seconds / ours,
            &f.digest[..16]
        );
    }
    if figures.windows(2).any(|w| w[0].digest != w[1].digest) {
        eprintln!("digests differ between tools");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
