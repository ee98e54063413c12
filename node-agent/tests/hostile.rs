//! The runtime half of the bad-input corpus (the spec half is specs.rs): hostile URIs and HTTPS
//! servers, fixtures, ONNX graphs, compiled-artifact archives planted in the store, store
//! tampering and compiler behaviour, one table row each, every row run through the real
//! `kiln-agent local`. For every row the runner asserts the run finished (killed after
//! [`DEADLINE`]), failed with the row's reason and a message holding every needle (or, for a
//! tampered store the agent is to repair, was ready again with the good artifact), and left
//! nothing behind: no new store entry, no scratch, partial or staging file in the store, no
//! unverified blob, nothing in the compiler's temp directory, no stray file in the case
//! directory. All mismatches are reported together.
//!
//! `spec.format` names no archive format (onnx, torch-export, safetensors, gguf): the only
//! archives kiln reads are its own compiled artifacts (a tar of NNEF profiles), and those are
//! the `archive` rows.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{AGENT, Case, HttpsServer, data};
use kiln_store::staged::{sha256_bytes, sha256_file};
use onnx::{model, node};
use serde_json::{Value, json};

/// A run still going after this is killed and counted as a hang.
const DEADLINE: Duration = Duration::from_secs(60);
/// A failure message longer than this is a bug of its own (it ends up in a status condition).
const MAX_MESSAGE: usize = 64 << 10;

/// What a row expects.
enum Expect {
    /// Not ready: exit status non-zero, this reason, every needle in the message.
    Fails(&'static str, &'static [&'static str]),
    /// Ready after the agent refused what the setup planted in the store: compiled again
    /// (`rebuilt`, the first run's artifact again) or reused.
    Ready { rebuilt: bool },
}

/// What a setup leaves for the run and its checks.
#[derive(Default)]
struct Prep {
    /// Environment of the run.
    env: Vec<(&'static str, OsString)>,
    /// Message needles known only once the setup ran (digests, sizes).
    needles: Vec<String>,
    /// The artifact digest of a first, good run (store rows).
    good: Option<String>,
    /// Paths that must not exist after the run.
    absent: Vec<PathBuf>,
    /// Paths that must be files hashing to their own name after the run.
    verified: Vec<PathBuf>,
    /// A `pgrep -f` pattern no process may match after the run.
    gone: Option<&'static str>,
}

impl Prep {
    fn env(&mut self, key: &'static str, value: impl Into<OsString>) {
        self.env.push((key, value.into()));
    }
}

type Setup = fn(&mut Case, &Ctx, &mut Prep) -> Result<(), String>;

/// One hostile input.
struct Hostile {
    name: &'static str,
    category: &'static str,
    setup: Setup,
    expect: Expect,
    /// Needles in the agent's log (what it refused before the outcome).
    logged: &'static [&'static str],
}

fn fails(
    category: &'static str,
    name: &'static str,
    setup: Setup,
    reason: &'static str,
    needles: &'static [&'static str],
) -> Hostile {
    Hostile {
        name,
        category,
        setup,
        expect: Expect::Fails(reason, needles),
        logged: &[],
    }
}

fn ready(category: &'static str, name: &'static str, setup: Setup, rebuilt: bool) -> Hostile {
    Hostile {
        name,
        category,
        setup,
        expect: Expect::Ready { rebuilt },
        logged: &[],
    }
}

impl Hostile {
    fn logged(mut self, needles: &'static [&'static str]) -> Self {
        self.logged = needles;
        self
    }
}

/// What the rows share: key pairs, and servers to fetch from.
struct Ctx {
    dir: tempfile::TempDir,
    /// `tests/data/hostile_https.py` serving `www/` (model.onnx), when python3 runs.
    https: Option<HttpsServer>,
    /// Accepts TCP connections and never says a word (a TLS handshake that never ends).
    silent_port: u16,
    /// Answers anything with plain-text HTTP (an `https://` URI pointing at an HTTP server).
    plaintext_port: u16,
}

impl Ctx {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for keys in ["keys", "other-keys"] {
            let out = Command::new(AGENT)
                .arg("keygen")
                .arg(dir.path().join(keys))
                .output()
                .expect("keygen");
            assert!(out.status.success(), "keygen: {out:?}");
        }
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).expect("www");
        std::fs::copy(data("mlp.onnx"), www.join("model.onnx")).expect("copy");
        let https = HttpsServer::hostile(&www);
        if https.is_none() {
            kiln_endpoints::test_support::skip(
                "the https rows: python3 tests/data/hostile_https.py (or openssl) did not start",
            );
        }
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let silent_port = silent.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in silent.incoming() {
                held.push(stream);
            }
        });
        let plaintext = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let plaintext_port = plaintext.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for mut stream in plaintext.incoming().flatten() {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
            }
        });
        Self {
            dir,
            https,
            silent_port,
            plaintext_port,
        }
    }

    fn signing_key(&self) -> PathBuf {
        self.dir.path().join("keys/signing.key")
    }

    fn trust_key(&self) -> PathBuf {
        self.dir.path().join("keys/signing.pub")
    }

    fn other_signing_key(&self) -> PathBuf {
        self.dir.path().join("other-keys/signing.key")
    }

    /// The hostile server's URL for `path`, trusting its CA; a skip without it.
    fn https(&self, prep: &mut Prep, path: &str) -> Result<String, String> {
        let server = self.https.as_ref().ok_or(SKIP)?;
        prep.env("SSL_CERT_FILE", server.ca.as_os_str());
        Ok(format!("https://127.0.0.1:{}/{path}", server.port))
    }
}

const SKIP: &str = "skipped: no hostile HTTPS server (python3)";

// --- the run -----------------------------------------------------------------------------

/// A finished `kiln-agent local`.
struct Outcome {
    json: Value,
    success: bool,
    stderr: String,
}

impl Outcome {
    fn message(&self) -> &str {
        self.json["message"].as_str().unwrap_or("")
    }
}

/// Reads `stream` to its end on a thread of its own.
fn drain(stream: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut stream) = stream {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stream.read_to_end(&mut bytes);
            let _ = tx.send(bytes);
        });
    }
    rx
}

/// Writes the case's YAML and runs `kiln-agent local` on it in the case directory, with
/// `TMPDIR` the case's `tmpdir/`; killed after [`DEADLINE`].
fn agent(case: &Case, env: &[(&'static str, OsString)]) -> Result<Outcome, String> {
    std::fs::write(case.path("kiln.yaml"), case.yaml()).map_err(|e| e.to_string())?;
    let mut child = Command::new(AGENT)
        .current_dir(case.dir.path())
        .env("TMPDIR", case.path("tmpdir"))
        .env_remove("SSL_CERT_FILE")
        .env_remove("KILN_SIGNING_KEY")
        .env_remove("KILN_TRUST_KEY")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(["local", "--output", "json", "--store"])
        .arg(case.store())
        .arg("--metrics-file")
        .arg(case.path("metrics.prom"))
        .arg(case.path("kiln.yaml"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {AGENT}: {e}"))?;
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {DEADLINE:?}: killed"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let held = "exited, but its output stayed open: something it started outlived it";
    let stdout = stdout
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| held)?;
    let stderr = stderr
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| held)?;
    let stdout = String::from_utf8_lossy(&stdout);
    let stderr = String::from_utf8_lossy(&stderr).into_owned();
    let last = stdout.lines().last().unwrap_or_default();
    let json = serde_json::from_str(last).map_err(|e| {
        let tail: String = stderr
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("last stdout line is not JSON ({e}): {stdout:?}; stderr ends {tail}")
    })?;
    Ok(Outcome {
        json,
        success: status.success(),
        stderr,
    })
}

/// Every path under `root`, relative, links not followed.
fn walk(root: &Path) -> BTreeSet<PathBuf> {
    let mut paths = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path.clone());
            }
            paths.insert(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
        }
    }
    paths
}

/// Names in `dir` (empty when it does not exist).
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `path` is a regular file whose sha256 is its name.
fn is_verified(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
        && sha256_file(path).is_ok_and(|(digest, _)| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy() == digest)
        })
}

