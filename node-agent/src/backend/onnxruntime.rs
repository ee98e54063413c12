//! The ONNX Runtime backend, through the `ort` crate with `load-dynamic`: the shared library is
//! opened at run time from `--onnxruntime-lib` / `ORT_DYLIB_PATH` (the PyPI `onnxruntime`
//! 1.31.1 wheel's `libonnxruntime.so.1.31.1`, fetched by `scripts/ensure-onnxruntime.sh`), so
//! nothing ONNX Runtime is needed to build kiln-agent, and an agent without it still runs tract.
//!
//! Compile = ONNX Runtime's graph optimisation for the requested execution provider at the
//! target's `optimizationLevel`, saved (`optimized_model_filepath`) as the artifact together with
//! the session configuration that produced it (`kiln-onnxruntime.json`). Load opens that graph
//! with the same provider and fallback policy and no further optimisation. The first run of every
//! engine is profiled: ONNX Runtime's profile names the provider of every node it ran, which is
//! the partition evidence ([`Placement`]). Reads the model and the artifact, writes (fsynced) only
//! the artifact path it is given and a private profile directory beside the artifact.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use kiln_crds::compiled_target::{
    CpuFallback, CpuFallbackPolicy, ExecutionProvider, OptimizationLevel, Precision,
};
use kiln_crds::placement::{PlacedNode, Placement};
use ort::session::Session;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::value::{DynValue, Tensor, TensorElementType, ValueType};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};

use super::archive::{append, entries};
use super::{Backend, CompileRequest, Compiled, Engine, GraphInterface, InputInfo, Shapes};
use crate::error::{Error, Result};
use crate::pipeline::tensor::{HostTensor, le_vec};

/// The ONNX Runtime release line the binding is built for (`ort` 2.0.0-rc.15, API 31).
pub const RELEASE_LINE: &str = "1.31";
const MEDIA_TYPE: &str = "application/vnd.kiln.onnxruntime.optimized.v1.tar";
const CONFIG: &str = "kiln-onnxruntime.json";
const MODEL: &str = "model.onnx";
/// A profile bigger than this is not read (a run of a million nodes, or a hostile graph).
const MAX_PROFILE_BYTES: u64 = 256 << 20;
const INSTALL: &str = "fetch the library with scripts/ensure-onnxruntime.sh (the PyPI onnxruntime \
    1.31.1 wheel's onnxruntime/capi/libonnxruntime.so.1.31.1) and pass --onnxruntime-lib or set \
    ORT_DYLIB_PATH";

/// The library this process loaded: ONNX Runtime is one per process.
pub struct Runtime {
    env: ort::environment::Environment,
    /// Release, as the library reports it (`1.31.1`).
    pub version: String,
    /// sha256 of the library file.
    pub sha256: String,
    /// Where it was loaded from.
    pub path: PathBuf,
}

static CONFIGURED: OnceLock<PathBuf> = OnceLock::new();
static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// Sets where the library is (`--onnxruntime-lib`), before first use; later calls are ignored.
pub fn configure(path: Option<PathBuf>) {
    if let Some(path) = path {
        let _ = CONFIGURED.set(path);
    }
}

