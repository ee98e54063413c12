//! The plan, from YAML fixtures: which Jobs should exist, which node labels, what status and
//! which Events follow — for fresh targets, cache hits, running, failing, exhausted and invalid
//! ones. No client: these are the decisions the controller only carries out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::conditions::is_true;
use kiln_crds::kiln_node::NodePhase;
use kiln_crds::{CompiledTarget, FailureReason, KilnNode, ModelArtifact};
use kiln_operator::plan::NodeView;
use kiln_operator::plan::{
    Inputs, JobState, JobView, LabelChange, ModelLookup, NodeLabel, Plan, Settings, Stored, Worker,
    key_for, plan, wanted_keys,
};

#[derive(serde::Deserialize)]
struct NodeFixture {
    name: String,
    labels: BTreeMap<String, String>,
}

fn target() -> CompiledTarget {
    serde_saphyr::from_str(include_str!("fixtures/target.yaml")).expect("target.yaml")
}

fn model() -> ModelLookup {
    let m: ModelArtifact =
        serde_saphyr::from_str(include_str!("fixtures/model.yaml")).expect("model.yaml");
    ModelLookup::Found(Box::new(m))
}

fn nodes() -> Vec<NodeView> {
    let fixtures: Vec<NodeFixture> =
        serde_saphyr::from_str(include_str!("fixtures/nodes.yaml")).expect("nodes.yaml");
    fixtures
        .into_iter()
        .map(|n| NodeView {
            name: n.name,
            class_labels: n.labels.clone(),
            labels: n.labels,
            // As if each node's agent had reported (facts no richer than the labels).
            reported: true,
            targets: Vec::new(),
        })
        .collect()
}

fn kiln_nodes() -> Vec<KilnNode> {
    serde_saphyr::from_str(include_str!("fixtures/kilnnodes.yaml")).expect("kilnnodes.yaml")
}

fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + secs).expect("time"))
}

struct World {
    target: CompiledTarget,
    model: ModelLookup,
    nodes: Vec<NodeView>,
    /// What agents report; the harness hands each node its rows for the target, as the
    /// controller does.
    kiln_nodes: Vec<KilnNode>,
    jobs: Vec<JobView>,
    stored: BTreeMap<String, Stored>,
    /// Compile Jobs other targets run.
    elsewhere: usize,
    settings: Settings,
}

impl World {
    fn new() -> Self {
        Self {
            target: target(),
            model: model(),
            nodes: nodes(),
            kiln_nodes: Vec::new(),
            jobs: Vec::new(),
            stored: BTreeMap::new(),
            elsewhere: 0,
            settings: Settings::default(),
        }
    }

    fn plan(&mut self, now: i64) -> Plan {
        let (ns, name) = (
            self.target.metadata.namespace.clone().unwrap_or_default(),
            self.target.metadata.name.clone().unwrap_or_default(),
        );
        for n in &mut self.nodes {
            n.targets = self
                .kiln_nodes
                .iter()
                .filter(|k| k.metadata.name.as_deref() == Some(&n.name))
                .flat_map(|k| k.status.iter().flat_map(|s| s.targets.iter()))
                .filter(|r| r.namespace == ns && r.name == name)
                .cloned()
                .collect();
        }
        plan(&self.inputs(now))
    }

    /// Sets the phase (and reason) of `node`'s row for the target.
    fn report(
        &mut self,
        node: &str,
        revision: i64,
        phase: NodePhase,
        reason: Option<FailureReason>,
    ) {
        let row = self.row_mut(node);
        row.revision = revision;
        row.phase = phase;
        row.reason = reason;
        row.message = reason.map(|r| format!("{} on {node}", r.as_str()));
    }

    /// `node`'s row for the target.
    fn row_mut(&mut self, node: &str) -> &mut kiln_crds::kiln_node::NodeTargetStatus {
        self.kiln_nodes
            .iter_mut()
            .find(|k| k.metadata.name.as_deref() == Some(node))
            .and_then(|k| k.status.as_mut())
            .and_then(|s| s.targets.iter_mut().find(|r| r.namespace == "ml"))
            .expect("row")
    }

    /// Sets the revision `node`'s row says the target asks for (a fallback row names it).
    fn desire(&mut self, node: &str, revision: i64) {
        let row = self.row_mut(node);
        row.desired_revision = Some(revision);
    }

    /// Stores an artifact for every key the plan wants.
    fn store_all(&mut self) {
        for (i, k) in self.keys().into_iter().enumerate() {
            self.stored.insert(
                k,
                Stored {
                    digest: format!("d{i}"),
                    manifest_digest: format!("sha256:m{i}"),
                    placement: None,
                    engine: None,
                },
            );
        }
    }

    fn label(&self, node: &str) -> Option<&str> {
        self.nodes
            .iter()
            .find(|n| n.name == node)
            .and_then(|n| n.labels.get("ml.ready.kiln.dev/squeezenet-cpu"))
            .map(String::as_str)
    }

    fn inputs(&self, now: i64) -> Inputs<'_> {
        Inputs {
            target: &self.target,
            model: &self.model,
            nodes: &self.nodes,
            jobs: &self.jobs,
            stored: &self.stored,
            compiles_elsewhere: self.elsewhere,
            settings: &self.settings,
            now: at(now),
        }
    }

    fn keys(&self) -> Vec<String> {
        wanted_keys(&self.inputs(0))
    }

    /// What the controller does with a plan: create the Jobs (as Active), label nodes, store status.
    fn apply(&mut self, p: &Plan) {
        for j in &p.create {
            self.jobs.push(JobView {
                name: j.name.clone(),
                compile_key: j.compile_key.clone(),
                attempt: j.attempt,
                state: JobState::Active,
                finished_at: None,
                deleting: false,
            });
        }
        self.jobs.retain(|j| !p.delete.contains(&j.name));
        for LabelChange { node, key, value } in &p.node_labels {
            if let Some(n) = self.nodes.iter_mut().find(|n| &n.name == node) {
                match value {
                    Some(v) => n.labels.insert(key.clone(), v.clone()),
                    None => n.labels.remove(key),
                };
            }
        }
        self.target.status = Some(p.status.clone());
    }

    fn finish(&mut self, key: &str, state: JobState, when: i64) {
        for j in self
            .jobs
            .iter_mut()
            .filter(|j| j.compile_key == key && j.state == JobState::Active)
        {
            j.state = state.clone();
            j.finished_at = Some(at(when));
        }
    }
}

