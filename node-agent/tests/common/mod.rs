//! The harness `kiln-agent local` tests share: a temp dir with a model, a fixture and the YAML
//! of one run ([`Case`]), the run and its JSON outcome ([`Run`]), and HTTPS servers to fetch
//! from ([`HttpsServer`]). Each test crate uses part of it.
#![allow(dead_code)]

pub mod llm;
pub mod servers;
pub mod signing;

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_engines::backend::tract::Tract;
use kiln_engines::golden as make_fixtures;
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_engines::pipeline::isolate::task::Reference;
use kiln_store::staged::{sha256_bytes, sha256_file};
use serde_json::Value;

pub const AGENT: &str = env!("CARGO_BIN_EXE_kiln-agent");

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A temp dir with a model, a fixture and the YAML of one local run.
pub struct Case {
    pub dir: tempfile::TempDir,
    pub model_sha: String,
    pub model_size: u64,
    pub fixture_sha: String,
    /// Symbol value of the profile.
    pub batch: i64,
    /// Extra YAML under `spec.warmup` of the target.
    pub warmup_extra: String,
    /// `spec.backend.kind` of the target.
    pub backend_kind: &'static str,
    pub backend_extra: String,
    pub min: i64,
    pub max: i64,
    /// URI of the model source.
    pub source_uri: String,
    /// URI of the fixture (its size is not declared).
    pub fixture_uri: String,
    /// `spec.inputs[0]` of the ModelArtifact: name, dtype, and its dims after the batch dim.
    pub input: (&'static str, &'static str, &'static str),
    /// Extra YAML under `spec` of the ModelArtifact (e.g. `outputs`).
    pub model_extra: String,
    /// Extra YAML inside `spec.source` (e.g. `, signature: "…"`).
    pub source_extra: String,
    /// `spec.format` of the ModelArtifact.
    pub format: &'static str,
    /// Dims the target's profile binds besides `batch` (e.g. `, height: 64`).
    pub profile_extra: String,
}

impl Case {
    /// The MLP test model with a fixture made for `fixture_batch` rows.
    pub fn mlp(fixture_batch: usize) -> Self {
        Self::model("mlp.onnx", fixture_batch)
    }

    /// A test model taking `x: f32[batch, 16]`, with a fixture of all its outputs made for
    /// `fixture_batch` rows.
    pub fn model(file: &str, fixture_batch: usize) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::copy(data(file), dir.path().join("model.onnx")).expect("copy model");
        let (model_sha, model_size) = sha256_file(&dir.path().join("model.onnx")).expect("hash");
        let mut case = Case {
            dir,
            model_sha,
            model_size,
            fixture_sha: String::new(),
            batch: 4,
            warmup_extra: String::new(),
            backend_kind: "tract",
            backend_extra: String::new(),
            min: 1,
            max: 8,
            source_uri: "file://model.onnx".into(),
            fixture_uri: "file://fixture.safetensors".into(),
            input: ("x", "f32", "{size: 16}"),
            model_extra: String::new(),
            source_extra: String::new(),
            format: "onnx",
            profile_extra: String::new(),
        };
        case.fixture_from(&case.path("model.onnx"), fixture_batch);
        case
    }

    /// Writes the v1 fixture of `model` (input `x: f32[batch, 16]`, seed 7, golden outputs from
    /// the reference execution) as this case's fixture.
    pub fn fixture_from(&mut self, model: &Path, batch: usize) {
        self.fixture_shaped(model, "x", vec![batch, 16]);
    }

