//! The agent's real exposition, as `kiln-agent local --metrics-file` writes it after the example
//! model's ready run, passes the real `promtool check metrics`.

use std::path::Path;
use std::process::Command;

use kiln_serve::test_support::promtool_check;

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
