//! kiln's endpoints and shared runtime for its two long-running components, the operator and the node agent:
//!
//! * [`serve`] — `/metrics`, `/healthz`, `/readyz` (see [`http`]);
//! * [`exposition`] — which metrics text format a scraper gets (content negotiation);
//! * [`logging`] — the `--log-format` value and the stderr log layer both install;
//! * [`shutdown_signal`] — SIGTERM (what the kubelet sends) or Ctrl-C;
//! * `test_support` (feature `test-support`, for the components' tests) — `promtool` checks of
//!   their expositions.
//!
//! No Kubernetes client and no ML runtime: only what both binaries run the same way.

pub mod exposition;
pub mod http;
pub mod logging;
#[cfg(feature = "test-support")]
pub mod test_support;

pub use http::{Health, serve};

/// Resolves on SIGTERM or Ctrl-C (SIGINT). Where no SIGTERM handler can be installed, Ctrl-C
/// alone ends it.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}
