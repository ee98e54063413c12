//! Node classes: which nodes a target selects, and how they group by the target's class label
//! keys; the node label changes that follow ([`LabelChange`]). Pure: nodes in, classes out; no
//! client.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kiln_crds::KilnNode;
pub use kiln_crds::class::selector_matches;
use kiln_crds::class::{ClassFacts, class_facts, class_id, node_class_labels, unreported_keys};
use kiln_crds::kiln_node::NodeTargetStatus;
use kiln_crds::labels::{DEFAULT_CLASS_KEYS, NODE_CLASS};
use sha2::{Digest, Sha256};

/// A node as class discovery sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// The node's own labels (what selectors match and what the operator may patch).
    pub labels: BTreeMap<String, String>,
    /// Class labels: the node's labels over the facts its KilnNode reports, so that a node
    /// without GPU Feature Discovery labels still classifies by CPU arch and x86-64 level.
    pub class_labels: BTreeMap<String, String>,
    /// Whether the node's agent has reported its hardware (KilnNode `status.hardware`).
    pub reported: bool,
    /// The node's KilnNode rows for the target being planned (the controller fills these in).
    pub targets: Vec<NodeTargetStatus>,
}

impl NodeView {
    /// Merges a Node with its KilnNode (same name), when the agent has reported one.
    pub fn new(node: &Node, kiln_node: Option<&KilnNode>) -> Self {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let facts = kiln_node
            .and_then(|k| k.status.as_ref())
            .and_then(|s| s.hardware.as_ref());
        let class_labels = node_class_labels(&labels, facts);
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels,
            class_labels,
            reported: facts.is_some(),
            targets: Vec::new(),
        }
    }
}

/// One hardware class of one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    /// Readable id plus short hash ([`class_id`]).
    pub id: String,
    /// Normalised label values.
    pub facts: ClassFacts,
    /// Member nodes, sorted.
    pub nodes: Vec<String>,
}

/// The node label that carries class ids for a set of class keys. Targets that use the default
/// keys (the common case) share `kiln.dev/class`; a target with its own keys gets
/// `kiln.dev/class-<8 hex of the sorted keys>`, so a node can sit in the classes of several key
/// sets at once without one label flapping between them.
pub fn class_label_key(keys: &[String]) -> String {
    let set: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
    let default: BTreeSet<&str> = DEFAULT_CLASS_KEYS.into_iter().collect();
    if set == default {
        return NODE_CLASS.to_string();
    }
    let encoded = set.into_iter().collect::<Vec<_>>().join("\n");
    let hash = hex::encode(&Sha256::digest(encoded.as_bytes())[..4]);
    format!("{NODE_CLASS}-{hash}")
}

/// Whether `node` waits for its agent's hardware report before it has a class
/// ([`unreported_keys`]).
fn awaits_report(keys: &[String], node: &NodeView) -> bool {
    !unreported_keys(keys.iter().map(String::as_str), &node.labels, node.reported).is_empty()
}

/// The nodes `selector` picks (all when none), grouped into classes by `keys`, ordered by id.
/// Nodes still waiting for their agent's report ([`unreported`]) are in no class yet.
pub fn group(selector: Option<&LabelSelector>, keys: &[String], nodes: &[NodeView]) -> Vec<Class> {
    let mut classes: BTreeMap<String, Class> = BTreeMap::new();
    for node in nodes {
        if !selector.is_none_or(|s| selector_matches(s, &node.labels)) || awaits_report(keys, node)
        {
            continue;
        }
        let facts = class_facts(keys.iter().map(String::as_str), &node.class_labels);
        let id = class_id(&facts);
        classes
            .entry(id.clone())
            .or_insert_with(|| Class {
                id,
                facts,
                nodes: Vec::new(),
            })
            .nodes
            .push(node.name.clone());
    }
    let mut out: Vec<Class> = classes.into_values().collect();
    for c in &mut out {
        c.nodes.sort();
    }
    out
}

/// Selected nodes whose class waits for their agent's hardware report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unreported<'a> {
    /// The nodes, sorted by name.
    pub nodes: Vec<String>,
    /// The class keys the report would supply, in `keys` order, each once.
    pub keys: Vec<&'a str>,
}

