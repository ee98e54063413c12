//! kiln-operator: node classes, compile Jobs and status. The controllers come with the operator
//! issue; until then the binary only answers `--version` and `--help`, and says so when run.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "kiln-operator",
    version,
    about = "kiln operator (controllers not yet in this build)"
)]
struct Cli {}

fn main() -> std::process::ExitCode {
    let _ = Cli::parse();
    eprintln!(
        "kiln-operator {}: the controllers are not part of this build yet; API group {} {}",
        env!("CARGO_PKG_VERSION"),
        kiln_crds::GROUP,
        kiln_crds::VERSION
    );
    std::process::ExitCode::from(2)
}
