//! Engines run in their own process (`kiln_engines::pipeline::isolate`): an engine that segfaults, aborts,
//! spins past its deadline or allocates without bound through ONNX Runtime fails its own
//! target, classified (`EngineCrashed` with the signal, `Timeout`, `MemoryBudgetExceeded` with
//! the limit), while kiln-agent itself lives on to report it; a healthy target on the same
//! machine is Ready before and after. The crashes are made on demand by the test-only cargo
//! feature `fault-injection` (scripts/test.sh runs this file with it); the memory bomb is real.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{AGENT, Case, Run};

/// The hook's marker is in the binary exactly when the feature built the hook in: what
/// scripts/test/product-bins.sh greps for to refuse a test build as an image's kiln-agent. Without
/// the feature this is the proof that the product carries no hook; with it, that the grep
/// would see one.
#[test]
fn the_fault_hook_is_in_the_binary_exactly_with_the_feature() {
    let marker = b"kiln-fault-inject:";
    let bytes = std::fs::read(AGENT).expect("read kiln-agent");
    let has = bytes.windows(marker.len()).any(|w| w == marker);
    assert_eq!(
        has,
        cfg!(feature = "fault-injection"),
        "{AGENT}: marker present {has}"
    );
}

/// The pinned ONNX Runtime library, fetched once by the project's script.
fn library() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure-onnxruntime.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("run ensure-onnxruntime.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The MLP test model on ONNX Runtime with `doc` appended as the model's `doc_string` (field 6
/// of ModelProto): where the fault marker rides, kept by the compile in the artifact.
fn mlp_with_doc(doc: &str) -> Case {
    let mut case = Case::mlp(4);
    case.backend_kind = "onnxruntime";
    let path = case.path("model.onnx");
    let mut bytes = std::fs::read(&path).expect("model");
    // ONNX Runtime 1.31 reads IR versions up to 13; the file says 14 (field 1, first) and uses
    // nothing newer.
    assert_eq!(
        bytes[..2],
        [0x08, 14],
        "mlp.onnx starts with its IR version"
    );
    bytes[1] = 10;
    if !doc.is_empty() {
        bytes.push(0x32);
        bytes.push(u8::try_from(doc.len()).expect("short doc"));
        bytes.extend_from_slice(doc.as_bytes());
    }
    std::fs::write(&path, &bytes).expect("write model");
    let (sha, size) = kiln_store::staged::sha256_file(&path).expect("hash");
    case.model_sha = sha;
    case.model_size = size;
    case
}

fn run(case: &Case, extra_args: &[&str]) -> Run {
    std::fs::write(case.path("kiln.yaml"), case.yaml()).expect("write yaml");
    let out = Command::new(common::AGENT)
        .env("ORT_DYLIB_PATH", library())
        .env("TMPDIR", engine_mark(case))
        .args(["local", "--output", "json", "--store"])
        .arg(case.store())
        .arg("--metrics-file")
        .arg(case.path("metrics.prom"))
        .args(extra_args)
        .arg(case.path("kiln.yaml"))
        .output()
        .expect("run kiln-agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let outcome =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| {
            panic!(
                "kiln-agent itself did not survive to report ({e}; status {:?}): {stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    Run {
        outcome,
        success: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn healthy_is_ready() {
    let ok = run(&mlp_with_doc(""), &[]);
    assert!(ok.success, "{}\n{}", ok.outcome, ok.stderr);
    assert_eq!(ok.outcome["engine"], "onnxruntime/cpu");
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the test-only hook: cargo test -p kiln-agent --features fault-injection --test isolation"
)]
fn a_crashing_engine_fails_its_target_and_the_agent_reports_it() {
    healthy_is_ready();
    for (marker, needle) in [
        ("compile:segfault", "killed by signal SIGSEGV (11)"),
        ("compile:abort", "killed by signal SIGABRT (6)"),
        ("load:segfault", "killed by signal SIGSEGV (11)"),
        ("load:abort", "killed by signal SIGABRT (6)"),
    ] {
        let case = mlp_with_doc(&format!("kiln-fault-inject:{marker}"));
        let r = run(&case, &[]);
        eprintln!("{marker}: {}", r.message());
        r.fails_with("EngineCrashed", &[needle]);
        assert!(
            case.metrics()
                .contains("kiln_agent_failures_total{reason=\"EngineCrashed\"} 1"),
            "{marker}: not counted"
        );
        let step = if marker.starts_with("load") {
            "loading and warming"
        } else {
            "compiling"
        };
        assert!(r.message().contains(step), "{marker}: {}", r.message());
        if marker.starts_with("compile") {
            assert!(case.stored().is_empty(), "{marker}: nothing stored");
        }
    }
    healthy_is_ready();
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the test-only hook: cargo test -p kiln-agent --features fault-injection --test isolation"
)]
fn an_engine_past_its_deadline_is_killed_with_its_process_group() {
    let case = mlp_with_doc("kiln-fault-inject:load:spin");
    let started = Instant::now();
    let r = run(&case, &["--warmup-deadline-seconds", "2"]);
    r.fails_with(
        "Timeout",
        &["ran past its deadline of 4s", "process group was killed"],
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    let mut compile = mlp_with_doc("kiln-fault-inject:compile:spin");
    compile.backend_extra = String::new();
    std::fs::write(
        compile.path("kiln.yaml"),
        compile.yaml().replace(
            "  warmup:\n",
            "  compile: {activeDeadlineSeconds: 3}\n  warmup:\n",
        ),
    )
    .expect("yaml");
    let out = Command::new(common::AGENT)
        .env("ORT_DYLIB_PATH", library())
        .env("TMPDIR", engine_mark(&compile))
        .args(["local", "--output", "json", "--store"])
        .arg(compile.store())
        .arg(compile.path("kiln.yaml"))
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("\"reason\":\"Timeout\"") && stdout.contains("deadline of 3s"),
        "{stdout}"
    );
    // Nothing of either engine is left running.
    let left = engines_left(&[engine_mark(&case), engine_mark(&compile)]);
    assert!(left.is_empty(), "engine processes left: {left:?}");
}

/// The TMPDIR a case's agent runs with, which its engines inherit (`passes_env` lets TMPDIR
/// through): it marks them as this case's.
fn engine_mark(case: &Case) -> PathBuf {
    let mark = case.path("engine-tmp");
    std::fs::create_dir_all(&mark).expect("engine tmp");
    mark
}

/// Engine processes (`kiln-agent-engine`) still running whose TMPDIR is one of `marks`: only
/// this test's, so engines of another test run on the same machine (the same binary, the same
/// name) do not count.
fn engines_left(marks: &[PathBuf]) -> Vec<String> {
    let wanted: Vec<Vec<u8>> = marks
        .iter()
        .map(|m| format!("TMPDIR={}", m.display()).into_bytes())
        .collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter(|p| {
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            let environ = std::fs::read(p.path().join("environ")).unwrap_or_default();
            cmdline.starts_with(b"kiln-agent-engine\0")
                && environ
                    .split(|b| *b == 0)
                    .any(|v| wanted.iter().any(|w| v == w))
        })
        .map(|p| p.file_name().to_string_lossy().into_owned())
        .collect()
}

/// tests/data/huge.onnx with its ConstantOfShape at [1024, 1048576]: a 212-byte model whose
/// constant is 4 GiB of f32, which ONNX Runtime allocates itself (the heap ceiling never sees
/// it). The two int64 of the shape are the last initializer's raw data.
fn huge_4gib(dir: &Path) -> (PathBuf, String, u64) {
    let mut bytes = std::fs::read(common::data("huge.onnx")).expect("huge.onnx");
    let raw: Vec<u8> = [100_000i64, 100_000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let at = bytes
        .windows(raw.len())
        .position(|w| w == raw)
        .expect("the shape's raw data");
    let new: Vec<u8> = [1024i64, 1 << 20]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    bytes[at..at + raw.len()].copy_from_slice(&new);
    let path = dir.join("model.onnx");
    std::fs::write(&path, &bytes).expect("write");
    let (sha, size) = kiln_store::staged::sha256_file(&path).expect("hash");
    (path, sha, size)
}

#[test]
fn onnx_runtime_allocating_without_bound_is_stopped_at_the_memory_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, sha, size) = huge_4gib(dir.path());
    common::write_huge_spec(
        dir.path(),
        (&sha, size),
        "huge-ort",
        "onnxruntime",
        "{iterations: 1, fixtureVersion: v1}",
    );
    let started = Instant::now();
    let out = Command::new(common::AGENT)
        .env("ORT_DYLIB_PATH", library())
        .args([
            "local",
            "--memory-limit",
            "2Gi",
            "--output",
            "json",
            "--store",
        ])
        .arg(dir.path().join("store"))
        .arg(dir.path().join("kiln.yaml"))
        .output()
        .expect("run kiln-agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let outcome: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| {
            panic!(
                "kiln-agent did not survive ({e}): {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(outcome["reason"], "MemoryBudgetExceeded", "{outcome}");
    let message = outcome["message"].as_str().unwrap_or_default();
    eprintln!("{message}");
    assert!(
        message.contains("memory limit of 2.1 GB (RLIMIT_DATA"),
        "{message}"
    );
    // Stopped near the limit, not at the 4 GiB it asked for.
    let peak = peak_in(message).unwrap_or_else(|| panic!("no peak in {message:?}"));
    assert!(peak < 2.4, "resident set peaked at {peak} GB: {message}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// The `peaked at N.N GB` figure of a message, in GB.
fn peak_in(message: &str) -> Option<f64> {
    let rest = message.split_once("peaked at ")?.1;
    let (number, unit) = rest.split_once(' ')?;
    let value: f64 = number.parse().ok()?;
    match unit.get(..2)? {
        "GB" => Some(value),
        "MB" => Some(value / 1000.0),
        _ => None,
    }
}

/// `kiln-agent fixtures` with its exit status and stderr.
fn fixtures(model: &Path, out: &Path) -> (Option<i32>, String) {
    let run = Command::new(common::AGENT)
        .env("ORT_DYLIB_PATH", library())
        .args([
            "fixtures",
            "--memory-limit",
            "2Gi",
            "--reference",
            "onnxruntime",
        ])
        .args(["--fixture-version", "v1", "--shape", "x=4,16", "--model"])
        .arg(model)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run kiln-agent fixtures");
    (
        run.status.code(),
        String::from_utf8_lossy(&run.stderr).into_owned(),
    )
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the test-only hook: cargo test -p kiln-agent --features fault-injection --test isolation"
)]
fn the_reference_run_of_fixtures_is_contained_too() {
    // The issue's own case: the 212-byte model made `fixtures --reference onnxruntime` hold
    // gigabytes; now its process stops at the limit.
    let dir = tempfile::tempdir().expect("tempdir");
    let (model, _, _) = huge_4gib(dir.path());
    let out = dir.path().join("f.safetensors");
    let (code, stderr) = fixtures(&model, &out);
    assert_eq!(code, Some(1), "{stderr}");
    for needle in [
        "MemoryBudgetExceeded",
        "memory limit of 2.1 GB (RLIMIT_DATA",
    ] {
        assert!(stderr.contains(needle), "{stderr} lacks {needle:?}");
    }
    assert!(!out.exists());
    let case = mlp_with_doc("kiln-fault-inject:reference:segfault");
    let (code, stderr) = fixtures(&case.path("model.onnx"), &out);
    assert_eq!(code, Some(1), "{stderr}");
    for needle in ["EngineCrashed", "killed by signal SIGSEGV (11)"] {
        assert!(stderr.contains(needle), "{stderr} lacks {needle:?}");
    }
    assert!(!out.exists());
}
