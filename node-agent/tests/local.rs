//! `kiln-agent local` end to end on real ONNX files: the ready path, reuse, and every bad input
//! the issue names, each with its classified reason, a message that says what to fix, and
//! nothing served or stored that should not be.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use common::signing::{ensured, ran, signature_field, signing_material};
use common::{AGENT, Case, HttpsServer, data, metric, run_local};
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_store::staged::{sha256_bytes, sha256_file};
use serde_json::Value;

#[test]
fn example_is_ready_then_reused_from_the_store() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let yaml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/squeezenet/kiln.yaml");
    let (store, metrics) = (tmp.path().join("store"), tmp.path().join("m.prom"));
    let first = run_local(&yaml, &store, &metrics);
    assert!(first.success, "{}", first.stderr);
    let o = &first.outcome;
    assert_eq!(o["ready"], true);
    assert_eq!(o["cacheHit"], false);
    let key = o["compileKey"].as_str().expect("key");
    let digest = o["artifactDigest"].as_str().expect("digest");
    let artifact = store.join("artifacts").join(key).join("artifact");
    assert_eq!(
        sha256_file(&artifact).expect("hash").0,
        digest,
        "reported digest is the stored bytes' digest"
    );
    for field in [
        "parityMaxAbsError",
        "loadSeconds",
        "warmupSeconds",
        "p50Seconds",
        "p99Seconds",
    ] {
        assert!(o[field].as_f64().is_some_and(|v| v >= 0.0), "{field}: {o}");
    }
    assert!(o["p99Seconds"].as_f64() >= o["p50Seconds"].as_f64());
    let class = o["class"].as_str().expect("class");
    let m = std::fs::read_to_string(&metrics).expect("metrics");
    assert_eq!(
        metric(&m, &format!("kiln_agent_ready{{class=\"{class}\"}}")),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "kiln_agent_compiles_total{backend=\"tract\",result=\"success\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            &format!("kiln_agent_warmup_seconds_count{{class=\"{class}\"}}")
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            &format!("kiln_agent_fixture_latency_seconds_count{{class=\"{class}\"}}")
        ),
        Some(20.0)
    );

    let second = run_local(&yaml, &store, &metrics);
    assert!(second.success, "{}", second.stderr);
    assert_eq!(second.outcome["cacheHit"], true);
    assert_eq!(second.outcome["compileKey"], key);
    assert_eq!(second.outcome["artifactDigest"], digest);
    assert!(
        second.stderr.contains("not compiling"),
        "the reuse is said: {}",
        second.stderr
    );
    let m = std::fs::read_to_string(&metrics).expect("metrics");
    assert_eq!(
        metric(
            &m,
            "kiln_agent_compiles_total{backend=\"tract\",result=\"cached\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            "kiln_agent_compiles_total{backend=\"tract\",result=\"success\"}"
        ),
        None
    );
}

#[test]
fn embedded_default_runs_with_no_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new(AGENT)
        .args(["local", "--store"])
        .arg(tmp.path())
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("READY squeezenet-cpu"), "{stdout}");
}

#[test]
fn symbolic_batch_profile_is_ready_and_compiles_reproducibly() {
    let case = Case::mlp(4);
    let run = case.run();
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    // Same inputs in another store: same key, byte-identical artifact.
    let other = Case::mlp(4);
    let again = other.run();
    assert_eq!(run.outcome["compileKey"], again.outcome["compileKey"]);
    assert_eq!(
        run.outcome["artifactDigest"],
        again.outcome["artifactDigest"]
    );
}

#[test]
fn wrong_sha256_fails_closed_and_stores_nothing() {
    let mut case = Case::mlp(4);
    case.model_sha = "0".repeat(64);
    case.run().fails_with(
        "HashMismatch",
        &["model source", "sha256 is", "the spec declares"],
    );
    assert!(case.stored().is_empty());
    let blobs: Vec<_> = std::fs::read_dir(case.store().join("blobs"))
        .expect("blobs")
        .collect();
    assert!(
        blobs.is_empty(),
        "no partial or unverified blob is left: {blobs:?}"
    );
    let m = case.metrics();
    assert_eq!(
        metric(
            &m,
            "kiln_agent_verify_failures_total{reason=\"HashMismatch\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, "kiln_agent_failures_total{reason=\"HashMismatch\"}"),
        Some(1.0)
    );
}

#[test]
fn truncated_source_is_detected() {
    let case = Case::mlp(4);
    let bytes = std::fs::read(case.path("model.onnx")).expect("read");
    std::fs::write(case.path("model.onnx"), &bytes[..bytes.len() / 2]).expect("truncate");
    case.run().fails_with(
        "HashMismatch",
        &[
            "truncated",
            &format!("of the declared {} bytes", bytes.len()),
        ],
    );
    assert!(case.stored().is_empty());
}

#[test]
fn missing_source_is_unavailable() {
    let case = Case::mlp(4);
    std::fs::remove_file(case.path("model.onnx")).expect("rm");
    case.run().fails_with("SourceUnavailable", &["model.onnx"]);
}

#[test]
fn unreadable_onnx_is_a_compile_failure() {
    let mut case = Case::mlp(4);
    let garbage = b"this is not a protobuf, it is a sentence".repeat(10);
    std::fs::write(case.path("model.onnx"), &garbage).expect("write");
    case.model_sha = sha256_bytes(&garbage);
    case.model_size = garbage.len() as u64;
    case.run()
        .fails_with("CompileFailed", &["cannot read ONNX model"]);
    assert!(case.stored().is_empty());
}

#[test]
fn unsupported_operator_is_listed_by_name() {
    let mut case = Case::mlp(4);
    std::fs::copy(data("unsupported.onnx"), case.path("model.onnx")).expect("copy");
    let (sha, size) = sha256_file(&case.path("model.onnx")).expect("hash");
    (case.model_sha, case.model_size) = (sha, size);
    // Declared as the graph is (x: f32[1, 4, 9]), so the operator is what fails.
    case.input = ("x", "f32", "{size: 4}, {size: 9}");
    case.run()
        .fails_with("UnsupportedOperator", &["Col2Im (node \"y\")"]);
    assert!(case.stored().is_empty());
}

/// A case running `file` from tests/data in place of the MLP.
fn case_of(file: &str) -> Case {
    let mut case = Case::mlp(1);
    std::fs::copy(data(file), case.path("model.onnx")).expect("copy");
    (case.model_sha, case.model_size) = sha256_file(&case.path("model.onnx")).expect("hash");
    case
}

#[test]
fn a_detector_whose_file_states_shapes_in_its_own_symbols_is_ready() {
    // The exporter's value_info says `batch,16,(height+1)/2,…`; tract unified that with the
    // profile's numbers and failed ("Impossible to unify Sym(batch) with Val(1)").
    let mut case = case_of("detector.onnx");
    case.input = (
        "images",
        "f32",
        "{size: 3}, {symbol: height, min: 32, max: 640}, {symbol: width, min: 32, max: 640}",
    );
    case.batch = 2;
    case.profile_extra = ", height: 64, width: 48".into();
    case.fixture_shaped(&case.path("model.onnx"), "images", vec![2, 3, 64, 48]);
    assert_eq!(case.fixture().outputs["output0"].shape, [2, 8, 16, 12]);
    let run = case.run();
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert_eq!(run.outcome["ready"], true, "{}", run.outcome);
}

#[test]
fn an_if_the_profile_decides_compiles_to_the_branch_it_picks() {
    // y = Relu(x) for one row, else Neg(x): the condition reads only a shape, which each
    // profile fixes, so tract keeps one branch; the reference execution runs the `If` itself.
    for (batch, negated) in [(1, false), (4, true)] {
        let mut case = case_of("if-shape.onnx");
        case.batch = batch;
        case.fixture_from(&case.path("model.onnx"), batch as usize);
        let fixture = case.fixture();
        let (x, y) = (&fixture.inputs["x"].data, &fixture.outputs["y"].data);
        let floats = |b: &[u8]| -> Vec<f32> {
            b.chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("f32")))
                .collect()
        };
        let want: Vec<f32> = floats(x)
            .into_iter()
            .map(|v| if negated { -v } else { v.max(0.0) })
            .collect();
        assert_eq!(floats(y), want, "batch {batch}");
        let run = case.run();
        assert!(
            run.success,
            "batch {batch}: {}\n{}",
            run.message(),
            run.stderr
        );
    }
}

#[test]
fn profile_outside_bounds_is_invalid() {
    let mut case = Case::mlp(4);
    case.batch = 9;
    case.run()
        .fails_with("InvalidSpec", &["batch=9", "outside [1, 8]"]);
}

#[test]
fn fixture_that_does_not_match_the_model_is_invalid() {
    // Fixture made for 2 rows, profile compiles 4.
    let case = Case::mlp(2);
    case.run()
        .fails_with("InvalidSpec", &["fixture v1", "match no compiled profile"]);
    assert!(case.stored().is_empty());
}