/// The configured library path: `--onnxruntime-lib`, else `ORT_DYLIB_PATH`.
pub fn library_path() -> Option<PathBuf> {
    CONFIGURED.get().cloned().or_else(|| {
        std::env::var_os("ORT_DYLIB_PATH")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// The loaded runtime, loading it on first use; a missing, unloadable or wrong-version library
/// is `IncompatibleRuntime` saying what to install.
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME
        .get_or_init(load_library)
        .as_ref()
        .map_err(|m| Error::IncompatibleRuntime(m.clone()))
}

fn load_library() -> std::result::Result<Runtime, String> {
    let Some(path) = library_path() else {
        return Err(format!(
            "backend onnxruntime needs the ONNX Runtime {RELEASE_LINE} shared library and none is configured; {INSTALL}"
        ));
    };
    let shown = path.display();
    let meta = std::fs::metadata(&path)
        .map_err(|e| format!("ONNX Runtime library {shown}: {e}; {INSTALL}"))?;
    if !meta.is_file() {
        return Err(format!(
            "ONNX Runtime library {shown} is not a regular file; {INSTALL}"
        ));
    }
    let (sha256, _) = kiln_store::staged::sha256_file(&path)
        .map_err(|e| format!("ONNX Runtime library {shown}: {e}"))?;
    // `ort` reports the version it found only through its log; listen for it while loading.
    let heard = Arc::new(Mutex::new(Vec::new()));
    let listener = {
        use tracing_subscriber::layer::SubscriberExt;
        tracing_subscriber::registry().with(Heard(heard.clone()))
    };
    let built = tracing::subscriber::with_default(listener, || {
        ort::init_from(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                b.with_name("kiln")
                    .with_telemetry(false)
                    .build()
                    .map_err(|e| e.to_string())
            })
    });
    let env =
        built.map_err(|e| format!("cannot load ONNX Runtime from {shown}: {e}; {INSTALL}"))?;
    // ONNX Runtime's own log goes through `ort` into ours; its informational lines (arena
    // growth, unused initialisers) would drown the agent's.
    env.set_log_level(ort::logging::LogLevel::Warning);
    let version = heard
        .lock()
        .map_err(|_| "poisoned".to_string())?
        .iter()
        .find_map(|m| reported_version(m))
        .ok_or_else(|| format!("{shown} loaded but did not report its version; {INSTALL}"))?;
    if version.rsplit_once('.').map(|(line, _)| line) != Some(RELEASE_LINE) {
        return Err(format!(
            "{shown} is ONNX Runtime {version}; kiln-agent is built for {RELEASE_LINE}.x; {INSTALL}"
        ));
    }
    tracing::info!(path = %shown, version, sha256, "ONNX Runtime loaded");
    Ok(Runtime {
        env,
        version,
        sha256,
        path,
    })
}

/// The version in `ort`'s "Loaded ONNX Runtime dylib from …; version '1.31.1'".
fn reported_version(message: &str) -> Option<String> {
    let rest = message.strip_prefix("Loaded ONNX Runtime dylib from ")?;
    let (_, tail) = rest.rsplit_once("; version '")?;
    let version = tail.strip_suffix('\'')?;
    version
        .chars()
        .all(|c| c.is_ascii_digit() || c == '.')
        .then(|| version.to_string())
}

/// A tracing layer keeping event messages.
struct Heard(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Heard {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        if let Ok(mut heard) = self.0.lock() {
            heard.push(message);
        }
    }
}

/// The ONNX Runtime backend as a target configures it.
pub struct OnnxRuntime {
    rt: &'static Runtime,
    level: OptimizationLevel,
    fallback: CpuFallback,
}

impl OnnxRuntime {
    /// The backend for `spec`, loading the library if this is the first use.
    pub fn for_spec(spec: &kiln_crds::compiled_target::Backend) -> Result<Self> {
        Ok(Self {
            rt: runtime()?,
            level: spec.optimization_level.unwrap_or_default(),
            fallback: spec.cpu_fallback.clone().unwrap_or_default(),
        })
    }

    /// A session builder for this provider and fallback policy at `level`, saving the optimised
    /// graph to `save` and profiling into `profile` when given.
    fn builder(
        &self,
        provider: ExecutionProvider,
        level: GraphOptimizationLevel,
        save: Option<&Path>,
        profile: Option<&Path>,
    ) -> ort::Result<SessionBuilder> {
        let mut b = Session::builder(&self.rt.env)?.with_optimization_level(level)?;
        match provider {
            ExecutionProvider::Cpu => {}
            ExecutionProvider::Cuda => {
                b = b.with_execution_providers([ort::ep::CUDA::default()
                    .build()
                    .error_on_failure()])?;
            }
            ExecutionProvider::Tensorrt => {
                b = b.with_execution_providers([ort::ep::TensorRT::default()
                    .build()
                    .error_on_failure()])?;
            }
        }
        if provider != ExecutionProvider::Cpu
            && self.fallback.policy == CpuFallbackPolicy::Forbidden
        {
            b = b.with_disable_cpu_fallback()?;
        }
        if let Some(save) = save {
            b = b.with_optimized_model_path(save)?;
        }
        if let Some(profile) = profile {
            b = b.with_profiling(profile)?;
        }
        Ok(b)
    }

    /// A session over the file as written, on the CPU, for reading its interface.
    fn inspect(&self, model: &Path) -> Result<Session> {
        self.builder(
            ExecutionProvider::Cpu,
            GraphOptimizationLevel::Disable,
            None,
            None,
        )
        .map_err(|e| Error::CompileFailed(e.to_string()))
        .and_then(|mut b| {
            b.commit_from_file(model)
                .map_err(|e| classify(e, "reading the model", Error::CompileFailed))
        })
    }
}

/// An ONNX Runtime error as a failure reason: a missing kernel or a provider that cannot take
/// the graph is `UnsupportedOperator`, a provider that cannot start `IncompatibleRuntime`,
/// anything else `other`.
fn classify(e: ort::Error, what: &str, other: fn(String) -> Error) -> Error {
    let message = e.to_string();
    let lower = message.to_ascii_lowercase();
    if lower.contains("could not find an implementation")
        || lower.contains("not implemented")
        || lower.contains("fallback to cpu ep has been explicitly disabled")
    {
        return Error::UnsupportedOperator {
            backend: "onnxruntime".into(),
            operators: vec![message],
        };
    }
    let provider_missing = lower.contains("execution provider")
        && ["not enabled", "not available", "not built", "not supported"]
            .iter()
            .any(|m| lower.contains(m));
    if provider_missing || lower.contains("failed to load library") {
        return Error::IncompatibleRuntime(format!(
            "{what}: {message}; this ONNX Runtime library does not carry the requested execution provider (the GPU providers need the onnxruntime-gpu build and its CUDA libraries)"
        ));
    }
    other(format!("{what}: {message}"))
}

/// The configuration an artifact was made with, stored in it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct ArtifactConfig {
    runtime_version: String,
    runtime_sha256: String,
    execution_provider: ExecutionProvider,
    optimization_level: OptimizationLevel,
    cpu_fallback: CpuFallback,
    profiles: Vec<ProfileEntry>,
    outputs: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct ProfileEntry {
    name: String,
    inputs: Vec<(String, Vec<usize>)>,
}

fn ort_level(level: OptimizationLevel) -> GraphOptimizationLevel {
    match level {
        OptimizationLevel::Disabled => GraphOptimizationLevel::Disable,
        OptimizationLevel::Basic => GraphOptimizationLevel::Level1,
        OptimizationLevel::Extended => GraphOptimizationLevel::Level2,
        OptimizationLevel::Layout => GraphOptimizationLevel::Level3,
        OptimizationLevel::All => GraphOptimizationLevel::All,
    }
}

/// The name ONNX Runtime gives a provider.
pub fn provider_name(provider: ExecutionProvider) -> &'static str {
    match provider {
        ExecutionProvider::Cpu => "CPUExecutionProvider",
        ExecutionProvider::Cuda => "CUDAExecutionProvider",
        ExecutionProvider::Tensorrt => "TensorrtExecutionProvider",
    }
}

