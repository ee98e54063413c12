//! `backend.kind: onnxruntime` through `kiln-agent local` and `kiln-agent fixtures`, on the real
//! ONNX Runtime 1.31.1 library from the PyPI wheel (fetched and cached by
//! `scripts/ensure-onnxruntime.sh`, which these tests run): the example model; real models tract
//! cannot compile (Silero VAD's `If`, the ONNX backend tests' `Loop` and `If`) with fixtures made
//! by ONNX Runtime, and tract's refusal of them by node and operator; a transformer encoder block
//! tract compiles, checked against ONNX Runtime's outputs; partition evidence in the outcome, the build manifest and the metrics; the
//! artifact bound to its CPU level; and every bad path (no library, a wrong-version library, not
//! a library, a provider the library lacks, a golden moved) with its reason and message.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Run, data, metric, ort_fixture, run_local_env};
use kiln_store::staged::{sha256_bytes, sha256_file};
use serde_json::{Value, json};

/// Which ONNX Runtime release a test loads.
#[derive(Clone, Copy)]
enum Release {
    /// 1.31.1, the one kiln-agent's binding is built against.
    Pinned,
    /// 1.20.1, too old to serve the binding's C API version.
    Old,
    /// 1.32.0, a later release serving the same C API.
    Newer,
}