#[test]
fn parity_outside_tolerance_names_the_output_and_stores_nothing() {
    let mut case = Case::mlp(4);
    let mut fixture = case.fixture();
    let y = fixture.outputs.get_mut("y").expect("golden y");
    // Shift the third element by 0.25: far outside atol 1e-5 + rtol 1e-4.
    let mut v = f32::from_le_bytes(y.data[8..12].try_into().expect("4 bytes"));
    v += 0.25;
    y.data[8..12].copy_from_slice(&v.to_le_bytes());
    case.write_fixture(&fixture);
    case.run()
        .fails_with("ParityExceeded", &["output y", "element 2", "atol 0.00001"]);
    assert!(
        case.stored().is_empty(),
        "an artifact that fails parity is never stored"
    );
}

/// Converts an f32 tensor to f64, keeping its values.
fn widened(
    t: &kiln_engines::backend::tensor::HostTensor,
) -> kiln_engines::backend::tensor::HostTensor {
    kiln_engines::backend::tensor::HostTensor {
        dtype: safetensors::Dtype::F64,
        shape: t.shape.clone(),
        data: t
            .to_f64()
            .expect("f64")
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    }
}

#[test]
fn non_finite_golden_is_refused_unless_the_output_allows_it() {
    // y = sqrt(x): the seeded fixture's negative inputs give golden NaNs.
    let mut case = Case::model("two-outputs.onnx", 4);
    case.run().fails_with(
        "InvalidSpec",
        &[
            "fixture v1",
            "output y",
            "is NaN",
            "regenerate the fixture",
            "warmup.outputs[name=y].allowNonFinite: true",
        ],
    );
    assert!(
        case.stored().is_empty(),
        "nothing is compiled into the store"
    );

    case.warmup_extra =
        "\n    outputs: [{name: \"y\", atol: 1.0e-5, rtol: 1.0e-4, allowNonFinite: true}]".into();
    let run = case.run();
    assert!(run.success, "{}", run.message());
    assert_eq!(run.outcome["ready"], true);

    // Allowing non-finite values loosens nothing else: where the model gives NaN, a finite
    // golden value still fails (a golden NaN against a number is in warmup.rs's unit tests).
    let mut fixture = case.fixture();
    let y = fixture.outputs.get_mut("y").expect("golden y");
    let values = y.to_f64().expect("f64");
    let nan_at = values.iter().position(|v| v.is_nan()).expect("a NaN");
    y.data[nan_at * 4..nan_at * 4 + 4].copy_from_slice(&0.0f32.to_le_bytes());
    case.write_fixture(&fixture);
    let _ = std::fs::remove_dir_all(case.store());
    case.run().fails_with(
        "ParityExceeded",
        &["output y", &format!("element {nan_at} is NaN")],
    );
    assert!(case.stored().is_empty());
}

#[test]
fn output_without_golden_value_is_refused_unless_excluded() {
    let mut case = Case::model("two-outputs.onnx", 4);
    let mut fixture = case.fixture();
    fixture.outputs.remove("abs").expect("golden abs");
    case.write_fixture(&fixture);
    let allow = "\n    outputs: [{name: \"y\", atol: 1.0e-5, rtol: 1.0e-4, allowNonFinite: true}]";
    case.warmup_extra = allow.into();
    case.run().fails_with(
        "InvalidSpec",
        &[
            "produces [\"abs\"]",
            "fixture v1 has no golden value",
            "warmup.excludeOutputs",
        ],
    );
    assert!(
        case.stored().is_empty(),
        "nothing is compiled into the store"
    );

    case.warmup_extra = format!("{allow}\n    excludeOutputs: [abs]");
    let run = case.run();
    assert!(run.success, "{}", run.message());
    assert_eq!(run.outcome["ready"], true);

    // An exclusion of an output the model does not produce is stale, not silently ignored.
    case.warmup_extra = format!("{allow}\n    excludeOutputs: [abs, logits]");
    let _ = std::fs::remove_dir_all(case.store());
    case.run().fails_with(
        "InvalidSpec",
        &["excludeOutputs names [\"logits\"]", "remove"],
    );
    assert!(case.stored().is_empty());
}

#[test]
fn fixture_input_dtype_other_than_the_graph_is_invalid() {
    let mut case = Case::mlp(4);
    let mut fixture = case.fixture();
    let x = widened(&fixture.inputs["x"]);
    fixture.inputs.insert("x".into(), x);
    case.write_fixture(&fixture);
    case.run().fails_with(
        "InvalidSpec",
        &[
            "fixture v1",
            "input x is F64 in the fixture, F32 in the graph",
        ],
    );
    assert!(case.stored().is_empty());
}

#[test]
fn golden_output_dtype_other_than_the_graph_is_invalid() {
    let mut case = Case::mlp(4);
    let mut fixture = case.fixture();
    let y = widened(&fixture.outputs["y"]);
    fixture.outputs.insert("y".into(), y);
    case.write_fixture(&fixture);
    case.run().fails_with(
        "InvalidSpec",
        &["output y is F32 in the graph but F64 in fixture v1"],
    );
    assert!(case.stored().is_empty());
}

#[test]
fn declared_interface_must_match_the_graph() {
    let mut case = Case::mlp(4);
    case.model_extra = "\n  outputs: [{name: \"y\", dtype: f32, dims: [{symbol: batch, min: 1, max: 8}, {size: 10}]}]".into();
    let run = case.run();
    assert!(run.success, "declared as the graph is: {}", run.message());
    let _ = std::fs::remove_dir_all(case.store());

    case.input = ("input", "f32", "{size: 16}");
    case.run().fails_with(
        "InvalidSpec",
        &["spec.inputs names {\"input\"}", "undeclared: [\"x\"]"],
    );
    assert!(
        case.stored().is_empty(),
        "nothing is compiled into the store"
    );

    case.input = ("x", "i64", "{size: 16}");
    case.run().fails_with(
        "InvalidSpec",
        &["spec.inputs[0] (x).dtype is I64, the graph's is F32"],
    );
    assert!(case.stored().is_empty());

    case.input = ("x", "f32", "{size: 16}");
    case.model_extra = "\n  outputs: [{name: \"y\", dtype: f32, dims: [{symbol: batch, min: 1, max: 8}, {size: 1000}]}]".into();
    case.run().fails_with(
        "InvalidSpec",
        &["spec.outputs[0] (y).dims[1].size is 1000, the graph's dim is 10"],
    );
    assert!(case.stored().is_empty());
}

#[test]
fn corrupt_stored_artifact_is_detected_before_load() {
    let case = Case::mlp(4);
    let run = case.run();
    assert!(run.success, "{}", run.message());
    let artifact = case
        .store()
        .join("artifacts")
        .join(run.outcome["compileKey"].as_str().expect("key"))
        .join("artifact");
    let mut bytes = std::fs::read(&artifact).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&artifact, &bytes).expect("corrupt");
    let run = case.run();
    run.fails_with("HashMismatch", &["stored artifact", "corrupt", "delete"]);
    assert!(run.outcome["loadSeconds"].is_null(), "nothing was loaded");
    assert_eq!(
        metric(
            &case.metrics(),
            "kiln_agent_verify_failures_total{reason=\"HashMismatch\"}"
        ),
        Some(1.0)
    );
}

/// With no key given, a local store signs its entries with a key of its own (created on first
/// use, 0600, in the store's root): an artifact and manifest rewritten together by someone
/// without that key are refused, rebuilt from the verified sources and replaced, never served.
#[test]
fn local_store_signs_itself_and_refuses_a_consistent_rewrite() {
    use std::os::unix::fs::PermissionsExt;
    let case = Case::mlp(4);
    let first = case.run();
    assert!(first.success, "{}", first.message());
    let key_file = case.store().join("signing.key");
    let mode = std::fs::metadata(&key_file)
        .expect("key created")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the key is its owner's only");
    let key = first.outcome["compileKey"]
        .as_str()
        .expect("key")
        .to_string();
    let good = first.outcome["artifactDigest"]
        .as_str()
        .expect("digest")
        .to_string();
    let entry = case.store().join("artifacts").join(&key);
    assert!(
        std::fs::read_dir(&entry)
            .expect("entry")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("attestation-")),
        "the entry is signed"
    );
    let again = case.run();
    assert_eq!(again.outcome["cacheHit"], true, "{}", again.message());

    // Artifact and manifest rewritten together: every digest agrees with itself.
    rewrite_consistently(&entry);
    let rebuilt = case.run();
    assert!(rebuilt.success, "{}", rebuilt.message());
    assert_eq!(
        rebuilt.outcome["cacheHit"], false,
        "the rewrite is never a cache hit"
    );
    assert_eq!(rebuilt.outcome["artifactDigest"], good.as_str());
    assert!(
        rebuilt.stderr.contains("refusing the stored entry"),
        "{}",
        rebuilt.stderr
    );

    // A key others can read is not used.
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    case.run()
        .fails_with("SignatureInvalid", &["signing.key", "mode 0644"]);
}