fn change(node: &str, key: &str, value: Option<&str>) -> LabelChange {
    LabelChange {
        node: node.to_string(),
        key: key.to_string(),
        value: value.map(str::to_string),
    }
}

fn condition<'a>(p: &'a Plan, type_: &str) -> &'a kiln_crds::Condition {
    p.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

#[test]
fn one_job_per_class_pinned_by_class_label_and_mig_does_not_split() {
    let mut w = World::new();
    let p = w.plan(0);
    assert_eq!(
        p.create.len(),
        3,
        "cpu, H100 (plain + MIG), L4: {:?}",
        p.create
    );
    let classes: Vec<&str> = p.create.iter().map(|j| j.class.as_str()).collect();
    assert!(
        classes.iter().any(|c| c.starts_with("amd64-")),
        "{classes:?}"
    );
    assert!(
        classes
            .iter()
            .any(|c| c.starts_with("nvidia-h100-80gb-hbm3-sm90-drv550-amd64-")),
        "{classes:?}"
    );
    assert!(
        classes
            .iter()
            .any(|c| c.starts_with("nvidia-l4-sm89-drv550-amd64-")),
        "{classes:?}"
    );
    for j in &p.create {
        assert_eq!(
            j.node_selector,
            NodeLabel {
                key: "kiln.dev/class".to_string(),
                value: j.class.clone()
            }
        );
        assert_eq!(j.attempt, 1);
        assert!(
            j.name.starts_with("squeezenet-cpu-") && j.name.ends_with("-1") && j.name.len() <= 63
        );
    }
    let h100 = p
        .status
        .classes
        .iter()
        .find(|c| c.class.starts_with("nvidia-h100"))
        .expect("h100 row");
    assert_eq!(h100.nodes, 2);
    assert_eq!(p.node_labels.len(), 4, "every node gets its class label");
    assert_eq!(p.status.class_count, Some(3));
    assert!(is_true(&p.status.conditions, "Reconciling"));
    assert!(!is_true(&p.status.conditions, "Ready"));
    assert_eq!(p.status.observed_generation, Some(1));
    assert_eq!(
        p.events
            .iter()
            .filter(|e| e.reason == "CompileJobCreated")
            .count(),
        3
    );
}

#[test]
fn replanning_an_unchanged_world_creates_nothing_and_writes_nothing() {
    let mut w = World::new();
    let first = w.plan(0);
    w.apply(&first);
    let second = w.plan(30);
    assert!(second.create.is_empty() && second.delete.is_empty() && second.node_labels.is_empty());
    assert_eq!(
        Some(&second.status),
        w.target.status.as_ref(),
        "identical status: no write"
    );
    assert!(second.events.is_empty(), "{:?}", second.events);
}

#[test]
fn a_stored_key_is_reused_without_a_job_and_all_stored_makes_a_revision() {
    let mut w = World::new();
    let keys = w.keys();
    assert_eq!(keys.len(), 3);
    w.stored.insert(
        keys[0].clone(),
        Stored {
            digest: "d0".into(),
            manifest_digest: "sha256:m0".into(),
            placement: Some(kiln_crds::placement::Placement::single("tract", 66)),
            engine: Some(("tract".into(), Some("tract kept: p50 1.000 ms".into()))),
        },
    );
    let p = w.plan(0);
    assert_eq!(p.create.len(), 2);
    assert!(p.create.iter().all(|j| j.compile_key != keys[0]));
    let row = p
        .status
        .classes
        .iter()
        .find(|c| c.compile_key.as_deref() == Some(&keys[0]))
        .expect("row");
    assert_eq!(
        (
            row.phase.as_str(),
            row.artifact_digest.as_deref(),
            row.job.as_deref()
        ),
        ("Compiled", Some("d0"), None)
    );
    assert_eq!(row.manifest_digest.as_deref(), Some("sha256:m0"));
    // The engine and why it was kept reach the class row.
    assert_eq!(
        (row.engine.as_deref(), row.engine_reason.as_deref()),
        (Some("tract"), Some("tract kept: p50 1.000 ms"))
    );
    // The build manifest's partition evidence reaches the class row.
    let placement = row.placement.as_ref().expect("placement from the manifest");
    assert_eq!((placement.total(), placement.partitions), (66, 1));
    assert!(
        p.status.revisions.is_empty(),
        "a revision needs every class"
    );
    w.apply(&p);

    for (i, k) in keys.iter().enumerate() {
        w.stored.insert(
            k.clone(),
            Stored {
                digest: format!("d{i}"),
                manifest_digest: format!("sha256:m{i}"),
                placement: None,
                engine: None,
            },
        );
    }
    let p = w.plan(60);
    assert!(p.create.is_empty());
    assert_eq!(p.status.revision, Some(1));
    assert_eq!(p.status.revisions.len(), 1);
    assert_eq!(p.status.revisions[0].artifacts.len(), 3);
    assert!(
        p.status.revisions[0]
            .artifacts
            .iter()
            .all(|a| a.manifest_digest == format!("sha256:m{}", &a.digest[1..])),
        "each revision artifact records the manifest digest agents pull by: {:?}",
        p.status.revisions[0].artifacts
    );
    assert!(is_true(&p.status.conditions, "Compiled"));
    let ready = condition(&p, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "WaitingForNodes"),
        "compiled is not ready: no node has reported"
    );
    assert!(is_true(&p.status.conditions, "Reconciling"));
    assert!(p.status.classes.iter().all(|c| c.phase == "Compiled"));
    assert_eq!(
        p.events
            .iter()
            .filter(|e| e.reason == "ClassCompiled")
            .count(),
        2,
        "{:?}",
        p.events
    );
    w.apply(&p);
    let again = w.plan(120);
    assert_eq!(
        Some(&again.status),
        w.target.status.as_ref(),
        "no second revision for the same artifacts"
    );
}

