//! The compile Job for one (CompiledTarget, class): pinned to the class by node label, owned by
//! the target, running `kiln-agent compile` (for a foreign compiler image, a copy injected by an
//! init container) with the objects it needs in its environment, as a
//! non-root user on a read-only root filesystem, with the operator's store (a hostPath mount for a
//! filesystem store; the URL and registry settings for an OCI store). Pure: builds the object,
//! sends nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource,
    PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile,
    SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kiln_crds::inject::{TOOLS_DIR, agent_command};
use kiln_crds::labels::JOB_CLASS;
use kiln_crds::{CompiledTarget, ModelArtifact};
use kube::Resource;

use crate::plan::NewJob;

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
    },
}

/// How compile Jobs are built, from the operator's flags.
#[derive(Clone, Debug)]
pub struct JobSettings {
    /// kiln-agent image.
    pub image: String,
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
}

/// The Job for `new`.
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
    let mut env = vec![
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
    let mut mounts = vec![VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..Default::default()
    }];
    let mut volumes = vec![Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("1Gi".into())),
            ..Default::default()
        }),
        ..Default::default()
    }];
    match &s.store {
        JobStore::HostPath(path) => {
            env.push(self::env("KILN_STORE", STORE_MOUNT));
            mounts.push(VolumeMount {
                name: "store".into(),
                mount_path: STORE_MOUNT.into(),
                ..Default::default()
            });
            volumes.push(Volume {
                name: "store".into(),
                host_path: Some(HostPathVolumeSource {
                    path: path.clone(),
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            });
        }
        JobStore::Registry {
            url,
            insecure,
            secret,
        } => {
            env.push(self::env("KILN_STORE", url));
            env.push(self::env("KILN_REGISTRY_INSECURE", &insecure.to_string()));
            if let Some(secret) = secret {
                for (var, key) in [
                    ("KILN_REGISTRY_USERNAME", "username"),
                    ("KILN_REGISTRY_PASSWORD", "password"),
                ] {
                    env.push(EnvVar {
                        name: var.into(),
                        value_from: Some(EnvVarSource {
                            secret_key_ref: Some(SecretKeySelector {
                                name: secret.clone(),
                                key: key.into(),
                                optional: Some(true),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                }
            }
        }
    }
    if let Some(src) = &s.sources_host_path {
        mounts.push(VolumeMount {
            name: "sources".into(),
            mount_path: SOURCES_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "sources".into(),
            host_path: Some(HostPathVolumeSource {
                path: src.clone(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        });
    }
    let resources = t
        .compile
        .resources
        .clone()
        .unwrap_or_else(|| ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("500m".into())),
                ("memory".to_string(), Quantity("512Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("4Gi".into()),
            )])),
            ..Default::default()
        });
    // A foreign compiler image gets kiln-agent injected: an init container running the agent
    // image copies it (with its loader and libraries) into an emptyDir, and the compile
    // container runs that copy in the compiler image.
    let (image, pull_policy, command, init_containers) = match &t.backend.image {
        Some(compiler) => {
            mounts.push(VolumeMount {
                name: "kiln-tools".into(),
                mount_path: TOOLS_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            });
            volumes.push(Volume {
                name: "kiln-tools".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity("512Mi".into())),
                    ..Default::default()
                }),
                ..Default::default()
            });
            // Foreign tools write caches under $HOME; the root filesystem is read-only.
            env.push(self::env("HOME", "/tmp"));
            let install = Container {
                name: "kiln-tools".into(),
                image: Some(s.image.clone()),
                image_pull_policy: Some(s.image_pull_policy.clone()),
                command: Some(vec!["/bin/kiln-agent".into()]),
                args: Some(vec!["install".into(), TOOLS_DIR.into()]),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity("50m".into())),
                        ("memory".to_string(), Quantity("32Mi".into())),
                    ])),
                    limits: Some(BTreeMap::from([(
                        "memory".to_string(),
                        Quantity("128Mi".into()),
                    )])),
                    ..Default::default()
                }),
                volume_mounts: Some(vec![VolumeMount {
                    name: "kiln-tools".into(),
                    mount_path: TOOLS_DIR.into(),
                    ..Default::default()
                }]),
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                security_context: Some(restricted()),
                ..Default::default()
            };
            (
                compiler.clone(),
                // Pinned by digest (admission enforces it): a local copy is that exact image.
                "IfNotPresent".to_string(),
                agent_command(TOOLS_DIR, &[]),
                Some(vec![install]),
            )
        }
        None => (
            s.image.clone(),
            s.image_pull_policy.clone(),
            vec!["/bin/kiln-agent".into()],
            None,
        ),
    };
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
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    node_selector: Some(BTreeMap::from([(
                        new.node_selector.key.clone(),
                        new.node_selector.value.clone(),
                    )])),
                    tolerations: (!t.compile.tolerations.is_empty())
                        .then(|| t.compile.tolerations.clone()),
                    // The worker needs no API access: everything it reads is in its environment.
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(s.run_as_user),
                        run_as_group: Some(s.run_as_user),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    init_containers,
                    containers: vec![Container {
                        name: "compile".into(),
                        image: Some(image),
                        image_pull_policy: Some(pull_policy),
                        command: Some(command),
                        args: Some(vec!["compile".into()]),
                        env: Some(env),
                        resources: Some(resources),
                        volume_mounts: Some(mounts),
                        termination_message_policy: Some("FallbackToLogsOnError".into()),
                        security_context: Some(restricted()),
                        ..Default::default()
                    }],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
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