#[test]
fn store_entry_rewritten_whole_is_refused_by_its_attestation_and_rebuilt() {
    let case = Case::mlp(4);
    let keys = case.path("keys");
    let out = Command::new(AGENT)
        .arg("keygen")
        .arg(&keys)
        .output()
        .expect("keygen");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (signing, public) = (keys.join("signing.key"), keys.join("signing.pub"));
    let publisher = [("KILN_SIGNING_KEY", signing.as_path())];
    let node = [("KILN_TRUST_KEY", public.as_path())];

    let first = case.run_with_env(&publisher);
    assert!(first.success, "{}", first.message());
    let key = first.outcome["compileKey"]
        .as_str()
        .expect("key")
        .to_string();
    let good_digest = first.outcome["artifactDigest"]
        .as_str()
        .expect("digest")
        .to_string();
    let entry = case.store().join("artifacts").join(&key);
    let signed: Vec<_> = std::fs::read_dir(&entry)
        .expect("entry")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("attestation-"))
        .collect();
    assert_eq!(signed.len(), 1, "one attestation beside the entry");
    let again = case.run_with_env(&node);
    assert!(again.success, "{}", again.message());
    assert_eq!(again.outcome["cacheHit"], true, "a signed entry is reused");

    // Someone with write access to the store (but not the key) substitutes the artifact and
    // rewrites the manifest to match it: every digest in the store agrees with itself.
    rewrite_consistently(&entry);

    // A node (public key only) never uses it: the rebuilt entry it cannot sign is refused too.
    let refused = case.run_with_env(&node);
    refused.fails_with("SignatureInvalid", &["no attestation", &key]);
    assert!(
        refused.outcome["loadSeconds"].is_null(),
        "nothing was loaded"
    );
    assert_eq!(
        metric(
            &case.metrics(),
            "kiln_agent_verify_failures_total{reason=\"SignatureInvalid\"}"
        ),
        Some(2.0),
        "the refused stored entry, then the unsigned rebuild"
    );
    // The publisher refuses it as a cache hit, rebuilds, replaces and signs.
    let rebuilt = case.run_with_env(&publisher);
    assert!(rebuilt.success, "{}", rebuilt.message());
    assert_eq!(rebuilt.outcome["cacheHit"], false, "never a cache hit");
    assert_eq!(rebuilt.outcome["artifactDigest"], good_digest.as_str());
    assert!(case.run_with_env(&node).success, "signed again");

    // A key that is not a P-256 PEM key is a clear error, not a silent skip.
    let junk = case.path("junk.pub");
    std::fs::write(&junk, "not a key").expect("write");
    case.run_with_env(&[("KILN_TRUST_KEY", junk.as_path())])
        .fails_with("SignatureInvalid", &["junk.pub", "PEM"]);
}

#[test]
fn an_engine_panic_on_a_hostile_model_is_a_classified_failure() {
    // A 134-byte model whose Gather indexes past its input. Compiled for a concrete profile,
    // tract refuses it with an error; its reference execution (what fixtures are made with)
    // panics on it (tract 0.23.9, gather.rs: index out of bounds).
    let mut case = Case::mlp(4);
    std::fs::copy(data("oob-gather.onnx"), case.path("model.onnx")).expect("copy");
    (case.model_sha, case.model_size) = sha256_file(&case.path("model.onnx")).expect("hash");
    let run = case.run();
    run.fails_with("CompileFailed", &["Gather", "101 vs 16"]);
    assert!(case.stored().is_empty(), "nothing stored");
    // The panic is contained: a classified message and exit status 1, not an abort.
    let out = Command::new(AGENT)
        .args([
            "fixtures",
            "--fixture-version",
            "v1",
            "--shape",
            "x=2,16",
            "--model",
        ])
        .arg(case.path("model.onnx"))
        .arg("--out")
        .arg(case.path("oob.safetensors"))
        .output()
        .expect("fixtures");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("panicked: index out of bounds"), "{stderr}");
    assert!(!case.path("oob.safetensors").exists());
}

/// The MatMul test model whose weights are ONNX external data: `model_file` (ext.onnx or
/// ext-sneaky.onnx) with ext-weights.bin beside it, the asset declared or not.
fn external_data_case(model_file: &str, declare: bool) -> Case {
    let mut case = Case::mlp(4);
    std::fs::copy(data(model_file), case.path("model.onnx")).expect("model");
    std::fs::copy(data("ext-weights.bin"), case.path("ext-weights.bin")).expect("weights");
    (case.model_sha, case.model_size) = sha256_file(&case.path("model.onnx")).expect("hash");
    // Golden outputs from the honest model next to its weights.
    let honest = case.path("honest");
    std::fs::create_dir_all(&honest).expect("dir");
    std::fs::copy(data("ext.onnx"), honest.join("ext.onnx")).expect("copy");
    std::fs::copy(data("ext-weights.bin"), honest.join("ext-weights.bin")).expect("copy");
    case.fixture_from(&honest.join("ext.onnx"), 4);
    if declare {
        let (sha, _) = sha256_file(&case.path("ext-weights.bin")).expect("hash");
        case.model_extra = format!(
            "\n  assets:\n    - {{name: ext-weights.bin, kind: other, uri: \"file://ext-weights.bin\", sha256: \"{sha}\"}}"
        );
    }
    case
}

#[test]
fn onnx_external_data_reaches_only_declared_assets() {
    // Declared as an asset: staged beside the model under its name, and it works.
    let declared = external_data_case("ext.onnx", true);
    let run = declared.run();
    assert!(run.success, "{}", run.message());
    // Not declared: the file lying beside the YAML is not beside the model being compiled.
    let undeclared = external_data_case("ext.onnx", false);
    undeclared
        .run()
        .fails_with("CompileFailed", &["ext-weights.bin"]);
    // A model naming the weights' blob in the shared blob cache (its sha256) cannot read it,
    // although the declared run above put exactly that blob there.
    let sneaky = external_data_case("ext-sneaky.onnx", false);
    std::fs::write(sneaky.path("kiln.yaml"), sneaky.yaml()).expect("yaml");
    let (sha, _) = sha256_file(&declared.path("ext-weights.bin")).expect("hash");
    assert!(
        declared.store().join("blobs").join(&sha).exists(),
        "the blob is in the cache"
    );
    let run = run_local(
        &sneaky.path("kiln.yaml"),
        &declared.store(),
        &sneaky.path("metrics.prom"),
    );
    run.fails_with("CompileFailed", &[&sha]);
    // Asset names are file names in that directory: nothing else.
    let mut bad = external_data_case("ext.onnx", true);
    bad.model_extra = bad
        .model_extra
        .replace("{name: ext-weights.bin", "{name: ../ext-weights.bin");
    bad.run().fails_with("InvalidSpec", &["plain file name"]);
}

#[test]
fn a_declared_asset_size_is_held_to() {
    let sized = |delta: i64| {
        let mut case = external_data_case("ext.onnx", true);
        let size = std::fs::metadata(case.path("ext-weights.bin"))
            .expect("weights")
            .len() as i64;
        case.model_extra =
            case.model_extra
                .replacen("\"}", &format!("\", size: {}}}", size + delta), 1);
        assert!(case.model_extra.contains("size:"), "{}", case.model_extra);
        case
    };
    let run = sized(0).run();
    assert!(run.success, "{}", run.message());
    sized(1)
        .run()
        .fails_with("HashMismatch", &["asset ext-weights.bin", "declared"]);
}

#[test]
fn corrupt_cached_source_blob_is_refetched() {
    let case = Case::mlp(4);
    assert!(case.run().success);
    let blob = case.store().join("blobs").join(&case.model_sha);
    let mut bytes = std::fs::read(&blob).expect("blob");
    bytes[0] ^= 0xff;
    std::fs::write(&blob, &bytes).expect("corrupt");
    let run = case.run();
    assert!(run.success, "{}", run.message());
    assert_eq!(
        sha256_file(&blob).expect("hash").0,
        case.model_sha,
        "blob restored from the source"
    );
}

#[test]
fn unwritable_store_is_reported() {
    let case = Case::mlp(4);
    std::fs::write(case.path("not-a-dir"), b"x").expect("file");
    std::fs::write(case.path("kiln.yaml"), case.yaml()).expect("yaml");
    let run = run_local(
        &case.path("kiln.yaml"),
        &case.path("not-a-dir/store"),
        &case.path("metrics.prom"),
    );
    run.fails_with("StoreUnavailable", &["not-a-dir/store", "writable --store"]);
}