/// The ONNX Runtime library of `release`, fetched once by the project's script.
fn library(release: Release) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure-onnxruntime.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    match release {
        Release::Pinned => {}
        Release::Old => {
            cmd.arg("--old");
        }
        Release::Newer => {
            cmd.arg("--newer");
        }
    }
    let out = cmd.output().expect("run ensure-onnxruntime.sh");
    assert!(
        out.status.success(),
        "scripts/ensure-onnxruntime.sh failed (it needs PyPI once, then its cache): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// One graph input or output as the ModelArtifact declares it.
struct Io {
    name: &'static str,
    dtype: &'static str,
    dims: &'static str,
}

/// A model with given inputs, a fixture made by ONNX Runtime, and the YAML of a local run.
struct Model {
    dir: tempfile::TempDir,
    sha: String,
    size: u64,
    fixture_sha: String,
    inputs: Vec<Io>,
    backend: String,
    tolerance: &'static str,
    /// `dims` of the target's one shape profile.
    profile: &'static str,
    /// Extra YAML under the target's `spec.warmup`.
    warmup_extra: String,
}

impl Model {
    /// `file` from tests/data with a fixture made by `kiln-agent fixtures --reference
    /// onnxruntime --inputs <file>-inputs.safetensors`.
    fn new(file: &str, inputs: Vec<Io>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("model.onnx");
        std::fs::copy(data(&format!("ort/{file}.onnx")), &model).expect("copy model");
        let (sha, size) = sha256_file(&model).expect("hash");
        let fixture = dir.path().join("fixture.safetensors");
        let fixture_sha = ort_fixture(
            &library(Release::Pinned),
            &model,
            &data(&format!("ort/{file}-inputs.safetensors")),
            &fixture,
        );
        Self {
            dir,
            sha,
            size,
            fixture_sha,
            inputs,
            backend: "{kind: onnxruntime}".into(),
            tolerance: "{atol: 1.0e-5, rtol: 1.0e-4}",
            profile: "{}",
            warmup_extra: String::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn yaml(&self) -> String {
        let inputs: String = self
            .inputs
            .iter()
            .map(|i| {
                format!(
                    "\n    - {{name: \"{}\", dtype: {}, dims: [{}]}}",
                    i.name, i.dtype, i.dims
                )
            })
            .collect();
        format!(
            r#"apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {{name: m}}
spec:
  source: {{uri: "file://model.onnx", sha256: "{}", size: {}}}
  format: onnx
  inputs:{inputs}
  fixtures:
    - {{version: v1, uri: "file://fixture.safetensors", sha256: "{}"}}
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {{name: m-cpu}}
spec:
  modelRef: {{name: m}}
  backend: {}
  profiles: [{{name: p, dims: {}}}]
  warmup:
    iterations: 5
    fixtureVersion: v1
    defaultTolerance: {}{}
"#,
            self.sha,
            self.size,
            self.fixture_sha,
            self.backend,
            self.profile,
            self.tolerance,
            self.warmup_extra
        )
    }

    fn run(&self, env: &[(&str, &Path)]) -> Run {
        std::fs::write(self.path("kiln.yaml"), self.yaml()).expect("yaml");
        run_local_env(
            &self.path("kiln.yaml"),
            &self.path("store"),
            &self.path("metrics.prom"),
            env,
        )
    }

    fn run_ort(&self) -> Run {
        self.run(&[("ORT_DYLIB_PATH", &library(Release::Pinned))])
    }

    /// The stored build manifest of the outcome's compile key.
    fn manifest(&self, run: &Run) -> Value {
        let key = run.outcome["compileKey"].as_str().expect("compile key");
        let path = self
            .path("store")
            .join("artifacts")
            .join(key)
            .join("manifest.json");
        serde_json::from_slice(&std::fs::read(path).expect("manifest")).expect("json")
    }
}

/// The example SqueezeNet (its tract-made fixture) on ONNX Runtime.
fn squeezenet(backend: &str) -> Model {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/squeezenet");
    for f in ["model.onnx", "fixture-v1.safetensors"] {
        std::fs::copy(example.join(f), dir.path().join(f)).expect("copy example");
    }
    std::fs::rename(
        dir.path().join("fixture-v1.safetensors"),
        dir.path().join("fixture.safetensors"),
    )
    .expect("rename");
    let (sha, size) = sha256_file(&dir.path().join("model.onnx")).expect("hash");
    let (fixture_sha, _) = sha256_file(&dir.path().join("fixture.safetensors")).expect("hash");
    Model {
        dir,
        sha,
        size,
        fixture_sha,
        inputs: vec![Io {
            name: "data_0",
            dtype: "f32",
            dims: "{symbol: batch, min: 1, max: 8}, {size: 3}, {size: 224}, {size: 224}",
        }],
        backend: backend.into(),
        tolerance: "{atol: 1.0e-4, rtol: 1.0e-3}",
        profile: "{batch: 1}",
        warmup_extra: String::new(),
    }
}

fn run_squeezenet(m: &Model) -> Run {
    m.run_ort()
}

#[test]
fn the_example_runs_on_onnxruntime_with_partition_evidence_everywhere() {
    let m = squeezenet("{kind: onnxruntime}");
    let run = run_squeezenet(&m);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert_eq!(run.outcome["ready"], true);
    // Every node ran on the CPU provider that was asked for: one partition, nothing fell back.
    let p = &run.outcome["placement"];
    assert_eq!(p["requested"], "cpu", "{p}");
    let cpu_nodes = p["nodes"]["cpu"].as_i64().expect("cpu nodes");
    assert!(cpu_nodes >= 10, "{p}");
    assert_eq!(p["nodes"].as_object().map(|o| o.len()), Some(1), "{p}");
    assert_eq!(
        (p["partitions"].as_i64(), p["fallbackShare"].as_f64()),
        (Some(1), Some(0.0))
    );
    // The profile's real durations: kernel time on the CPU, none of it fallback (the CPU was
    // asked for), no shape or compute fallback nodes, nothing copied between providers.
    // (Mixed placements need a GPU provider, which the CPU wheel lacks: they are tested on
    // written profiles in backend/onnxruntime/profile.rs.)
    let kernel = p["kernelSeconds"]["cpu"].as_f64().expect("cpu kernel time");
    assert!(kernel > 0.0 && kernel < 60.0, "{p}");
    assert_eq!(p["fallbackTimeShare"].as_f64(), Some(0.0), "{p}");
    assert_eq!(
        (
            p["shapeNodeCount"].as_i64(),
            p["computeNodeCount"].as_i64(),
            p["transferCount"].as_i64()
        ),
        (Some(0), Some(0), Some(0)),
        "{p}"
    );
    // The first request after Ready is measured (the goal, within 1.2x p50, is a figure for
    // the benchmarks, not a timed assertion).
    assert!(
        run.outcome["firstRequestSeconds"]
            .as_f64()
            .is_some_and(|s| s > 0.0)
    );
    // The build manifest names the library's bytes, the settings and the compile's placement.
    let manifest = m.manifest(&run);
    let (lib_sha, _) = sha256_file(&library(Release::Pinned)).expect("hash library");
    assert_eq!(manifest["backend"], "onnxruntime");
    assert_eq!(manifest["backendVersion"], "1.31.1");
    assert_eq!(manifest["runtimeDigest"], json!(lib_sha));
    assert_eq!(
        manifest["backendOptions"],
        json!({"cpuFallback": "Allowed", "executionProvider": "cpu", "optimizationLevel": "extended"})
    );
    assert_eq!(manifest["placement"]["nodes"]["cpu"], json!(cpu_nodes));
    assert!(
        manifest["placement"]["kernelSeconds"]["cpu"]
            .as_f64()
            .is_some_and(|s| s > 0.0),
        "the compile's parity run is profiled too: {manifest}"
    );
    assert!(
        manifest["boundTo"].is_null(),
        "extended is portable: {manifest}"
    );
    assert!(
        manifest["converterLog"][0]
            .as_str()
            .is_some_and(|l| l.contains("CPUExecutionProvider at level extended")),
        "{manifest}"
    );
    // Metrics: nodes per provider, partitions and the fallback share, by class.
    let class = run.outcome["class"].as_str().expect("class");
    let exposition = std::fs::read_to_string(m.path("metrics.prom")).expect("metrics");
    let target = format!("namespace=\"\",target=\"m-cpu\",class=\"{class}\"");
    assert_eq!(
        metric(
            &exposition,
            &format!("kiln_agent_partition_nodes{{{target},provider=\"cpu\"}}")
        ),
        Some(cpu_nodes as f64),
        "{exposition}"
    );
    assert_eq!(
        metric(&exposition, &format!("kiln_agent_partitions{{{target}}}")),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &exposition,
            &format!("kiln_agent_fallback_share{{{target}}}")
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &exposition,
            &format!("kiln_agent_fallback_time_share{{{target}}}")
        ),
        Some(0.0)
    );
    assert!(
        metric(
            &exposition,
            &format!("kiln_agent_partition_kernel_seconds{{{target},provider=\"cpu\"}}")
        )
        .is_some_and(|s| s > 0.0),
        "{exposition}"
    );

    // tract reports the same fields: one partition on `tract`, no fallback.
    let t = squeezenet("{kind: tract}");
    let run = run_squeezenet(&t);
    assert!(run.success, "{}", run.message());
    let p = &run.outcome["placement"];
    assert_eq!(
        (p["requested"].as_str(), p["partitions"].as_i64()),
        (Some("tract"), Some(1)),
        "{p}"
    );
    assert!(p["nodes"]["tract"].as_i64().is_some_and(|n| n > 0), "{p}");
    assert!(
        p["kernelSeconds"].is_null(),
        "tract measures no kernel time: {p}"
    );
    assert_eq!(p["computeNodeCount"].as_i64(), Some(0), "{p}");
}

#[test]
fn the_settings_and_the_library_are_in_the_compile_key() {
    let keys: Vec<String> = [
        "{kind: onnxruntime}",
        "{kind: onnxruntime, executionProvider: cpu, optimizationLevel: extended, cpuFallback: {policy: Allowed}}",
        "{kind: onnxruntime, optimizationLevel: basic}",
        "{kind: onnxruntime, cpuFallback: {policy: Forbidden}}",
        "{kind: onnxruntime, cpuFallback: {policy: UpToShare, maxSharePercent: 5}}",
        "{kind: onnxruntime, cpuFallback: {policy: Strict}}",
    ]
    .iter()
    .map(|backend| {
        let m = squeezenet(backend);
        let run = run_squeezenet(&m);
        // On the CPU provider nothing can fall back, so every policy is ready.
        assert!(run.success, "{backend}: {}", run.message());
        run.outcome["compileKey"].as_str().expect("key").to_string()
    })
    .collect();
    assert_eq!(keys[0], keys[1], "spelled-out defaults are the same key");
    let distinct: std::collections::BTreeSet<_> = keys[1..].iter().collect();
    assert_eq!(distinct.len(), 5, "every setting changes the key: {keys:?}");
}

#[test]
fn cuda_graphs_on_a_cpu_class_change_nothing_and_fixture_samples_alternate() {
    // The CUDA settings apply only to the CUDA provider: on this CPU class a target with CUDA
    // graphs compiles, warms (alternating a fixture of two samples, each against its own golden
    // outputs) and keys exactly as one without them.
    let mut m = squeezenet("{kind: onnxruntime, cpuFallback: {policy: Forbidden}}");
    let fixture = m.path("fixture.safetensors");
    let made = Command::new(common::AGENT)
        .args(["fixtures", "--fixture-version", "v1", "--samples", "2"])
        .args(["--shape", "data_0=1,3,224,224"])
        .arg("--model")
        .arg(m.path("model.onnx"))
        .arg("--out")
        .arg(&fixture)
        .output()
        .expect("kiln-agent fixtures");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let bytes = std::fs::read(&fixture).expect("fixture");
    m.fixture_sha = sha256_bytes(&bytes);
    let names = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).to_string();
    assert!(
        names.contains("sample1/input/data_0") && names.contains("sample1/output/"),
        "a second sample in the fixture's header"
    );
    let plain = m.run_ort();
    assert!(plain.success, "{}", plain.message());
    m.backend =
        "{kind: onnxruntime, cpuFallback: {policy: Forbidden}, cuda: {cudaGraphs: true}}".into();
    let graphs = m.run_ort();
    assert!(graphs.success, "{}", graphs.message());
    assert_eq!(
        graphs.outcome["compileKey"], plain.outcome["compileKey"],
        "cudaGraphs keys only CUDA classes"
    );
}

#[test]
fn a_later_release_serving_the_api_is_accepted_and_keyed_by_its_bytes() {
    // ONNX Runtime's C API is backward compatible: 1.32.0 serves API 31 and runs the example.
    let m = squeezenet("{kind: onnxruntime}");
    let newer = m.run(&[("ORT_DYLIB_PATH", &library(Release::Newer))]);
    assert!(newer.success, "{}\n{}", newer.message(), newer.stderr);
    let manifest = m.manifest(&newer);
    assert_eq!(manifest["backendVersion"], "1.32.0");
    let (lib_sha, _) = sha256_file(&library(Release::Newer)).expect("hash library");
    assert_eq!(manifest["runtimeDigest"], json!(lib_sha));
    // The version and the bytes stay in the compile key: the pinned release is another key, and
    // neither library's artifact is reused by the other.
    let pinned = m.run_ort();
    assert!(pinned.success, "{}", pinned.message());
    assert_ne!(pinned.outcome["compileKey"], newer.outcome["compileKey"]);
    assert_eq!(pinned.outcome["cacheHit"], false);
}

/// The candidates of an `auto` outcome: (engine, passed, p50 seconds).
fn candidates(run: &Run) -> Vec<(String, bool, Option<f64>)> {
    run.outcome["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .map(|c| {
            (
                c["engine"].as_str().unwrap_or("").to_string(),
                c["passed"] == true,
                c["p50Seconds"].as_f64(),
            )
        })
        .collect()
}