/// Selected nodes whose class waits for their agent's hardware report, and the keys it supplies.
pub fn unreported<'a>(
    selector: Option<&LabelSelector>,
    keys: &'a [String],
    nodes: &[NodeView],
) -> Unreported<'a> {
    let (mut names, mut missing) = (Vec::new(), BTreeSet::new());
    for node in nodes {
        if !selector.is_none_or(|s| selector_matches(s, &node.labels)) {
            continue;
        }
        let lacking = unreported_keys(keys.iter().map(String::as_str), &node.labels, node.reported);
        if !lacking.is_empty() {
            names.push(node.name.clone());
            missing.extend(lacking);
        }
    }
    names.sort();
    let keys_in_order = keys
        .iter()
        .map(String::as_str)
        .filter(|k| missing.contains(k))
        .collect();
    Unreported {
        nodes: names,
        keys: keys_in_order,
    }
}

/// Non-default class keys that none of the selected nodes carries: almost always a typo or an
/// unlabelled fleet, and worth a condition rather than one catch-all class.
pub fn missing_keys(
    selector: Option<&LabelSelector>,
    keys: &[String],
    nodes: &[NodeView],
) -> Vec<String> {
    keys.iter()
        .filter(|k| !DEFAULT_CLASS_KEYS.contains(&k.as_str()))
        .filter(|k| {
            !nodes
                .iter()
                .filter(|n| selector.is_none_or(|s| selector_matches(s, &n.labels)))
                .any(|n| n.class_labels.contains_key(k.as_str()))
        })
        .cloned()
        .collect()
}

