//! Engine backends: one trait with `compile`, `load` and `run`, shared by the compile worker and
//! the node agent, so the parity a Job reports and the parity a node checks come from the same
//! code. Backends read the model file and write the artifact path they are given; they never
//! fetch, store, or talk to the apiserver.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_crds::compiled_target::{BackendKind, Precision};

use crate::error::{Error, Result};
use crate::pipeline::tensor::HostTensor;

pub mod archive;
pub mod auto;
pub mod exec;
pub mod guard;
pub mod llamacpp;
pub mod onnxruntime;
pub mod select;
pub mod tract;
mod tract_nnef;
mod tract_unsupported;

/// Input name → concrete shape.
pub type Shapes = BTreeMap<String, Vec<usize>>;

/// What a compile needs.
pub struct CompileRequest<'a> {
    /// The verified source model file.
    pub model: &'a Path,
    /// Profile name → concrete input shapes (bound and bounds-checked).
    pub profiles: &'a BTreeMap<String, Shapes>,
    /// Numeric precision.
    pub precision: Precision,
    /// The execution provider for the class ([`kiln_crds::compiled_target::Backend::provider_for`]).
    pub provider: kiln_crds::compiled_target::ExecutionProvider,
    /// Backend flags.
    pub flags: &'a BTreeMap<String, String>,
    /// Where to write the artifact.
    pub out: &'a Path,
    /// How long a foreign compiler may run (`spec.compile.activeDeadlineSeconds`).
    pub timeout: Option<std::time::Duration>,
    /// `warmup.memoryBudget` in bytes, which `llamacpp` quantisation `auto` fits.
    pub memory_budget: Option<u64>,
}

/// What a compile reports.
#[derive(Debug, Default)]
pub struct Compiled {
    /// Output names, in order.
    pub outputs: Vec<String>,
    /// What the converter did, line by line.
    pub log: Vec<String>,
    /// Why the artifact depends on the build machine's instruction set, when it does: it is
    /// then bound to that machine's CPU level.
    pub machine_bound: Option<String>,
    /// What the compile resolved (e.g. the weight type `auto` chose, sizes), recorded in the
    /// build manifest's `backendOptions` beside the target's settings.
    pub resolved: BTreeMap<String, String>,
}

/// A compiler and loader for one kind of engine.
pub trait Backend: Send + Sync {
    /// Backend name as in `CompiledTarget.spec.backend.kind`.
    fn name(&self) -> &'static str;
    /// Version of the backend library.
    fn version(&self) -> String;
    /// What the compile key names as the backend version: the version, and for a library
    /// loaded at run time also its bytes (`1.31.1@sha256:<hex>`).
    fn identity(&self) -> String {
        self.version()
    }
    /// sha256 of a library loaded at run time (recorded in the build manifest).
    fn runtime_digest(&self) -> Option<String> {
        None
    }
    /// Media type of its artifacts.
    fn media_type(&self) -> &'static str;
    /// Compiles `req.model` into `req.out`.
    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled>;
    /// Loads an artifact this backend compiled, ready to run.
    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>>;
    /// The source model executed as written, unoptimised: the reference fixtures are made with.
    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>>;
    /// The graph inputs the model file declares.
    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>>;
    /// The graph's inputs and outputs as far as the model file states them, for checking the
    /// ModelArtifact's declaration.
    fn interface(&self, model: &Path) -> Result<GraphInterface>;
}

/// A loaded engine.
pub trait Engine: Send + Sync {
    /// Runs one batch of named inputs and returns the named outputs.
    fn run(&self, inputs: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>>;
    /// Names and shapes of the inputs of each compiled profile.
    fn profiles(&self) -> Vec<(String, Shapes)>;
    /// Element type of each input (the same in every profile), for checking fixtures.
    fn input_dtypes(&self) -> BTreeMap<String, safetensors::Dtype>;
    /// Which provider ran which nodes, once the engine has run (`None` before, or for an engine
    /// that cannot tell).
    fn placement(&self) -> Option<kiln_crds::placement::Placement> {
        None
    }
    /// A language model's prefill and decode figures from its last run (`None` for other
    /// engines).
    fn generation(&self) -> Option<Generation> {
        None
    }
}

/// What a language model's run measured.
pub use kiln_crds::llamacpp::Generation;

/// What compiles a target's class: one backend, or for kind `auto` every candidate.
pub enum Builder {
    /// One backend.
    One(Box<dyn Backend>),
    /// `auto`: the candidates, measured at compile.
    Auto(auto::Auto),
}

impl Builder {
    /// The name in metrics and logs (`auto` for kind auto).
    pub fn name(&self) -> &'static str {
        match self {
            Self::One(b) => b.name(),
            Self::Auto(_) => "auto",
        }
    }

