//! Writes the CRD YAML for every kiln resource: `crdgen [DIR]` writes `DIR/<plural>.yaml`
//! (default `crds/`); `crdgen -` prints all of them as one multi-document stream.

use std::path::PathBuf;

fn main() -> std::process::ExitCode {
    let arg = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "crds".to_string());
    for (file, yaml) in kiln_crds::crd_yaml() {
        if arg == "-" {
            print!("---\n{yaml}");
            continue;
        }
        let path = PathBuf::from(&arg).join(file);
        if let Err(err) = std::fs::write(&path, yaml) {
            eprintln!("crdgen: cannot write {}: {err}", path.display());
            return std::process::ExitCode::FAILURE;
        }
        eprintln!("crdgen: wrote {}", path.display());
    }
    std::process::ExitCode::SUCCESS
}
