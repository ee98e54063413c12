//! The plan, from YAML fixtures: which Jobs should exist, which node labels, what status and
//! which Events follow — for fresh targets, cache hits, running, failing, exhausted and invalid
//! ones. No client: these are the decisions the controller only carries out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::conditions::is_true;
use kiln_crds::{CompiledTarget, FailureReason, ModelArtifact};
use kiln_operator::classes::NodeView;
use kiln_operator::plan::{
    Inputs, JobState, JobView, ModelLookup, Plan, Settings, Stored, plan, wanted_keys,
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
        })
        .collect()
}

fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + secs).expect("time"))
}

struct World {
    target: CompiledTarget,
    model: ModelLookup,
    nodes: Vec<NodeView>,
    jobs: Vec<JobView>,
    stored: BTreeMap<String, Stored>,
    settings: Settings,
}

impl World {
    fn new() -> Self {
        Self {
            target: target(),
            model: model(),
            nodes: nodes(),
            jobs: Vec::new(),
            stored: BTreeMap::new(),
            settings: Settings::default(),
        }
    }

    fn plan(&self, now: i64) -> Plan {
        plan(&self.inputs(now))
    }

    fn inputs(&self, now: i64) -> Inputs<'_> {
        Inputs {
            target: &self.target,
            model: &self.model,
            nodes: &self.nodes,
            jobs: &self.jobs,
            stored: &self.stored,
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
        for (node, key, value) in &p.node_labels {
            if let Some(n) = self.nodes.iter_mut().find(|n| &n.name == node) {
                n.labels.insert(key.clone(), value.clone());
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

fn condition<'a>(p: &'a Plan, type_: &str) -> &'a kiln_crds::Condition {
    p.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

#[test]
fn one_job_per_class_pinned_by_class_label_and_mig_does_not_split() {
    let w = World::new();
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
            .any(|c| c.starts_with("nvidia-h100-80gb-hbm3-sm90-cuda12-amd64-")),
        "{classes:?}"
    );
    assert!(
        classes
            .iter()
            .any(|c| c.starts_with("nvidia-l4-sm89-cuda12-amd64-")),
        "{classes:?}"
    );
    for j in &p.create {
        assert_eq!(
            j.node_selector,
            ("kiln.dev/class".to_string(), j.class.clone())
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
    assert!(is_true(&p.status.conditions, "Ready") && is_true(&p.status.conditions, "Compiled"));
    assert!(
        p.events.iter().any(|e| e.reason == "Ready"),
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
            j.node_selector.0.starts_with("kiln.dev/class-"),
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
