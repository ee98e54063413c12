//! The compile Job for one (CompiledTarget, class): pinned to the class by node label, owned by
//! the target, running `kiln-agent compile` with the objects it needs in its environment, as a
//! non-root user on a read-only root filesystem under the `kiln-compile` ServiceAccount with no
//! token, with the operator's store (a hostPath mount for a filesystem store; the URL and
//! registry settings for an OCI store) and the signing key. The image is the class's worker
//! (the GPU agent image on a GPU class when there is one, [`crate::plan::Workers`]), which may
//! claim a GPU and name a RuntimeClass.
//!
//! A foreign compiler (`backend.kind: exec`) never shares a container with any of those: it runs
//! in an init container of its own image (kiln-agent injected by another init container) with
//! the spec, the sources and a handoff emptyDir only; the `compile` container (the agent image)
//! then builds, checks, stores and signs what it handed over.
//! Pure: builds the object, sends nothing.

pub mod observe;

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource,
    KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile,
    SecretKeySelector, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kiln_crds::inject::{TOOLS_DIR, agent_command};
use kiln_crds::labels::JOB_CLASS;
use kiln_crds::{CompiledTarget, ModelArtifact};
use kube::Resource;

use crate::plan::{GPU_RESOURCE, NewJob};

/// Label on every Job (and its pods) the operator creates; its Job watch selects on it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kiln-operator");
/// Annotation: the full compile key (64 hex does not fit a label value).
pub const ANN_KEY: &str = "kiln.dev/compile-key";
/// Annotation: attempt number.
pub const ANN_ATTEMPT: &str = "kiln.dev/attempt";
/// Where the store is mounted in the compile container.
pub const STORE_MOUNT: &str = "/var/lib/kiln/store";
/// Where the source directory is mounted (relative `file://` URIs resolve against it).
pub const SOURCES_MOUNT: &str = "/var/lib/kiln/sources";
/// Where the signing Secret is mounted in the publisher.
pub const SIGNING_MOUNT: &str = "/var/run/kiln/signing";
/// Key of the signing Secret that holds the PKCS#8 PEM private key.
pub const SIGNING_KEY: &str = "signing.key";
/// Where the trusted source keys are mounted in the publisher.
pub const SOURCE_TRUST_MOUNT: &str = "/var/run/kiln/source-trust";
/// The key of the source-trust Secret: what `cosign generate-key-pair` names the public key.
pub const SOURCE_TRUST_KEY: &str = "cosign.pub";
/// The key of the source-trust Secret that holds the Sigstore trust (trusted root and
/// identities) for keyless model signing bundles.
pub const SOURCE_TRUST_SIGSTORE: &str = "sigstore.json";
/// Where an exec compiler hands its model to the publisher.
pub const HANDOFF_MOUNT: &str = "/kiln/handoff";
/// Name of an exec Job's compiler init container.
pub const COMPILER_CONTAINER: &str = "compiler";

/// Where compile Jobs store artifacts: the operator's own store, seen from the Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStore {
    /// A filesystem store in this host directory (mounted at [`STORE_MOUNT`]), shared with
    /// the operator on one node.
    HostPath(String),
    /// An OCI registry store (`oci://…`), reached over the network; no host mount.
    Registry {
        /// The store URL, passed as is.
        url: String,
        /// Plain HTTP.
        insecure: bool,
        /// Secret in the Job's namespace with keys `username` and `password` (both optional).
        secret: Option<String>,
        /// The registry's mirrors (`KILN_REGISTRY_MIRRORS`, as the operator was given and
        /// validated them), so that the Job's pulls go through them as the agents' do.
        mirrors: Option<String>,
    },
}

/// How compile Jobs are built, from the operator's flags. The image each runs is the plan's
/// choice per class ([`NewJob::runner`]).
#[derive(Clone, Debug)]
pub struct JobSettings {
    /// `Always`, `IfNotPresent` or `Never`.
    pub image_pull_policy: String,
    /// Where the worker stores artifacts.
    pub store: JobStore,
    /// Host directory mounted read-only for relative `file://` sources (local clusters), if any.
    pub sources_host_path: Option<String>,
    /// UID (and GID) the worker runs as; must be able to write the store directory.
    pub run_as_user: i64,
    /// Deadline of one Job when the target sets none.
    pub active_deadline_seconds: i64,
    /// Finished Jobs are deleted this long after they end.
    pub ttl_seconds_after_finished: i32,
    /// Secret (key [`SIGNING_KEY`]) the publisher signs attestations with, if any.
    pub signing_secret: Option<String>,
    /// ServiceAccount of compile pods (no token is mounted either way).
    pub service_account: Option<String>,
    /// Secret (keys [`SOURCE_TRUST_KEY`], a cosign.pub of keys and CA certificates, and
    /// [`SOURCE_TRUST_SIGSTORE`], either or both) of whom model sources may be signed by; the
    /// publisher verifies `spec.source.signature` against it.
    pub source_trust_secret: Option<String>,
    /// The publisher refuses unsigned sources.
    pub require_source_signature: bool,
}

