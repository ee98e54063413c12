//! `kiln-agent local`: the whole pipeline on one machine, no cluster — probe, fetch and verify,
//! compile or reuse, re-verify, load, warm with parity, and only then ready.
//! Touches the store directory (artifacts, blobs, the pulled copy under `cache/`, the embedded
//! example) and the metrics file; never a cluster.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kiln_crds::FailureReason;
use kiln_crds::class::{class_facts, class_id};
use kiln_store::FsStore;
use prometheus_client::registry::Registry;
use serde::Serialize;

use kiln_engines::backend;
use kiln_engines::host::probe;
use kiln_engines::metrics::Metrics;
use kiln_engines::pipeline::build::{
    Built, Publish, SourceTrustArgs, compile_or_reuse, fetch_inputs, key_for,
};
use kiln_engines::pipeline::fetch::{FetchLimits, Fetcher, SourceRegistryArgs};
use kiln_engines::pipeline::ready::{load_warm, pull_verified};
use kiln_engines::pipeline::spec::Spec;
use kiln_node_core::error::{Error, Result};
use kiln_store::TrustArgs;

/// The outcome of a local run; with `--output json` this is the last line on stdout.
#[derive(Serialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// Verified, loaded, warmed within tolerance (and budget).
    pub ready: bool,
    /// Failure reason when not ready.
    pub reason: Option<FailureReason>,
    /// What went wrong, or what was done.
    pub message: String,
    /// This machine's class id.
    pub class: Option<String>,
    /// Compile key of the artifact.
    pub compile_key: Option<String>,
    /// sha256 of the artifact.
    pub artifact_digest: Option<String>,
    /// Whether the store already held the artifact.
    pub cache_hit: bool,
    /// Seconds the compile took (0 on a cache hit).
    pub compile_seconds: f64,
    /// Largest absolute output error in warmup.
    pub parity_max_abs_error: Option<f64>,
    /// Seconds to load the engine.
    pub load_seconds: Option<f64>,
    /// Seconds of warmup.
    pub warmup_seconds: Option<f64>,
    /// Latency of the first (cold) fixture run.
    pub first_seconds: Option<f64>,
    /// Steady-state median latency.
    pub p50_seconds: Option<f64>,
    /// Steady-state p99 latency.
    pub p99_seconds: Option<f64>,
    /// Latency of the first fixture run after warmup (what a first request finds).
    pub first_request_seconds: Option<f64>,
    /// Which execution provider ran which nodes in warmup.
    pub placement: Option<kiln_crds::placement::Placement>,
    /// Resident memory the engine added at its peak in load and warmup.
    pub peak_memory_bytes: Option<u64>,
    /// GPU memory this process held at its peak after load and warmup (NVML; absent where
    /// nothing was measured: no GPU, no NVML).
    pub peak_device_memory_bytes: Option<u64>,
    /// A language model's prefill (time to first token) and decode rate in warmup.
    pub generation: Option<kiln_crds::llamacpp::Generation>,
    /// The engine that serves (`tract`, `onnxruntime/cpu`, `onnxruntime/cuda`).
    pub engine: Option<String>,
    /// `backend.kind: auto`: why the compile kept that engine.
    pub engine_reason: Option<String>,
    /// `backend.kind: auto`: every candidate the compile tried (empty otherwise, or when the
    /// artifact was found in the store: then the stored manifest's are shown).
    pub candidates: Vec<kiln_crds::engine::EngineCandidate>,
}

/// How `local` treats this machine.
pub struct Machine {
    /// How long loading, and then warming, may each take.
    pub warm_deadline: std::time::Duration,
    /// `--cpu-level`: the x86-64 level the class is taken to have, at most this CPU's.
    pub cpu_level: Option<String>,
}

impl Machine {
    /// This machine's facts as the class it stands for: the probed ones, with the CPU level
    /// lowered to `--cpu-level` (a node of that level would get that class's artifact; this
    /// CPU runs it as it runs everything a lower level runs). A level above the probed one is
    /// refused: this CPU cannot stand for it.
    fn as_class(
        &self,
        mut host: kiln_crds::kiln_node::HardwareFacts,
    ) -> Result<kiln_crds::kiln_node::HardwareFacts> {
        use kiln_engines::host::compat::cpu_level_rank;
        let Some(level) = &self.cpu_level else {
            return Ok(host);
        };
        let known = ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"];
        if !known.contains(&level.as_str())
            || cpu_level_rank(level) > cpu_level_rank(&host.cpu_level)
        {
            return Err(Error::InvalidSpec(format!(
                "--cpu-level {level:?}: this CPU is {}; give it or a lower x86-64 level ({})",
                host.cpu_level,
                known.join(", ")
            )));
        }
        host.cpu_level.clone_from(level);
        Ok(host)
    }
}