#[test]
fn failures_retry_with_backoff_then_stall_with_the_classified_reason() {
    let mut w = World::new();
    w.nodes.retain(|n| n.name == "cpu-0");
    let p = w.plan(0);
    w.apply(&p);
    let key = w.keys()[0].clone();
    let failed = JobState::Failed {
        reason: FailureReason::HashMismatch,
        message: "model source: sha256 abc but spec says ed2b".into(),
    };
    w.finish(&key, failed.clone(), 100);
    let p = w.plan(101);
    assert!(p.create.is_empty(), "backoff first");
    assert_eq!(p.status.classes[0].phase, "Retrying");
    assert_eq!(
        p.status.classes[0].reason,
        Some(FailureReason::HashMismatch)
    );
    assert!(p.requeue.is_some_and(|r| r <= Duration::from_secs(10)));
    assert!(
        condition(&p, "Reconciling")
            .message
            .contains("HashMismatch")
    );
    assert!(
        p.events
            .iter()
            .any(|e| e.warning && e.reason == "ClassRetrying")
    );
    w.apply(&p);

    let p = w.plan(111);
    assert_eq!(p.create.len(), 1);
    assert_eq!(p.create[0].attempt, 2);
    w.apply(&p);
    w.finish(&key, failed.clone(), 200);
    let p = w.plan(221); // 20 s backoff after the second failure
    assert_eq!(p.create.len(), 1);
    assert_eq!(p.create[0].attempt, 3);
    w.apply(&p);
    w.finish(&key, failed, 300);

    let p = w.plan(10_000);
    assert!(p.create.is_empty(), "attempts exhausted: {:?}", p.create);
    assert_eq!(p.status.classes[0].phase, "Failed");
    assert_eq!(p.status.classes[0].attempts, 3);
    let stalled = condition(&p, "Stalled");
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "HashMismatch")
    );
    assert!(
        stalled.message.contains("sha256 abc"),
        "{}",
        stalled.message
    );
    assert!(p.events.iter().any(|e| e.warning && e.reason == "Stalled"));
    w.apply(&p);
    let again = w.plan(20_000);
    assert!(again.create.is_empty() && again.events.is_empty());
    assert_eq!(
        Some(&again.status),
        w.target.status.as_ref(),
        "stalled is quiet: no hot loop"
    );
}

#[test]
fn succeeded_job_without_a_stored_artifact_counts_as_a_store_failure() {
    let mut w = World::new();
    w.nodes.retain(|n| n.name == "cpu-0");
    w.settings.default_max_attempts = 1;
    let p = w.plan(0);
    w.apply(&p);
    let key = w.keys()[0].clone();
    w.finish(&key, JobState::Succeeded, 10);
    let p = w.plan(11);
    assert_eq!(
        p.status.classes[0].reason,
        Some(FailureReason::StoreUnavailable)
    );
    assert_eq!(condition(&p, "Stalled").status, "True");
}

#[test]
fn jobs_for_keys_no_class_wants_are_deleted() {
    let mut w = World::new();
    let p = w.plan(0);
    w.apply(&p);
    w.target.spec.profiles[0].dims.insert("batch".into(), 2);
    w.target.metadata.generation = Some(2);
    let p = w.plan(10);
    assert_eq!(p.delete.len(), 3, "old keys' Jobs go");
    assert_eq!(p.create.len(), 3, "new keys' Jobs come");
    assert_eq!(p.status.observed_generation, Some(2));
}

#[test]
fn bad_input_stalls_with_a_message_that_says_what_to_fix() {
    type Edit = Box<dyn Fn(&mut World)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "ModelNotFound",
            Box::new(|w| w.model = ModelLookup::Missing),
            "create it or fix spec.modelRef.name",
        ),
        (
            "ModelInOtherNamespace",
            Box::new(|w| w.target.spec.model_ref.namespace = Some("other".into())),
            "its own namespace",
        ),
        (
            "NoMatchingNodes",
            Box::new(|w| {
                w.target.spec.node_selector = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            "pool".to_string(),
                            "nowhere".to_string(),
                        )])),
                        ..Default::default()
                    },
                )
            }),
            "fix the selector",
        ),
        (
            "ClassKeyNotFound",
            Box::new(|w| w.target.spec.class_label_keys = vec!["example.com/accelerator".into()]),
            "example.com/accelerator",
        ),
        (
            "FixtureNotFound",
            Box::new(|w| w.target.spec.warmup.fixture_version = "v9".into()),
            "\"v9\"",
        ),
        (
            "InvalidProfile",
            Box::new(|w| {
                w.target.spec.profiles[0].dims.insert("batch".into(), 64);
            }),
            "outside [1, 8]",
        ),
        (
            "BackendUnavailable",
            Box::new(|w| {
                w.target.spec.backend.kind = kiln_crds::compiled_target::BackendKind::Tensorrt
            }),
            "tensorrt",
        ),
    ];
    for (reason, edit, hint) in cases {
        let mut w = World::new();
        edit(&mut w);
        let p = w.plan(0);
        assert!(p.create.is_empty(), "{reason}: no Jobs");
        let stalled = condition(&p, "Stalled");
        assert_eq!(
            (stalled.status.as_str(), stalled.reason.as_str()),
            ("True", reason)
        );
        assert!(
            stalled.message.contains(hint),
            "{reason}: {}",
            stalled.message
        );
        assert_eq!(condition(&p, "Ready").status, "False");
        w.apply(&p);
        let again = w.plan(60);
        assert_eq!(
            Some(&again.status),
            w.target.status.as_ref(),
            "{reason}: quiet afterwards"
        );
        assert!(
            again.requeue.is_none(),
            "{reason}: waits for a change, no polling"
        );
    }
}

