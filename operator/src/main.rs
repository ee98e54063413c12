//! kiln-operator: watches CompiledTargets, ModelArtifacts, Nodes, KilnNodes and compile Jobs;
//! groups nodes into classes; runs one compile Job per class unless the store holds the key;
//! reports honest status. Runs with no flags in-cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kiln_operator::job::{JobSettings, JobStore};
use kiln_operator::plan::{CompileBounds, Settings, Worker, Workers, quantity};
use kiln_operator::telemetry::{self, LogFormat};
use kiln_operator::wiring::{Config, Election, run};

#[derive(Parser)]
#[command(
    name = "kiln-operator",
    version,
    about = "kiln operator: node classes, compile Jobs, status"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, env = "KILN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
    /// Artifact store: a host directory (or `file:///dir`) shared with the compile Jobs, or
    /// `oci://HOST[:PORT]/REPOSITORY`.
    #[arg(long, env = "KILN_STORE", default_value = "/var/lib/kiln/store")]
    store: String,
    #[command(flatten)]
    registry: kiln_store::RegistryArgs,
    /// PEM public key(s) (P-256) that stored entries' attestations must be signed by; an entry
    /// without one is treated as not built. Without it, unsigned entries are accepted.
    #[arg(long, env = "KILN_TRUST_KEY")]
    trust_key: Option<std::path::PathBuf>,
    /// Secret (key `signing.key`, a PKCS#8 PEM P-256 key) that compile Jobs sign their
    /// artifacts with; it must exist in each target's namespace. Only the Jobs' publisher mounts it.
    #[arg(long, env = "KILN_SIGNING_SECRET")]
    signing_secret: Option<String>,
    /// Secret (key `cosign.pub`: one or more PEM P-256 public keys) whose keys may sign model
    /// sources; compile Jobs verify `spec.source.signature` against it. Must exist in each
    /// target's namespace.
    #[arg(long, env = "KILN_SOURCE_TRUST_SECRET")]
    source_trust_secret: Option<String>,
    /// Refuse ModelArtifacts whose source has no `spec.source.signature` (Stalled,
    /// SignatureInvalid); compile Jobs refuse them too.
    #[arg(long, env = "KILN_REQUIRE_SOURCE_SIGNATURE")]
    require_source_signature: bool,
    /// ServiceAccount of compile pods (must exist in each target's namespace; no token is
    /// mounted). Empty: the namespace's default account.
    #[arg(long, env = "KILN_COMPILE_SERVICE_ACCOUNT")]
    compile_service_account: Option<String>,
    /// Largest memory a CompiledTarget may request or limit for its compile Jobs (a quantity).
    #[arg(long, env = "KILN_COMPILE_MAX_MEMORY", default_value = "64Gi")]
    compile_max_memory: String,
    /// Largest CPU a CompiledTarget may request or limit for its compile Jobs (a quantity).
    #[arg(long, env = "KILN_COMPILE_MAX_CPU", default_value = "32")]
    compile_max_cpu: String,
    /// Most `nvidia.com/gpu` a compile Job may ask for.
    #[arg(long, env = "KILN_COMPILE_MAX_GPUS", default_value_t = 1)]
    compile_max_gpus: u64,
    /// Toleration keys CompiledTargets may give their compile Jobs (`*`: any, including a
    /// keyless toleration of every taint).
    #[arg(
        long,
        env = "KILN_COMPILE_TOLERATION_KEYS",
        value_delimiter = ',',
        default_value = "nvidia.com/gpu"
    )]
    compile_toleration_keys: Vec<String>,
    /// Secret (keys `username`, `password`) that compile Jobs read registry credentials from;
    /// it must exist in each target's namespace, where the Jobs run.
    #[arg(long, env = "KILN_REGISTRY_SECRET")]
    registry_secret: Option<String>,
    /// kiln-agent image the compile Jobs run (on GPU classes too, unless --gpu-agent-image).
    #[arg(
        long,
        env = "KILN_AGENT_IMAGE",
        default_value = "ghcr.io/kiln-dev/kiln-agent:latest"
    )]
    agent_image: String,
    /// kiln-agent image with the GPU runtimes (chart `agent.gpu`) that runs the compile Jobs of
    /// classes whose facts name an NVIDIA GPU (`nvidia.com/gpu.product`); their compile keys
    /// name its --gpu-backend-version. Requires --gpu-backend-version. Unset: the agent image.
    #[arg(long, env = "KILN_GPU_AGENT_IMAGE", requires = "gpu_backend_versions")]
    gpu_agent_image: Option<String>,
    /// Backend versions the GPU agent image carries, NAME=VERSION as for --backend-version (its
    /// ONNX Runtime is another library: onnxruntime=1.31.1@sha256:<hex of that library>).
    /// Requires --gpu-agent-image.
    #[arg(
        long = "gpu-backend-version",
        env = "KILN_GPU_BACKEND_VERSIONS",
        value_delimiter = ',',
        requires = "gpu_agent_image"
    )]
    gpu_backend_versions: Vec<String>,
    /// RuntimeClass of GPU classes' compile pods (where the NVIDIA container runtime is not the
    /// node's default; chart `agent.gpu.runtimeClassName`). Used only with --gpu-agent-image.
    #[arg(long, env = "KILN_GPU_RUNTIME_CLASS")]
    gpu_runtime_class: Option<String>,
    /// Image pull policy of compile Jobs (`Never` for images loaded onto the node).
    #[arg(
        long,
        env = "KILN_AGENT_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent"
    )]
    agent_image_pull_policy: String,
    /// Host directory mounted read-only into compile Jobs; relative `file://` URIs of models
    /// resolve against it (local and test clusters; production sources use https:// or oci://).
    #[arg(long, env = "KILN_SOURCES_HOST_PATH")]
    sources_host_path: Option<String>,
    /// UID the compile worker runs as; it must be able to write the store directory.
    #[arg(long, env = "KILN_COMPILE_UID", default_value_t = 65532)]
    compile_uid: i64,
    /// Deadline of one compile Job when the target sets none, in seconds.
    #[arg(long, env = "KILN_COMPILE_DEADLINE_SECONDS", default_value_t = 1800)]
    compile_deadline_seconds: i64,
    /// Finished compile Jobs are deleted this many seconds after they end.
    #[arg(long, env = "KILN_JOB_TTL_SECONDS", default_value_t = 3600)]
    job_ttl_seconds: i32,
    /// Backend versions the agent image carries, NAME=VERSION (part of the compile key); a
    /// runtime loaded at run time names its library too: onnxruntime=1.31.1@sha256:<hex>.
    #[arg(
        long = "backend-version",
        env = "KILN_BACKEND_VERSIONS",
        value_delimiter = ',',
        default_value = "tract=0.23.9,llamacpp=0.1.160"
    )]
    backend_versions: Vec<String>,
    /// Compile attempts per class when a target sets none.
    #[arg(long, env = "KILN_MAX_ATTEMPTS", default_value_t = 3)]
    max_attempts: u32,
    /// Compile Jobs running at once across all targets; more wait in phase `Queued`.
    #[arg(long, env = "KILN_MAX_CONCURRENT_COMPILES", default_value_t = 4)]
    max_concurrent_compiles: usize,
    /// CompiledTargets reconciled at once (never two reconciles of one target). Each holds its
    /// view of the nodes, its plan and an API request; unbounded, 1,000 new targets held 1,000
    /// of each at once.
    #[arg(long, env = "KILN_MAX_CONCURRENT_RECONCILES", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_reconciles: u16,
    /// The shortest time between two status writes of one CompiledTarget, in milliseconds: changes
    /// that come sooner (node reports during a rollout) go out together in the next write, so a
    /// status lags its nodes by at most this long. A first write, and one that goes with a Job
    /// created or deleted, is never held. 0: every change at once.
    #[arg(long, env = "KILN_STATUS_WRITE_INTERVAL_MS", default_value_t = 1000)]
    status_write_interval_ms: u64,
    /// Store lookups: a compile key found missing (or refused) is looked up again after this
    /// many seconds at the latest, and at once when one of its compile Jobs finishes; 0 looks
    /// it up on every reconcile. A verified entry is remembered for good (it does not change).
    #[arg(long, env = "KILN_STORE_MISS_RECHECK_SECONDS", default_value_t = 300)]
    store_miss_recheck_seconds: u64,
    /// Compile keys whose store lookup is remembered (oldest forgotten first).
    #[arg(long, env = "KILN_STORE_CACHE_ENTRIES", default_value_t = kiln_operator::recall::lookups::DEFAULT_MAX_ENTRIES,
          value_parser = clap::value_parser!(usize))]
    store_cache_entries: usize,
    /// Wait after a failed attempt, in seconds; doubles per attempt up to 5 minutes.
    #[arg(long, env = "KILN_RETRY_BACKOFF_SECONDS", default_value_t = 10)]
    retry_backoff_seconds: u64,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "KILN_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Run without leader election (one replica only).
    #[arg(long, env = "KILN_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Lease name for leader election.
    #[arg(long, env = "KILN_LEASE_NAME", default_value = "kiln-operator")]
    lease_name: String,
    /// Lease namespace (in-cluster: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kiln-system")]
    lease_namespace: String,
    /// This replica's identity (in-cluster: the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kiln-operator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The span exporter runs on the runtime; the guard, declared after it, flushes first.
    let _guard = match runtime.block_on(async { telemetry::init(cli.log_format) }) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("kiln-operator: cannot set up logging/tracing: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = match config(cli) {
        Ok(config) => config,
        Err(code) => return code,
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "kiln-operator stopped");
            ExitCode::FAILURE
        }
    }
}