/// Runs the pipeline for the YAML at `file` with the store at `store_dir`.
pub async fn run(
    file: &Path,
    store_dir: &Path,
    metrics: &Metrics,
    fetch: (&FetchLimits, &SourceRegistryArgs),
    trust: &TrustArgs,
    sources: &SourceTrustArgs,
    machine: &Machine,
) -> Outcome {
    let mut outcome = Outcome::default();
    match pipeline(
        file,
        store_dir,
        metrics,
        fetch,
        (trust, sources),
        machine,
        &mut outcome,
    )
    .await
    {
        Ok(()) => outcome.ready = true,
        Err(err) => {
            metrics.failure(err.reason());
            outcome.reason = Some(err.reason());
            outcome.message = err.to_string();
        }
    }
    if let Some(class) = &outcome.class {
        metrics.ready(class, outcome.ready);
    }
    outcome
}

async fn pipeline(
    file: &Path,
    store_dir: &Path,
    metrics: &Metrics,
    (fetch, registry): (&FetchLimits, &SourceRegistryArgs),
    (trust, sources): (&TrustArgs, &SourceTrustArgs),
    machine: &Machine,
    outcome: &mut Outcome,
) -> Result<()> {
    // With no key given, the store signs itself with a key of its own (created on first use),
    // so an entry rewritten by someone without that key is refused like in a cluster.
    let trust = match (&trust.signing_key, &trust.trust_key) {
        (None, None) => kiln_store::local_key::trust(store_dir)?,
        _ => trust.load()?,
    };
    let publish = Publish {
        trust,
        builder_image: None,
    };
    let spec = Spec::load(file)?;
    let t = &spec.target.spec;
    let host = machine.as_class(probe::probe(backend::runtimes()))?;
    let labels = probe::labels(&host);
    let class = class_facts(t.class_label_keys.iter().map(String::as_str), &labels);
    let id = class_id(&class);
    tracing::info!(class = %id, cpu = %host.cpu_level, gpus = host.accelerators.len(), "probed this machine");
    let builder = backend::builder_for(&t.backend, &class, None)?;
    outcome.class = Some(id.clone());
    outcome.compile_key = Some(key_for(&spec, &builder, &class));

    let store = FsStore::open(store_dir)?;
    let fetcher = Fetcher::new(store.blobs(), metrics.clone(), fetch.clone())?
        .with_registry(registry.registry());
    let inputs = fetch_inputs(&spec, &fetcher, Some(&sources.load()?)).await?;

    let Built {
        entry,
        reused: cache_hit,
    } = compile_or_reuse(
        &spec, &inputs, &builder, &class, &host, &store, &publish, metrics,
    )
    .await?;
    let manifest = &entry.manifest;
    record_build(outcome, manifest, cache_hit);

    // The same path a node takes: pull by digest into a cache, verified while it streams.
    let cached = store_dir.join("cache").join(&manifest.artifact_digest);
    let manifest = pull_verified(
        &store,
        &publish.trust,
        &entry.artifact_ref(),
        &cached,
        metrics,
    )
    .await?;
    // Loaded by the backend the verified manifest names: for `auto`, the kept candidate's.
    let backend = backend::for_artifact(&t.backend, &manifest)?;
    outcome.engine = Some(manifest.engine());
    let labels = kiln_engines::metrics::TargetLabels {
        namespace: spec.target.metadata.namespace.clone().unwrap_or_default(),
        target: spec.target.metadata.name.clone().unwrap_or_default(),
        class: id.clone(),
    };
    let ready = blocking(|| {
        load_warm(
            &manifest,
            &cached,
            backend.as_ref(),
            &class,
            inputs.fixture_ref(),
            &spec.target,
            &labels,
            kiln_engines::pipeline::ready::gpu_memory(&host),
            machine.warm_deadline.saturating_mul(2),
            metrics,
        )
    })
    // What failed to load or warm is not kept as a ready copy: the next run pulls it again
    // from the store, verified.
    .inspect_err(|_| {
        let _ = std::fs::remove_file(&cached);
    })?;
    record_ready(
        outcome,
        spec.target.metadata.name.as_deref().unwrap_or("target"),
        &ready,
    );
    Ok(())
}

