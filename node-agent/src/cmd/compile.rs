//! `kiln-agent compile`: the compile Job's worker. Reads the ModelArtifact and CompiledTarget the
//! operator put in its environment, checks that this node really is the class the Job was pinned
//! to, fetches and verifies every input (fail closed), compiles or reuses, stores artifact and
//! build manifest, and prints the manifest. On failure the termination message is
//! `Reason: message`, which the operator classifies.
//! Touches the store, a blob cache and the termination log; never the apiserver.

use std::path::PathBuf;
use std::process::ExitCode;

use kiln_crds::class::{ClassFacts, class_facts};
use kiln_crds::{CompiledTarget, ModelArtifact};
use kiln_store::{Entry, RegistryOptions};
use prometheus_client::registry::Registry;

use kiln_engines::backend;
use kiln_engines::host::probe;
use kiln_engines::metrics::Metrics;
use kiln_engines::pipeline::build::{
    Built, Publish, SourcePolicy, SourceTrustArgs, compile_or_reuse, fetch_inputs, key_for,
};
use kiln_engines::pipeline::fetch::{FetchLimits, Fetcher, SourceRegistry};
use kiln_engines::pipeline::spec::Spec;
use kiln_node_core::error::{Error, Result};

/// What the operator passes to a compile Job.
pub struct Job {
    /// `{"model": ModelArtifact, "target": CompiledTarget}` as JSON.
    pub spec_json: String,
    /// Class facts (label key → value) as JSON: what this node must probe as.
    pub class_facts_json: String,
    /// Compile key the operator computed; the worker must arrive at the same one.
    pub compile_key: String,
    /// Store URL (a directory, `file:///dir` or `oci://host/repository`).
    pub store: Option<String>,
    /// How to reach the registry of an `oci://` store.
    pub registry: RegistryOptions,
    /// Base directory for relative `file://` URIs.
    pub source_base: PathBuf,
    /// Bounds on fetching the inputs.
    pub fetch: FetchLimits,
    /// Signing key, trusted keys and the builder image for the provenance.
    pub publish: Publish,
    /// The directory an `exec` compiler's model is handed over in (see [`kiln_engines::backend::exec`]).
    pub handoff: Option<PathBuf>,
    /// Who may sign model sources.
    pub sources: SourcePolicy,
}

/// Which container of the compile Job this is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// Compile (or reuse), check parity, store and sign: the whole job, or the publisher of an
    /// `exec` Job, which builds the model the compiler container handed over.
    #[default]
    Publish,
    /// Only run an `exec` compiler and hand its model over; no store, no keys.
    Compiler,
}

/// What both stages start from: the objects, the backend, this node's facts, the checked key.
struct Prepared {
    spec: Spec,
    backend: kiln_engines::backend::Builder,
    expected: ClassFacts,
    host: kiln_crds::kiln_node::HardwareFacts,
}

fn prepare(job: &Job, handoff: Option<&std::path::Path>) -> Result<Prepared> {
    let objects: Objects = serde_json::from_str(&job.spec_json)
        .map_err(|e| Error::InvalidSpec(format!("KILN_COMPILE_SPEC: {e}")))?;
    let expected: ClassFacts = serde_json::from_str(&job.class_facts_json)
        .map_err(|e| Error::InvalidSpec(format!("KILN_CLASS_FACTS: {e}")))?;
    let spec = Spec::from_objects(objects.model, objects.target, &job.source_base)?;
    let t = &spec.target.spec;
    let host = probe::probe(backend::runtimes());
    let probed = class_facts(
        t.class_label_keys.iter().map(String::as_str),
        &probe::labels(&host),
    );
    check_class(&expected, &probed)?;
    let backend = backend::builder_for(&t.backend, &expected, handoff)?;
    // The class is what the operator grouped nodes by; the key must be the one it computed.
    let key = key_for(&spec, &backend, &expected);
    if key != job.compile_key {
        return Err(Error::IncompatibleRuntime(format!(
            "this worker computes compile key {key}, the operator expected {}; the agent image's backend ({} {}) differs from the operator's --backend-version",
            job.compile_key,
            backend.name(),
            backend.version()
        )));
    }
    Ok(Prepared {
        spec,
        backend,
        expected,
        host,
    })
}