/// The Job for `new`: its identity, the wiring of the compile container (environment, mounts),
/// what runs it (the agent image, or a foreign compiler with the agent injected), and the pod.
pub fn build(target: &CompiledTarget, model: &ModelArtifact, new: &NewJob, s: &JobSettings) -> Job {
    let t = &target.spec;
    let labels = BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        (JOB_CLASS.to_string(), new.class.clone()),
    ]);
    let annotations = BTreeMap::from([
        (ANN_KEY.to_string(), new.compile_key.clone()),
        (ANN_ATTEMPT.to_string(), new.attempt.to_string()),
    ]);
    let mut wiring = Wiring::new(target, model, new);
    if let Some(src) = &s.sources_host_path {
        wiring.sources(src);
    }
    // The foreign compiler gets what it needs so far, and nothing that follows.
    let init = t
        .backend
        .image
        .as_ref()
        .map(|compiler| wiring.compiler(target, new, compiler, s));
    wiring.store(&s.store);
    if let Some(secret) = &s.signing_secret {
        wiring.signing(secret);
    }
    if let Some(secret) = &s.source_trust_secret {
        wiring.source_trust(secret);
    }
    if s.require_source_signature {
        wiring
            .env
            .push(env("KILN_REQUIRE_SOURCE_SIGNATURE", "true"));
    }
    wiring.env.push(env(
        "KILN_BUILDER_IMAGE",
        t.backend.image.as_deref().unwrap_or(&new.runner.image),
    ));
    Job {
        metadata: ObjectMeta {
            name: Some(new.name.clone()),
            namespace: target.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            annotations: Some(annotations),
            owner_references: target.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            // The operator retries, with backoff and a classified reason per attempt.
            backoff_limit: Some(0),
            active_deadline_seconds: Some(
                t.compile
                    .active_deadline_seconds
                    .unwrap_or(s.active_deadline_seconds),
            ),
            ttl_seconds_after_finished: Some(s.ttl_seconds_after_finished),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(pod(target, new, s, wiring, init)),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the compile container is given: its environment, its mounts and the volumes behind them.
struct Wiring {
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
    volumes: Vec<Volume>,
}

impl Wiring {
    /// The objects and class the worker needs, and a writable `/tmp` (the root is read-only).
    fn new(target: &CompiledTarget, model: &ModelArtifact, new: &NewJob) -> Self {
        let env = vec![
            env("KILN_COMPILE_SPEC", &spec_json(target, model)),
            env(
                "KILN_CLASS_FACTS",
                &serde_json::to_string(&new.facts).unwrap_or_default(),
            ),
            env("KILN_CLASS", &new.class),
            env("KILN_COMPILE_KEY", &new.compile_key),
            env("KILN_SOURCE_BASE", SOURCES_MOUNT),
            // Plain lines: the operator quotes the last few in status when a compile fails.
            env("KILN_LOG_FORMAT", "plain"),
            env("NO_COLOR", "1"),
        ];
        let mut wiring = Self {
            env,
            mounts: Vec::new(),
            volumes: Vec::new(),
        };
        let scratch = scratch_limit(model.spec.source.size);
        wiring.mount("tmp", "/tmp", false, empty_dir(&scratch));
        wiring
    }

    /// Mounts `volume` (named `name`) at `path`.
    fn mount(&mut self, name: &str, path: &str, read_only: bool, volume: Volume) {
        self.mounts.push(VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: read_only.then_some(true),
            ..Default::default()
        });
        self.volumes.push(Volume {
            name: name.into(),
            ..volume
        });
    }

    /// The operator's store: a hostPath mount, or the registry URL, its settings and credentials
    /// from the Secret (optional keys: a registry without auth needs none).
    fn store(&mut self, store: &JobStore) {
        match store {
            JobStore::HostPath(path) => {
                self.env.push(env("KILN_STORE", STORE_MOUNT));
                self.mount("store", STORE_MOUNT, false, host_path(path));
            }
            JobStore::Registry {
                url,
                insecure,
                secret,
                mirrors,
            } => {
                self.env.push(env("KILN_STORE", url));
                self.env
                    .push(env("KILN_REGISTRY_INSECURE", &insecure.to_string()));
                if let Some(mirrors) = mirrors {
                    self.env.push(env("KILN_REGISTRY_MIRRORS", mirrors));
                }
                if let Some(secret) = secret {
                    for (var, key) in [
                        ("KILN_REGISTRY_USERNAME", "username"),
                        ("KILN_REGISTRY_PASSWORD", "password"),
                    ] {
                        self.env.push(secret_env(var, secret, key));
                    }
                }
            }
        }
    }

    /// The sources directory, read-only (relative `file://` URIs resolve against it).
    fn sources(&mut self, src: &str) {
        self.mount("sources", SOURCES_MOUNT, true, host_path(src));
    }

    /// The signing key, for the publisher only (a file readable by the pod's group).
    fn signing(&mut self, secret: &str) {
        self.secret_files(
            ("signing", SIGNING_MOUNT, secret),
            &[(SIGNING_KEY, "KILN_SIGNING_KEY")],
            0o440,
            false,
        );
    }

    /// Both keys, each optional (the kubelet skips a key the Secret lacks): the agent needs one
    /// of them, and says which is missing when a signature needs it.
    fn source_trust(&mut self, secret: &str) {
        self.secret_files(
            ("source-trust", SOURCE_TRUST_MOUNT, secret),
            &[
                (SOURCE_TRUST_KEY, "KILN_SOURCE_TRUST_KEY"),
                (SOURCE_TRUST_SIGSTORE, "KILN_SOURCE_TRUST_SIGSTORE"),
            ],
            0o444,
            true,
        );
    }

    /// `keys` of `secret`, nothing else of it, each at `mount/key` (read-only, `mode`), named
    /// to the publisher by its variable; `optional`: keys (and the Secret) may be missing.
    fn secret_files(
        &mut self,
        (volume, mount, secret): (&str, &str, &str),
        keys: &[(&str, &str)],
        mode: i32,
        optional: bool,
    ) {
        for (key, variable) in keys {
            self.env.push(env(variable, &format!("{mount}/{key}")));
        }
        let items = keys.iter().map(|(key, _)| KeyToPath {
            key: (*key).into(),
            path: (*key).into(),
            mode: Some(mode),
        });
        self.mount(
            volume,
            mount,
            true,
            Volume {
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.into()),
                    items: Some(items.collect()),
                    default_mode: Some(mode),
                    optional: optional.then_some(true),
                }),
                ..Default::default()
            },
        );
    }

    /// A foreign compiler: an init container running the agent image copies kiln-agent (with
    /// its loader and libraries) into an emptyDir, and a second one runs that copy in the
    /// compiler image as `compile --stage compiler`, with the wiring so far (spec, sources,
    /// `/tmp`) and a handoff emptyDir the publisher then reads.
    fn compiler(
        &mut self,
        target: &CompiledTarget,
        new: &NewJob,
        compiler: &str,
        s: &JobSettings,
    ) -> Vec<Container> {
        self.mount("kiln-tools", TOOLS_DIR, true, empty_dir("512Mi"));
        self.mount("handoff", HANDOFF_MOUNT, false, empty_dir("16Gi"));
        self.env.push(env("KILN_HANDOFF", HANDOFF_MOUNT));
        let mut compiler_env = self.env.clone();
        compiler_env.extend([
            env("KILN_COMPILE_STAGE", "compiler"),
            // Foreign tools write caches under $HOME; the root filesystem is read-only.
            env("HOME", "/tmp"),
            // The image's own preload does not run inside kiln-agent.
            env("LD_PRELOAD", ""),
        ]);
        let compiler_mounts = self.mounts.clone();
        // The publisher reads the handoff; it never writes it.
        if let Some(m) = self.mounts.iter_mut().find(|m| m.name == "handoff") {
            m.read_only = Some(true);
        }
        self.mounts.retain(|m| m.name != "kiln-tools");
        let install = Container {
            name: "kiln-tools".into(),
            image: Some(new.runner.image.clone()),
            image_pull_policy: Some(s.image_pull_policy.clone()),
            command: Some(vec!["/bin/kiln-agent".into()]),
            args: Some(vec!["install".into(), TOOLS_DIR.into()]),
            resources: Some(resources(("50m", "32Mi"), "128Mi")),
            volume_mounts: Some(vec![VolumeMount {
                name: "kiln-tools".into(),
                mount_path: TOOLS_DIR.into(),
                ..Default::default()
            }]),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            security_context: Some(restricted()),
            ..Default::default()
        };
        let run = Container {
            name: COMPILER_CONTAINER.into(),
            image: Some(compiler.to_string()),
            // Pinned by digest (admission enforces it): a local copy is that exact image.
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(agent_command(TOOLS_DIR, &[])),
            args: Some(vec!["compile".into()]),
            env: Some(compiler_env),
            resources: Some(compile_resources(target, new)),
            volume_mounts: Some(compiler_mounts),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            security_context: Some(restricted()),
            ..Default::default()
        };
        vec![install, run]
    }
}

