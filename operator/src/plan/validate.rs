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
        .or_else(|| format(target, model))
        .or_else(|| compile_request(target, &settings.compile_bounds))
        .or_else(|| fixture(target, model))
        .or_else(|| profiles(target, model))
        .or_else(|| source_signature(model, settings))
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

/// A backend no compile worker has (the agent image's or the GPU agent image's). A foreign
/// (`exec`) compiler's output is built and served by the built-in runtime, so that runtime must
/// be there.
fn backend(target: &CompiledTarget, settings: &Settings) -> Option<Invalid> {
    let kind = &target.spec.backend.kind;
    let runtimes = settings.workers.runtimes();
    if runtimes.contains(kind.runtime().as_str()) {
        return None;
    }
    let available = runtimes.into_iter().collect::<Vec<_>>().join(", ");
    Some(Invalid {
        reason: reasons::BACKEND_UNAVAILABLE,
        message: format!(
            "backend {:?} is not available to this operator's compile workers (available: {available}, and exec with a compiler image); use one of those",
            kind.as_str()
        ),
    })
}

/// A model format the backend kind cannot take (GGUF only on llamacpp, and the reverse).
fn format(target: &CompiledTarget, model: &ModelArtifact) -> Option<Invalid> {
    let refused = kiln_crds::formats::accepts(target.spec.backend.kind, model.spec.format).err()?;
    Some(Invalid {
        reason: reasons::BACKEND_UNAVAILABLE,
        message: refused,
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

/// An unsigned source where the operator requires signatures: refused before the store is
/// consulted, so an artifact built from it earlier is not reused either.
fn source_signature(model: &ModelArtifact, settings: &Settings) -> Option<Invalid> {
    (settings.require_source_signature && model.spec.source.signature.is_none()).then(|| Invalid {
        reason: kiln_crds::FailureReason::SignatureInvalid.as_str(),
        message: format!(
            "ModelArtifact {}'s spec.source has no signature and this cluster requires one \
             (--require-source-signature); sign the source with cosign sign-blob --key and set \
             spec.source.signature in a new ModelArtifact",
            model.metadata.name.as_deref().unwrap_or_default()
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

/// Resources and tolerations of the compile Jobs within the operator's bounds: a tenant cannot
/// ask for a node's whole memory, every GPU, or to land on nodes tainted for someone else.
fn compile_request(target: &CompiledTarget, bounds: &super::CompileBounds) -> Option<Invalid> {
    let refuse = |message: String| {
        Some(Invalid {
            reason: reasons::COMPILE_REQUEST_REFUSED,
            message,
        })
    };
    let c = &target.spec.compile;
    if let Some(r) = &c.resources {
        for (which, map) in [("requests", &r.requests), ("limits", &r.limits)] {
            for (name, q) in map.iter().flatten() {
                let (parsed, max, unit) = match name.as_str() {
                    "memory" => (quantity(&q.0, 1.0), bounds.max_memory_bytes, "bytes"),
                    "cpu" => (quantity(&q.0, 1000.0), bounds.max_cpu_millis, "millicores"),
                    "nvidia.com/gpu" => (quantity(&q.0, 1.0), bounds.max_gpus, "GPUs"),
                    "ephemeral-storage" => continue,
                    other => {
                        return refuse(format!(
                            "spec.compile.resources.{which}.{other}: compile Jobs may ask for cpu, memory, ephemeral-storage and nvidia.com/gpu only"
                        ));
                    }
                };
                match parsed {
                    Some(v) if v <= max as f64 => {}
                    Some(_) => {
                        return refuse(format!(
                            "spec.compile.resources.{which}.{name} is {}, above this cluster's bound of {max} {unit} for a compile Job (the operator's --compile-max-* flags); ask for less",
                            q.0
                        ));
                    }
                    None => {
                        return refuse(format!(
                            "spec.compile.resources.{which}.{name} {:?} is not a Kubernetes quantity",
                            q.0
                        ));
                    }
                }
            }
        }
    }
    let allowed = |key: &str| bounds.toleration_keys.iter().any(|k| k == "*" || k == key);
    for (i, t) in c.tolerations.iter().enumerate() {
        let key = t.key.as_deref().unwrap_or("");
        if !allowed(key) {
            let what = if key.is_empty() {
                "has no key, so it tolerates every taint".to_string()
            } else {
                format!("key {key:?} is not allowed")
            };
            return refuse(format!(
                "spec.compile.tolerations[{i}] {what}; compile Jobs may tolerate only {:?} (the operator's --compile-toleration-keys)",
                bounds.toleration_keys
            ));
        }
    }
    None
}

/// A Kubernetes quantity (`512Mi`, `1.5G`, `500m`, `2e9`) in base units times `scale`.
pub fn quantity(s: &str, scale: f64) -> Option<f64> {
    let s = s.trim();
    let suffixes: [(&str, f64); 14] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (number, factor) = suffixes
        .iter()
        .find_map(|(suffix, f)| s.strip_suffix(suffix).map(|n| (n, *f)))
        .or_else(|| s.strip_suffix('E').map(|n| (n, 1e18)))
        .unwrap_or((s, 1.0));
    let v: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
    Some(v * factor * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsigned_source_is_refused_only_where_signatures_are_required() {
        let mut model: ModelArtifact = serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1", "kind": "ModelArtifact",
            "metadata": {"name": "m", "namespace": "ml"},
            "spec": {"source": {"uri": "https://x/m.onnx", "sha256": "a".repeat(64), "size": 1},
                     "format": "onnx", "inputs": [{"name": "x", "dtype": "f32", "dims": [{"size": 1}]}],
                     "fixtures": [{"version": "v1", "uri": "https://x/f", "sha256": "b".repeat(64)}]}
        }))
        .expect("model");
        let mut settings = Settings::default();
        assert!(source_signature(&model, &settings).is_none());
        settings.require_source_signature = true;
        let refused = source_signature(&model, &settings).expect("refused");
        assert_eq!(refused.reason, "SignatureInvalid");
        assert!(
            refused.message.contains("ModelArtifact m"),
            "{}",
            refused.message
        );
        model.spec.source.signature = Some("MEUCIQ==".into());
        assert!(source_signature(&model, &settings).is_none());
    }

    #[test]
    fn compile_requests_are_bounded() {
        let b = super::super::CompileBounds::default();
        let with = |json: serde_json::Value| {
            let mut t = target();
            t.spec.compile = serde_json::from_value(json).expect("compile");
            compile_request(&t, &b).map(|i| (i.reason, i.message))
        };
        assert_eq!(with(serde_json::json!({})), None);
        assert_eq!(
            with(
                serde_json::json!({"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"}},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]})
            ),
            None
        );
        for (json, needle) in [
            (
                serde_json::json!({"resources": {"limits": {"memory": "65Gi"}}}),
                "limits.memory is 65Gi",
            ),
            (
                serde_json::json!({"resources": {"requests": {"memory": "1e12"}}}),
                "requests.memory",
            ),
            (
                serde_json::json!({"resources": {"requests": {"cpu": "33"}}}),
                "requests.cpu is 33",
            ),
            (
                serde_json::json!({"resources": {"limits": {"nvidia.com/gpu": "8"}}}),
                "nvidia.com/gpu is 8",
            ),
            (
                serde_json::json!({"resources": {"limits": {"memory": "lots"}}}),
                "not a Kubernetes quantity",
            ),
            (
                serde_json::json!({"resources": {"limits": {"example.com/fpga": "1"}}}),
                "example.com/fpga",
            ),
            (
                serde_json::json!({"tolerations": [{"operator": "Exists"}]}),
                "tolerates every taint",
            ),
            (
                serde_json::json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}),
                "control-plane",
            ),
        ] {
            let (reason, message) = with(json.clone()).unwrap_or_else(|| panic!("{json} accepted"));
            assert_eq!(reason, reasons::COMPILE_REQUEST_REFUSED);
            assert!(message.contains(needle), "{message}");
        }
        assert_eq!(quantity("1.5Gi", 1.0), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(quantity("250m", 1000.0), Some(250.0));
        assert_eq!(quantity("-1", 1.0), None);
    }

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