/// The compiler container of an `exec` Job: fetches and verifies the source, runs the compiler,
/// leaves its model in the handoff directory. It has no store and no keys to leak.
pub async fn hand_off(job: &Job, metrics: &Metrics) -> Result<()> {
    let dir = job.handoff.as_deref().ok_or_else(|| {
        Error::InvalidSpec("--stage compiler needs --handoff (KILN_HANDOFF)".into())
    })?;
    let p = prepare(job, None)?;
    let t = &p.spec.target.spec;
    let exec = kiln_engines::backend::exec::Exec {
        command: t.backend.command.clone(),
        handoff: None,
    };
    let blobs = tempfile::tempdir().map_err(|e| Error::store(std::env::temp_dir(), e))?;
    let fetcher = Fetcher::new(
        blobs.path().to_path_buf(),
        metrics.clone(),
        job.fetch.clone(),
    )?;
    let inputs = fetch_inputs(&p.spec, &fetcher, None).await?;
    let profiles = p.spec.shapes()?;
    tokio::task::block_in_place(|| {
        exec.hand_off(
            &kiln_engines::backend::CompileRequest {
                model: &inputs.model,
                profiles: &profiles,
                precision: t.precision,
                provider: kiln_crds::compiled_target::ExecutionProvider::Cpu,
                flags: &t.backend.flags,
                out: &dir.join(kiln_engines::backend::exec::HANDOFF_MODEL),
                timeout: p.spec.compile_timeout(),
                memory_budget: None,
                chat_template: None,
                declared: None,
            },
            dir,
        )
    })
}

#[derive(serde::Deserialize)]
struct Objects {
    model: ModelArtifact,
    target: CompiledTarget,
}

/// Runs the compile; returns the stored entry and whether the store already held it.
pub async fn run(job: &Job, metrics: &Metrics) -> Result<Built> {
    let Prepared {
        spec,
        backend,
        expected,
        host,
    } = prepare(job, job.handoff.as_deref())?;
    let url = job.store.as_deref().ok_or_else(|| {
        Error::InvalidSpec("compile needs --store (KILN_STORE) to publish to".into())
    })?;
    let store = kiln_store::open(url, &job.registry)?;
    store.check_writable().await?;
    // A filesystem store keeps verified sources across compiles; otherwise they live as long as
    // this Job.
    let scratch;
    let blobs = match store.blob_cache() {
        Some(dir) => dir,
        None => {
            scratch = tempfile::tempdir().map_err(|e| Error::store(std::env::temp_dir(), e))?;
            scratch.path().to_path_buf()
        }
    };
    let fetcher = Fetcher::new(blobs, metrics.clone(), job.fetch.clone())?
        .with_registry(SourceRegistry::of_store(url, &job.registry));
    let inputs = fetch_inputs(&spec, &fetcher, Some(&job.sources)).await?;
    compile_or_reuse(
        &spec,
        &inputs,
        &backend,
        &expected,
        &host,
        store.as_ref(),
        &job.publish,
        metrics,
    )
    .await
}

/// Every hardware fact of the expected class must hold on this node exactly
/// ([`kiln_engines::host::compat::matches_class`]): the Job's node selector matched its labels, this checks
/// that they tell the truth about the hardware.
pub fn check_class(expected: &ClassFacts, probed: &ClassFacts) -> Result<()> {
    let wrong = kiln_engines::host::compat::matches_class(expected, probed);
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Error::IncompatibleHardware(format!(
            "this node does not match the class the Job was pinned to ({}); its node labels disagree with its hardware, fix the labels",
            kiln_engines::host::compat::describe(&wrong)
        )))
    }
}

