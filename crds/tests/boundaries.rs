//! The crate boundaries ARCHITECTURE.md promises, checked on the resolved dependency graph
//! (`cargo tree`, normal dependencies, transitively): the API crate does no
//! I/O, the store and the operator never link an ML runtime, the store links no Kubernetes
//! client; on the node, the privileged CSI plugin links no engine, and each node crate uses only
//! those below it (kiln-node-core ← kiln-engines ← kiln-server ← kiln-agent; kiln-csi on
//! kiln-node-core alone). A new edge that breaks one of these fails here, not in review.

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

const ML_RUNTIMES: &[&str] = &[
    "tract",
    "ort",
    "nvml-wrapper",
    "cudarc",
    "llama-cpp-2",
    "llama-cpp-sys-2",
];
const KUBE_CLIENT: &[&str] = &["kube-client", "kube-runtime"];

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
        &[ML_RUNTIMES, KUBE_CLIENT].concat(),
        "the store is shared by the operator, the compile worker and the agent",
    );
}

#[test]
fn the_privileged_csi_plugin_links_no_engine() {
    assert_links_none(
        "kiln-csi",
        &[ML_RUNTIMES, &["kiln-engines", "kiln-server", "kiln-agent"]].concat(),
        "the plugin runs privileged on every node: nothing that runs models may be in it",
    );
}

#[test]
fn the_node_core_links_no_engine_server_or_client() {
    assert_links_none(
        "kiln-node-core",
        &[
            ML_RUNTIMES,
            KUBE_CLIENT,
            &["kiln-engines", "kiln-server", "kiln-csi", "kiln-agent"],
        ]
        .concat(),
        "the node cache and the error are read by the privileged plugin too",
    );
}

#[test]
fn the_engines_link_no_kubernetes_client_and_no_crate_above() {
    assert_links_none(
        "kiln-engines",
        &[KUBE_CLIENT, &["kiln-server", "kiln-csi", "kiln-agent"]].concat(),
        "the engines run in the compile Job, the agent's children and `serve` alike",
    );
}

#[test]
fn the_server_links_no_kubernetes_client_no_plugin_and_no_daemon() {
    assert_links_none(
        "kiln-server",
        &[KUBE_CLIENT, &["kiln-csi", "kiln-agent"]].concat(),
        "a serving pod's server holds no cluster credential and runs no node daemon",
    );
}

#[test]
fn the_agent_does_not_link_the_plugin() {
    assert_links_none(
        "kiln-agent",
        &["kiln-csi"],
        "the plugin is its own binary and image; the agent shares only kiln-node-core with it",
    );
}

#[test]
fn the_check_sees_what_the_crates_link() {
    // The same walk finds the engines under kiln-agent and the node core under the plugin: the
    // checks above are not vacuous.
    let linked = closure("kiln-agent");
    for want in [
        "tract-onnx",
        "llama-cpp-2",
        "kiln-engines",
        "kiln-server",
        "kube-client",
    ] {
        assert!(linked.contains(want), "kiln-agent lacks {want}: {linked:?}");
    }
    assert!(linked.contains("kiln-store") && linked.contains("tokio"));
    let plugin = closure("kiln-csi");
    for want in ["kiln-node-core", "tonic", "kube-client"] {
        assert!(plugin.contains(want), "kiln-csi lacks {want}: {plugin:?}");
    }
}
