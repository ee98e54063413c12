//! `kiln-csi`, the CSI node plugin `csi.kiln.dev` (its own DaemonSet and image, privileged,
//! apart from the engine-running agent): its flags and its entry. The plugin itself is the
//! library, `kiln_csi`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kiln_endpoints::logging::{self, LogFormat};

/// Flags of `kiln-csi`; the Helm chart sets them through the environment.
#[derive(Parser)]
#[command(
    name = "kiln-csi",
    version,
    about = "kiln's CSI node plugin csi.kiln.dev: mounts the artifact this node's agent verified, read-only, into serving pods' inline volumes once the node's row is Ready"
)]
struct Args {
    /// Log format on stderr.
    #[arg(long, env = "KILN_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
    /// The CSI socket this process listens on (`unix://PATH`, or a path).
    #[arg(
        long,
        env = "KILN_CSI_ENDPOINT",
        default_value = "unix:///csi/csi.sock"
    )]
    endpoint: String,
    /// The same socket as the kubelet sees it, handed over at registration (default: the
    /// endpoint's path; the chart mounts the kubelet's `plugins/csi.kiln.dev/` at `/csi`).
    #[arg(long, env = "KILN_CSI_KUBELET_ENDPOINT")]
    kubelet_endpoint: Option<PathBuf>,
    /// The kubelet's plugin registration directory, where `csi.kiln.dev@reg.sock` is served.
    #[arg(
        long,
        env = "KILN_CSI_REGISTRATION_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    registration_dir: PathBuf,
    /// The kubelet's root directory (its `--root-dir`), mounted at the same path: the volumes'
    /// target paths must lie under its `pods/`.
    #[arg(long, env = "KILN_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// This node's name (downward API `spec.nodeName`): the node id and the KilnNode read.
    #[arg(long, env = "KILN_NODE_NAME")]
    node: String,
    /// The node cache the agent writes (its `--cache`); volumes are built in its `published/`.
    #[arg(long, env = "KILN_CACHE", default_value = "/var/lib/kiln/cache")]
    cache: PathBuf,
}

/// Serves until SIGTERM; exits non-zero when it cannot start or the kubelet refuses the
/// registration (the container restarts and registers again).
fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = logging::init(args.log_format) {
        eprintln!("kiln-csi: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    let endpoint = match args
        .endpoint
        .strip_prefix("unix://")
        .unwrap_or(&args.endpoint)
    {
        p if p.starts_with('/') => PathBuf::from(p),
        _ => {
            tracing::error!(endpoint = %args.endpoint, "--endpoint must be unix:///ABSOLUTE/PATH");
            return ExitCode::FAILURE;
        }
    };
    if !kiln_csi::request::is_dns1123_subdomain(&args.node) {
        tracing::error!(node = %args.node, "--node must be the node's name (KILN_NODE_NAME, downward API spec.nodeName)");
        return ExitCode::FAILURE;
    }
    let config = kiln_csi::Config {
        kubelet_endpoint: args.kubelet_endpoint.unwrap_or_else(|| endpoint.clone()),
        endpoint,
        registration_dir: args.registration_dir,
        kubelet_dir: args.kubelet_dir,
        node: args.node,
        cache: args.cache,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "kiln-csi failed");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: kiln_csi::Config) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let rows = kiln_csi::node::KubeRows(kube::Api::all(client));
    kiln_csi::serve(config, rows, kiln_endpoints::shutdown_signal()).await
}
