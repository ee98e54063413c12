//! The model `kiln-agent serve` serves: the mounted directory ([`kiln_crds::mounted`]) read and
//! checked (kiln.json, the build manifest, the artifact against both: taken on the plugin's seal
//! when the volume is mounted read-only and the artifact's inode, size and modification time are
//! the seal's, re-hashed otherwise; the fixture
//! against its digest, the artifact's class against this machine's probed hardware), loaded with
//! the backend its manifest names and the settings it records, as the node's warmup loaded it.
//! Then requests through the engines of a [`Pool`] sized to the pod ([`crate::pool::size`]),
//! every input checked against its profiles.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_crds::BuildManifest;
use kiln_crds::compiled_target::{Backend as BackendSpec, BackendKind};
use kiln_crds::mounted::{self, MountedModel};
use kiln_store::staged::sha256_file;

use crate::oip::{ModelMetadata, TensorMetadata, datatype};
use crate::pool::{self, Pool};
use kiln_engines::backend::tensor::HostTensor;
use kiln_engines::backend::{self, Engine};
use kiln_engines::pipeline::fixtures::FixtureFile;
use kiln_engines::pipeline::warmup::{describe_profiles, fits_a_profile, shapes_of};
use kiln_node_core::error::{Error, Result};

/// A loaded, checked model.
pub struct Served {
    /// The name clients address it by.
    pub name: String,
    /// What the volume says it is.
    pub mounted: MountedModel,
    /// Its build manifest.
    pub manifest: BuildManifest,
    /// The model's metadata as the protocol reports it.
    pub metadata: ModelMetadata,
    /// Seconds the load took.
    pub load_seconds: f64,
    /// Whether the artifact was re-hashed here (false: taken on the plugin's seal).
    pub hashed: bool,
    /// The engines requests run on.
    pub pool: Pool,
    /// The threads they run on.
    pub workers: crate::workers::Workers,
    /// The fixture's first sample's inputs, which warm each worker thread.
    warm_inputs: Option<BTreeMap<String, HostTensor>>,
}

/// Reads, checks and loads the model in `dir`, served as `name` (default: the target's name),
/// with `instances` engines (or runs at once, for a shareable engine) when asked, else as many
/// as [`pool::size`] finds fit.
pub fn open(dir: &Path, name: Option<String>, instances: Option<usize>) -> Result<Served> {
    let (mounted, manifest, hashed) = read_checked(dir)?;
    let fixture = read_fixture(dir, &mounted)?;
    let backend = backend::for_artifact(&settings_of(&manifest), &manifest)?;
    let probed =
        kiln_engines::host::probe::labels(&kiln_engines::host::probe::probe(backend::runtimes()));
    let wrong = kiln_engines::host::compat::runs_here(&manifest.class, &probed);
    if !wrong.is_empty() {
        return Err(Error::IncompatibleHardware(format!(
            "the artifact of class {} does not run on this machine ({}): is the pod on the node whose agent verified it?",
            mounted.class,
            kiln_engines::host::compat::describe(&wrong)
        )));
    }
    kiln_engines::pipeline::ready::check_compatible(&manifest, backend.as_ref(), &manifest.class)?;
    let started = std::time::Instant::now();
    let artifact = dir.join(mounted::ARTIFACT);
    let first = backend.load(&artifact)?;
    let sizing = pool::size(
        pool::Facts {
            shareable: first.shareable(),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            artifact_bytes: manifest.artifact_size,
            memory_available: pool::memory_available(),
        },
        instances,
    )
    .map_err(Error::InvalidSpec)?;
    let mut engines = vec![first];
    while engines.len() < sizing.instances {
        engines.push(backend.load(&artifact)?);
    }
    let load_seconds = started.elapsed().as_secs_f64();
    let name = name.unwrap_or_else(|| mounted.target.clone());
    let metadata = metadata(&name, &manifest, engines[0].as_ref(), fixture.as_ref());
    Ok(Served {
        name,
        mounted,
        manifest,
        metadata,
        load_seconds,
        hashed,
        pool: Pool::new(engines, sizing.workers),
        workers: crate::workers::Workers::start(sizing.workers)
            .map_err(|e| Error::LoadFailed(format!("starting the worker threads: {e}")))?,
        warm_inputs: fixture.map(|f| f.inputs),
    })
}

/// The backend settings the artifact was built and warmed with, as its manifest records them
/// (`backendOptions`): the provider and optimisation level ([`backend::for_artifact`] reads
/// those), and for ONNX Runtime on CUDA the cuDNN search, the arena and CUDA graphs. TF32
/// follows the artifact's own precision. Pure.
pub fn settings_of(manifest: &BuildManifest) -> BackendSpec {
    let built = BackendSpec::from_options(BackendKind::Onnxruntime, &manifest.backend_options);
    BackendSpec {
        cuda: built.cuda,
        ..BackendSpec::of(BackendKind::Auto)
    }
}

