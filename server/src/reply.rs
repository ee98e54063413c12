//! The replies every route builds: a JSON body with its status, an error in the protocol's
//! shape. Pure.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};

use crate::oip::ErrorBody;

/// A reply.
pub type Reply = Response<Full<Bytes>>;

/// `value` as JSON with `status`.
pub fn json(status: StatusCode, value: &impl serde::Serialize) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(value).unwrap_or_default(),
    )));
    *reply.status_mut() = status;
    if let Ok(v) = "application/json".parse() {
        reply.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    reply
}

/// The protocol's error body with `status`; server errors but 503 logged.
pub fn error(status: StatusCode, message: String) -> Reply {
    if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
        tracing::warn!(%status, %message, "request failed");
    }
    json(status, &ErrorBody { error: message })
}
