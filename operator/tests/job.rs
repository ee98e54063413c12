//! The compile Job's store wiring: a filesystem store is a hostPath mount; an OCI store is the
//! URL, the insecure flag and credentials from a Secret, with no host mount at all. And the
//! image wiring: the agent image for built-in backends, the compiler image with the agent
//! injected by an init container for `exec`.

#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use kiln_crds::inject::{TOOLS_DIR, agent_command};
use kiln_crds::{CompiledTarget, ModelArtifact};
use kiln_operator::job::{
    COMPILER_CONTAINER, HANDOFF_MOUNT, JobSettings, JobStore, STORE_MOUNT, build,
};
use kiln_operator::plan::{NewJob, NodeLabel, Runner};

fn objects() -> (CompiledTarget, ModelArtifact) {
    let mut target: CompiledTarget =
        serde_saphyr::from_str(include_str!("fixtures/target.yaml")).expect("target.yaml");
    target.metadata.uid = Some("uid-1".into());
    let model: ModelArtifact =
        serde_saphyr::from_str(include_str!("fixtures/model.yaml")).expect("model.yaml");
    (target, model)
}

fn settings(store: JobStore) -> JobSettings {
    JobSettings {
        image_pull_policy: "Never".into(),
        store,
        sources_host_path: None,
        run_as_user: 65532,
        active_deadline_seconds: 600,
        ttl_seconds_after_finished: 60,
        signing_secret: None,
        service_account: None,
        source_trust_secret: None,
        require_source_signature: false,
    }
}

fn new_job() -> NewJob {
    NewJob {
        name: "t-abc".into(),
        class: "amd64-1234".into(),
        facts: [("kubernetes.io/arch".to_string(), "amd64".to_string())].into(),
        compile_key: "a".repeat(64),
        attempt: 1,
        node_selector: NodeLabel {
            key: "kiln.dev/class".into(),
            value: "amd64-1234".into(),
        },
        runner: Runner {
            image: "kiln/agent:test".into(),
            gpu: false,
            runtime_class: None,
        },
    }
}

fn env_of(job: &k8s_openapi::api::batch::v1::Job) -> Vec<k8s_openapi::api::core::v1::EnvVar> {
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    pod.containers[0].env.clone().unwrap()
}

fn value(env: &[k8s_openapi::api::core::v1::EnvVar], name: &str) -> Option<String> {
    env.iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[test]
fn filesystem_store_is_a_host_path_mount() {
    let (target, model) = objects();
    let job = build(
        &target,
        &model,
        &new_job(),
        &settings(JobStore::HostPath("/var/lib/kiln/store".into())),
    );
    let env = env_of(&job);
    assert_eq!(value(&env, "KILN_STORE").as_deref(), Some(STORE_MOUNT));
    let pod = job.spec.unwrap().template.spec.unwrap();
    let store = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "store")
        .expect("store volume");
    assert_eq!(store.host_path.unwrap().path, "/var/lib/kiln/store");
    assert!(env.iter().all(|e| !e.name.starts_with("KILN_REGISTRY")));
}

#[test]
fn oci_store_passes_url_insecure_and_secret_credentials_without_host_mounts() {
    let (target, model) = objects();
    let job = build(
        &target,
        &model,
        &new_job(),
        &settings(JobStore::Registry {
            url: "oci://10.201.0.2:5000/kiln".into(),
            insecure: true,
            secret: Some("kiln-registry".into()),
            mirrors: Some(MIRRORS.into()),
        }),
    );
    let env = env_of(&job);
    assert_eq!(
        value(&env, "KILN_STORE").as_deref(),
        Some("oci://10.201.0.2:5000/kiln")
    );
    assert_eq!(
        value(&env, "KILN_REGISTRY_INSECURE").as_deref(),
        Some("true")
    );
    assert_eq!(
        value(&env, "KILN_REGISTRY_MIRRORS").as_deref(),
        Some(MIRRORS),
        "the Job pulls through the mirrors the agents use"
    );
    for (var, key) in [
        ("KILN_REGISTRY_USERNAME", "username"),
        ("KILN_REGISTRY_PASSWORD", "password"),
    ] {
        let e = env.iter().find(|e| e.name == var).expect(var);
        assert!(e.value.is_none(), "credentials never inline in the Job");
        let r = e
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secretKeyRef");
        assert_eq!((r.name.as_str(), r.key.as_str()), ("kiln-registry", key));
    }
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert!(
        pod.volumes.unwrap().iter().all(|v| v.host_path.is_none()),
        "no hostPath for a registry store"
    );

    let without_secret = build(
        &target,
        &model,
        &new_job(),
        &settings(JobStore::Registry {
            url: "oci://r.example/kiln".into(),
            insecure: false,
            secret: None,
            mirrors: None,
        }),
    );
    let env = env_of(&without_secret);
    assert_eq!(
        value(&env, "KILN_REGISTRY_INSECURE").as_deref(),
        Some("false")
    );
    assert!(env.iter().all(|e| e.name != "KILN_REGISTRY_USERNAME"));
    assert!(env.iter().all(|e| e.name != "KILN_REGISTRY_MIRRORS"));
}

