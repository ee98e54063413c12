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
//! the partition evidence ([`kiln_crds::placement::Placement`]). Reads the model and the
//! artifact, writes (fsynced) only the artifact path it is given and a private profile
//! directory beside the artifact.

mod artifact;
mod engine;
mod external;
mod graphs;
mod library;
mod profile;
mod terms;
mod values;

use std::path::Path;

use kiln_crds::compiled_target::{
    ArenaExtendStrategy, ConvAlgoSearch, CpuFallback, CpuFallbackPolicy, CudaSettings,
    ExecutionProvider, OptimizationLevel, Precision,
};
use ort::session::Session;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};

use super::archive::append;
use super::{Backend, CompileRequest, Compiled, Engine, GraphInterface, InputInfo, Shapes};
use artifact::{ArtifactConfig, CONFIG, MODEL, ProfileEntry, read_artifact};
use engine::OrtEngine;
use kiln_node_core::error::{Error, Result, chain};
pub use library::{MIN_RELEASE, Runtime, configure, library_path, runtime};
pub use profile::read_profile;
use terms::classify;
pub use terms::provider_name;
use values::{bind_profile, tensor_type, unsupported_io};

const MEDIA_TYPE: &str = "application/vnd.kiln.onnxruntime.optimized.v1.tar";

/// The ONNX Runtime backend as a target configures it.
pub struct OnnxRuntime {
    rt: &'static Runtime,
    level: OptimizationLevel,
    fallback: CpuFallback,
    cuda: CudaSettings,
}

/// What a session runs on: the provider and the options that follow from the precision and the
/// target's provider settings. Recorded in the artifact, so a node opens it exactly so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Device<'a> {
    provider: ExecutionProvider,
    precision: Precision,
    cuda: &'a CudaSettings,
}

impl OnnxRuntime {
    /// The backend for `spec`, loading the library if this is the first use.
    pub fn for_spec(spec: &kiln_crds::compiled_target::Backend) -> Result<Self> {
        Ok(Self {
            rt: runtime()?,
            level: spec.optimization_level.unwrap_or_default(),
            fallback: spec.cpu_fallback.clone().unwrap_or_default(),
            cuda: spec.cuda.clone().unwrap_or_default(),
        })
    }

