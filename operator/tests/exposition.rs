//! The operator's real `/metrics` endpoint, served by its HTTP module over TCP: Prometheus text
//! 0.0.4 by default, which the real `promtool check metrics` accepts, and OpenMetrics to a
//! scraper whose `Accept` asks for it.

use std::io::{Read, Write};
use std::sync::Arc;

use kiln_endpoints::test_support::promtool_check;
use kiln_endpoints::{Health, serve};
use kiln_operator::metrics::Metrics;
use prometheus_client::registry::Registry;

/// GET /metrics with an optional Accept header; (Content-Type, body).
fn get_metrics(port: u16, accept: Option<&str>) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n"
    )
    .expect("request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let (head, body) = resp.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let ct = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .expect("content-type");
    (ct, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_passes_promtool_and_negotiates_openmetrics() {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    // Every family with a series, so promtool sees each one's samples.
    metrics.reconciled(0.02);
    metrics.error("kube");
    metrics.job("cpu-x86-64", "failed", "HashMismatch");
    metrics.job("cpu-x86-64", "created", "");
    metrics.cache_hit();
    metrics.classes(2);
    metrics.write("status");
    metrics.ready_nodes("cpu-x86-64", 1);
    metrics.promoted();
    metrics.untrusted_entry();

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        ([127, 0, 0, 1], port).into(),
        Arc::new(registry),
        Arc::new(Health::new("caches not synced")),
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut text = None;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            text = Some(tokio::task::spawn_blocking(move || get_metrics(port, None)).await);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (ct, body) = text.expect("server up").expect("get");
    assert_eq!(ct, kiln_endpoints::exposition::PROMETHEUS_TEXT);
    // Every operator metric the chart's Grafana dashboard queries is one the operator exports.
    let queried = kiln_endpoints::test_support::dashboard_metrics("kiln_operator_");
    assert!(queried.len() > 5, "{queried:?}");
    let missing = kiln_endpoints::test_support::not_exported(&queried, &body);
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which the operator does not export"
    );
    assert!(
        body.contains("# TYPE kiln_operator_compile_jobs_total counter\n")
            && body.contains(
                "kiln_operator_compile_jobs_total{class=\"cpu-x86-64\",result=\"failed\",reason=\"HashMismatch\"} 1\n"
            )
            && !body.contains("# EOF"),
        "{body}"
    );
    if let Err(skip) = promtool_check(&body) {
        eprintln!("skipping promtool check: {skip}");
    }

    let scraper = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let (ct, body) = tokio::task::spawn_blocking(move || get_metrics(port, Some(scraper)))
        .await
        .expect("get");
    assert_eq!(ct, kiln_endpoints::exposition::OPENMETRICS);
    assert!(
        body.ends_with("# EOF\n") && body.contains("# TYPE kiln_operator_compile_jobs counter\n"),
        "{body}"
    );
    let _ = stop_tx.send(());
    server.await.expect("join").expect("serve");
}