#[test]
fn latency_budget_is_enforced() {
    let mut case = Case::mlp(4);
    case.warmup_extra = "\n    latencyBudgetP99Ms: 0.000001".into();
    case.run()
        .fails_with("LatencyBudgetExceeded", &["above the budget"]);
    // The copy pulled for the run that failed is gone; the stored entry stays.
    let cache: Vec<_> = std::fs::read_dir(case.store().join("cache"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(cache.is_empty(), "a failed warmup left {cache:?}");
    assert_eq!(case.stored().len(), 1);
}

#[test]
fn backend_version_mismatch_is_incompatible_runtime() {
    let mut case = Case::mlp(4);
    case.backend_extra = ", version: \"0.1.0\"".into();
    case.run()
        .fails_with("IncompatibleRuntime", &["requires tract 0.1.0"]);
}

#[test]
fn cel_rules_apply_in_local_mode_too() {
    let mut case = Case::mlp(4);
    (case.min, case.max) = (8, 1);
    case.run().fails_with("InvalidSpec", &["min <= max"]);
    let mut case = Case::mlp(4);
    case.backend_kind = "exec";
    case.backend_extra = format!(", image: \"c@sha256:{}\"", "0".repeat(64));
    case.run().fails_with("InvalidSpec", &["backend.command"]);
    let mut case = Case::mlp(4);
    case.backend_kind = "exec";
    case.backend_extra = ", image: \"c:latest\", command: [cp]".into();
    case.run()
        .fails_with("InvalidSpec", &["pin backend.image by digest"]);
    let mut case = Case::mlp(4);
    case.backend_extra = ", command: [cp]".into();
    case.run().fails_with("InvalidSpec", &["are for kind exec"]);
    let mut case = Case::mlp(4);
    case.model_sha = "ABC".into();
    case.run()
        .fails_with("InvalidSpec", &["spec.source.sha256", "^[0-9a-f]{64}$"]);
}

#[test]
fn fixtures_command_is_deterministic_and_versioned() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let make = |out: &str| {
        let status = Command::new(AGENT)
            .args(["fixtures", "--model"])
            .arg(data("mlp.onnx"))
            .args([
                "--fixture-version",
                "v7",
                "--shape",
                "x=3,16",
                "--seed",
                "9",
                "-o",
            ])
            .arg(tmp.path().join(out))
            .status()
            .expect("run");
        assert!(status.success());
        std::fs::read(tmp.path().join(out)).expect("read")
    };
    let (a, b) = (make("a.safetensors"), make("b.safetensors"));
    assert_eq!(a, b, "same seed, same bytes");
    let f = FixtureFile::parse(&a).expect("parse");
    assert_eq!(f.version, "v7");
    assert_eq!(f.inputs["x"].shape, vec![3, 16]);
    assert_eq!(f.outputs["y"].shape, vec![3, 10]);
    let rows: Vec<f64> = f.outputs["y"].to_f64().expect("f64");
    for row in rows.chunks(10) {
        assert!(
            (row.iter().sum::<f64>() - 1.0).abs() < 1e-5,
            "softmax rows sum to 1: {row:?}"
        );
    }
    // Symbolic dims without --shape: a clear error.
    let out = Command::new(AGENT)
        .args(["fixtures", "--model"])
        .arg(data("mlp.onnx"))
        .args(["--fixture-version", "v1", "-o"])
        .arg(tmp.path().join("c"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--shape x="));
}

#[test]
fn bench_verify_agrees_with_sha256sum_and_openssl() {
    let out = Command::new(AGENT)
        .args(["bench-verify", "--size-mib", "8", "--runs", "1"])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("kiln-agent")
            && stdout.contains("GB/s")
            && stdout.contains("speed kiln/this"),
        "{stdout}"
    );
}

#[test]
fn https_source_is_fetched_verified_and_cached() {
    let mut case = Case::mlp(4);
    let server = HttpsServer::start(case.dir.path())
        .expect("openssl s_server (Debian package openssl) must start");
    let env = [("SSL_CERT_FILE", server.ca.as_path())];
    case.source_uri = format!("https://127.0.0.1:{}/model.onnx", server.port);
    let run = case.run_with_env(&env);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert_eq!(
        sha256_file(&case.store().join("blobs").join(&case.model_sha))
            .expect("blob")
            .0,
        case.model_sha
    );

    // A wrong digest over HTTPS fails closed like a local file does.
    let mut wrong = Case::mlp(4);
    wrong.source_uri = case.source_uri.clone();
    wrong.model_sha = "1".repeat(64);
    wrong
        .run_with_env(&env)
        .fails_with("HashMismatch", &["sha256 is"]);

    // s_server answers a missing file with a short error text, not the model: caught by size.
    let mut missing = Case::mlp(4);
    missing.source_uri = format!("https://127.0.0.1:{}/nope.onnx", server.port);
    missing
        .run_with_env(&env)
        .fails_with("HashMismatch", &["nope.onnx", "truncated"]);

    // Nobody listening: SourceUnavailable.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut refused = Case::mlp(4);
    refused.source_uri = format!("https://127.0.0.1:{closed}/model.onnx");
    refused
        .run_with_env(&env)
        .fails_with("SourceUnavailable", &["model.onnx"]);

    // An untrusted certificate is refused, not ignored.
    let mut untrusted = Case::mlp(4);
    untrusted.source_uri = case.source_uri.clone();
    untrusted
        .run()
        .fails_with("SourceUnavailable", &["127.0.0.1"]);
}

/// A fetch cannot be made to hang, downgrade or fill the disk: redirects stay on HTTPS and are
/// bounded, a silent server times out, and a body past the declared size (or, undeclared, past
/// `--fetch-max-bytes`) is cut off; nothing partial is left in the blob cache.
#[test]
fn hostile_https_sources_are_bounded() {
    let case = Case::mlp(4);
    let server = HttpsServer::hostile(case.dir.path())
        .expect("python3 tests/data/hostile_https.py must start");
    let base = format!("https://127.0.0.1:{}", server.port);
    let ca = server.ca.as_path();
    let env = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, PathBuf)> {
        let mut env = vec![("SSL_CERT_FILE", ca.to_path_buf())];
        env.extend(extra.iter().map(|(k, v)| (*k, PathBuf::from(v))));
        env
    };
    let run =
        |source: Option<&str>, fixture: Option<&str>, extra: &[(&'static str, &'static str)]| {
            let mut c = Case::mlp(4);
            if let Some(s) = source {
                c.source_uri = s.replace("BASE", &base);
            }
            if let Some(f) = fixture {
                c.fixture_uri = f.replace("BASE", &base);
            }
            std::fs::copy(case.path("model.onnx"), c.path("model.onnx")).expect("model");
            let env = env(extra);
            let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
            let out = c.run_with_env(&env);
            let partial: Vec<_> = std::fs::read_dir(c.store().join("blobs"))
                .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(
                partial
                    .iter()
                    .all(|n| !n.to_string_lossy().starts_with(".kiln-partial-")),
                "partial files left: {partial:?}"
            );
            (out, c)
        };

    // Redirects within the bound are followed (to a file the server has).
    let (ok, _) = run(Some("BASE/hop/2/model.onnx"), None, &[]);
    assert!(ok.success, "{}\n{}", ok.message(), ok.stderr);
    // A downgrade to plain HTTP is refused, whatever the bytes would have been.
    run(Some("BASE/redirect-http/model.onnx"), None, &[])
        .0
        .fails_with("SourceUnavailable", &["only https:// is followed"]);
    // Redirects are bounded.
    run(
        Some("BASE/loop/0"),
        None,
        &[("KILN_FETCH_MAX_REDIRECTS", "3")],
    )
    .0
    .fails_with("SourceUnavailable", &["more than 3 redirects"]);
    // A server that goes silent mid-body times out instead of hanging the agent.
    run(
        Some("BASE/stall"),
        None,
        &[("KILN_FETCH_READ_TIMEOUT", "1")],
    )
    .0
    .fails_with("SourceUnavailable", &["stall", "timed out"]);
    // A length past the declared size is refused before the body is read.
    run(Some("BASE/huge-length"), None, &[])
        .0
        .fails_with("HashMismatch", &["larger than the declared size"]);
    // Without a declared size, an endless body stops at --fetch-max-bytes over HTTPS; a device
    // is not read at all (only regular files are).
    run(
        None,
        Some("BASE/zero"),
        &[("KILN_FETCH_MAX_BYTES", "1048576")],
    )
    .0
    .fails_with(
        "SourceUnavailable",
        &["larger than 1048576 bytes", "--fetch-max-bytes"],
    );
    run(None, Some("file:///dev/zero"), &[]).0.fails_with(
        "SourceUnavailable",
        &["/dev/zero is a character device, not a regular file"],
    );
}

#[test]
fn exec_compiler_output_is_built_parity_checked_stored_and_served() {
    let script = r#"echo "optimising $(basename "$KILN_MODEL") at $KILN_PRECISION in $(pwd)"
echo "profiles $KILN_PROFILES flags $KILN_FLAGS"
echo "credentials ${KILN_REGISTRY_PASSWORD:-withheld}" >&2
env | cut -d= -f1 | sed 's/^/env-name /'
cp "$KILN_MODEL" "$KILN_ARTIFACT""#;
    let case = Case::exec(script);
    let run = case.run_with_env(&[
        ("KILN_REGISTRY_PASSWORD", Path::new("hunter2")),
        ("AWS_SECRET_ACCESS_KEY", Path::new("s3cr3t")),
        ("LC_ALL", Path::new("C")),
    ]);
    assert!(run.success, "{}", run.stderr);
    assert_eq!(run.outcome["ready"], true);
    let manifest = case.manifest(&run);
    assert_eq!(manifest["backend"], "exec");
    let log = manifest["converterLog"].to_string();
    assert!(
        log.contains("at fp32 in ") && log.contains("kiln-exec-"),
        "{log}"
    );
    // Its working directory is a scratch of its own, not inside the store it could poison.
    assert!(
        !log.contains(&case.store().display().to_string()),
        "the compiler works outside the store: {log}"
    );
    assert!(
        log.contains(r#"profiles {\"p\":{\"x\":[4,16]}} flags {}"#),
        "{log}"
    );
    assert!(
        log.contains("credentials withheld"),
        "registry credentials never reach the compiler: {log}"
    );
    assert!(!log.contains("hunter2") && !run.stderr.contains("hunter2"));
    // Its whole environment, as it dumped it: the contract's KILN_* variables and an
    // allow-list (paths, locale, GPU selection); nothing else of kiln-agent's.
    let names: Vec<String> = manifest["converterLog"]
        .as_array()
        .expect("converterLog")
        .iter()
        .filter_map(|l| l.as_str()?.strip_prefix("env-name ").map(str::to_string))
        .collect();
    assert!(names.iter().any(|n| n == "LC_ALL"), "{names:?}");
    assert!(names.iter().any(|n| n == "KILN_MODEL"), "{names:?}");
    let contract = [
        "KILN_MODEL",
        "KILN_ARTIFACT",
        "KILN_WORK",
        "KILN_PRECISION",
        "KILN_PROFILES",
        "KILN_FLAGS",
    ];
    // The allow-list (backend/subprocess.rs), and what the shell sets itself.
    let allowed = [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "OMP_NUM_THREADS",
        "PWD",
        "SHLVL",
        "_",
    ];
    for name in &names {
        assert!(
            contract.contains(&name.as_str())
                || allowed.contains(&name.as_str())
                || ["LC_", "CUDA_", "NVIDIA_"]
                    .iter()
                    .any(|p| name.starts_with(p)),
            "{name} reached the compiler: {names:?}"
        );
    }
    // Everything else the test harness runs kiln-agent with stays behind.
    for name in [
        "AWS_SECRET_ACCESS_KEY",
        "KILN_REGISTRY_PASSWORD",
        "ORT_DYLIB_PATH",
    ] {
        assert!(!names.iter().any(|n| n == name), "{name}: {names:?}");
    }
    // The compiler's lines are logged as they come.
    assert!(run.stderr.contains("optimising"), "{}", run.stderr);
    // Same model through tract: another key (the compiler is in it), same numbers.
    let mut tract = Case::exec("");
    tract.backend_kind = "tract";
    tract.backend_extra.clear();
    let tract_run = tract.run();
    assert!(tract_run.success, "{}", tract_run.stderr);
    assert_ne!(run.outcome["compileKey"], tract_run.outcome["compileKey"]);
    // Run again: reused, the compiler is not started.
    let again = case.run();
    assert_eq!(again.outcome["cacheHit"], true, "{}", again.stderr);
    assert!(!again.stderr.contains("optimising"));
}

#[test]
fn exec_compiler_output_that_is_not_utf8_or_endless_does_not_fail_a_good_compile() {
    // A Latin-1 byte, then 1 MiB without a newline (more than a pipe holds: a reader that
    // stopped at the bad byte would leave the compiler blocked until its deadline).
    let case = Case::exec(
        r#"printf 'caf\351 ok\n'; head -c 1048576 /dev/zero | tr '\0' x; echo; echo done; cp "$KILN_MODEL" "$KILN_ARTIFACT""#,
    );
    let mut case = case;
    case.warmup_extra = "\n  compile: {activeDeadlineSeconds: 20}".into();
    let run = case.run();
    assert!(run.success, "{}: {}", run.message(), run.stderr);
    // Logged as it came, with the bad byte replaced; the manifest keeps the last lines, the
    // endless one cut into 4 KiB pieces.
    assert!(run.stderr.contains("caf\u{fffd} ok"), "not logged");
    let log = case.manifest(&run)["converterLog"].clone();
    let lines = log.as_array().expect("lines");
    assert!(lines.iter().any(|l| l == "done"), "{lines:?}");
    assert!(
        lines
            .iter()
            .all(|l| l.as_str().is_some_and(|l| l.len() <= 4096))
    );
}

#[test]
fn exec_compiler_failure_is_compile_failed_with_its_last_output() {
    let case = Case::exec("echo loading; echo 'fatal: opset 13 not supported' >&2; exit 3");
    case.run().fails_with(
        "CompileFailed",
        &[
            "exited with status 3",
            "fatal: opset 13 not supported",
            "loading",
        ],
    );
    assert!(case.stored().is_empty());

    let case = Case::exec("echo done");
    case.run().fails_with(
        "CompileFailed",
        &["wrote no model to $KILN_ARTIFACT", "done"],
    );
    assert!(case.stored().is_empty());

    let case = Case::exec("echo 'not onnx' > \"$KILN_ARTIFACT\"");
    case.run().fails_with(
        "CompileFailed",
        &["the model backend.command wrote cannot be built"],
    );
    assert!(case.stored().is_empty());

    let mut case = Case::exec("");
    case.backend_extra = format!(
        ", image: \"c@sha256:{}\", command: [/no/such/compiler]",
        "c".repeat(64)
    );
    case.run().fails_with(
        "CompileFailed",
        &["cannot start backend.command \"/no/such/compiler\""],
    );
}

#[test]
fn exec_compiler_that_changes_the_numbers_fails_parity_and_stores_nothing() {
    let drift = data("mlp-drift.onnx");
    let case = Case::exec(&format!("cp '{}' \"$KILN_ARTIFACT\"", drift.display()));
    case.run().fails_with("ParityExceeded", &["output y"]);
    assert!(
        case.stored().is_empty(),
        "a compile that fails parity is never stored"
    );
}

#[test]
fn install_copies_a_self_contained_agent_that_runs_through_its_own_loader() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tools = dir.path().join("tools");
    let out = Command::new(AGENT)
        .arg("install")
        .arg(&tools)
        .output()
        .expect("install");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let installed: Value = serde_json::from_slice(&out.stdout).expect("json");
    let libs: Vec<&str> = installed["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(libs.contains(&"libc.so.6"), "{libs:?}");
    for lib in &libs {
        assert!(tools.join("lib").join(lib).is_file(), "{lib}");
    }
    // The copy runs with an empty environment through the copied loader, and does real work.
    let argv = kiln_crds::inject::agent_command(&tools.display().to_string(), &["probe"]);
    let probe = Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .output()
        .expect("run the copy");
    assert!(
        probe.status.success(),
        "{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let facts: Value = serde_json::from_slice(&probe.stdout).expect("probe json");
    assert!(facts["hardware"].is_object(), "{facts}");
}

#[test]
fn exec_compiler_past_its_deadline_is_killed_with_what_it_started() {
    // A background child keeps the compiler's output open: if it survived, the run would wait
    // for its 60 s. Both the deadline and the normal exit take the whole process group down.
    let mut case = Case::exec("echo started; sleep 60 & sleep 60");
    case.warmup_extra = "\n  compile: {activeDeadlineSeconds: 1}".into();
    let started = std::time::Instant::now();
    case.run().fails_with(
        "Timeout",
        &["compile.activeDeadlineSeconds (1s)", "started"],
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the run waited for the compiler's children: {:?}",
        started.elapsed()
    );
    assert!(case.stored().is_empty());

    let case = Case::exec("sleep 60 & cp \"$KILN_MODEL\" \"$KILN_ARTIFACT\"");
    let started = std::time::Instant::now();
    let run = case.run();
    assert!(run.success, "{}", run.stderr);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "a straggler kept the run waiting: {:?}",
        started.elapsed()
    );

    // A child that leaves the process group (setsid) and keeps the output open: killed too,
    // at the deadline and after a normal exit, and it does not hang the log readers.
    let mut case = Case::exec("echo started; setsid sleep 60.0137 & sleep 60");
    case.warmup_extra = "\n  compile: {activeDeadlineSeconds: 1}".into();
    let started = std::time::Instant::now();
    case.run().fails_with("Timeout", &["(1s)"]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "a setsid child kept the run waiting: {:?}",
        started.elapsed()
    );
    let case = Case::exec("setsid sleep 61.0137 & cp \"$KILN_MODEL\" \"$KILN_ARTIFACT\"");
    let started = std::time::Instant::now();
    let run = case.run();
    assert!(run.success, "{}", run.stderr);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "a setsid straggler kept the run waiting: {:?}",
        started.elapsed()
    );
    // Durations no other test (or other checkout on this machine) uses: pgrep sees them all.
    let survivors = Command::new("pgrep")
        .args(["-f", "sleep 6[01].0137$"])
        .output()
        .expect("pgrep");
    assert!(
        survivors.stdout.is_empty(),
        "setsid children outlived the compile: {}",
        String::from_utf8_lossy(&survivors.stdout)
    );
}

/// `openssl` as cosign signs a blob with a key (`cosign sign-blob --key`: ECDSA P-256 over the
/// blob's SHA-256, ASN.1 DER, base64): a key pair in `dir` and the signature of `blob`.
fn cosign_like_signature(dir: &Path, name: &str, blob: &Path) -> (PathBuf, String) {
    let key = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let sig = dir.join(format!("{name}.sig"));
    for args in [
        vec![
            "ecparam",
            "-genkey",
            "-name",
            "prime256v1",
            "-noout",
            "-out",
            key.to_str().unwrap_or_default(),
        ],
        vec![
            "ec",
            "-in",
            key.to_str().unwrap_or_default(),
            "-pubout",
            "-out",
            public.to_str().unwrap_or_default(),
        ],
        vec![
            "dgst",
            "-sha256",
            "-sign",
            key.to_str().unwrap_or_default(),
            "-out",
            sig.to_str().unwrap_or_default(),
            blob.to_str().unwrap_or_default(),
        ],
    ] {
        let out = Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl (Debian package openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let b64 = Command::new("base64")
        .arg("-w0")
        .arg(&sig)
        .output()
        .expect("base64 (coreutils)");
    (public, String::from_utf8(b64.stdout).expect("ascii"))
}

#[test]
fn a_signed_source_is_built_only_with_a_trusted_key_that_made_it() {
    let mut case = Case::mlp(4);
    let unsigned = case.run();
    assert_eq!(unsigned.outcome["ready"], true, "{}", unsigned.stderr);
    let (publisher, signature) =
        cosign_like_signature(case.dir.path(), "publisher", &case.path("model.onnx"));
    let (stranger, _) =
        cosign_like_signature(case.dir.path(), "stranger", &case.path("model.onnx"));
    case.source_extra = format!(", signature: \"{signature}\"");

    // Signed, nobody to check it: refused rather than silently unchecked.
    case.run().fails_with(
        "SignatureInvalid",
        &["model source", "no trusted source key is configured"],
    );
    // Signed by another key than the trusted one.
    case.run_with_env(&[("KILN_SOURCE_TRUST_KEY", stranger.as_path())])
        .fails_with(
            "SignatureInvalid",
            &[
                "does not verify",
                "no trusted source key made this signature",
            ],
        );
    // The publisher's key: built, under its own compile key (the signature is part of it).
    let signed = case.run_with_env(&[("KILN_SOURCE_TRUST_KEY", publisher.as_path())]);
    assert_eq!(signed.outcome["ready"], true, "{}", signed.stderr);
    assert_ne!(signed.outcome["compileKey"], unsigned.outcome["compileKey"]);
    // A signature over other bytes (the source changed, the signature did not) is refused.
    let (_, other) = cosign_like_signature(
        case.dir.path(),
        "publisher2",
        &case.path("fixture.safetensors"),
    );
    case.source_extra = format!(", signature: \"{other}\"");
    case.run_with_env(&[("KILN_SOURCE_TRUST_KEY", publisher.as_path())])
        .fails_with("SignatureInvalid", &["does not verify"]);
    // Unsigned where signatures are required.
    case.source_extra.clear();
    std::fs::write(case.path("kiln.yaml"), case.yaml()).expect("yaml");
    let out = Command::new(AGENT)
        .env("KILN_REQUIRE_SOURCE_SIGNATURE", "true")
        .args(["local", "--output", "json", "--store"])
        .arg(case.store())
        .arg(case.path("kiln.yaml"))
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("json");
    assert_eq!(last["reason"], "SignatureInvalid", "{last}");
    assert!(
        last["message"]
            .as_str()
            .unwrap_or_default()
            .contains("required here"),
        "{last}"
    );
}

/// Substitutes a stored entry's artifact (one bit flipped) and rewrites its manifest to match,
/// so every digest in the store agrees with itself: only a signature can tell.
fn rewrite_consistently(entry: &Path) {
    let mut bytes = std::fs::read(entry.join("artifact")).expect("artifact");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(entry.join("artifact"), &bytes).expect("substitute");
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(entry.join("manifest.json")).expect("manifest"))
            .expect("json");
    manifest["artifactDigest"] = sha256_bytes(&bytes).into();
    std::fs::write(
        entry.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).expect("json"),
    )
    .expect("rewrite manifest");
}

/// The store tests' real registry (Debian's docker-registry), written with their lints.
#[allow(clippy::unwrap_used)]
#[path = "../../store/tests/registry/mod.rs"]
mod registry;

/// Pushes `files` (name:mediatype, in `dir`) with oras as one artifact; returns its manifest
/// digest, read back from the registry as the user would (`oras resolve`).
fn oras_push(oras: &Path, dir: &Path, reference: &str, extra: &[&str], files: &[&str]) -> String {
    let out = Command::new(oras)
        .current_dir(dir)
        .args([
            "push",
            "--plain-http",
            "--disable-path-validation",
            reference,
        ])
        .args(extra)
        .args(files)
        .output()
        .expect("oras push");
    assert!(out.status.success(), "oras push: {out:?}");
    let out = Command::new(oras)
        .args(["resolve", "--plain-http", reference])
        .output()
        .expect("oras resolve");
    assert!(out.status.success(), "oras resolve: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Sources kept in a registry as OCI artifacts pushed by the real ORAS CLI: a CNCF ModelPack
/// (the model and its ONNX external data as raw weight layers, found by their
/// `org.cncf.model.filepath`) and a plain one-file artifact; both Ready. A tag, a file the
/// artifact does not hold, and a blob changed in the registry's storage each fail closed.
#[test]
fn oci_sources_pushed_by_oras_are_pulled_by_digest_and_verified() {
    let Some(oras) = ensured("oras") else { return };
    let Some(registry) = registry::Registry::start() else {
        return;
    };
    let host = registry.addr.to_string();
    let insecure = Path::new("true");
    let env = [
        ("KILN_SOURCE_REGISTRY", Path::new(&host)),
        ("KILN_REGISTRY_INSECURE", insecure),
    ];
    // ModelPack: the model and its external data, as modctl lays them out.
    let mut pack = external_data_case("ext.onnx", true);
    std::fs::write(pack.path("config.json"), r#"{"descriptor":{"name":"ext"},"config":{"format":"onnx"},"modelfs":{"type":"layers","diffIds":[]}}"#).expect("config");
    std::fs::write(
        pack.path("annotations.json"),
        r#"{"model.onnx":{"org.cncf.model.filepath":"model.onnx"},"ext-weights.bin":{"org.cncf.model.filepath":"ext-weights.bin"}}"#,
    )
    .expect("annotations");
    let digest = oras_push(
        &oras,
        pack.dir.path(),
        &format!("{host}/models/ext:v1"),
        &[
            "--artifact-type",
            "application/vnd.cncf.model.manifest.v1+json",
            "--config",
            "config.json:application/vnd.cncf.model.config.v1+json",
            "--annotation-file",
            "annotations.json",
        ],
        &[
            "model.onnx:application/vnd.cncf.model.weight.v1.raw",
            "ext-weights.bin:application/vnd.cncf.model.weight.v1.raw",
        ],
    );
    let artifact = format!("oci://{host}/models/ext@{digest}");
    pack.source_uri = format!("{artifact}#model.onnx");
    pack.model_extra = pack.model_extra.replace(
        "file://ext-weights.bin",
        &format!("{artifact}#ext-weights.bin"),
    );
    std::fs::remove_file(pack.path("model.onnx")).expect("rm");
    std::fs::remove_file(pack.path("ext-weights.bin")).expect("rm");
    let run = pack.run_with_env(&env);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert!(pack.store().join("blobs").join(&pack.model_sha).exists());

    // A plain artifact of one file, as `oras push REF FILE` makes it: the only layer.
    let mut plain = Case::mlp(4);
    let digest = oras_push(
        &oras,
        plain.dir.path(),
        &format!("{host}/models/mlp:v1"),
        &[],
        &["model.onnx"],
    );
    plain.source_uri = format!("oci://{host}/models/mlp@{digest}");
    std::fs::remove_file(plain.path("model.onnx")).expect("rm");
    let run = plain.run_with_env(&env);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);

    // By tag: refused before anything is pulled.
    let mut tagged = Case::mlp(4);
    tagged.source_uri = format!("oci://{host}/models/mlp:v1");
    tagged
        .run_with_env(&env)
        .fails_with("InvalidSpec", &["pin the artifact by digest"]);
    // A file the artifact does not hold.
    let mut absent = Case::mlp(4);
    absent.source_uri = format!("{artifact}#tokenizer.json");
    absent.run_with_env(&env).fails_with(
        "HashMismatch",
        &[
            "no layer is named \"tokenizer.json\"",
            "model.onnx, ext-weights.bin",
        ],
    );
    // The registry's stored blob changed: the pull hashes what arrives and refuses it.
    let mut flipped = Case::mlp(4);
    let blob = registry.blob_path(&flipped.model_sha);
    let mut bytes = std::fs::read(&blob).expect("stored blob");
    bytes[100] ^= 1;
    std::fs::write(&blob, bytes).expect("flip");
    flipped.source_uri = plain.source_uri.clone();
    flipped
        .run_with_env(&env)
        .fails_with("HashMismatch", &["model source", "sha256 is"]);
    assert!(
        !flipped
            .store()
            .join("blobs")
            .join(&flipped.model_sha)
            .exists()
    );
}

/// `oci://` sources pulled through registry mirrors, as the store's artifacts are. Keyed by the
/// source's registry (the object form of KILN_REGISTRY_MIRRORS), a real pull-through cache
/// (Distribution 3) in front of a registry kiln was given nothing for (so HTTPS, which that
/// plain-HTTP origin does not speak) serves the file, the origin serving it once, to the cache.
/// As the store registry's list, a mirror holding other bytes is passed over and the next used.
#[test]
fn oci_sources_are_pulled_through_mirrors_and_a_lying_one_is_passed_over() {
    let Some(oras) = ensured("oras") else { return };
    let (Some(origin), Some(liar)) = (
        registry::Registry::start_logged(),
        registry::Registry::start(),
    ) else {
        return;
    };
    let Some(cache) = registry::Registry::start_proxy(origin.addr) else {
        return;
    };
    let mut case = Case::mlp(4);
    let at = |r: &registry::Registry| format!("{}/models/mlp:v1", r.addr);
    let digest = oras_push(&oras, case.dir.path(), &at(&origin), &[], &["model.onnx"]);
    // The liar holds the same manifest (oras push stamps the time into it, so it is copied).
    let copied = Command::new(&oras)
        .args([
            "cp",
            "--from-plain-http",
            "--to-plain-http",
            &at(&origin),
            &at(&liar),
        ])
        .output()
        .expect("oras cp");
    assert!(copied.status.success(), "oras cp: {copied:?}");
    let blob = liar.blob_path(&case.model_sha);
    let mut bytes = std::fs::read(&blob).expect("stored blob");
    bytes[100] ^= 1;
    std::fs::write(&blob, bytes).expect("flip");
    std::fs::remove_file(case.path("model.onnx")).expect("rm");
    case.source_uri = format!("oci://{}/models/mlp@{digest}", origin.addr);
    let mirror = |r: &registry::Registry| format!(r#"{{"host": "http://{}"}}"#, r.addr);

    let keyed = format!(r#"{{"{}": [{}]}}"#, origin.addr, mirror(&cache));
    let run = case.run_with_env(&[("KILN_REGISTRY_MIRRORS", Path::new(&keyed))]);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    // The origin served the layer once for this pull (to the cache), once before to `oras cp`.
    let layer = format!("sha256:{}", case.model_sha);
    assert_eq!(origin.blob_gets().get(&layer), Some(&2), "{}", origin.log());

    let mut again = Case::mlp(4);
    again.source_uri = case.source_uri.clone();
    let host = origin.addr.to_string();
    let list = format!("[{}, {}]", mirror(&liar), mirror(&cache));
    let run = again.run_with_env(&[
        ("KILN_SOURCE_REGISTRY", Path::new(&host)),
        ("KILN_REGISTRY_INSECURE", Path::new("true")),
        ("KILN_REGISTRY_MIRRORS", Path::new(&list)),
    ]);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert!(
        run.stderr.contains("registry mirror passed over") && run.stderr.contains("hash_mismatch"),
        "{}",
        run.stderr
    );
    assert_eq!(
        origin.blob_gets().get(&layer),
        Some(&2),
        "served by the cache"
    );
}

/// The real `cosign verify-blob-attestation --type slsaprovenance1` accepts the attestation a
/// local compile writes beside its entry, for the artifact, and refuses it for another blob and
/// once its statement is changed under the signature.
#[test]
fn cosign_verifies_a_local_store_entry_and_refuses_a_changed_one() {
    let Some(cosign) = ensured("cosign") else {
        return;
    };
    let case = Case::mlp(4);
    let run = case.run();
    assert!(run.success, "{}", run.message());
    let public = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(case.store().join("signing.key"))
        .output()
        .expect("openssl");
    assert!(public.status.success(), "{public:?}");
    std::fs::write(case.path("signing.pub"), &public.stdout).expect("pub");
    let key = run.outcome["compileKey"].as_str().expect("key");
    let entry = case.store().join("artifacts").join(key);
    let attestation = std::fs::read_dir(&entry)
        .expect("entry")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("attestation-"))
        })
        .expect("an attestation beside the entry");
    let verify = |signature: &Path, blob: &Path| {
        let out = Command::new(&cosign)
            .args([
                "verify-blob-attestation",
                "--key",
                "signing.pub",
                "--type",
                "slsaprovenance1",
            ])
            .args(["--insecure-ignore-tlog=true", "--signature"])
            .args([signature, blob])
            .current_dir(case.dir.path())
            .env("HOME", case.dir.path())
            .output()
            .expect("cosign");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, said) = verify(&attestation, &entry.join("artifact"));
    assert!(ok && said.contains("Verified OK"), "{said}");
    let (ok, said) = verify(&attestation, &case.path("model.onnx"));
    assert!(!ok && said.contains("no matching subject digest"), "{said}");
    // The statement changed under the signature: one base64 character of the payload.
    let mut envelope: Value =
        serde_json::from_slice(&std::fs::read(&attestation).expect("read")).expect("json");
    let payload = envelope["payload"].as_str().expect("payload").to_string();
    let at = payload.len() / 2;
    let flipped = if &payload[at..=at] == "A" { "B" } else { "A" };
    envelope["payload"] = format!("{}{flipped}{}", &payload[..at], &payload[at + 1..]).into();
    std::fs::write(case.path("changed.json"), envelope.to_string()).expect("write");
    let (ok, said) = verify(&case.path("changed.json"), &entry.join("artifact"));
    assert!(
        !ok && said.contains("accepted signatures do not match threshold"),
        "{said}"
    );
}

/// The case's store holds no artifact: nothing was compiled.
fn nothing_built(case: &Case) {
    let artifacts = case.store().join("artifacts");
    assert!(
        std::fs::read_dir(&artifacts).map_or(true, |mut d| d.next().is_none()),
        "nothing compiled"
    );
}

/// OpenSSF Model Signing bundles made by the real `model_signing` CLI (PyPI 1.1.1,
/// `scripts/ensure/model-signing.sh`) over a model directory holding an ONNX model and its
/// external data: key-based and certificate-based bundles verify and the model is Ready; a byte
/// changed, a file added, another key and another CA are each `SignatureInvalid`, and nothing is
/// compiled for them.
#[test]
fn model_signing_bundles_from_the_real_cli_are_verified_before_anything_is_built() {
    let Some(bin) = ensured("model-signing") else {
        return;
    };
    let cli = bin.join("model_signing");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    signing_material(w);
    let base = external_data_case("ext.onnx", true);
    let model = w.join("ext-model");
    std::fs::create_dir(&model).expect("dir");
    for f in ["model.onnx", "ext-weights.bin"] {
        std::fs::copy(base.path(f), model.join(f)).expect("copy");
    }
    ran(
        w,
        &cli,
        &[
            "sign",
            "key",
            "ext-model",
            "--private_key",
            "key.pem",
            "--signature",
            "key.sig",
        ],
    );
    ran(
        w,
        &cli,
        &[
            "sign",
            "certificate",
            "ext-model",
            "--private_key",
            "leaf.key",
            "--signing_certificate",
            "leaf.pem",
            "--certificate_chain",
            "root.pem",
            "--signature",
            "cert.sig",
        ],
    );
    let signed = |bundle: &str| {
        let mut case = external_data_case("ext.onnx", true);
        case.source_extra = signature_field(&w.join(bundle));
        case
    };
    let trusting = |file: &str| [("KILN_SOURCE_TRUST_KEY", w.join(file))];
    let run = |case: &Case, trust: &str| {
        let env = trusting(trust);
        let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
        case.run_with_env(&env)
    };
    for (bundle, trust) in [("key.sig", "key.pub"), ("cert.sig", "root.pem")] {
        let case = signed(bundle);
        let ready = run(&case, trust);
        assert!(
            ready.success,
            "{bundle}: {}\n{}",
            ready.message(),
            ready.stderr
        );
        assert!(
            ready.stderr.contains("model source signature verified"),
            "{}",
            ready.stderr
        );
    }
    // One byte of the external data changed after signing (and declared so).
    let mut changed = signed("key.sig");
    let mut weights = std::fs::read(changed.path("ext-weights.bin")).expect("weights");
    weights[0] ^= 1;
    std::fs::write(changed.path("ext-weights.bin"), &weights).expect("write");
    let (sha, _) = sha256_file(&changed.path("ext-weights.bin")).expect("hash");
    changed.model_extra = format!(
        "\n  assets:\n    - {{name: ext-weights.bin, kind: other, uri: \"file://ext-weights.bin\", sha256: \"{sha}\"}}"
    );
    run(&changed, "key.pub").fails_with(
        "SignatureInvalid",
        &[
            "ext-weights.bin is signed with sha256",
            "changed since it was signed",
        ],
    );
    nothing_built(&changed);
    // A file added beside the signed ones (declared, so it would reach the compile).
    let mut added = signed("key.sig");
    std::fs::write(added.path("tokenizer.json"), "{}").expect("write");
    added.model_extra.push_str(&format!(
        "\n    - {{name: tokenizer.json, kind: other, uri: \"file://tokenizer.json\", sha256: \"{}\"}}",
        sha256_bytes(b"{}")
    ));
    run(&added, "key.pub").fails_with(
        "SignatureInvalid",
        &["spec.assets[tokenizer.json] is not among the files the bundle signs"],
    );
    nothing_built(&added);
    // Another key, another CA, and a certificate bundle where only a key is trusted.
    let other = signed("key.sig");
    run(&other, "other.pub")
        .fails_with("SignatureInvalid", &["no trusted key made this signature"]);
    nothing_built(&other);
    let stranger = signed("cert.sig");
    run(&stranger, "stranger.pem")
        .fails_with("SignatureInvalid", &["does not chain to a trusted CA"]);
    nothing_built(&stranger);
    run(&signed("cert.sig"), "key.pub").fails_with(
        "SignatureInvalid",
        &["no trusted CA certificate is configured"],
    );
}

/// What `scripts/test/sigstore-instance.py` leaves beside the bundles it signed keyless with the
/// real `model_signing sign sigstore` (each already checked by `model_signing verify sigstore`):
/// the private Sigstore instance's trusted root and OIDC issuer.
struct Keyless {
    root: Value,
    issuer: String,
}

/// Stands the instance up from the upstream servers `scripts/ensure/sigstore.sh` builds, signs
/// `model` in `w` as each `(bundle, email)`, and takes it down; `None` after saying why the
/// tools are missing (a failure under `CI=true`).
fn keyless_signed(w: &Path, model: &str, signers: &[(&str, &str)]) -> Option<Keyless> {
    let venv = ensured("model-signing")?;
    let servers = ensured("sigstore")?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/test/sigstore-instance.py");
    let mut args = vec![
        script.display().to_string(),
        "--dir".into(),
        "instance".into(),
        "--servers".into(),
        servers.display().to_string(),
        "--model-signing".into(),
        venv.display().to_string(),
    ];
    for (bundle, email) in signers {
        args.extend(["--sign".into(), format!("{model}={bundle}={email}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ran(w, &venv.join("python"), &args);
    let read =
        |f: &str| std::fs::read_to_string(w.join("instance").join(f)).expect("instance file");
    Some(Keyless {
        root: serde_json::from_str(&read("trusted_root.json")).expect("trusted root"),
        issuer: read("issuer.txt"),
    })
}

/// Sigstore keyless bundles made by the real `model_signing sign sigstore` against a private
/// Sigstore instance (Fulcio, TesseraCT, Rekor v2 and the timestamp authority from their
/// upstream releases), over a model directory holding an ONNX model and its external data:
/// verified offline against the instance's trusted root and the identity the trust file names,
/// and the model is Ready. Another identity, no Sigstore trust, and each part of a bundle
/// tampered with (timestamp, log entry, inclusion proof, checkpoint, certificate, CT log, CA
/// window, TSA) are refused naming what failed, and nothing is compiled.
#[test]
fn keyless_bundles_are_verified_offline_against_the_trusted_root_and_identity() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let base = external_data_case("ext.onnx", true);
    std::fs::create_dir(w.join("ext-model")).expect("dir");
    for f in ["model.onnx", "ext-weights.bin"] {
        std::fs::copy(base.path(f), w.join("ext-model").join(f)).expect("copy");
    }
    let signers = [
        ("keyless.sig", "publisher@example.com"),
        ("stranger.sig", "stranger@example.com"),
    ];
    let Some(instance) = keyless_signed(w, "ext-model", &signers) else {
        return;
    };
    let trust_file = |name: &str, root: &Value, subject: &str| {
        let trust = serde_json::json!({
            "trustedRoot": root,
            "identities": [{"issuer": instance.issuer, "subject": subject}],
        });
        let path = w.join(name);
        std::fs::write(&path, trust.to_string()).expect("trust");
        path
    };
    let publisher = trust_file("publisher.json", &instance.root, "publisher@example.com");
    let signed = |bundle: &str| {
        let mut case = external_data_case("ext.onnx", true);
        case.source_extra = signature_field(&w.join(bundle));
        case
    };
    let run =
        |case: &Case, trust: &Path| case.run_with_env(&[("KILN_SOURCE_TRUST_SIGSTORE", trust)]);
    let ready = run(&signed("keyless.sig"), &publisher);
    assert!(ready.success, "{}\n{}", ready.message(), ready.stderr);
    assert!(
        ready.stderr.contains("model source signature verified")
            && ready.stderr.contains("sigstore publisher@example.com"),
        "{}",
        ready.stderr
    );
    let stranger = signed("stranger.sig");
    run(&stranger, &publisher).fails_with(
        "SignatureInvalid",
        &[
            "signed by stranger@example.com",
            "not among the trusted identities",
        ],
    );
    nothing_built(&stranger);
    signing_material(w);
    let keys_only = signed("keyless.sig");
    keys_only
        .run_with_env(&[("KILN_SOURCE_TRUST_KEY", &w.join("key.pub"))])
        .fails_with("SignatureInvalid", &["no Sigstore trust is configured"]);
    nothing_built(&keys_only);
    tampered_keyless_bundles_are_refused(w, &publisher);
}

/// Each part of a real keyless bundle, or of its trusted root, changed: the verifier names it.
fn tampered_keyless_bundles_are_refused(w: &Path, trust: &Path) {
    use kiln_store::attest::model_signing::{SourceTrust, UnixTime, verify};
    use kiln_store::attest::sigstore::KeylessTrust;
    let bundle: Value =
        serde_json::from_slice(&std::fs::read(w.join("keyless.sig")).expect("b")).expect("json");
    let stranger: Value =
        serde_json::from_slice(&std::fs::read(w.join("stranger.sig")).expect("b")).expect("json");
    let trust: Value = serde_json::from_slice(&std::fs::read(trust).expect("trust")).expect("json");
    let check = |bundle: &Value, trust: &Value| {
        let keyless = KeylessTrust::from_json(trust.to_string().as_bytes()).expect("trust parses");
        let trust = SourceTrust {
            keyless: Some(keyless),
            ..SourceTrust::default()
        };
        verify(bundle.to_string().as_bytes(), &trust, UnixTime::now()).map(|s| s.signer)
    };
    let signer = check(&bundle, &trust).expect("the real bundle verifies");
    assert!(
        signer.starts_with("sigstore publisher@example.com (issuer "),
        "{signer}"
    );
    let entry = "/verificationMaterial/tlogEntries/0";
    let cases: [(&str, &str, Value, &str); 6] = [
        (
            "/verificationMaterial/timestampVerificationData/rfc3161Timestamps",
            "",
            serde_json::json!([]),
            "no timestamp from a trusted timestamp authority",
        ),
        (
            entry,
            "/canonicalizedBody",
            stranger
                .pointer(&format!("{entry}/canonicalizedBody"))
                .cloned()
                .expect("body"),
            "records another signature",
        ),
        (
            entry,
            "/inclusionProof/rootHash",
            serde_json::json!(B64.encode([7u8; 32])),
            "inclusion proof",
        ),
        (
            entry,
            "/inclusionProof/checkpoint/envelope",
            serde_json::json!(tamper_checkpoint(&bundle)),
            "no signature of the trusted log",
        ),
        (
            "/verificationMaterial",
            "/certificate",
            stranger["verificationMaterial"]["certificate"].clone(),
            "not the signing certificate's",
        ),
        (
            "/dsseEnvelope",
            "/signatures/0/sig",
            stranger["dsseEnvelope"]["signatures"][0]["sig"].clone(),
            "not the signing certificate's",
        ),
    ];
    for (at, field, value, needle) in cases {
        let mut b = bundle.clone();
        *b.pointer_mut(&format!("{at}{field}")).expect("field") = value;
        let e = check(&b, &trust).expect_err(needle);
        assert!(e.contains(needle), "{at}{field}: {e}");
    }
    let mut root = trust.clone();
    root["trustedRoot"]["ctlogs"][0]["publicKey"] =
        trust["trustedRoot"]["tlogs"][0]["publicKey"].clone();
    let e = check(&bundle, &root).expect_err("another CT log key");
    assert!(
        e.contains("no SCT in the certificate is a trusted CT log's"),
        "{e}"
    );
    let mut root = trust.clone();
    root["trustedRoot"]["certificateAuthorities"][0]["validFor"]["start"] =
        serde_json::json!("2099-01-01T00:00:00Z");
    let e = check(&bundle, &root).expect_err("a CA not yet valid");
    assert!(e.contains("no CA was valid then"), "{e}");
    let mut root = trust.clone();
    root["trustedRoot"]["timestampAuthorities"][0]["certChain"] =
        trust["trustedRoot"]["certificateAuthorities"][0]["certChain"].clone();
    let e = check(&bundle, &root).expect_err("another TSA");
    assert!(
        e.contains("no trusted timestamp authority signed the timestamp"),
        "{e}"
    );
}

/// The bundle's checkpoint with one byte of its signature changed.
fn tamper_checkpoint(bundle: &Value) -> String {
    let note = bundle["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]["checkpoint"]["envelope"]
        .as_str()
        .expect("checkpoint");
    let (text, line) = note.rsplit_once("\u{2014} ").expect("signature line");
    let (name, sig) = line.trim_end().split_once(' ').expect("name and signature");
    let mut raw = B64.decode(sig).expect("base64");
    let last = raw.len() - 1;
    raw[last] ^= 1;
    format!("{text}\u{2014} {name} {}\n", B64.encode(raw))
}