#[test]
fn targets_with_their_own_class_keys_use_their_own_node_label() {
    let mut w = World::new();
    w.target.spec.class_label_keys = vec!["nvidia.com/gpu.product".into()];
    let p = w.plan(0);
    assert_eq!(p.create.len(), 3, "no product, H100, L4");
    for j in &p.create {
        assert!(
            j.node_selector.key.starts_with("kiln.dev/class-"),
            "{:?}",
            j.node_selector
        );
    }
}

#[test]
fn a_job_missing_from_a_lagging_cache_is_asked_for_again_not_counted_as_an_attempt() {
    let mut w = World::new();
    let first = w.plan(0);
    let asked: Vec<String> = first.create.iter().map(|j| j.name.clone()).collect();
    // Status is written, but the watch has not delivered the new Jobs yet.
    w.target.status = Some(first.status.clone());
    let again = w.plan(1);
    let names: Vec<String> = again.create.iter().map(|j| j.name.clone()).collect();
    assert_eq!(names, asked, "the same Jobs (409 on create), no attempt 2");
    assert!(again.create.iter().all(|j| j.attempt == 1));
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(Some(&again.status), w.target.status.as_ref());
}

fn row<'a>(p: &'a Plan, prefix: &str) -> &'a kiln_crds::compiled_target::ClassStatus {
    p.status
        .classes
        .iter()
        .find(|c| c.class.starts_with(prefix))
        .unwrap_or_else(|| panic!("no class {prefix}"))
}

/// A world whose revision 1 is compiled for every class, with the agents' reports of
/// kilnnodes.yaml.
fn compiled_world() -> World {
    let mut w = World::new();
    w.store_all();
    let p = w.plan(0);
    assert_eq!(p.status.revision, Some(1));
    w.apply(&p);
    w.kiln_nodes = kiln_nodes();
    w
}

#[test]
fn node_reports_aggregate_per_class_and_label_the_nodes_that_serve() {
    let mut w = compiled_world();
    let p = w.plan(10);
    let cpu = row(&p, "amd64-");
    assert_eq!(
        (cpu.phase.as_str(), cpu.ready_nodes, cpu.failed_nodes),
        ("Ready", 1, 0)
    );
    let h100 = row(&p, "nvidia-h100");
    assert_eq!(
        (h100.phase.as_str(), h100.ready_nodes, h100.failed_nodes),
        ("Failing", 1, 1)
    );
    assert_eq!(h100.failing_nodes, ["h100-1"]);
    assert_eq!(h100.reason, Some(FailureReason::HashMismatch));
    assert!(
        h100.message
            .as_deref()
            .is_some_and(|m| m.contains("h100-1") && m.contains("sha256 9f3c")),
        "{:?}",
        h100.message
    );
    assert_eq!(row(&p, "nvidia-l4").phase, "Warming");
    // The other namespace's target of the same name is not this one.
    assert_eq!(cpu.failing_nodes, Vec::<String>::new());
    let ready = condition(&p, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Warming")
    );
    assert!(
        ready.message.contains("ready on 2 of 4 node(s)"),
        "{}",
        ready.message
    );
    assert!(is_true(&p.status.conditions, "Reconciling"));
    let key = "ml.ready.kiln.dev/squeezenet-cpu";
    let mut labels = p.node_labels.clone();
    labels.sort();
    assert_eq!(
        labels,
        [
            change("cpu-0", key, Some("1")),
            change("h100-0", key, Some("1"))
        ]
    );
    assert!(
        !p.status.revisions[0].known_good,
        "2 of 4 ready is below 100%"
    );
    assert!(
        p.events
            .iter()
            .any(|e| e.warning && e.reason == "ClassFailing"),
        "{:?}",
        p.events
    );
    w.apply(&p);
    let again = w.plan(20);
    assert!(
        again.node_labels.is_empty(),
        "labels written once: {:?}",
        again.node_labels
    );
    assert_eq!(Some(&again.status), w.target.status.as_ref(), "no write");
    assert!(again.events.is_empty(), "{:?}", again.events);
}

#[test]
fn every_node_settled_below_the_threshold_is_stalled_with_the_nodes_reason() {
    let mut w = compiled_world();
    w.report("l4-0", 1, NodePhase::Ready, None);
    let p = w.plan(10);
    let stalled = condition(&p, "Stalled");
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "HashMismatch")
    );
    assert!(stalled.message.contains("h100-1"), "{}", stalled.message);
    assert_eq!(condition(&p, "Ready").status, "False");
    assert_eq!(condition(&p, "Reconciling").status, "False");
    assert!(!p.status.revisions[0].known_good);
    w.apply(&p);

    // The node recovers: Ready, promoted, Stalled cleared.
    w.report("h100-1", 1, NodePhase::Ready, None);
    let p = w.plan(20);
    let ready = condition(&p, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Ready")
    );
    assert!(
        ready.message.contains("ready on 4 of 4"),
        "{}",
        ready.message
    );
    assert_eq!(condition(&p, "Stalled").status, "False");
    assert!(p.status.revisions[0].known_good);
    assert!(
        p.status
            .classes
            .iter()
            .all(|c| c.phase == "Ready" && c.failed_nodes == 0)
    );
    assert!(p.events.iter().any(|e| e.reason == "RevisionPromoted"));
    assert!(p.events.iter().any(|e| e.reason == "Ready" && !e.warning));
    assert_eq!(
        p.node_labels,
        [change(
            "h100-1",
            "ml.ready.kiln.dev/squeezenet-cpu",
            Some("1")
        )],
        "l4-0 was labelled when it became ready"
    );
}