/// What `run` needs, from the flags: the compile workers, the store, the keys entries must be
/// signed by, plan and Job settings, leader election. A flag that cannot be used is said on
/// stderr, exit status 2.
fn config(cli: Cli) -> Result<Config, ExitCode> {
    let workers = workers(&cli)?;
    let store = kiln_store::open(&cli.store, &cli.registry.options())
        .map_err(|e| usage(&format!("--store: {e}")))?;
    let trust = kiln_store::attest::Trust::from_files(None, cli.trust_key.as_deref())
        .map_err(|e| usage(&format!("--trust-key: {e}")))?;
    Ok(Config {
        store,
        trust,
        lookups: kiln_operator::recall::lookups::LookupCache::new(
            cli.store_cache_entries,
            Duration::from_secs(cli.store_miss_recheck_seconds),
        ),
        settings: settings(&cli, workers)?,
        job_settings: job_settings(&cli),
        listen: cli.listen,
        concurrency: cli.max_concurrent_reconciles,
        status_interval: Duration::from_millis(cli.status_write_interval_ms),
        election: election(cli),
    })
}

/// Says what is wrong with a flag; the exit status of a usage error.
fn usage(message: &str) -> ExitCode {
    eprintln!("kiln-operator: {message}");
    ExitCode::from(2)
}