/// kiln.json and the manifest, and the artifact proved ([`sealed`], else re-hashed: the flag):
/// its sha256 and size must be what both say.
fn read_checked(dir: &Path) -> Result<(MountedModel, BuildManifest, bool)> {
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read(&path).map_err(|e| {
            Error::InvalidSpec(format!(
                "{}: {e}; --model-dir must be a csi.kiln.dev volume (artifact, manifest.json, kiln.json)",
                path.display()
            ))
        })
    };
    let mounted = MountedModel::parse(&read(mounted::KILN_JSON)?).map_err(Error::InvalidSpec)?;
    let manifest: BuildManifest = serde_json::from_slice(&read(mounted::MANIFEST)?)
        .map_err(|e| Error::InvalidSpec(format!("{}: {e}", mounted::MANIFEST)))?;
    let path = dir.join(mounted::ARTIFACT);
    let sealed = sealed(dir, &mounted, manifest.artifact_size);
    let (digest, size) = match sealed {
        Some(size) => (mounted.digest.clone(), size),
        None => sha256_file(&path).map_err(|e| Error::store(&path, e))?,
    };
    if digest != mounted.digest
        || manifest.artifact_digest != mounted.digest
        || size != manifest.artifact_size
    {
        return Err(Error::HashMismatch {
            what: format!("mounted artifact {}", path.display()),
            message: format!(
                "sha256 {digest} ({size} bytes); kiln.json says {}, the manifest {} ({} bytes): not served",
                mounted.digest, manifest.artifact_digest, manifest.artifact_size
            ),
            source: None,
        });
    }
    Ok((mounted, manifest, sealed.is_none()))
}

/// The artifact's size when the plugin's seal stands: `dir` is mounted read-only (nothing writes
/// through it) and the artifact's inode, size (the manifest's too) and modification time are
/// what the plugin proved. `None`: hash it.
fn sealed(dir: &Path, mounted: &MountedModel, size: u64) -> Option<u64> {
    let seal = mounted.seal?;
    let read_only = rustix::fs::statvfs(dir)
        .ok()?
        .f_flag
        .contains(rustix::fs::StatVfsMountFlags::RDONLY);
    let now = kiln_store::staged::Stamp::of(&dir.join(mounted::ARTIFACT)).ok()?;
    let stands = (now.ino, now.size, now.mtime_ns) == (seal.inode, seal.size, seal.mtime_ns);
    (read_only && stands && now.size == size).then_some(now.size)
}

/// The fixture, when kiln.json names one, checked against its digest.
fn read_fixture(dir: &Path, mounted: &MountedModel) -> Result<Option<FixtureFile>> {
    let Some(want) = &mounted.fixture else {
        return Ok(None);
    };
    let path = dir.join(mounted::FIXTURE);
    let (got, _) = sha256_file(&path).map_err(|e| Error::store(&path, e))?;
    if &got != want {
        return Err(Error::HashMismatch {
            what: format!("mounted fixture {}", path.display()),
            message: format!("sha256 {got}, kiln.json says {want}"),
            source: None,
        });
    }
    FixtureFile::read(&path).map(Some)
}

/// The protocol's metadata: inputs from the engine's profiles (-1 where profiles differ),
/// outputs from the manifest, their types and shapes from the fixture's golden values.
fn metadata(
    name: &str,
    manifest: &BuildManifest,
    engine: &dyn Engine,
    fixture: Option<&FixtureFile>,
) -> ModelMetadata {
    let dtypes = engine.input_dtypes();
    let profiles = engine.profiles();
    let mut inputs: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (_, shapes) in &profiles {
        for (input, shape) in shapes {
            let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
            inputs
                .entry(input.clone())
                .and_modify(|seen| {
                    if seen.len() != dims.len() {
                        *seen = vec![-1];
                    } else {
                        for (s, d) in seen.iter_mut().zip(&dims) {
                            if s != d {
                                *s = -1;
                            }
                        }
                    }
                })
                .or_insert(dims);
        }
    }
    let typed = |dtype: Option<&safetensors::Dtype>| {
        dtype.and_then(|d| datatype(*d)).unwrap_or("").to_string()
    };
    let outputs = manifest
        .outputs
        .iter()
        .filter_map(|o| {
            let golden = fixture?.outputs.get(o)?;
            Some(TensorMetadata {
                name: o.clone(),
                datatype: typed(Some(&golden.dtype)),
                shape: golden.shape.iter().map(|d| *d as i64).collect(),
            })
        })
        .collect();
    ModelMetadata {
        parameters: Default::default(),
        name: name.to_string(),
        versions: Vec::new(),
        platform: manifest.engine(),
        inputs: inputs
            .into_iter()
            .map(|(input, shape)| TensorMetadata {
                datatype: typed(dtypes.get(&input)),
                name: input,
                shape,
            })
            .collect(),
        outputs,
    }
}

