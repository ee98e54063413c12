//! `/metrics`, `/healthz` (the process serves) and `/readyz` for both kiln components. Plain
//! hyper: three GET routes need no framework. What "ready" means is the component's: the
//! operator's caches synced (leading or standing by); the agent's watches synced and its KilnNode
//! written — never that a model is ready (tying a DaemonSet's `/readyz` to targets would stall
//! its rollout on every fail-closed node).
//! Touches one TCP listener; reads the registry and the health flag.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;

/// What the probes report.
pub struct Health {
    /// Set once the component is ready (see the module doc).
    pub ready: AtomicBool,
    /// `/readyz` body until then: what it waits for.
    not_ready: &'static str,
}

impl Health {
    /// Not ready yet; `/readyz` answers 503 with `waiting_for` until [`Health::ready`] is set.
    pub fn new(waiting_for: &'static str) -> Self {
        Self {
            ready: AtomicBool::new(false),
            not_ready: waiting_for,
        }
    }
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        let (registry, health) = (registry.clone(), health.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| route(req, registry.clone(), health.clone()));
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

async fn route(
    req: Request<Incoming>,
    registry: Arc<Registry>,
    health: Arc<Health>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body, content_type) = match req.uri().path() {
        "/metrics" => {
            let accept = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (body, content_type) = crate::exposition::encode(&registry, accept);
            (StatusCode::OK, body, content_type)
        }
        "/healthz" => (StatusCode::OK, "ok\n".into(), "text/plain"),
        "/readyz" if health.ready.load(Ordering::Relaxed) => {
            (StatusCode::OK, "ok\n".into(), "text/plain")
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", health.not_ready),
            "text/plain",
        ),
        _ => (StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    Ok(resp)
}