impl Backend for OnnxRuntime {
    fn name(&self) -> &'static str {
        "onnxruntime"
    }

    fn version(&self) -> String {
        self.rt.version.clone()
    }

    fn identity(&self) -> String {
        format!("{}@sha256:{}", self.rt.version, self.rt.sha256)
    }

    fn runtime_digest(&self) -> Option<String> {
        Some(self.rt.sha256.clone())
    }

    fn media_type(&self) -> &'static str {
        MEDIA_TYPE
    }

    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled> {
        if req.precision != Precision::Fp32 {
            return Err(Error::InvalidSpec(format!(
                "the onnxruntime backend compiles precision fp32 only, not {}; set precision: fp32",
                req.precision.as_str()
            )));
        }
        if let Some(flag) = req.flags.keys().next() {
            return Err(Error::InvalidSpec(format!(
                "the onnxruntime backend takes typed settings, not flags; remove backend.flags.{flag} (see backend.executionProvider, optimizationLevel, cpuFallback)"
            )));
        }
        let mut log = Vec::new();
        let scratch = req.out.parent().unwrap_or(Path::new("."));
        let work = tempfile::Builder::new()
            .prefix(".ort-compile-")
            .tempdir_in(scratch)
            .map_err(|e| Error::store(scratch, e))?;
        let optimized = work.path().join(MODEL);
        let session = self
            .builder(req.provider, ort_level(self.level), Some(&optimized), None)
            .map_err(|e| classify(e, "configuring the session", Error::CompileFailed))
            .and_then(|mut b| {
                b.commit_from_file(req.model)
                    .map_err(|e| classify(e, "optimising the graph", Error::CompileFailed))
            })?;
        let mut profiles = Vec::new();
        for (profile, shapes) in req.profiles {
            profiles.push(ProfileEntry {
                name: profile.clone(),
                inputs: bind_profile(profile, shapes, session.inputs())?,
            });
        }
        let outputs: Vec<String> = session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        drop(session);
        let graph = std::fs::read(&optimized).map_err(|e| {
            Error::CompileFailed(format!(
                "ONNX Runtime wrote no optimised graph at {}: {e}",
                optimized.display()
            ))
        })?;
        let source_size = std::fs::metadata(req.model).map(|m| m.len()).unwrap_or(0);
        log.push(format!(
            "optimised for {} at level {} by ONNX Runtime {}: {source_size} bytes → {} bytes",
            provider_name(req.provider),
            self.level.as_str(),
            self.rt.version,
            graph.len()
        ));
        let machine_bound = self.level.machine_specific().then(|| {
            format!(
                "ONNX Runtime optimisation level {} lays tensors out for the build machine's instruction set",
                self.level.as_str()
            )
        });
        if let Some(why) = &machine_bound {
            log.push(format!("{why}: the artifact is bound to it"));
        }
        let config = ArtifactConfig {
            runtime_version: self.rt.version.clone(),
            runtime_sha256: self.rt.sha256.clone(),
            execution_provider: req.provider,
            optimization_level: self.level,
            cpu_fallback: self.fallback.clone(),
            profiles,
            outputs,
        };
        let config_json =
            serde_json::to_vec_pretty(&config).map_err(|e| Error::CompileFailed(e.to_string()))?;
        let mut tar = tar::Builder::new(Vec::new());
        append(&mut tar, CONFIG, &config_json)?;
        append(&mut tar, MODEL, &graph)?;
        let bytes = tar
            .into_inner()
            .map_err(|e| Error::CompileFailed(e.to_string()))?;
        kiln_store::staged::write_synced(req.out, &bytes).map_err(|e| Error::store(req.out, e))?;
        Ok(Compiled {
            outputs: config.outputs,
            log,
            machine_bound,
        })
    }

    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>> {
        let load_failed = |m: String| Error::LoadFailed(format!("{}: {m}", artifact.display()));
        let (config, graph) = read_artifact(artifact).map_err(load_failed)?;
        if config.runtime_sha256 != self.rt.sha256 || config.runtime_version != self.rt.version {
            return Err(Error::IncompatibleRuntime(format!(
                "artifact optimised by ONNX Runtime {} (library sha256 {}), this agent loaded {} (sha256 {}) from {}",
                config.runtime_version,
                config.runtime_sha256,
                self.rt.version,
                self.rt.sha256,
                self.rt.path.display()
            )));
        }
        // The provider is the artifact's (the compile key binds it to the class); the fallback
        // policy must still be the target's.
        if config.cpu_fallback != self.fallback {
            return Err(Error::IncompatibleRuntime(format!(
                "artifact made with cpuFallback {}, the target asks for {}",
                config.cpu_fallback.describe(),
                self.fallback.describe()
            )));
        }
        let dir = artifact.parent().unwrap_or(Path::new("."));
        let profile_dir = tempfile::Builder::new()
            .prefix(".ort-profile-")
            .tempdir_in(dir)
            .map_err(|e| Error::store(dir, e))?;
        // The graph is already optimised: open it as saved.
        let profile = profile_dir.path().join("run");
        let open = |backend: &Self| {
            backend
                .builder(
                    config.execution_provider,
                    GraphOptimizationLevel::Disable,
                    None,
                    Some(&profile),
                )
                .map_err(|e| classify(e, "configuring the session", Error::LoadFailed))
                .and_then(|mut b| {
                    b.commit_from_memory(&graph)
                        .map_err(|e| classify(e, "loading the optimised graph", Error::LoadFailed))
                })
        };
        let (session, refused) = match open(self) {
            Ok(session) => (session, None),
            // The provider cannot take every node and cpuFallback is Forbidden. ONNX Runtime
            // does not say which nodes: open the graph once more with fallback allowed, only to
            // run the first fixture and name the nodes the CPU takes; that run then fails.
            Err(Error::UnsupportedOperator { operators, .. })
                if self.fallback.policy == CpuFallbackPolicy::Forbidden
                    && operators.iter().any(|m| m.contains("explicitly disabled")) =>
            {
                let diagnose = Self {
                    fallback: CpuFallback::default(),
                    ..*self
                };
                (open(&diagnose)?, Some(operators.join("; ")))
            }
            Err(e) => return Err(e),
        };
        let mut engine = OrtEngine::new(
            session,
            config.profiles,
            config.execution_provider,
            Some(profile_dir),
        );
        engine.refused = refused;
        Ok(Box::new(engine))
    }

    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>> {
        let session = self.inspect(model)?;
        let inputs = bind_profile("reference", shapes, session.inputs())?;
        Ok(Box::new(OrtEngine::new(
            session,
            vec![ProfileEntry {
                name: "reference".into(),
                inputs,
            }],
            ExecutionProvider::Cpu,
            None,
        )))
    }

    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>> {
        let session = self.inspect(model)?;
        session
            .inputs()
            .iter()
            .map(|o| {
                let (dtype, dims) =
                    tensor_type(o.dtype()).ok_or_else(|| unsupported_io("input", o))?;
                Ok(InputInfo {
                    name: o.name().to_string(),
                    dtype,
                    dims,
                })
            })
            .collect()
    }

    fn interface(&self, model: &Path) -> Result<GraphInterface> {
        let session = self.inspect(model)?;
        let mut graph = GraphInterface::default();
        let mut unsupported = Vec::new();
        for (what, outlets, into) in [
            ("input", session.inputs(), &mut graph.inputs),
            ("output", session.outputs(), &mut graph.outputs),
        ] {
            for o in outlets {
                match tensor_type(o.dtype()) {
                    Some((dtype, dims)) => into.push(super::TensorInfo {
                        name: o.name().to_string(),
                        dtype: Some(dtype),
                        dims: Some(dims),
                    }),
                    None => unsupported.push(format!("{what} {} of type {}", o.name(), o.dtype())),
                }
            }
        }
        if !unsupported.is_empty() {
            return Err(Error::UnsupportedOperator {
                backend: "onnxruntime".into(),
                operators: unsupported,
            });
        }
        Ok(graph)
    }
}

