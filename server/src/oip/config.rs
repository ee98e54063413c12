//! Triton's model configuration extension (`GET /v2/models/{name}/config`), the part clients
//! read before they send: perf_analyzer, the field's load tool, stops without it. Made from the
//! protocol's metadata; `max_batch_size` 0 (every request carries its whole shape: a profile's).
//! Pure.

use serde_json::{Value, json};

use super::{ModelMetadata, TensorMetadata};

/// Triton's `TYPE_…` name of a protocol datatype (`FP32` → `TYPE_FP32`, `BYTES` →
/// `TYPE_STRING`).
pub fn triton_type(datatype: &str) -> String {
    match datatype {
        "BYTES" => "TYPE_STRING".to_string(),
        other => format!("TYPE_{other}"),
    }
}

/// The configuration of the model `meta` describes.
pub fn of(meta: &ModelMetadata) -> Value {
    let tensors = |items: &[TensorMetadata]| -> Vec<Value> {
        items
            .iter()
            .map(
                |t| json!({"name": t.name, "data_type": triton_type(&t.datatype), "dims": t.shape}),
            )
            .collect()
    };
    json!({
        "name": meta.name,
        "platform": meta.platform,
        "max_batch_size": 0,
        "input": tensors(&meta.inputs),
        "output": tensors(&meta.outputs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_names_each_tensor_with_tritons_types_and_whole_shapes() {
        let meta = ModelMetadata {
            name: "squeezenet".into(),
            versions: Vec::new(),
            platform: "tract".into(),
            inputs: vec![TensorMetadata {
                name: "data_0".into(),
                datatype: "FP32".into(),
                shape: vec![-1, 3, 224, 224],
            }],
            outputs: vec![TensorMetadata {
                name: "ids".into(),
                datatype: "BYTES".into(),
                shape: vec![1],
            }],
            parameters: Default::default(),
        };
        let c = of(&meta);
        assert_eq!(c["max_batch_size"], 0);
        assert_eq!(
            c["input"][0],
            json!({"name": "data_0", "data_type": "TYPE_FP32", "dims": [-1, 3, 224, 224]})
        );
        assert_eq!(c["output"][0]["data_type"], "TYPE_STRING");
    }
}
