//! The agent's real exposition, as `kiln-agent local --metrics-file` writes it after the example
//! model's ready run, passes the real `promtool check metrics`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// `promtool check metrics` on `text`; `Err` with the reason when promtool is absent and this
/// is not root (scripts/test.sh installs it as root, so there its absence is a failure).
fn promtool_check(text: &str) -> Result<(), String> {
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

#[test]
fn metrics_file_after_a_ready_run_passes_promtool() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/squeezenet/kiln.yaml");
    let metrics = tmp.path().join("m.prom");
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args(["local", "--store"])
        .arg(tmp.path().join("store"))
        .arg("--metrics-file")
        .arg(&metrics)
        .arg(&yaml)
        .output()
        .expect("run kiln-agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&metrics).expect("metrics file");
    // Counters are named by their `_total` series, as Prometheus text 0.0.4 requires.
    assert!(
        text.contains("# TYPE kiln_agent_compiles_total counter\n")
            && text.contains("# HELP kiln_agent_failures_total ")
            && !text.contains("# EOF"),
        "{text}"
    );
    if let Err(skip) = promtool_check(&text) {
        eprintln!("skipping promtool check: {skip}");
    }
}
