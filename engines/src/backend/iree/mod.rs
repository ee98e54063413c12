//! IREE, kiln's compiler engine: an ONNX model lowered through MLIR to machine code for one node
//! class by IREE's compiler ([`compile`]: the pinned PyPI wheel, run as a child process, with the
//! class's x86-64 level as its target CPU, never `host`), and run by IREE's runtime built into
//! kiln-agent ([`engine`]). Before a module is loaded, the targets it records are checked against
//! this CPU ([`target`]): IREE's runtime does not check, and a module with an instruction the
//! CPU lacks dies of SIGILL. [`terms`] reads the operators the compiler refused out of its errors.
//! The reference and the graph's interface are tract's reading of the same source. An MLIR source
//! (StableHLO or another input dialect) is compiled as it is, its function bound to the declared
//! inputs and outputs in order ([`source`]); it has no reference here.

mod artifact;
pub mod compile;
mod engine;
pub mod source;
pub mod target;
pub mod terms;

use std::collections::BTreeMap;
use std::path::Path;

use kiln_crds::compiled_target::{ExecutionProvider, Precision};

use super::tract::Tract;
use super::{Backend, CompileRequest, Compiled, Engine, GraphInterface, InputInfo, Shapes};
use artifact::{ArtifactConfig, CONFIG, MODULE, ProfileEntry};
use kiln_node_core::error::{Error, Result};
use source::Source;
use target::{ClassTarget, NoTarget};

const MEDIA_TYPE: &str = "application/vnd.kiln.iree.vmfb.v1.tar";

/// The IREE backend.
#[derive(Default)]
pub struct Iree {
    /// Where IREE's compiler tools are; `None`: `$KILN_IREE_BIN`, else `PATH`.
    pub compiler: Option<std::path::PathBuf>,
}

impl Backend for Iree {
    fn name(&self) -> &'static str {
        "iree"
    }

    fn version(&self) -> String {
        compile::VERSION.to_string()
    }

    /// The version and the revision of the flags (the target CPU is the class's, already in
    /// the key): `3.13.0+llvm-cpu.1`.
    fn identity(&self) -> String {
        format!("{}+{}", compile::VERSION, compile::FLAGS_REVISION)
    }

    fn media_type(&self) -> &'static str {
        MEDIA_TYPE
    }

    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled> {
        check_request(req)?;
        let cpu = cpu_for(req)?;
        let tools = compile::Tools::find(self.compiler.as_deref())?;
        let (built, config) = match Source::of(req.model).input_type() {
            None => compile_onnx(&tools, req, cpu)?,
            Some(input_type) => compile_mlir(&tools, req, cpu, input_type)?,
        };
        write_artifact(req.out, &config, &built.module)?;
        Ok(Compiled {
            outputs: config.outputs.clone(),
            log: built.log,
            machine_bound: None,
            resolved: BTreeMap::from([
                ("compilerVersion".into(), config.compiler_version.clone()),
                ("targetCpu".into(), cpu.to_string()),
                ("compilerFlags".into(), config.compiler_flags.join(" ")),
                ("moduleBytes".into(), built.module.len().to_string()),
            ]),
        })
    }

    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>> {
        let load_failed = |m: String| Error::LoadFailed(format!("{}: {m}", artifact.display()));
        let (config, module) = artifact::read_artifact(artifact).map_err(load_failed)?;
        if config.compiler_version != compile::VERSION {
            return Err(Error::IncompatibleRuntime(format!(
                "module compiled by IREE {}, this agent's runtime is IREE {}",
                config.compiler_version,
                compile::VERSION
            )));
        }
        check_module_fits(&module)?;
        Ok(Box::new(engine::IreeEngine::start(module, config)?))
    }

    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>> {
        onnx_only(model)?;
        Tract.reference(model, shapes)
    }

    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>> {
        onnx_only(model)?;
        Tract.inputs(model)
    }

    fn interface(&self, model: &Path) -> Result<GraphInterface> {
        onnx_only(model)?;
        Tract.interface(model)
    }
}

/// The reference and the interface are tract's reading of an ONNX source; an MLIR source has
/// neither (its interface is the declaration, bound by [`source::bind`]).
fn onnx_only(model: &Path) -> Result<()> {
    match Source::of(model) {
        Source::Onnx => Ok(()),
        _ => Err(Error::InvalidSpec(
            "kiln runs ONNX sources as the reference; for an MLIR source, make the fixture's golden outputs with the framework that exported it".into(),
        )),
    }
}

/// An ONNX source: imported (its inputs fixed to the one profile's shapes: code for one shape is
/// IREE's fast case, a symbolic dim costs it several times; several profiles share one module
/// with symbolic dims) and compiled; its interface is tract's reading of it.
fn compile_onnx(
    tools: &compile::Tools,
    req: &CompileRequest<'_>,
    cpu: &'static str,
) -> Result<(compile::Built, ArtifactConfig)> {
    let flags = compile::flags(cpu);
    let fixed = match req.profiles.values().collect::<Vec<_>>()[..] {
        [one] => Some(one),
        _ => None,
    };
    let built = compile::build(tools, req.model, fixed, &flags, req.timeout)?;
    // One reading of the source (it may be gigabytes): the inputs in order with their types,
    // the outputs in order.
    let graph = Tract.interface(req.model)?;
    let inputs = graph
        .inputs
        .into_iter()
        .map(|i| {
            let dtype = i.dtype.ok_or_else(|| {
                Error::CompileFailed(format!(
                    "the model states no element type for input {:?}",
                    i.name
                ))
            })?;
            Ok((i.name, dtype))
        })
        .collect::<Result<_>>()?;
    let outputs = graph.outputs.into_iter().map(|o| o.name).collect();
    let config = config_for(req.profiles, cpu, flags, &built, None, inputs, outputs);
    Ok((built, config))
}

