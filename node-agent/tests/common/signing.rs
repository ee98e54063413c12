//! Signing as publishers sign, with their own tools: what `scripts/ensure/` installs (oras,
//! cosign, the model_signing CLI), keys and a small CA by openssl, and a bundle as the
//! ModelArtifact carries it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What `scripts/ensure/TOOL.sh` prints (oras and cosign, built from the Go module proxy; the
/// model-signing venv's bin, from PyPI; all cached), or `None` after saying why (a failure
/// under `CI=true`).
pub fn ensured(tool: &str) -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../scripts/ensure/{tool}.sh"));
    match Command::new(&script).output() {
        Ok(o) if o.status.success() => Some(PathBuf::from(
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        )),
        other => {
            kiln_endpoints::test_support::skip(&format!(
                "no {tool} (scripts/ensure/{tool}.sh needs its registry once): {other:?}"
            ));
            None
        }
    }
}

/// Runs `program` in `dir`, asserting success.
pub fn ran(dir: &Path, program: &Path, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{} {args:?}: {out:?}",
        program.display()
    );
}

/// In `dir`: `key.pem`/`key.pub`, `other.pub`, and a CA `root.pem` whose `leaf.pem`/`leaf.key`
/// may sign code, and another CA `stranger.pem` (all P-256, by openssl).
pub fn signing_material(dir: &Path) {
    let openssl = Path::new("openssl");
    for name in ["key", "other", "root", "leaf", "stranger"] {
        ran(
            dir,
            openssl,
            &[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                &format!("{name}.pem"),
            ],
        );
        ran(
            dir,
            openssl,
            &[
                "ec",
                "-in",
                &format!("{name}.pem"),
                "-pubout",
                "-out",
                &format!("{name}.pub"),
            ],
        );
    }
    std::fs::rename(dir.join("leaf.pem"), dir.join("leaf.key")).expect("rename");
    std::fs::rename(dir.join("root.pem"), dir.join("root.key")).expect("rename");
    std::fs::rename(dir.join("stranger.pem"), dir.join("stranger.key")).expect("rename");
    for ca in ["root", "stranger"] {
        ran(
            dir,
            openssl,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                &format!("{ca}.key"),
                "-subj",
                &format!("/CN=kiln test {ca}"),
                "-days",
                "30",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign",
                "-out",
                &format!("{ca}.pem"),
            ],
        );
    }
    std::fs::write(
        dir.join("leaf.cnf"),
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=codeSigning\n",
    )
    .expect("cnf");
    ran(
        dir,
        openssl,
        &[
            "req",
            "-new",
            "-key",
            "leaf.key",
            "-subj",
            "/CN=model publisher",
            "-out",
            "leaf.csr",
        ],
    );
    ran(
        dir,
        openssl,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "root.pem",
            "-CAkey",
            "root.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            "leaf.cnf",
            "-out",
            "leaf.pem",
        ],
    );
}

/// `spec.source.signature` of `bundle`: the base64 the ModelArtifact carries.
pub fn signature_field(bundle: &Path) -> String {
    let out = Command::new("base64")
        .arg("-w0")
        .arg(bundle)
        .output()
        .expect("base64");
    format!(", signature: \"{}\"", String::from_utf8_lossy(&out.stdout))
}
