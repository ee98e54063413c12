//! Stage 2: which classes the selected nodes form and each class's compile key; the class
//! label every node should carry (and stale ones to remove); and, when there is no class to
//! compile for, why. Reads the nodes, the target, its model and the settings. Pure.

use kiln_crds::class::ClassFacts;
use kiln_crds::conditions::reasons;
use kiln_crds::{CompileKeyInput, CompiledTarget, ModelArtifact, compile_key};

use crate::plan::classes::{NodeView, class_label_key, group, missing_keys, unreported};
use crate::plan::conditions::Course;
use crate::plan::keyed::Keyed;
use crate::plan::{Inputs, LabelChange, Settings, validate};

/// The target's classes, and what follows for its nodes' class labels.
pub struct KeyedClasses {
    /// Classes, each with its compile key, in a stable order.
    pub keyed: Vec<Keyed>,
    /// The node label that carries the class id for the target's class keys.
    pub label_key: String,
    /// Why some selected nodes have no class yet, for the Ready condition.
    pub awaiting_note: Option<String>,
    /// Class labels of nodes whose class is unknown again (their KilnNode went): to remove.
    pub stale: Vec<LabelChange>,
    /// Why nothing can be compiled for these nodes, if so.
    pub halt: Option<Course>,
}

/// Classifies the selected nodes for a target whose spec is valid and whose model is `model`.
pub fn key_classes(inputs: &Inputs<'_>, model: &ModelArtifact) -> KeyedClasses {
    let t = &inputs.target.spec;
    let selector = t.node_selector.as_ref();
    let keyed = keyed_with(inputs, model);
    let missing = missing_keys(selector, &t.class_label_keys, inputs.nodes);
    let awaiting = unreported(selector, &t.class_label_keys, inputs.nodes);
    let awaiting_note =
        (!awaiting.nodes.is_empty()).then(|| awaiting_message(&awaiting.nodes, &awaiting.keys));
    let label_key = class_label_key(&t.class_label_keys);
    let stale = inputs
        .nodes
        .iter()
        .filter(|n| n.labels.contains_key(&label_key) && awaiting.nodes.contains(&n.name))
        .map(|n| LabelChange {
            node: n.name.clone(),
            key: label_key.clone(),
            value: None,
        })
        .collect();
    let halt = halt(&keyed, &missing, awaiting_note.as_ref());
    KeyedClasses {
        keyed,
        label_key,
        awaiting_note,
        stale,
        halt,
    }
}

/// The class label each class's nodes should carry, where they do not yet.
pub fn class_labels(keyed: &[Keyed], nodes: &[NodeView], label_key: &str) -> Vec<LabelChange> {
    keyed
        .iter()
        .flat_map(|k| k.class.nodes.iter().map(move |node| (node, &k.class.id)))
        .filter(|(node, id)| {
            let current = nodes
                .iter()
                .find(|n| &n.name == *node)
                .and_then(|n| n.labels.get(label_key));
            current != Some(*id)
        })
        .map(|(node, id)| LabelChange {
            node: node.clone(),
            key: label_key.to_string(),
            value: Some(id.clone()),
        })
        .collect()
}

/// No class, or a class key no node has: nothing to compile until the nodes (or the spec)
/// change. Nodes waiting for their agent's report are not a stall: agents report in seconds.
fn halt(keyed: &[Keyed], missing: &[String], awaiting_note: Option<&String>) -> Option<Course> {
    if keyed.is_empty() {
        return Some(match awaiting_note {
            Some(message) => Course::WaitingForNodeFacts {
                message: message.clone(),
            },
            None => Course::Stalled {
                reason: reasons::NO_MATCHING_NODES,
                message: "spec.nodeSelector matches no node; fix the selector or label the nodes that should serve this model".to_string(),
                waiting: "waiting for matching nodes",
            },
        });
    }
    (!missing.is_empty()).then(|| Course::Stalled {
        reason: reasons::CLASS_KEY_NOT_FOUND,
        message: format!(
            "class label key(s) {} are on none of the {} selected node(s); fix spec.classLabelKeys or label the nodes",
            missing.join(", "),
            keyed.iter().map(|k| k.class.nodes.len()).sum::<usize>()
        ),
        waiting: "waiting for matching nodes",
    })
}

/// Why `nodes` have no class yet, and what gives them one.
fn awaiting_message(nodes: &[String], keys: &[&str]) -> String {
    let mut named = nodes.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if nodes.len() > 5 {
        named.push_str(", …");
    }
    format!(
        "{} selected node(s) ({named}) have no class yet: their kiln-agent has not reported their hardware (no KilnNode) and they lack the class label(s) {}; they are classified once the agent DaemonSet runs on them",
        nodes.len(),
        keys.join(", ")
    )
}