#[test]
fn promotion_and_ready_follow_promote_at_ready_percent_per_class() {
    let mut w = compiled_world();
    w.target.spec.rollout.promote_at_ready_percent = 50;
    let p = w.plan(10);
    // cpu 1/1, h100 1/2 meet 50%; the warming L4 (0/1) does not.
    assert_eq!(condition(&p, "Ready").status, "False");
    assert!(!p.status.revisions[0].known_good);
    assert_eq!(row(&p, "nvidia-h100").phase, "Ready", "1 of 2 is 50%");
    w.apply(&p);
    w.report("l4-0", 1, NodePhase::Ready, None);
    let p = w.plan(20);
    assert!(
        is_true(&p.status.conditions, "Ready"),
        "{:?}",
        condition(&p, "Ready")
    );
    assert!(p.status.revisions[0].known_good);
    assert_eq!(row(&p, "nvidia-h100").failed_nodes, 1, "still counted");
    w.apply(&p);
    // A later failure does not take known-good back.
    w.report(
        "l4-0",
        1,
        NodePhase::Failed,
        Some(FailureReason::LoadFailed),
    );
    let p = w.plan(30);
    assert!(p.status.revisions[0].known_good);
    assert_eq!(condition(&p, "Ready").status, "False");
    assert_eq!(
        p.node_labels,
        [change("l4-0", "ml.ready.kiln.dev/squeezenet-cpu", None)],
        "fail-closed: the label goes"
    );
}

#[test]
fn a_node_on_a_fallback_keeps_its_label_on_the_revision_it_serves_and_degrades_the_target() {
    let mut w = second_revision_world(false);
    let p = w.plan(20);
    assert_eq!(p.status.revision, Some(2));
    let ready = condition(&p, "Ready");
    assert_eq!(ready.status, "False", "nodes are still on revision 1");
    assert!(
        p.node_labels.is_empty(),
        "still serving 1: {:?}",
        p.node_labels
    );
    w.apply(&p);
    for n in ["cpu-0", "h100-0", "l4-0"] {
        w.report(n, 2, NodePhase::Ready, None);
    }
    // PreviousKnownGood: revision 2 failed parity on h100-1, which serves 1.
    w.report(
        "h100-1",
        1,
        NodePhase::Degraded,
        Some(FailureReason::ParityExceeded),
    );
    let p = w.plan(30);
    let degraded = condition(&p, "Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "Fallback")
    );
    assert!(p.events.iter().any(|e| e.warning && e.reason == "Degraded"));
    let h100 = row(&p, "nvidia-h100");
    assert_eq!((h100.phase.as_str(), h100.failed_nodes), ("Degraded", 1));
    assert_eq!(h100.reason, Some(FailureReason::ParityExceeded));
    let mut labels = p.node_labels.clone();
    labels.sort();
    let key = "ml.ready.kiln.dev/squeezenet-cpu";
    assert_eq!(
        labels,
        [
            change("cpu-0", key, Some("2")),
            change("h100-0", key, Some("2")),
            change("l4-0", key, Some("2")),
        ],
        "h100-1 keeps label value 1"
    );
    assert!(
        !p.status
            .revisions
            .iter()
            .any(|r| r.number == 2 && r.known_good)
    );
}

/// A world whose revision 1 is known-good on every node and whose spec has just compiled to
/// revision 2 (generation 2), with `rollout.autoRollback` as given.
fn second_revision_world(auto_rollback: bool) -> World {
    let mut w = compiled_world();
    w.target.spec.rollout.auto_rollback = auto_rollback;
    for n in ["cpu-0", "h100-0", "h100-1", "l4-0"] {
        w.report(n, 1, NodePhase::Ready, None);
    }
    let p = w.plan(10);
    assert!(p.status.revisions[0].known_good);
    w.apply(&p);
    w.target.spec.profiles[0].dims.insert("batch".into(), 2);
    w.target.metadata.generation = Some(2);
    w.store_all();
    w
}

#[test]
fn auto_rollback_serves_the_newest_known_good_when_the_new_revision_fails_on_a_node() {
    let mut w = second_revision_world(true);
    // Nodes still report revision 1 (they have not tried 2): nothing failed on 2 yet.
    let p = w.plan(20);
    assert_eq!(p.status.revision, Some(2));
    assert_eq!(p.status.auto_rollback, None);
    w.apply(&p);
    for n in ["cpu-0", "h100-0", "l4-0"] {
        w.report(n, 2, NodePhase::Ready, None);
    }
    w.report(
        "h100-1",
        2,
        NodePhase::Failed,
        Some(FailureReason::ParityExceeded),
    );
    let p = w.plan(30);
    let back = p.status.auto_rollback.clone().expect("rolled back");
    assert_eq!((back.from_revision, back.to_revision), (2, 1));
    assert!(back.class.starts_with("nvidia-h100"), "{}", back.class);
    assert_eq!(back.reason, Some(FailureReason::ParityExceeded));
    assert!(back.message.contains("h100-1"), "{}", back.message);
    assert_eq!(p.status.revision, Some(1), "nodes are told to serve 1");
    for type_ in ["Degraded", "Stalled"] {
        let c = condition(&p, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "AutoRolledBack"),
            "{type_}"
        );
    }
    let ready = condition(&p, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "AutoRolledBack")
    );
    assert!(
        ready
            .message
            .contains("revision 2 failed on class nvidia-h100")
            && ready
                .message
                .contains("rolled back to known-good revision 1"),
        "{}",
        ready.message
    );
    let events: Vec<_> = p
        .events
        .iter()
        .filter(|e| e.reason == "AutoRolledBack")
        .collect();
    assert_eq!(events.len(), 1, "{:?}", p.events);
    assert!(events[0].warning && events[0].note.contains("known-good revision 1"));
    w.apply(&p);

    // The nodes move back to 1 and stop reporting anything about 2: the rollback holds, and
    // is news only once.
    for n in ["cpu-0", "h100-0", "h100-1", "l4-0"] {
        w.report(n, 1, NodePhase::Ready, None);
    }
    let p = w.plan(40);
    assert_eq!(p.status.auto_rollback, Some(back.clone()));
    assert_eq!(p.status.revision, Some(1));
    assert!(!p.events.iter().any(|e| e.reason == "AutoRolledBack"));
    w.apply(&p);

    // A pin wins and ends the record; a newer revision does too.
    w.target.spec.rollout.pinned_revision = Some(2);
    let p = w.plan(50);
    assert_eq!(
        (p.status.revision, &p.status.auto_rollback),
        (Some(2), &None)
    );
    w.target.spec.rollout.pinned_revision = None;
    w.apply(&p);
    let p = w.plan(55);
    assert_eq!(
        (p.status.revision, &p.status.auto_rollback),
        (Some(2), &None),
        "unpinned: the newest again, until a node fails it again"
    );
    w.target.status.as_mut().expect("status").auto_rollback = Some(back.clone());
    w.target.status.as_mut().expect("status").revision = Some(1);
    w.target.spec.profiles[0].dims.insert("batch".into(), 4);
    w.target.metadata.generation = Some(3);
    w.store_all();
    let p = w.plan(60);
    assert_eq!(p.status.revisions.last().map(|r| r.number), Some(3));
    assert_eq!(
        (p.status.revision, &p.status.auto_rollback),
        (Some(3), &None)
    );
}