/// A node label to set or remove.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LabelChange {
    /// Node name.
    pub node: String,
    /// Label key.
    pub key: String,
    /// The value to set; `None` removes the label.
    pub value: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeView {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        NodeView {
            name: name.into(),
            class_labels: labels.clone(),
            labels,
            reported: true,
            targets: Vec::new(),
        }
    }

    #[test]
    fn default_keys_share_one_label_and_custom_keys_get_their_own() {
        let default = kiln_crds::labels::default_class_keys();
        assert_eq!(class_label_key(&default), NODE_CLASS);
        let mut reordered = default.clone();
        reordered.reverse();
        assert_eq!(class_label_key(&reordered), NODE_CLASS);
        let custom = vec!["kubernetes.io/arch".to_string()];
        let key = class_label_key(&custom);
        assert!(key.starts_with("kiln.dev/class-") && key.len() == NODE_CLASS.len() + 9);
        assert_ne!(key, class_label_key(&["example.com/x".to_string()]));
    }

    #[test]
    fn selector_operators() {
        let n = node("a", &[("zone", "z1"), ("gpu", "yes")]);
        let req = |key: &str, op: &str, values: &[&str]| LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| (*v).into()).collect()),
        };
        let sel = |reqs: Vec<LabelSelectorRequirement>| LabelSelector {
            match_expressions: Some(reqs),
            match_labels: None,
        };
        assert!(selector_matches(
            &sel(vec![req("zone", "In", &["z1", "z2"])]),
            &n.labels
        ));
        assert!(!selector_matches(
            &sel(vec![req("zone", "NotIn", &["z1"])]),
            &n.labels
        ));
        assert!(selector_matches(
            &sel(vec![req("gpu", "Exists", &[])]),
            &n.labels
        ));
        assert!(selector_matches(
            &sel(vec![req("tpu", "DoesNotExist", &[])]),
            &n.labels
        ));
        assert!(!selector_matches(
            &sel(vec![req("gpu", "Bogus", &[])]),
            &n.labels
        ));
    }

    #[test]
    fn kiln_node_facts_fill_in_for_missing_labels_but_node_labels_win() {
        let mut k = KilnNode::new("a", Default::default());
        k.status = Some(kiln_crds::KilnNodeStatus {
            hardware: Some(kiln_crds::kiln_node::HardwareFacts {
                arch: "amd64".into(),
                cpu_level: "x86-64-v3".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut n = Node::default();
        n.metadata.name = Some("a".into());
        n.metadata.labels = Some(BTreeMap::from([(
            "kubernetes.io/arch".to_string(),
            "arm64".to_string(),
        )]));
        let v = NodeView::new(&n, Some(&k));
        assert_eq!(v.class_labels["kiln.dev/cpu-level"], "x86-64-v3");
        assert_eq!(v.class_labels["kubernetes.io/arch"], "arm64");
        assert!(!v.labels.contains_key("kiln.dev/cpu-level"));
        assert!(v.reported);
        assert!(!NodeView::new(&n, None).reported);
    }

    #[test]
    fn host_memory_splits_classes_only_for_targets_that_key_on_it() {
        let view = |name: &str, memory_bytes: i64| {
            let mut k = KilnNode::new(name, Default::default());
            k.status = Some(kiln_crds::KilnNodeStatus {
                hardware: Some(kiln_crds::kiln_node::HardwareFacts {
                    arch: "amd64".into(),
                    cpu_level: "x86-64-v3".into(),
                    memory_bytes,
                    ..Default::default()
                }),
                ..Default::default()
            });
            let mut n = Node::default();
            n.metadata.name = Some(name.into());
            NodeView::new(&n, Some(&k))
        };
        // MemTotal of two 16 GiB machines (the kernel keeps a little more on one) and a 32.
        let gib = 1i64 << 30;
        let nodes = [
            view("a", 16 * gib - (700 << 20)),
            view("b", 16 * gib - (500 << 20)),
            view("c", 32 * gib - (800 << 20)),
        ];
        let default = kiln_crds::labels::default_class_keys();
        assert_eq!(
            group(None, &default, &nodes).len(),
            1,
            "default keys: one class"
        );
        let mut keys = default.clone();
        keys.push(kiln_crds::labels::MEMORY_GIB.into());
        let classes = group(None, &keys, &nodes);
        let split: Vec<(&str, Vec<String>)> = classes
            .iter()
            .map(|c| {
                (
                    c.facts[kiln_crds::labels::MEMORY_GIB].as_str(),
                    c.nodes.clone(),
                )
            })
            .collect();
        assert_eq!(
            split,
            [
                ("16", vec!["a".to_string(), "b".to_string()]),
                ("32", vec!["c".to_string()])
            ]
        );
        assert!(
            classes[0].id.starts_with("amd64-x86-64-v3-16gib-"),
            "{}",
            classes[0].id
        );
        // Until its report comes, a node waits for the memory fact like for the CPU level.
        let mut waiting = nodes[0].clone();
        waiting.reported = false;
        waiting.class_labels = waiting.labels.clone();
        let lacking = unreported(None, &keys, &[waiting]).keys;
        assert!(
            lacking.contains(&kiln_crds::labels::MEMORY_GIB),
            "{lacking:?}"
        );
    }

    #[test]
    fn a_node_without_its_report_is_in_no_class_until_it_comes() {
        let keys = kiln_crds::labels::default_class_keys();
        let mut cpu = node("cpu-0", &[("kubernetes.io/arch", "amd64")]);
        cpu.reported = false;
        let mut labelled = node(
            "gpu-0",
            &[
                ("kubernetes.io/arch", "amd64"),
                ("kiln.dev/cpu-level", "x86-64-v3"),
                ("nvidia.com/gpu.product", "NVIDIA-L4"),
                ("nvidia.com/gpu.compute.major", "8"),
                ("nvidia.com/gpu.compute.minor", "9"),
                ("nvidia.com/cuda.driver-version.major", "550"),
            ],
        );
        labelled.reported = false;
        let nodes = [cpu.clone(), labelled];
        let classes = group(None, &keys, &nodes);
        assert_eq!(classes.len(), 1);
        assert_eq!(classes[0].nodes, ["gpu-0"], "every class key is a label");
        let waiting = unreported(None, &keys, &nodes);
        assert_eq!(waiting.nodes, ["cpu-0"]);
        assert_eq!(
            waiting.keys,
            [
                "nvidia.com/gpu.product",
                "nvidia.com/gpu.compute.major",
                "nvidia.com/gpu.compute.minor",
                "nvidia.com/cuda.driver-version.major",
                "kiln.dev/cpu-level"
            ]
        );
        // Keys no report supplies do not wait: arch is a label on every node.
        let arch = vec!["kubernetes.io/arch".to_string()];
        assert_eq!(group(None, &arch, &nodes).len(), 1);
        assert!(unreported(None, &arch, &nodes).nodes.is_empty());
        // The report arrives: cpu-0 gets its class (facts merged by NodeView::new).
        cpu.reported = true;
        cpu.class_labels
            .insert("kiln.dev/cpu-level".into(), "x86-64-v4".into());
        let classes = group(None, &keys, &[cpu]);
        assert!(
            classes[0].id.starts_with("amd64-x86-64-v4-"),
            "{}",
            classes[0].id
        );
    }
}
