//! `kiln-agent serve`: its flags and its entry. The server is [`kiln_server`]; this file
//! starts it, loads the model beside it, and turns a load failure into an exit code.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Flags of `serve`.
#[derive(clap::Args)]
pub struct Args {
    /// The model directory: a `csi.kiln.dev` volume (artifact, manifest.json, kiln.json,
    /// fixture.safetensors).
    #[arg(long, env = "KILN_MODEL_DIR", default_value = "/model")]
    model_dir: PathBuf,
    /// Port of the Open Inference Protocol v2 REST endpoint.
    #[arg(long, env = "KILN_PORT", default_value_t = 8000)]
    port: u16,
    /// Address to listen on.
    #[arg(long, env = "KILN_HOST", default_value = "0.0.0.0")]
    host: std::net::IpAddr,
    /// The name clients address the model by (default: the CompiledTarget's, from kiln.json).
    #[arg(long, env = "KILN_MODEL_NAME")]
    model_name: Option<String>,
    /// The largest request body accepted, in bytes.
    #[arg(long, env = "KILN_MAX_REQUEST_BYTES", default_value_t = 64 << 20)]
    max_request_bytes: usize,
    /// For a shareable engine (tract) the requests that run at once, else the engines loaded
    /// (default: the cores for tract, one engine for engines whose run uses all cores).
    #[arg(long, env = "KILN_INSTANCES", value_parser = clap::value_parser!(u16).range(1..))]
    instances: Option<u16>,
    /// Requests that may wait for a worker; past that a request gets 503 with Retry-After
    /// (default: as many as run at once, so none waits more than about one run).
    #[arg(long, env = "KILN_MAX_QUEUE")]
    max_queue: Option<usize>,
    /// A request's deadline when it names none (Envoy's x-envoy-expected-rq-timeout-ms, or
    /// parameters.timeout in µs): one still waiting then gets 504 unrun. 0: none.
    #[arg(long, env = "KILN_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    request_timeout_ms: u64,
    /// After SIGTERM, seconds the server goes on refusing new requests (not ready) at least,
    /// so its endpoint leaves the Service before the port closes.
    #[arg(long, env = "KILN_DRAIN_DELAY_SECONDS", default_value_t = 2)]
    drain_delay_seconds: u64,
    /// After SIGTERM, the most seconds it waits for admitted requests (keep it under the
    /// pod's terminationGracePeriodSeconds).
    #[arg(long, env = "KILN_DRAIN_TIMEOUT_SECONDS", default_value_t = 25)]
    drain_timeout_seconds: u64,
    /// The most single-sample requests one engine run takes together (dynamic batching), where
    /// the artifact has a profile for that many rows and a batch answered each row exactly as
    /// the row alone did at load. 1: off.
    #[arg(long, env = "KILN_MAX_BATCH", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    max_batch: u16,
    /// How long the first request of a batch waits for more, in microseconds.
    #[arg(long, env = "KILN_BATCH_DELAY_US", default_value_t = 500)]
    batch_delay_us: u64,
}

/// Listens at once (live), loads the model (then ready), serves until SIGTERM. A model that
/// does not check or load ends the process with the reason: nothing unverified is served.
pub fn main(args: Args) -> ExitCode {
    let Some(runtime) = super::runtime() else {
        return ExitCode::FAILURE;
    };
    let seconds = std::time::Duration::from_secs;
    let state = Arc::new(kiln_server::State::new(kiln_server::Limits {
        max_body: args.max_request_bytes,
        max_queue: args.max_queue,
        request_timeout: (args.request_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(args.request_timeout_ms)),
        drain_delay: seconds(args.drain_delay_seconds),
        drain_timeout: seconds(args.drain_timeout_seconds.max(args.drain_delay_seconds)),
        max_batch: usize::from(args.max_batch),
        batch_delay: std::time::Duration::from_micros(args.batch_delay_us),
    }));
    let listen = std::net::SocketAddr::new(args.host, args.port);
    let result = runtime.block_on(async {
        let server = tokio::spawn(kiln_server::serve(
            listen,
            state.clone(),
            kiln_endpoints::shutdown_signal(),
        ));
        let (dir, name) = (args.model_dir.clone(), args.model_name.clone());
        let instances = args.instances.map(usize::from);
        let serving = state.clone();
        tokio::task::spawn_blocking(move || load(&serving, &dir, name, instances))
            .await
            .map_err(|e| anyhow::anyhow!("loading failed: {e}"))??;
        server
            .await
            .map_err(|e| anyhow::anyhow!("server task: {e}"))??;
        anyhow::Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let error = kiln_node_core::error::with_causes(e.as_ref());
            tracing::error!(%error, model_dir = %args.model_dir.display(), "kiln-agent serve failed");
            ExitCode::FAILURE
        }
    }
}

/// Loads the model in `dir`, warms each worker thread and serves it from `state`, logging what
/// was loaded and how.
fn load(
    state: &kiln_server::State,
    dir: &std::path::Path,
    name: Option<String>,
    instances: Option<usize>,
) -> kiln_node_core::error::Result<()> {
    let loaded = kiln_server::model::open(dir, name, instances)?;
    let model = loaded.name.clone();
    let mounted = loaded.mounted.clone();
    let engine = loaded.metadata.platform.clone();
    let (load_seconds, hashed) = (loaded.load_seconds, loaded.hashed);
    let (instances, workers) = (loaded.pool.instances(), loaded.pool.workers());
    let warm_seconds = state.serve_model(loaded)?;
    tracing::info!(%model, target = %format!("{}/{}", mounted.namespace, mounted.target), revision = mounted.revision, digest = %mounted.digest, %engine, load_seconds, hashed, instances, workers, max_queue = state.gate.max_queue(), warm_seconds, "model loaded, each worker thread warmed; ready");
    Ok(())
}