const MIRRORS: &str = r#"[{"host":"http://registry-cache:5000","capabilities":["pull"]}]"#;

#[test]
fn built_in_backend_runs_the_agent_image_with_no_init_container() {
    let (target, model) = objects();
    let job = build(
        &target,
        &model,
        &new_job(),
        &settings(JobStore::HostPath("/s".into())),
    );
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert!(pod.init_containers.is_none());
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("kiln/agent:test"));
    assert_eq!(
        c.command.as_deref(),
        Some(&["/bin/kiln-agent".to_string()][..])
    );
}

/// The Job of a GPU class whose worker is the GPU agent image (the plan's `Runner`).
fn gpu_job() -> NewJob {
    let mut new = new_job();
    new.facts
        .insert("nvidia.com/gpu.product".into(), "NVIDIA-L4".into());
    new.runner = Runner {
        image: "kiln/agent-gpu:test".into(),
        gpu: true,
        runtime_class: Some("nvidia".into()),
    };
    new
}

fn gpus(c: &k8s_openapi::api::core::v1::Container) -> Option<String> {
    let limits = c.resources.as_ref()?.limits.as_ref()?;
    limits.get("nvidia.com/gpu").map(|q| q.0.clone())
}

#[test]
fn a_gpu_class_runs_its_runner_image_with_one_gpu_and_its_runtime_class() {
    let (mut target, model) = objects();
    let s = settings(JobStore::HostPath("/s".into()));
    let job = build(&target, &model, &gpu_job(), &s);
    let pod = job.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("kiln/agent-gpu:test"));
    assert_eq!(
        value(c.env.as_ref().unwrap(), "KILN_BUILDER_IMAGE").as_deref(),
        Some("kiln/agent-gpu:test"),
        "the provenance names the image that built it"
    );
    assert_eq!(gpus(c).as_deref(), Some("1"));
    // The default memory limit and requests stay.
    let r = c.resources.as_ref().unwrap();
    assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "4Gi");
    assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "500m");
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));

    // The target's own resources keep theirs, with the GPU added to its limits.
    target.spec.compile.resources = Some(
        serde_json::from_value(
            serde_json::json!({"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}}),
        )
        .unwrap(),
    );
    let job = build(&target, &model, &gpu_job(), &s);
    let c = &job.spec.unwrap().template.spec.unwrap().containers[0];
    let r = c.resources.as_ref().unwrap();
    assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "2");
    assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "8Gi");
    assert_eq!(gpus(c).as_deref(), Some("1"));

    // A CPU class's Job: the agent image, no GPU, no RuntimeClass.
    let job = build(&target, &model, &new_job(), &s);
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.containers[0].image.as_deref(), Some("kiln/agent:test"));
    assert_eq!(gpus(&pod.containers[0]), None);
    assert!(pod.runtime_class_name.is_none());
}

#[test]
fn a_gpu_class_exec_job_installs_the_agent_from_its_runner_image() {
    let (mut target, model) = objects();
    target.spec.backend.kind = kiln_crds::compiled_target::BackendKind::Exec;
    target.spec.backend.image = Some(format!("registry.example/c@sha256:{}", "e".repeat(64)));
    let job = build(
        &target,
        &model,
        &gpu_job(),
        &settings(JobStore::HostPath("/s".into())),
    );
    let pod = job.spec.unwrap().template.spec.unwrap();
    let init = pod.init_containers.unwrap();
    assert_eq!(init[0].image.as_deref(), Some("kiln/agent-gpu:test"));
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some("kiln/agent-gpu:test")
    );
}