#[test]
fn auto_builds_measures_and_keeps_the_fastest_engine_that_passes() {
    let m = squeezenet("{kind: auto}");
    let Some(iree) = common::signing::ensured("iree") else {
        return;
    };
    let ort = library(Release::Pinned);
    let with = [
        ("ORT_DYLIB_PATH", ort.as_path()),
        ("KILN_IREE_BIN", iree.as_path()),
    ];
    let run = m.run(&with);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert!(run.outcome["engineReason"].is_string());
    // The three engines this CPU class can run were built, checked and measured.
    let tried = candidates(&run);
    let names: Vec<&str> = tried.iter().map(|(n, ..)| n.as_str()).collect();
    assert_eq!(
        names,
        ["tract", "onnxruntime/cpu", "iree"],
        "{}",
        run.outcome
    );
    assert!(
        tried
            .iter()
            .all(|(_, passed, p50)| *passed && p50.is_some())
    );
    // The kept one follows the rule on the measured figures: a later candidate only when its
    // p50 is more than 10% below the one kept so far.
    let mut kept = 0;
    for (i, (_, _, p50)) in tried.iter().enumerate().skip(1) {
        if p50.unwrap_or(f64::MAX) < tried[kept].2.unwrap_or(0.0) * 0.9 {
            kept = i;
        }
    }
    let expected = tried[kept].0.as_str();
    assert_eq!(run.outcome["engine"], expected, "{}", run.outcome);
    let why = run.outcome["engineReason"].as_str().expect("reason");
    assert!(why.starts_with(&format!("{expected} kept: p50")), "{why}");
    // The build manifest records the selection; its backend is the kept engine's, which is
    // what the node loaded.
    let manifest = m.manifest(&run);
    assert_eq!(manifest["selection"]["engine"], expected);
    assert_eq!(
        manifest["selection"]["candidates"].as_array().map(Vec::len),
        Some(3)
    );
    assert_eq!(
        manifest["backend"],
        expected.split('/').next().unwrap_or("")
    );
    assert_eq!(manifest["compileKey"], run.outcome["compileKey"]);
    // A second run finds the class's choice in the store: nothing is measured again.
    let again = m.run(&with);
    assert!(again.success, "{}", again.message());
    assert_eq!(again.outcome["cacheHit"], true);
    assert_eq!(again.outcome["engine"], expected);
    // Without IREE's compiler (the agent image) its candidate is a classified refusal, left out
    // of the backend identity: another key, built by the other two.
    let without = m.run_ort();
    assert!(without.success, "{}", without.message());
    assert_ne!(without.outcome["compileKey"], run.outcome["compileKey"]);
    let refused = &without.outcome["candidates"][2];
    assert_eq!(
        (&refused["engine"], &refused["reason"]),
        (&json!("iree"), &json!("IncompatibleRuntime")),
        "{}",
        without.outcome
    );
}