/// Runs one row: what was wrong, and the outcome's reason and message; `Err` when it was
/// skipped or its setup failed.
fn run_row(row: &Hostile, ctx: &Ctx) -> Result<(Vec<String>, String), String> {
    let mut case = Case::mlp(4);
    let mut prep = Prep::default();
    std::fs::create_dir_all(case.path("tmpdir")).map_err(|e| e.to_string())?;
    (row.setup)(&mut case, ctx, &mut prep)?;
    std::fs::write(case.path("kiln.yaml"), case.yaml()).map_err(|e| e.to_string())?;
    let before = walk(case.dir.path());
    let entries_before = names(&case.store().join("artifacts"));
    let run = agent(&case, &prep.env)?;
    let mut wrong = Vec::new();
    let o = &run.json;
    let message = run.message();
    match &row.expect {
        Expect::Fails(reason, needles) => {
            if run.success {
                wrong.push("exit status 0".to_string());
            }
            if o["ready"] != false {
                wrong.push(format!("ready is {}", o["ready"]));
            }
            let mut bad = o["reason"] != *reason;
            if bad {
                wrong.push(format!("reason {}, not {reason}", o["reason"]));
            }
            for needle in needles
                .iter()
                .map(|n| n.to_string())
                .chain(prep.needles.clone())
            {
                if !message.contains(&needle) {
                    wrong.push(format!("message lacks {needle:?}"));
                    bad = true;
                }
            }
            if bad {
                wrong.push(format!("the message: {message}"));
            }
            let metrics = std::fs::read_to_string(case.path("metrics.prom")).unwrap_or_default();
            let series = format!("kiln_agent_failures_total{{reason=\"{reason}\"}} 1");
            if !metrics.lines().any(|l| l == series) {
                wrong.push(format!("metrics lack {series:?}"));
            }
        }
        Expect::Ready { rebuilt } => {
            if !run.success || o["ready"] != true {
                wrong.push(format!("not ready: {} {message}", o["reason"]));
            } else if *rebuilt {
                let good = prep.good.as_deref().unwrap_or("(no first run)");
                if o["cacheHit"] != false {
                    wrong.push("served from the store, not rebuilt".into());
                }
                if o["artifactDigest"] != good {
                    wrong.push(format!(
                        "artifact {}, not the good {good}",
                        o["artifactDigest"]
                    ));
                }
                let key = o["compileKey"].as_str().unwrap_or_default();
                let stored = case.store().join("artifacts").join(key).join("artifact");
                match sha256_file(&stored) {
                    Ok((digest, _)) if digest == good => {}
                    other => wrong.push(format!("the stored artifact is {other:?}, not {good}")),
                }
            } else if o["cacheHit"] != true {
                wrong.push("compiled again instead of reusing the intact entry".into());
            }
        }
    }
    if message.len() > MAX_MESSAGE {
        wrong.push(format!("a message of {} bytes", message.len()));
    }
    for needle in row.logged {
        if !run.stderr.contains(needle) {
            wrong.push(format!("the log lacks {needle:?}"));
        }
    }
    wrong.extend(leftovers(
        &case,
        &prep,
        &before,
        &entries_before,
        &row.expect,
    ));
    Ok((wrong, format!("{} {message}", o["reason"])))
}

/// What the run left that it should not have.
fn leftovers(
    case: &Case,
    prep: &Prep,
    before: &BTreeSet<PathBuf>,
    entries_before: &BTreeSet<String>,
    expect: &Expect,
) -> Vec<String> {
    let mut wrong = Vec::new();
    let failed = matches!(expect, Expect::Fails(..));
    let store = case.store();
    for path in walk(case.dir.path()).difference(before) {
        let shown = path.display();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path == Path::new("metrics.prom") {
            continue;
        }
        if !path.starts_with("store") {
            wrong.push(format!("a stray {shown}"));
        } else if [".kiln-partial-", ".model-", ".tmp", "kiln-exec-"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            wrong.push(format!("a partial or scratch {shown}"));
        } else if failed && path.starts_with("store/artifacts") && path.components().count() > 2 {
            wrong.push(format!("a failed run stored {shown}"));
        } else if (path.starts_with("store/blobs") || path.starts_with("store/cache"))
            && path.components().count() == 3
            && !is_verified(&case.dir.path().join(path))
        {
            wrong.push(format!("an unverified {shown}"));
        }
    }
    let scratch = names(&store.join("tmp"));
    if !scratch.is_empty() {
        wrong.push(format!("store/tmp holds {scratch:?}"));
    }
    let tmp = names(&case.path("tmpdir"));
    if !tmp.is_empty() {
        wrong.push(format!("the compiler's TMPDIR holds {tmp:?}"));
    }
    let entries = names(&store.join("artifacts"));
    if &entries != entries_before {
        wrong.push(format!(
            "store/artifacts holds {entries:?}, before the run {entries_before:?}"
        ));
    }
    for path in &prep.absent {
        if std::fs::symlink_metadata(path).is_ok() {
            wrong.push(format!("{} is still there", path.display()));
        }
    }
    for path in &prep.verified {
        if !is_verified(path) {
            wrong.push(format!("{} is not a verified blob", path.display()));
        }
    }
    if let Some(pattern) = prep.gone {
        let survivors = Command::new("pgrep").args(["-f", pattern]).output();
        if let Ok(out) = survivors
            && !out.stdout.is_empty()
        {
            let pids = String::from_utf8_lossy(&out.stdout).into_owned();
            wrong.push(format!(
                "processes matching {pattern:?} outlived the run: {pids}"
            ));
            for pid in pids.split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
    }
    wrong
}

// --- inputs ------------------------------------------------------------------------------

fn set_model(case: &mut Case, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(case.path("model.onnx"), bytes).map_err(|e| e.to_string())?;
    case.model_sha = sha256_bytes(bytes);
    case.model_size = bytes.len() as u64;
    Ok(())
}

fn set_fixture(case: &mut Case, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(case.path("fixture.safetensors"), bytes).map_err(|e| e.to_string())?;
    case.fixture_sha = sha256_bytes(bytes);
    Ok(())
}

/// The fixture's safetensors header (JSON) and data.
fn fixture_parts(case: &Case) -> Result<(Value, Vec<u8>), String> {
    let bytes = std::fs::read(case.path("fixture.safetensors")).map_err(|e| e.to_string())?;
    let n = u64::from_le_bytes(bytes[..8].try_into().map_err(|_| "short")?) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).map_err(|e| e.to_string())?;
    Ok((header, bytes[8 + n..].to_vec()))
}

/// Rewrites the fixture from a header and data, as a safetensors writer would lay them out.
fn put_fixture_parts(case: &mut Case, header: &Value, data: &[u8]) -> Result<(), String> {
    let mut json = serde_json::to_vec(header).map_err(|e| e.to_string())?;
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.extend_from_slice(data);
    set_fixture(case, &bytes)
}

/// Edits the fixture's header.
fn edit_fixture(case: &mut Case, edit: impl FnOnce(&mut Value)) -> Result<(), String> {
    let (mut header, data) = fixture_parts(case)?;
    edit(&mut header);
    put_fixture_parts(case, &header, &data)
}

/// Edits the `kiln.fixture` metadata map of the fixture.
fn edit_fixture_meta(case: &mut Case, edit: impl FnOnce(&mut Value)) -> Result<(), String> {
    edit_fixture(case, |h| {
        let meta = &mut h["__metadata__"]["kiln.fixture"];
        let mut map: Value =
            serde_json::from_str(meta.as_str().unwrap_or("{}")).unwrap_or_default();
        edit(&mut map);
        *meta = Value::String(map.to_string());
    })
}

/// Makes the target's backend `exec` running `sh -c script`.
fn exec(case: &mut Case, script: &str, deadline_seconds: Option<u32>) {
    case.backend_kind = "exec";
    case.backend_extra = format!(
        ", image: \"registry.example/compiler@sha256:{}\", command: [sh, -c, {}]",
        "c".repeat(64),
        serde_json::to_string(script).unwrap_or_default()
    );
    if let Some(s) = deadline_seconds {
        case.warmup_extra = format!("\n  compile: {{activeDeadlineSeconds: {s}}}");
    }
}