    /// A session builder for this provider and fallback policy at `level`, saving the optimised
    /// graph to `save` and profiling into `profile` when given.
    fn builder(
        &self,
        device: Device<'_>,
        level: GraphOptimizationLevel,
        save: Option<&Path>,
        profile: Option<&Path>,
    ) -> ort::Result<SessionBuilder> {
        let provider = device.provider;
        let mut b = Session::builder(&self.rt.env)?.with_optimization_level(level)?;
        match provider {
            ExecutionProvider::Cpu => {}
            ExecutionProvider::Cuda => {
                b = b.with_execution_providers([cuda_provider(device).error_on_failure()])?;
            }
            ExecutionProvider::Tensorrt => {
                b = b.with_execution_providers([ort::ep::TensorRT::default()
                    .build()
                    .error_on_failure()])?;
            }
        }
        // Only `Strict` asks ONNX Runtime to refuse CPU nodes: under `Forbidden` the shape
        // nodes its GPU providers leave on the CPU on purpose are allowed, and the profile of
        // the first run decides (`backend::cpu_fallback::check`).
        if provider != ExecutionProvider::Cpu && self.fallback.policy == CpuFallbackPolicy::Strict {
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
        let cpu = Device {
            provider: ExecutionProvider::Cpu,
            precision: Precision::Fp32,
            cuda: &self.cuda,
        };
        self.builder(cpu, GraphOptimizationLevel::Disable, None, None)
            .map_err(|e| Error::CompileFailed(e.to_string()))
            .and_then(|mut b| {
                b.commit_from_file(model)
                    .map_err(|e| classify(e, "reading the model", Error::CompileFailed))
            })
    }
}

/// ONNX Runtime's CUDA provider as `device` asks for it ([`cuda_options`]).
fn cuda_provider(device: Device<'_>) -> ort::ep::ExecutionProviderDispatch {
    use ort::ep::ArbitrarilyConfigurableExecutionProvider;
    cuda_options(device)
        .into_iter()
        .fold(ort::ep::CUDA::default(), |ep, (key, value)| {
            ep.with_arbitrary_config(key, value)
        })
        .build()
}

/// The CUDA provider's options, by ONNX Runtime's names, as `device` asks for them. Pure.
/// TensorFloat-32 is on only for precision `tf32`: the provider's own default is on, which makes
/// an fp32 target miss a 1e-3 tolerance on real models (ResNet-50 2.4e-2) or silently serve a
/// lower precision. `enable_cuda_graph` is set only when on, as ONNX Runtime's default is off.
fn cuda_options(device: Device<'_>) -> Vec<(&'static str, &'static str)> {
    let search = match device.cuda.conv_algo_search.unwrap_or_default() {
        ConvAlgoSearch::Exhaustive => "EXHAUSTIVE",
        ConvAlgoSearch::Heuristic => "HEURISTIC",
        ConvAlgoSearch::Default => "DEFAULT",
    };
    let arena = match device.cuda.arena_extend_strategy.unwrap_or_default() {
        ArenaExtendStrategy::NextPowerOfTwo => "kNextPowerOfTwo",
        ArenaExtendStrategy::SameAsRequested => "kSameAsRequested",
    };
    let tf32 = if tf32_allowed(device.precision) {
        "1"
    } else {
        "0"
    };
    let mut options = vec![
        ("use_tf32", tf32),
        ("cudnn_conv_algo_search", search),
        ("arena_extend_strategy", arena),
    ];
    if device.cuda.graphs() {
        options.push(("enable_cuda_graph", "1"));
    }
    options
}

/// Whether matrix products may use TensorFloat-32: only when the target says `tf32`.
fn tf32_allowed(precision: Precision) -> bool {
    precision == Precision::Tf32
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

/// What this backend refuses to compile: a precision other than fp32 or tf32, untyped flags.
fn check_request(req: &CompileRequest<'_>) -> Result<()> {
    if !matches!(req.precision, Precision::Fp32 | Precision::Tf32) {
        return Err(Error::InvalidSpec(format!(
            "the onnxruntime backend compiles precision fp32 and tf32, not {}; set precision: fp32",
            req.precision.as_str()
        )));
    }
    if let Some(flag) = req.flags.keys().next() {
        return Err(Error::InvalidSpec(format!(
            "the onnxruntime backend takes typed settings, not flags; remove backend.flags.{flag} (see backend.executionProvider, optimizationLevel, cpuFallback)"
        )));
    }
    Ok(())
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
        check_request(req)?;
        let mut log = Vec::new();
        let scratch = req.out.parent().unwrap_or(Path::new("."));
        let work = tempfile::Builder::new()
            .prefix(".ort-compile-")
            .tempdir_in(scratch)
            .map_err(|e| Error::store(scratch, e))?;
        let optimized = work.path().join(MODEL);
        let device = Device {
            provider: req.provider,
            precision: req.precision,
            cuda: &self.cuda,
        };
        let session = self
            .builder(device, ort_level(self.level), Some(&optimized), None)
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
        self_contained(&graph)?;
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
        if req.provider == ExecutionProvider::Cuda {
            let options: Vec<String> = cuda_options(device)
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            log.push(format!("CUDA provider options: {}", options.join(" ")));
        }
        let config = ArtifactConfig {
            runtime_version: self.rt.version.clone(),
            runtime_sha256: self.rt.sha256.clone(),
            execution_provider: req.provider,
            optimization_level: self.level,
            cpu_fallback: self.fallback.clone(),
            precision: req.precision,
            cuda: self.cuda.clone(),
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
            resolved: Default::default(),
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
        // The provider, precision and CUDA settings are the artifact's (the compile key binds
        // them to the class).
        let device = Device {
            provider: config.execution_provider,
            precision: config.precision,
            cuda: &config.cuda,
        };
        let open = |backend: &Self| {
            backend
                .builder(
                    device,
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
            // The provider cannot take every node and cpuFallback is Strict. ONNX Runtime
            // does not say which nodes: open the graph once more with fallback allowed, only to
            // run the first fixture and name the nodes the CPU takes; that run then fails.
            Err(Error::UnsupportedOperator { operators, .. })
                if self.fallback.policy == CpuFallbackPolicy::Strict
                    && operators.iter().any(|m| m.contains("explicitly disabled")) =>
            {
                let diagnose = Self {
                    fallback: CpuFallback::default(),
                    cuda: self.cuda.clone(),
                    ..*self
                };
                (open(&diagnose)?, Some(operators.join("; ")))
            }
            Err(e) => return Err(e),
        };
        // CUDA graphs: runs go through fixed device tensors (`graphs.rs`).
        let graphs = (config.execution_provider == ExecutionProvider::Cuda && config.cuda.graphs())
            .then(|| graphs::Graphs::new(&session))
            .transpose()?;
        let mut engine = OrtEngine::new(
            session,
            config.profiles,
            config.execution_provider,
            Some(profile_dir),
        );
        engine.refused = refused;
        engine.graphs = graphs.map(std::sync::Mutex::new);
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

/// Refuses an optimised graph that still keeps tensors as external data: the artifact carries
/// the graph alone, so those weights would be read at load from whatever file is at that path
/// then, outside the artifact's digest ([`external`]). Fails closed, naming the way out.
fn self_contained(graph: &[u8]) -> Result<()> {
    use tract_onnx::prelude::Framework;
    let proto = tract_onnx::onnx()
        .proto_model_for_read(&mut &graph[..])
        .map_err(|e| {
            Error::CompileFailed(format!(
                "ONNX Runtime's optimised graph does not parse: {}",
                chain(&e)
            ))
        })?;
    let external = proto
        .graph
        .as_ref()
        .map(external::external_tensors)
        .unwrap_or_default();
    if external.is_empty() {
        return Ok(());
    }
    Err(Error::CompileFailed(format!(
        "ONNX Runtime's optimised graph keeps {} tensor(s) ({}) as ONNX external data beside the \
         source; an onnxruntime artifact carries the graph alone, so those weights would be read \
         unverified at load: kiln does not carry external data in onnxruntime artifacts yet; use \
         backend.kind: tract for this model",
        external.len(),
        external
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::terms::classify_message;
    use super::*;

    fn device(precision: Precision, cuda: &CudaSettings) -> Device<'_> {
        Device {
            provider: ExecutionProvider::Cuda,
            precision,
            cuda,
        }
    }

    #[test]
    fn an_optimised_graph_that_keeps_external_data_is_refused() {
        use prost::Message;
        use tract_onnx::pb::{GraphProto, ModelProto};
        let model = |external: bool| {
            let w = external::tensor("w0", external);
            ModelProto {
                ir_version: 8,
                graph: Some(GraphProto {
                    initializer: vec![w],
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec()
        };
        self_contained(&model(false)).expect("weights inside: kept");
        let err = self_contained(&model(true)).expect_err("weights outside the artifact");
        assert_eq!(err.reason(), kiln_crds::FailureReason::CompileFailed);
        let message = err.to_string();
        assert!(
            message.contains("w0") && message.contains("backend.kind: tract"),
            "{message}"
        );
    }

    #[test]
    fn cuda_options_follow_precision_and_settings() {
        let defaults = CudaSettings::default();
        assert_eq!(
            cuda_options(device(Precision::Fp32, &defaults)),
            vec![
                ("use_tf32", "0"),
                ("cudnn_conv_algo_search", "EXHAUSTIVE"),
                ("arena_extend_strategy", "kNextPowerOfTwo"),
            ],
            "fp32 is exact; no CUDA graphs unless asked"
        );
        let options = cuda_options(device(Precision::Tf32, &defaults));
        assert!(options.contains(&("use_tf32", "1")), "{options:?}");
        let graphs = CudaSettings {
            cuda_graphs: Some(true),
            conv_algo_search: Some(ConvAlgoSearch::Heuristic),
            arena_extend_strategy: Some(ArenaExtendStrategy::SameAsRequested),
        };
        assert_eq!(
            cuda_options(device(Precision::Fp32, &graphs)),
            vec![
                ("use_tf32", "0"),
                ("cudnn_conv_algo_search", "HEURISTIC"),
                ("arena_extend_strategy", "kSameAsRequested"),
                ("enable_cuda_graph", "1"),
            ]
        );
        let off = CudaSettings {
            cuda_graphs: Some(false),
            ..CudaSettings::default()
        };
        assert!(
            !cuda_options(device(Precision::Fp32, &off))
                .iter()
                .any(|(k, _)| *k == "enable_cuda_graph")
        );
    }

    #[test]
    fn a_refused_graph_capture_is_unsupported_and_says_what_to_do() {
        // ONNX Runtime's words when a graph has nodes off the CUDA provider or control flow.
        for message in [
            "This session cannot use the graph capture feature as requested by the user  as all compute graph nodes have not been partitioned to the CUDAExecutionProvider",
            "This session cannot use the CUDA Graph feature as requested by the user as the model has control flow nodes which can't be supported by CUDA Graphs.",
        ] {
            let err =
                classify_message(message.into(), "optimising the graph", Error::CompileFailed);
            assert_eq!(
                err.reason(),
                kiln_crds::FailureReason::UnsupportedOperator,
                "{err}"
            );
            let text = err.to_string();
            assert!(
                text.contains(
                    "backend.cuda.cudaGraphs needs every compute node on the CUDA provider"
                ) && text.contains(message),
                "{text}"
            );
        }
        let other = classify_message("out of memory".into(), "x", Error::CompileFailed);
        assert_eq!(other.reason(), kiln_crds::FailureReason::CompileFailed);
    }
}
