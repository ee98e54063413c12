//! Which CompiledTargets a Node or KilnNode change concerns. A change to what classes are made
//! of (labels, hardware facts) concerns every target; a change to one target's readiness label or
//! to a node's report rows concerns only the targets named. Keeps one agent's status write from
//! reconciling the whole fleet of targets. A compile Job concerns its owner, and once it has
//! finished, every target waiting for its compile slot.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kiln_crds::compiled_target::ClassPhase;
use kiln_crds::labels::{is_ready_label, ready_label};
use kiln_crds::{CompiledTarget, KilnNode};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

/// What a KilnNode's last event looked like.
struct Seen {
    /// Fingerprint of its hardware facts.
    hardware: u64,
    /// Per target it reports on, (namespace, name) → fingerprint of its rows for that target.
    rows: BTreeMap<(String, String), u64>,
}

/// What the last event of each object looked like.
#[derive(Default)]
pub struct Triggers {
    nodes: Mutex<HashMap<String, BTreeMap<String, String>>>,
    kiln_nodes: Mutex<HashMap<String, Seen>>,
}

fn every(targets: &Store<CompiledTarget>) -> Vec<ObjectRef<CompiledTarget>> {
    targets
        .state()
        .iter()
        .map(|t| ObjectRef::from_obj(t.as_ref()))
        .collect()
}

/// A cheap fingerprint of a value's JSON, to tell whether a watched object's part changed
/// between events. In memory only: `DefaultHasher` is not stable across builds.
pub fn fingerprint<T: serde::Serialize>(value: &T) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(value)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

impl Triggers {
    /// Targets a Node event concerns (a deleted Node arrives with no labels). A label whose new
    /// value `own` says this replica wrote itself is the echo of that write, and concerns no
    /// target: each of the first reconciles of a thousand targets would otherwise, through the
    /// class labels it sets, reconcile the thousand again.
    pub fn node(
        &self,
        node: &Node,
        targets: &Store<CompiledTarget>,
        own: impl Fn(&str, &str, Option<&str>) -> bool,
    ) -> Vec<ObjectRef<CompiledTarget>> {
        let labels = node.labels().clone();
        let before = self
            .nodes
            .lock()
            .map(|mut m| m.insert(node.name_any(), labels.clone()))
            .unwrap_or(None);
        let Some(before) = before else {
            return every(targets);
        };
        let changed: BTreeSet<&String> = labels
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(v))
            .map(|(k, _)| k)
            .chain(before.keys().filter(|k| !labels.contains_key(*k)))
            .filter(|k| !own(&node.name_any(), k, labels.get(*k).map(String::as_str)))
            .collect();
        if changed.iter().any(|k| !is_ready_label(k)) {
            return every(targets);
        }
        targets
            .state()
            .iter()
            .filter(|t| {
                changed.contains(&ready_label(
                    &t.namespace().unwrap_or_default(),
                    &t.name_any(),
                ))
            })
            .map(|t| ObjectRef::from_obj(t.as_ref()))
            .collect()
    }

    /// Targets a KilnNode event concerns (a deleted KilnNode arrives with no status).
    pub fn kiln_node(
        &self,
        node: &KilnNode,
        targets: &Store<CompiledTarget>,
    ) -> Vec<ObjectRef<CompiledTarget>> {
        let status = node.status.as_ref();
        let hardware = fingerprint(&status.and_then(|s| s.hardware.as_ref()));
        // Per target, a fingerprint of the node's rows for it: only targets whose rows changed.
        let mut named: BTreeMap<(String, String), Vec<&kiln_crds::kiln_node::NodeTargetStatus>> =
            BTreeMap::new();
        for r in status.map(|s| s.targets.as_slice()).unwrap_or_default() {
            named
                .entry((r.namespace.clone(), r.name.clone()))
                .or_default()
                .push(r);
        }
        let named: BTreeMap<(String, String), u64> = named
            .into_iter()
            .map(|(k, rows)| (k, fingerprint(&rows)))
            .collect();
        let before = self
            .kiln_nodes
            .lock()
            .map(|mut m| {
                let seen = Seen {
                    hardware,
                    rows: named.clone(),
                };
                m.insert(node.name_any(), seen)
            })
            .unwrap_or(None);
        match before {
            Some(Seen {
                hardware: h,
                rows: before,
            }) if h == hardware => {
                let changed: BTreeSet<&(String, String)> = named
                    .iter()
                    .filter(|(k, v)| before.get(*k) != Some(v))
                    .map(|(k, _)| k)
                    .chain(before.keys().filter(|k| !named.contains_key(*k)))
                    .collect();
                changed
                    .into_iter()
                    .map(|(ns, name)| ObjectRef::new(name).within(ns))
                    .collect()
            }
            _ => every(targets),
        }
    }
}