/// The compile pod: pinned to the class, no API access, non-root, one `compile` container
/// (the agent image) after the `init` containers an exec compiler needs.
fn pod(
    target: &CompiledTarget,
    new: &NewJob,
    s: &JobSettings,
    wiring: Wiring,
    init: Option<Vec<Container>>,
) -> PodSpec {
    let t = &target.spec;
    PodSpec {
        restart_policy: Some("Never".into()),
        node_selector: Some(BTreeMap::from([(
            new.node_selector.key.clone(),
            new.node_selector.value.clone(),
        )])),
        tolerations: (!t.compile.tolerations.is_empty()).then(|| t.compile.tolerations.clone()),
        // The worker needs no API access: everything it reads is in its environment.
        service_account_name: s.service_account.clone(),
        runtime_class_name: new.runner.runtime_class.clone(),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(s.run_as_user),
            run_as_group: Some(s.run_as_user),
            // Secret files (the signing key, mode 0440) belong to this group, so the user reads them.
            fs_group: Some(s.run_as_user),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        init_containers: init,
        containers: vec![Container {
            name: "compile".into(),
            image: Some(new.runner.image.clone()),
            image_pull_policy: Some(s.image_pull_policy.clone()),
            command: Some(vec!["/bin/kiln-agent".into()]),
            args: Some(vec!["compile".into()]),
            env: Some(wiring.env),
            resources: Some(compile_resources(target, new)),
            volume_mounts: Some(wiring.mounts),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            security_context: Some(restricted()),
            ..Default::default()
        }],
        volumes: Some(wiring.volumes),
        ..Default::default()
    }
}

