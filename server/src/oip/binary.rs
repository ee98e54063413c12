//! Triton's binary tensor extension as bodies: split one into its JSON header and binary tail,
//! join a response's header and output bytes, and read the outputs of a response either way.
//! Pure.

use std::collections::BTreeMap;

use super::{InferRequest, InferResponse, WireTensor, binary_size, to_host};
use kiln_engines::backend::tensor::HostTensor;

/// `body` split at `header_length` (the `Inference-Header-Content-Length` header, when given)
/// into the JSON header and the binary tail.
pub fn split<'a>(
    body: &'a [u8],
    header_length: Option<&str>,
) -> Result<(&'a [u8], &'a [u8]), String> {
    let Some(length) = header_length else {
        return Ok((body, &[]));
    };
    let n: usize = length
        .trim()
        .parse()
        .map_err(|_| format!("Inference-Header-Content-Length {length:?} is not a byte count"))?;
    if n > body.len() {
        return Err(format!(
            "Inference-Header-Content-Length {n} is longer than the {}-byte body",
            body.len()
        ));
    }
    Ok(body.split_at(n))
}

/// Input tensors of a request by name, binary parts taken from `tail` in order; a name given
/// twice, a binary part that is short or left over, is refused.
pub fn request_inputs(
    request: &InferRequest,
    tail: &[u8],
) -> Result<BTreeMap<String, HostTensor>, String> {
    let mut inputs = BTreeMap::new();
    let mut at = 0usize;
    for t in &request.inputs {
        let part = take(t, tail, &mut at)?;
        if inputs.insert(t.name.clone(), to_host(t, part)?).is_some() {
            return Err(format!("input {:?} is given twice", t.name));
        }
    }
    if at != tail.len() {
        return Err(format!(
            "{} binary bytes follow the JSON header, the inputs' binary_data_size add up to {at}",
            tail.len()
        ));
    }
    Ok(inputs)
}

/// A response body: the JSON header, then each binary output's bytes in the order the header
/// lists them. Returns the body and the header's length (for `Inference-Header-Content-Length`)
/// when anything travels as binary.
pub fn join(response: &InferResponse, binary: &[Vec<u8>]) -> (Vec<u8>, Option<usize>) {
    let mut body = serde_json::to_vec(response).unwrap_or_default();
    if binary.is_empty() {
        return (body, None);
    }
    let header = body.len();
    for part in binary {
        body.extend_from_slice(part);
    }
    (body, Some(header))
}

/// The outputs of a response as host tensors by name, binary ones read from `tail` in order.
pub fn response_outputs(
    response: &InferResponse,
    tail: &[u8],
) -> Result<BTreeMap<String, HostTensor>, String> {
    let mut at = 0usize;
    let mut outputs = BTreeMap::new();
    for t in &response.outputs {
        let part = take(t, tail, &mut at)?;
        if outputs.insert(t.name.clone(), to_host(t, part)?).is_some() {
            return Err(format!("output {:?} is given twice", t.name));
        }
    }
    Ok(outputs)
}

fn take<'a>(t: &WireTensor, tail: &'a [u8], at: &mut usize) -> Result<Option<&'a [u8]>, String> {
    let Some(n) = binary_size(t)? else {
        return Ok(None);
    };
    let end = at
        .checked_add(n)
        .filter(|e| *e <= tail.len())
        .ok_or_else(|| {
            format!(
                "tensor {:?}: binary_data_size {n} runs past the {} binary bytes",
                t.name,
                tail.len()
            )
        })?;
    let part = &tail[*at..end];
    *at = end;
    Ok(Some(part))
}
