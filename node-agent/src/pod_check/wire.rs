//! The HTTP exchange every protocol's check makes with a serving pod: bounded answers, the
//! failure classified (no answer is `Unreachable`, an oversized one `Malformed`).

use futures::StreamExt;

use super::verdict::Cold;
use kiln_server::oip;

/// The largest answer read from a serving pod.
const MAX_ANSWER: usize = 256 << 20;

/// Sends a request; the status, the binary extension's header length and the body (at most
/// [`MAX_ANSWER`] bytes).
pub async fn exchange(
    request: reqwest::RequestBuilder,
) -> Result<(u16, Option<String>, Vec<u8>), Cold> {
    let response = request
        .send()
        .await
        .map_err(|e| Cold::Unreachable(kiln_node_core::error::with_causes(&e)))?;
    let status = response.status().as_u16();
    let header = response
        .headers()
        .get(oip::HEADER_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Cold::Unreachable(kiln_node_core::error::with_causes(&e)))?;
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(Cold::Malformed(format!(
                "the answer is longer than {MAX_ANSWER} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((status, header, body))
}

/// The start of a body, for messages.
pub fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).to_string();
    text.trim().to_string()
}

/// A request the server answered with another status than 200: 401 and 403 refuse the agent's
/// credentials (`Unauthorized`: the pod's `kiln.dev/api-key-secret`), another 4xx refuses this
/// request (the server takes other inputs or serves another model: `Mismatch`), anything else is
/// outside the protocol (`Malformed`).
pub fn refused(what: &str, status: u16, body: &[u8]) -> Cold {
    let message = format!("{what} answered {status}: {}", snippet(body));
    if status == 401 || status == 403 {
        Cold::Unauthorized(format!(
            "{message}; a server that wants an API key gets it from the Secret the pod names in kiln.dev/api-key-secret"
        ))
    } else if (400..500).contains(&status) {
        Cold::Mismatch(message)
    } else {
        Cold::Malformed(message)
    }
}

/// Parses a 200 answer as `api` answers (`"llama-server's"`: named in the message when it does
/// not parse); any other status is the server's refusal of the request ([`refused`]).
pub fn json_of<T: serde::de::DeserializeOwned>(
    api: &str,
    url: &str,
    (status, _, body): (u16, Option<String>, Vec<u8>),
) -> Result<T, Cold> {
    match status {
        200 => serde_json::from_slice(&body).map_err(|e| {
            Cold::Malformed(format!("{url}: not {api} answer: {e} ({})", snippet(&body)))
        }),
        _ => Err(refused(url, status, &body)),
    }
}