/// What the build says in the outcome: cache hit, compile time, digest, the engine choice.
fn record_build(outcome: &mut Outcome, manifest: &kiln_crds::BuildManifest, cache_hit: bool) {
    outcome.cache_hit = cache_hit;
    outcome.compile_seconds = if cache_hit {
        0.0
    } else {
        manifest.compile_seconds
    };
    outcome.artifact_digest = Some(manifest.artifact_digest.clone());
    if let Some(selection) = &manifest.selection {
        outcome.engine_reason = Some(selection.reason.clone());
        outcome.candidates.clone_from(&selection.candidates);
    }
}

/// What load and warmup measured, in the outcome.
fn record_ready(outcome: &mut Outcome, name: &str, ready: &kiln_engines::pipeline::ready::Ready) {
    let w = &ready.warmup;
    outcome.parity_max_abs_error = Some(w.parity_max_abs_error);
    outcome.load_seconds = Some(ready.load_seconds);
    outcome.warmup_seconds = Some(w.total_seconds);
    outcome.first_seconds = Some(w.first_seconds);
    outcome.p50_seconds = Some(w.p50_seconds);
    outcome.p99_seconds = Some(w.p99_seconds);
    outcome.first_request_seconds = Some(w.first_request_seconds);
    outcome.placement = w.placement.clone();
    outcome.peak_memory_bytes = w.peak_memory_bytes;
    outcome.peak_device_memory_bytes = w.peak_device_memory_bytes;
    outcome.generation = w.generation;
    outcome.message = format!(
        "{} verified, loaded and warmed: {} iterations, parity max abs error {:.3e}",
        name, w.iterations, w.parity_max_abs_error
    );
}

/// Runs CPU-bound work off the async workers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The embedded example: SqueezeNet (light variant from the ONNX project's backend test data),
/// its fixture and its YAML, so `kiln-agent local` runs with no file at all.
const EXAMPLE_YAML: &str = include_str!("../../../examples/squeezenet/kiln.yaml");
const EXAMPLE_MODEL: &[u8] = include_bytes!("../../../examples/squeezenet/model.onnx");
const EXAMPLE_FIXTURE: &[u8] =
    include_bytes!("../../../examples/squeezenet/fixture-v1.safetensors");

/// Writes the embedded example into `<store>/example/` and returns the YAML's path.
pub fn unpack_example(store: &Path) -> std::io::Result<PathBuf> {
    let dir = store.join("example");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("model.onnx"), EXAMPLE_MODEL)?;
    std::fs::write(dir.join("fixture-v1.safetensors"), EXAMPLE_FIXTURE)?;
    let yaml = dir.join("kiln.yaml");
    std::fs::write(&yaml, EXAMPLE_YAML)?;
    Ok(yaml)
}

/// Flags of `local`.
#[derive(clap::Args)]
pub struct Args {
    /// Multi-document YAML with one ModelArtifact and one CompiledTarget.
    #[arg(env = "KILN_LOCAL_FILE")]
    file: Option<PathBuf>,
    /// Content-addressed store directory (artifacts, manifests, verified source blobs).
    #[arg(long, env = "KILN_STORE")]
    store: Option<PathBuf>,
    /// `json` makes the last stdout line one JSON object with the outcome.
    #[arg(long, env = "KILN_OUTPUT", value_enum, default_value_t = Output::Plain)]
    output: Output,
    /// Write the metrics here after the run (Prometheus text 0.0.4, as `promtool` reads).
    #[arg(long, env = "KILN_METRICS_FILE")]
    metrics_file: Option<PathBuf>,
    #[command(flatten)]
    fetch: FetchLimits,
    #[command(flatten)]
    source_registry: SourceRegistryArgs,
    #[command(flatten)]
    trust: TrustArgs,
    #[command(flatten)]
    sources: SourceTrustArgs,
    /// Seconds loading, and then warming, the engine may each take (the engine's process is
    /// killed past both together), as `run`'s flag of the same name.
    #[arg(long, env = "KILN_WARMUP_DEADLINE_SECONDS", default_value_t = 600)]
    warmup_deadline_seconds: u64,
    /// Run as a node of this x86-64 level would (`x86-64`, `x86-64-v2` … `-v4`, at most this
    /// CPU's): the class, and so the compile key and the code an `iree` target gets, are that
    /// level's.
    #[arg(long, env = "KILN_LOCAL_CPU_LEVEL")]
    cpu_level: Option<String>,
}

/// What stdout gets.
#[derive(Clone, Copy, clap::ValueEnum, PartialEq)]
enum Output {
    Plain,
    Json,
}

