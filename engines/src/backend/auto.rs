//! `backend.kind: auto`: the engine candidates a class can run, each with the backend that
//! builds it here or the reason this worker cannot. The compile (`pipeline::build`) builds,
//! checks and measures each; [`super::select`] keeps one.

use kiln_crds::class::ClassFacts;
use kiln_crds::compiled_target::Backend as Spec;

use super::Backend;
use kiln_node_core::error::Error;

/// One candidate: its concrete backend spec, and the backend or why it is unavailable.
pub struct Candidate {
    /// The concrete spec (`kind: onnxruntime, executionProvider: cuda`, …).
    pub spec: Spec,
    /// The backend that compiles and loads it on this worker.
    pub backend: std::result::Result<Box<dyn Backend>, Error>,
}

/// The candidates of one class.
pub struct Auto {
    /// In the order [`Spec::candidates`] gives.
    pub candidates: Vec<Candidate>,
}

impl Auto {
    /// The candidates of `spec` (kind `auto`) on `class`, each backend made by `make`
    /// (`backend::for_target`: passed in, so this list sits below the code that picks backends).
    pub fn for_class(
        spec: &Spec,
        class: &ClassFacts,
        make: impl Fn(&Spec) -> Result<Box<dyn Backend>, Error>,
    ) -> Self {
        let candidates = spec
            .candidates(class)
            .into_iter()
            .map(|spec| Candidate {
                backend: make(&spec),
                spec,
            })
            .collect();
        Self { candidates }
    }

    /// What the compile key names as the backend version: every runtime a candidate loaded
    /// (`onnxruntime=1.31.1@sha256:…,tract=0.23.9`), as the operator computes it from its
    /// `--backend-version`.
    pub fn identity(&self) -> String {
        let loaded: Vec<(&str, String)> = self
            .candidates
            .iter()
            .filter_map(|c| c.backend.as_ref().ok())
            .map(|b| (b.name(), b.identity()))
            .collect();
        kiln_crds::compiled_target::auto_identity(loaded.iter().map(|(n, v)| (*n, v.as_str())))
    }
}
