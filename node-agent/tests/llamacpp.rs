//! `backend.kind: llamacpp` through `kiln-agent fixtures` and `kiln-agent local` on a real
//! llama.cpp (built from source by the `llama-cpp-2` crate) and a llama-architecture GGUF with
//! random weights and its tokenizer inside (examples/tiny-llama/, written by the PyPI `gguf`
//! package): golden logits and greedy tokens made by the reference (the unquantised source),
//! Ready unquantised and requantised to Q8_0 and Q4_K_M, `auto` picking by the memory budget and
//! by the class's host memory (`kiln.dev/memory-gib`),
//! a wrong golden refused as `ParityExceeded`, and hostile files (not GGUF, truncated, an
//! architecture llama.cpp does not know, GGUF on an ONNX engine) refused with their reasons.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{GgufSpec, Run, data, run_local};
use kiln_engines::backend::tensor::HostTensor;
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_store::staged::{sha256_bytes, sha256_file};
use safetensors::Dtype;
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_kiln-agent");
/// A prompt of 8 token ids of the tiny vocabulary (`<s>` then word pieces).
const PROMPT: [i32; 8] = [1, 260, 262, 270, 281, 290, 300, 311];
const GENERATE: i32 = 6;

/// The example's model (examples/tiny-llama/make.py).
fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny-llama/model.gguf")
}