/// Runs the pipeline once and prints the outcome; success only when ready.
pub fn main(args: Args) -> ExitCode {
    let store = args.store.unwrap_or_else(default_store);
    let file = match args.file {
        Some(f) => f,
        None => match unpack_example(&store) {
            Ok(f) => f,
            Err(e) => {
                eprintln!(
                    "kiln-agent: cannot unpack the embedded example into {}: {e}",
                    store.display()
                );
                return ExitCode::FAILURE;
            }
        },
    };
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let Some(runtime) = super::runtime() else {
        return ExitCode::FAILURE;
    };
    let outcome = runtime.block_on(run(
        &file,
        &store,
        &metrics,
        (&args.fetch, &args.source_registry),
        &args.trust,
        &args.sources,
        &Machine {
            warm_deadline: std::time::Duration::from_secs(args.warmup_deadline_seconds.max(1)),
            cpu_level: args.cpu_level,
        },
    ));
    if let Some(path) = args.metrics_file
        && let Err(e) = std::fs::write(&path, kiln_endpoints::exposition::encode(&registry, None).0)
    {
        eprintln!(
            "kiln-agent: cannot write metrics to {}: {e}",
            path.display()
        );
    }
    match args.output {
        Output::Json => println!("{}", serde_json::to_string(&outcome).unwrap_or_default()),
        Output::Plain => print_plain(&outcome),
    }
    if outcome.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_plain(outcome: &Outcome) {
    if !outcome.ready {
        let reason = outcome.reason.map(|r| r.as_str()).unwrap_or("Unknown");
        println!("NOT READY {reason}: {}", outcome.message);
        return;
    }
    let ms = |s: Option<f64>| {
        s.map(|s| format!("{:.2} ms", s * 1000.0))
            .unwrap_or_default()
    };
    println!("READY {}", outcome.message);
    println!(
        "  class            {}",
        outcome.class.as_deref().unwrap_or_default()
    );
    println!(
        "  compile key      {}",
        outcome.compile_key.as_deref().unwrap_or_default()
    );
    println!(
        "  artifact sha256  {}",
        outcome.artifact_digest.as_deref().unwrap_or_default()
    );
    println!(
        "  compile          {}",
        if outcome.cache_hit {
            "reused from store".to_string()
        } else {
            format!("{:.2} s", outcome.compile_seconds)
        }
    );
    println!("  load             {}", ms(outcome.load_seconds));
    println!("  warmup           {}", ms(outcome.warmup_seconds));
    println!(
        "  first / p50 / p99 {} / {} / {}",
        ms(outcome.first_seconds),
        ms(outcome.p50_seconds),
        ms(outcome.p99_seconds)
    );
    if let (Some(first), Some(p50)) = (outcome.first_request_seconds, outcome.p50_seconds) {
        println!(
            "  first request    {} after Ready ({:.2}x the steady p50)",
            ms(Some(first)),
            first / p50.max(f64::MIN_POSITIVE)
        );
    }
    if let Some(peak) = outcome.peak_memory_bytes {
        println!(
            "  peak memory      {} above the baseline in load and warmup",
            kiln_engines::host::memory::human(peak as usize)
        );
    }
    if let Some(g) = &outcome.generation {
        println!(
            "  generation       {} prompt tokens: first token {}; {} more at {:.1} tokens/s (median of {} warmup runs)",
            g.prompt_tokens,
            ms(Some(g.prefill_seconds)),
            g.generated_tokens.saturating_sub(1),
            g.decode_tokens_per_second,
            g.runs
        );
        if let (Some(p), Some(d)) = (
            g.first_request_prefill_seconds,
            g.first_request_decode_tokens_per_second,
        ) {
            println!(
                "  first request    first token {}; {d:.1} tokens/s",
                ms(Some(p))
            );
        }
    }
    if let Some(peak) = outcome.peak_device_memory_bytes {
        println!(
            "  peak GPU memory  {} held by this process after load and warmup",
            kiln_engines::host::memory::human(peak as usize)
        );
    }
    if let Some(p) = &outcome.placement {
        let nodes: Vec<String> = p.nodes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "  placement        asked {}; nodes {}; {} partition(s); CPU fallback {:.1}%",
            p.requested,
            nodes.join(", "),
            p.partitions,
            p.fallback_share * 100.0
        );
        println!(
            "  kernel time      {} on all providers; CPU fallback {:.1}% of it ({} shape, {} compute node(s)); {} transfer(s), {}",
            ms(Some(p.total_kernel_seconds())),
            p.fallback_time_share * 100.0,
            p.shape_node_count,
            p.compute_node_count,
            p.transfer_count,
            ms(Some(p.transfer_seconds))
        );
    }
}

/// `$XDG_CACHE_HOME/kiln/store`, else `~/.cache/kiln/store`, else under the temp directory.
fn default_store() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("kiln").join("store")
}