#[test]
fn auto_keeps_the_engine_that_runs_a_model_another_cannot() {
    let (file, inputs) = control_flow_models().remove(0);
    let mut m = Model::new(file, inputs);
    m.backend = "{kind: auto}".into();
    let run = m.run_ort();
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert_eq!(run.outcome["engine"], "onnxruntime/cpu");
    // tract's refusal is evidence, with its reason and message.
    let tract = &run.outcome["candidates"][0];
    assert_eq!(
        (tract["engine"].as_str(), tract["passed"].as_bool()),
        (Some("tract"), Some(false))
    );
    assert_eq!(tract["reason"], "UnsupportedOperator");
    let why = run.outcome["engineReason"].as_str().expect("reason");
    assert!(
        why.contains("tract did not pass (UnsupportedOperator"),
        "{why}"
    );
}

#[test]
fn auto_fails_only_when_no_candidate_passes_naming_each() {
    // A golden moved by half: every engine computes the real value, none passes parity.
    let (file, inputs) = control_flow_models().remove(0);
    let mut m = Model::new(file, inputs);
    m.backend = "{kind: auto}".into();
    let mut fixture =
        kiln_engines::pipeline::fixtures::FixtureFile::read(&m.path("fixture.safetensors"))
            .expect("fixture");
    let out = fixture.outputs.get_mut("output").expect("output");
    let v = f32::from_le_bytes(out.data[..4].try_into().expect("f32")) + 0.5;
    out.data[..4].copy_from_slice(&v.to_le_bytes());
    let bytes = fixture.to_bytes().expect("bytes");
    std::fs::write(m.path("fixture.safetensors"), &bytes).expect("write");
    m.fixture_sha = sha256_bytes(&bytes);
    m.run_ort().fails_with(
        "UnsupportedOperator",
        &[
            "no engine candidate passed",
            "tract: UnsupportedOperator",
            "onnxruntime/cpu: ParityExceeded",
        ],
    );
}

