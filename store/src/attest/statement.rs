//! The in-toto Statement (SLSA provenance v1 predicate) kiln signs for a stored entry, and
//! the subject an entry's statement must name to be accepted. Pure.

use std::collections::BTreeMap;

use kiln_crds::BuildManifest;
use serde::{Deserialize, Serialize};

use crate::Entry;

/// in-toto Statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// SLSA provenance predicate type.
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
/// kiln's build type inside the provenance.
pub const BUILD_TYPE: &str = "https://kiln.dev/compile/v1";
/// Subject name of the stored build manifest (the digest agents pull by).
const MANIFEST_SUBJECT: &str = "build-manifest";

/// What an entry's statement must name to be accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject<'a> {
    /// The compile key.
    pub compile_key: &'a str,
    /// `sha256:<hex>` the entry is stored (and pulled) under.
    pub manifest_digest: &'a str,
    /// Bare hex sha256 of the artifact.
    pub artifact_digest: &'a str,
}

/// An in-toto Statement v1 with a SLSA provenance v1 predicate.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<ResourceDescriptor>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Provenance,
}

/// An in-toto ResourceDescriptor (name, digest, optional URI).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResourceDescriptor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default)]
    pub digest: BTreeMap<String, String>,
}

/// SLSA provenance v1 (the fields kiln fills).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    pub build_definition: BuildDefinition,
    pub run_details: RunDetails,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BuildDefinition {
    pub build_type: String,
    /// `compileKey` and `class` (label → value).
    pub external_parameters: serde_json::Value,
    /// Backend, version, precision.
    pub internal_parameters: serde_json::Value,
    /// The inputs by digest, and the builder image.
    pub resolved_dependencies: Vec<ResourceDescriptor>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunDetails {
    pub builder: Builder,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Builder {
    pub id: String,
}

impl Statement {
    /// The provenance of `entry`, built by `builder_image` (an image reference; its digest is
    /// recorded when the reference is pinned by one).
    pub fn for_entry(entry: &Entry, builder_image: Option<&str>) -> Self {
        let m: &BuildManifest = &entry.manifest;
        let mut deps: Vec<ResourceDescriptor> = m
            .inputs
            .iter()
            .map(|(name, digest)| ResourceDescriptor {
                name: Some(name.clone()),
                uri: None,
                digest: BTreeMap::from([("sha256".to_string(), digest.clone())]),
            })
            .collect();
        if let Some(image) = builder_image {
            deps.push(ResourceDescriptor {
                name: Some("builder-image".into()),
                uri: Some(format!("oci://{image}")),
                digest: image
                    .split_once("@sha256:")
                    .map(|(_, d)| BTreeMap::from([("sha256".to_string(), d.to_string())]))
                    .unwrap_or_default(),
            });
        }
        Self {
            type_: STATEMENT_TYPE.into(),
            subject: vec![
                ResourceDescriptor {
                    name: Some(m.compile_key.clone()),
                    uri: None,
                    digest: BTreeMap::from([("sha256".to_string(), m.artifact_digest.clone())]),
                },
                ResourceDescriptor {
                    name: Some(MANIFEST_SUBJECT.into()),
                    uri: None,
                    digest: BTreeMap::from([(
                        "sha256".to_string(),
                        bare(&entry.manifest_digest).to_string(),
                    )]),
                },
            ],
            predicate_type: PREDICATE_TYPE.into(),
            predicate: Provenance {
                build_definition: BuildDefinition {
                    build_type: BUILD_TYPE.into(),
                    external_parameters: serde_json::json!({
                        "compileKey": m.compile_key,
                        "class": m.class,
                    }),
                    internal_parameters: serde_json::json!({
                        "backend": m.backend,
                        "backendVersion": m.backend_version,
                        "precision": m.precision,
                        "toolVersion": m.tool_version,
                    }),
                    resolved_dependencies: deps,
                },
                run_details: RunDetails {
                    builder: Builder {
                        id: format!("https://kiln.dev/kiln-agent@{}", m.tool_version),
                    },
                },
            },
        }
    }

    /// The statement must be kiln provenance naming exactly `want`.
    pub(super) fn check(&self, want: &Subject<'_>) -> std::result::Result<(), String> {
        if self.type_ != STATEMENT_TYPE || self.predicate_type != PREDICATE_TYPE {
            return Err(format!(
                "statement type {} / predicate {}, expected {STATEMENT_TYPE} / {PREDICATE_TYPE}",
                self.type_, self.predicate_type
            ));
        }
        if self.predicate.build_definition.build_type != BUILD_TYPE {
            return Err(format!(
                "build type {}, expected {BUILD_TYPE}",
                self.predicate.build_definition.build_type
            ));
        }
        let sha = |name: &str| {
            self.subject
                .iter()
                .find(|s| s.name.as_deref() == Some(name))
                .and_then(|s| s.digest.get("sha256"))
                .map(String::as_str)
        };
        let key = self
            .predicate
            .build_definition
            .external_parameters
            .get("compileKey")
            .and_then(|k| k.as_str());
        let mismatches: Vec<String> = [
            ("compile key", key, want.compile_key),
            ("artifact", sha(want.compile_key), want.artifact_digest),
            (
                "build manifest",
                sha(MANIFEST_SUBJECT),
                bare(want.manifest_digest),
            ),
        ]
        .into_iter()
        .filter(|(_, got, want)| !got.is_some_and(|g| g.eq_ignore_ascii_case(want)))
        .map(|(what, got, want)| format!("{what}: signed {got:?}, stored {want}"))
        .collect();
        if mismatches.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the signed statement is about something else ({}); the entry was replaced after it was signed",
                mismatches.join("; ")
            ))
        }
    }
}

impl<'a> From<&'a crate::ArtifactRef> for Subject<'a> {
    /// What the attestation of the entry a node pulls by `r` must name.
    fn from(r: &'a crate::ArtifactRef) -> Self {
        Self {
            compile_key: &r.compile_key,
            manifest_digest: &r.manifest_digest,
            artifact_digest: &r.artifact_digest,
        }
    }
}

/// What the attestation of `entry` must name.
pub fn subject(entry: &Entry) -> Subject<'_> {
    Subject {
        compile_key: &entry.manifest.compile_key,
        manifest_digest: &entry.manifest_digest,
        artifact_digest: &entry.manifest.artifact_digest,
    }
}

fn bare(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}
