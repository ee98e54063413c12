//! For the components' tests only (feature `test-support`, a dev-dependency): checks an
//! exposition with the real `promtool`. Panics are the point here: they fail the calling test.

use std::io::Write;
use std::process::{Command, Stdio};

/// `promtool check metrics` on `text`; `Err` with the reason when promtool is absent and this
/// is not root (scripts/test.sh installs it as root, so there its absence is a failure).
pub fn promtool_check(text: &str) -> Result<(), String> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let uid = std::fs::read_to_string("/proc/self/status")
                .unwrap_or_default()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Uid:")?
                        .split_whitespace()
                        .next()
                        .map(String::from)
                });
            assert_ne!(
                uid.as_deref(),
                Some("0"),
                "promtool is missing: scripts/test.sh installs it (Debian package prometheus)"
            );
            return Err("promtool not installed and not root (scripts/test.sh installs it)".into());
        }
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics rejects the exposition:\n{}{}\n--- exposition:\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