/// Flags of `compile`; the operator sets every one in the Job's environment.
#[derive(clap::Args)]
pub struct Args {
    /// `{"model": ModelArtifact, "target": CompiledTarget}` as JSON.
    #[arg(long, env = "KILN_COMPILE_SPEC", hide_env_values = true)]
    spec: String,
    /// Class facts (label key → value) as JSON that this node must match.
    #[arg(long, env = "KILN_CLASS_FACTS")]
    class_facts: String,
    /// Compile key the operator expects.
    #[arg(long, env = "KILN_COMPILE_KEY")]
    compile_key: String,
    /// Artifact store: a directory (or `file:///dir`) shared with the operator, or
    /// `oci://HOST[:PORT]/REPOSITORY`. Required, except for `--stage compiler` (which has none).
    #[arg(long, env = "KILN_STORE")]
    store: Option<String>,
    #[command(flatten)]
    registry: kiln_store::RegistryArgs,
    /// Base directory for relative file:// URIs.
    #[arg(long, env = "KILN_SOURCE_BASE", default_value = ".")]
    source_base: PathBuf,
    /// Where the one-line outcome (`Reason: message` on failure) goes for the operator.
    #[arg(
        long,
        env = "KILN_TERMINATION_LOG",
        default_value = "/dev/termination-log"
    )]
    termination_log: PathBuf,
    #[command(flatten)]
    fetch: FetchLimits,
    #[command(flatten)]
    trust: kiln_store::TrustArgs,
    #[command(flatten)]
    sources: SourceTrustArgs,
    /// Which container of the Job this is (`compiler`: an exec Job's init container).
    #[arg(long, env = "KILN_COMPILE_STAGE", value_enum, default_value_t = Stage::Publish)]
    stage: Stage,
    /// Directory (an emptyDir) in which an exec compiler's model is handed to the publisher.
    #[arg(long, env = "KILN_HANDOFF")]
    handoff: Option<PathBuf>,
    /// The image this Job runs in, recorded in the provenance.
    #[arg(long, env = "KILN_BUILDER_IMAGE")]
    builder_image: Option<String>,
}

impl Args {
    /// The registry flags, for the credentials kiln_agent::secrets took out of the environment.
    pub fn registry_mut(&mut self) -> &mut kiln_store::RegistryArgs {
        &mut self.registry
    }
}

/// Compiles, prints the manifest as JSON, and leaves the one-line outcome in the termination log.
pub fn main(args: Args) -> ExitCode {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let Some(runtime) = super::runtime() else {
        return ExitCode::FAILURE;
    };
    let termination_log = args.termination_log.clone();
    let stage = args.stage;
    let loaded = args
        .trust
        .load()
        .map_err(Error::from)
        .and_then(|trust| Ok((trust, args.sources.load()?)));
    let outcome = loaded.and_then(|(trust, sources)| {
        let job = Job {
            sources,
            publish: Publish {
                trust,
                builder_image: args.builder_image,
            },
            handoff: args.handoff,
            spec_json: args.spec,
            class_facts_json: args.class_facts,
            compile_key: args.compile_key,
            store: args.store,
            registry: args.registry.options(),
            source_base: args.source_base,
            fetch: args.fetch,
        };
        match stage {
            Stage::Compiler => runtime
                .block_on(hand_off(&job, &metrics))
                .map(|()| "Compiled: model handed to the publisher".to_string()),
            Stage::Publish => runtime.block_on(run(&job, &metrics)).map(
                |Built {
                     entry: Entry { manifest, .. },
                     reused,
                 }| {
                    println!("{}", serde_json::to_string(&manifest).unwrap_or_default());
                    tracing::info!(digest = %manifest.artifact_digest, reused, "compile done");
                    format!(
                        "Compiled: sha256:{}{}",
                        manifest.artifact_digest,
                        if reused { " (already stored)" } else { "" }
                    )
                },
            ),
        }
    });
    let (line, code) = match outcome {
        Ok(line) => (line, ExitCode::SUCCESS),
        Err(e) => {
            tracing::error!(reason = %e.reason(), error = %e, ?stage, "compile failed");
            (format!("{}: {e}", e.reason()), ExitCode::FAILURE)
        }
    };
    // Best effort: outside a pod there may be no termination log.
    let _ = std::fs::write(&termination_log, line.as_bytes());
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_probed_facts_are_fine_and_mismatches_are_incompatible_hardware() {
        let expected = ClassFacts::from([("kubernetes.io/arch".into(), "amd64".into())]);
        let mut probed = expected.clone();
        probed.insert("kiln.dev/cpu-level".into(), "x86-64-v3".into());
        assert!(check_class(&expected, &probed).is_ok());
        // A pool label is not hardware: nothing to probe, the node selector matched it.
        let mut pooled = expected.clone();
        pooled.insert("example.com/pool".into(), "b".into());
        assert!(check_class(&pooled, &probed).is_ok());
        let gpu = ClassFacts::from([("nvidia.com/gpu.product".into(), "NVIDIA-L4".into())]);
        let err = check_class(&gpu, &probed).expect_err("no GPU here");
        assert_eq!(err.reason(), kiln_crds::FailureReason::IncompatibleHardware);
        assert!(err.to_string().contains("NVIDIA-L4"), "{err}");
    }
}
