//! The agent's real exposition, as `kiln-agent local --metrics-file` writes it after the example
//! model's ready run, passes the real `promtool check metrics`.

use std::path::Path;
use std::process::Command;

use kiln_endpoints::test_support::promtool_check;

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

/// Every agent metric the chart's Grafana dashboard queries is one the agent exports. The
/// exposition is the agent's registry with a series in every family (a `local` run leaves the
/// DaemonSet-only ones, such as `target_ready`, without series, and so unprinted), through the
/// same Prometheus text conversion `/metrics` serves.
#[test]
fn the_dashboard_queries_only_metrics_the_agent_exports() {
    use kiln_crds::FailureReason;
    use kiln_engines::metrics::{Metrics, TargetLabels};
    let mut registry = prometheus_client::registry::Registry::default();
    let m = Metrics::register(&mut registry);
    let labels = TargetLabels {
        namespace: "ml".into(),
        target: "t".into(),
        class: "cpu".into(),
    };
    m.fetched(1);
    m.verify_failure(FailureReason::HashMismatch);
    m.failure(FailureReason::ParityExceeded);
    m.compile("tract", "built", Some(0.1));
    m.load("cpu", 0.1);
    m.warmup("cpu", 0.2, &[0.01, 0.02], 1e-6);
    let placement = kiln_crds::placement::Placement {
        requested: "cuda".into(),
        nodes: [("cpu".to_string(), 4), ("cuda".to_string(), 35)].into(),
        partitions: 3,
        kernel_seconds: [("cpu".to_string(), 1e-5), ("cuda".to_string(), 2e-3)].into(),
        fallback_time_share: 0.005,
        shape_node_count: 4,
        transfer_count: 2,
        transfer_seconds: 4e-5,
        ..Default::default()
    };
    m.placement(&labels, &placement);
    m.peak_memory(&labels, 1 << 20);
    m.peak_device_memory(&labels, 1 << 30);
    m.ready("cpu", true);
    m.pulled(1 << 20, 0.5);
    m.compat_rejection(FailureReason::IncompatibleHardware);
    m.target_ready(&labels, Some(3));
    // A node that moved from one engine to another (NextCandidate) has one engine series.
    m.served_engine(&labels, Some("onnxruntime/cpu"));
    m.served_engine(&labels, Some("tract"));
    m.fallback(FailureReason::ParityExceeded, "PreviousKnownGood");
    m.fail_closed(FailureReason::HashMismatch);
    m.revision_ready(1.0);
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, &registry).expect("encode");
    let text = kiln_endpoints::exposition::to_prometheus_text(&openmetrics);
    assert!(
        text.contains(
            "kiln_agent_served_revision{namespace=\"ml\",target=\"t\",class=\"cpu\"} 3\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "kiln_agent_served_engine{namespace=\"ml\",target=\"t\",class=\"cpu\",engine=\"tract\"} 1\n"
        ) && !text.contains("engine=\"onnxruntime/cpu\""),
        "{text}"
    );
    for series in [
        "kiln_agent_partition_kernel_seconds{namespace=\"ml\",target=\"t\",class=\"cpu\",provider=\"cuda\"} 0.002\n",
        "kiln_agent_fallback_time_share{namespace=\"ml\",target=\"t\",class=\"cpu\"} 0.005\n",
        "kiln_agent_fallback_shape_nodes{namespace=\"ml\",target=\"t\",class=\"cpu\"} 4\n",
        "kiln_agent_partition_transfers{namespace=\"ml\",target=\"t\",class=\"cpu\"} 2\n",
        "kiln_agent_engine_peak_device_memory_bytes{namespace=\"ml\",target=\"t\",class=\"cpu\"} 1073741824\n",
    ] {
        assert!(text.contains(series), "{series} in {text}");
    }
    // Every family with series, the placement and device memory ones included.
    if let Err(skip) = promtool_check(&text) {
        eprintln!("skipping promtool check: {skip}");
    }
    let queried = kiln_endpoints::test_support::dashboard_metrics("kiln_agent_");
    assert!(queried.len() > 5, "{queried:?}");
    let missing = kiln_endpoints::test_support::not_exported(&queried, &text);
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which the agent does not export"
    );
    // (The check itself refuses a name nobody exports.)
    let bogus = std::collections::BTreeSet::from(["kiln_agent_no_such_seconds_bucket".to_string()]);
    assert_eq!(
        kiln_endpoints::test_support::not_exported(&bogus, &text),
        ["kiln_agent_no_such_seconds_bucket"]
    );
    // And it names no kiln metric of a third component.
    let all = kiln_endpoints::test_support::dashboard_metrics("kiln_");
    let foreign: Vec<&String> = all
        .iter()
        .filter(|n| {
            !["kiln_agent_", "kiln_operator_", "kiln_inference_"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    assert!(foreign.is_empty(), "{foreign:?}");
}