#[test]
fn auto_without_the_onnx_runtime_library_keys_and_keeps_tract() {
    // A worker without the library has one candidate, and another compile key: what the
    // workers carry is part of the key.
    let m = squeezenet("{kind: auto}");
    let without = m.run(&[("ORT_DYLIB_PATH", Path::new(""))]);
    assert!(without.success, "{}", without.message());
    assert_eq!(without.outcome["engine"], "tract");
    let ort = &without.outcome["candidates"][1];
    assert_eq!(
        (ort["engine"].as_str(), ort["reason"].as_str()),
        (Some("onnxruntime/cpu"), Some("IncompatibleRuntime"))
    );
    let with = m.run_ort();
    assert!(with.success, "{}", with.message());
    assert_ne!(with.outcome["compileKey"], without.outcome["compileKey"]);
}

/// The models tract cannot compile, with their interfaces.
fn control_flow_models() -> Vec<(&'static str, Vec<Io>)> {
    let io = |name, dtype, dims| Io { name, dtype, dims };
    vec![
        (
            "silero-vad",
            vec![
                io("input", "f32", "{size: 1}, {size: 512}"),
                io("state", "f32", "{size: 2}, {size: 1}, {size: 128}"),
                io("sr", "i64", ""),
            ],
        ),
        (
            "loop11",
            vec![
                io("trip_count", "i64", ""),
                io("cond", "bool", ""),
                io("y", "f32", "{size: 1}"),
            ],
        ),
        (
            "range-loop",
            vec![
                io("start", "f32", ""),
                io("limit", "f32", ""),
                io("delta", "f32", ""),
            ],
        ),
        ("if", vec![io("cond", "bool", "")]),
    ]
}

