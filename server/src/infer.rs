//! One inference request: its body read within the limit, its inputs checked, its deadline
//! set ([`deadline`]), a worker waited for in a bounded line ([`crate::admission`]), one engine
//! run on a worker thread ([`crate::workers`]), the outputs encoded as asked, and what happened counted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::Value;

use crate::State;
use crate::admission::Shed;
use crate::metrics::ModelLabels;
use crate::model::{Refusal, Served};
use crate::oip::{self, InferRequest, InferResponse, binary};
use crate::reply::{Reply, error};
use kiln_engines::backend::tensor::HostTensor;

/// The header a mesh's proxy (Envoy, so Istio) sets on a request it forwards: the time it will
/// wait for the answer, in milliseconds.
pub const TIMEOUT_HEADER: &str = "x-envoy-expected-rq-timeout-ms";

/// Seconds a shed client is told to wait before it retries.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// Answers one `POST /v2/models/{name}/infer`.
pub async fn infer(req: Request<Incoming>, s: Arc<Served>, state: &Arc<State>) -> Reply {
    let arrived = Instant::now();
    let labels = ModelLabels::of(&s);
    let fail = |status: StatusCode, reason: &str, message: String| {
        state.metrics.failed(&labels, reason);
        error(status, message)
    };
    let req = match shed_early(req, state, &labels).await {
        Ok(req) => req,
        Err(reply) => return reply,
    };
    let header_ms = req
        .headers()
        .get(TIMEOUT_HEADER)
        .map(|v| v.to_str().unwrap_or("not text").to_string());
    let (request, inputs) = match read(req, state.limits.max_body).await {
        Ok(r) => r,
        Err((status, m)) => return fail(status, "invalid", m),
    };
    // Refused once its body is read: a server that closes on an unread body resets the
    // connection, and the client cannot tell whether its request ran.
    if state.gate.draining() {
        return shed(Shed::Draining, state, &labels);
    }
    let deadline = match deadline(
        arrived,
        state.limits.request_timeout,
        header_ms.as_deref(),
        request.parameters.get("timeout"),
    ) {
        Ok(d) => d,
        Err(m) => return fail(StatusCode::BAD_REQUEST, "invalid", m),
    };
    let admitted = match state.gate.admit(deadline).await {
        Ok(a) => a,
        Err(why) => return shed(why, state, &labels),
    };
    let queued = admitted.waited;
    let wanted: Option<Vec<String>> = request
        .outputs
        .as_ref()
        .map(|o| o.iter().map(|o| o.name.clone()).collect());
    let run = async {
        let batcher = state.batcher.get().filter(|b| {
            b.takes(&inputs) && crate::model::check_inputs(s.pool.first(), &inputs).is_ok()
        });
        if let Some(b) = batcher {
            let answer = b.run(inputs).await;
            drop(admitted);
            return answer.map(|(rows, took, leads)| {
                let kept = rows.and_then(|o| crate::model::keep(o, wanted.as_deref()));
                (kept, took, leads)
            });
        }
        let s2 = s.clone();
        // The worker goes with the run: a client that hangs up does not free it early.
        s.workers
            .run(move || {
                let started = Instant::now();
                let outputs = s2.infer(&inputs, wanted.as_deref());
                drop(admitted);
                (outputs, started.elapsed(), true)
            })
            .await
    };
    let ran = run.await;
    if ran.as_ref().is_some_and(|(_, _, leads)| *leads) {
        state.metrics.executed(&labels);
    }
    let (outputs, compute) = match ran {
        Some((Ok(outputs), compute, _)) => (outputs, compute),
        Some((Err(Refusal::Request(m)), _, _)) => {
            return fail(StatusCode::BAD_REQUEST, "invalid", m);
        }
        Some((Err(Refusal::Engine(m)), _, _)) => {
            return fail(StatusCode::INTERNAL_SERVER_ERROR, "backend", m);
        }
        None => {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                "backend",
                "the run panicked".to_string(),
            );
        }
    };
    let reply = respond(&request, &s, &outputs);
    if reply.status().is_success() {
        let secs = Duration::as_secs_f64;
        state.metrics.answered(
            &labels,
            secs(&queued),
            secs(&compute),
            arrived.elapsed().as_secs_f64(),
        );
    } else {
        state.metrics.failed(&labels, "backend");
    }
    reply
}

/// A request the gate would shed now, refused before its body is buffered or parsed: under a
/// retry storm the refusals would otherwise take the cores from the runs. Its body is still read
/// to the end (and dropped frame by frame), so that the connection stays usable and the 503 is
/// not lost to a reset.
async fn shed_early(
    req: Request<Incoming>,
    state: &State,
    labels: &ModelLabels,
) -> Result<Request<Incoming>, Reply> {
    let why = if state.gate.draining() {
        Shed::Draining
    } else if state.gate.full() {
        Shed::Full
    } else {
        return Ok(req);
    };
    discard(req.into_body(), state.limits.max_body).await;
    Err(shed(why, state, labels))
}

