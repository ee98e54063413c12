//! kiln-server, the model server of `kiln-agent serve`: the Open Inference Protocol v2 over REST for the model a `csi.kiln.dev`
//! volume holds, loaded with the same engine code and settings the node's agent warmed
//! ([`model`]). Plain hyper, like the probe endpoints: seven routes need no framework.
//! Live at once, ready once the model is loaded; nothing is served that did not re-verify.
//! Touches one TCP listener and the model directory (read only).
//!
//! * [`oip`] — the protocol's wire types and binary tensor extension, which the agent's warmer
//!   also speaks to a serving pod.
//! * [`model`] — the model of a volume, loaded and checked.
//!
//! May use: kiln-engines, kiln-node-core, kiln-crds, kiln-store. Must not use a Kubernetes
//! client, the CSI plugin or the agent (`crds/tests/boundaries.rs`).

pub mod model;
pub mod oip;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use model::{Refusal, Served};
use oip::{ErrorBody, InferRequest, InferResponse, binary};

/// What the routes share.
pub struct State {
    /// Set once the model is loaded.
    pub served: OnceLock<Arc<Served>>,
    /// The largest request body accepted.
    pub max_body: usize,
}

/// Serves on `listen` until `shutdown` resolves.
pub async fn serve(
    listen: SocketAddr,
    state: Arc<State>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "serving the Open Inference Protocol v2");
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
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
}

type Reply = Response<Full<Bytes>>;

async fn route(req: Request<Incoming>, state: Arc<State>) -> Result<Reply, Infallible> {
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
    Ok(match (parts.as_slice(), served) {
        (["v2", "health", "live"], _) if get => {
            json(StatusCode::OK, &serde_json::json!({"live": true}))
        }
        (["v2", "health", "ready"], s) if get => ready(s.is_some()),
        (["v2"], _) if get => json(
            StatusCode::OK,
            &serde_json::json!({
                "name": "kiln-agent",
                "version": env!("CARGO_PKG_VERSION"),
                "extensions": ["binary_tensor_data"],
            }),
        ),
        (["v2", "models", name, rest @ ..], Some(s)) if *name == s.name => {
            model_route(req, rest, s, state.max_body).await
        }
        (["v2", "models", name, ..], Some(_)) => {
            error(StatusCode::NOT_FOUND, format!("no model {name:?} here"))
        }
        (["v2", "models", ..], None) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading".into(),
        ),
        _ => error(StatusCode::NOT_FOUND, "no such route".into()),
    })
}

/// The routes under `/v2/models/{name}` (and `/versions/{v}`, any version: one is served).
async fn model_route(
    req: Request<Incoming>,
    rest: &[&str],
    s: Arc<Served>,
    max_body: usize,
) -> Reply {
    let rest = match rest {
        ["versions", _, tail @ ..] => tail,
        other => other,
    };
    match (req.method(), rest) {
        (&Method::GET, []) => json(StatusCode::OK, &s.metadata),
        (&Method::GET, ["ready"]) => ready(true),
        (&Method::POST, ["infer"]) => infer(req, s, max_body).await,
        _ => error(StatusCode::NOT_FOUND, "no such route".into()),
    }
}

fn ready(yes: bool) -> Reply {
    if yes {
        json(StatusCode::OK, &serde_json::json!({"ready": true}))
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading".into(),
        )
    }
}

/// One inference: the body (JSON, or the binary extension's header and tail) read within
/// `max_body`, the inputs checked, one engine run off the async threads, the outputs encoded
/// as asked.
async fn infer(req: Request<Incoming>, s: Arc<Served>, max_body: usize) -> Reply {
    let header = req
        .headers()
        .get(oip::HEADER_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match Limited::new(req.into_body(), max_body).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body: {e} (the limit is --max-request-bytes {max_body})"),
            );
        }
    };
    let parsed = binary::split(&body, header.as_deref()).and_then(|(head, tail)| {
        let request: InferRequest =
            serde_json::from_slice(head).map_err(|e| format!("request JSON: {e}"))?;
        let inputs = binary::request_inputs(&request, tail)?;
        Ok((request, inputs))
    });
    let (request, inputs) = match parsed {
        Ok(p) => p,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let wanted: Option<Vec<String>> = request
        .outputs
        .as_ref()
        .map(|o| o.iter().map(|o| o.name.clone()).collect());
    let run = {
        let s = s.clone();
        tokio::task::spawn_blocking(move || s.infer(&inputs, wanted.as_deref()))
    };
    let outputs = match run.await {
        Ok(Ok(outputs)) => outputs,
        Ok(Err(Refusal::Request(m))) => return error(StatusCode::BAD_REQUEST, m),
        Ok(Err(Refusal::Engine(m))) => return error(StatusCode::INTERNAL_SERVER_ERROR, m),
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the run failed: {e}"),
            );
        }
    };
    respond(&request, &s, &outputs)
}

/// The response body: each output in JSON or, where asked, binary.
fn respond(
    request: &InferRequest,
    s: &Served,
    outputs: &std::collections::BTreeMap<String, kiln_engines::backend::tensor::HostTensor>,
) -> Reply {
    let mut response = InferResponse {
        model_name: s.name.clone(),
        model_version: Some(s.mounted.revision.to_string()),
        id: request.id.clone(),
        outputs: Vec::new(),
    };
    let mut tail = Vec::new();
    for (name, t) in outputs {
        let wire = if oip::wants_binary(request, name) {
            tail.push(t.data.clone());
            oip::from_host_binary(name, t)
        } else {
            oip::from_host(name, t)
        };
        match wire {
            Ok(w) => response.outputs.push(w),
            Err(m) => return error(StatusCode::INTERNAL_SERVER_ERROR, m),
        }
    }
    let (body, header) = binary::join(&response, &tail);
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    let headers = reply.headers_mut();
    match header {
        Some(n) => {
            headers.insert(
                hyper::header::CONTENT_TYPE,
                "application/octet-stream".parse().expect("static"),
            );
            if let Ok(v) = n.to_string().parse() {
                headers.insert(oip::HEADER_LENGTH, v);
            }
        }
        None => {
            headers.insert(
                hyper::header::CONTENT_TYPE,
                "application/json".parse().expect("static"),
            );
        }
    }
    reply
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(value).unwrap_or_default(),
    )));
    *reply.status_mut() = status;
    if let Ok(v) = "application/json".parse() {
        reply.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    reply
}

fn error(status: StatusCode, message: String) -> Reply {
    if status.is_server_error() {
        tracing::warn!(%status, %message, "request failed");
    }
    json(status, &ErrorBody { error: message })
}
