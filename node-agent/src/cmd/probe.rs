//! `kiln-agent probe`: prints this machine's hardware facts and the class labels they give, as
//! JSON. Reads the machine only ([`kiln_engines::host::probe`]).

use std::process::ExitCode;

use kiln_engines::backend;
use kiln_engines::host::probe;

/// Probes and prints; always succeeds (a missing GPU driver is a fact, not an error).
pub fn main() -> ExitCode {
    let facts = probe::probe(backend::runtimes());
    let labels = probe::labels(&facts);
    let json = serde_json::json!({"hardware": facts, "labels": labels});
    println!(
        "{}",
        serde_json::to_string_pretty(&json).unwrap_or_default()
    );
    ExitCode::SUCCESS
}
