//! Engine backends: one trait with `compile`, `load` and `run`, shared by the compile worker and
//! the node agent, so the parity a Job reports and the parity a node checks come from the same
//! code. Backends read the model file and write the artifact path they are given; they never
//! fetch, store, or talk to the apiserver. Their shared vocabulary lives here too, below the
//! pipeline that uses it: [`tensor`] (the host tensor every engine takes and returns) and
//! [`cpu_fallback`] (whether a measured placement is allowed).

use std::collections::BTreeMap;

use kiln_crds::compiled_target::BackendKind;

use kiln_node_core::error::{Error, Result};

mod api;
pub mod archive;
pub mod auto;
pub mod cpu_fallback;
pub mod exec;
pub mod guard;
pub mod iree;
pub mod llamacpp;
pub mod onnxruntime;
pub mod select;
mod subprocess;
pub mod tensor;
pub mod tract;
mod tract_nnef;
mod tract_unsupported;

pub use api::{
    Backend, CompileRequest, Compiled, Engine, Generation, GraphInterface, InputInfo, MemoryFit,
    Shapes, TensorInfo, Tokenizer,
};

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
        return Ok(Builder::Auto(auto::Auto::for_class(
            spec,
            class,
            candidate_here,
        )));
    }
    for_target_with(spec, handoff).map(Builder::One)
}

/// An `auto` candidate's backend on this worker: [`for_target`]'s, but IREE only where its
/// compiler is (the agent image loads IREE modules; compiling them takes the compiler's image).
fn candidate_here(spec: &kiln_crds::compiled_target::Backend) -> Result<Box<dyn Backend>> {
    if spec.kind == BackendKind::Iree {
        iree::compile::Tools::find(None)?;
    }
    for_target(spec)
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
        "iree" => BackendKind::Iree,
        other => {
            return Err(Error::IncompatibleRuntime(format!(
                "artifact built by backend {other:?}, which kiln-agent cannot load"
            )));
        }
    };
    // The provider and the optimisation are the artifact's; the CPU-fallback policy and the CUDA
    // settings are the target's (an `auto` artifact was built with them; another backend's
    // artifact is checked against them on load).
    let from = kiln_crds::compiled_target::Backend::from_options(kind, &manifest.backend_options);
    let mut built = kiln_crds::compiled_target::Backend {
        execution_provider: from.execution_provider,
        optimization_level: from.optimization_level,
        ..kiln_crds::compiled_target::Backend::of(kind)
    };
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
        BackendKind::Iree => Box::new(iree::Iree::default()),
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
                "backend {} is not built into kiln-agent; use backend.kind: tract, onnxruntime, llamacpp or iree, or kind: exec with a compiler image that writes ONNX",
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
        ("iree".to_string(), iree::compile::VERSION.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_crds::compiled_target::Backend as Spec;

    fn manifest(backend: &str, options: serde_json::Value) -> kiln_crds::BuildManifest {
        kiln_node_core::test_support::manifest(
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