    /// What the compile key names as the backend version.
    pub fn identity(&self) -> String {
        match self {
            Self::One(b) => b.identity(),
            Self::Auto(a) => a.identity(),
        }
    }

    /// The version for messages.
    pub fn version(&self) -> String {
        match self {
            Self::One(b) => b.version(),
            Self::Auto(a) => a.identity(),
        }
    }

    /// A backend that reads the graph's interface: the one, or the first candidate available.
    pub fn reader(&self) -> Result<&dyn Backend> {
        match self {
            Self::One(b) => Ok(b.as_ref()),
            Self::Auto(a) => a
                .candidates
                .iter()
                .find_map(|c| c.backend.as_ref().ok())
                .map(|b| b.as_ref())
                .ok_or_else(|| {
                    Error::IncompatibleRuntime("no engine candidate is available here".into())
                }),
        }
    }
}

/// What compiles `spec` for `class`: the backend it names, or for kind `auto` the candidates
/// of that class. `handoff` as in [`for_target_with`].
pub fn builder_for(
    spec: &kiln_crds::compiled_target::Backend,
    class: &kiln_crds::class::ClassFacts,
    handoff: Option<&std::path::Path>,
) -> Result<Builder> {
    if spec.kind == BackendKind::Auto {
        return Ok(Builder::Auto(auto::Auto::for_class(spec, class)));
    }
    for_target_with(spec, handoff).map(Builder::One)
}

/// The backend a target asks for, refusing a version other than the one this binary carries.
pub fn for_target(spec: &kiln_crds::compiled_target::Backend) -> Result<Box<dyn Backend>> {
    for_target_with(spec, None)
}

/// The backend that loads an artifact: the target's when that is what built it, else the one
/// its (verified) build manifest names, with the execution provider and optimisation level the
/// manifest records. A node serves an artifact of another backend when it goes back to a
/// revision built before `spec.backend` changed: a rollback, a pin, `PreviousKnownGood`.
pub fn for_artifact(
    spec: &kiln_crds::compiled_target::Backend,
    manifest: &kiln_crds::BuildManifest,
) -> Result<Box<dyn Backend>> {
    if let Ok(own) = for_target(spec)
        && own.name() == manifest.backend
    {
        return Ok(own);
    }
    let kind = match manifest.backend.as_str() {
        "tract" => BackendKind::Tract,
        "onnxruntime" => BackendKind::Onnxruntime,
        "llamacpp" => BackendKind::Llamacpp,
        other => {
            return Err(Error::IncompatibleRuntime(format!(
                "artifact built by backend {other:?}, which kiln-agent cannot load"
            )));
        }
    };
    fn option<T: serde::de::DeserializeOwned>(
        m: &kiln_crds::BuildManifest,
        name: &str,
    ) -> Option<T> {
        let value = m.backend_options.get(name)?.clone();
        serde_json::from_value(serde_json::Value::String(value)).ok()
    }
    // The provider and the optimisation are the artifact's; the CPU-fallback policy and the CUDA
    // settings are the target's (an `auto` artifact was built with them; another backend's
    // artifact is checked against them on load).
    let mut built = kiln_crds::compiled_target::Backend::of(kind);
    built.execution_provider = option(manifest, "executionProvider");
    built.optimization_level = option(manifest, "optimizationLevel");
    built.llamacpp.clone_from(&spec.llamacpp);
    if kind == BackendKind::Onnxruntime {
        built.cpu_fallback.clone_from(&spec.cpu_fallback);
        built.cuda.clone_from(&spec.cuda);
    }
    for_target(&built)
}