impl Served {
    /// Runs the fixture's first sample on every worker thread, all at once, so no request
    /// pays a thread's first run; refused when a run fails. Seconds of the slowest.
    pub fn warm_workers(self: &std::sync::Arc<Self>) -> Result<f64> {
        let Some(inputs) = self.warm_inputs.clone() else {
            return Ok(0.0);
        };
        let served = self.clone();
        let runs = self.workers.on_each(move || {
            let started = std::time::Instant::now();
            served
                .infer(&inputs, None)
                .map(|_| started.elapsed().as_secs_f64())
        });
        if runs.len() != self.pool.workers() {
            return Err(Error::WarmupFailed(format!(
                "warming the worker threads: {} of {} ran",
                runs.len(),
                self.pool.workers()
            )));
        }
        runs.into_iter()
            .try_fold(0.0_f64, |slowest, run| match run {
                Ok(s) => Ok(slowest.max(s)),
                Err(Refusal::Request(m) | Refusal::Engine(m)) => Err(Error::WarmupFailed(format!(
                    "the fixture's first sample on a worker thread: {m}"
                ))),
            })
    }

    /// Runs one request: `inputs` must be exactly one profile's (names, shapes, types);
    /// `wanted` keeps those outputs (all when `None`; an unknown name is refused).
    pub fn infer(
        &self,
        inputs: &BTreeMap<String, HostTensor>,
        wanted: Option<&[String]>,
    ) -> std::result::Result<BTreeMap<String, HostTensor>, Refusal> {
        check_inputs(self.pool.first(), inputs).map_err(Refusal::Request)?;
        let outputs = self
            .pool
            .with(|engine| engine.run(inputs))
            .map_err(Refusal::Engine)?
            .map_err(|e| Refusal::Engine(e.to_string()))?;
        keep(outputs, wanted)
    }

    /// The fixture's first sample's inputs, when the volume has a fixture.
    pub fn warm_sample(&self) -> Option<&BTreeMap<String, HostTensor>> {
        self.warm_inputs.as_ref()
    }
}

/// `outputs` with only those `wanted` (all when `None`; an unknown name is refused). Pure.
pub fn keep(
    mut outputs: BTreeMap<String, HostTensor>,
    wanted: Option<&[String]>,
) -> std::result::Result<BTreeMap<String, HostTensor>, Refusal> {
    if let Some(wanted) = wanted {
        if let Some(unknown) = wanted.iter().find(|w| !outputs.contains_key(*w)) {
            return Err(Refusal::Request(format!(
                "output {unknown:?} is not one of the model's {:?}",
                outputs.keys().collect::<Vec<_>>()
            )));
        }
        outputs.retain(|k, _| wanted.contains(k));
    }
    Ok(outputs)
}

/// Why a request got no answer: the client's fault (400) or the engine's (500).
#[derive(Clone, Debug)]
pub enum Refusal {
    /// The request does not fit the model.
    Request(String),
    /// The engine failed on a request that fit.
    Engine(String),
}

/// The inputs must be one profile's, each with its element type. Pure.
pub fn check_inputs(
    engine: &dyn Engine,
    inputs: &BTreeMap<String, HostTensor>,
) -> std::result::Result<(), String> {
    let dtypes = engine.input_dtypes();
    for (name, t) in inputs {
        match dtypes.get(name) {
            None => {
                return Err(format!(
                    "input {name:?} is not one of the model's {:?}",
                    dtypes.keys().collect::<Vec<_>>()
                ));
            }
            Some(d) if *d != t.dtype => {
                return Err(format!(
                    "input {name:?} is {}, the model takes {}",
                    datatype(t.dtype).unwrap_or("?"),
                    datatype(*d).unwrap_or("?")
                ));
            }
            Some(_) => {}
        }
    }
    let profiles = engine.profiles();
    if fits_a_profile(&profiles, inputs) {
        return Ok(());
    }
    Err(format!(
        "inputs {:?} match none of the compiled profiles ({}); send one profile's shapes",
        shapes_of(inputs),
        describe_profiles(&profiles)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_cuda_settings_are_the_ones_served() {
        let manifest = kiln_node_core::test_support::manifest(serde_json::json!({
            "backend": "onnxruntime",
            "backendOptions": {
                "executionProvider": "cuda", "cuda.convAlgoSearch": "Heuristic",
                "cuda.arenaExtendStrategy": "SameAsRequested", "cuda.cudaGraphs": "true"
            }
        }));
        let cuda = settings_of(&manifest).cuda.expect("cuda settings");
        assert!(cuda.graphs());
        let back = kiln_crds::compiled_target::Backend {
            cuda: Some(cuda),
            execution_provider: Some(kiln_crds::compiled_target::ExecutionProvider::Cuda),
            ..BackendSpec::of(BackendKind::Onnxruntime)
        };
        let options = back.options(&Default::default());
        assert_eq!(
            options.get("cuda.convAlgoSearch").map(String::as_str),
            Some("Heuristic"),
            "the recorded search round-trips: {options:?}"
        );
        let cpu = kiln_node_core::test_support::manifest(serde_json::json!({"backend": "tract"}));
        assert!(settings_of(&cpu).cuda.is_none());
    }
}
