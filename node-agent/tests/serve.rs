//! `kiln-agent serve` on a model directory laid out as a `csi.kiln.dev` volume holds it (from a
//! real `kiln-agent local` run's store), over real HTTP: a real v2 client from PyPI
//! (`tritonclient[http]`, scripts/ensure/v2-client.sh) gets the fixture's golden outputs back
//! within tolerance, with and without the binary extension; the warmer (what the agent runs
//! against a serving pod) passes it and refuses a server with another model; and every hostile
//! directory or request is refused with what to fix.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::servers::{Server, free_port, runtime};
use common::{AGENT, Case, data};
use kiln_agent::pod_check::{self, Cold, Endpoint, Protocol};
use kiln_crds::compiled_target::Warmup;
use kiln_crds::mounted::{self, MountedModel};
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_server::oip;
use kiln_store::staged::sha256_file;

/// A model directory as the node plugin writes it, from a successful local run of `case`.
fn model_dir(case: &Case, name: &str) -> PathBuf {
    let run = case.run();
    assert!(run.success, "local run failed: {}", run.stderr);
    let key = run.outcome["compileKey"].as_str().expect("key");
    let stored = case.store().join("artifacts").join(key);
    volume(&stored, &case.path("fixture.safetensors"), &case.path(name))
}

/// `dir` laid out as a csi.kiln.dev volume of the stored entry `stored` and `fixture`.
fn volume(stored: &Path, fixture: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    for file in [mounted::ARTIFACT, mounted::MANIFEST] {
        std::fs::copy(stored.join(file), dir.join(file)).expect("copy");
    }
    std::fs::copy(fixture, dir.join(mounted::FIXTURE)).expect("fixture");
    let (digest, _) = sha256_file(&dir.join(mounted::ARTIFACT)).expect("hash");
    let (fixture_sha, _) = sha256_file(fixture).expect("hash");
    let kiln = MountedModel {
        namespace: "ns".into(),
        target: "mlp".into(),
        revision: 1,
        class: "cpu".into(),
        digest,
        engine: None,
        media_type: "x".into(),
        fixture: Some(fixture_sha),
        chat_template: None,
        node: "n".into(),
        pod: "ns/p".into(),
        seal: None,
    };
    std::fs::write(
        dir.join(mounted::KILN_JSON),
        serde_json::to_vec(&kiln).expect("json"),
    )
    .expect("kiln.json");
    dir.to_path_buf()
}

fn spawn(dir: &Path, extra: &[&str]) -> Server {
    let port = free_port();
    let child = Command::new(AGENT)
        .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--model-dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    Server { child, port }
}

fn get(url: &str) -> Option<(u16, String)> {
    let rt = runtime();
    rt.block_on(async {
        let r = reqwest::get(url).await.ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.ok()?))
    })
}

fn post(url: &str, body: Vec<u8>) -> (u16, String) {
    let rt = runtime();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(url)
            .body(body)
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        (status, r.text().await.expect("body"))
    })
}