#[test]
fn auto_rollback_needs_the_option_an_older_known_good_revision_and_a_failure_on_the_newest() {
    // Off: the failed revision stays current (the fallback policy decides what nodes serve).
    let mut w = second_revision_world(true);
    w.target.spec.rollout.auto_rollback = false;
    let p = w.plan(20);
    w.apply(&p);
    w.report(
        "h100-1",
        2,
        NodePhase::Failed,
        Some(FailureReason::LoadFailed),
    );
    let p = w.plan(30);
    assert_eq!(
        (p.status.revision, &p.status.auto_rollback),
        (Some(2), &None)
    );

    // A failure about an older revision is not one of the newest.
    let mut w = second_revision_world(true);
    let p = w.plan(20);
    w.apply(&p);
    w.report(
        "h100-1",
        1,
        NodePhase::Failed,
        Some(FailureReason::LoadFailed),
    );
    let p = w.plan(30);
    assert_eq!(p.status.auto_rollback, None);

    // A node serving revision 1 as a fallback for 2 is a failure of 2.
    let mut w = second_revision_world(true);
    let p = w.plan(20);
    w.apply(&p);
    w.report(
        "h100-1",
        1,
        NodePhase::Degraded,
        Some(FailureReason::ParityExceeded),
    );
    w.desire("h100-1", 2);
    let p = w.plan(30);
    assert_eq!(
        p.status
            .auto_rollback
            .map(|b| (b.from_revision, b.to_revision)),
        Some((2, 1))
    );

    // No known-good revision to go back to: nothing to roll back to.
    let mut w = World::new();
    w.target.spec.rollout.auto_rollback = true;
    w.store_all();
    let p = w.plan(0);
    w.apply(&p);
    w.kiln_nodes = kiln_nodes();
    let p = w.plan(10);
    assert_eq!(p.status.revision, Some(1));
    assert_eq!(
        p.status.auto_rollback, None,
        "h100-1 failed 1, the only revision"
    );
}

#[test]
fn nodes_the_target_no_longer_selects_lose_its_label() {
    let mut w = compiled_world();
    let p = w.plan(10);
    w.apply(&p);
    assert_eq!(w.label("h100-0"), Some("1"));
    w.target.spec.node_selector = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                "cpu-0".to_string(),
            )])),
            ..Default::default()
        },
    );
    let p = w.plan(20);
    w.apply(&p);
    assert_eq!((w.label("cpu-0"), w.label("h100-0")), (Some("1"), None));
    // A target whose spec goes invalid still removes labels of nodes that stop serving.
    w.model = ModelLookup::Missing;
    w.report(
        "cpu-0",
        1,
        NodePhase::Failed,
        Some(FailureReason::LoadFailed),
    );
    let p = w.plan(30);
    w.apply(&p);
    assert_eq!(w.label("cpu-0"), None);
}

#[test]
fn readiness_labels_of_deleted_targets_are_stale() {
    let mut w = World::new();
    let key_of = kiln_crds::labels::ready_label;
    w.nodes[0].labels.insert(key_of("ml", "gone"), "3".into());
    w.nodes[0]
        .labels
        .insert(key_of("ml", "squeezenet-cpu"), "1".into());
    w.nodes[1]
        .labels
        .insert(key_of("ml", &"x".repeat(80)), "1".into());
    let live = std::collections::BTreeSet::from([key_of("ml", "squeezenet-cpu")]);
    let mut stale = kiln_operator::plan::stale_labels(&w.nodes, &live);
    stale.sort();
    assert_eq!(
        stale,
        [
            change("cpu-0", "ml.ready.kiln.dev/gone", None),
            change("h100-0", &key_of("ml", &"x".repeat(80)), None),
        ]
    );
}