#[test]
fn models_tract_cannot_compile_are_ready_on_onnxruntime() {
    for (file, inputs) in control_flow_models() {
        let mut m = Model::new(file, inputs);
        let run = m.run_ort();
        assert!(
            run.success,
            "{file} on onnxruntime: {}\n{}",
            run.message(),
            run.stderr
        );
        assert_eq!(run.outcome["placement"]["requested"], "cpu", "{file}");
        assert_eq!(run.outcome["placement"]["fallbackNodeCount"], 0, "{file}");

        // tract on the same model fails before its analyser does, naming the node and op.
        m.backend = "{kind: tract}".into();
        let _ = std::fs::remove_dir_all(m.path("store"));
        let run = m.run(&[]);
        assert!(!run.success, "{file} must not compile on tract");
        let why = match file {
            "silero-vad" => "If on a condition computed at run time from input sr (node \"If_0\")",
            "if" => "If on a condition computed at run time from input cond (node \"res\")",
            "loop11" => "Loop (node \"res_y\")",
            _ => "Loop (node \"Range_test_range_float_type_positive_delta_expanded_function",
        };
        assert_eq!(
            run.reason(),
            "UnsupportedOperator",
            "{file}: {}",
            run.message()
        );
        assert!(run.message().contains(why), "{file}: {}", run.message());
        assert!(!run.message().contains("analyse"), "{}", run.message());
    }
}

#[test]
fn a_transformer_encoder_compiles_on_tract_with_onnx_runtime_parity() {
    let mut m = Model::new(
        "encoder",
        vec![Io {
            name: "x",
            dtype: "f32",
            dims: "{symbol: batch, min: 1, max: 8}, {symbol: sequence, min: 1, max: 128}, {size: 32}",
        }],
    );
    m.backend = "{kind: tract}".into();
    m.profile = "{batch: 2, sequence: 8}";
    let run = m.run(&[]);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    // The artifact holds the fused operators, in the registries that load read back from.
    let graph = nnef_graph(&m, &run);
    for needle in [
        "extension tract_registry kiln;",
        "kiln_gelu_exact(",
        "extension tract_registry tract_transformers;",
        "tract_transformers_sdpa(",
    ] {
        assert!(graph.contains(needle), "{needle} not in\n{graph}");
    }
}

