//! Spans reach an OTLP/HTTP collector: the real exporter, configured only by
//! `OTEL_EXPORTER_OTLP_ENDPOINT` as in production, posts to a real HTTP server in this test, and
//! the protobuf it receives carries the `reconcile` span of the real controller function and the
//! service name. (No OTLP receiver is packaged in Debian; the test server only records requests.)

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_crds::CompiledTarget;
use kiln_operator::context::Context;
use kiln_operator::controller;
use kiln_operator::metrics::Metrics;
use kiln_operator::plan::Settings;
use kiln_operator::telemetry::{self, LogFormat};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;

/// One received request: path, content type, body.
type Received = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// A minimal HTTP/1.1 server: records each request and answers 200 with an empty body.
fn collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let got: Received = Arc::default();
    let out = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            reader.read_line(&mut line).expect("request line");
            let path = line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            let (mut length, mut content_type) = (0usize, String::new());
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).expect("header");
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap_or((h, ""));
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    "content-type" => content_type = v.trim().to_string(),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("body");
            out.lock().expect("lock").push((path, content_type, body));
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
            );
        }
    });
    (format!("http://{addr}"), got)
}

fn ready_store<K>() -> Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

/// The exporting side, run by [`reconcile_spans_are_exported_over_otlp_http`] as a child process
/// with `OTEL_EXPORTER_OTLP_ENDPOINT` in its environment (the exporter reads it there, as in
/// production; setting it in this process would need `unsafe`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by reconcile_spans_are_exported_over_otlp_http"]
async fn child_exports_a_reconcile_span() {
    if std::env::var_os("KILN_OTLP_CHILD").is_none() {
        return;
    }
    let guard = telemetry::init(LogFormat::Json).expect("telemetry");

    // The real reconcile, on a target being deleted: it returns before any API call.
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = kiln_store::open(
        &dir.path().display().to_string(),
        &kiln_store::RegistryOptions::default(),
    )
    .expect("store");
    let mut registry = prometheus_client::registry::Registry::default();
    let ctx = Arc::new(Context {
        client: client.clone(),
        nodes: ready_store(),
        kiln_nodes: ready_store(),
        models: ready_store(),
        jobs: ready_store(),
        synced: tokio::sync::watch::channel(true).1,
        store,
        trust: Default::default(),
        settings: Settings::default(),
        job_settings: common::job_settings(dir.path()),
        metrics: Metrics::register(&mut registry),
        recorder: common::recorder(client),
        class_counts: Default::default(),
        labelled: Default::default(),
        ready_counts: Default::default(),
        compile_slots: Default::default(),
        written: Default::default(),
        lookups: std::sync::Mutex::new(kiln_operator::recall::lookups::LookupCache::new(
            16,
            kiln_operator::recall::lookups::DEFAULT_MISS_RECHECK,
        )),
        pacer: kiln_operator::recall::pace::Pacer::new(std::time::Duration::ZERO),
    });
    let mut target: CompiledTarget =
        serde_saphyr::from_str(include_str!("fixtures/target.yaml")).expect("target.yaml");
    target.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    controller::reconcile(Arc::new(target), ctx)
        .await
        .expect("reconcile");
    // Dropping the guard flushes the batch exporter.
    tokio::task::spawn_blocking(move || drop(guard))
        .await
        .expect("flush");
}

#[test]
fn reconcile_spans_are_exported_over_otlp_http() {
    let (endpoint, got) = collector();
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "child_exports_a_reconcile_span",
            "--ignored",
            "--nocapture",
        ])
        .env("KILN_OTLP_CHILD", "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .output()
        .expect("run the child");
    assert!(
        out.status.success(),
        "child failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut found = None;
    for _ in 0..50 {
        found = got
            .lock()
            .expect("lock")
            .iter()
            .find(|(_, _, body)| contains(body, b"reconcile"))
            .cloned();
        if found.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (path, content_type, body) = found.unwrap_or_else(|| {
        panic!(
            "no span named reconcile arrived; requests: {:?}; child said: {}",
            got.lock()
                .expect("lock")
                .iter()
                .map(|(p, c, b)| (p.clone(), c.clone(), b.len()))
                .collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(path, "/v1/traces");
    assert_eq!(content_type, "application/x-protobuf");
    assert!(
        contains(&body, b"kiln-operator"),
        "service name in the resource"
    );
    assert!(
        contains(&body, b"squeezenet-cpu"),
        "the target field on the span"
    );
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