#[test]
fn foreign_compiler_image_gets_the_agent_injected_by_an_init_container() {
    let (mut target, model) = objects();
    let compiler = format!("registry.example/onnxsim@sha256:{}", "e".repeat(64));
    target.spec.backend.kind = kiln_crds::compiled_target::BackendKind::Exec;
    target.spec.backend.image = Some(compiler.clone());
    target.spec.backend.command = vec!["onnxsim".into(), "--fold".into()];
    let job = build(
        &target,
        &model,
        &new_job(),
        &settings(JobStore::Registry {
            url: "oci://r/kiln".into(),
            insecure: false,
            secret: Some("creds".into()),
            mirrors: None,
        }),
    );
    let pod = job.spec.unwrap().template.spec.unwrap();
    let volumes = pod.volumes.unwrap();
    let tools = volumes
        .iter()
        .find(|v| v.name == "kiln-tools")
        .expect("tools volume");
    assert!(
        tools.empty_dir.is_some(),
        "the agent travels in an emptyDir"
    );

    // The first init container runs the agent image and installs into the shared directory.
    let init = pod.init_containers.expect("init containers");
    assert_eq!(init.len(), 2, "install, then the compiler");
    assert_eq!(init[0].image.as_deref(), Some("kiln/agent:test"));
    assert_eq!(
        init[0].args.as_deref(),
        Some(&["install".to_string(), TOOLS_DIR.to_string()][..])
    );
    let init_mount = &init[0].volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (init_mount.name.as_str(), init_mount.mount_path.as_str()),
        ("kiln-tools", TOOLS_DIR)
    );
    assert_ne!(
        init_mount.read_only,
        Some(true),
        "the init container writes the tools"
    );

    // The compiler runs in its image through the injected copy and its own loader, with the
    // spec, /tmp and the handoff, and nothing secret: no store, no credentials, no signing key.
    let c = &init[1];
    assert_eq!(c.name, COMPILER_CONTAINER);
    assert_eq!(c.image.as_deref(), Some(compiler.as_str()));
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(c.command.clone().unwrap(), agent_command(TOOLS_DIR, &[]));
    assert_eq!(c.command.as_ref().unwrap()[0], "/kiln/tools/ld.so");
    let env = c.env.clone().unwrap();
    assert_eq!(
        value(&env, "KILN_COMPILE_STAGE").as_deref(),
        Some("compiler")
    );
    assert_eq!(value(&env, "KILN_HANDOFF").as_deref(), Some(HANDOFF_MOUNT));
    assert_eq!(value(&env, "LD_PRELOAD").as_deref(), Some(""));
    assert_eq!(value(&env, "HOME").as_deref(), Some("/tmp"));
    assert!(
        value(&env, "KILN_COMPILE_SPEC")
            .unwrap()
            .contains("onnxsim")
    );
    for secret in [
        "KILN_STORE",
        "KILN_REGISTRY_USERNAME",
        "KILN_REGISTRY_PASSWORD",
        "KILN_SIGNING_KEY",
    ] {
        assert!(
            env.iter().all(|e| e.name != secret),
            "{secret} reaches the compiler"
        );
    }
    let mounts: Vec<(&str, Option<bool>)> = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.name.as_str(), m.read_only))
        .collect();
    assert!(mounts.contains(&("kiln-tools", Some(true))), "{mounts:?}");
    assert!(
        mounts.contains(&("handoff", None)),
        "the compiler writes the handoff: {mounts:?}"
    );
    assert!(
        mounts
            .iter()
            .all(|(n, _)| !["store", "signing"].contains(n)),
        "{mounts:?}"
    );

    // The publisher is the agent image with the credentials, the handoff read-only, no tools.
    let p = &pod.containers[0];
    assert_eq!(p.image.as_deref(), Some("kiln/agent:test"));
    assert_eq!(p.args.as_deref(), Some(&["compile".to_string()][..]));
    let env = p.env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "KILN_REGISTRY_PASSWORD"));
    assert_eq!(value(&env, "KILN_HANDOFF").as_deref(), Some(HANDOFF_MOUNT));
    assert_eq!(
        value(&env, "KILN_BUILDER_IMAGE").as_deref(),
        Some(compiler.as_str())
    );
    assert!(env.iter().all(|e| e.name != "KILN_COMPILE_STAGE"));
    let mounts = p.volume_mounts.as_ref().unwrap();
    assert_eq!(
        mounts
            .iter()
            .find(|m| m.name == "handoff")
            .unwrap()
            .read_only,
        Some(true)
    );
    assert!(mounts.iter().all(|m| m.name != "kiln-tools"));
    for sc in [
        p.security_context.as_ref(),
        c.security_context.as_ref(),
        init[0].security_context.as_ref(),
    ] {
        let sc = sc.unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
    }
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
}