/// `graph.nnef` of the one profile of the tract artifact the run stored.
fn nnef_graph(m: &Model, run: &Run) -> String {
    let key = run.outcome["compileKey"].as_str().expect("compile key");
    let artifact = m.path("store").join("artifacts").join(key).join("artifact");
    let find = |bytes: &[u8], name: &str| -> Vec<u8> {
        let mut archive = tar::Archive::new(bytes);
        let mut entries = archive.entries().expect("tar");
        let mut entry = entries
            .find(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().is_ok_and(|p| p.ends_with(name)))
            })
            .unwrap_or_else(|| panic!("no {name}"))
            .expect("entry");
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut out).expect("read");
        out
    };
    let outer = std::fs::read(artifact).expect("artifact");
    let profile = find(&outer, "profiles/p.nnef.tar");
    String::from_utf8(find(&profile, "graph.nnef")).expect("utf-8")
}

#[test]
fn a_golden_moved_by_half_is_parity_exceeded_on_onnxruntime() {
    let (file, inputs) = control_flow_models().remove(0);
    let mut m = Model::new(file, inputs);
    let mut fixture =
        kiln_engines::pipeline::fixtures::FixtureFile::read(&m.path("fixture.safetensors"))
            .expect("fixture");
    let out = fixture
        .outputs
        .get_mut("output")
        .expect("VAD probability output");
    let mut v = f32::from_le_bytes(out.data[..4].try_into().expect("f32"));
    v += 0.5;
    out.data[..4].copy_from_slice(&v.to_le_bytes());
    let bytes = fixture.to_bytes().expect("bytes");
    std::fs::write(m.path("fixture.safetensors"), &bytes).expect("write");
    m.fixture_sha = sha256_bytes(&bytes);
    m.run_ort().fails_with("ParityExceeded", &["output"]);
}

#[test]
fn layout_optimised_artifacts_are_bound_to_their_cpu_level() {
    let m = squeezenet("{kind: onnxruntime, optimizationLevel: all}");
    let run = run_squeezenet(&m);
    assert!(run.success, "{}", run.message());
    let manifest = m.manifest(&run);
    let bound = &manifest["boundTo"];
    assert_eq!(
        bound["cpuLevel"], manifest["host"]["cpuLevel"],
        "{manifest}"
    );
    assert!(
        bound["why"]
            .as_str()
            .is_some_and(|w| w.contains("instruction set")),
        "{bound}"
    );
    // The same stored artifact, as if built on a machine of another level: refused before load.
    let key = run.outcome["compileKey"].as_str().expect("key").to_string();
    let path = m
        .path("store")
        .join("artifacts")
        .join(&key)
        .join("manifest.json");
    let mut edited = manifest.clone();
    let other = if bound["cpuLevel"] == "x86-64-v2" {
        "x86-64-v4"
    } else {
        "x86-64-v2"
    };
    edited["boundTo"]["cpuLevel"] = json!(other);
    std::fs::write(&path, serde_json::to_vec_pretty(&edited).expect("json")).expect("write");
    // Signed as the store's own key would (the check under test lies behind the signature).
    common::resign(&m.path("store"), &key).expect("re-sign");
    let run = run_squeezenet(&m);
    run.fails_with(
        "IncompatibleHardware",
        &["bound to amd64", other, "classLabelKeys"],
    );
}

#[test]
fn a_missing_wrong_or_foreign_library_is_incompatible_runtime_saying_what_to_install() {
    let m = squeezenet("{kind: onnxruntime}");
    std::fs::write(m.path("kiln.yaml"), m.yaml()).expect("yaml");
    let run_with = |env: &[(&str, &Path)]| {
        run_local_env(
            &m.path("kiln.yaml"),
            &m.path("store"),
            &m.path("metrics.prom"),
            env,
        )
    };
    // None configured (an empty ORT_DYLIB_PATH counts as unset).
    run_with(&[("ORT_DYLIB_PATH", Path::new(""))]).fails_with(
        "IncompatibleRuntime",
        &[
            "none is configured",
            "scripts/ensure-onnxruntime.sh",
            "--onnxruntime-lib",
        ],
    );
    // A path that does not exist.
    run_with(&[("ORT_DYLIB_PATH", &m.path("nope.so"))])
        .fails_with("IncompatibleRuntime", &["nope.so", "ensure-onnxruntime.sh"]);
    // A file that is not a shared library.
    run_with(&[("ORT_DYLIB_PATH", &m.path("model.onnx"))]).fails_with(
        "IncompatibleRuntime",
        &["cannot load ONNX Runtime", "ensure-onnxruntime.sh"],
    );
    // A real ONNX Runtime too old for the binding's C API: refused naming the minimum, never a
    // silent switch to tract.
    run_with(&[("ORT_DYLIB_PATH", &library(Release::Old))]).fails_with(
        "IncompatibleRuntime",
        &["1.20.1", ">= '1.31.x'", "ensure-onnxruntime.sh"],
    );
    assert!(
        !m.path("store").join("artifacts").exists()
            || std::fs::read_dir(m.path("store").join("artifacts"))
                .map(|d| d.count() == 0)
                .unwrap_or(true),
        "nothing stored"
    );
}