/// An MLIR source (StableHLO, or another input dialect): its public function read by the
/// compiler's parser, bound to the declared inputs and outputs in order, then compiled as it is.
fn compile_mlir(
    tools: &compile::Tools,
    req: &CompileRequest<'_>,
    cpu: &'static str,
    input_type: &str,
) -> Result<(compile::Built, ArtifactConfig)> {
    let declared = req.declared.ok_or_else(|| {
        Error::InvalidSpec("an MLIR source is compiled against its ModelArtifact's inputs and outputs, and none were given".into())
    })?;
    let funcs = compile::signature(tools, req.model, req.timeout)?;
    let func = source::entry(&funcs).map_err(Error::InvalidSpec)?;
    source::check_dialect(Source::of(req.model), func).map_err(Error::InvalidSpec)?;
    let (inputs, outputs) = source::bind(&declared.inputs, &declared.outputs, func, req.profiles)
        .map_err(Error::InvalidSpec)?;
    let mut flags = compile::flags(cpu);
    flags.push(format!("--iree-input-type={input_type}"));
    let built = compile::build_mlir(tools, req.model, &flags, func.name.clone(), req.timeout)?;
    let module = func.module.clone();
    let config = config_for(req.profiles, cpu, flags, &built, module, inputs, outputs);
    Ok((built, config))
}

/// What the IREE backend refuses to build: another precision, flags, a GPU provider this
/// runtime cannot run.
fn check_request(req: &CompileRequest<'_>) -> Result<()> {
    if req.precision != Precision::Fp32 {
        return Err(Error::InvalidSpec(format!(
            "the iree backend compiles precision fp32 only, not {}; set precision: fp32",
            req.precision.as_str()
        )));
    }
    if let Some(flag) = req.flags.keys().next() {
        return Err(Error::InvalidSpec(format!(
            "the iree backend takes no flags (its target is the class's); remove backend.flags.{flag}"
        )));
    }
    Ok(())
}

/// The target CPU for the request's class: its level, or the x86-64 baseline where the class
/// does not key on it. The class's facts come with the memory fit (absent only where no class's
/// artifact is built: then the baseline). A GPU class with a compute capability IREE has code
/// for still fails: this runtime is built without IREE's CUDA driver.
fn cpu_for(req: &CompileRequest<'_>) -> Result<&'static str> {
    let class = req
        .memory_budget
        .as_ref()
        .map(|m| m.class.clone())
        .unwrap_or_default();
    let gpu = !matches!(req.provider, ExecutionProvider::Cpu);
    match target::class_target(&class, gpu) {
        Ok(ClassTarget::Cpu(cpu)) => Ok(cpu),
        Ok(ClassTarget::Cuda(arch)) => Err(Error::IncompatibleRuntime(format!(
            "IREE compiles this class's {arch}, but kiln-agent's IREE runtime is built without its CUDA driver; set backend.executionProvider: cpu"
        ))),
        Err(NoTarget::Hardware(m)) => Err(Error::IncompatibleHardware(m)),
        Err(NoTarget::Unstated(m)) => Err(Error::InvalidSpec(m)),
    }
}

/// How the module is called: its module and function, the inputs in call order with their types
/// and the outputs in return order, and the target's profiles.
fn config_for(
    profiles: &BTreeMap<String, Shapes>,
    cpu: &str,
    flags: Vec<String>,
    built: &compile::Built,
    module: Option<String>,
    inputs: Vec<(String, safetensors::Dtype)>,
    outputs: Vec<String>,
) -> ArtifactConfig {
    ArtifactConfig {
        compiler_version: compile::VERSION.to_string(),
        target_cpu: cpu.to_string(),
        compiler_flags: flags,
        function: built.function.clone(),
        module,
        inputs,
        outputs,
        profiles: profiles
            .iter()
            .map(|(name, shapes)| ProfileEntry {
                name: name.clone(),
                inputs: shapes.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            })
            .collect(),
    }
}

fn write_artifact(out: &Path, config: &ArtifactConfig, module: &[u8]) -> Result<()> {
    let json = serde_json::to_vec_pretty(config)
        .map_err(|e| Error::CompileFailed(format!("{CONFIG}: {e}")))?;
    let mut tar = tar::Builder::new(Vec::new());
    super::archive::append(&mut tar, CONFIG, &json)?;
    super::archive::append(&mut tar, MODULE, module)?;
    let bytes = tar
        .into_inner()
        .map_err(|e| Error::CompileFailed(format!("archiving the module: {e}")))?;
    std::fs::write(out, bytes).map_err(|e| Error::store(out, e))
}

/// `IncompatibleHardware` when the module asks for CPU features this machine lacks, or records
/// no target kiln can read (fail closed); a GPU module is refused likewise.
fn check_module_fits(module: &[u8]) -> Result<()> {
    let targets = target::recorded_targets(module);
    if targets.is_empty() {
        return Err(Error::IncompatibleHardware(
            "the module records no executable target kiln can read, so nothing says this CPU can run it".into(),
        ));
    }
    for t in &targets {
        if t.backend != "llvm-cpu" {
            return Err(Error::IncompatibleRuntime(format!(
                "the module holds {} code ({}), which kiln-agent's IREE runtime does not run",
                t.backend, t.cpu
            )));
        }
        let missing = target::missing_features(t, target::host_has);
        if !missing.is_empty() {
            return Err(Error::IncompatibleHardware(format!(
                "the module was compiled for CPU {:?} and uses {}, which this CPU lacks",
                t.cpu,
                missing.join(", ")
            )));
        }
    }
    Ok(())
}
