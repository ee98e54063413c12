//! `kiln-agent keygen DIR`: a fresh ECDSA P-256 key pair for artifact attestations, as
//! `DIR/signing.key` (PKCS#8 PEM, mode 0600; for the compile Jobs' Secret) and `DIR/signing.pub`
//! (for the operator, the agents and `--trust-key`). Refuses to overwrite an existing key.
//! Touches DIR only.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `keygen`.
#[derive(clap::Args)]
pub struct Args {
    /// Directory to write `signing.key` and `signing.pub` into (created if missing).
    dir: PathBuf,
}

/// Writes the pair; prints the public key's path.
pub fn main(args: Args) -> ExitCode {
    match write(&args.dir) {
        Ok(public) => {
            println!("{}", public.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-agent keygen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let (private, public) = kiln_store::attest::Signer::generate()?;
    std::fs::create_dir_all(dir)?;
    let key = dir.join("signing.key");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key)
        .map_err(|e| anyhow::anyhow!("{}: {e}", key.display()))?;
    f.write_all(private.as_bytes())?;
    f.sync_all()?;
    let pub_path = dir.join("signing.pub");
    std::fs::write(&pub_path, public)?;
    Ok(pub_path)
}