/// A first, good run storing the case's artifact; returns its compile key.
fn stored_once(
    case: &Case,
    prep: &mut Prep,
    env: &[(&'static str, OsString)],
) -> Result<String, String> {
    let run = agent(case, env)?;
    if !run.success {
        return Err(format!("the first run failed: {}", run.message()));
    }
    prep.good = run.json["artifactDigest"].as_str().map(str::to_string);
    run.json["compileKey"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "no compile key".into())
}

fn entry(case: &Case, key: &str) -> PathBuf {
    case.store().join("artifacts").join(key)
}

fn edit_manifest(case: &Case, key: &str, edit: impl FnOnce(&mut Value)) -> Result<(), String> {
    let path = entry(case, key).join("manifest.json");
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(&path).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    edit(&mut manifest);
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    resign(case, key)
}

/// Signs the edited entry of `key` with the store's own key, as someone holding it would: the
/// checks behind the signature (digests, the loaders) are what these rows exercise. Nothing
/// without that key (a row that passes its own keys tests the signature itself).
fn resign(case: &Case, key: &str) -> Result<(), String> {
    common::resign(&case.store(), key)
}

/// Replaces the stored artifact of `key` with `bytes` and rewrites its manifest to match: a
/// store whose digests all agree with each other (only an attestation would tell).
fn plant_artifact(case: &Case, key: &str, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(entry(case, key).join("artifact"), bytes).map_err(|e| e.to_string())?;
    edit_manifest(case, key, |m| {
        m["artifactDigest"] = json!(sha256_bytes(bytes));
        m["artifactSize"] = json!(bytes.len());
    })
}

/// The one attestation file of a signed entry.
fn attestation(case: &Case, key: &str) -> Result<PathBuf, String> {
    std::fs::read_dir(entry(case, key))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("attestation-"))
        })
        .ok_or_else(|| "no attestation".into())
}

/// A tar with raw entry names (no path checks) and optionally a size claim other than the data.
fn tar(entries: &[(&str, &[u8], Option<u64>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data, claimed) in entries {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_size(claimed.unwrap_or(data.len() as u64));
        header.set_cksum();
        let _ = builder.append(&header, *data);
    }
    builder.into_inner().unwrap_or_default()
}

/// Pseudo-random bytes (a fixed seed: the same corpus every run).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

/// Just enough of the protobuf wire format to write ONNX models field by field, so each hostile
/// graph is made here and says in code what is wrong with it.
mod onnx {
    pub const FLOAT: i64 = 1;
    pub const STRING: i64 = 8;
    pub const DOUBLE: i64 = 11;
    pub const COMPLEX64: i64 = 14;

    /// A message being written.
    #[derive(Default)]
    pub struct Pb(pub Vec<u8>);

    impl Pb {
        fn varint(&mut self, mut v: u64) {
            loop {
                let byte = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    self.0.push(byte);
                    return;
                }
                self.0.push(byte | 0x80);
            }
        }

        /// A varint field.
        pub fn int(mut self, field: u64, v: i64) -> Self {
            self.varint(field << 3);
            self.varint(v as u64);
            self
        }

        /// A length-delimited field.
        pub fn bytes(mut self, field: u64, b: &[u8]) -> Self {
            self.varint((field << 3) | 2);
            self.varint(b.len() as u64);
            self.0.extend_from_slice(b);
            self
        }

        pub fn str(self, field: u64, s: &str) -> Self {
            self.bytes(field, s.as_bytes())
        }

        pub fn msg(self, field: u64, m: Pb) -> Self {
            self.bytes(field, &m.0)
        }
    }

    /// ValueInfoProto `name: elem[batch, 16]`.
    pub fn io(name: &str, elem: i64) -> Pb {
        let shape = Pb::default()
            .msg(1, Pb::default().str(2, "batch"))
            .msg(1, Pb::default().int(1, 16));
        let tensor = Pb::default().int(1, elem).msg(2, shape);
        Pb::default()
            .str(1, name)
            .msg(2, Pb::default().msg(1, tensor))
    }

    /// NodeProto.
    pub fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> Pb {
        let mut n = Pb::default();
        for i in inputs {
            n = n.str(1, i);
        }
        for o in outputs {
            n = n.str(2, o);
        }
        n.str(4, op)
    }

    /// A float TensorProto `name` of `dims` (data to be added).
    pub fn tensor(name: &str, dims: &[i64]) -> Pb {
        let mut t = Pb::default();
        for d in dims {
            t = t.int(1, *d);
        }
        t.int(2, FLOAT).str(8, name)
    }

    /// A float tensor whose data is ONNX external data in `location`.
    pub fn external(name: &str, dims: &[i64], location: &str, length: &str) -> Pb {
        let kv = |k: &str, v: &str| Pb::default().str(1, k).str(2, v);
        tensor(name, dims)
            .msg(13, kv("location", location))
            .msg(13, kv("offset", "0"))
            .msg(13, kv("length", length))
            .int(14, 1)
    }

    /// A model: graph input `input` (`x`), output `y`, both `elem[batch, 16]`.
    pub struct Model {
        pub input: &'static str,
        pub nodes: Vec<Pb>,
        pub initializers: Vec<Pb>,
        pub elem: i64,
        pub opset: i64,
        pub ir_version: i64,
    }

    pub fn model(nodes: Vec<Pb>) -> Model {
        Model {
            input: "x",
            nodes,
            initializers: Vec::new(),
            elem: FLOAT,
            opset: 13,
            ir_version: 8,
        }
    }

    impl Model {
        pub fn bytes(self) -> Vec<u8> {
            let mut graph = Pb::default();
            for n in self.nodes {
                graph = graph.msg(1, n);
            }
            graph = graph.str(2, "hostile");
            for t in self.initializers {
                graph = graph.msg(5, t);
            }
            graph = graph
                .msg(11, io(self.input, self.elem))
                .msg(12, io("y", self.elem));
            Pb::default()
                .int(1, self.ir_version)
                .str(2, "kiln-tests")
                .msg(7, graph)
                .msg(8, Pb::default().str(1, "").int(2, self.opset))
                .0
        }
    }
}

fn matmul_with(w: onnx::Pb) -> Vec<u8> {
    let mut m = model(vec![node("MatMul", &["x", "w"], &["y"])]);
    m.initializers.push(w);
    m.bytes()
}

// --- the corpus --------------------------------------------------------------------------

