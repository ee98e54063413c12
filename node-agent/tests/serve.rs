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

/// An IREE artifact (the MLP compiled for this machine's class by IREE's compiler) served by
/// `kiln-agent serve` on IREE's runtime: Ready, and the serving check's fixture answers through
/// the v2 endpoint within tolerance, as for the other engines.
#[test]
fn an_iree_artifact_is_served_and_answers_like_its_fixture() {
    let Some(iree) = common::signing::ensured("iree") else {
        return;
    };
    let mut case = Case::mlp(4);
    case.backend_kind = "iree";
    let run = case.run_with_env(&[("KILN_IREE_BIN", &iree)]);
    assert!(run.success, "local run failed: {}", run.stderr);
    assert_eq!(run.outcome["engine"], "iree", "{}", run.outcome);
    let key = run.outcome["compileKey"].as_str().expect("key");
    let stored = case.store().join("artifacts").join(key);
    let dir = volume(
        &stored,
        &case.path("fixture.safetensors"),
        &case.path("model"),
    );
    let mut server = spawn(&dir, &[]);
    ready(&mut server);
    let figures = warm(server.port, "mlp", &case.fixture()).expect("warm");
    assert_eq!(figures.requests, 5);
    assert!(figures.parity_max_abs_error <= 1e-4, "{figures:?}");
    let (status, meta) =
        get(&format!("http://127.0.0.1:{}/v2/models/mlp", server.port)).expect("model metadata");
    assert_eq!(status, 200, "{meta}");
    assert!(
        meta.contains("iree"),
        "the metadata names the engine: {meta}"
    );
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
    // A deadline that is no number of milliseconds (the mesh's header) or microseconds
    // (Triton's parameter): refused saying which, and not run.
    let timed = |header: &str| {
        runtime().block_on(async {
            let r = reqwest::Client::new()
                .post(&infer)
                .header(kiln_server::infer::TIMEOUT_HEADER, header)
                .body(x("[4,16]", 64).into_bytes())
                .send()
                .await
                .expect("post");
            (r.status().as_u16(), r.text().await.expect("body"))
        })
    };
    let (status, body) = timed("soon");
    assert!(
        status == 400 && body.contains("x-envoy-expected-rq-timeout-ms"),
        "{status} {body}"
    );
    let with_timeout = x("[4,16]", 64).replacen('{', r#"{"parameters": {"timeout": -1}, "#, 1);
    let (status, body) = post(&infer, with_timeout.into_bytes());
    assert!(
        status == 400 && body.contains("parameters.timeout"),
        "{status} {body}"
    );
    let (status, _) = timed("60000");
    assert_eq!(status, 200, "a deadline in time is run");
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

/// The example (SqueezeNet on tract, several ms a run) run by `kiln-agent local` and laid out
/// as a volume, with its fixture.
fn example_volume(dir: &Path) -> (PathBuf, FixtureFile) {
    example_volume_with(dir, |yaml| yaml)
}

/// The same, with the example's targets as `edit` makes them.
fn example_volume_with(dir: &Path, edit: impl Fn(String) -> String) -> (PathBuf, FixtureFile) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/squeezenet");
    for f in ["model.onnx", "fixture-v1.safetensors"] {
        std::fs::copy(example.join(f), dir.join(f)).expect("copy example");
    }
    let yaml = std::fs::read_to_string(example.join("kiln.yaml")).expect("example");
    std::fs::write(dir.join("kiln.yaml"), edit(yaml)).expect("yaml");
    let run = common::run_local(
        &dir.join("kiln.yaml"),
        &dir.join("store"),
        &dir.join("m.prom"),
    );
    assert!(run.success, "local run failed: {}", run.stderr);
    let key = run.outcome["compileKey"].as_str().expect("key");
    let stored = dir.join("store/artifacts").join(key);
    let fixture = dir.join("fixture-v1.safetensors");
    let volume = volume(&stored, &fixture, &dir.join("volume"));
    (volume, FixtureFile::read(&fixture).expect("fixture"))
}

/// The fixture's first sample as a binary-extension request, and its golden outputs.
fn first_sample(fixture: &FixtureFile) -> ((Vec<u8>, usize), FixtureFile) {
    let case = fixture.samples().remove(0);
    let request = oip::InferRequest {
        inputs: case
            .inputs
            .iter()
            .map(|(n, t)| oip::from_host_binary(n, t).expect("wire"))
            .collect(),
        parameters: [(
            "binary_data_output".to_string(),
            serde_json::Value::Bool(true),
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let mut body = serde_json::to_vec(&request).expect("json");
    let header = body.len();
    for t in case.inputs.values() {
        body.extend_from_slice(&t.data);
    }
    ((body, header), case)
}

/// What clients saw.
#[derive(Debug, Default)]
struct Tally {
    right: usize,
    shed: usize,
    wrong: Vec<String>,
    gave_up: usize,
}

/// `clients` clients sending `body` back to back for `span` (each at least once), each answer checked against
/// `golden`; a client gives up on an answer after `patience` (counted, not wrong).
fn load(
    port: u16,
    clients: usize,
    span: Duration,
    patience: Duration,
    (body, header): &(Vec<u8>, usize),
    golden: &FixtureFile,
) -> Tally {
    let url = format!("http://127.0.0.1:{port}/v2/models/mlp/infer");
    let tally = std::sync::Mutex::new(Tally::default());
    runtime().block_on(async {
        let until = Instant::now() + span;
        let client = reqwest::Client::builder()
            .timeout(patience)
            .build()
            .expect("client");
        let tasks = (0..clients).map(|_| async {
            loop {
                let sent = client
                    .post(&url)
                    .header(oip::HEADER_LENGTH, header.to_string())
                    .body(body.clone())
                    .send()
                    .await;
                let seen = match sent {
                    Err(e) if e.is_timeout() => Seen::GaveUp,
                    Err(e) => Seen::Wrong(format!("transport: {e}")),
                    Ok(r) => judge(r, golden).await,
                };
                let mut t = tally.lock().expect("tally");
                match seen {
                    Seen::GaveUp => t.gave_up += 1,
                    Seen::Right => t.right += 1,
                    Seen::Shed => t.shed += 1,
                    Seen::Wrong(m) => t.wrong.push(m),
                }
                if Instant::now() >= until {
                    break;
                }
            }
        });
        futures::future::join_all(tasks).await;
    });
    tally.into_inner().expect("tally")
}

/// What one client saw of one request.
enum Seen {
    /// The golden answer.
    Right,
    /// `503` with `Retry-After`.
    Shed,
    /// The client's patience ran out, before the answer or while reading it.
    GaveUp,
    Wrong(String),
}

async fn judge(r: reqwest::Response, golden: &FixtureFile) -> Seen {
    match judged(r, golden).await {
        Ok(true) => Seen::Right,
        Ok(false) => Seen::Shed,
        Err(None) => Seen::GaveUp,
        Err(Some(m)) => Seen::Wrong(m),
    }
}

/// `Ok(true)`: the golden answer; `Ok(false)`: shed; `Err(None)`: gave up reading the answer.
async fn judged(r: reqwest::Response, golden: &FixtureFile) -> Result<bool, Option<String>> {
    let status = r.status().as_u16();
    let retry = r.headers().get("retry-after").is_some();
    let header = r
        .headers()
        .get(oip::HEADER_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let answer = match r.bytes().await {
        Err(e) if e.is_timeout() => return Err(None),
        Err(e) => return Err(Some(format!("body: {e}"))),
        Ok(answer) => answer,
    };
    if status == 503 && retry {
        return Ok(false);
    }
    if status != 200 {
        return Err(Some(format!(
            "{status}: {}",
            String::from_utf8_lossy(&answer)
        )));
    }
    let (json, tail) = oip::binary::split(&answer, header.as_deref()).map_err(Some)?;
    let response: oip::InferResponse =
        serde_json::from_slice(json).map_err(|e| Some(e.to_string()))?;
    let got = oip::binary::response_outputs(&response, tail).map_err(Some)?;
    kiln_engines::pipeline::warmup::parity(&got, golden, &warmup())
        .map(|_| true)
        .map_err(|e| Some(format!("a wrong answer: {e}")))
}

/// VmRSS and VmHWM of `pid`, in bytes.
fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib << 10)
            .expect("field")
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// How far RSS may move between two like rounds without anything being kept: glibc's per-thread
/// arenas hold freed pages (a first round of abandoned requests raised RSS by up to 80 MiB, a
/// second by up to 17). Requests kept would be thousands of 600 KB bodies a round, gigabytes.
const ALLOCATOR_SLACK: u64 = 64 << 20;

#[test]
fn an_overloaded_server_sheds_keeps_its_memory_and_answers_every_admitted_request_rightly() {
    let work = tempfile::tempdir().expect("tempdir");
    let (dir, fixture) = example_volume(work.path());
    let mut server = spawn(
        &dir,
        &[
            "--instances",
            "1",
            "--max-queue",
            "4",
            "--model-name",
            "mlp",
        ],
    );
    ready(&mut server);
    let base = format!("http://127.0.0.1:{}", server.port);
    let (_, meta) = get(&format!("{base}/v2/models/mlp")).expect("metadata");
    let meta: serde_json::Value = serde_json::from_str(&meta).expect("json");
    assert_eq!(
        meta["parameters"],
        serde_json::json!({"instances": 1, "workers": 1, "admitted": 1, "maxQueue": 4}),
        "{meta}"
    );
    let (request, golden) = first_sample(&fixture);
    let patient = Duration::from_secs(60);
    let port = server.port;
    let round = |clients, span, patience| load(port, clients, span, patience, &request, &golden);
    let warm = round(1, Duration::from_millis(300), patient);
    assert!(warm.right > 0 && warm.wrong.is_empty(), "{warm:?}");
    let (before, _) = memory_of(server.child.id());
    // Twice as many clients as one worker and its queue take: the rest are told to come back.
    let first = round(24, Duration::from_secs(3), patient);
    let (after_first, _) = memory_of(server.child.id());
    let second = round(24, Duration::from_secs(3), patient);
    let (after_second, peak) = memory_of(server.child.id());
    for t in [&first, &second] {
        assert!(
            t.wrong.is_empty(),
            "every admitted request gets its right answer: {:?}",
            &t.wrong[..t.wrong.len().min(3)]
        );
        assert!(t.right > 0 && t.shed > 0 && t.gave_up == 0, "{t:?}");
    }
    eprintln!(
        "rss before {} MiB, after {} and {} MiB, peak {} MiB; {first:?} {second:?}",
        before >> 20,
        after_first >> 20,
        after_second >> 20,
        peak >> 20
    );
    assert!(
        after_second < after_first + ALLOCATOR_SLACK,
        "memory grows with the requests ({} of 600 KB each): {} MiB after 3 s, {} MiB after 6 s",
        second.right + second.shed,
        after_first >> 20,
        after_second >> 20
    );
    // Counted as operators see it.
    let (_, text) = get(&format!("{base}/metrics")).expect("metrics");
    let series = |s: &str| common::metric(&text, s).unwrap_or(-1.0) as usize;
    assert_eq!(
        series(
            "kiln_inference_request_failure_total{model=\"mlp\",version=\"1\",reason=\"queue_full\"}"
        ),
        first.shed + second.shed,
        "{text}"
    );
    assert_eq!(
        series("kiln_inference_request_success_total{model=\"mlp\",version=\"1\"}"),
        warm.right + first.right + second.right
    );
    // Clients that give up leave the line: what is left runs at once, not after their work. The
    // first such round may raise the allocator's high-water mark; a second must not add to it.
    let impatient = || round(24, Duration::from_secs(2), Duration::from_millis(5));
    let (mut gave_up, mut rss): (Vec<usize>, Vec<u64>) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let t = impatient();
        assert!(t.gave_up > 0 && t.wrong.is_empty(), "{t:?}");
        gave_up.push(t.gave_up);
        rss.push(memory_of(server.child.id()).0);
    }
    eprintln!(
        "rss after {gave_up:?} abandoned: {:?} MiB",
        rss.iter().map(|m| m >> 20).collect::<Vec<_>>()
    );
    assert!(
        rss[1] < rss[0] + ALLOCATOR_SLACK,
        "{} more abandoned requests kept: {} MiB before, {} MiB after",
        gave_up[1],
        rss[0] >> 20,
        rss[1] >> 20
    );
    let started = Instant::now();
    let after = round(1, Duration::from_millis(1), patient);
    assert_eq!((after.right, after.wrong.len()), (1, 0), "{after:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a request after {} abandoned ones waited {:?}: their work ran first",
        gave_up[1],
        started.elapsed()
    );
}

#[test]
fn sigterm_drains_not_ready_at_once_admitted_requests_answered_new_ones_refused() {
    let work = tempfile::tempdir().expect("tempdir");
    let (dir, fixture) = example_volume(work.path());
    let mut server = spawn(
        &dir,
        &[
            "--instances",
            "1",
            "--max-queue",
            "64",
            "--model-name",
            "mlp",
            "--drain-delay-seconds",
            "1",
        ],
    );
    ready(&mut server);
    let (request, golden) = first_sample(&fixture);
    let port = server.port;
    let pid = server.child.id();
    // Eight clients in flight when SIGTERM comes; their requests were admitted, so answered.
    let loaded = std::thread::spawn(move || {
        load(
            port,
            8,
            Duration::from_millis(1500),
            Duration::from_secs(60),
            &request,
            &golden,
        )
    });
    std::thread::sleep(Duration::from_millis(700));
    let sent = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).expect("pid"),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let ready_url = format!("http://127.0.0.1:{port}/v2/health/ready");
    let live_url = format!("http://127.0.0.1:{port}/v2/health/live");
    let not_ready = get(&ready_url).map(|(s, _)| s);
    assert_eq!(not_ready, Some(503), "readiness goes false at once");
    assert_eq!(
        get(&live_url).map(|(s, _)| s),
        Some(200),
        "still live while draining"
    );
    let tally = loaded.join().expect("clients");
    assert!(tally.wrong.is_empty(), "{:?}", tally.wrong);
    assert!(
        tally.right > 0 && tally.shed > 0,
        "admitted answered, then refused with Retry-After: {tally:?}"
    );
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(30),
            "still running 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "a drained server exits 0: {status}");
    assert!(
        sent.elapsed() >= Duration::from_secs(1),
        "it answered through the drain delay"
    );
}

/// `sample`'s inputs made distinct by `seed` (a ramp that differs per element and seed), as a
/// binary-extension request.
fn scaled(sample: &FixtureFile, seed: f32) -> (Vec<u8>, usize) {
    let mut other = sample.clone();
    for t in other.inputs.values_mut() {
        for (j, v) in t.data.chunks_exact_mut(4).enumerate() {
            let x = f32::from_le_bytes([v[0], v[1], v[2], v[3]])
                + ((j * 7919) % 251) as f32 / 251.0 * seed;
            v.copy_from_slice(&x.to_le_bytes());
        }
    }
    first_sample(&other).0
}

/// The outputs of one binary-extension request.
async fn outputs_of(
    client: &reqwest::Client,
    url: &str,
    (body, header): &(Vec<u8>, usize),
) -> std::collections::BTreeMap<String, kiln_engines::backend::tensor::HostTensor> {
    let r = client
        .post(url)
        .header(oip::HEADER_LENGTH, header.to_string())
        .body(body.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 200);
    let length = r
        .headers()
        .get(oip::HEADER_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let answer = r.bytes().await.expect("body");
    let (json, tail) = oip::binary::split(&answer, length.as_deref()).expect("split");
    let response: oip::InferResponse = serde_json::from_slice(json).expect("response");
    oip::binary::response_outputs(&response, tail).expect("outputs")
}

/// A volume of `file` (tests/data; input `images: f32[batch, 3, h, w]` for the detector, else
/// `x: f32[batch, 16]`) compiled with a four-row profile beside its one-row one, and a one-row
/// fixture.
fn batchable(file: &str) -> (Case, PathBuf) {
    let mut case = Case::mlp(1);
    std::fs::copy(data(file), case.path("model.onnx")).expect("copy");
    (case.model_sha, case.model_size) = sha256_file(&case.path("model.onnx")).expect("hash");
    let dims = if file == "detector.onnx" {
        case.input = ("images", "f32", "{size: 3}, {size: 32}, {size: 32}");
        case.fixture_shaped(&case.path("model.onnx"), "images", vec![1, 3, 32, 32]);
        ""
    } else {
        case.fixture_from(&case.path("model.onnx"), 1);
        ""
    };
    case.batch = 1;
    let yaml = case.yaml().replace(
        &format!("profiles: [{{name: p, dims: {{batch: 1{dims}}}}}]"),
        &format!("profiles: [{{name: p, dims: {{batch: 1{dims}}}}}, {{name: p4, dims: {{batch: 4{dims}}}}}]"),
    );
    assert!(yaml.contains("name: p4"), "{yaml}");
    std::fs::write(case.path("kiln.yaml"), yaml).expect("yaml");
    let run = common::run_local(&case.path("kiln.yaml"), &case.store(), &case.path("m.prom"));
    assert!(run.success, "local run failed: {}", run.stderr);
    let key = run.outcome["compileKey"].as_str().expect("key");
    let stored = case.store().join("artifacts").join(key);
    let dir = volume(
        &stored,
        &case.path("fixture.safetensors"),
        &case.path("volume"),
    );
    (case, dir)
}

#[test]
fn a_batch_that_would_answer_differently_is_not_made() {
    // The MLP's matrix product takes another kernel for four rows than for one: the bytes
    // differ, so the server checks at load, says so and runs each request alone.
    let (case, dir) = batchable("mlp.onnx");
    let mut server = spawn(&dir, &["--max-batch", "4", "--batch-delay-us", "200000"]);
    ready(&mut server);
    let base = format!("http://127.0.0.1:{}", server.port);
    let url = format!("{base}/v2/models/mlp/infer");
    let request = first_sample(&case.fixture()).0;
    let client = reqwest::Client::new();
    let rt = runtime();
    let _ = rt.block_on(futures::future::join_all(
        (0..4).map(|_| outputs_of(&client, &url, &request)),
    ));
    let runs = metric_of(
        &base,
        "kiln_inference_exec_total{model=\"mlp\",version=\"1\"}",
    );
    drop(rt);
    let _ = server.child.kill();
    let log = stderr_of(&mut server);
    assert!(
        log.contains("does not answer each row as it alone: not batched rows=4"),
        "{log}"
    );
    assert!(!log.contains("batching single-sample requests"), "{log}");
    assert_eq!(runs, 4.0, "each request ran alone");
}

#[test]
fn batched_requests_get_exactly_the_answers_they_get_alone() {
    // A detector's convolutions, with a four-image profile beside its one-image one.
    let (case, dir) = batchable("detector.onnx");
    let fixture = case.fixture();
    let args = [
        "--instances",
        "1",
        "--max-batch",
        "4",
        "--batch-delay-us",
        "200000",
    ];
    let mut server = spawn(&dir, &args);
    ready(&mut server);
    let base = format!("http://127.0.0.1:{}", server.port);
    let url = format!("{base}/v2/models/mlp/infer");
    // One engine, a batch of four a run: four admitted at once, and by default as many wait.
    let (_, meta) = get(&format!("{base}/v2/models/mlp")).expect("metadata");
    let meta: serde_json::Value = serde_json::from_str(&meta).expect("json");
    assert_eq!(
        meta["parameters"],
        serde_json::json!({"instances": 1, "workers": 1, "admitted": 4, "maxQueue": 4}),
        "{meta}"
    );
    let sample = fixture.samples().remove(0);
    let requests: Vec<(Vec<u8>, usize)> = (0..4)
        .map(|i| scaled(&sample, 1.0 + 0.25 * i as f32))
        .collect();
    let client = reqwest::Client::new();
    let rt = runtime();
    // Alone: one at a time, each a batch of one once the delay passes.
    let alone: Vec<_> = requests
        .iter()
        .map(|r| rt.block_on(outputs_of(&client, &url, r)))
        .collect();
    assert!(
        alone[0] != alone[1] && alone[1] != alone[3],
        "different inputs, different answers"
    );
    let runs_alone = metric_of(
        &base,
        "kiln_inference_exec_total{model=\"mlp\",version=\"1\"}",
    );
    assert_eq!(runs_alone, 4.0);
    // Together: four at once, three times; each gets the bytes it got alone.
    for _ in 0..3 {
        let together = rt.block_on(futures::future::join_all(
            requests.iter().map(|r| outputs_of(&client, &url, r)),
        ));
        for (i, got) in together.iter().enumerate() {
            assert!(
                got == &alone[i],
                "request {i} answered differently in a batch"
            );
        }
    }
    let runs = metric_of(
        &base,
        "kiln_inference_exec_total{model=\"mlp\",version=\"1\"}",
    ) - runs_alone;
    let log = {
        drop(rt);
        let _ = server.child.kill();
        stderr_of(&mut server)
    };
    assert!(log.contains("batching single-sample requests"), "{log}");
    assert!(runs < 12.0, "12 requests in {runs} runs: batched");
}

fn metric_of(base: &str, series: &str) -> f64 {
    let (_, text) = get(&format!("{base}/metrics")).expect("metrics");
    common::metric(&text, series).unwrap_or_else(|| panic!("{series} missing from {text}"))
}
