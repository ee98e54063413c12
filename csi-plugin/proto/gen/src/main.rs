//! Writes `csi-plugin/proto/generated/` from the vendored protos, or with `--check` says whether
//! what is there is exactly what they generate (exit 1 and the stale files named otherwise).
//!
//! `cargo run --locked --manifest-path csi-plugin/proto/gen/Cargo.toml [-- --check]`

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The protos, relative to `csi-plugin/proto/`.
const PROTOS: [&str; 2] = ["csi/v1/csi.proto", "pluginregistration/v1/api.proto"];

fn generate(proto: &Path, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let files = protox::compile(PROTOS, [proto])?;
    std::fs::create_dir_all(out)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Every RPC kiln does not implement answers UNIMPLEMENTED, as the CSI spec asks.
        .generate_default_stubs(true)
        .emit_rerun_if_changed(false)
        .out_dir(out)
        .compile_fds(files)?;
    Ok(())
}

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let generated = proto.join("generated");
    let scratch = std::env::temp_dir().join(format!("kiln-proto-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    if let Err(e) = generate(&proto, &scratch) {
        eprintln!("kiln-proto-gen: {e}");
        return ExitCode::FAILURE;
    }
    let names = |dir: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| PathBuf::from(e.file_name()))
            .collect();
        v.sort();
        v
    };
    let (want, have) = (names(&scratch), names(&generated));
    let stale: Vec<&PathBuf> = want
        .iter()
        .filter(|n| std::fs::read(scratch.join(n)).ok() != std::fs::read(generated.join(n)).ok())
        .chain(have.iter().filter(|n| !want.contains(n)))
        .collect();
    let code = if stale.is_empty() {
        println!("csi-plugin/proto/generated is current");
        ExitCode::SUCCESS
    } else if check {
        eprintln!(
            "csi-plugin/proto/generated is stale ({}): run cargo run --locked --manifest-path \
             csi-plugin/proto/gen/Cargo.toml",
            stale
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        ExitCode::FAILURE
    } else {
        let _ = std::fs::remove_dir_all(&generated);
        let copied = std::fs::create_dir_all(&generated).and_then(|()| {
            want.iter()
                .try_for_each(|n| std::fs::copy(scratch.join(n), generated.join(n)).map(|_| ()))
        });
        match copied {
            Ok(()) => {
                println!("wrote {}", generated.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kiln-proto-gen: {e}");
                ExitCode::FAILURE
            }
        }
    };
    let _ = std::fs::remove_dir_all(&scratch);
    code
}
