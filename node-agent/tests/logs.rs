//! Logs a person can read: the plain format writes no ANSI colour codes when stderr is not a
//! terminal (a file, a pipe, `kubectl logs`), so `kiln-agent local 2>file` reads as text.

use std::path::Path;
use std::process::Command;

#[test]
fn plain_logs_to_a_pipe_carry_no_colour_codes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // The example, but with a source that is not there: the run logs its probe, then fails fast
    // (no compile).
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/squeezenet/kiln.yaml");
    let yaml = std::fs::read_to_string(example)
        .expect("example")
        .replace("file://model.onnx", "file://missing.onnx");
    let file = tmp.path().join("kiln.yaml");
    std::fs::write(&file, yaml).expect("write yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
        .args(["local", "--store"])
        .arg(tmp.path().join("store"))
        .arg(&file)
        .env_remove("KILN_LOG_FORMAT")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .output()
        .expect("run kiln-agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a missing source fails the run");
    assert!(
        stderr.contains("INFO") && stderr.contains("probed this machine"),
        "plain log lines on stderr: {stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "ANSI escape codes in logs written to a pipe: {stderr:?}"
    );
}
