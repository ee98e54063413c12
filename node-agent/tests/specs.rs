//! The bad-spec corpus (`e2e/testdata/specs/`): every edit of a valid ModelArtifact +
//! CompiledTarget pair that the apiserver refuses (schema, strict field validation, CEL,
//! object names) is refused by local mode too, `InvalidSpec` naming the field; the valid edits are
//! accepted by both. e2e/tests/kiln-crds.sh applies the same corpus to the real apiserver.

use std::path::Path;

use kiln_engines::pipeline::spec::Spec;
use serde_json::Value;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/testdata/specs")
}

/// Sets `pointer` in `doc` (creating the last key of an object).
fn set(doc: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let parent = if parent.is_empty() {
        &mut *doc
    } else {
        doc.pointer_mut(parent)
            .unwrap_or_else(|| panic!("no {parent}"))
    };
    match parent {
        Value::Object(m) => {
            m.insert(key.to_string(), value);
        }
        Value::Array(a) => a[key.parse::<usize>().expect("index")] = value,
        other => panic!("{pointer}: parent is {other}"),
    }
}

fn delete(doc: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    doc.pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|m| m.remove(key))
        .unwrap_or_else(|| panic!("nothing at {pointer}"));
}

/// The base documents with `case`'s edits, as YAML (JSON documents).
fn edited(case: &Value) -> String {
    let base = std::fs::read_to_string(dir().join("base.yaml")).expect("base.yaml");
    let mut docs: Vec<Value> = serde_saphyr::from_str_multiple(&base).expect("base parses");
    let kind = case["doc"].as_str().expect("doc");
    let doc = docs
        .iter_mut()
        .find(|d| d["kind"] == kind)
        .expect("kind in base");
    for (pointer, value) in case["set"].as_object().into_iter().flatten() {
        set(doc, pointer, value.clone());
    }
    for pointer in case["delete"].as_array().into_iter().flatten() {
        delete(doc, pointer.as_str().expect("pointer"));
    }
    // Edits of the other document that local mode's cross-object checks need (a GGUF model for a
    // llamacpp target); the apiserver is given only `doc`, so they do not change its verdict.
    if let Some(other) = docs.iter_mut().find(|d| d["kind"] != kind) {
        for (pointer, value) in case["other"].as_object().into_iter().flatten() {
            set(other, pointer, value.clone());
        }
    }
    docs.iter()
        .map(|d| serde_json::to_string(d).expect("json"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[test]
fn local_mode_refuses_what_the_apiserver_refuses() {
    let corpus: Value = serde_json::from_str(
        &std::fs::read_to_string(dir().join("corpus.json")).expect("corpus.json"),
    )
    .expect("corpus json");
    let cases = corpus["cases"].as_array().expect("cases");
    assert!(cases.len() >= 60, "the corpus shrank: {}", cases.len());
    let mut wrong = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let result = Spec::parse(&edited(case));
        match (case["valid"].as_bool().unwrap_or(false), result) {
            (true, Ok(_)) => {}
            (true, Err(e)) => wrong.push(format!("{name}: refused: {e}")),
            (false, Ok(_)) => wrong.push(format!("{name}: accepted")),
            (false, Err(e)) => {
                let expect = case["expect"].as_str().expect("expect");
                let message = e.to_string();
                if e.reason() != kiln_crds::FailureReason::InvalidSpec || !message.contains(expect)
                {
                    wrong.push(format!(
                        "{name}: {:?} {message:?} lacks {expect:?}",
                        e.reason()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
