//! Compiling with one backend: the verified inputs a compile reads, where and for whom it
//! builds, the compile itself with parity on the fixture and the placement check, and the build
//! manifest it returns. Below both `build.rs` (which fetches the inputs, reuses or stores) and
//! `candidates.rs` (which runs it once per engine of `backend.kind: auto`).
//! Writes only the artifact path it is given; runs the backend.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_crds::class::ClassFacts;
use kiln_crds::compiled_target::{BackendKind, ExecutionProvider};
use kiln_crds::engine::EngineCandidate;
use kiln_crds::kiln_node::HardwareFacts;
use kiln_crds::manifest::MANIFEST_VERSION;
use kiln_crds::model_artifact::ModelFormat;
use kiln_crds::{BuildManifest, CompileKeyInput, compile_key};
use kiln_store::staged::sha256_file;

use crate::backend::{Backend, CompileRequest, MemoryFit};
use crate::pipeline::fixtures::FixtureFile;
use crate::pipeline::isolate::task::{FixtureRef, Outcome, Task};
use crate::pipeline::spec::Spec;
use crate::pipeline::warmup;
use kiln_node_core::error::{Error, Result};

/// Verified local copies of everything a model run needs.
pub struct Inputs {
    /// The model source, alone in a private directory with the declared assets (named by their
    /// `name`): ONNX external data resolves inside the model's directory, so it can name only
    /// declared assets — never another model's blob in the shared cache.
    pub model: PathBuf,
    /// That directory; removed when the inputs go (`None`: staged by another process).
    pub(super) _staged: Option<tempfile::TempDir>,
    /// Asset name → path.
    pub assets: BTreeMap<String, PathBuf>,
    /// The warmup fixture, parsed.
    pub fixture: FixtureFile,
    /// sha256 of the fixture file.
    pub fixture_digest: String,
    /// The fixture file in the blob cache.
    pub fixture_path: PathBuf,
}

impl Inputs {
    /// Inputs another process fetched, verified and staged (the engine's process gets them
    /// so): the staged model and the fixture, re-checked against its digest by the caller.
    pub fn verified(model: PathBuf, fixture: FixtureFile, from: FixtureRef) -> Self {
        Self {
            model,
            _staged: None,
            assets: BTreeMap::new(),
            fixture,
            fixture_digest: from.sha256,
            fixture_path: from.path,
        }
    }

    /// Where the engine's process finds the fixture.
    pub fn fixture_ref(&self) -> FixtureRef {
        FixtureRef {
            path: self.fixture_path.clone(),
            sha256: self.fixture_digest.clone(),
        }
    }
}

/// The compile key of `spec` for a class, with the backend identity given.
pub fn key_with(spec: &Spec, identity: &str, class: &ClassFacts) -> String {
    compile_key(&CompileKeyInput::for_target(
        &spec.model.spec,
        &spec.target.spec,
        class,
        identity,
    ))
}

/// Where and for whom a compile builds.
pub struct Target<'a> {
    /// The class's facts.
    pub class: &'a ClassFacts,
    /// This machine's facts.
    pub host: &'a HardwareFacts,
    /// Where the artifact goes.
    pub out: &'a Path,
    /// Its compile key.
    pub key: &'a str,
}

/// Checks the declared interface against the graph where the model file names its tensors
/// (ONNX, GGUF). For a source that names none (an MLIR function) it returns the declaration,
/// which the backend binds to the function in order.
fn declared_for<'a>(
    spec: &'a Spec,
    backend: &dyn Backend,
    model: &Path,
) -> Result<Option<&'a kiln_crds::model_artifact::ModelArtifactSpec>> {
    let m = &spec.model.spec;
    if matches!(m.format, ModelFormat::Stablehlo | ModelFormat::Mlir) {
        return Ok(Some(m));
    }
    crate::pipeline::interface::check_declared(m, &backend.interface(model)?)?;
    Ok(None)
}

