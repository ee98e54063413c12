//! Reads the YAML a user would `kubectl apply` — one ModelArtifact and one CompiledTarget — and
//! checks it the way the apiserver would (CEL rules, patterns) plus what needs both objects.
//! Reads the YAML file; otherwise pure.

use std::collections::BTreeMap;

use kiln_crds::compiled_target::CompiledTarget;
use kiln_crds::model_artifact::ModelArtifact;

use crate::backend::Shapes;
use kiln_node_core::error::{Error, Result};

/// The two objects of a local run.
#[derive(Clone)]
pub struct Spec {
    /// What the model is.
    pub model: ModelArtifact,
    /// How and where it runs.
    pub target: CompiledTarget,
}

impl Spec {
    /// Reads `path`; relative `file://` URIs in it resolve against the file's directory.
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let yaml = std::fs::read_to_string(path).map_err(|e| {
            Error::spec_unreadable(format!("cannot read {}: {e}", path.display()), e)
        })?;
        let mut spec = Self::parse(&yaml)?;
        spec.resolve_relative(path.parent().unwrap_or(std::path::Path::new(".")));
        Ok(spec)
    }

    /// The two objects as the operator hands them to a compile Job (or the agent reads them from
    /// the cluster), checked like a file would be. In a cluster `file://` URIs are confined to the
    /// sources directory `base`: relative, no `..`, and not leading out of it through a symlink.
    pub fn from_objects(
        model: ModelArtifact,
        target: CompiledTarget,
        base: &std::path::Path,
    ) -> Result<Self> {
        let mut spec = Self { model, target };
        spec.validate()?;
        spec.confine(base)?;
        spec.resolve_relative(base);
        Ok(spec)
    }

    /// Every `file://` URI names a file under `base`.
    fn confine(&self, base: &std::path::Path) -> Result<()> {
        let m = &self.model.spec;
        let uris = std::iter::once(("spec.source.uri".to_string(), &m.source.uri))
            .chain(
                m.assets
                    .iter()
                    .map(|a| (format!("spec.assets[{}].uri", a.name), &a.uri)),
            )
            .chain(
                m.fixtures
                    .iter()
                    .map(|f| (format!("spec.fixtures[{}].uri", f.version), &f.uri)),
            );
        for (field, uri) in uris {
            let Some(rest) = uri.strip_prefix("file://") else {
                continue;
            };
            let refuse = |rule: &str| {
                Err(Error::InvalidSpec(format!(
                    "ModelArtifact {field} {uri:?}: {rule}; in a cluster file:// URIs name files under the sources directory ({}), relative to it",
                    base.display()
                )))
            };
            let path = std::path::Path::new(rest);
            if rest.is_empty() || path.is_absolute() {
                return refuse("absolute paths are not allowed");
            }
            if path.components().any(|c| {
                !matches!(
                    c,
                    std::path::Component::Normal(_) | std::path::Component::CurDir
                )
            }) {
                return refuse("`..` is not allowed");
            }
            // A symlink inside the directory may not lead out of it. (A file that does not exist
            // yet is the fetch's to report.)
            if let (Ok(root), Ok(real)) = (base.canonicalize(), base.join(path).canonicalize())
                && !real.starts_with(&root)
            {
                return refuse(&format!(
                    "it leads out of the sources directory through a symlink (to {})",
                    real.display()
                ));
            }
        }
        Ok(())
    }

    fn resolve_relative(&mut self, base: &std::path::Path) {
        let m = &mut self.model.spec;
        let uris = std::iter::once(&mut m.source.uri)
            .chain(m.assets.iter_mut().map(|a| &mut a.uri))
            .chain(m.fixtures.iter_mut().map(|f| &mut f.uri));
        for uri in uris {
            if let Some(rest) = uri.strip_prefix("file://")
                && !rest.starts_with('/')
            {
                *uri = format!("file://{}", base.join(rest).display());
            }
        }
    }

    /// Parses a multi-document YAML string.
    pub fn parse(yaml: &str) -> Result<Self> {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(yaml)
            .map_err(|e| Error::spec_unreadable(format!("not valid YAML: {e}"), e))?;
        let mut model = None;
        let mut target = None;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let kind = doc
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or_default()
                .to_string();
            let name = doc
                .pointer("/metadata/name")
                .and_then(|k| k.as_str())
                .unwrap_or("<unnamed>")
                .to_string();
            let wrap =
                |e: serde_json::Error| Error::spec_unreadable(format!("{kind} {name}: {e}"), e);
            if matches!(kind.as_str(), "ModelArtifact" | "CompiledTarget") {
                super::schema::check(&kind, &doc)?;
            }
            match kind.as_str() {
                "ModelArtifact" if model.is_none() => {
                    model = Some(serde_json::from_value(doc).map_err(wrap)?)
                }
                "CompiledTarget" if target.is_none() => {
                    target = Some(serde_json::from_value(doc).map_err(wrap)?)
                }
                "ModelArtifact" | "CompiledTarget" => {
                    return Err(Error::InvalidSpec(format!(
                        "more than one {kind}; local mode runs one of each"
                    )));
                }
                other => {
                    return Err(Error::InvalidSpec(format!(
                        "unexpected document kind {other:?} ({name})"
                    )));
                }
            }
        }
        let model: ModelArtifact =
            model.ok_or_else(|| Error::InvalidSpec("no ModelArtifact document".into()))?;
        let target: CompiledTarget =
            target.ok_or_else(|| Error::InvalidSpec("no CompiledTarget document".into()))?;
        let spec = Self { model, target };
        spec.validate()?;
        Ok(spec)
    }

    /// The checks admission would make, and the cross-object ones it cannot.
    fn validate(&self) -> Result<()> {
        let cel = |what: &str, r: std::result::Result<(), kube::core::cel::ValidationErrors>| {
            r.map_err(|e| Error::InvalidSpec(format!("{what}: {e}")))
        };
        cel("ModelArtifact", kube::core::cel::validate_cel(&self.model))?;
        cel(
            "CompiledTarget",
            kube::core::cel::validate_cel(&self.target),
        )?;
        let m = &self.model.spec;
        let mut digests = vec![("spec.source.sha256".to_string(), &m.source.sha256)];
        digests.extend(
            m.assets
                .iter()
                .map(|a| (format!("spec.assets[{}].sha256", a.name), &a.sha256)),
        );
        digests.extend(
            m.fixtures
                .iter()
                .map(|f| (format!("spec.fixtures[{}].sha256", f.version), &f.sha256)),
        );
        for (field, digest) in digests {
            if digest.len() != 64
                || !digest
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(Error::InvalidSpec(format!(
                    "{field} must be 64 lowercase hex characters, got {digest:?}"
                )));
            }
        }
        if m.source.size < 1 {
            return Err(Error::InvalidSpec(
                "spec.source.size must be at least 1".into(),
            ));
        }
        let t = &self.target;
        let model_name = self.model.metadata.name.as_deref().unwrap_or_default();
        if t.spec.model_ref.name != model_name {
            return Err(Error::InvalidSpec(format!(
                "CompiledTarget modelRef.name is {:?} but the ModelArtifact is named {model_name:?}",
                t.spec.model_ref.name
            )));
        }
        kiln_crds::formats::accepts(t.spec.backend.kind, m.format).map_err(Error::InvalidSpec)?;
        if m.fixture(&t.spec.warmup.fixture_version).is_none() {
            return Err(Error::InvalidSpec(format!(
                "warmup.fixtureVersion {:?} is not among the ModelArtifact's fixtures {:?}",
                t.spec.warmup.fixture_version,
                m.fixtures.iter().map(|f| &f.version).collect::<Vec<_>>()
            )));
        }
        self.shapes().map(|_| ())
    }

    /// How long a foreign compiler may run: `spec.compile.activeDeadlineSeconds`.
    pub fn compile_timeout(&self) -> Option<std::time::Duration> {
        self.target
            .spec
            .compile
            .active_deadline_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(std::time::Duration::from_secs)
    }

    /// Profile name → input name → concrete shape, bounds-checked.
    pub fn shapes(&self) -> Result<BTreeMap<String, Shapes>> {
        self.target
            .spec
            .profiles
            .iter()
            .map(|p| {
                p.bind(&self.model.spec)
                    .map(|s| (p.name.clone(), s))
                    .map_err(|e| Error::InvalidSpec(e.to_string()))
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../examples/squeezenet/kiln.yaml");

    fn with_source(uri: &str, base: &std::path::Path) -> Result<Spec> {
        let s = Spec::parse(EXAMPLE).unwrap();
        let mut model = s.model;
        model.spec.source.uri = uri.to_string();
        Spec::from_objects(model, s.target, base)
    }

    #[test]
    fn an_unreadable_spec_keeps_its_cause() {
        use std::error::Error as _;
        let Err(err) = Spec::parse("kind: [unclosed") else {
            panic!("unclosed YAML parsed")
        };
        assert_eq!(err.reason(), kiln_crds::FailureReason::InvalidSpec);
        assert!(
            err.to_string()
                .starts_with("invalid spec: not valid YAML: "),
            "{err}"
        );
        assert!(err.source().is_some(), "the YAML error is kept: {err:?}");

        let missing = std::path::Path::new("/nonexistent/kiln/spec.yaml");
        let Err(err) = Spec::load(missing) else {
            panic!("a missing file loaded")
        };
        assert!(
            err.to_string()
                .starts_with("invalid spec: cannot read /nonexistent"),
            "{err}"
        );
        let io = err
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(io.map(|e| e.kind()), Some(std::io::ErrorKind::NotFound));
    }

    #[test]
    fn cluster_file_uris_stay_under_the_sources_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("sources");
        std::fs::create_dir_all(base.join("models")).unwrap();
        std::fs::write(tmp.path().join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), base.join("models/escape")).unwrap();
        std::os::unix::fs::symlink("model.onnx", base.join("models/alias")).unwrap();
        std::fs::write(base.join("models/model.onnx"), b"m").unwrap();

        let ok = with_source("file://models/model.onnx", &base).unwrap();
        assert_eq!(
            ok.model.spec.source.uri,
            format!("file://{}/models/model.onnx", base.display())
        );
        assert!(
            with_source("file://models/alias", &base).is_ok(),
            "a link inside is fine"
        );
        assert!(
            with_source("file://models/not-yet", &base).is_ok(),
            "the fetch reports it"
        );
        for (uri, rule) in [
            ("file:///etc/shadow", "absolute paths"),
            ("file://", "absolute paths"),
            ("file://../secret", "`..`"),
            ("file://models/../../secret", "`..`"),
            ("file://models/escape", "symlink"),
        ] {
            let err = with_source(uri, &base)
                .err()
                .unwrap_or_else(|| panic!("{uri} accepted"));
            assert_eq!(err.reason(), kiln_crds::FailureReason::InvalidSpec);
            let msg = err.to_string();
            assert!(
                msg.contains(rule) && msg.contains("spec.source.uri"),
                "{uri}: {msg}"
            );
        }
        // Local mode (a file on the user's machine) keeps absolute paths.
        let yaml = EXAMPLE.replace("file://model.onnx", "file:///srv/models/model.onnx");
        assert!(Spec::parse(&yaml).is_ok());
    }
}
