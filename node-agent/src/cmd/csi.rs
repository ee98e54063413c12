//! `kiln-agent csi`, the CSI node plugin `csi.kiln.dev` (its own DaemonSet, privileged, apart
//! from the engine-running agent): its flags and its entry. The plugin itself is
//! [`crate::csi`].

use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `csi`; the Helm chart sets them through the environment.
#[derive(clap::Args)]
pub struct Args {
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
pub fn main(args: Args) -> ExitCode {
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
    if !crate::csi::request::is_dns1123_subdomain(&args.node) {
        tracing::error!(node = %args.node, "--node must be the node's name (KILN_NODE_NAME, downward API spec.nodeName)");
        return ExitCode::FAILURE;
    }
    let config = crate::csi::Config {
        kubelet_endpoint: args.kubelet_endpoint.unwrap_or_else(|| endpoint.clone()),
        endpoint,
        registration_dir: args.registration_dir,
        kubelet_dir: args.kubelet_dir,
        node: args.node,
        cache: args.cache,
    };
    let Some(runtime) = super::runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "kiln-agent csi failed");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: crate::csi::Config) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let rows = crate::csi::node::KubeRows(kube::Api::all(client));
    crate::csi::serve(config, rows, kiln_endpoints::shutdown_signal()).await
}
