//! kiln-csi, the CSI node plugin `csi.kiln.dev` (the binary `kiln-csi`, image `kiln/csi`): publishes, read-only, the artifact this
//! node's agent verified for a target into a serving pod's inline volume, and only while the
//! node's row for it is Ready (or serving a fallback the policy allowed). It reads the node
//! cache ([`kiln_node_core::cache::View`]) and the node's KilnNode (a GET), writes only its own
//! `published/` directory and the mounts. Its container is privileged (mounts), so nothing that
//! runs models is in it: it may use kiln-node-core, kiln-crds, kiln-store and kiln-endpoints,
//! never kiln-engines, kiln-server or kiln-agent (`crds/tests/boundaries.rs`; its binary's
//! symbols and libraries, `tests/binary.rs`).
//!
//! Two gRPC servers on unix sockets: the CSI Identity and Node services at `--endpoint`
//! ([`identity`], [`node`]), and the kubelet's plugin registration API at
//! `<registration dir>/csi.kiln.dev@reg.sock` ([`identity::Registration`], [`Config::registration_socket`]). The decisions are
//! pure modules: the request ([`request`]), the row ([`admit`]), the volume's layout and
//! `kiln.json` ([`layout`]); the syscalls are in [`mount`].

pub mod admit;
pub mod identity;
pub mod layout;
pub mod mount;
pub mod node;
pub mod proto;
pub mod request;
pub mod seals;

use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

pub use identity::DRIVER;

/// Where the plugin listens and what it reads.
#[derive(Clone, Debug)]
pub struct Config {
    /// The CSI socket, as this process sees it.
    pub endpoint: PathBuf,
    /// The CSI socket as the kubelet sees it (the path registration hands over).
    pub kubelet_endpoint: PathBuf,
    /// The kubelet's plugin registration directory (`<kubelet dir>/plugins_registry`).
    pub registration_dir: PathBuf,
    /// The kubelet's root directory: target paths lie under its `pods/`.
    pub kubelet_dir: PathBuf,
    /// This node's name.
    pub node: String,
    /// The node cache (the agent's `--cache`).
    pub cache: PathBuf,
}

impl Config {
    /// The registration socket, `csi.kiln.dev@reg.sock` (not the usual `-reg.sock`): the
    /// kubelet's registration client (Kubernetes 1.34, grpc-go 1.72) dials it with no authority
    /// override, so grpc-go sends the socket's path, percent-encoded, as `:authority`, which h2
    /// (tonic's HTTP/2) refuses as malformed (`PROTOCOL_ERROR`): percent-encoding is allowed only
    /// in an authority's userinfo. With an `@` in the name, everything before it is userinfo and
    /// `reg.sock` the host, so the request is accepted. (The kubelet's CSI client sets the
    /// authority `localhost`; the CSI socket needs nothing.)
    pub fn registration_socket(&self) -> PathBuf {
        self.registration_dir.join(format!("{DRIVER}@reg.sock"))
    }
}

/// Serves both sockets until `shutdown` completes (`Ok`) or the kubelet refuses the
/// registration (`Err` with its message).
pub async fn serve<R: node::Rows>(
    config: Config,
    rows: R,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let csi = listen(&config.endpoint)?;
    let reg = listen(&config.registration_socket())?;
    let (failed, mut refused) = tokio::sync::mpsc::channel(1);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let node = node::Node::new(
        config.node.clone(),
        &config.cache,
        &config.kubelet_dir,
        rows,
    );
    let csi_server = tonic::transport::Server::builder()
        .add_service(proto::csi::identity_server::IdentityServer::new(
            identity::Identity,
        ))
        .add_service(proto::csi::node_server::NodeServer::new(node))
        .serve_with_incoming_shutdown(UnixListenerStream::new(csi), until(stopped.clone()));
    let registration = identity::Registration {
        endpoint: config.kubelet_endpoint.clone(),
        failed,
    };
    let reg_server = tonic::transport::Server::builder()
        .add_service(
            proto::registration::registration_server::RegistrationServer::new(registration),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(reg), until(stopped));
    tracing::info!(driver = DRIVER, endpoint = %config.endpoint.display(), registration = %config.registration_socket().display(), node = %config.node, "serving");
    let servers = async { tokio::try_join!(csi_server, reg_server) };
    let outcome = tokio::select! {
        r = servers => r.map(|_| ()).map_err(anyhow::Error::from),
        () = shutdown => Ok(()),
        Some(error) = refused.recv() => Err(anyhow::anyhow!(
            "the kubelet refused to register {DRIVER}: {error}"
        )),
    };
    let _ = stop.send(true);
    // Gone with the process, so the kubelet deregisters the driver (a SIGKILLed plugin leaves
    // them; the next one replaces them).
    let _ = std::fs::remove_file(config.registration_socket());
    let _ = std::fs::remove_file(&config.endpoint);
    outcome
}

/// A listener at `path`, replacing a socket a previous run left there; anything else at the
/// path is refused rather than removed.
fn listen(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| anyhow::anyhow!("removing the stale socket {}: {e}", path.display()))?,
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; remove it or choose another path",
            path.display()
        ),
        Err(_) => {}
    }
    UnixListener::bind(path).map_err(|e| anyhow::anyhow!("listening on {}: {e}", path.display()))
}
