//! What in an ONNX graph tract cannot compile into an artifact, by operator and node, found
//! before tract's analyser trips over it (its trace names neither plainly). Pure: reads a parsed
//! model, returns the refusal.

use std::collections::{BTreeMap, HashMap, HashSet};

use tract_onnx::pb::{GraphProto, NodeProto};
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::logic::IfThenElse;
use tract_onnx::tract_core::ops::unimpl::UnimplementedOp;

use kiln_node_core::error::{Error, Result};

/// How many node names one entry lists before it counts the rest.
const NAMES_SHOWN: usize = 3;

/// Each operator (or kind of use of one) tract cannot compile, with the nodes where it occurs.
pub type Found = BTreeMap<String, Vec<String>>;

/// Operators tract does not implement at all (`Loop`, `Col2Im`, custom domains).
pub fn unimplemented(inference: &InferenceModel) -> Found {
    let mut found = Found::new();
    for node in inference
        .nodes()
        .iter()
        .filter(|n| n.op_is::<UnimplementedOp>())
    {
        let name = node.op().name();
        let op = name
            .strip_prefix("Unimplemented(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or(&name)
            .to_string();
        found.entry(op).or_default().push(node.name.clone());
    }
    found
}

/// `If` nodes of the main graph whose condition is computed from an input's values. tract
/// keeps only the branch a condition known at compile time picks (a profile fixes every shape,
/// so conditions on shapes are known); a condition known only at run time needs both branches
/// typed and written, and tract's NNEF has no `If`.
pub fn runtime_conditions(graph: &GraphProto) -> Found {
    let producers: HashMap<&str, &NodeProto> = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n)))
        .collect();
    let constants: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let inputs: HashSet<&str> = graph
        .input
        .iter()
        .map(|i| i.name.as_str())
        .filter(|n| !constants.contains(n))
        .collect();
    let mut found = Found::new();
    for node in graph.node.iter().filter(|n| is_onnx(n, "If")) {
        let Some(cond) = node.input.first() else {
            continue;
        };
        if let Some(input) = input_behind(cond, &producers, &inputs) {
            found
                .entry(format!(
                    "If on a condition computed at run time from input {input}"
                ))
                .or_default()
                .push(node_name(node));
        }
    }
    found
}

/// `If` nodes left after decluttering: their condition did not fold to a constant.
pub fn undecided(typed: &TypedModel) -> Found {
    let nodes: Vec<String> = typed
        .nodes()
        .iter()
        .filter(|n| n.op_is::<IfThenElse>())
        .map(|n| n.name.clone())
        .collect();
    if nodes.is_empty() {
        return Found::new();
    }
    [("If on a condition computed at run time".to_string(), nodes)].into()
}

/// The refusal naming everything found, or nothing to refuse.
pub fn refuse(found: Found) -> Result<()> {
    if found.is_empty() {
        return Ok(());
    }
    let operators = found
        .into_iter()
        .map(|(op, nodes)| {
            let shown: Vec<String> = nodes
                .iter()
                .take(NAMES_SHOWN)
                .map(|n| format!("{n:?}"))
                .collect();
            let more = nodes.len().saturating_sub(NAMES_SHOWN);
            let plural = if nodes.len() == 1 { "node" } else { "nodes" };
            let rest = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{op} ({plural} {}{rest})", shown.join(", "))
        })
        .collect();
    Err(Error::UnsupportedOperator {
        backend: "tract".into(),
        operators,
    })
}

/// The first graph input whose values `value` is computed from, not counting what reads only
/// a tensor's shape.
fn input_behind<'g>(
    value: &'g str,
    producers: &HashMap<&'g str, &'g NodeProto>,
    inputs: &HashSet<&'g str>,
) -> Option<&'g str> {
    let mut todo = vec![value];
    let mut seen = HashSet::new();
    while let Some(v) = todo.pop() {
        if !seen.insert(v) {
            continue;
        }
        if inputs.contains(v) {
            return Some(v);
        }
        match producers.get(v) {
            Some(n) if is_onnx(n, "Shape") || is_onnx(n, "Size") => {}
            Some(n) => todo.extend(n.input.iter().map(String::as_str).filter(|i| !i.is_empty())),
            None => {}
        }
    }
    None
}

fn is_onnx(node: &NodeProto, op: &str) -> bool {
    node.op_type == op && (node.domain.is_empty() || node.domain == "ai.onnx")
}

/// The name tract gives the node: its own, else its first output's.
fn node_name(node: &NodeProto) -> String {
    if !node.name.is_empty() {
        node.name.clone()
    } else {
        node.output.first().cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::pb::{TensorProto, ValueInfoProto};

    fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: name.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn graph(nodes: Vec<NodeProto>, inputs: &[&str], initializers: &[&str]) -> GraphProto {
        GraphProto {
            node: nodes,
            input: inputs
                .iter()
                .map(|n| ValueInfoProto {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            initializer: initializers
                .iter()
                .map(|n| TensorProto {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_condition_on_an_input_value_is_found_through_the_nodes_computing_it() {
        let g = graph(
            vec![
                node("Equal", "eq", &["sr", "k16000"], &["is16k"]),
                node("Not", "", &["is16k"], &["not16k"]),
                node("If", "", &["not16k"], &["out"]),
            ],
            &["x", "sr", "k16000"],
            &["k16000"],
        );
        let found = runtime_conditions(&g);
        assert_eq!(
            found,
            [(
                "If on a condition computed at run time from input sr".to_string(),
                vec!["out".to_string()]
            )]
            .into()
        );
        let message = refuse(found).expect_err("refused").to_string();
        assert!(
            message.contains("from input sr (node \"out\")"),
            "{message}"
        );
    }

    #[test]
    fn a_condition_on_shapes_or_constants_is_left_to_tract() {
        let g = graph(
            vec![
                node("Shape", "shape", &["x"], &["s"]),
                node("Gather", "dim", &["s", "zero"], &["d"]),
                node("Equal", "eq", &["d", "one"], &["c"]),
                node("If", "by_shape", &["c"], &["y"]),
                node("If", "by_constant", &["one"], &["z"]),
            ],
            &["x"],
            &["zero", "one"],
        );
        assert!(runtime_conditions(&g).is_empty());
    }

    #[test]
    fn long_lists_of_nodes_are_counted_not_spelled_out() {
        let nodes = (0..5).map(|i| format!("loop_{i}")).collect();
        let message = refuse([("Loop".to_string(), nodes)].into())
            .expect_err("refused")
            .to_string();
        assert!(
            message.ends_with("Loop (nodes \"loop_0\", \"loop_1\", \"loop_2\" and 2 more)"),
            "{message}"
        );
        assert!(refuse(Found::new()).is_ok());
    }
}
