//! `kiln-agent serve`: its flags and its entry. The server is [`kiln_server`]; this file
//! starts it, loads the model beside it, and turns a load failure into an exit code.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

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
}

/// Listens at once (live), loads the model (then ready), serves until SIGTERM. A model that
/// does not check or load ends the process with the reason: nothing unverified is served.
pub fn main(args: Args) -> ExitCode {
    let Some(runtime) = super::runtime() else {
        return ExitCode::FAILURE;
    };
    let state = Arc::new(kiln_server::State {
        served: OnceLock::new(),
        max_body: args.max_request_bytes,
    });
    let listen = std::net::SocketAddr::new(args.host, args.port);
    let result = runtime.block_on(async {
        let server = tokio::spawn(kiln_server::serve(
            listen,
            state.clone(),
            kiln_endpoints::shutdown_signal(),
        ));
        let (dir, name) = (args.model_dir.clone(), args.model_name.clone());
        let loaded = tokio::task::spawn_blocking(move || kiln_server::model::open(&dir, name))
            .await
            .map_err(|e| anyhow::anyhow!("loading failed: {e}"))??;
        tracing::info!(model = %loaded.name, target = %format!("{}/{}", loaded.mounted.namespace, loaded.mounted.target), revision = loaded.mounted.revision, digest = %loaded.mounted.digest, engine = %loaded.metadata.platform, load_seconds = loaded.load_seconds, hashed = loaded.hashed, "model loaded; ready");
        let _ = state.served.set(Arc::new(loaded));
        server.await.map_err(|e| anyhow::anyhow!("server task: {e}"))??;
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
