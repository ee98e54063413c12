//! Whether an ONNX graph carries all its weights (pure). A tensor stored as ONNX external data
//! names a file beside the model; an artifact that holds the graph alone would, when loaded, read
//! those weights from whatever file sits at that path then: bytes outside the artifact's digest,
//! never verified. ONNX Runtime's optimised graph keeps the source's external references for
//! the initializers it leaves untouched, so a compile checks its output here.

use tract_onnx::pb::{GraphProto, SparseTensorProto, TensorProto};

/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;

/// The names of the tensors of `graph` stored as external data: its initializers (dense and
/// sparse), its nodes' tensor attributes and those of every subgraph, recursively.
pub fn external_tensors(graph: &GraphProto) -> Vec<String> {
    let mut found = Vec::new();
    walk(graph, &mut found);
    found
}

fn walk(graph: &GraphProto, found: &mut Vec<String>) {
    let sparse = |s: &SparseTensorProto| {
        s.values
            .iter()
            .chain(s.indices.iter())
            .cloned()
            .collect::<Vec<_>>()
    };
    let mut tensors: Vec<TensorProto> = graph.initializer.clone();
    tensors.extend(graph.sparse_initializer.iter().flat_map(sparse));
    for node in &graph.node {
        for a in &node.attribute {
            tensors.extend(a.t.iter().cloned());
            tensors.extend(a.tensors.iter().cloned());
            tensors.extend(a.sparse_tensor.iter().flat_map(sparse));
            tensors.extend(a.sparse_tensors.iter().flat_map(sparse));
            for g in a.g.iter().chain(a.graphs.iter()) {
                walk(g, found);
            }
        }
    }
    found.extend(
        tensors
            .into_iter()
            .filter(|t| t.data_location == Some(EXTERNAL) || !t.external_data.is_empty())
            .map(|t| t.name),
    );
}

/// A tensor named `name`, stored as external data in `model.onnx.data` when `external`.
#[cfg(test)]
pub(super) fn tensor(name: &str, external: bool) -> TensorProto {
    use tract_onnx::pb::StringStringEntryProto;
    TensorProto {
        name: name.into(),
        data_location: external.then_some(EXTERNAL),
        external_data: if external {
            vec![StringStringEntryProto {
                key: "location".into(),
                value: "model.onnx.data".into(),
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::pb::{AttributeProto, NodeProto};

    #[test]
    fn every_external_tensor_is_found_however_deep() {
        let inner = GraphProto {
            initializer: vec![tensor("deep", true)],
            ..Default::default()
        };
        let graph = GraphProto {
            initializer: vec![tensor("w0", true), tensor("b0", false)],
            node: vec![NodeProto {
                attribute: vec![
                    AttributeProto {
                        t: Some(tensor("constant", true)),
                        ..Default::default()
                    },
                    AttributeProto {
                        g: Some(inner),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut found = external_tensors(&graph);
        found.sort();
        assert_eq!(found, ["constant", "deep", "w0"]);
        let inline = GraphProto {
            initializer: vec![tensor("b0", false)],
            ..Default::default()
        };
        assert!(external_tensors(&inline).is_empty());
    }
}