    /// Writes the v1 fixture of `model`'s one input `name` of `shape` (seed 7, golden outputs
    /// from the reference execution) as this case's fixture.
    pub fn fixture_shaped(&mut self, model: &Path, name: &str, shape: Vec<usize>) {
        let fixture = make_fixtures::make(
            &Tract,
            &Reference {
                model: model.to_path_buf(),
                version: "v1".into(),
                shapes: [(name.to_string(), shape)].into(),
                given: Vec::new(),
                samples: 1,
                seed: 7,
                tolerance: None,
                runtime: kiln_crds::compiled_target::BackendKind::Tract,
                out: PathBuf::new(),
                text: None,
            },
        )
        .expect("fixture");
        self.write_fixture(&fixture);
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn store(&self) -> PathBuf {
        self.path("store")
    }

    pub fn write_fixture(&mut self, fixture: &FixtureFile) {
        let bytes = fixture.to_bytes().expect("fixture bytes");
        std::fs::write(self.path("fixture.safetensors"), &bytes).expect("write fixture");
        self.fixture_sha = sha256_bytes(&bytes);
    }

    pub fn fixture(&self) -> FixtureFile {
        FixtureFile::read(&self.path("fixture.safetensors")).expect("read fixture")
    }

    pub fn yaml(&self) -> String {
        format!(
            r#"apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {{name: mlp}}
spec:
  source: {{uri: "{}", sha256: "{}", size: {}{}}}
  format: {}
  inputs:
    - name: {}
      dtype: {}
      dims: [{{symbol: batch, min: {}, max: {}}}, {}]{}
  fixtures:
    - {{version: v1, uri: "{}", sha256: "{}"}}
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {{name: mlp-cpu}}
spec:
  modelRef: {{name: mlp}}
  backend: {{kind: {}{}}}
  profiles: [{{name: p, dims: {{batch: {}{}}}}}]
  warmup:
    iterations: 5
    fixtureVersion: v1
    defaultTolerance: {{atol: 1.0e-5, rtol: 1.0e-4}}{}
"#,
            self.source_uri,
            self.model_sha,
            self.model_size,
            self.source_extra,
            self.format,
            self.input.0,
            self.input.1,
            self.min,
            self.max,
            self.input.2,
            self.model_extra,
            self.fixture_uri,
            self.fixture_sha,
            self.backend_kind,
            self.backend_extra,
            self.batch,
            self.profile_extra,
            self.warmup_extra
        )
    }

    /// Runs `local` and returns the JSON outcome, the exit status and stderr.
    pub fn run(&self) -> Run {
        self.run_with_env(&[])
    }

    pub fn run_with_env(&self, env: &[(&str, &Path)]) -> Run {
        std::fs::write(self.path("kiln.yaml"), self.yaml()).expect("write yaml");
        run_local_env(
            &self.path("kiln.yaml"),
            &self.store(),
            &self.path("metrics.prom"),
            env,
        )
    }

    pub fn metrics(&self) -> String {
        std::fs::read_to_string(self.path("metrics.prom")).expect("metrics file")
    }

    /// Everything in the store's artifact directory.
    pub fn stored(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.store().join("artifacts"))
            .map(|d| d.map(|e| e.expect("entry").path()).collect())
            .unwrap_or_default()
    }
}

pub struct Run {
    pub outcome: Value,
    pub success: bool,
    pub stderr: String,
}

impl Run {
    pub fn reason(&self) -> &str {
        self.outcome["reason"].as_str().unwrap_or("")
    }

    pub fn message(&self) -> &str {
        self.outcome["message"].as_str().unwrap_or("")
    }

    /// Asserts a failed, classified run whose message contains every `needle`.
    pub fn fails_with(&self, reason: &str, needles: &[&str]) {
        assert!(
            !self.success,
            "exit status must be non-zero; stderr:\n{}",
            self.stderr
        );
        assert_eq!(self.outcome["ready"], false);
        assert_eq!(self.reason(), reason, "message: {}", self.message());
        for needle in needles {
            assert!(
                self.message().contains(needle),
                "message {:?} lacks {needle:?}",
                self.message()
            );
        }
    }
}

/// A GGUF language model (`model.gguf`) and its fixture (`fixture.safetensors`, version v1) as
/// a ModelArtifact `lm` and a CompiledTarget `lm-cpu` for `kiln-agent local`.
pub struct GgufSpec<'a> {
    /// The model's sha256 and size.
    pub sha: &'a str,
    pub size: u64,
    /// The fixture's sha256.
    pub fixture_sha: &'a str,
    /// `spec.backend` of the target.
    pub backend: &'a str,
    /// The prompt length the profile binds (the fixture's), and the most the model declares.
    pub len: usize,
    pub max_len: usize,
    /// `spec.warmup.outputs`.
    pub outputs: &'a str,
    /// Extra YAML under `spec.warmup`.
    pub warmup_extra: &'a str,
}