/// The images compile Jobs run and the backend versions each carries.
fn workers(cli: &Cli) -> Result<Workers, ExitCode> {
    let (Ok(backend_versions), Ok(gpu_backend_versions)) = (
        versions(&cli.backend_versions, "--backend-version"),
        versions(&cli.gpu_backend_versions, "--gpu-backend-version"),
    ) else {
        return Err(ExitCode::from(2));
    };
    Ok(Workers {
        agent: Worker {
            image: cli.agent_image.clone(),
            backend_versions,
            runtime_class: None,
        },
        gpu: cli
            .gpu_agent_image
            .clone()
            .filter(|i| !i.is_empty())
            .map(|image| Worker {
                image,
                backend_versions: gpu_backend_versions,
                runtime_class: cli.gpu_runtime_class.clone().filter(|c| !c.is_empty()),
            }),
    })
}

/// Plan settings: workers, attempts and backoff, compile slots, the bounds on what a target may
/// ask of its compile Jobs.
fn settings(cli: &Cli, workers: Workers) -> Result<Settings, ExitCode> {
    let bound = |q: &str, scale: f64, flag: &str| {
        quantity(q, scale)
            .map(|v| v as u64)
            .ok_or_else(|| eprintln!("kiln-operator: {flag} {q:?}: not a Kubernetes quantity"))
    };
    let (Ok(max_memory_bytes), Ok(max_cpu_millis)) = (
        bound(&cli.compile_max_memory, 1.0, "--compile-max-memory"),
        bound(&cli.compile_max_cpu, 1000.0, "--compile-max-cpu"),
    ) else {
        return Err(ExitCode::from(2));
    };
    Ok(Settings {
        workers,
        default_max_attempts: cli.max_attempts,
        backoff_base: Duration::from_secs(cli.retry_backoff_seconds),
        max_concurrent_compiles: cli.max_concurrent_compiles,
        compile_bounds: CompileBounds {
            max_memory_bytes,
            max_cpu_millis,
            max_gpus: cli.compile_max_gpus,
            toleration_keys: cli
                .compile_toleration_keys
                .iter()
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())
                .collect(),
        },
        require_source_signature: cli.require_source_signature,
        ..Settings::default()
    })
}

/// How compile Jobs are built: pull policy, the store they publish to, mounts, identity,
/// deadlines, the Secrets they read.
fn job_settings(cli: &Cli) -> JobSettings {
    let secret = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    JobSettings {
        image_pull_policy: cli.agent_image_pull_policy.clone(),
        store: match kiln_store::fs_path(&cli.store) {
            Some(path) => JobStore::HostPath(path.display().to_string()),
            None => JobStore::Registry {
                url: cli.store.trim().to_string(),
                insecure: cli.registry.registry_insecure,
                secret: secret(&cli.registry_secret),
                mirrors: cli.registry.options().mirrors,
            },
        },
        sources_host_path: cli.sources_host_path.clone(),
        run_as_user: cli.compile_uid,
        active_deadline_seconds: cli.compile_deadline_seconds,
        ttl_seconds_after_finished: cli.job_ttl_seconds,
        signing_secret: secret(&cli.signing_secret),
        service_account: secret(&cli.compile_service_account),
        source_trust_secret: secret(&cli.source_trust_secret),
        require_source_signature: cli.require_source_signature,
    }
}

/// Leader election, unless disabled; the identity defaults to host name and process id.
fn election(cli: Cli) -> Option<Election> {
    (!cli.no_leader_election).then(|| Election {
        lease: cli.lease_name,
        namespace: cli.lease_namespace,
        identity: cli.identity.unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        }),
    })
}

/// NAME=VERSION pairs of `flag` as a map; a malformed pair is reported.
fn versions(pairs: &[String], flag: &str) -> Result<BTreeMap<String, String>, ()> {
    let mut versions = BTreeMap::new();
    for pair in pairs {
        let Some((name, version)) = pair.split_once('=') else {
            eprintln!("kiln-operator: {flag} {pair:?}: expected NAME=VERSION");
            return Err(());
        };
        versions.insert(name.trim().to_string(), version.trim().to_string());
    }
    Ok(versions)
}
