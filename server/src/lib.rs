//! kiln-server, the model server of `kiln-agent serve`: the Open Inference Protocol v2 over REST for the model a `csi.kiln.dev`
//! volume holds, loaded with the same engine code and settings the node's agent warmed
//! ([`model`]). Plain hyper, like the probe endpoints: nine routes need no framework.
//! Live at once, ready once the model is loaded; nothing is served that did not re-verify.
//! Under load it runs as many requests as its engines take ([`pool`]), lets a bounded number
//! wait and sheds the rest ([`admission`]); on shutdown it drains. Touches one TCP listener and
//! the model directory (read only).
//!
//! * [`oip`] — the protocol's wire types and binary tensor extension, which the agent's warmer
//!   also speaks to a serving pod.
//! * [`model`] — the model of a volume, loaded and checked.
//! * [`pool`] — its engines and how many; [`workers`] — the threads they run on, warmed;
//!   [`admission`] — who runs, waits or is shed; [`batch`] — single-sample requests run
//!   together; [`infer`] — one inference request;
//!   [`metrics`] — what `/metrics` shows.
//!
//! May use: kiln-engines, kiln-node-core, kiln-crds, kiln-store, kiln-endpoints. Must not use a
//! Kubernetes client, the CSI plugin or the agent (`crds/tests/boundaries.rs`).

pub mod admission;
pub mod batch;
pub mod infer;
pub mod metrics;
pub mod model;
pub mod oip;
pub mod pool;
mod reply;
mod state;
pub mod workers;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use model::Served;
use reply::{Reply, error, json};
pub use state::{Limits, State};

/// Serves on `listen` until `shutdown` resolves, then drains: not ready, new requests refused,
/// admitted ones answered; returns once none is left and the drain delay has passed, or at the
/// drain timeout.
pub async fn serve(
    listen: SocketAddr,
    state: Arc<State>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "serving the Open Inference Protocol v2");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => connection(accepted?.0, &state),
            () = &mut shutdown => break,
        }
    }
    state.gate.drain();
    let began = Instant::now();
    tracing::info!(
        waiting = state.gate.waiting(),
        running = state.gate.running(),
        "draining: not ready, refusing new requests"
    );
    loop {
        let left = state.gate.waiting() + state.gate.running();
        let waited = began.elapsed();
        if (left == 0 && waited >= state.limits.drain_delay) || waited >= state.limits.drain_timeout
        {
            if left > 0 {
                tracing::warn!(left, "drain timeout: requests still admitted are cut off");
            }
            return Ok(());
        }
        tokio::select! {
            accepted = listener.accept() => connection(accepted?.0, &state),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// Serves one connection on its own task.
fn connection(stream: tokio::net::TcpStream, state: &Arc<State>) {
    let _ = stream.set_nodelay(true);
    let state = state.clone();
    tokio::spawn(async move {
        let service = hyper::service::service_fn(move |req| route(req, state.clone()));
        let io = hyper_util::rt::TokioIo::new(stream);
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await;
    });
}

/// Every reply; while draining each closes its connection, so clients reconnect elsewhere.
async fn route(req: Request<Incoming>, state: Arc<State>) -> Result<Reply, Infallible> {
    let mut reply = reply(req, &state).await;
    if state.gate.draining() {
        reply.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    Ok(reply)
}

async fn reply(req: Request<Incoming>, state: &Arc<State>) -> Reply {
    let path: Vec<String> = req
        .uri()
        .path()
        .trim_matches('/')
        .split('/')
        .map(str::to_string)
        .collect();
    let parts: Vec<&str> = path.iter().map(String::as_str).collect();
    let served = state.served.get().cloned();
    let get = req.method() == Method::GET;
    match (parts.as_slice(), served) {
        (["v2", "health", "live"], _) if get => {
            json(StatusCode::OK, &serde_json::json!({"live": true}))
        }
        (["v2", "health", "ready"], s) if get => ready(s.is_some() && !state.gate.draining()),
        (["metrics"], _) if get => metrics(&req, state),
        (["v2"], _) if get => json(
            StatusCode::OK,
            &serde_json::json!({
                "name": "kiln-agent",
                "version": env!("CARGO_PKG_VERSION"),
                "extensions": ["binary_tensor_data"],
            }),
        ),
        (["v2", "models", name, rest @ ..], Some(s)) if *name == s.name => {
            model_route(req, rest, s, state).await
        }
        (["v2", "models", name, ..], Some(_)) => {
            error(StatusCode::NOT_FOUND, format!("no model {name:?} here"))
        }
        (["v2", "models", ..], None) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading".into(),
        ),
        _ => error(StatusCode::NOT_FOUND, "no such route".into()),
    }
}

/// The routes under `/v2/models/{name}` (and `/versions/{v}`, any version: one is served).
async fn model_route(
    req: Request<Incoming>,
    rest: &[&str],
    s: Arc<Served>,
    state: &Arc<State>,
) -> Reply {
    let rest = match rest {
        ["versions", _, tail @ ..] => tail,
        other => other,
    };
    match (req.method(), rest) {
        (&Method::GET, []) => json(StatusCode::OK, &metadata(&s, &state.gate)),
        (&Method::GET, ["ready"]) => ready(!state.gate.draining()),
        (&Method::GET, ["config"]) => json(StatusCode::OK, &oip::config::of(&s.metadata)),
        (&Method::POST, ["infer"]) => infer::infer(req, s, state).await,
        _ => error(StatusCode::NOT_FOUND, "no such route".into()),
    }
}

/// The model's metadata with how it is served now: its engines and workers, and the gate's
/// workers (times `--max-batch` when batching) and queue.
fn metadata(s: &Served, gate: &admission::Gate) -> oip::ModelMetadata {
    let mut m = s.metadata.clone();
    m.parameters = serde_json::Map::from_iter([
        ("instances".to_string(), s.pool.instances().into()),
        ("workers".to_string(), s.pool.workers().into()),
        ("admitted".to_string(), gate.workers().into()),
        ("maxQueue".to_string(), gate.max_queue().into()),
    ]);
    m
}

fn metrics(req: &Request<Incoming>, state: &State) -> Reply {
    let accept = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let (body, content_type) = state
        .metrics
        .encode(state.labels().as_ref(), &state.gate, accept);
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    reply.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    reply
}

fn ready(yes: bool) -> Reply {
    if yes {
        json(StatusCode::OK, &serde_json::json!({"ready": true}))
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the model is still loading, or the server is shutting down".into(),
        )
    }
}