#[test]
fn signing_key_and_service_account_reach_only_the_publisher() {
    let (mut target, model) = objects();
    target.spec.backend.kind = kiln_crds::compiled_target::BackendKind::Exec;
    target.spec.backend.image = Some(format!("r/c@sha256:{}", "e".repeat(64)));
    target.spec.backend.command = vec!["c".into()];
    let mut s = settings(JobStore::HostPath("/s".into()));
    s.signing_secret = Some("kiln-signing".into());
    s.service_account = Some("kiln-compile".into());
    let job = build(&target, &model, &new_job(), &s);
    let pod = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("kiln-compile"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "signing")
        .expect("signing volume");
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("kiln-signing"));
    let items = secret.items.as_ref().unwrap();
    assert_eq!(
        items.len(),
        1,
        "only the private key, nothing else of the Secret"
    );
    assert_eq!(
        (items[0].key.as_str(), items[0].mode),
        ("signing.key", Some(0o440))
    );
    let publisher = &pod.containers[0];
    assert_eq!(
        value(publisher.env.as_ref().unwrap(), "KILN_SIGNING_KEY").as_deref(),
        Some("/var/run/kiln/signing/signing.key")
    );
    assert!(
        publisher
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.name == "signing")
    );
    let compiler = &pod.init_containers.as_ref().unwrap()[1];
    assert!(
        compiler
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .all(|m| m.name != "signing")
    );
    assert!(
        compiler
            .env
            .as_ref()
            .unwrap()
            .iter()
            .all(|e| e.name != "KILN_SIGNING_KEY")
    );
}

#[test]
fn source_trust_keys_and_the_signature_policy_reach_only_the_publisher() {
    let (mut target, model) = objects();
    target.spec.backend.kind = kiln_crds::compiled_target::BackendKind::Exec;
    target.spec.backend.image = Some(format!("r/c@sha256:{}", "e".repeat(64)));
    target.spec.backend.command = vec!["c".into()];
    let mut s = settings(JobStore::HostPath("/s".into()));
    s.source_trust_secret = Some("kiln-source-keys".into());
    s.require_source_signature = true;
    let job = build(&target, &model, &new_job(), &s);
    let pod = job.spec.unwrap().template.spec.unwrap();
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "source-trust")
        .expect("source-trust volume");
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("kiln-source-keys"));
    let items = secret.items.as_ref().unwrap();
    let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["cosign.pub", "sigstore.json"]);
    // Either key may be missing: a Secret of keys, or of keyless trust only.
    assert_eq!(secret.optional, Some(true));
    let publisher = &pod.containers[0];
    let env = publisher.env.as_ref().unwrap();
    assert_eq!(
        value(env, "KILN_SOURCE_TRUST_KEY").as_deref(),
        Some("/var/run/kiln/source-trust/cosign.pub")
    );
    assert_eq!(
        value(env, "KILN_SOURCE_TRUST_SIGSTORE").as_deref(),
        Some("/var/run/kiln/source-trust/sigstore.json")
    );
    assert_eq!(
        value(env, "KILN_REQUIRE_SOURCE_SIGNATURE").as_deref(),
        Some("true")
    );
    let compiler = &pod.init_containers.as_ref().unwrap()[1];
    assert!(
        compiler
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.name != "source-trust")
    );
    assert!(
        compiler
            .env
            .iter()
            .flatten()
            .all(|e| !e.name.starts_with("KILN_SOURCE_TRUST"))
    );
    // Without the settings, nothing of it.
    let plain = build(
        &target,
        &model,
        &new_job(),
        &settings(JobStore::HostPath("/s".into())),
    );
    let pod = plain.spec.unwrap().template.spec.unwrap();
    assert!(
        pod.volumes
            .iter()
            .flatten()
            .all(|v| v.name != "source-trust")
    );
    assert!(
        pod.containers[0]
            .env
            .iter()
            .flatten()
            .all(|e| !e.name.contains("SOURCE_SIGNATURE"))
    );
}
