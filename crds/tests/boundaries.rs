//! The crate boundaries ARCHITECTURE.md promises, checked on the resolved dependency graph
//! (`cargo tree`, normal dependencies, transitively): the API crate does no
//! I/O, the store and the operator never link an ML runtime, the store links no Kubernetes
//! client. A new edge that breaks one of these fails here, not in review.

use std::collections::BTreeSet;
use std::process::Command;

/// Every package `krate` links for normal use (not dev, not build), by name, on this platform.
fn closure(krate: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree", "-p", krate, "-e", "normal", "--prefix", "none", "-f", "{p}",
        ])
        .args(["--locked", "--offline"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn assert_links_none(krate: &str, forbidden: &[&str], why: &str) {
    let linked = closure(krate);
    let bad: Vec<&String> = linked
        .iter()
        .filter(|n| {
            forbidden
                .iter()
                .any(|f| n.as_str() == *f || n.starts_with(&format!("{f}-")))
        })
        .collect();
    assert!(bad.is_empty(), "{krate} links {bad:?}: {why}");
}

const ML_RUNTIMES: &[&str] = &["tract", "ort", "nvml-wrapper", "cudarc"];

#[test]
fn the_api_crate_does_no_io() {
    assert_links_none(
        "kiln-crds",
        &[
            "tokio",
            "hyper",
            "reqwest",
            "oci-client",
            "kiln-store",
            "kiln-endpoints",
        ],
        "kiln-crds holds types and pure functions only",
    );
}

#[test]
fn the_operator_never_links_an_ml_runtime() {
    assert_links_none(
        "kiln-operator",
        ML_RUNTIMES,
        "compiles run in Jobs (kiln-agent compile), never in the operator",
    );
}

#[test]
fn the_store_links_no_ml_runtime_and_no_kubernetes_client() {
    assert_links_none(
        "kiln-store",
        &[ML_RUNTIMES, &["kube-client", "kube-runtime"]].concat(),
        "the store is shared by the operator, the compile worker and the agent",
    );
}

#[test]
fn the_check_sees_what_the_agent_links() {
    // The same walk finds tract under kiln-agent: the checks above are not vacuous.
    let linked = closure("kiln-agent");
    assert!(linked.contains("tract-onnx"), "{linked:?}");
    assert!(linked.contains("kiln-store") && linked.contains("tokio"));
}