/// Waits until the server is ready; panics with its stderr when it exits first.
fn ready(server: &mut Server) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = format!("http://127.0.0.1:{}/v2/health/ready", server.port);
    while Instant::now() < deadline {
        if let Some((200, _)) = get(&url) {
            return;
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("serve exited ({status}): {}", stderr_of(server));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("serve not ready within 60 s");
}

fn stderr_of(server: &mut Server) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(e) = server.child.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Runs serve on a directory that must be refused, and returns its stderr.
fn refused(dir: &Path) -> String {
    let mut server = spawn(dir, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            assert!(!status.success());
            return stderr_of(&mut server);
        }
        assert!(
            Instant::now() < deadline,
            "serve did not refuse the directory"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn warmup() -> Warmup {
    serde_json::from_value(serde_json::json!({"fixtureVersion": "v1", "iterations": 5, "defaultTolerance": {"atol": 1e-4, "rtol": 1e-4}}))
        .expect("warmup")
}

fn warm(port: u16, model: &str, fixture: &FixtureFile) -> Result<pod_check::Figures, Cold> {
    warm_with(port, model, fixture, &warmup())
}

fn warm_with(
    port: u16,
    model: &str,
    fixture: &FixtureFile,
    warmup: &Warmup,
) -> Result<pod_check::Figures, Cold> {
    let endpoint = Endpoint {
        protocol: Protocol::OipV2,
        base: format!("http://127.0.0.1:{port}"),
        model: model.into(),
        api_key: None,
    };
    let rt = runtime();
    rt.block_on(pod_check::check(
        &pod_check::client(Duration::from_secs(30)),
        &endpoint,
        fixture,
        warmup,
    ))
}

#[test]
fn the_warmer_passes_the_served_model_and_refuses_another() {
    let case = Case::mlp(4);
    let dir = model_dir(&case, "model");
    let mut server = spawn(&dir, &[]);
    ready(&mut server);
    let figures = warm(server.port, "mlp", &case.fixture()).expect("warm");
    assert_eq!(figures.requests, 5);
    assert!(figures.parity_max_abs_error <= 1e-4, "{figures:?}");
    assert!(figures.p50_seconds > 0.0 && figures.after_seconds > 0.0);
    // Asked for a model it does not serve: the server says so, nothing is warm.
    let err = warm(server.port, "other", &case.fixture()).expect_err("not served");
    assert_eq!(err.reason(), "ServingMismatch", "{err:?}");
    // Another model mounted under the same name (same inputs, other weights): wrong answers.
    // (Its own fixture: a compile checks the engine against the fixture it was given.)
    let drift = Case::model("mlp-drift.onnx", 4);
    let drift_dir = model_dir(&drift, "drift");
    let mut other = spawn(&drift_dir, &["--model-name", "mlp"]);
    ready(&mut other);
    let err = warm(other.port, "mlp", &case.fixture()).expect_err("another model");
    assert_eq!(err.reason(), "ServingParityExceeded", "{err:?}");
    drop(server);
    let err = warm(free_port(), "mlp", &case.fixture()).expect_err("nobody there");
    assert_eq!(err.reason(), "ServingUnreachable", "{err:?}");
}

/// Writes the seal the node plugin would into `dir`'s kiln.json: the artifact's inode, size and
/// modification time now.
fn seal(dir: &Path) {
    let now = kiln_store::staged::Stamp::of(&dir.join(mounted::ARTIFACT)).expect("stat");
    let path = dir.join(mounted::KILN_JSON);
    let mut m = MountedModel::parse(&std::fs::read(&path).expect("read")).expect("parse");
    m.seal = Some(mounted::Seal {
        inode: now.ino,
        size: now.size,
        mtime_ns: now.mtime_ns,
    });
    std::fs::write(&path, serde_json::to_vec(&m).expect("json")).expect("write");
}

/// Serves `dir` until ready, and returns its log.
fn served_log(dir: &Path) -> String {
    let mut server = spawn(dir, &[]);
    ready(&mut server);
    let _ = server.child.kill();
    let _ = server.child.wait();
    stderr_of(&mut server)
}

#[test]
fn a_sealed_read_only_volume_is_served_without_a_second_hash() {
    if !rustix::process::geteuid().is_root() {
        kiln_endpoints::test_support::skip("a read-only bind mount needs root");
        return;
    }
    let case = Case::mlp(4);
    let dir = model_dir(&case, "model");
    seal(&dir);
    // Writable: the seal proves nothing, the artifact is hashed.
    assert!(served_log(&dir).contains("hashed=true"));
    // Mounted read-only, as the plugin mounts it: taken on the seal.
    let ro = case.path("ro");
    std::fs::create_dir_all(&ro).expect("mount point");
    kiln_csi::mount::bind_read_only(&dir, &ro).expect("bind read-only");
    let sealed = served_log(&ro);
    // A seal that does not stand (the artifact's modification time moved): hashed again.
    let mut m = MountedModel::parse(&std::fs::read(dir.join(mounted::KILN_JSON)).expect("read"))
        .expect("parse");
    if let Some(s) = m.seal.as_mut() {
        s.mtime_ns += 1;
    }
    for d in [&ro, &dir] {
        let _ = kiln_csi::mount::unmount(d);
    }
    std::fs::write(
        dir.join(mounted::KILN_JSON),
        serde_json::to_vec(&m).expect("json"),
    )
    .expect("write");
    kiln_csi::mount::bind_read_only(&dir, &ro).expect("bind read-only");
    let stale = served_log(&ro);
    for d in [&ro, &dir] {
        let _ = kiln_csi::mount::unmount(d);
    }
    assert!(sealed.contains("hashed=false"), "{sealed}");
    assert!(stale.contains("hashed=true"), "{stale}");
}

#[test]
fn a_real_v2_client_gets_the_golden_outputs() {
    let python = match Command::new(data("../../../scripts/ensure/v2-client.sh")).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        other => {
            kiln_endpoints::test_support::skip(&format!(
                "no v2 client (scripts/ensure/v2-client.sh needs PyPI once): {other:?}"
            ));
            return;
        }
    };
    let case = Case::mlp(4);
    let dir = model_dir(&case, "model");
    let mut server = spawn(&dir, &[]);
    ready(&mut server);
    let fixture = case.fixture();
    let inputs: Vec<oip::WireTensor> = fixture
        .inputs
        .iter()
        .map(|(n, t)| oip::from_host(n, t).expect("wire"))
        .collect();
    std::fs::write(
        case.path("case.json"),
        serde_json::to_vec(&inputs).expect("json"),
    )
    .expect("case");
    for mode in [&[][..], &["--json"][..]] {
        let out = Command::new(&python)
            .arg(data("v2_client.py"))
            .arg(format!("127.0.0.1:{}", server.port))
            .arg("mlp")
            .arg(case.path("case.json"))
            .args(mode)
            .output()
            .expect("client");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: serde_json::Value = serde_json::from_str(&stdout).expect("client json");
        assert_eq!(
            answer["binary"],
            mode.is_empty(),
            "binary extension as asked: {answer}"
        );
        assert_eq!(answer["metadata"]["name"], "mlp");
        let outputs: Vec<oip::WireTensor> =
            serde_json::from_value(answer["outputs"].clone()).expect("tensors");
        let got = outputs
            .iter()
            .map(|t| (t.name.clone(), oip::to_host(t, None).expect("host")))
            .collect();
        let errors = kiln_engines::pipeline::warmup::parity(&got, &fixture, &warmup())
            .expect("within tolerance");
        assert!(!errors.is_empty());
    }
}

#[test]
fn hostile_directories_and_requests_are_refused() {
    let case = Case::mlp(4);
    let dir = model_dir(&case, "model");
    // Requests that do not fit: named in the answer, the server stays up.
    let mut server = spawn(&dir, &["--max-request-bytes", "4096"]);
    ready(&mut server);
    let infer = format!("http://127.0.0.1:{}/v2/models/mlp/infer", server.port);
    let x = |shape: &str, n: usize| {
        format!(
            r#"{{"inputs":[{{"name":"x","shape":{shape},"datatype":"FP32","data":{:?}}}]}}"#,
            vec![0.5f32; n]
        )
    };
    let (status, body) = post(&infer, x("[3,16]", 48).into_bytes());
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("match none of the compiled profiles"),
        "{body}"
    );
    let (status, body) = post(&infer, x("[4,16]", 60).into_bytes());
    assert_eq!(status, 400);
    assert!(body.contains("60 elements"), "{body}");
    let (status, body) = post(
        &infer,
        br#"{"inputs":[{"name":"y","shape":[1],"datatype":"FP32","data":[1]}]}"#.to_vec(),
    );
    assert!(
        status == 400 && body.contains("not one of the model's"),
        "{body}"
    );
    let (status, body) = post(&infer, vec![b' '; 8192]);
    assert!(
        status == 413 && body.contains("--max-request-bytes"),
        "{status} {body}"
    );
    let (status, body) = post(&infer, b"{not json".to_vec());
    assert!(status == 400 && body.contains("request JSON"), "{body}");
    let (status, _) =
        get(&format!("http://127.0.0.1:{}/v2/models/other", server.port)).expect("get");
    assert_eq!(status, 404);
    let (status, _) = post(&infer, x("[4,16]", 64).into_bytes());
    assert_eq!(status, 200, "still serving after the refusals");
    drop(server);
    // A flipped byte in the artifact: never served.
    let artifact = dir.join(mounted::ARTIFACT);
    let mut bytes = std::fs::read(&artifact).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&artifact, &bytes).expect("write");
    let stderr = refused(&dir);
    assert!(
        stderr.contains("not served") && stderr.contains("sha256"),
        "{stderr}"
    );
    bytes[last] ^= 1;
    std::fs::write(&artifact, &bytes).expect("restore");
    // A fixture that is not the one kiln.json names.
    std::fs::write(dir.join(mounted::FIXTURE), b"other").expect("fixture");
    let stderr = refused(&dir);
    assert!(stderr.contains("mounted fixture"), "{stderr}");
    // Not a kiln volume at all.
    std::fs::write(dir.join(mounted::KILN_JSON), br#"{"target": "x"}"#).expect("kiln.json");
    let stderr = refused(&dir);
    assert!(stderr.contains("kiln.json"), "{stderr}");
    let stderr = refused(&case.path("nowhere"));
    assert!(stderr.contains("csi.kiln.dev volume"), "{stderr}");
}

#[test]
fn a_gguf_language_model_is_served_and_warmed_through_the_server() {
    let dir = tempfile::tempdir().expect("tmp");
    let example = data("../../../examples/tiny-llama");
    for f in ["kiln.yaml", "model.gguf", "fixture-v1.safetensors"] {
        std::fs::copy(example.join(f), dir.path().join(f)).expect("copy");
    }
    let run = common::run_local(
        &dir.path().join("kiln.yaml"),
        &dir.path().join("store"),
        &dir.path().join("metrics.prom"),
    );
    assert!(run.success, "local run failed: {}", run.stderr);
    let key = run.outcome["compileKey"].as_str().expect("key");
    let fixture = dir.path().join("fixture-v1.safetensors");
    let model = volume(
        &dir.path().join("store/artifacts").join(key),
        &fixture,
        &dir.path().join("model"),
    );
    let mut server = spawn(&model, &[]);
    ready(&mut server);
    // The example's own tolerances: Q8_0 logits within tenths, the first two greedy tokens exact.
    let warmup: Warmup = serde_json::from_value(serde_json::json!({
        "fixtureVersion": "v1", "iterations": 3,
        "outputs": [{"name": "logits", "atol": 0.5, "rtol": 0.1},
                    {"name": "tokens", "atol": 0, "rtol": 0, "firstElements": 2}]
    }))
    .expect("warmup");
    let fixture = FixtureFile::read(&fixture).expect("fixture");
    let figures = warm_with(server.port, "mlp", &fixture, &warmup).expect("warm");
    assert_eq!(figures.requests, 3);
    assert!(
        figures.parity_max_abs_error <= 0.5 + 0.1 * 30.0,
        "{figures:?}"
    );
}