/// The compile key of `target` for a class, as the compile worker computes it: with the
/// backend versions of the image that compiles the class (`Workers::for_class`).
pub fn key_for(
    model: &ModelArtifact,
    target: &CompiledTarget,
    facts: &ClassFacts,
    settings: &Settings,
) -> String {
    let t = &target.spec;
    let carried = &settings.workers.for_class(facts).backend_versions;
    let backend_version = if t.backend.kind == kiln_crds::compiled_target::BackendKind::Auto {
        // Every runtime the class's worker carries: what its candidates load.
        kiln_crds::compiled_target::auto_identity(
            carried.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        )
    } else {
        backend_version(
            t.backend.version.as_deref(),
            carried
                .get(t.backend.kind.runtime().as_str())
                .map(String::as_str),
        )
    };
    compile_key(&CompileKeyInput::for_target(
        &model.spec,
        t,
        facts,
        &backend_version,
    ))
}

/// The backend version a key names: what the workers carry (`1.31.1@sha256:<library>` for a
/// runtime loaded at run time) when the target pins nothing or the same version; a version the
/// target pins that they do not carry still keys on it, and the Job refuses it.
fn backend_version(pinned: Option<&str>, carried: Option<&str>) -> String {
    match (pinned, carried) {
        (Some(wanted), Some(have)) if have.split('@').next() == Some(wanted) => have.into(),
        (Some(wanted), _) => wanted.into(),
        (None, have) => have.unwrap_or_default().into(),
    }
}

fn keyed_with(inputs: &Inputs<'_>, model: &ModelArtifact) -> Vec<Keyed> {
    let t = inputs.target;
    group(
        t.spec.node_selector.as_ref(),
        &t.spec.class_label_keys,
        inputs.nodes,
    )
    .into_iter()
    .map(|class| Keyed {
        key: key_for(model, t, &class.facts, inputs.settings),
        runner: inputs
            .settings
            .workers
            .runner(t, &class.facts, &inputs.settings.compile_bounds),
        class,
    })
    .collect()
}

/// The compile keys whose store entries the plan needs: the controller looks these up first.
/// None while the spec is invalid.
pub fn wanted_keys(inputs: &Inputs<'_>) -> Vec<String> {
    let Ok(model) = validate::check(inputs.target, inputs.model, inputs.settings) else {
        return Vec::new();
    };
    keyed_with(inputs, model)
        .into_iter()
        .map(|k| k.key)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Runner;
    use crate::plan::classes::Class;

    fn keyed(id: &str, nodes: &[&str]) -> Keyed {
        Keyed {
            class: Class {
                id: id.into(),
                facts: Default::default(),
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
            },
            key: format!("key-{id}"),
            runner: Runner::default(),
        }
    }

    #[test]
    fn no_class_waits_for_agents_or_stalls_and_a_missing_key_stalls() {
        let note = "1 selected node(s) (n) have no class yet".to_string();
        assert!(matches!(
            halt(&[], &[], Some(&note)),
            Some(Course::WaitingForNodeFacts { message }) if message == note
        ));
        assert!(matches!(
            halt(&[], &[], None),
            Some(Course::Stalled {
                reason: reasons::NO_MATCHING_NODES,
                ..
            })
        ));
        let classes = [keyed("a", &["n1", "n2"]), keyed("b", &["n3"])];
        let Some(Course::Stalled {
            reason, message, ..
        }) = halt(&classes, &["example.com/x".into()], Some(&note))
        else {
            panic!("a class key no node has stalls, even with nodes awaiting facts");
        };
        assert_eq!(reason, reasons::CLASS_KEY_NOT_FOUND);
        assert!(
            message.contains("none of the 3 selected node(s)"),
            "{message}"
        );
        assert!(halt(&classes, &[], Some(&note)).is_none());
    }

    #[test]
    fn a_pinned_version_keys_on_the_library_the_workers_carry() {
        let carried = format!("1.31.1@sha256:{}", "f".repeat(64));
        assert_eq!(backend_version(None, Some(&carried)), carried);
        assert_eq!(backend_version(Some("1.31.1"), Some(&carried)), carried);
        assert_eq!(backend_version(Some("1.30.0"), Some(&carried)), "1.30.0");
        assert_eq!(backend_version(Some("0.23.9"), Some("0.23.9")), "0.23.9");
        assert_eq!(backend_version(None, None), "");
    }

    #[test]
    fn awaiting_names_five_nodes_at_most() {
        let nodes: Vec<String> = (0..7).map(|i| format!("n{i}")).collect();
        let m = awaiting_message(&nodes, &["kiln.dev/cpu-level"]);
        assert!(
            m.starts_with("7 selected node(s) (n0, n1, n2, n3, n4, …)"),
            "{m}"
        );
    }
}
