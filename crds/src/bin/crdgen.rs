//! Writes the CRD YAML for every kiln resource: `crdgen` writes `<plural>.yaml` into the Helm
//! chart's `charts/kiln/files/crds/`, their one committed copy (run from the workspace root);
//! `crdgen DIR` writes only into DIR; `crdgen -` prints all of them as one multi-document stream.

use std::path::PathBuf;

fn main() -> std::process::ExitCode {
    let dirs = match std::env::args().nth(1) {
        Some(arg) if arg == "-" => {
            for (_, yaml) in kiln_crds::crd_yaml() {
                print!("---\n{yaml}");
            }
            return std::process::ExitCode::SUCCESS;
        }
        Some(dir) => vec![PathBuf::from(dir)],
        None => kiln_crds::CRD_DIRS.iter().map(PathBuf::from).collect(),
    };
    for dir in dirs {
        for (file, yaml) in kiln_crds::crd_yaml() {
            let path = dir.join(file);
            if let Err(err) = std::fs::write(&path, yaml) {
                eprintln!("crdgen: cannot write {}: {err}", path.display());
                return std::process::ExitCode::FAILURE;
            }
            eprintln!("crdgen: wrote {}", path.display());
        }
    }
    std::process::ExitCode::SUCCESS
}