#[test]
fn a_provider_the_library_lacks_is_refused_not_replaced_by_the_cpu() {
    // The CPU wheel has no CUDA provider: asking for it must fail, not run on the CPU.
    let m = squeezenet("{kind: onnxruntime, executionProvider: cuda}");
    let run = run_squeezenet(&m);
    run.fails_with(
        "IncompatibleRuntime",
        &[
            "CUDA execution provider",
            "does not carry the requested execution provider",
        ],
    );
    assert!(run.outcome["placement"].is_null(), "nothing ran");
}

#[test]
fn peak_memory_is_measured_and_held_to_the_budget() {
    let mut m = squeezenet("{kind: onnxruntime}");
    // A device budget applies only on a node with a GPU; this one has none (or runs the CPU
    // provider), so nothing is measured: the figure is absent, never 0.
    m.warmup_extra = "\n    memoryBudget: 4Gi\n    deviceMemoryBudget: 1k".into();
    let run = m.run_ort();
    assert!(run.success, "{}", run.message());
    assert!(
        run.outcome["peakDeviceMemoryBytes"].is_null(),
        "{}",
        run.outcome
    );
    let peak = run.outcome["peakMemoryBytes"]
        .as_u64()
        .expect("peak measured");
    assert!(peak > 0 && peak < 4 << 30, "{peak}");
    let exposition = std::fs::read_to_string(m.path("metrics.prom")).expect("metrics");
    let class = run.outcome["class"].as_str().expect("class");
    assert_eq!(
        metric(
            &exposition,
            &format!(
                "kiln_agent_engine_peak_memory_bytes{{namespace=\"\",target=\"m-cpu\",class=\"{class}\"}}"
            )
        ),
        Some(peak as f64)
    );
    // An engine bigger than its budget fails after warmup, with the measured figure.
    m.warmup_extra = "\n    memoryBudget: 1k".into();
    m.run_ort().fails_with(
        "MemoryBudgetExceeded",
        &["peaked", "over warmup.memoryBudget 1000 bytes"],
    );
    // A budget no node of this size can hold is refused before anything is loaded.
    m.warmup_extra = "\n    memoryBudget: 64Ti".into();
    let run = m.run_ort();
    run.fails_with(
        "IncompatibleHardware",
        &["memoryBudget 64Ti", "does not fit this node"],
    );
    assert!(run.outcome["placement"].is_null(), "nothing was loaded");
}

#[test]
fn onnx_runtime_telemetry_is_switched_off_before_the_library_loads() {
    // The official library's telemetry SDK keeps a `.ses` session file in $TMPDIR unless
    // ORT_DISABLE_TELEMETRY=1 is set before it loads; kiln-agent sets it for itself.
    let m = squeezenet("{kind: onnxruntime}");
    let tmp = m.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    std::fs::write(m.path("kiln.yaml"), m.yaml()).expect("yaml");
    let run = run_local_env(
        &m.path("kiln.yaml"),
        &m.path("store"),
        &m.path("metrics.prom"),
        &[
            ("ORT_DYLIB_PATH", &library(Release::Pinned)),
            ("TMPDIR", &tmp),
        ],
    );
    assert!(run.success, "{}", run.message());
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "ONNX Runtime left {left:?} in TMPDIR");
}