/// [`for_target`], where an `exec` compiler already ran in another container of the compile Job
/// and left its model in `handoff` (see [`exec`]).
pub fn for_target_with(
    spec: &kiln_crds::compiled_target::Backend,
    handoff: Option<&std::path::Path>,
) -> Result<Box<dyn Backend>> {
    let backend: Box<dyn Backend> = match spec.kind {
        BackendKind::Tract => Box::new(tract::Tract),
        BackendKind::Onnxruntime => Box::new(onnxruntime::OnnxRuntime::for_spec(spec)?),
        BackendKind::Llamacpp => Box::new(llamacpp::Llamacpp::for_spec(spec)),
        BackendKind::Exec => Box::new(exec::Exec {
            command: spec.command.clone(),
            handoff: handoff.map(std::path::Path::to_path_buf),
        }),
        BackendKind::Auto => {
            return Err(Error::InvalidSpec(
                "backend kind auto names no single engine: each class's compile chooses one, and its artifact is loaded by the backend its build manifest names".into(),
            ));
        }
        other => {
            return Err(Error::InvalidSpec(format!(
                "backend {} is not built into kiln-agent; use backend.kind: tract, onnxruntime or llamacpp, or kind: exec with a compiler image that writes ONNX",
                other.as_str()
            )));
        }
    };
    if let Some(wanted) = &spec.version
        && wanted != &backend.version()
    {
        return Err(Error::IncompatibleRuntime(format!(
            "the target requires {} {wanted}, this agent carries {}",
            backend.name(),
            backend.version()
        )));
    }
    Ok(Box::new(guard::Guarded(backend)))
}

/// The runtimes this binary carries, for the hardware facts.
pub fn runtimes() -> BTreeMap<String, String> {
    let mut runtimes = BTreeMap::from([
        (tract::Tract.name().to_string(), tract::Tract.version()),
        ("llamacpp".to_string(), llamacpp::VERSION.to_string()),
    ]);
    // ONNX Runtime when a library is configured and loads (a broken one is reported when a
    // target asks for it).
    if onnxruntime::library_path().is_some()
        && let Ok(rt) = onnxruntime::runtime()
    {
        runtimes.insert("onnxruntime".into(), rt.version.clone());
    }
    runtimes
}

/// One graph input as the model file declares it.
#[derive(Clone, Debug)]
pub struct InputInfo {
    /// Input name.
    pub name: String,
    /// Element type.
    pub dtype: safetensors::Dtype,
    /// Extents; `None` for a symbolic dim.
    pub dims: Vec<Option<usize>>,
}

/// A graph's inputs and outputs, in order.
#[derive(Clone, Debug, Default)]
pub struct GraphInterface {
    /// Graph inputs.
    pub inputs: Vec<TensorInfo>,
    /// Graph outputs.
    pub outputs: Vec<TensorInfo>,
}

/// One graph input or output, with what the model file leaves open as `None`.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type; `None` when the file does not state it.
    pub dtype: Option<safetensors::Dtype>,
    /// Dims (`None` inside for a symbolic dim); `None` when the rank is not stated.
    pub dims: Option<Vec<Option<usize>>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::compiled_target::Backend as Spec;

    fn manifest(backend: &str, options: serde_json::Value) -> kiln_crds::BuildManifest {
        crate::test_support::manifest(
            serde_json::json!({"backend": backend, "backendOptions": options}),
        )
    }

    #[test]
    fn an_artifact_loads_with_the_backend_that_built_it_not_the_one_the_spec_names_now() {
        // The spec moved to onnxruntime; revision 1 was built by tract and is served again.
        let tract = manifest("tract", serde_json::json!({}));
        let spec = Spec::of(BackendKind::Onnxruntime);
        let backend = for_artifact(&spec, &tract).expect("tract loads it");
        assert_eq!(backend.name(), "tract");
        assert_eq!(
            for_artifact(&Spec::of(BackendKind::Tract), &tract)
                .expect("own")
                .name(),
            "tract"
        );
        // A backend kiln-agent does not carry is a classified refusal, not a guess.
        let foreign = manifest("tensorrt", serde_json::json!({}));
        let err = for_artifact(&Spec::of(BackendKind::Tract), &foreign)
            .err()
            .expect("refused");
        assert_eq!(err.reason(), kiln_crds::FailureReason::IncompatibleRuntime);
        assert!(err.to_string().contains("tensorrt"), "{err}");
    }
}