/// The target's compile resources, or the default; with one `nvidia.com/gpu` where the plan
/// says the Job claims one (a GPU compile on a GPU class whose target asked none). An extended
/// resource is a limit: its request follows it.
fn compile_resources(target: &CompiledTarget, new: &NewJob) -> ResourceRequirements {
    let mut r = target
        .spec
        .compile
        .resources
        .clone()
        .unwrap_or_else(|| resources(("500m", "512Mi"), "4Gi"));
    if new.runner.gpu {
        r.limits
            .get_or_insert_with(BTreeMap::new)
            .insert(GPU_RESOURCE.to_string(), Quantity("1".into()));
    }
    r
}

/// Requests (cpu, memory) and a memory limit.
fn resources(requests: (&str, &str), memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(requests.0.into())),
            ("memory".to_string(), Quantity(requests.1.into())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(memory_limit.into()),
        )])),
        ..Default::default()
    }
}

/// The compile's scratch space (`/tmp`, an emptyDir the kubelet evicts the pod for exceeding)
/// for a source of `source_size` bytes, as a quantity in bytes (pure): 1 GiB for the worker's own
/// files, plus four times the source: its verified copy, the compiled artifact (a tract NNEF
/// archive or an optimised ONNX is about the source's size; a quantised GGUF smaller), and room
/// for the other engine candidates `auto` keeps. A fixed 1 GiB evicted every compile of a source
/// near or above 1 GB.
pub fn scratch_limit(source_size: i64) -> String {
    const GIB: u64 = 1 << 30;
    let source = u64::try_from(source_size).unwrap_or(0);
    GIB.saturating_add(source.saturating_mul(4)).to_string()
}

/// An emptyDir volume of at most `size` (the name is set by [`Wiring::mount`]).
fn empty_dir(size: &str) -> Volume {
    Volume {
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(size.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A hostPath volume of an existing directory (the name is set by [`Wiring::mount`]).
fn host_path(path: &str) -> Volume {
    Volume {
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some("Directory".into()),
        }),
        ..Default::default()
    }
}

/// An environment variable from an optional key of a Secret.
fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(true),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// No privilege escalation, no capabilities, read-only root filesystem.
fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// The two objects the worker needs, without server-side metadata: `{"model": …, "target": …}`.
pub fn spec_json(target: &CompiledTarget, model: &ModelArtifact) -> String {
    let strip = |mut meta: ObjectMeta| ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        ..Default::default()
    };
    let mut model = model.clone();
    model.metadata = strip(model.metadata);
    model.status = None;
    let mut target = target.clone();
    target.metadata = strip(target.metadata);
    target.status = None;
    serde_json::json!({"model": model, "target": target}).to_string()
}

#[cfg(test)]
mod scratch_tests {
    use super::scratch_limit;

    #[test]
    fn the_compile_scratch_grows_with_the_source() {
        assert_eq!(scratch_limit(1), (1u64 << 30).saturating_add(4).to_string());
        // A 4 GB F16 source: its copy, the artifact and a candidate's fit.
        let four_gb = 4_000_000_000i64;
        let limit: u64 = scratch_limit(four_gb).parse().expect("bytes");
        assert!(limit >= 3 * four_gb as u64 + (1 << 30), "{limit}");
        assert_eq!(scratch_limit(i64::MAX), u64::MAX.to_string(), "saturates");
        assert_eq!(scratch_limit(-1), (1u64 << 30).to_string());
    }
}
