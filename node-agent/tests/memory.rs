//! The heap ceiling: a 212-byte model asking for a 40 GB tensor (tests/data/huge.onnx) fails
//! classified and fast, in `local` and in `fixtures`, instead of taking the machine. Without the
//! ceiling (and Linux overcommit, as on the CI machines) the same run fills 24 GB of RAM for
//! ~40 s until the kernel kills it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kiln_store::staged::sha256_file;
use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_kiln-agent");

fn huge() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/huge.onnx")
}

#[test]
fn a_model_asking_for_40_gb_fails_classified_in_local_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("model.onnx");
    std::fs::copy(huge(), &model).expect("copy");
    let (model_sha, model_size) = sha256_file(&model).expect("hash");
    common::write_huge_spec(
        dir.path(),
        (&model_sha, model_size),
        "huge-cpu",
        "tract",
        "{iterations: 1, fixtureVersion: v1, defaultTolerance: {atol: 1.0e-5, rtol: 1.0e-4}}",
    );
    let started = Instant::now();
    // The ceiling is the default (80% of this machine's memory or cgroup limit, well under
    // 40 GB on any CI machine), so this also proves the default is in force.
    let out = Command::new(AGENT)
        .env_remove("KILN_MEMORY_LIMIT")
        .args(["local", "--output", "json", "--store"])
        .arg(dir.path().join("store"))
        .arg(dir.path().join("kiln.yaml"))
        .output()
        .expect("run kiln-agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let outcome: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| {
            panic!(
                "no JSON outcome ({e}; status {:?}): {stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(!out.status.success());
    assert_eq!(outcome["reason"], "CompileFailed", "{outcome}");
    let message = outcome["message"].as_str().unwrap_or_default();
    for needle in ["an allocation of 40.0 GB was refused", "memory limit of"] {
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }
    assert!(
        std::fs::read_dir(dir.path().join("store/artifacts"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "nothing stored"
    );
    // Refused up front: nothing was filled (the unbounded run takes ~40 s).
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn the_ceiling_is_the_flag_when_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(AGENT)
        .args([
            "fixtures",
            "--memory-limit",
            "2Gi",
            "--fixture-version",
            "v1",
        ])
        .args(["--shape", "x=2,16", "--model"])
        .arg(huge())
        .arg("--out")
        .arg(dir.path().join("f.safetensors"))
        .output()
        .expect("fixtures");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for needle in [
        "CompileFailed",
        "an allocation of 40.0 GB was refused",
        "memory limit of 2.1 GB",
    ] {
        assert!(stderr.contains(needle), "{stderr} lacks {needle:?}");
    }
    assert!(!dir.path().join("f.safetensors").exists());
    // A ceiling that is not a byte count is refused by the command line, naming the units.
    let bad = Command::new(AGENT)
        .args(["probe", "--memory-limit", "lots"])
        .output()
        .expect("probe");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a byte count"));
}
