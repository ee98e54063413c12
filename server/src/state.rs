//! What the routes share: the served model once loaded, the limits, the gate and the metrics.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::admission::Gate;
use crate::batch::Batcher;
use crate::metrics::{Metrics, ModelLabels};
use crate::model::Served;

/// What the routes share.
pub struct State {
    /// Set once the model is loaded ([`State::serve_model`]).
    pub served: OnceLock<Arc<Served>>,
    /// The server's limits.
    pub limits: Limits,
    /// Who runs, who waits.
    pub gate: Gate,
    /// What `/metrics` shows.
    pub metrics: Metrics,
    /// Gathers single-sample requests into batches, when `--max-batch` asks and the model
    /// allows.
    pub batcher: OnceLock<Batcher>,
}

/// The limits `serve`'s flags set.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The largest request body accepted.
    pub max_body: usize,
    /// Requests that may wait for a worker; more are shed. `None`: as many as run at once, so
    /// a request waits at most about one run (the p99 under overload stays within about three
    /// times an idle request's) and a freed worker always finds the next one waiting.
    pub max_queue: Option<usize>,
    /// A request's deadline when it names none (`None`: none).
    pub request_timeout: Option<Duration>,
    /// After the shutdown signal, how long the server goes on answering (not ready, refusing
    /// new requests) at least, so the endpoint leaves the Service before the port closes.
    pub drain_delay: Duration,
    /// After the shutdown signal, the longest it waits for admitted requests.
    pub drain_timeout: Duration,
    /// The most single-sample requests one run batches (1: no batching).
    pub max_batch: usize,
    /// How long the first request of a batch waits for more.
    pub batch_delay: Duration,
}

impl State {
    /// A server with nothing loaded yet.
    pub fn new(limits: Limits) -> Self {
        State {
            served: OnceLock::new(),
            gate: Gate::new(),
            limits,
            metrics: Metrics::default(),
            batcher: OnceLock::new(),
        }
    }

    /// Serves `served` from now on, once each worker thread has run the fixture: its workers
    /// (times `--max-batch` when batching) open the gate. Blocks for the warm runs; returns the
    /// slowest one's seconds.
    pub fn serve_model(&self, served: Served) -> kiln_node_core::error::Result<f64> {
        let served = Arc::new(served);
        let warm = served.warm_workers()?;
        let mut admitted = served.pool.workers();
        if let Some(sample) = served.warm_sample().filter(|_| self.limits.max_batch > 1) {
            let batcher = Batcher::start(
                served.clone(),
                self.limits.max_batch,
                self.limits.batch_delay,
                sample,
            );
            if let Some(b) = batcher {
                tracing::info!(sizes = ?b.sizes, delay = ?self.limits.batch_delay, "batching single-sample requests");
                // Each worker's run takes a batch: that many requests are admitted at once.
                admitted *= self.limits.max_batch;
                let _ = self.batcher.set(b);
            }
        }
        self.gate
            .open(admitted, self.limits.max_queue.unwrap_or(admitted));
        let _ = self.served.set(served);
        Ok(warm)
    }

    /// The served model's metric labels.
    pub fn labels(&self) -> Option<ModelLabels> {
        self.served.get().map(|s| ModelLabels::of(s))
    }
}