/// Reads a body to its end within `max_body`, keeping none of it.
async fn discard(body: Incoming, max_body: usize) {
    let mut body = Limited::new(body, max_body);
    while let Some(Ok(_)) = body.frame().await {}
}

/// The body (JSON, or the binary extension's header and tail) read within `max_body`, and the
/// inputs it carries.
async fn read(
    req: Request<Incoming>,
    max_body: usize,
) -> Result<(InferRequest, BTreeMap<String, HostTensor>), (StatusCode, String)> {
    let header = req
        .headers()
        .get(oip::HEADER_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match Limited::new(req.into_body(), max_body).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body: {e} (the limit is --max-request-bytes {max_body})"),
            ));
        }
    };
    binary::split(&body, header.as_deref())
        .and_then(|(head, tail)| {
            let request: InferRequest =
                serde_json::from_slice(head).map_err(|e| format!("request JSON: {e}"))?;
            let inputs = binary::request_inputs(&request, tail)?;
            Ok((request, inputs))
        })
        .map_err(|m| (StatusCode::BAD_REQUEST, m))
}

/// The deadline of a request that arrived at `arrived`: the soonest of the server's
/// `--request-timeout-ms`, the mesh's [`TIMEOUT_HEADER`] (milliseconds) and the request's own
/// `parameters.timeout` (microseconds, as Triton reads it). A malformed one is refused with what
/// to send. Pure.
pub fn deadline(
    arrived: Instant,
    default: Option<Duration>,
    header_ms: Option<&str>,
    parameter_us: Option<&Value>,
) -> Result<Option<Instant>, String> {
    let header = header_ms
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| {
                    format!("header {TIMEOUT_HEADER}: {v:?} is not a whole number of milliseconds")
                })
        })
        .transpose()?;
    let parameter = parameter_us
        .map(|v| {
            v.as_u64().map(Duration::from_micros).ok_or_else(|| {
                format!("parameters.timeout: {v} is not a whole number of microseconds")
            })
        })
        .transpose()?;
    let soonest = [default, header, parameter]
        .into_iter()
        .flatten()
        .filter(|d| !d.is_zero())
        .min();
    Ok(soonest.map(|d| arrived + d))
}

/// The reply to a request that was not run, counted: full or draining is 503 with
/// `Retry-After` (another replica, or this one in a moment, takes it); a passed deadline is 504.
fn shed(why: Shed, state: &State, labels: &ModelLabels) -> Reply {
    state.metrics.failed(labels, why.reason());
    let (status, message) = match why {
        Shed::Full => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server is full: {} requests wait for {} workers (--max-queue {}); retry after {RETRY_AFTER_SECONDS} s",
                state.gate.waiting(),
                state.gate.workers(),
                state.gate.max_queue()
            ),
        ),
        Shed::Draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down; retry (another replica answers)".to_string(),
        ),
        Shed::Expired => (
            StatusCode::GATEWAY_TIMEOUT,
            "the request's deadline passed while it waited for a worker; it was not run"
                .to_string(),
        ),
    };
    let mut reply = error(status, message);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        reply.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from(RETRY_AFTER_SECONDS),
        );
    }
    reply
}

/// The response body: each output in JSON or, where asked, binary.
fn respond(request: &InferRequest, s: &Served, outputs: &BTreeMap<String, HostTensor>) -> Reply {
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
    let content_type = if header.is_some() {
        "application/octet-stream"
    } else {
        "application/json"
    };
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    if let Some(n) = header {
        headers.insert(oip::HEADER_LENGTH, hyper::header::HeaderValue::from(n));
    }
    reply
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_soonest_deadline_wins_and_a_malformed_one_says_what_to_send() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(deadline(t, None, None, None), Ok(None));
        assert_eq!(
            deadline(t, Some(ms(500)), None, None),
            Ok(Some(t + ms(500)))
        );
        assert_eq!(
            deadline(t, Some(ms(500)), Some("120"), Some(&Value::from(300_000))),
            Ok(Some(t + ms(120)))
        );
        assert_eq!(
            deadline(t, Some(ms(500)), None, Some(&Value::from(50_000))),
            Ok(Some(t + ms(50)))
        );
        assert_eq!(
            deadline(t, None, Some("0"), None),
            Ok(None),
            "0 is no deadline"
        );
        let bad = deadline(t, None, Some("soon"), None).unwrap_err();
        assert!(
            bad.contains(TIMEOUT_HEADER) && bad.contains("milliseconds"),
            "{bad}"
        );
        let bad = deadline(t, None, None, Some(&Value::from(-3))).unwrap_err();
        assert!(bad.contains("parameters.timeout"), "{bad}");
    }
}