fn unsupported_io(what: &str, o: &ort::value::Outlet) -> Error {
    Error::UnsupportedOperator {
        backend: "onnxruntime".into(),
        operators: vec![format!("{what} {} of type {}", o.name(), o.dtype())],
    }
}

/// Checks a profile's shapes against the graph's inputs: the same names, the same rank, and
/// every fixed extent kept.
fn bind_profile(
    profile: &str,
    shapes: &Shapes,
    inputs: &[ort::value::Outlet],
) -> Result<Vec<(String, Vec<usize>)>> {
    let model_inputs: Vec<&str> = inputs.iter().map(|o| o.name()).collect();
    let mut sorted = model_inputs.clone();
    sorted.sort_unstable();
    let declared: Vec<&str> = shapes.keys().map(String::as_str).collect();
    if sorted != declared {
        return Err(Error::InvalidSpec(format!(
            "the model's inputs are {model_inputs:?} but the spec declares {declared:?}; make spec.inputs name exactly the graph inputs"
        )));
    }
    let mut bound = Vec::new();
    for o in inputs {
        let shape = &shapes[o.name()];
        if let Some((_, dims)) = tensor_type(o.dtype()) {
            let fits = dims.len() == shape.len()
                && dims
                    .iter()
                    .zip(shape)
                    .all(|(d, s)| d.is_none_or(|d| d == *s));
            if !fits {
                return Err(Error::CompileFailed(format!(
                    "profile {profile}: shape {shape:?} for input {} does not fit the graph's {}",
                    o.name(),
                    show_dims(&dims)
                )));
            }
        }
        bound.push((o.name().to_string(), shape.clone()));
    }
    Ok(bound)
}