fn i32s(values: &[i32]) -> HostTensor {
    HostTensor {
        dtype: Dtype::I32,
        shape: vec![values.len()],
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// A GGUF model, its llama.cpp-made fixture and the YAML of a local run.
struct Lm {
    dir: tempfile::TempDir,
    sha: String,
    size: u64,
    fixture_sha: String,
    /// `spec.backend` of the target.
    backend: String,
    /// `spec.warmup.outputs` of the target.
    outputs: String,
    /// Extra YAML under `spec.warmup`.
    warmup_extra: String,
}

impl Lm {
    /// The tiny model with a fixture from `kiln-agent fixtures --reference llamacpp`.
    fn new(backend: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("model.gguf");
        std::fs::copy(tiny(), &model).expect("copy model");
        let inputs = FixtureFile {
            version: "inputs".into(),
            model_sha256: None,
            tolerance: None,
            inputs: [
                ("prompt".to_string(), i32s(&PROMPT)),
                ("generate".to_string(), i32s(&[GENERATE])),
            ]
            .into(),
            outputs: Default::default(),
            more: Vec::new(),
            text: Default::default(),
        };
        let inputs_path = dir.path().join("inputs.safetensors");
        std::fs::write(&inputs_path, inputs.to_bytes().expect("bytes")).expect("write inputs");
        let fixture = dir.path().join("fixture.safetensors");
        let out = Command::new(AGENT)
            .args([
                "fixtures",
                "--reference",
                "llamacpp",
                "--fixture-version",
                "v1",
            ])
            .arg("--model")
            .arg(&model)
            .arg("--inputs")
            .arg(&inputs_path)
            .arg("--out")
            .arg(&fixture)
            .output()
            .expect("run kiln-agent fixtures");
        assert!(
            out.status.success(),
            "fixtures --reference llamacpp: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (sha, size) = sha256_file(&model).expect("hash");
        let fixture_sha = sha256_bytes(&std::fs::read(&fixture).expect("fixture"));
        Self {
            dir,
            sha,
            size,
            fixture_sha,
            backend: backend.into(),
            outputs:
                "[{name: logits, atol: 1.0e-4, rtol: 1.0e-4}, {name: tokens, atol: 0, rtol: 0}]"
                    .into(),
            warmup_extra: String::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn fixture(&self) -> FixtureFile {
        FixtureFile::read(&self.path("fixture.safetensors")).expect("fixture")
    }

    fn write_fixture(&mut self, f: &FixtureFile) {
        let bytes = f.to_bytes().expect("bytes");
        std::fs::write(self.path("fixture.safetensors"), &bytes).expect("write");
        self.fixture_sha = sha256_bytes(&bytes);
    }

    /// Replaces the model with `bytes` (declared by their own digest and size).
    fn replace_model(&mut self, bytes: &[u8]) {
        std::fs::write(self.path("model.gguf"), bytes).expect("write model");
        self.sha = sha256_bytes(bytes);
        self.size = bytes.len() as u64;
    }

    fn yaml(&self) -> String {
        GgufSpec {
            sha: &self.sha,
            size: self.size,
            fixture_sha: &self.fixture_sha,
            backend: &self.backend,
            len: PROMPT.len(),
            max_len: 64,
            outputs: &self.outputs,
            warmup_extra: &self.warmup_extra,
        }
        .yaml()
    }

    fn run(&self) -> Run {
        std::fs::write(self.path("kiln.yaml"), self.yaml()).expect("yaml");
        run_local(
            &self.path("kiln.yaml"),
            &self.path("store"),
            &self.path("metrics.prom"),
        )
    }

    fn manifest(&self, run: &Run) -> Value {
        let key = run.outcome["compileKey"].as_str().expect("compile key");
        let path = self.path("store/artifacts").join(key).join("manifest.json");
        serde_json::from_slice(&std::fs::read(path).expect("manifest")).expect("json")
    }
}

#[test]
fn the_reference_fixture_holds_last_position_logits_and_greedy_tokens() {
    let lm = Lm::new("{kind: llamacpp}");
    let f = lm.fixture();
    assert_eq!(f.inputs["prompt"], i32s(&PROMPT));
    let logits = &f.outputs["logits"];
    assert_eq!(
        (logits.dtype, logits.shape.clone()),
        (Dtype::F32, vec![312])
    );
    let tokens = &f.outputs["tokens"];
    assert_eq!((tokens.dtype, tokens.shape.clone()), (Dtype::I32, vec![6]));
    // The first greedy token is the argmax of the golden logits.
    let l = logits.to_f64().expect("f64");
    let best = (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b });
    assert_eq!(tokens.to_f64().expect("f64")[0] as usize, best);
    // Random weights scaled so the logits spread: greedy choices are clear, not ties.
    let (min, max) = l
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
    assert!(max - min > 1.0, "logits span {min}..{max}");
}

#[test]
fn unquantised_is_ready_with_exact_parity_and_generation_figures() {
    let lm = Lm::new("{kind: llamacpp, llamacpp: {contextLength: 64}}");
    let run = lm.run();
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert_eq!(run.outcome["ready"], true);
    let m = lm.manifest(&run);
    assert_eq!(m["backend"], "llamacpp");
    assert_eq!(m["backendVersion"], "0.1.160");
    let options = &m["backendOptions"];
    assert_eq!(options["llamacpp.weights"], "source", "{options}");
    assert_eq!(options["llamacpp.contextLength"], "64", "{options}");
    assert_eq!(options["llamacpp.sourceBytes"], lm.size.to_string());
    let g = &run.outcome["generation"];
    assert_eq!(g["promptTokens"], 8, "{}", run.outcome);
    assert_eq!(g["generatedTokens"], 6);
    assert!(g["prefillSeconds"].as_f64().expect("prefill") > 0.0);
    assert!(g["decodeTokensPerSecond"].as_f64().expect("decode") > 0.0);
    // The steady state is the median of the three warmup runs (one context, its KV cache
    // cleared before each: every run passed parity at 1e-4 above), the first request apart.
    assert_eq!(g["runs"], 3, "{}", run.outcome);
    assert!(g["firstRequestPrefillSeconds"].as_f64().expect("first") > 0.0);
    assert!(
        g["firstRequestDecodeTokensPerSecond"]
            .as_f64()
            .expect("first")
            > 0.0
    );
    let metrics = std::fs::read_to_string(lm.path("metrics.prom")).expect("metrics");
    for series in [
        "kiln_agent_prefill_seconds",
        "kiln_agent_decode_tokens_per_second",
    ] {
        let value = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{series}{{")) && l.contains("target=\"lm-cpu\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        assert!(value.is_some_and(|v| v > 0.0), "{series}: {metrics}");
    }
}

#[test]
fn q8_0_is_ready_within_its_tolerance_and_q4_k_m_changes_the_answer() {
    let q = |quantization: &str, atol: f64| {
        let mut lm = Lm::new(&format!(
            "{{kind: llamacpp, llamacpp: {{quantization: {quantization}, contextLength: 64}}}}"
        ));
        lm.outputs = format!(
            "[{{name: logits, atol: {atol}, rtol: 0.1}}, {{name: tokens, atol: 0, rtol: 0, firstElements: 2}}]"
        );
        let run = lm.run();
        (lm, run)
    };
    let (lm, run) = q("Q8_0", 0.5);
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    let m = lm.manifest(&run);
    let options = &m["backendOptions"];
    assert_eq!(options["llamacpp.weights"], "Q8_0", "{options}");
    let gguf: f64 = options["llamacpp.ggufBytes"]
        .as_str()
        .expect("size")
        .parse()
        .expect("n");
    // 8.5 bits of 32 for the matrices; the norms stay F32.
    assert!(
        gguf < 0.35 * lm.size as f64,
        "{gguf} bytes from {}",
        lm.size
    );
    assert!(
        m["converterLog"][0]
            .as_str()
            .expect("log")
            .contains("requantised")
    );
    // Random weights have no structure a 4-bit quantiser keeps: the greedy answer moves, and
    // the compile fails closed before anything is stored, though the logits are within 4.
    let (lm, run) = q("Q4_K_M", 4.0);
    run.fails_with("ParityExceeded", &["output tokens", "element 0"]);
    assert!(
        !lm.path("store/artifacts").exists()
            || std::fs::read_dir(lm.path("store/artifacts"))
                .expect("dir")
                .next()
                .is_none()
    );
}

#[test]
fn auto_takes_the_largest_type_the_memory_budget_holds() {
    // 64 MiB of fixed overhead plus 1.6 MB of F32 weights fit 80Mi: F32, a copy.
    let mut lm = Lm::new("{kind: llamacpp, llamacpp: {quantization: auto, contextLength: 64}}");
    lm.warmup_extra = "\n    memoryBudget: 80Mi".into();
    let run = lm.run();
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    assert_eq!(
        lm.manifest(&run)["backendOptions"]["llamacpp.weights"],
        "F32"
    );
    // Without a budget or the memory class key, auto is refused at admission.
    lm.warmup_extra = String::new();
    lm.run()
        .fails_with("InvalidSpec", &["memoryBudget", "kiln.dev/memory-gib"]);
}

/// This machine's host memory step, as its agent reports it (`kiln.dev/memory-gib`).
fn memory_step() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kib: i64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("MemTotal");
    kiln_crds::class::memory_gib(kib * 1024).expect("at least 1 GiB")
}

#[test]
fn auto_sized_by_the_class_memory_this_machine_probes() {
    let keys = "\n  classLabelKeys: [kubernetes.io/arch, kiln.dev/cpu-level, kiln.dev/memory-gib]";
    let auto = "{kind: llamacpp, llamacpp: {quantization: auto, contextLength: 64}}";
    let mut lm = Lm::new(auto);
    lm.warmup_extra = keys.into();
    let run = lm.run();
    assert!(run.success, "{}\n{}", run.message(), run.stderr);
    let manifest = lm.manifest(&run);
    let gib = memory_step();
    assert_eq!(manifest["class"]["kiln.dev/memory-gib"], gib.to_string());
    // The figure fit.rs fits: 0.8 of the class's step. The tiny model (about 66 MB with
    // llama.cpp's overhead) fits F32 in any step; fit.rs's unit tests size a 7B model.
    let bytes = (gib as f64 * (1u64 << 30) as f64 * 0.8) as u64;
    let fit = manifest["backendOptions"]["llamacpp.autoFit"]
        .as_str()
        .expect("autoFit");
    assert!(
        fit.contains(&format!(
            "of {bytes} bytes, 0.8 of the class's kiln.dev/memory-gib {gib} GiB"
        )),
        "{fit}"
    );
    assert_eq!(manifest["backendOptions"]["llamacpp.weights"], "F32");
    // The same class compiled again from scratch: the same key and the same bytes.
    let mut again = Lm::new(auto);
    again.warmup_extra = keys.into();
    let second = again.run();
    assert!(second.success, "{}", second.message());
    assert_eq!(run.outcome["compileKey"], second.outcome["compileKey"]);
    assert_eq!(
        run.outcome["artifactDigest"],
        second.outcome["artifactDigest"]
    );
    // A budget under the class's memory is the smaller figure: it decides, and keys.
    lm.warmup_extra = format!("\n    memoryBudget: 80Mi{keys}");
    let budgeted = lm.run();
    assert!(budgeted.success, "{}", budgeted.message());
    assert_ne!(budgeted.outcome["compileKey"], run.outcome["compileKey"]);
    let fit = &lm.manifest(&budgeted)["backendOptions"]["llamacpp.autoFit"];
    assert!(
        fit.as_str()
            .is_some_and(|f| f.contains(&format!("of {} bytes, warmup.memoryBudget", 80u64 << 20))),
        "{fit}"
    );
}

#[test]
fn a_wrong_golden_token_fails_parity() {
    let mut lm = Lm::new("{kind: llamacpp, llamacpp: {contextLength: 64}}");
    let mut f = lm.fixture();
    let tokens = f.outputs.get_mut("tokens").expect("tokens");
    let mut ids: Vec<i32> = tokens
        .to_f64()
        .expect("ids")
        .iter()
        .map(|v| *v as i32)
        .collect();
    ids[1] = (ids[1] + 1) % 312;
    *tokens = i32s(&ids);
    lm.write_fixture(&f);
    lm.run()
        .fails_with("ParityExceeded", &["output tokens", "element 1"]);
    // Checking only the first token, the same fixture passes.
    lm.outputs = "[{name: logits, atol: 1.0e-4, rtol: 1.0e-4}, {name: tokens, atol: 0, rtol: 0, firstElements: 1}]".into();
    let run = lm.run();
    assert!(run.success, "{}", run.message());
}

#[test]
fn hostile_and_mismatched_files_are_refused_with_their_reasons() {
    let model = std::fs::read(tiny()).expect("model");
    let mut lm = Lm::new("{kind: llamacpp}");
    lm.replace_model(&model[..model.len() / 2]);
    lm.run()
        .fails_with("InvalidSpec", &["not a usable GGUF", "truncated"]);
    lm.replace_model(&std::fs::read(data("mlp.onnx")).expect("onnx"));
    lm.run().fails_with("InvalidSpec", &["not a GGUF file"]);
    // The same bytes with an architecture llama.cpp does not know.
    let at = model
        .windows(5)
        .position(|w| w == b"llama")
        .expect("architecture value");
    let mut foreign = model.clone();
    foreign[at..at + 5].copy_from_slice(b"llamz");
    lm.replace_model(&foreign);
    lm.run().fails_with("UnsupportedOperator", &["llamz"]);
    // A tensor whose shape the architecture does not take (the header's second dim of the first
    // query weight halved: its data still lies inside the file): llama.cpp refuses it, classified.
    let name = b"blk.0.attn_q.weight";
    let at = model
        .windows(name.len())
        .position(|w| w == name)
        .expect("tensor info")
        + name.len();
    let mut misshapen = model.clone();
    // After the name: n_dims (u32), then the dims (u64 each).
    misshapen[at + 12..at + 20].copy_from_slice(&64u64.to_le_bytes());
    lm.replace_model(&misshapen);
    lm.run()
        .fails_with("LoadFailed", &["llama.cpp could not load"]);
    // GGUF on an ONNX engine, and auto.
    let mut lm = Lm::new("{kind: tract}");
    lm.run().fails_with("InvalidSpec", &["llamacpp"]);
    lm.backend = "{kind: auto}".into();
    lm.run().fails_with("InvalidSpec", &["auto", "llamacpp"]);
}

#[test]
fn one_compile_key_gives_one_artifact_whatever_the_threads() {
    let runs: Vec<Run> = [1, 2]
        .into_iter()
        .map(|threads| {
            let mut lm = Lm::new(&format!(
                "{{kind: llamacpp, llamacpp: {{quantization: Q8_0, contextLength: 64, threads: {threads}}}}}"
            ));
            lm.outputs = "[{name: logits, atol: 0.5, rtol: 0.1}, {name: tokens, atol: 0, rtol: 0, firstElements: 2}]".into();
            let run = lm.run();
            assert!(run.success, "threads {threads}: {}", run.message());
            run
        })
        .collect();
    // Threads change speed, not bytes: not in the key, not in the artifact.
    assert_eq!(runs[0].outcome["compileKey"], runs[1].outcome["compileKey"]);
    assert_eq!(
        runs[0].outcome["artifactDigest"],
        runs[1].outcome["artifactDigest"]
    );
}

/// The CPU build's llama.cpp has no CUDA backend: a target that asks for CUDA is refused as the
/// runtime's shortcoming (not the spec's), naming the build that has one; TensorRT, which no
/// llama.cpp has, is the spec's fault (the CRD's rule, which local mode applies too). (The CUDA build's own refusals, with no GPU or with
/// kernels for another GPU, are `e2e/tests/gpu-image.sh` and `device.rs`'s unit tests.)
#[test]
fn a_cuda_target_is_refused_by_the_cpu_build_saying_which_build_runs_it() {
    let lm = Lm::new("{kind: llamacpp, executionProvider: cuda, llamacpp: {contextLength: 64}}");
    lm.run().fails_with(
        "IncompatibleRuntime",
        &["no CUDA backend", "scripts/build-agent-cuda.sh"],
    );
    let lm =
        Lm::new("{kind: llamacpp, executionProvider: tensorrt, llamacpp: {contextLength: 64}}");
    lm.run().fails_with(
        "InvalidSpec",
        &["tensorrt kind onnxruntime", "executionProvider"],
    );
}