#[test]
fn the_retry_annotation_clears_stalled_and_grants_max_attempts_more() {
    let mut w = World::new();
    w.nodes.retain(|n| n.name == "cpu-0");
    w.target.spec.compile.max_attempts = Some(1);
    let p = w.plan(0);
    w.apply(&p);
    let key = w.keys()[0].clone();
    let failed = JobState::Failed {
        reason: FailureReason::SourceUnavailable,
        message: "model source: connection refused".into(),
    };
    w.finish(&key, failed.clone(), 10);
    let p = w.plan(11);
    assert_eq!(condition(&p, "Stalled").status, "True");
    assert!(condition(&p, "Stalled").message.contains("kiln.dev/retry"));
    w.apply(&p);

    w.target.metadata.annotations = Some(BTreeMap::from([(
        "kiln.dev/retry".to_string(),
        "2026-11-21T13:40".to_string(),
    )]));
    let p = w.plan(12);
    assert_eq!(p.create.len(), 1, "retried at once, no backoff");
    assert_eq!(p.create[0].attempt, 2, "a new Job name");
    assert_eq!(condition(&p, "Stalled").status, "False");
    assert!(is_true(&p.status.conditions, "Reconciling"));
    assert_eq!(p.status.observed_retry.as_deref(), Some("2026-11-21T13:40"));
    assert_eq!(p.status.classes[0].retry_base, 1);
    assert!(p.events.iter().any(|e| e.reason == "RetryRequested"));
    w.apply(&p);
    w.finish(&key, failed, 20);
    let p = w.plan(21);
    assert_eq!(
        condition(&p, "Stalled").status,
        "True",
        "the same annotation value does not retry twice"
    );
    assert!(p.create.is_empty());
    w.apply(&p);
    let again = w.plan(100);
    assert_eq!(Some(&again.status), w.target.status.as_ref(), "quiet");
}

#[test]
fn compiles_beyond_the_concurrency_limit_wait_queued() {
    let mut w = World::new();
    w.settings.max_concurrent_compiles = 4;
    w.elsewhere = 2;
    let p = w.plan(0);
    assert_eq!(p.create.len(), 2, "2 running elsewhere + 2 here = 4");
    let queued: Vec<_> = p
        .status
        .classes
        .iter()
        .filter(|c| c.phase == "Queued")
        .collect();
    assert_eq!(queued.len(), 1);
    assert!(
        queued[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("all 4 concurrent compiles")),
        "{:?}",
        queued[0].message
    );
    assert!(condition(&p, "Reconciling").message.contains("queued"));
    assert!(p.requeue.is_some(), "looks for a slot again");
    w.apply(&p);
    // Unchanged world: still queued, nothing new.
    let p = w.plan(5);
    assert!(p.create.is_empty());
    w.apply(&p);
    // Other targets' compiles come and go while the slots stay full: nothing to write.
    let before = w.target.status.clone();
    w.elsewhere = 3;
    let p = w.plan(7);
    assert!(p.create.is_empty());
    assert_eq!(
        Some(&p.status),
        before.as_ref(),
        "a queued row follows its own state only"
    );
    // A slot frees up elsewhere: the queued class gets its Job.
    w.elsewhere = 1;
    let p = w.plan(10);
    assert_eq!(p.create.len(), 1);
    assert!(p.status.classes.iter().all(|c| c.phase == "Compiling"));
}

#[test]
fn an_exec_compiler_image_compiles_per_class_under_its_own_keys() {
    let mut built_in = World::new();
    let tract_keys: Vec<String> = built_in
        .plan(0)
        .create
        .into_iter()
        .map(|j| j.compile_key)
        .collect();
    let mut w = World::new();
    w.target.spec.backend.kind = kiln_crds::compiled_target::BackendKind::Exec;
    w.target.spec.backend.image = Some(format!("r.example/onnxsim@sha256:{}", "e".repeat(64)));
    w.target.spec.backend.command = vec!["onnxsim".into()];
    let p = w.plan(0);
    assert_eq!(p.create.len(), 3, "one Job per class, as for tract");
    assert!(!is_true(&p.status.conditions, "Stalled"));
    for j in &p.create {
        assert!(
            !tract_keys.contains(&j.compile_key),
            "the compiler is part of the key"
        );
    }
    // Another command is another key; the same command is the same key.
    let again: Vec<String> = w
        .plan(0)
        .create
        .into_iter()
        .map(|j| j.compile_key)
        .collect();
    w.target.spec.backend.command = vec!["onnxsim".into(), "--fold".into()];
    let other: Vec<String> = w
        .plan(0)
        .create
        .into_iter()
        .map(|j| j.compile_key)
        .collect();
    let first: Vec<String> = p.create.iter().map(|j| j.compile_key.clone()).collect();
    assert_eq!(first, again);
    assert!(first.iter().all(|k| !other.contains(k)));
    // exec builds with tract: without tract in the operator's worker versions it is unavailable.
    w.settings.workers.agent.backend_versions.clear();
    let stalled = w.plan(0);
    assert_eq!(condition(&stalled, "Stalled").reason, "BackendUnavailable");
}

