//! `kiln-agent run`, the DaemonSet: its flags and its entry. The loop itself (watches, passes,
//! status) is [`crate::daemon`]. This file touches nothing itself.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Flags of `run`; the Helm chart sets them through the environment.
#[derive(clap::Args)]
pub struct Args {
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
    #[command(flatten)]
    fetch: kiln_engines::pipeline::fetch::FetchLimits,
    /// Seconds one target's artifact pull (and fixture fetch) may take before it is `Timeout`
    /// and the agent goes on with the others.
    #[arg(long, env = "KILN_PULL_DEADLINE_SECONDS", default_value_t = 1800)]
    pull_deadline_seconds: u64,
    /// Seconds loading, and then warming, one target's engine may each take.
    #[arg(long, env = "KILN_WARMUP_DEADLINE_SECONDS", default_value_t = 600)]
    warmup_deadline_seconds: u64,
    /// PEM public key(s) (P-256): use only artifacts whose attestation one of them signed. The
    /// chart sets it; without it unsigned artifacts are accepted.
    #[arg(long, env = "KILN_TRUST_KEY")]
    trust_key: Option<PathBuf>,
}

impl Args {
    /// The registry flags, for the credentials kiln_agent::secrets took out of the environment.
    pub fn registry_mut(&mut self) -> &mut kiln_store::RegistryArgs {
        &mut self.registry
    }
}

/// Runs the agent until SIGTERM; a failure to start (no apiserver, no cache) is logged.
pub fn main(args: Args) -> ExitCode {
    let Some(runtime) = super::runtime() else {
        return ExitCode::FAILURE;
    };
    let trust = match kiln_store::attest::Trust::from_files(None, args.trust_key.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot read --trust-key");
            return ExitCode::FAILURE;
        }
    };
    if trust.verifier.is_none() {
        tracing::warn!("no --trust-key: artifacts are accepted without an attestation");
    }
    let config = crate::daemon::Config {
        trust,
        deadlines: crate::daemon::deadline::Deadlines {
            pull: Duration::from_secs(args.pull_deadline_seconds.max(1)),
            warm: Duration::from_secs(args.warmup_deadline_seconds.max(1)),
        },
        node_name: args.node_name,
        cache: args.cache,
        store: args.store,
        registry: args.registry.options(),
        source_base: args.source_base,
        listen: args.listen,
        retry: Duration::from_secs(args.retry_seconds),
        resync: Duration::from_secs(args.resync_seconds),
        fetch: args.fetch,
    };
    match runtime.block_on(crate::daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let error = kiln_node_core::error::with_causes(e.as_ref());
            tracing::error!(%error, "kiln-agent run failed");
            ExitCode::FAILURE
        }
    }
}