fn table() -> Vec<Hostile> {
    vec![
        // URIs and sources.
        fails(
            "uri",
            "file:// to a missing file",
            |c, _, _| {
                c.source_uri = "file://nowhere/model.onnx".into();
                Ok(())
            },
            "SourceUnavailable",
            &["nowhere/model.onnx", "No such file or directory"],
        ),
        fails(
            "uri",
            "file:// to a directory",
            |c, _, _| {
                std::fs::create_dir(c.path("models")).map_err(|e| e.to_string())?;
                c.source_uri = "file://models".into();
                Ok(())
            },
            "SourceUnavailable",
            &["models is a directory, not a regular file"],
        ),
        fails(
            "uri",
            "file:///dev/zero with a declared size",
            |c, _, _| {
                c.source_uri = "file:///dev/zero".into();
                Ok(())
            },
            "SourceUnavailable",
            &[
                "file:///dev/zero",
                "is a character device, not a regular file",
            ],
        ),
        fails(
            "uri",
            "file:// to a FIFO nobody writes",
            |c, _, _| {
                let status = Command::new("mkfifo")
                    .arg(c.path("pipe"))
                    .status()
                    .map_err(|e| e.to_string())?;
                if !status.success() {
                    return Err("mkfifo failed".into());
                }
                c.source_uri = "file://pipe".into();
                Ok(())
            },
            "SourceUnavailable",
            &["is a FIFO, not a regular file"],
        ),
        fails(
            "uri",
            "file:// to a symlink loop",
            |c, _, _| {
                std::os::unix::fs::symlink("b.onnx", c.path("a.onnx"))
                    .map_err(|e| e.to_string())?;
                std::os::unix::fs::symlink("a.onnx", c.path("b.onnx"))
                    .map_err(|e| e.to_string())?;
                c.source_uri = "file://a.onnx".into();
                Ok(())
            },
            "SourceUnavailable",
            &["a.onnx", "Too many levels of symbolic links"],
        ),
        fails(
            "uri",
            "declared size one byte short",
            |c, _, p| {
                c.model_size -= 1;
                p.needles.push(format!(
                    "larger than the declared size of {} bytes",
                    c.model_size
                ));
                Ok(())
            },
            "HashMismatch",
            &["model source"],
        ),
        fails(
            "uri",
            "declared size one byte long",
            |c, _, p| {
                c.model_size += 1;
                p.needles.push(format!(
                    "truncated: got {} of the declared {} bytes",
                    c.model_size - 1,
                    c.model_size
                ));
                Ok(())
            },
            "HashMismatch",
            &["model source"],
        ),
        fails(
            "uri",
            "empty source file",
            |c, _, _| {
                std::fs::write(c.path("empty.onnx"), b"").map_err(|e| e.to_string())?;
                c.source_uri = "file://empty.onnx".into();
                Ok(())
            },
            "HashMismatch",
            &["empty.onnx", "truncated: got 0 of the declared"],
        ),
        fails(
            "uri",
            "sha256 of another file (the fixture)",
            |c, _, p| {
                p.needles.push(format!(
                    "sha256 is {}, the spec declares {}",
                    c.model_sha, c.fixture_sha
                ));
                c.model_sha = c.fixture_sha.clone();
                Ok(())
            },
            "HashMismatch",
            &["model source"],
        ),
        fails(
            "uri",
            "oci:// source by tag",
            |c, _, _| {
                c.source_uri = "oci://registry.example/models/mlp:1".into();
                Ok(())
            },
            "InvalidSpec",
            &["pin the artifact by digest, not by tag"],
        ),
        fails(
            "uri",
            "oci:// source on a registry that is not there",
            |c, _, _| {
                c.source_uri = format!("oci://127.0.0.1:1/models/mlp@sha256:{}", "a".repeat(64));
                Ok(())
            },
            "SourceUnavailable",
            &["cannot reach registry 127.0.0.1:1 over https"],
        ),
        fails(
            "uri",
            "undeclared-size asset from /dev/urandom",
            |c, _, _| {
                c.model_extra = format!(
                    "\n  assets:\n    - {{name: noise, kind: other, uri: \"file:///dev/urandom\", sha256: \"{}\"}}",
                    "a".repeat(64)
                );
                Ok(())
            },
            "SourceUnavailable",
            &["file:///dev/urandom", "/dev/urandom is a character device"],
        ),
        fails(
            "uri",
            "asset named like the model it would shadow",
            |c, _, _| {
                c.model_extra = format!(
                    "\n  assets:\n    - {{name: model.onnx, kind: other, uri: \"file://fixture.safetensors\", sha256: \"{}\"}}",
                    c.fixture_sha
                );
                Ok(())
            },
            "InvalidSpec",
            &["spec.assets[model.onnx]", "other than model.onnx"],
        ),
        // HTTPS servers.
        fails(
            "https",
            "nobody listening",
            |c, _, _| {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map_err(|e| e.to_string())?
                    .port();
                c.source_uri = format!("https://127.0.0.1:{port}/model.onnx");
                Ok(())
            },
            "SourceUnavailable",
            &["Connection refused"],
        ),
        fails(
            "https",
            "certificate from an untrusted CA",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "model.onnx")?;
                p.env.clear();
                Ok(())
            },
            "SourceUnavailable",
            &["invalid peer certificate", "UnknownIssuer"],
        ),
        fails(
            "https",
            "TLS handshake that never comes",
            |c, ctx, p| {
                c.source_uri = format!("https://127.0.0.1:{}/model.onnx", ctx.silent_port);
                p.env("KILN_FETCH_CONNECT_TIMEOUT", "1");
                p.env("KILN_FETCH_READ_TIMEOUT", "1");
                Ok(())
            },
            "SourceUnavailable",
            &["timed out"],
        ),
        fails(
            "https",
            "plain HTTP behind an https:// URI",
            |c, ctx, _| {
                c.source_uri = format!("https://127.0.0.1:{}/model.onnx", ctx.plaintext_port);
                Ok(())
            },
            "SourceUnavailable",
            &["received corrupt message"],
        ),
        fails(
            "https",
            "redirect down to plain HTTP",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "redirect-http/model.onnx")?;
                Ok(())
            },
            "SourceUnavailable",
            &["refused a redirect to http://", "only https:// is followed"],
        ),
        fails(
            "https",
            "endless redirect loop",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "loop/0")?;
                p.env("KILN_FETCH_MAX_REDIRECTS", "2");
                Ok(())
            },
            "SourceUnavailable",
            &["more than 2 redirects"],
        ),
        fails(
            "https",
            "server stalls mid-body",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "stall")?;
                p.env("KILN_FETCH_READ_TIMEOUT", "1");
                Ok(())
            },
            "SourceUnavailable",
            &["stall", "timed out"],
        ),
        fails(
            "https",
            "server drips a byte every 0.2 s",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "drip")?;
                // The rate floor's window is the read timeout. At 1 s a loaded machine that
                // delays one drip past it made this the read timeout's row instead (a flake);
                // at 3 s a drip would have to be 15 times late.
                p.env("KILN_FETCH_READ_TIMEOUT", "3");
                Ok(())
            },
            "SourceUnavailable",
            &[
                "the transfer stalled",
                "below --fetch-min-rate 1024 bytes/s",
            ],
        ),
        fails(
            "https",
            "Content-Length of a petabyte",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "huge-length")?;
                Ok(())
            },
            "HashMismatch",
            &["huge-length", "larger than the declared size"],
        ),
        fails(
            "https",
            "connection closed mid-body",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "short")?;
                Ok(())
            },
            "SourceUnavailable",
            &["short", "error decoding response body"],
        ),
        fails(
            "https",
            "HTTP 500",
            |c, ctx, p| {
                c.source_uri = ctx.https(p, "status/500")?;
                Ok(())
            },
            "SourceUnavailable",
            &["HTTP 500"],
        ),
        fails(
            "https",
            "endless fixture body without a length",
            |c, ctx, p| {
                c.fixture_uri = ctx.https(p, "zero")?;
                p.env("KILN_FETCH_MAX_BYTES", "1048576");
                Ok(())
            },
            "SourceUnavailable",
            &["fixture v1 is larger than 1048576 bytes"],
        ),
        // Fixtures.
        fails(
            "fixture",
            "random bytes",
            |c, _, _| set_fixture(c, &noise(4096, 1)),
            "InvalidSpec",
            &[
                "fixture v1 (file://",
                "fixture.safetensors): not a safetensors file",
                "not a safetensors file",
            ],
        ),
        fails(
            "fixture",
            "JSON, not safetensors",
            |c, _, _| set_fixture(c, br#"{"input/x": [[1, 2, 3]], "output/y": [[0.5]]}"#),
            "InvalidSpec",
            &["fixture v1", "not a safetensors file"],
        ),
        fails(
            "fixture",
            "empty file",
            |c, _, _| set_fixture(c, b""),
            "InvalidSpec",
            &["fixture v1", "not a safetensors file: header too small"],
        ),
        fails(
            "fixture",
            "truncated by 100 bytes",
            |c, _, _| {
                let bytes =
                    std::fs::read(c.path("fixture.safetensors")).map_err(|e| e.to_string())?;
                set_fixture(c, &bytes[..bytes.len() - 100])
            },
            "InvalidSpec",
            &["fixture v1", "not a safetensors file: incomplete metadata"],
        ),
        fails(
            "fixture",
            "header length pointing a terabyte past the end",
            |c, _, _| {
                let mut bytes =
                    std::fs::read(c.path("fixture.safetensors")).map_err(|e| e.to_string())?;
                bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                set_fixture(c, &bytes)
            },
            "InvalidSpec",
            &["fixture v1", "header too large"],
        ),
        fails(
            "fixture",
            "header claiming a [2^31, 2^31] tensor",
            |c, _, _| {
                edit_fixture(c, |h| {
                    h["input/x"]["shape"] = json!([1u64 << 31, 1u64 << 31])
                })
            },
            "InvalidSpec",
            &["fixture v1", "overflow computing buffer size"],
        ),
        fails(
            "fixture",
            "data shorter than the shape",
            |c, _, _| edit_fixture(c, |h| h["input/x"]["shape"] = json!([4, 15])),
            "InvalidSpec",
            &["fixture v1", "invalid shape, data type, or offset"],
        ),
        fails(
            "fixture",
            "data offsets a terabyte past the end",
            |c, _, _| {
                edit_fixture(c, |h| {
                    h["output/y"]["data_offsets"] = json!([256, 1u64 << 40])
                })
            },
            "InvalidSpec",
            &["fixture v1", "invalid shape, data type, or offset"],
        ),
        fails(
            "fixture",
            "unknown dtype",
            |c, _, _| edit_fixture(c, |h| h["input/x"]["dtype"] = json!("Q9")),
            "InvalidSpec",
            &["fixture v1", "unknown variant `Q9`"],
        ),
        fails(
            "fixture",
            "input the graph does not have",
            |c, _, _| {
                edit_fixture(c, |h| {
                    if let Some(m) = h.as_object_mut()
                        && let Some(x) = m.remove("input/x")
                    {
                        m.insert("input/z".into(), x);
                    }
                })
            },
            "InvalidSpec",
            &[
                "fixture v1 has inputs {\"z\": [4, 16]}",
                "match no compiled profile",
            ],
        ),
        fails(
            "fixture",
            "no input at all",
            |c, _, _| {
                let (mut h, data) = fixture_parts(c)?;
                let x = h
                    .as_object_mut()
                    .and_then(|m| m.remove("input/x"))
                    .ok_or("no input/x")?;
                let len = x["data_offsets"][1].as_u64().ok_or("offsets")? as usize;
                h["output/y"]["data_offsets"] = json!([0, data.len() - len]);
                put_fixture_parts(c, &h, &data[len..])
            },
            "InvalidSpec",
            &["fixture v1", "at least one input/ and one output/ tensor"],
        ),
        fails(
            "fixture",
            "tensor neither input/ nor output/",
            |c, _, _| {
                edit_fixture(c, |h| {
                    if let Some(m) = h.as_object_mut()
                        && let Some(x) = m.remove("input/x")
                    {
                        m.insert("weights/x".into(), x);
                    }
                })
            },
            "InvalidSpec",
            &[
                "fixture v1",
                "\"weights/x\" is neither input/<name> nor output/<name>",
            ],
        ),
        fails(
            "fixture",
            "a second sample without golden outputs",
            |c, _, _| {
                let (mut h, mut data) = fixture_parts(c)?;
                let mut x = h["input/x"].clone();
                let at = |i: usize| x["data_offsets"][i].as_u64().ok_or("offsets");
                let (a, b) = (at(0)? as usize, at(1)? as usize);
                let end = data.len();
                data.extend_from_within(a..b);
                x["data_offsets"] = json!([end, end + (b - a)]);
                h["sample1/input/x"] = x;
                put_fixture_parts(c, &h, &data)
            },
            "InvalidSpec",
            &[
                "sample1/ has outputs []",
                "every sample has the same output names",
            ],
        ),
        fails(
            "fixture",
            "a sample number with a leading zero",
            |c, _, _| {
                edit_fixture(c, |h| {
                    if let Some(m) = h.as_object_mut()
                        && let Some(x) = m.remove("input/x")
                    {
                        m.insert("sample01/input/x".into(), x);
                    }
                })
            },
            "InvalidSpec",
            &["\"sample01/input/x\"", "without leading zeros"],
        ),
        fails(
            "fixture",
            "made for fixture version v2",
            |c, _, _| edit_fixture_meta(c, |m| m["kiln.fixture.version"] = json!("v2")),
            "InvalidSpec",
            &["says version \"v2\", the ModelArtifact lists it as \"v1\""],
        ),
        fails(
            "fixture",
            "no kiln metadata",
            |c, _, _| {
                edit_fixture(c, |h| {
                    if let Some(m) = h.as_object_mut() {
                        m.remove("__metadata__");
                    }
                })
            },
            "InvalidSpec",
            &["fixture v1", "not a kiln fixture file"],
        ),
        fails(
            "fixture",
            "tolerance metadata that is not a number",
            |c, _, _| {
                edit_fixture_meta(c, |m| {
                    m["kiln.fixture.atol"] = json!("tight");
                    m["kiln.fixture.rtol"] = json!("1e-4");
                })
            },
            "InvalidSpec",
            &["fixture v1", "bad atol"],
        ),
        fails(
            "fixture",
            "declared sha256 of nothing it is",
            |c, _, p| {
                p.needles.push(format!("sha256 is {}", c.fixture_sha));
                c.fixture_sha = "0".repeat(64);
                Ok(())
            },
            "HashMismatch",
            &["fixture v1 file://", "the spec declares 0000"],
        ),
        fails(
            "fixture",
            "declared sha256 of the model (served from the blob cache)",
            |c, _, _| {
                c.fixture_sha = c.model_sha.clone();
                Ok(())
            },
            "InvalidSpec",
            &["fixture v1", "not a safetensors file"],
        ),
        fails(
            "fixture",
            "golden output transposed",
            |c, _, _| edit_fixture(c, |h| h["output/y"]["shape"] = json!([10, 4])),
            "ParityExceeded",
            &["output y: shape [4, 10], golden shape [10, 4]"],
        ),
        fails(
            "fixture",
            "golden value for an output the model lacks",
            |c, _, _| {
                let mut f = c.fixture();
                let y = f.outputs["y"].clone();
                f.outputs.insert("z".into(), y);
                c.write_fixture(&f);
                Ok(())
            },
            "InvalidSpec",
            &["fixture v1 has golden output \"z\""],
        ),
        fails(
            "fixture",
            "-inf golden value",
            |c, _, _| {
                let mut f = c.fixture();
                let y = f.outputs.get_mut("y").ok_or("no y")?;
                y.data[4..8].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
                c.write_fixture(&f);
                Ok(())
            },
            "InvalidSpec",
            &["output y: element 1 is -inf", "allowNonFinite"],
        ),
        fails(
            "fixture",
            "batch past the symbol's max",
            |c, _, _| {
                let bigger = Case::mlp(9);
                let bytes =
                    std::fs::read(bigger.path("fixture.safetensors")).map_err(|e| e.to_string())?;
                set_fixture(c, &bytes)
            },
            "InvalidSpec",
            &[
                "fixture v1 has inputs {\"x\": [9, 16]}",
                "match no compiled profile",
            ],
        ),
        // ONNX graphs.
        fails(
            "onnx",
            "random bytes",
            |c, _, _| set_model(c, &noise(4096, 2)),
            "CompileFailed",
            &[
                "cannot read ONNX model",
                "failed to decode Protobuf message",
            ],
        ),
        fails(
            "onnx",
            "first half of mlp.onnx",
            |c, _, _| {
                let bytes = std::fs::read(data("mlp.onnx")).map_err(|e| e.to_string())?;
                set_model(c, &bytes[..bytes.len() / 2])
            },
            "CompileFailed",
            &["cannot read ONNX model", "buffer underflow"],
        ),
        fails(
            "onnx",
            "a model with no graph",
            |c, _, _| {
                let proto = onnx::Pb::default()
                    .int(1, 8)
                    .msg(8, onnx::Pb::default().str(1, "").int(2, 13));
                set_model(c, &proto.0)
            },
            "CompileFailed",
            &["model proto does not contain a graph"],
        ),
        fails(
            "onnx",
            "a cycle",
            |c, _, _| {
                set_model(
                    c,
                    &model(vec![
                        node("Relu", &["x"], &["a"]),
                        node("Add", &["a", "b"], &["y"]),
                        node("Relu", &["y"], &["b"]),
                    ])
                    .bytes(),
                )
            },
            "CompileFailed",
            &["Loop detected"],
        ),
        fails(
            "onnx",
            "a node consuming an undefined value",
            |c, _, _| {
                set_model(
                    c,
                    &model(vec![node("Add", &["x", "ghost"], &["y"])]).bytes(),
                )
            },
            "CompileFailed",
            &["Could not resolve inputs", "ghost"],
        ),
        fails(
            "onnx",
            "an operator of a custom domain",
            |c, _, _| {
                set_model(
                    c,
                    &model(vec![node("Exfiltrate", &["x"], &["y"]).str(7, "com.evil")]).bytes(),
                )
            },
            "UnsupportedOperator",
            &["Exfiltrate"],
        ),
        fails(
            "onnx",
            "an operator set from the future",
            |c, _, _| {
                let mut m = model(vec![node("Relu", &["x"], &["y"])]);
                m.opset = 99;
                set_model(c, &m.bytes())
            },
            "UnsupportedOperator",
            &["operator set ai.onnx 99"],
        ),
        fails(
            "onnx",
            "an IR version from the future",
            |c, _, _| {
                let mut m = model(vec![node("Relu", &["x"], &["y"])]);
                m.ir_version = 999;
                set_model(c, &m.bytes())
            },
            "CompileFailed",
            &["IR version 999 is newer than any ONNX release"],
        ),
        fails(
            "onnx",
            "input f64 where the spec declares f32",
            |c, _, _| {
                let mut m = model(vec![node("Relu", &["x"], &["y"])]);
                m.elem = onnx::DOUBLE;
                set_model(c, &m.bytes())
            },
            "InvalidSpec",
            &["spec.inputs[0] (x).dtype is F32, the graph's is F64"],
        ),
        fails(
            "onnx",
            "string input and output",
            |c, _, _| {
                let mut m = model(vec![node("Identity", &["x"], &["y"])]);
                m.elem = onnx::STRING;
                set_model(c, &m.bytes())
            },
            "UnsupportedOperator",
            &["input x of dtype String", "output y of dtype String"],
        ),
        fails(
            "onnx",
            "complex64 input",
            |c, _, _| {
                let mut m = model(vec![node("Identity", &["x"], &["y"])]);
                m.elem = onnx::COMPLEX64;
                set_model(c, &m.bytes())
            },
            "CompileFailed",
            &["cannot read ONNX model", "Complex64"],
        ),
        fails(
            "onnx",
            "external data at an absolute path",
            |c, _, _| {
                set_model(
                    c,
                    &matmul_with(onnx::external("w", &[16, 16], "/etc/passwd", "1024")),
                )
            },
            "CompileFailed",
            &[
                "external data location must be a relative path",
                "/etc/passwd",
            ],
        ),
        fails(
            "onnx",
            "external data reaching a sibling blob through ..",
            |c, _, p| {
                let location = format!("../{}", c.fixture_sha);
                p.needles.push(location.clone());
                set_model(
                    c,
                    &matmul_with(onnx::external("w", &[16, 16], &location, "1024")),
                )
            },
            "CompileFailed",
            &["external data location must be a relative path"],
        ),
        fails(
            "onnx",
            "external data in a file that is not there",
            |c, _, _| {
                set_model(
                    c,
                    &matmul_with(onnx::external("w", &[16, 16], "weights.bin", "1024")),
                )
            },
            "CompileFailed",
            &["weights.bin", "No such file or directory"],
        ),
        fails(
            "onnx",
            "external data a terabyte long in the model itself",
            |c, _, _| {
                set_model(
                    c,
                    &matmul_with(onnx::external(
                        "w",
                        &[16, 16],
                        "model.onnx",
                        "1099511627776",
                    )),
                )
            },
            "CompileFailed",
            &["external data range 0..1099511627776 is out of bounds"],
        ),
        fails(
            "onnx",
            "raw data shorter than its shape",
            |c, _, _| {
                set_model(
                    c,
                    &matmul_with(onnx::tensor("w", &[16, 16]).bytes(9, &[0; 10])),
                )
            },
            "CompileFailed",
            &["Raw tensor data length (10) does not match shape [16, 16]"],
        ),
        fails(
            "onnx",
            "an initializer claiming [2^31, 2^31] without data",
            |c, _, _| set_model(c, &matmul_with(onnx::tensor("w", &[1 << 31, 1 << 31]))),
            "CompileFailed",
            &["cannot read ONNX model", "OutOfBounds"],
        ),
        fails(
            "onnx",
            "ONNX bytes declared as gguf",
            |c, _, _| {
                c.format = "gguf";
                Ok(())
            },
            "InvalidSpec",
            &["model is GGUF", "backend.kind: llamacpp"],
        ),
        // Compiled-artifact archives planted in the store (no trust key: the digests agree).
        fails(
            "archive",
            "random bytes",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                plant_artifact(c, &key, &noise(12288, 3))
            },
            "LoadFailed",
            &["load failed", "not a readable tar archive"],
        ),
        fails(
            "archive",
            "entries escaping with ../ and absolute names, no index",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                p.absent.push(c.dir.path().join("../kiln-escaped"));
                p.absent.push(PathBuf::from("/tmp/kiln-escaped-absolute"));
                plant_artifact(
                    c,
                    &key,
                    &tar(&[
                        ("../kiln-escaped", b"x", None),
                        ("/tmp/kiln-escaped-absolute", b"x", None),
                    ]),
                )
            },
            "LoadFailed",
            &["no kiln-profiles.json: not a kiln tract artifact"],
        ),
        fails(
            "archive",
            "index naming a profile outside the archive",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                let index = br#"{"profiles":[{"name":"p","file":"../../../etc/passwd","inputs":[["x",[4,16]]],"outputs":["y"]}]}"#;
                plant_artifact(c, &key, &tar(&[("kiln-profiles.json", index, None)]))
            },
            "LoadFailed",
            &["missing ../../../etc/passwd"],
        ),
        fails(
            "archive",
            "index that is not JSON",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                plant_artifact(
                    c,
                    &key,
                    &tar(&[("kiln-profiles.json", b"{profiles: yes", None)]),
                )
            },
            "LoadFailed",
            &["kiln-profiles.json: key must be a string"],
        ),
        fails(
            "archive",
            "profile that is not NNEF",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                let index = br#"{"profiles":[{"name":"p","file":"profiles/p.nnef.tar","inputs":[["x",[4,16]]],"outputs":["y"]}]}"#;
                plant_artifact(
                    c,
                    &key,
                    &tar(&[
                        ("profiles/p.nnef.tar", &noise(2048, 4), None),
                        ("kiln-profiles.json", index, None),
                    ]),
                )
            },
            "LoadFailed",
            &["profile p"],
        ),
        fails(
            "archive",
            "entry claiming a terabyte it does not hold",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                plant_artifact(
                    c,
                    &key,
                    &tar(&[("kiln-profiles.json", b"{}", Some(1 << 40))]),
                )
            },
            "LoadFailed",
            &["not a readable tar archive", "unexpected EOF"],
        ),
        fails(
            "archive",
            "another model's valid artifact",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                // mlp.onnx with one output bias moved, compiled with a fixture of its own.
                let other = Case::model("mlp-drift.onnx", 4);
                let drift_key = stored_once(&other, &mut Prep::default(), &[])?;
                let bytes = std::fs::read(entry(&other, &drift_key).join("artifact"))
                    .map_err(|e| e.to_string())?;
                plant_artifact(c, &key, &bytes)
            },
            "ParityExceeded",
            &["output y", "against golden"],
        ),
        // Store tampering.
        fails(
            "store",
            "a byte appended to the artifact",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                let path = entry(c, &key).join("artifact");
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(path)
                    .map_err(|e| e.to_string())?;
                f.write_all(b"\0").map_err(|e| e.to_string())
            },
            "HashMismatch",
            &["stored artifact", "more than the expected", "delete"],
        ),
        fails(
            "store",
            "artifact truncated",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(entry(c, &key).join("artifact"))
                    .map_err(|e| e.to_string())?;
                f.set_len(100).map_err(|e| e.to_string())
            },
            "HashMismatch",
            &["stored artifact", "got 100 bytes, expected", "delete"],
        ),
        fails(
            "store",
            "artifact deleted",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                std::fs::remove_file(entry(c, &key).join("artifact")).map_err(|e| e.to_string())
            },
            "HashMismatch",
            &["stored artifact", "it is missing", "delete"],
        ),
        fails(
            "store",
            "artifact replaced by a directory",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                let path = entry(c, &key).join("artifact");
                std::fs::remove_file(&path).map_err(|e| e.to_string())?;
                std::fs::create_dir(&path).map_err(|e| e.to_string())
            },
            "HashMismatch",
            &["stored artifact", "it is a directory", "delete"],
        ),
        fails(
            "store",
            "artifact replaced by a symlink to /etc/passwd",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                let path = entry(c, &key).join("artifact");
                std::fs::remove_file(&path).map_err(|e| e.to_string())?;
                std::os::unix::fs::symlink("/etc/passwd", &path).map_err(|e| e.to_string())
            },
            "HashMismatch",
            &["stored artifact", "it is a symbolic link", "delete"],
        ),
        // A digest that holds a path never becomes one: the entry is corrupt, rebuilt and
        // replaced, and nothing is created outside the store.
        ready(
            "store",
            "manifest whose artifact digest is a path: rebuilt, nothing outside the store",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                p.absent.push(c.dir.path().join("kiln-digest-escape"));
                edit_manifest(c, &key, |m| {
                    m["artifactDigest"] = json!("../../../kiln-digest-escape")
                })
            },
            true,
        )
        .logged(&[
            "the stored entry is corrupt; compiling and replacing it",
            "artifactDigest \"../../../kiln-digest-escape\" is not 64 hex digits",
        ]),
        fails(
            "store",
            "manifest naming another artifact digest",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                edit_manifest(c, &key, |m| m["artifactDigest"] = json!("ab".repeat(32)))
            },
            "HashMismatch",
            &["stored artifact", "sha256 mismatch: expected abab"],
        ),
        // A substituted entry is refused at lookup, like an unsigned one: the publisher builds the
        // key again from the verified sources and replaces it.
        ready(
            "store",
            "manifest naming another compile key: rebuilt and replaced",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                edit_manifest(c, &key, |m| m["compileKey"] = json!("ab".repeat(32)))
            },
            true,
        )
        .logged(&[
            "the stored entry is corrupt; compiling and replacing it",
            "it describes compile key abab",
        ]),
        fails(
            "store",
            "manifest that is not JSON",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                std::fs::write(entry(c, &key).join("manifest.json"), "{\"compileKey\":")
                    .map_err(|e| e.to_string())
            },
            "StoreUnavailable",
            &["unreadable manifest", "delete"],
        ),
        fails(
            "store",
            "manifest claiming an exabyte artifact",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                edit_manifest(c, &key, |m| m["artifactSize"] = json!(1u64 << 60))
            },
            "HashMismatch",
            &[
                "1152921504606846976 bytes is over the",
                "refusing to pull it",
            ],
        ),
        fails(
            "store",
            "manifest of another tract version",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                edit_manifest(c, &key, |m| m["backendVersion"] = json!("9.9.9"))
            },
            "IncompatibleRuntime",
            &["artifact built by tract 9.9.9"],
        ),
        fails(
            "store",
            "manifest of another hardware class",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                edit_manifest(c, &key, |m| {
                    m["class"] = json!({"kubernetes.io/arch": "riscv64"})
                })
            },
            "IncompatibleHardware",
            &["riscv64"],
        ),
        ready(
            "store",
            "manifest deleted: rebuilt",
            |c, _, p| {
                let key = stored_once(c, p, &[])?;
                std::fs::remove_file(entry(c, &key).join("manifest.json"))
                    .map_err(|e| e.to_string())
            },
            true,
        ),
        fails(
            "store",
            "signed entry's attestation deleted, node holds only the trust key",
            |c, ctx, p| {
                let key = stored_once(c, p, &[("KILN_SIGNING_KEY", ctx.signing_key().into())])?;
                std::fs::remove_file(attestation(c, &key)?).map_err(|e| e.to_string())?;
                p.env("KILN_TRUST_KEY", ctx.trust_key());
                Ok(())
            },
            "SignatureInvalid",
            &["no attestation"],
        )
        .logged(&["refusing the stored entry", "has no attestation"]),
        ready(
            "store",
            "signed entry's attestation deleted: the publisher rebuilds and signs",
            |c, ctx, p| {
                let key = stored_once(c, p, &[("KILN_SIGNING_KEY", ctx.signing_key().into())])?;
                std::fs::remove_file(attestation(c, &key)?).map_err(|e| e.to_string())?;
                p.env("KILN_SIGNING_KEY", ctx.signing_key());
                Ok(())
            },
            true,
        )
        .logged(&["refusing the stored entry"]),
        fails(
            "store",
            "attestation that is not an envelope",
            |c, ctx, p| {
                let key = stored_once(c, p, &[("KILN_SIGNING_KEY", ctx.signing_key().into())])?;
                std::fs::write(attestation(c, &key)?, "garbage").map_err(|e| e.to_string())?;
                p.env("KILN_TRUST_KEY", ctx.trust_key());
                Ok(())
            },
            "SignatureInvalid",
            &["no attestation"],
        )
        .logged(&["not a DSSE envelope"]),
        fails(
            "store",
            "attestation of 4 MiB",
            |c, ctx, p| {
                let key = stored_once(c, p, &[("KILN_SIGNING_KEY", ctx.signing_key().into())])?;
                std::fs::write(attestation(c, &key)?, vec![b'{'; 4 << 20])
                    .map_err(|e| e.to_string())?;
                p.env("KILN_TRUST_KEY", ctx.trust_key());
                Ok(())
            },
            "SignatureInvalid",
            &["no attestation"],
        )
        .logged(&["larger than 1048576 bytes; not read"]),
        fails(
            "store",
            "entry signed by another key",
            |c, ctx, p| {
                stored_once(
                    c,
                    p,
                    &[("KILN_SIGNING_KEY", ctx.other_signing_key().into())],
                )?;
                p.env("KILN_TRUST_KEY", ctx.trust_key());
                Ok(())
            },
            "SignatureInvalid",
            &["no attestation"],
        )
        .logged(&["no signature by a trusted key"]),
        ready(
            "store",
            "attestation of another entry swapped in: rebuilt",
            |c, ctx, p| {
                let sign = [("KILN_SIGNING_KEY", OsString::from(ctx.signing_key()))];
                let key = stored_once(c, p, &sign)?;
                let mine = attestation(c, &key)?;
                // The same model with another fixture file: another key, another signed entry.
                let original =
                    std::fs::read(c.path("fixture.safetensors")).map_err(|e| e.to_string())?;
                let mut f = c.fixture();
                f.tolerance = Some(kiln_crds::compiled_target::Tolerance {
                    atol: 1e-3,
                    rtol: 1e-3,
                });
                c.write_fixture(&f);
                let mut scratch = Prep::default();
                let other = stored_once(c, &mut scratch, &sign)?;
                std::fs::copy(attestation(c, &other)?, &mine).map_err(|e| e.to_string())?;
                set_fixture(c, &original)?;
                p.env("KILN_SIGNING_KEY", ctx.signing_key());
                Ok(())
            },
            true,
        )
        .logged(&["refusing the stored entry"]),
        fails(
            "store",
            "source blob replaced by a directory",
            |c, _, p| {
                stored_once(c, p, &[])?;
                let blob = c.store().join("blobs").join(&c.model_sha);
                std::fs::remove_file(&blob).map_err(|e| e.to_string())?;
                std::fs::create_dir(&blob).map_err(|e| e.to_string())
            },
            "StoreUnavailable",
            &["blobs/", "Is a directory", "delete this to fetch it again"],
        ),
        ready(
            "store",
            "source blob replaced by a symlink to /etc/passwd: fetched again",
            |c, _, p| {
                stored_once(c, p, &[])?;
                let blob = c.store().join("blobs").join(&c.model_sha);
                std::fs::remove_file(&blob).map_err(|e| e.to_string())?;
                std::os::unix::fs::symlink("/etc/passwd", &blob).map_err(|e| e.to_string())?;
                p.verified.push(blob);
                Ok(())
            },
            false,
        )
        .logged(&["cached blob corrupt; fetching again"]),
        ready(
            "store",
            "a stale partial blob of a killed fetch: swept",
            |c, _, p| {
                stored_once(c, p, &[])?;
                let partial = c.store().join("blobs").join(".kiln-partial-killed");
                std::fs::write(&partial, noise(1024, 5)).map_err(|e| e.to_string())?;
                let old = std::time::SystemTime::now() - Duration::from_secs(3600);
                std::fs::File::options()
                    .write(true)
                    .open(&partial)
                    .and_then(|f| f.set_modified(old))
                    .map_err(|e| e.to_string())?;
                p.absent.push(partial);
                Ok(())
            },
            false,
        )
        .logged(&["removed partial files of interrupted fetches"]),
        // Compiler behaviour (backend kind exec).
        fails(
            "exec",
            "killed by a signal",
            |c, _, _| {
                exec(c, "echo crashing >&2; kill -SEGV $$", None);
                Ok(())
            },
            "CompileFailed",
            &["was killed by signal 11", "crashing"],
        ),
        fails(
            "exec",
            "exits 0 having written an empty file",
            |c, _, _| {
                exec(c, ": > \"$KILN_ARTIFACT\"", None);
                Ok(())
            },
            "CompileFailed",
            &["exited 0 but wrote no model to $KILN_ARTIFACT"],
        ),
        fails(
            "exec",
            "writes a symlink to /etc/passwd as its result",
            |c, _, _| {
                exec(c, "ln -s /etc/passwd \"$KILN_ARTIFACT\"", None);
                Ok(())
            },
            "CompileFailed",
            &["left a symbolic link at $KILN_ARTIFACT", "not a file"],
        ),
        fails(
            "exec",
            "writes a directory where the model should be",
            |c, _, _| {
                exec(
                    c,
                    "mkdir \"$KILN_ARTIFACT\" && cp \"$KILN_MODEL\" \"$KILN_ARTIFACT/\"",
                    None,
                );
                Ok(())
            },
            "CompileFailed",
            &["left a directory at $KILN_ARTIFACT"],
        ),
        fails(
            "exec",
            "leaves a FIFO where the model should be",
            |c, _, _| {
                exec(c, "mkfifo \"$KILN_ARTIFACT\"", None);
                Ok(())
            },
            "CompileFailed",
            &["left something other than a file at $KILN_ARTIFACT"],
        ),
        fails(
            "exec",
            "3 MB of non-UTF-8 output without a newline, then exit 1",
            |c, _, _| {
                exec(
                    c,
                    "head -c 3000000 /dev/zero | tr '\\0' '\\377'; printf '\\377\\376 last words\\n'; exit 1",
                    Some(30),
                );
                Ok(())
            },
            "CompileFailed",
            &["exited with status 1", "\u{fffd}\u{fffd} last words"],
        ),
        fails(
            "exec",
            "ignores SIGTERM and spins past its deadline",
            |c, _, _| {
                exec(
                    c,
                    "trap '' TERM INT HUP; echo spinning; while :; do :; done",
                    Some(1),
                );
                Ok(())
            },
            "Timeout",
            &["compile.activeDeadlineSeconds (1s)", "spinning"],
        ),
        fails(
            "exec",
            "fails, leaving a setsid child holding its output",
            |c, _, p| {
                exec(
                    c,
                    "setsid sh -c 'sleep 47.25' & echo forked; exit 2",
                    Some(30),
                );
                p.gone = Some("sleep 47.25");
                Ok(())
            },
            "CompileFailed",
            &["exited with status 2", "forked"],
        ),
        fails(
            "exec",
            "renames the graph input",
            |c, _, _| {
                let mut m = model(vec![node("Relu", &["q"], &["y"])]);
                m.input = "q";
                std::fs::write(c.path("renamed.onnx"), m.bytes()).map_err(|e| e.to_string())?;
                let script = format!(
                    "cp '{}' \"$KILN_ARTIFACT\"",
                    c.path("renamed.onnx").display()
                );
                exec(c, &script, None);
                Ok(())
            },
            "InvalidSpec",
            &["the model's inputs are [\"q\"]"],
        ),
        fails(
            "exec",
            "emits an operator tract lacks",
            |c, _, _| {
                let m = model(vec![node("Exfiltrate", &["x"], &["y"]).str(7, "com.evil")]).bytes();
                std::fs::write(c.path("custom.onnx"), m).map_err(|e| e.to_string())?;
                let script = format!(
                    "cp '{}' \"$KILN_ARTIFACT\"",
                    c.path("custom.onnx").display()
                );
                exec(c, &script, None);
                Ok(())
            },
            "UnsupportedOperator",
            &["Exfiltrate"],
        ),
    ]
}

