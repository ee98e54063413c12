//! kiln-agent: `run` (the DaemonSet), `local` (whole pipeline, no cluster), `compile` (the
//! compile Job's worker), `install` (its init container for foreign compiler images),
//! `fixtures`, `probe`, `bench-verify`, `bench-pull`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kiln_agent::backend;
use kiln_agent::cmd::{bench_verify as bench, fixtures as make_fixtures, local};
use kiln_agent::metrics;
use kiln_agent::pipeline::probe;
use prometheus_client::registry::Registry;

#[derive(Parser)]
#[command(
    name = "kiln-agent",
    version,
    about = "kiln node agent: compile, verify, load, warm, report ready"
)]
struct Cli {
    /// Log format on stderr (default: json for `run`, plain otherwise).
    #[arg(long, env = "KILN_LOG_FORMAT", value_enum, global = true)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Plain,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Output {
    Plain,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// The node agent (DaemonSet): pull, verify, load and warm the artifact of every
    /// CompiledTarget that selects this node; report on its KilnNode and pod readiness gates.
    Run {
        /// This node's name (downward API `spec.nodeName`).
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
        /// Node cache directory (a hostPath): verified artifacts, fixtures, the known-good index.
        #[arg(long, env = "KILN_CACHE", default_value = "/var/lib/kiln/cache")]
        cache: PathBuf,
        /// Artifact store: a path or file:///path (filesystem store), or
        /// oci://HOST[:PORT]/REPOSITORY (pulled by digest only).
        #[arg(long, env = "KILN_STORE", default_value = "/var/lib/kiln/store")]
        store: String,
        #[command(flatten)]
        registry: kiln_store::RegistryArgs,
        /// Base directory for relative file:// URIs of fixtures.
        #[arg(long, env = "KILN_SOURCE_BASE", default_value = ".")]
        source_base: PathBuf,
        /// Address for /metrics, /healthz and /readyz.
        #[arg(long, env = "KILN_LISTEN", default_value = "0.0.0.0:8080")]
        listen: std::net::SocketAddr,
        /// Seconds before an artifact that failed is tried again; doubles per failure in a row, up
        /// to 10 minutes.
        #[arg(long, env = "KILN_RETRY_SECONDS", default_value_t = 60)]
        retry_seconds: u64,
        /// Seconds between passes when nothing changes.
        #[arg(long, env = "KILN_RESYNC_SECONDS", default_value_t = 30)]
        resync_seconds: u64,
    },
    /// Run the whole pipeline on this machine for one ModelArtifact + CompiledTarget YAML.
    /// Without FILE, runs the embedded example (SqueezeNet from the ONNX test data).
    Local {
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
    },
    /// Make a versioned fixture file (safetensors) from a model, with golden outputs from the
    /// reference execution.
    Fixtures {
        /// ONNX model.
        #[arg(long, env = "KILN_FIXTURE_MODEL")]
        model: PathBuf,
        /// Fixture version to record.
        #[arg(long = "fixture-version", env = "KILN_FIXTURE_VERSION")]
        version: String,
        /// Shape of an input with symbolic dims: NAME=D0,D1,... (repeatable).
        #[arg(long = "shape", env = "KILN_FIXTURE_SHAPES", value_delimiter = ';')]
        shapes: Vec<String>,
        /// Safetensors file with given input tensors, named like the inputs.
        #[arg(long, env = "KILN_FIXTURE_INPUTS")]
        inputs: Option<PathBuf>,
        /// Seed for random inputs.
        #[arg(long, env = "KILN_FIXTURE_SEED", default_value_t = 42)]
        seed: u64,
        /// Suggested absolute tolerance, recorded in metadata.
        #[arg(long, env = "KILN_FIXTURE_ATOL")]
        atol: Option<f64>,
        /// Suggested relative tolerance, recorded in metadata.
        #[arg(long, env = "KILN_FIXTURE_RTOL")]
        rtol: Option<f64>,
        /// Output file.
        #[arg(long, short, env = "KILN_FIXTURE_OUT")]
        out: PathBuf,
    },
    /// Compile Job worker: compile one (ModelArtifact, CompiledTarget, class) into the store and
    /// print the build manifest as JSON. The operator sets every input in the Job's environment.
    Compile {
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
        /// `oci://HOST[:PORT]/REPOSITORY`.
        #[arg(long, env = "KILN_STORE")]
        store: String,
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
    },
    /// Init container of a compile Job with a foreign compiler image: copy this binary, its
    /// dynamic loader and libraries into DIR (an emptyDir the compiler container mounts) and
    /// check that the copy runs.
    Install {
        /// Target directory (created if missing).
        dir: PathBuf,
    },
    /// Print this machine's hardware facts and class labels as JSON.
    Probe,
    /// Measure a verified pull of a large artifact from a local docker-registry into a cache
    /// directory against `curl -o` followed by `sha256sum`, in the same run.
    BenchPull {
        /// Artifact size in MiB.
        #[arg(long, env = "KILN_BENCH_SIZE_MIB", default_value_t = 1024)]
        size_mib: u64,
        /// Runs per side (best of).
        #[arg(long, env = "KILN_BENCH_RUNS", default_value_t = 3)]
        runs: usize,
        /// Directory for the registry's storage, the cache and curl's file (on disk).
        #[arg(long, env = "KILN_BENCH_DIR", default_value = "/var/tmp")]
        dir: PathBuf,
        /// The distribution registry binary (Debian package docker-registry).
        #[arg(
            long,
            env = "KILN_BENCH_REGISTRY",
            default_value = "/usr/bin/docker-registry"
        )]
        registry: PathBuf,
    },
    /// Measure streaming sha256 verification against sha256sum and openssl on one file.
    BenchVerify {
        /// File to hash; default: a fresh pseudo-random file of --size-mib.
        #[arg(long, env = "KILN_BENCH_FILE")]
        file: Option<PathBuf>,
        /// Size of the generated file in MiB.
        #[arg(long, env = "KILN_BENCH_SIZE_MIB", default_value_t = 1024)]
        size_mib: u64,
        /// Runs per tool (best of).
        #[arg(long, env = "KILN_BENCH_RUNS", default_value_t = 3)]
        runs: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_format = match cli.command {
        Command::Run { .. } => LogFormat::Json,
        _ => LogFormat::Plain,
    };
    init_tracing(cli.log_format.unwrap_or(default_format));
    // reqwest is built without a default crypto provider; kiln uses ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Run {
            node_name,
            cache,
            store,
            registry,
            source_base,
            listen,
            retry_seconds,
            resync_seconds,
        } => {
            let Some(runtime) = runtime() else {
                return ExitCode::FAILURE;
            };
            let config = kiln_agent::run::Config {
                node_name,
                cache,
                store,
                registry: registry.options(),
                source_base,
                listen,
                retry: std::time::Duration::from_secs(retry_seconds),
                resync: std::time::Duration::from_secs(resync_seconds),
            };
            match runtime.block_on(kiln_agent::run::run(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "kiln-agent run failed");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Local {
            file,
            store,
            output,
            metrics_file,
        } => run_local(file, store, output, metrics_file),
        Command::Fixtures {
            model,
            version,
            shapes,
            inputs,
            seed,
            atol,
            rtol,
            out,
        } => run_fixtures(model, version, shapes, inputs, seed, atol.zip(rtol), out),
        Command::Compile {
            spec,
            class_facts,
            compile_key,
            store,
            registry,
            source_base,
            termination_log,
        } => run_compile(
            kiln_agent::cmd::compile::Job {
                spec_json: spec,
                class_facts_json: class_facts,
                compile_key,
                store,
                registry: registry.options(),
                source_base,
            },
            &termination_log,
        ),
        Command::Install { dir } => match kiln_agent::cmd::install::install(&dir) {
            Ok(installed) => {
                println!("{}", serde_json::to_string(&installed).unwrap_or_default());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kiln-agent install: {}: {e}", e.reason());
                ExitCode::FAILURE
            }
        },
        Command::Probe => {
            let facts = probe::probe(backend::runtimes());
            let labels = probe::labels(&facts);
            let json = serde_json::json!({"hardware": facts, "labels": labels});
            println!(
                "{}",
                serde_json::to_string_pretty(&json).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Command::BenchVerify {
            file,
            size_mib,
            runs,
        } => run_bench(file, size_mib, runs),
        Command::BenchPull {
            size_mib,
            runs,
            dir,
            registry,
        } => run_bench_pull(&dir, &registry, size_mib << 20, runs),
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run_local(
    file: Option<PathBuf>,
    store: Option<PathBuf>,
    output: Output,
    metrics_file: Option<PathBuf>,
) -> ExitCode {
    let store = store.unwrap_or_else(default_store);
    let file = match file {
        Some(f) => f,
        None => match kiln_agent::cmd::local::unpack_example(&store) {
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
    let metrics = metrics::Metrics::register(&mut registry);
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let outcome = runtime.block_on(local::run(&file, &store, &metrics));
    if let Some(path) = metrics_file
        && let Err(e) = std::fs::write(&path, kiln_serve::exposition(&registry, None).0)
    {
        eprintln!(
            "kiln-agent: cannot write metrics to {}: {e}",
            path.display()
        );
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string(&outcome).unwrap_or_default()),
        Output::Plain if outcome.ready => {
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
        }
        Output::Plain => {
            let reason = outcome.reason.map(|r| r.as_str()).unwrap_or("Unknown");
            println!("NOT READY {reason}: {}", outcome.message);
        }
    }
    if outcome.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run_compile(job: kiln_agent::cmd::compile::Job, termination_log: &std::path::Path) -> ExitCode {
    let mut registry = Registry::default();
    let metrics = metrics::Metrics::register(&mut registry);
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let (line, code) = match runtime.block_on(kiln_agent::cmd::compile::run(&job, &metrics)) {
        Ok((manifest, reused)) => {
            println!("{}", serde_json::to_string(&manifest).unwrap_or_default());
            tracing::info!(digest = %manifest.artifact_digest, reused, "compile done");
            (
                format!(
                    "Compiled: sha256:{}{}",
                    manifest.artifact_digest,
                    if reused { " (already stored)" } else { "" }
                ),
                ExitCode::SUCCESS,
            )
        }
        Err(e) => {
            tracing::error!(reason = %e.reason(), error = %e, "compile failed");
            (format!("{}: {e}", e.reason()), ExitCode::FAILURE)
        }
    };
    // Best effort: outside a pod there may be no termination log.
    let _ = std::fs::write(termination_log, line.as_bytes());
    code
}

/// The multi-threaded runtime the pipeline runs on; says why on stderr when it cannot start.
fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .inspect_err(|e| eprintln!("kiln-agent: cannot start the async runtime: {e}"))
        .ok()
}

fn default_store() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("kiln").join("store")
}

#[allow(clippy::too_many_arguments)]
fn run_fixtures(
    model: PathBuf,
    version: String,
    shapes: Vec<String>,
    inputs: Option<PathBuf>,
    seed: u64,
    tolerance: Option<(f64, f64)>,
    out: PathBuf,
) -> ExitCode {
    let parsed: Result<backend::Shapes, String> = shapes
        .iter()
        .map(|s| {
            let (name, dims) = s
                .split_once('=')
                .ok_or_else(|| format!("--shape {s:?}: expected NAME=D0,D1,..."))?;
            let dims = dims
                .split(',')
                .map(|d| {
                    d.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("--shape {s:?}: {d:?} is not a size"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((name.to_string(), dims))
        })
        .collect();
    let shapes = match parsed {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kiln-agent fixtures: {e}");
            return ExitCode::from(2);
        }
    };
    let request = make_fixtures::Request {
        model: &model,
        version: &version,
        shapes,
        given: inputs,
        seed,
        tolerance,
    };
    let result = make_fixtures::make(&backend::tract::Tract, &request).and_then(|f| f.to_bytes());
    match result.and_then(|bytes| {
        std::fs::write(&out, &bytes)
            .map_err(|e| kiln_agent::error::Error::store(&out, e))
            .map(|()| bytes)
    }) {
        Ok(bytes) => {
            println!(
                "{}  {}",
                kiln_agent::pipeline::digest::sha256_bytes(&bytes),
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-agent fixtures: {} ({})", e, e.reason());
            ExitCode::FAILURE
        }
    }
}

fn run_bench_pull(
    dir: &std::path::Path,
    registry: &std::path::Path,
    size: u64,
    runs: usize,
) -> ExitCode {
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(kiln_agent::cmd::bench_pull::run(dir, registry, size, runs)) {
        Ok(f) => {
            let gb = f.bytes as f64 / 1e9;
            println!(
                "verified pull of {:.2} GiB from docker-registry at {} into {} (best of {runs})",
                f.bytes as f64 / f64::from(1u32 << 30),
                f.registry,
                dir.display()
            );
            println!(
                "  kiln-agent pull (hash while streaming, fsync, rename) {:>7.3} s  {:>5.2} GB/s",
                f.agent,
                gb / f.agent
            );
            println!(
                "  curl -o + sha256sum (sequential)                     {:>7.3} s  {:>5.2} GB/s  (curl {:.3} s + sha256sum {:.3} s)",
                f.peer,
                gb / f.peer,
                f.curl,
                f.sha256sum
            );
            println!("  peer/kiln-agent time ratio {:.2}x", f.peer / f.agent);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-agent bench-pull: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_bench(file: Option<PathBuf>, size_mib: u64, runs: usize) -> ExitCode {
    let bytes = match &file {
        Some(f) => std::fs::metadata(f).map(|m| m.len()).unwrap_or(0),
        None => size_mib << 20,
    };
    match bench::run(file, size_mib << 20, runs) {
        Ok(figures) => {
            println!(
                "streaming sha256 over {:.2} GiB (page cache warm, best of {runs})",
                bytes as f64 / f64::from(1u32 << 30)
            );
            let ours = figures
                .iter()
                .find(|f| f.tool == "kiln-agent")
                .map(|f| f.seconds)
                .unwrap_or(f64::NAN);
            for f in &figures {
                println!(
                    "  {:<22} {:>7.3} s  {:>6.2} GB/s  speed kiln/this {:.2}x  {}",
                    f.tool,
                    f.seconds,
                    bytes as f64 / f.seconds / 1e9,
                    f.seconds / ours,
                    &f.digest[..16]
                );
            }
            if figures.windows(2).any(|w| w[0].digest != w[1].digest) {
                eprintln!("digests differ between tools");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-agent bench-verify: {e}");
            ExitCode::FAILURE
        }
    }
}