fn show_dims(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.map_or("?".to_string(), |d| d.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// A tensor outlet's element type and dims (`None` for a symbolic dim); `None` for sequences,
/// maps, optionals and element types no fixture can hold.
fn tensor_type(t: &ValueType) -> Option<(Dtype, Vec<Option<usize>>)> {
    let ValueType::Tensor { ty, shape, .. } = t else {
        return None;
    };
    let dims = shape
        .iter()
        .map(|d| usize::try_from(*d).ok())
        .collect::<Vec<_>>();
    Some((dtype(*ty)?, dims))
}

fn dtype(ty: TensorElementType) -> Option<Dtype> {
    Some(match ty {
        TensorElementType::Float32 => Dtype::F32,
        TensorElementType::Float64 => Dtype::F64,
        TensorElementType::Float16 => Dtype::F16,
        TensorElementType::Int64 => Dtype::I64,
        TensorElementType::Int32 => Dtype::I32,
        TensorElementType::Int8 => Dtype::I8,
        TensorElementType::Uint8 => Dtype::U8,
        TensorElementType::Bool => Dtype::BOOL,
        _ => return None,
    })
}

/// The configuration and the graph of an artifact, read by name (never extracted).
fn read_artifact(artifact: &Path) -> std::result::Result<(ArtifactConfig, Vec<u8>), String> {
    let mut files = entries(artifact)?;
    if let Some(other) = files.keys().find(|k| *k != CONFIG && *k != MODEL) {
        return Err(format!(
            "unexpected entry {other:?}: not a kiln onnxruntime artifact"
        ));
    }
    let config = files
        .remove(CONFIG)
        .ok_or_else(|| format!("no {CONFIG}: not a kiln onnxruntime artifact"))?;
    let config: ArtifactConfig =
        serde_json::from_slice(&config).map_err(|e| format!("{CONFIG}: {e}"))?;
    let graph = files
        .remove(MODEL)
        .ok_or_else(|| format!("no {MODEL}: not a kiln onnxruntime artifact"))?;
    Ok((config, graph))
}

/// A session, its profiles, and what its first run measured.
struct OrtEngine {
    session: Mutex<Session>,
    profiles: Vec<ProfileEntry>,
    dtypes: BTreeMap<String, Dtype>,
    requested: ExecutionProvider,
    /// Where the first run's profile goes; taken (and removed) once it is read.
    profile_dir: Mutex<Option<tempfile::TempDir>>,
    placement: Mutex<Option<Placement>>,
    /// ONNX Runtime refused the graph under `cpuFallback: Forbidden`; this engine runs with
    /// fallback allowed only to name the nodes, then fails.
    refused: Option<String>,
}

impl OrtEngine {
    fn new(
        session: Session,
        profiles: Vec<ProfileEntry>,
        requested: ExecutionProvider,
        profile_dir: Option<tempfile::TempDir>,
    ) -> Self {
        let dtypes = session
            .inputs()
            .iter()
            .filter_map(|o| Some((o.name().to_string(), tensor_type(o.dtype())?.0)))
            .collect();
        Self {
            session: Mutex::new(session),
            profiles,
            dtypes,
            requested,
            profile_dir: Mutex::new(profile_dir),
            placement: Mutex::new(None),
            refused: None,
        }
    }
}

impl Engine for OrtEngine {
    fn run(&self, inputs: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>> {
        // A refused graph serves no run but the one that names its CPU nodes.
        if let Some(refused) = &self.refused
            && self.profile_dir.lock().map(|d| d.is_none()).unwrap_or(true)
        {
            return Err(Error::UnsupportedOperator {
                backend: "onnxruntime".into(),
                operators: vec![refused.clone()],
            });
        }
        let fits = self.profiles.iter().any(|p| {
            p.inputs.len() == inputs.len()
                && p.inputs
                    .iter()
                    .all(|(n, s)| inputs.get(n).is_some_and(|t| &t.shape == s))
        });
        if !fits {
            let got: BTreeMap<&String, &Vec<usize>> =
                inputs.iter().map(|(n, t)| (n, &t.shape)).collect();
            let want: Vec<_> = self.profiles.iter().map(|p| (&p.name, &p.inputs)).collect();
            return Err(Error::WarmupFailed(format!(
                "inputs {got:?} match no compiled profile {want:?}; fixture inputs must have a profile's names and shapes"
            )));
        }
        let mut values: Vec<(String, DynValue)> = Vec::with_capacity(inputs.len());
        for (name, t) in inputs {
            values.push((name.clone(), to_value(t)?));
        }
        let mut session = self.session.lock().map_err(|_| {
            Error::WarmupFailed("the engine is poisoned by an earlier panic".into())
        })?;
        let outputs = session
            .run(values)
            .map_err(|e| classify(e, "running the engine", Error::WarmupFailed))?;
        let mut host = BTreeMap::new();
        for (name, value) in outputs.iter() {
            host.insert(name.to_string(), from_value(name, &value)?);
        }
        drop(outputs);
        let first = self
            .profile_dir
            .lock()
            .map_err(|_| Error::WarmupFailed("poisoned".into()))?
            .take();
        if let Some(dir) = first {
            let file = session
                .end_profiling()
                .map_err(|e| Error::WarmupFailed(format!("ending the profile: {e}")))?;
            let placement =
                read_profile(Path::new(&file), provider_name(self.requested)).map_err(|m| {
                    Error::WarmupFailed(format!("reading the run's profile {file}: {m}"))
                })?;
            drop(dir);
            if let Some(refused) = &self.refused {
                let forbidden = CpuFallback {
                    policy: CpuFallbackPolicy::Forbidden,
                    max_share_percent: None,
                };
                crate::pipeline::placement::check("onnxruntime", &forbidden, &placement)?;
                return Err(Error::UnsupportedOperator {
                    backend: "onnxruntime".into(),
                    operators: vec![refused.clone()],
                });
            }
            if let Ok(mut p) = self.placement.lock() {
                *p = Some(placement);
            }
        }
        Ok(host)
    }

    fn profiles(&self) -> Vec<(String, Shapes)> {
        self.profiles
            .iter()
            .map(|p| (p.name.clone(), p.inputs.iter().cloned().collect()))
            .collect()
    }

    fn input_dtypes(&self) -> BTreeMap<String, Dtype> {
        self.dtypes.clone()
    }

    fn placement(&self) -> Option<Placement> {
        self.placement.lock().ok().and_then(|p| p.clone())
    }
}

/// One event of ONNX Runtime's profile (Chrome trace format), as far as placement needs it.
#[derive(Deserialize)]
struct ProfileEvent {
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    args: ProfileArgs,
}

#[derive(Deserialize, Default)]
struct ProfileArgs {
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    op_name: Option<String>,
}

/// The placement a profile shows: every node event with its provider, in execution order; a
/// node run again (a loop body) counts once.
pub fn read_profile(file: &Path, requested: &str) -> std::result::Result<Placement, String> {
    let meta = std::fs::metadata(file).map_err(|e| e.to_string())?;
    if meta.len() > MAX_PROFILE_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_PROFILE_BYTES} read",
            meta.len()
        ));
    }
    let bytes = std::fs::read(file).map_err(|e| e.to_string())?;
    placement_of(&bytes, requested)
}