#[test]
fn every_hostile_input_is_classified_and_leaves_nothing_behind() {
    let ctx = Ctx::new();
    let table = table();
    assert!(
        table.len() >= 100,
        "the corpus shrank to {} rows",
        table.len()
    );
    let names: BTreeSet<_> = table.iter().map(|h| (h.category, h.name)).collect();
    assert_eq!(names.len(), table.len(), "two rows share a name");
    let started = Instant::now();
    let mut wrong = Vec::new();
    let mut skipped = Vec::new();
    let mut per_category = std::collections::BTreeMap::<&str, usize>::new();
    for row in &table {
        *per_category.entry(row.category).or_default() += 1;
        let t = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_row(row, &ctx)))
            .unwrap_or_else(|_| Err("panicked (see above)".into()));
        let label = format!("[{}] {}", row.category, row.name);
        match result {
            Ok((problems, outcome)) => {
                let shown: String = outcome.chars().take(300).collect();
                eprintln!(
                    "{label}: {} ({:.1} s) {shown}",
                    if problems.is_empty() { "ok" } else { "WRONG" },
                    t.elapsed().as_secs_f64()
                );
                wrong.extend(problems.into_iter().map(|p| format!("{label}: {p}")));
            }
            Err(e) if e == SKIP => skipped.push(label),
            Err(e) => wrong.push(format!("{label}: setup or run failed: {e}")),
        }
    }
    eprintln!(
        "{} rows {per_category:?} in {:.1} s; skipped {skipped:?}",
        table.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        wrong.is_empty(),
        "{} mismatches:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The ONNX writer above makes models tract runs: a hostile row fails for what it changed, not
/// for a broken encoding.
#[test]
fn the_onnx_writer_makes_models_that_are_ready() {
    let mut case = Case::mlp(4);
    set_model(
        &mut case,
        &model(vec![node("Relu", &["x"], &["y"])]).bytes(),
    )
    .expect("model");
    case.fixture_from(&case.path("model.onnx"), 4);
    let run = agent(&case, &[]).expect("run");
    assert!(run.success, "{}: {}", run.message(), run.stderr);
    // And the external-data tensor it writes loads when its file is declared beside it.
    let mut case = Case::mlp(4);
    let weights: Vec<u8> = (0..256)
        .flat_map(|i| (i as f32 / 256.0).to_le_bytes())
        .collect();
    std::fs::write(case.path("w.bin"), &weights).expect("weights");
    set_model(
        &mut case,
        &matmul_with(onnx::external("w", &[16, 16], "w.bin", "1024")),
    )
    .expect("model");
    case.fixture_from(&case.path("model.onnx"), 4);
    case.model_extra = format!(
        "\n  assets:\n    - {{name: w.bin, kind: other, uri: \"file://w.bin\", sha256: \"{}\"}}",
        sha256_bytes(&weights)
    );
    let run = agent(&case, &[]).expect("run");
    assert!(run.success, "{}: {}", run.message(), run.stderr);
}
