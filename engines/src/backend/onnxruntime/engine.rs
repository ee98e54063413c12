//! A loaded ONNX Runtime session as a kiln [`Engine`]: runs fixtures, and reads the profile of
//! its first run for the placement.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use kiln_crds::compiled_target::{CpuFallback, CpuFallbackPolicy, ExecutionProvider};
use kiln_crds::placement::Placement;
use ort::session::Session;
use ort::value::DynValue;
use safetensors::Dtype;

use super::artifact::ProfileEntry;
use super::graphs::Graphs;
use super::profile::read_profile;
use super::terms::{classify, provider_name};
use super::values::{from_value, tensor_type, to_value};
use crate::backend::tensor::HostTensor;
use crate::backend::{Engine, Shapes};
use kiln_node_core::error::{Error, Result};

/// A session, its profiles, and what its first run measured.
pub(super) struct OrtEngine {
    session: Mutex<Session>,
    profiles: Vec<ProfileEntry>,
    dtypes: BTreeMap<String, Dtype>,
    requested: ExecutionProvider,
    /// Where the first run's profile goes; taken (and removed) once it is read.
    profile_dir: Mutex<Option<tempfile::TempDir>>,
    placement: Mutex<Option<Placement>>,
    /// ONNX Runtime refused the graph under `cpuFallback: Strict`; this engine runs with
    /// fallback allowed only to name the nodes, then fails.
    pub(super) refused: Option<String>,
    /// With `backend.cuda.cudaGraphs` on the CUDA provider: runs through fixed device tensors,
    /// capturing and replaying a CUDA graph per profile.
    pub(super) graphs: Option<Mutex<Graphs>>,
}

impl OrtEngine {
    pub(super) fn new(
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
            graphs: None,
        }
    }
}

impl Drop for OrtEngine {
    /// The CUDA graphs' binding and device tensors go before the session they were made for
    /// (fields drop in declaration order, the session first).
    fn drop(&mut self) {
        self.graphs = None;
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
        let poisoned = || Error::WarmupFailed("the engine is poisoned by an earlier panic".into());
        let mut session = self.session.lock().map_err(|_| poisoned())?;
        let host = match &self.graphs {
            Some(graphs) => graphs
                .lock()
                .map_err(|_| poisoned())?
                .run(&mut session, inputs)?,
            None => run_plain(&mut session, inputs)?,
        };
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
                let strict = CpuFallback {
                    policy: CpuFallbackPolicy::Strict,
                    max_share_percent: None,
                };
                crate::backend::cpu_fallback::check("onnxruntime", &strict, &placement)?;
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

    fn replays_captured_work(&self) -> bool {
        self.graphs.is_some()
    }
}

/// One run with the inputs copied in and the outputs out by ONNX Runtime.
fn run_plain(
    session: &mut Session,
    inputs: &BTreeMap<String, HostTensor>,
) -> Result<BTreeMap<String, HostTensor>> {
    let mut values: Vec<(String, DynValue)> = Vec::with_capacity(inputs.len());
    for (name, t) in inputs {
        values.push((name.clone(), to_value(t)?));
    }
    let outputs = session
        .run(values)
        .map_err(|e| classify(e, "running the engine", Error::WarmupFailed))?;
    let mut host = BTreeMap::new();
    for (name, value) in outputs.iter() {
        host.insert(name.to_string(), from_value(name, &value)?);
    }
    Ok(host)
}