/// Targets a compile Job event concerns: its owner, and once the Job has finished (a compile
/// slot is free) every target with a class queued for one.
pub fn job(job: &Job, targets: &Store<CompiledTarget>) -> Vec<ObjectRef<CompiledTarget>> {
    let ns = job.namespace().unwrap_or_default();
    let mut refs: Vec<ObjectRef<CompiledTarget>> = job
        .owner_references()
        .iter()
        .filter(|o| o.controller == Some(true) && o.kind == "CompiledTarget")
        .map(|o| ObjectRef::new(&o.name).within(&ns))
        .collect();
    if crate::job::observe::outcome(job).is_some() {
        refs.extend(
            targets
                .state()
                .iter()
                .filter(|t| {
                    t.status
                        .as_ref()
                        .is_some_and(|s| s.classes.iter().any(|c| c.phase == ClassPhase::Queued))
                })
                .map(|t| ObjectRef::from_obj(t.as_ref())),
        );
    }
    refs
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};

    fn target(name: &str, phase: &str) -> CompiledTarget {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1",
            "kind": "CompiledTarget",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"modelRef": {"name": "m"}, "backend": {"kind": "tract"}, "profiles": [],
                     "warmup": {"fixtureVersion": "v1"}},
            "status": {"classes": [{"class": "c", "nodes": 1, "phase": phase}]},
        }))
        .expect("target")
    }

    fn job(owner: &str, finished: bool) -> Job {
        let conditions = if finished {
            serde_json::json!([{"type": "Complete", "status": "True"}])
        } else {
            serde_json::json!([])
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{owner}-c-1"), "namespace": "ml", "ownerReferences": [{
                "apiVersion": "kiln.dev/v1alpha1", "kind": "CompiledTarget", "name": owner,
                "uid": "u", "controller": true}]},
            "status": {"conditions": conditions},
        }))
        .expect("job")
    }

    #[test]
    fn a_finished_job_wakes_its_owner_and_every_target_queued_for_a_slot() {
        let (store, mut writer) = reflector::store::<CompiledTarget>();
        for t in [
            target("owner", "Compiling"),
            target("queued", "Queued"),
            target("compiled", "Compiled"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(t));
        }
        let names = |refs: Vec<ObjectRef<CompiledTarget>>| {
            let mut v: Vec<String> = refs.into_iter().map(|r| r.name).collect();
            v.sort();
            v
        };
        assert_eq!(names(super::job(&job("owner", false), &store)), ["owner"]);
        assert_eq!(
            names(super::job(&job("owner", true), &store)),
            ["owner", "queued"]
        );
    }

    fn node(labels: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n1", "labels": labels}}))
            .expect("node")
    }

    #[test]
    fn the_echo_of_a_label_this_replica_wrote_wakes_no_target() {
        let (store, mut writer) = reflector::store::<CompiledTarget>();
        for name in ["a", "b"] {
            writer.apply_watcher_event(&watcher::Event::Apply(target(name, "Queued")));
        }
        let triggers = Triggers::default();
        let nobody = |_: &str, _: &str, _: Option<&str>| false;
        let first = node(serde_json::json!({"gpu": "h100"}));
        assert_eq!(triggers.node(&first, &store, nobody).len(), 2);
        // The operator set the class label: its own write comes back and concerns nobody.
        let labelled = node(serde_json::json!({"gpu": "h100", "kiln.dev/class": "c1"}));
        let mine = |n: &str, k: &str, v: Option<&str>| {
            n == "n1" && k == "kiln.dev/class" && v == Some("c1")
        };
        assert!(triggers.node(&labelled, &store, mine).is_empty());
        // Somebody else changes it: every target looks again (and puts it right).
        let edited = node(serde_json::json!({"gpu": "h100", "kiln.dev/class": "x"}));
        assert_eq!(triggers.node(&edited, &store, mine).len(), 2);
        // A hardware label change with the echo in the same event still wakes every target.
        let both = node(serde_json::json!({"gpu": "h200", "kiln.dev/class": "c1"}));
        assert_eq!(triggers.node(&both, &store, mine).len(), 2);
    }
}