/// Compiles `spec` with one backend into `target.out`, checks parity on the fixture and the
/// placement against the CPU-fallback policy, and returns the build manifest.
pub fn compile(
    spec: &Spec,
    inputs: &Inputs,
    backend: &dyn Backend,
    target: &Target<'_>,
) -> Result<BuildManifest> {
    let Target {
        class,
        host,
        out,
        key,
    } = *target;
    let started = Instant::now();
    let t = &spec.target.spec;
    let profiles = spec.shapes()?;
    let out = out.to_path_buf();
    let declared = declared_for(spec, backend, &inputs.model)?;
    tracing::info!(compile_key = %key, backend = backend.name(), profiles = profiles.len(), "compiling");
    let compiled = backend.compile(&CompileRequest {
        model: &inputs.model,
        profiles: &profiles,
        precision: t.precision,
        provider: t.backend.provider_for(class),
        flags: &t.backend.flags,
        out: &out,
        timeout: spec.compile_timeout(),
        memory_budget: Some(MemoryFit {
            budget: crate::pipeline::ready::memory_budget(&t.warmup)?,
            class: class.clone(),
        }),
        chat_template: chat_template(spec, &inputs.model)?.as_deref(),
        declared,
    })?;
    // Parity of the compiled engine against the fixture's golden outputs, before anything is stored.
    let engine = backend.load(&out)?;
    let parity = warmup::check_samples(engine.as_ref(), &inputs.fixture, &t.warmup)?;
    let parity_max = parity.values().copied().fold(0.0, f64::max);
    let placement = engine.placement();
    if let Some(p) = &placement {
        crate::backend::cpu_fallback::check(
            backend.name(),
            &t.backend.cpu_fallback.clone().unwrap_or_default(),
            p,
        )?;
    }
    let (digest, size) = sha256_file(&out).map_err(|e| Error::store(&out, e))?;
    let mut input_digests = BTreeMap::from([
        ("model".to_string(), spec.model.spec.source.sha256.clone()),
        (
            format!("fixture/{}", inputs.fixture.version),
            inputs.fixture_digest.clone(),
        ),
    ]);
    for a in &spec.model.spec.assets {
        input_digests.insert(format!("asset/{}", a.name), a.sha256.clone());
    }
    let backend_options = backend_options(&spec.target.spec, class, compiled.resolved);
    let manifest = BuildManifest {
        manifest_version: MANIFEST_VERSION,
        compile_key: key.to_string(),
        artifact_digest: digest,
        artifact_size: size,
        media_type: backend.media_type().to_string(),
        backend: backend.name().to_string(),
        backend_version: backend.version(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        precision: t.precision.as_str().to_string(),
        profiles,
        class: class.clone(),
        host: host.clone(),
        flags: t.backend.flags.clone(),
        inputs: input_digests,
        outputs: compiled.outputs,
        unsupported_operators: Vec::new(),
        parity_max_abs_error: Some(parity_max),
        compile_seconds: started.elapsed().as_secs_f64(),
        converter_log: compiled.log,
        backend_options,
        runtime_digest: backend.runtime_digest(),
        bound_to: compiled
            .machine_bound
            .map(|why| kiln_crds::manifest::MachineBinding {
                arch: host.arch.clone(),
                cpu_level: host.cpu_level.clone(),
                why,
            }),
        placement,
        selection: None,
    };
    tracing::info!(compile_key = %key, digest = %manifest.artifact_digest, parity_max_abs_error = parity_max, "compiled; parity within tolerance");
    Ok(manifest)
}

/// The manifest's backend options: the target's settings for the class, what the compile
/// resolved, and for ONNX Runtime's CUDA provider what the precision means to it (llama.cpp's
/// engine computes fp32 whatever the device).
fn backend_options(
    t: &kiln_crds::compiled_target::CompiledTargetSpec,
    class: &ClassFacts,
    resolved: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut options = t.backend.options(class);
    options.extend(resolved);
    let llama = t.backend.kind == BackendKind::Llamacpp;
    if t.backend.provider_for(class) == ExecutionProvider::Cuda && !llama {
        let tf32 = t.precision == kiln_crds::compiled_target::Precision::Tf32;
        options.insert("cuda.useTf32".into(), tf32.to_string());
    }
    options
}

/// How long a compile may run when the target sets no `compile.activeDeadlineSeconds`.
const DEFAULT_COMPILE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3600);

/// [`compile`] (and with `measure`, [`measure`]) in the engine's
/// own process ([`crate::pipeline::isolate`]). `exec` stays in this process: its foreign compiler already
/// runs apart, in its own container or process group, and the tract build after it reads the
/// handoff only this process was given.
pub fn compile_isolated(
    spec: &Spec,
    inputs: &Inputs,
    backend: &dyn Backend,
    target: &Target<'_>,
    measure: bool,
) -> Result<(BuildManifest, Option<EngineCandidate>)> {
    if backend.name() == "exec" {
        let manifest = compile(spec, inputs, backend, target)?;
        let measured = measure
            .then(|| self::measure(spec, inputs, backend, target.out))
            .transpose()?;
        return Ok((manifest, measured));
    }
    let job = Task::Compile(Box::new(crate::pipeline::isolate::task::Compile {
        model: spec.model.clone(),
        target: spec.target.clone(),
        model_file: inputs.model.clone(),
        fixture: inputs.fixture_ref(),
        class: target.class.clone(),
        host: target.host.clone(),
        out: target.out.to_path_buf(),
        key: target.key.to_string(),
        measure,
    }));
    let what = format!("compiling {} with {}", target.key, backend.name());
    let deadline = spec.compile_timeout().unwrap_or(DEFAULT_COMPILE_DEADLINE);
    match crate::pipeline::isolate::parent::run(job, &what, deadline)?.outcome {
        Outcome::Compiled(c) => Ok((c.manifest, c.measured)),
        _ => Err(Error::EngineAnswer(format!(
            "{what}: the answer is not a compile's"
        ))),
    }
}

/// Load, first run, p50 and p99 over the target's warmup iterations, parity on each.
pub fn measure(
    spec: &Spec,
    inputs: &Inputs,
    backend: &dyn Backend,
    artifact: &Path,
) -> Result<EngineCandidate> {
    let started = Instant::now();
    let engine = backend.load(artifact)?;
    let load_seconds = started.elapsed().as_secs_f64();
    let w = warmup::warm(engine.as_ref(), &inputs.fixture, &spec.target.spec.warmup)?;
    Ok(EngineCandidate {
        parity_max_abs_error: Some(w.parity_max_abs_error),
        load_seconds: Some(load_seconds),
        first_seconds: Some(w.first_seconds),
        p50_seconds: Some(w.p50_seconds),
        p99_seconds: Some(w.p99_seconds),
        ..EngineCandidate::default()
    })
}

/// The staged chat template given beside the model (its one `chatTemplate` asset, staged by
/// name in the model's directory), if any. Two are refused: which one renders would be a guess.
fn chat_template(spec: &Spec, model: &Path) -> Result<Option<PathBuf>> {
    let given: Vec<&kiln_crds::model_artifact::Asset> = spec
        .model
        .spec
        .assets
        .iter()
        .filter(|a| a.kind == kiln_crds::model_artifact::AssetKind::ChatTemplate)
        .collect();
    match given.as_slice() {
        [] => Ok(None),
        [one] => Ok(model.parent().map(|d| d.join(&one.name))),
        more => Err(Error::InvalidSpec(format!(
            "spec.assets names {} chat templates ({}); give at most one asset of kind chatTemplate",
            more.len(),
            more.iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
