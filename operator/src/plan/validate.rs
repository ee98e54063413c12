//! Stage 1: can the spec be acted on at all? The model reference, the backend, the warmup
//! fixture and the shape profiles, checked in that order; the first problem wins. Reads the
//! target, its model and the settings; decides nothing about nodes or Jobs. Pure.

use kiln_crds::conditions::reasons;
use kiln_crds::{CompiledTarget, ModelArtifact};

use super::{ModelLookup, Settings};

/// Why the spec cannot be acted on, in words that say what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Condition reason ([`reasons`]).
    pub reason: &'static str,
    /// What is wrong and what to do about it.
    pub message: String,
}

/// The model to compile, or the first problem of the spec.
pub fn check<'a>(
    target: &CompiledTarget,
    model: &'a ModelLookup,
    settings: &Settings,
) -> Result<&'a ModelArtifact, Invalid> {
    let model = model_of(target, model)?;
    match backend(target, settings)
        .or_else(|| fixture(target, model))
        .or_else(|| profiles(target, model))
    {
        Some(invalid) => Err(invalid),
        None => Ok(model),
    }
}

fn namespace(target: &CompiledTarget) -> &str {
    target.metadata.namespace.as_deref().unwrap_or("default")
}

/// The model, when the reference is to one in the target's namespace that exists.
fn model_of<'a>(
    target: &CompiledTarget,
    model: &'a ModelLookup,
) -> Result<&'a ModelArtifact, Invalid> {
    let t = &target.spec;
    let ns = namespace(target);
    if let Some(other) = t.model_ref.namespace.as_deref().filter(|m| *m != ns) {
        return Err(Invalid {
            reason: reasons::MODEL_IN_OTHER_NAMESPACE,
            message: format!(
                "spec.modelRef.namespace is {other:?}, but a CompiledTarget may only use a ModelArtifact in its own namespace {ns:?}; copy the ModelArtifact into {ns:?} and drop modelRef.namespace"
            ),
        });
    }
    match model {
        ModelLookup::Found(m) => Ok(m),
        ModelLookup::Missing => Err(Invalid {
            reason: reasons::MODEL_NOT_FOUND,
            message: format!(
                "ModelArtifact {ns}/{} does not exist; create it or fix spec.modelRef.name",
                t.model_ref.name
            ),
        }),
    }
}

/// A backend the compile workers do not have. A foreign (`exec`) compiler's output is built
/// and served by the built-in runtime, so that runtime must be there.
fn backend(target: &CompiledTarget, settings: &Settings) -> Option<Invalid> {
    let kind = &target.spec.backend.kind;
    if settings
        .backend_versions
        .contains_key(kind.runtime().as_str())
    {
        return None;
    }
    let available = settings
        .backend_versions
        .keys()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    Some(Invalid {
        reason: reasons::BACKEND_UNAVAILABLE,
        message: format!(
            "backend {:?} is not available to this operator's compile workers (available: {available}, and exec with a compiler image); use one of those",
            kind.as_str()
        ),
    })
}

/// A warmup fixture version the model does not list.
fn fixture(target: &CompiledTarget, model: &ModelArtifact) -> Option<Invalid> {
    let t = &target.spec;
    if model.spec.fixture(&t.warmup.fixture_version).is_some() {
        return None;
    }
    Some(Invalid {
        reason: reasons::FIXTURE_NOT_FOUND,
        message: format!(
            "spec.warmup.fixtureVersion {:?} is not among ModelArtifact {}'s fixtures {:?}; add the fixture or pick a listed version",
            t.warmup.fixture_version,
            t.model_ref.name,
            model
                .spec
                .fixtures
                .iter()
                .map(|f| &f.version)
                .collect::<Vec<_>>()
        ),
    })
}

/// The first shape profile that does not bind the model's symbolic dims.
fn profiles(target: &CompiledTarget, model: &ModelArtifact) -> Option<Invalid> {
    target.spec.profiles.iter().find_map(|p| {
        p.bind(&model.spec).err().map(|e| Invalid {
            reason: reasons::INVALID_PROFILE,
            message: e.to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> CompiledTarget {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1",
            "kind": "CompiledTarget",
            "metadata": {"name": "t", "namespace": "ml"},
            "spec": {"modelRef": {"name": "m"}, "backend": {"kind": "tract"},
                     "profiles": [{"name": "p", "dims": {"batch": 1}}],
                     "warmup": {"fixtureVersion": "v1"}},
        }))
        .expect("target")
    }

    #[test]
    fn the_first_problem_in_reference_backend_fixture_profile_order_wins() {
        let mut t = target();
        t.spec.model_ref.namespace = Some("other".into());
        t.spec.backend.kind = kiln_crds::compiled_target::BackendKind::Tensorrt;
        let reason = |t: &CompiledTarget, m: &ModelLookup, s: &Settings| {
            check(t, m, s).err().map(|i| i.reason)
        };
        let s = Settings::default();
        // Another namespace is reported before a missing model or an unavailable backend.
        assert_eq!(
            reason(&t, &ModelLookup::Missing, &s),
            Some(reasons::MODEL_IN_OTHER_NAMESPACE)
        );
        t.spec.model_ref.namespace = None;
        let missing = check(&t, &ModelLookup::Missing, &s).expect_err("missing model");
        assert_eq!(missing.reason, reasons::MODEL_NOT_FOUND);
        assert!(
            missing.message.contains("ModelArtifact ml/m"),
            "{}",
            missing.message
        );
    }
}