fn placement_of(profile: &[u8], requested: &str) -> std::result::Result<Placement, String> {
    let events: Vec<ProfileEvent> = serde_json::from_slice(profile).map_err(|e| e.to_string())?;
    let mut seen = std::collections::BTreeSet::new();
    let mut ran = Vec::new();
    for e in events {
        let (Some(provider), Some(op)) = (e.args.provider, e.args.op_name) else {
            continue;
        };
        let Some(node) = e.name.strip_suffix("_kernel_time") else {
            continue;
        };
        if e.cat != "Node" || !seen.insert((node.to_string(), op.clone(), provider.clone())) {
            continue;
        }
        ran.push((
            provider,
            PlacedNode {
                name: node.to_string(),
                op_type: op,
            },
        ));
    }
    Ok(Placement::measure(
        requested,
        ran.iter().map(|(p, n)| (p.as_str(), n.clone())),
    ))
}

fn to_value(t: &HostTensor) -> Result<DynValue> {
    let shape = t.shape.clone();
    let d = &t.data;
    let wrong = |e: ort::Error| Error::InvalidSpec(format!("tensor of shape {shape:?}: {e}"));
    let s = t.shape.clone();
    Ok(match t.dtype {
        Dtype::F32 => Tensor::from_array((s, le_vec!(d, f32)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::F64 => Tensor::from_array((s, le_vec!(d, f64)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::F16 => Tensor::from_array((
            s,
            le_vec!(d, u16)
                .into_iter()
                .map(half::f16::from_bits)
                .collect::<Vec<_>>(),
        ))
        .map_err(wrong)?
        .into_dyn(),
        Dtype::I64 => Tensor::from_array((s, le_vec!(d, i64)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::I32 => Tensor::from_array((s, le_vec!(d, i32)))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::I8 => Tensor::from_array((s, d.iter().map(|b| *b as i8).collect::<Vec<_>>()))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::U8 => Tensor::from_array((s, d.clone()))
            .map_err(wrong)?
            .into_dyn(),
        Dtype::BOOL => Tensor::from_array((s, d.iter().map(|b| *b != 0).collect::<Vec<_>>()))
            .map_err(wrong)?
            .into_dyn(),
        other => {
            return Err(Error::InvalidSpec(format!(
                "dtype {other:?} is not supported by the onnxruntime backend"
            )));
        }
    })
}

fn from_value(name: &str, v: &ort::value::DynValueRef<'_>) -> Result<HostTensor> {
    let failed = |e: ort::Error| Error::WarmupFailed(format!("output {name}: {e}"));
    let ValueType::Tensor { ty, .. } = v.dtype() else {
        return Err(Error::WarmupFailed(format!(
            "output {name} is a {}, not a tensor; it cannot be compared",
            v.dtype()
        )));
    };
    macro_rules! bytes {
        ($t:ty) => {{
            let (shape, data) = v.try_extract_tensor::<$t>().map_err(failed)?;
            (
                shape.iter().map(|d| *d as usize).collect::<Vec<_>>(),
                data.iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            )
        }};
    }
    let (shape, data) = match ty {
        TensorElementType::Float32 => bytes!(f32),
        TensorElementType::Float64 => bytes!(f64),
        TensorElementType::Float16 => bytes!(half::f16),
        TensorElementType::Int64 => bytes!(i64),
        TensorElementType::Int32 => bytes!(i32),
        TensorElementType::Int8 => bytes!(i8),
        TensorElementType::Uint8 => bytes!(u8),
        TensorElementType::Bool => {
            let (shape, data) = v.try_extract_tensor::<bool>().map_err(failed)?;
            (
                shape.iter().map(|d| *d as usize).collect(),
                data.iter().map(|b| u8::from(*b)).collect(),
            )
        }
        other => {
            return Err(Error::WarmupFailed(format!(
                "output {name} has element type {other:?}, which cannot be compared"
            )));
        }
    };
    Ok(HostTensor {
        dtype: dtype(*ty).unwrap_or(Dtype::U8),
        shape,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_ort_reports() {
        assert_eq!(
            reported_version("Loaded ONNX Runtime dylib from \"/x/lib.so\"; version '1.31.1'"),
            Some("1.31.1".into())
        );
        assert_eq!(reported_version("something else"), None);
        assert_eq!(
            reported_version("Loaded ONNX Runtime dylib from \"/x\"; version '1.31.1; rm -rf'"),
            None
        );
    }

    #[test]
    fn a_profile_gives_providers_boundaries_and_fallback() {
        let profile = br#"[
 {"cat":"Session","name":"session_initialization","args":{}},
 {"cat":"Node","name":"conv1_kernel_time","args":{"provider":"CUDAExecutionProvider","op_name":"Conv"}},
 {"cat":"Node","name":"shape_kernel_time","args":{"provider":"CPUExecutionProvider","op_name":"Shape"}},
 {"cat":"Node","name":"shape_fence_before","args":{"provider":"CPUExecutionProvider","op_name":"Shape"}},
 {"cat":"Node","name":"relu_kernel_time","args":{"provider":"CUDAExecutionProvider","op_name":"Relu"}},
 {"cat":"Node","name":"relu_kernel_time","args":{"provider":"CUDAExecutionProvider","op_name":"Relu"}}
]"#;
        let p = placement_of(profile, "CUDAExecutionProvider").expect("profile");
        assert_eq!(
            p.nodes,
            BTreeMap::from([("cuda".into(), 2), ("cpu".into(), 1)])
        );
        assert_eq!(p.partitions, 3);
        assert_eq!(
            p.fallback_nodes,
            vec![PlacedNode {
                name: "shape".into(),
                op_type: "Shape".into()
            }]
        );
        assert!(placement_of(b"{not json", "cpu").is_err());
    }
}