#[test]
fn nodes_wait_for_their_agents_report_before_they_get_a_class_and_a_compile() {
    let mut w = World::new();
    for n in &mut w.nodes {
        n.reported = false;
    }
    let p = w.plan(0);
    assert!(p.create.is_empty(), "no class, no Job: {:?}", p.create);
    assert!(p.node_labels.is_empty(), "{:?}", p.node_labels);
    let ready = condition(&p, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "WaitingForNodeFacts")
    );
    for part in ["4 selected node(s)", "cpu-0", "l4-0", "kiln.dev/cpu-level"] {
        assert!(ready.message.contains(part), "{part}: {}", ready.message);
    }
    assert!(is_true(&p.status.conditions, "Reconciling"));
    assert!(!is_true(&p.status.conditions, "Stalled"), "agents come");
    assert_eq!(p.status.class_count, Some(0));
    w.apply(&p);
    let again = w.plan(30);
    assert_eq!(Some(&again.status), w.target.status.as_ref(), "no write");
    assert!(again.events.is_empty(), "{:?}", again.events);

    // The GPU nodes' agents report (facts no richer than their labels, which lack the CPU
    // level): they classify and compile; cpu-0 still waits and Ready says so.
    for n in w.nodes.iter_mut().filter(|n| n.name != "cpu-0") {
        n.reported = true;
    }
    let p = w.plan(40);
    assert_eq!(p.create.len(), 2, "{:?}", p.create);
    assert!(p.node_labels.iter().all(|c| c.node != "cpu-0"));
    let ready = condition(&p, "Ready");
    assert!(
        ready
            .message
            .contains("1 selected node(s) (cpu-0) have no class yet"),
        "{}",
        ready.message
    );
    w.apply(&p);

    // cpu-0's report: its CPU level joins its class, one more Job, and no other changes.
    let cpu = w
        .nodes
        .iter_mut()
        .find(|n| n.name == "cpu-0")
        .expect("cpu-0");
    cpu.reported = true;
    cpu.class_labels
        .insert("kiln.dev/cpu-level".into(), "x86-64-v4".into());
    let p = w.plan(50);
    assert_eq!(p.create.len(), 1, "{:?}", p.create);
    assert!(
        p.create[0].class.starts_with("amd64-x86-64-v4-"),
        "{:?}",
        p.create
    );
    assert!(p.delete.is_empty(), "{:?}", p.delete);
    assert!(!condition(&p, "Ready").message.contains("no class yet"));
    w.apply(&p);
    assert!(w.nodes[0].labels["kiln.dev/class"].starts_with("amd64-x86-64-v4-"));

    // Its KilnNode goes (facts unknown again): the class label goes with it, and its Job.
    w.nodes[0].reported = false;
    let p = w.plan(60);
    assert_eq!(p.node_labels, [change("cpu-0", "kiln.dev/class", None)]);
    assert_eq!(p.delete.len(), 1, "{:?}", p.delete);
}

/// Each class's Job as `(is a GPU class, image, claims a GPU, RuntimeClass, compile key)`.
fn jobs_by_class(p: &Plan) -> BTreeMap<String, (bool, String, bool, Option<String>, String)> {
    p.create
        .iter()
        .map(|j| {
            let gpu_class = j.facts.contains_key(kiln_crds::labels::GPU_PRODUCT);
            let r = &j.runner;
            let job = (gpu_class, r.image.clone(), r.gpu, r.runtime_class.clone());
            (
                j.class.clone(),
                (job.0, job.1, job.2, job.3, j.compile_key.clone()),
            )
        })
        .collect()
}

#[test]
fn gpu_classes_compile_in_the_gpu_image_keyed_on_its_libraries() {
    let cpu_ort = format!("1.31.1@sha256:{}", "c".repeat(64));
    let gpu_ort = format!("1.31.1@sha256:{}", "9".repeat(64));
    let gpu_worker = Worker {
        image: "kiln/agent-gpu:test".into(),
        backend_versions: BTreeMap::from([
            ("tract".into(), "0.23.9".into()),
            ("onnxruntime".into(), gpu_ort),
        ]),
        runtime_class: Some("nvidia".into()),
    };
    for (kind, gpu_engine) in [("onnxruntime", true), ("auto", true), ("tract", false)] {
        let mut w = World::new();
        w.target.spec.backend =
            serde_json::from_value(serde_json::json!({"kind": kind})).expect("backend");
        let agent = &mut w.settings.workers.agent;
        agent
            .backend_versions
            .insert("onnxruntime".into(), cpu_ort.clone());
        let image = agent.image.clone();
        // No GPU image: every class as before, the agent image, no GPU claimed.
        let before = jobs_by_class(&w.plan(0));
        assert_eq!(before.len(), 3, "{kind}: {before:?}");
        assert!(
            before
                .values()
                .all(|j| j.1 == image && !j.2 && j.3.is_none())
        );

        w.settings.workers.gpu = Some(gpu_worker.clone());
        let after = jobs_by_class(&w.plan(0));
        // The key a GPU class must have: the one a worker with the GPU image's libraries computes.
        let mut as_gpu = w.settings.clone();
        as_gpu.workers.agent.backend_versions = gpu_worker.backend_versions.clone();
        let ModelLookup::Found(model) = w.model.clone() else {
            panic!("model");
        };
        for j in w.plan(0).create {
            let (gpu_class, img, claims, runtime_class, key) = &after[&j.class];
            if !gpu_class {
                assert_eq!(
                    &after[&j.class], &before[&j.class],
                    "{kind}: CPU class changed"
                );
                continue;
            }
            let want = key_for(&model, &w.target, &j.facts, &as_gpu);
            assert_eq!(
                key, &want,
                "{kind} on {}: not keyed on the GPU image",
                j.class
            );
            // tract is the same library in both images: its key stays; ONNX Runtime's does not.
            assert_eq!(
                key == &before[&j.class].4,
                !gpu_engine,
                "{kind} on {}",
                j.class
            );
            assert_eq!(img, "kiln/agent-gpu:test", "{kind} on {}", j.class);
            assert_eq!(*claims, gpu_engine, "{kind} on {}: GPU claim", j.class);
            assert_eq!(runtime_class.as_deref(), Some("nvidia"));
        }
        assert_eq!(
            after.values().filter(|j| j.0).count(),
            2,
            "{kind}: {after:?}"
        );
    }
}

#[test]
fn a_runtime_only_the_gpu_image_carries_is_available() {
    let mut w = World::new();
    w.target.spec.backend =
        serde_json::from_value(serde_json::json!({"kind": "onnxruntime"})).expect("backend");
    assert_eq!(
        condition(&w.plan(0), "Stalled").reason,
        "BackendUnavailable"
    );
    w.settings.workers.gpu = Some(Worker {
        image: "kiln/agent-gpu:test".into(),
        backend_versions: BTreeMap::from([("onnxruntime".into(), "1.31.1@sha256:g".into())]),
        runtime_class: None,
    });
    let p = w.plan(0);
    assert!(!is_true(&p.status.conditions, "Stalled"), "{:?}", p.status);
    assert_eq!(p.create.len(), 3, "{:?}", p.create);
}