impl GgufSpec<'_> {
    /// The two documents.
    pub fn yaml(&self) -> String {
        format!(
            r#"apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {{name: lm}}
spec:
  source: {{uri: "file://model.gguf", sha256: "{}", size: {}}}
  format: gguf
  inputs:
    - {{name: prompt, dtype: i32, dims: [{{symbol: len, min: 1, max: {}}}]}}
    - {{name: generate, dtype: i32, dims: [{{size: 1}}]}}
  fixtures:
    - {{version: v1, uri: "file://fixture.safetensors", sha256: "{}"}}
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {{name: lm-cpu}}
spec:
  modelRef: {{name: lm}}
  backend: {}
  profiles: [{{name: p{}, dims: {{len: {}}}}}]
  warmup:
    iterations: 3
    fixtureVersion: v1
    outputs: {}{}
"#,
            self.sha,
            self.size,
            self.max_len,
            self.fixture_sha,
            self.backend,
            self.len,
            self.len,
            self.outputs,
            self.warmup_extra
        )
    }
}

pub fn run_local(yaml: &Path, store: &Path, metrics: &Path) -> Run {
    run_local_env(yaml, store, metrics, &[])
}

pub fn run_local_env(yaml: &Path, store: &Path, metrics: &Path, env: &[(&str, &Path)]) -> Run {
    let out = Command::new(AGENT)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .args(["local", "--output", "json", "--store"])
        .arg(store)
        .arg("--metrics-file")
        .arg(metrics)
        .arg(yaml)
        .output()
        .expect("run kiln-agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let outcome = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {stdout}"));
    Run {
        outcome,
        success: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// Golden outputs for `inputs` through `model` as ONNX Runtime (the library at `library`) runs
/// it as written: `kiln-agent fixtures --reference onnxruntime`, version v1, into `out`.
/// Returns the fixture's sha256.
#[allow(dead_code)] // not every test binary makes ONNX Runtime fixtures
pub fn ort_fixture(library: &Path, model: &Path, inputs: &Path, out: &Path) -> String {
    let run = Command::new(AGENT)
        .env("ORT_DYLIB_PATH", library)
        .args([
            "fixtures",
            "--reference",
            "onnxruntime",
            "--fixture-version",
            "v1",
        ])
        .arg("--model")
        .arg(model)
        .arg("--inputs")
        .arg(inputs)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run kiln-agent fixtures");
    assert!(
        run.status.success(),
        "fixtures --reference onnxruntime for {}: {}",
        model.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    sha256_bytes(&std::fs::read(out).expect("fixture"))
}

pub fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A real HTTPS server (`openssl s_server -WWW`) serving `dir` with a certificate from a CA made
/// for the test; the agent trusts that CA through `SSL_CERT_FILE`.
pub struct HttpsServer {
    pub child: std::process::Child,
    pub port: u16,
    pub ca: PathBuf,
}

impl HttpsServer {
    /// `openssl s_server -WWW`: serves the files in `dir`.
    pub fn start(dir: &Path) -> Option<Self> {
        Self::spawn(dir, |port| {
            let mut c = Command::new("openssl");
            c.args([
                "s_server", "-quiet", "-WWW", "-cert", "leaf.pem", "-key", "leaf.key", "-accept",
            ])
            .arg(format!("127.0.0.1:{port}"));
            c
        })
    }

    /// `tests/data/hostile_https.py`: the files in `dir`, plus redirects to plain HTTP, redirect
    /// loops, stalls and endless bodies (its docstring lists the paths).
    pub fn hostile(dir: &Path) -> Option<Self> {
        Self::spawn(dir, |port| {
            let mut c = Command::new("python3");
            c.arg(data("hostile_https.py"))
                .args(["leaf.pem", "leaf.key", &port.to_string(), "."]);
            c
        })
    }

    /// Makes the CA and the leaf certificate in `dir`, then runs `server(port)` there.
    pub fn spawn(dir: &Path, server: impl Fn(u16) -> Command) -> Option<Self> {
        let openssl = |args: &[&str]| {
            Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        let made = openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=kiln test CA",
        ]) && openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=localhost",
        ]) && std::fs::write(
            dir.join("leaf.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .is_ok()
            && openssl(&[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "leaf.pem",
                "-days",
                "1",
                "-extfile",
                "leaf.ext",
            ]);
        if !made {
            return None;
        }
        let port = servers::free_port();
        let child = server(port)
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let mut server = Self {
            child,
            port,
            ca: dir.join("ca.pem"),
        };
        // Wall time, not a count of polls: python's start takes seconds on a loaded machine.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = server.child.try_wait() {
                return None;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(server);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Case {
    /// The MLP with `backend.kind: exec` running `sh -c SCRIPT` as the compiler.
    pub fn exec(script: &str) -> Self {
        let mut case = Case::mlp(4);
        case.backend_kind = "exec";
        case.backend_extra = format!(
            ", image: \"registry.example/compiler@sha256:{}\", command: [sh, -c, {}]",
            "c".repeat(64),
            serde_json::to_string(script).expect("quote")
        );
        case
    }

    /// The stored build manifest of a successful run.
    pub fn manifest(&self, run: &Run) -> Value {
        let key = run.outcome["compileKey"].as_str().expect("key");
        let path = self
            .store()
            .join("artifacts")
            .join(key)
            .join("manifest.json");
        serde_json::from_slice(&std::fs::read(&path).expect("manifest")).expect("manifest json")
    }
}

/// Signs the entry of `key` in the local store at `store` again with the store's own key
/// (`signing.key`, which `local` creates when given no key), after a test edited it: as someone
/// holding that key would, so the test reaches the checks behind the signature. Nothing when the
/// store has no key of its own, or when the manifest no longer parses.
pub fn resign(store: &Path, key: &str) -> Result<(), String> {
    use kiln_store::attest::{Signer, Statement};
    let signing = store.join("signing.key");
    if !signing.exists() {
        return Ok(());
    }
    let dir = store.join("artifacts").join(key);
    let bytes = std::fs::read(dir.join("manifest.json")).map_err(|e| e.to_string())?;
    let Ok(manifest) = serde_json::from_slice::<kiln_crds::BuildManifest>(&bytes) else {
        return Ok(());
    };
    let hex = kiln_store::staged::sha256_bytes(&bytes);
    let entry = kiln_store::Entry {
        manifest,
        manifest_digest: format!("sha256:{hex}"),
    };
    let signer = Signer::from_pem_file(&signing).map_err(|e| e.to_string())?;
    let envelope = signer
        .sign(&Statement::for_entry(&entry, None))
        .map_err(|e| e.to_string())?;
    std::fs::write(dir.join(format!("attestation-{hex}.json")), envelope).map_err(|e| e.to_string())
}

/// Writes, beside a model at `dir/model.onnx` with input `x` and output `y` (f32 [batch, 16];
/// the 212-byte `huge.onnx` and its variants), a well-formed fixture for that interface (its
/// numbers do not matter: the engine must fail before they are used) and `dir/kiln.yaml`: the
/// ModelArtifact `huge` and the CompiledTarget `target` on backend `backend`, warmup `warmup`
/// (the YAML flow mapping of `spec.warmup`).
pub fn write_huge_spec(
    dir: &Path,
    (sha, size): (&str, u64),
    target: &str,
    backend: &str,
    warmup: &str,
) {
    use kiln_engines::pipeline::fixtures::Seeded;
    use safetensors::Dtype;
    let mut seeded = Seeded::new(1);
    let fixture = FixtureFile {
        version: "v1".into(),
        model_sha256: None,
        tolerance: None,
        inputs: [("x".into(), seeded.tensor(Dtype::F32, &[4, 16]).expect("x"))].into(),
        outputs: [("y".into(), seeded.tensor(Dtype::F32, &[4, 16]).expect("y"))].into(),
        more: Vec::new(),
        text: Default::default(),
    };
    let bytes = fixture.to_bytes().expect("fixture");
    std::fs::write(dir.join("fixture.safetensors"), &bytes).expect("write");
    let yaml = format!(
        r#"apiVersion: kiln.dev/v1alpha1
kind: ModelArtifact
metadata: {{name: huge}}
spec:
  source: {{uri: "file://model.onnx", sha256: "{sha}", size: {size}}}
  format: onnx
  inputs:
    - {{name: x, dtype: f32, dims: [{{symbol: batch, min: 1, max: 8}}, {{size: 16}}]}}
  fixtures:
    - {{version: v1, uri: "file://fixture.safetensors", sha256: "{}"}}
---
apiVersion: kiln.dev/v1alpha1
kind: CompiledTarget
metadata: {{name: {target}}}
spec:
  modelRef: {{name: huge}}
  backend: {{kind: {backend}}}
  profiles: [{{name: p, dims: {{batch: 4}}}}]
  warmup: {warmup}
"#,
        sha256_bytes(&bytes)
    );
    std::fs::write(dir.join("kiln.yaml"), yaml).expect("yaml");
}
