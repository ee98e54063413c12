//! Warming an Open Inference Protocol v2 server over REST: its model must be ready and named as
//! asked, take the fixture's inputs, and answer each sample within tolerance. Requests use
//! Triton's binary tensor extension where the server lists it (`GET /v2`: kiln-agent serve,
//! Triton), JSON otherwise (every v2 server reads it); answers may use either.

use std::collections::BTreeMap;

use kiln_crds::compiled_target::Warmup;

use super::verdict::{Cold, Endpoint, Figures, judge, requests, send_all};
use super::wire::{exchange, refused, snippet};
use kiln_engines::backend::tensor::HostTensor;
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_server::oip::{self, InferRequest, InferResponse, ModelMetadata, binary};

/// See [`super::check`].
pub async fn check(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<Figures, Cold> {
    let model = format!("{}/v2/models/{}", endpoint.base, endpoint.model);
    let (status, _, body) = exchange(client.get(format!("{model}/ready"))).await?;
    match status {
        200 => {}
        404 => {
            return Err(Cold::Mismatch(format!(
                "GET {model}/ready answered 404: the server does not serve model {:?} ({}); set kiln.dev/model-name to the name it serves",
                endpoint.model,
                snippet(&body)
            )));
        }
        _ => {
            return Err(Cold::Unreachable(format!(
                "GET {model}/ready answered {status}: not ready ({})",
                snippet(&body)
            )));
        }
    }
    check_metadata(client, &model, &endpoint.model, fixture).await?;
    let binary = speaks_binary(client, &endpoint.base).await;
    let samples = fixture.samples();
    let bodies = samples
        .iter()
        .map(|s| request_body(&s.inputs, binary))
        .collect::<Result<Vec<_>, Cold>>()?;
    let n = requests(warmup, samples.len());
    let model = &model;
    send_all(
        n,
        samples.len(),
        |k| infer(client, model, bodies[k].clone()),
        |outputs, k| judge(outputs, &samples[k], warmup),
    )
    .await
}

/// The model's metadata must name it as asked and list the fixture's inputs: a server with
/// another model mounted is a mismatch before any request.
async fn check_metadata(
    client: &reqwest::Client,
    url: &str,
    name: &str,
    fixture: &FixtureFile,
) -> Result<(), Cold> {
    let (status, _, body) = exchange(client.get(url)).await?;
    if status != 200 {
        return Err(Cold::Malformed(format!(
            "GET {url} answered {status}: {}",
            snippet(&body)
        )));
    }
    let meta: ModelMetadata = serde_json::from_slice(&body)
        .map_err(|e| Cold::Malformed(format!("GET {url}: not v2 model metadata: {e}")))?;
    if meta.name != name {
        return Err(Cold::Mismatch(format!(
            "GET {url} describes model {:?}, not {name:?}",
            meta.name
        )));
    }
    let served: Vec<&str> = meta.inputs.iter().map(|i| i.name.as_str()).collect();
    let missing: Vec<&String> = fixture
        .inputs
        .keys()
        .filter(|k| !served.contains(&k.as_str()))
        .collect();
    if !meta.inputs.is_empty() && !missing.is_empty() {
        return Err(Cold::Mismatch(format!(
            "the server's model takes inputs {served:?}, the fixture's {missing:?} are not among them: another model is mounted"
        )));
    }
    Ok(())
}

/// Whether the server lists Triton's binary tensor extension in its metadata (`GET /v2`):
/// then requests carry their tensors as bytes, as production clients send them, so the
/// latencies measured are those clients see. Anything else: JSON, which every v2 server reads.
async fn speaks_binary(client: &reqwest::Client, base: &str) -> bool {
    let Ok((200, _, body)) = exchange(client.get(format!("{base}/v2"))).await else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("extensions").cloned())
        .and_then(|e| e.as_array().cloned())
        .is_some_and(|e| e.iter().any(|x| x == "binary_tensor_data"))
}

/// A request with every input: JSON, or the binary extension's JSON header and tensor bytes
/// (outputs asked in binary too); the header's length beside it when binary.
fn request_body(
    inputs: &BTreeMap<String, HostTensor>,
    binary: bool,
) -> Result<(Vec<u8>, Option<usize>), Cold> {
    let wire = |(n, t): (&String, &HostTensor)| {
        if binary {
            oip::from_host_binary(n, t)
        } else {
            oip::from_host(n, t)
        }
    };
    let tensors = inputs
        .iter()
        .map(wire)
        .collect::<Result<Vec<_>, String>>()
        .map_err(|m| Cold::Mismatch(format!("fixture input: {m}")))?;
    let mut request = InferRequest {
        inputs: tensors,
        ..InferRequest::default()
    };
    if binary {
        request
            .parameters
            .insert("binary_data_output".into(), serde_json::Value::Bool(true));
    }
    let mut body =
        serde_json::to_vec(&request).map_err(|e| Cold::Mismatch(format!("fixture input: {e}")))?;
    if !binary {
        return Ok((body, None));
    }
    let header = body.len();
    for t in inputs.values() {
        body.extend_from_slice(&t.data);
    }
    Ok((body, Some(header)))
}

/// One inference: the outputs, or why the answer cannot be judged.
async fn infer(
    client: &reqwest::Client,
    model: &str,
    (body, header_length): (Vec<u8>, Option<usize>),
) -> Result<BTreeMap<String, HostTensor>, Cold> {
    let url = format!("{model}/infer");
    let mut request = client.post(&url);
    request = match header_length {
        Some(n) => request
            .header("content-type", "application/octet-stream")
            .header(oip::HEADER_LENGTH, n.to_string()),
        None => request.header("content-type", "application/json"),
    };
    let (status, header, answer) = exchange(request.body(body)).await?;
    if status != 200 {
        return Err(refused(&format!("POST {url}"), status, &answer));
    }
    let (json, tail) = binary::split(&answer, header.as_deref())
        .map_err(|m| Cold::Malformed(format!("POST {url}: {m}")))?;
    let response: InferResponse = serde_json::from_slice(json)
        .map_err(|e| Cold::Malformed(format!("POST {url}: not a v2 infer response: {e}")))?;
    binary::response_outputs(&response, tail)
        .map_err(|m| Cold::Malformed(format!("POST {url}: {m}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::Dtype;

    #[test]
    fn a_request_carries_the_same_inputs_as_json_or_as_bytes() {
        let inputs = BTreeMap::from([
            (
                "a".to_string(),
                HostTensor {
                    dtype: Dtype::F32,
                    shape: vec![2],
                    data: [1.5f32, -2.0]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect(),
                },
            ),
            (
                "b".to_string(),
                HostTensor {
                    dtype: Dtype::I64,
                    shape: vec![1],
                    data: 7i64.to_le_bytes().to_vec(),
                },
            ),
        ]);
        let (json, none) = request_body(&inputs, false).expect("json");
        assert_eq!(none, None);
        let parsed: InferRequest = serde_json::from_slice(&json).expect("a JSON request");
        assert_eq!(
            binary::request_inputs(&parsed, &[]).expect("inputs"),
            inputs
        );
        let (body, header) = request_body(&inputs, true).expect("binary");
        let n = header.expect("a header length").to_string();
        let (head, tail) = binary::split(&body, Some(&n)).expect("split");
        let parsed: InferRequest = serde_json::from_slice(head).expect("header");
        assert!(
            oip::wants_binary(&parsed, "any output"),
            "outputs asked as bytes too"
        );
        assert_eq!(
            binary::request_inputs(&parsed, tail).expect("inputs"),
            inputs
        );
    }
}
