//! Local mode validates a file the way the apiserver validates `kubectl apply`: apiVersion and
//! kind, `metadata.name` a DNS-1123 subdomain, and the CRD's own OpenAPI v3 schema (generated
//! from the same Rust types, so it cannot drift) with unknown fields refused, as kubectl's
//! strict field validation does. Types, required fields, bounds, lengths, patterns and enums
//! all come from the schema; the CEL rules run next in [`super::spec`]. What `local` accepts
//! the cluster accepts, and the error names the field path.
//! Pure: values in, an error out.

use std::sync::OnceLock;

use kiln_crds::{CompiledTarget, ModelArtifact};
use kube::CustomResourceExt;
use serde_json::Value;

use kiln_node_core::error::{Error, Result};

/// The group/version every kiln object is served under.
const API_VERSION: &str = "kiln.dev/v1alpha1";
/// Errors quoted in one message.
const MAX_ERRORS: usize = 8;

/// Checks one document of kind `kind` (`ModelArtifact` or `CompiledTarget`).
pub fn check(kind: &str, doc: &Value) -> Result<()> {
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let refuse = |errors: Vec<String>| {
        Error::InvalidSpec(format!(
            "{kind} {name}: {} validation error(s), as the apiserver would report them:\n  - {}",
            errors.len(),
            errors.join("\n  - ")
        ))
    };
    let api_version = doc.get("apiVersion").and_then(Value::as_str);
    if api_version != Some(API_VERSION) {
        return Err(refuse(vec![format!(
            "apiVersion: {:?}, expected {API_VERSION:?}",
            api_version.unwrap_or("")
        )]));
    }
    if let Err(e) = dns_subdomain(doc.pointer("/metadata/name").and_then(Value::as_str)) {
        return Err(refuse(vec![format!("metadata.name: {e}")]));
    }
    let validator = match kind {
        "ModelArtifact" => validators().0.as_ref(),
        "CompiledTarget" => validators().1.as_ref(),
        other => return Err(Error::InvalidSpec(format!("no schema for kind {other:?}"))),
    }
    .map_err(|e| Error::InvalidSpec(format!("the {kind} schema does not compile: {e}")))?;
    // The schema describes spec and status; metadata and type meta were checked above.
    let mut body = doc.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
    }
    let errors: Vec<String> = validator
        .iter_errors(&body)
        .take(MAX_ERRORS)
        .map(|e| format!("{}: {e}", field_path(e.instance_path().as_str())))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(refuse(errors))
    }
}

type Compiled = std::result::Result<jsonschema::Validator, String>;

/// The two validators, built once from the CRDs.
fn validators() -> &'static (Compiled, Compiled) {
    static V: OnceLock<(Compiled, Compiled)> = OnceLock::new();
    V.get_or_init(|| {
        (
            validator(ModelArtifact::crd()),
            validator(CompiledTarget::crd()),
        )
    })
}

fn validator(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Compiled {
    let schema = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .ok_or("the CRD has no openAPIV3Schema")?;
    let mut schema = serde_json::to_value(schema).map_err(|e| e.to_string())?;
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.remove("metadata");
        props.remove("apiVersion");
        props.remove("kind");
    }
    structural(&mut schema);
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(&schema)
        .map_err(|e| e.to_string())
}

/// OpenAPI v3 as the apiserver reads it, in JSON Schema terms: `nullable` allows null, and an
/// object with declared properties allows no others (unless it preserves unknown fields).
fn structural(schema: &mut Value) {
    let Value::Object(m) = schema else { return };
    if m.get("nullable") == Some(&Value::Bool(true))
        && let Some(Value::String(t)) = m.get("type").cloned()
    {
        m.insert("type".into(), serde_json::json!([t, "null"]));
    }
    let preserve = m.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if m.contains_key("properties") && !m.contains_key("additionalProperties") && !preserve {
        m.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "patternProperties"] {
        if let Some(Value::Object(props)) = m.get_mut(key) {
            props.values_mut().for_each(structural);
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(sub) = m.get_mut(key) {
            structural(sub);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(subs)) = m.get_mut(key) {
            subs.iter_mut().for_each(structural);
        }
    }
}

/// `/spec/inputs/0/dims` → `spec.inputs[0].dims`.
fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').filter(|s| !s.is_empty()) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if seg.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg);
        }
    }
    if out.is_empty() { "(root)".into() } else { out }
}

/// A Kubernetes object name: a DNS-1123 subdomain.
fn dns_subdomain(name: Option<&str>) -> std::result::Result<(), String> {
    let name = name.ok_or("required")?;
    if !kiln_crds::names::is_dns1123_subdomain(name) {
        return Err(format!(
            "{name:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253 characters, starting and ending alphanumeric)"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_names() {
        assert_eq!(field_path("/spec/inputs/0/dims"), "spec.inputs[0].dims");
        assert_eq!(field_path(""), "(root)");
        assert!(dns_subdomain(Some("mlp-cpu.v1")).is_ok());
        for bad in ["../x", "UPPER", "-a", "a-", "", "a..b", &"a".repeat(254)] {
            assert!(dns_subdomain(Some(bad)).is_err(), "{bad}");
        }
        assert!(dns_subdomain(None).is_err());
    }

    #[test]
    fn both_schemas_compile() {
        assert!(
            validators().0.is_ok(),
            "{:?}",
            validators().0.as_ref().err()
        );
        assert!(
            validators().1.is_ok(),
            "{:?}",
            validators().1.as_ref().err()
        );
    }
}
