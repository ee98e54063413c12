//! What `kiln-agent serve` exposes on `GET /metrics` (its serving port, as KServe's ModelServer
//! does): Triton's inference metrics under kiln's prefix and Prometheus' naming, labelled by
//! `model` and `version` as Triton labels them. Triton's `nv_inference_request_success`,
//! `_failure`, `_queue_duration_us` and `_compute_infer_duration_us`,
//! `nv_inference_pending_request_count` are here `kiln_inference_request_success_total`,
//! `_failure_total{reason}`, `kiln_inference_queue_duration_seconds` and
//! `kiln_inference_compute_duration_seconds` (histograms, not sums), and
//! `kiln_inference_pending_requests`; `nv_inference_exec_count` is `kiln_inference_exec_total`
//! (engine runs: a batch counts once); `kiln_inference_inflight_requests`, `_workers` and
//! `_queue_capacity` say how full the server is. Labels are bounded: one model, its revision,
//! a fixed set of reasons.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::admission::Gate;

/// The served model.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// The name clients address it by.
    pub model: String,
    /// Its CompiledTarget revision.
    pub version: String,
}

impl ModelLabels {
    /// The labels of the model `served` serves.
    pub fn of(served: &crate::model::Served) -> Self {
        ModelLabels {
            model: served.name.clone(),
            version: served.mounted.revision.to_string(),
        }
    }
}

/// A failed request's model and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// The name clients address it by.
    pub model: String,
    /// Its CompiledTarget revision.
    pub version: String,
    /// `queue_full`, `deadline`, `draining` (shed), `invalid` (the request's fault) or
    /// `backend` (the engine's).
    pub reason: String,
}

/// The server's metrics and the registry they are in.
pub struct Metrics {
    registry: Registry,
    success: Family<ModelLabels, Counter>,
    failure: Family<FailureLabels, Counter>,
    exec: Family<ModelLabels, Counter>,
    queue: Family<ModelLabels, Histogram, fn() -> Histogram>,
    compute: Family<ModelLabels, Histogram, fn() -> Histogram>,
    request: Family<ModelLabels, Histogram, fn() -> Histogram>,
    pending: Family<ModelLabels, Gauge>,
    inflight: Family<ModelLabels, Gauge>,
    workers: Family<ModelLabels, Gauge>,
    queue_capacity: Family<ModelLabels, Gauge>,
}

/// 50 µs to about 26 s, doubling.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kiln_inference");
        let m = Metrics {
            success: Family::default(),
            failure: Family::default(),
            exec: Family::default(),
            queue: Family::new_with_constructor(seconds),
            compute: Family::new_with_constructor(seconds),
            request: Family::new_with_constructor(seconds),
            pending: Family::default(),
            inflight: Family::default(),
            workers: Family::default(),
            queue_capacity: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "request_success",
            "Inference requests answered",
            m.success.clone(),
        );
        r.register(
            "request_failure",
            "Inference requests not answered, by reason",
            m.failure.clone(),
        );
        r.register(
            "exec",
            "Engine runs (a batch of requests is one)",
            m.exec.clone(),
        );
        r.register(
            "queue_duration_seconds",
            "Time an inference request waited for a worker",
            m.queue.clone(),
        );
        r.register(
            "compute_duration_seconds",
            "Time the engine ran an inference request",
            m.compute.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from an inference request's headers to its answer",
            m.request.clone(),
        );
        r.register(
            "pending_requests",
            "Inference requests waiting for a worker",
            m.pending.clone(),
        );
        r.register(
            "inflight_requests",
            "Inference requests running",
            m.inflight.clone(),
        );
        r.register(
            "workers",
            "Inference requests that run at once",
            m.workers.clone(),
        );
        r.register(
            "queue_capacity",
            "Inference requests that may wait (--max-queue)",
            m.queue_capacity.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// One request answered after `queued` seconds in line, `compute` in the engine and
    /// `total` in the server.
    pub fn answered(&self, model: &ModelLabels, queued: f64, compute: f64, total: f64) {
        self.success.get_or_create(model).inc();
        self.queue.get_or_create(model).observe(queued);
        self.compute.get_or_create(model).observe(compute);
        self.request.get_or_create(model).observe(total);
    }

    /// One engine run (a batch counts once).
    pub fn executed(&self, model: &ModelLabels) {
        self.exec.get_or_create(model).inc();
    }

    /// One request not answered, for `reason` ([`FailureLabels::reason`]).
    pub fn failed(&self, model: &ModelLabels, reason: &str) {
        self.failure
            .get_or_create(&FailureLabels {
                model: model.model.clone(),
                version: model.version.clone(),
                reason: reason.into(),
            })
            .inc();
    }

    /// The exposition for a scraper that sent `accept`, with the gate's levels read now.
    pub fn encode(
        &self,
        model: Option<&ModelLabels>,
        gate: &Gate,
        accept: Option<&str>,
    ) -> (String, &'static str) {
        if let Some(m) = model {
            let set = |f: &Family<ModelLabels, Gauge>, v: usize| {
                f.get_or_create(m).set(i64::try_from(v).unwrap_or(i64::MAX));
            };
            set(&self.pending, gate.waiting());
            set(&self.inflight, gate.running());
            set(&self.workers, gate.workers());
            set(&self.queue_capacity, gate.max_queue());
        }
        kiln_endpoints::exposition::encode(&self.registry, accept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_what_v2_users_watch_and_promtool_accepts_it() {
        let m = Metrics::default();
        let model = ModelLabels {
            model: "squeezenet".into(),
            version: "3".into(),
        };
        m.answered(&model, 0.001, 0.012, 0.014);
        m.executed(&model);
        m.failed(&model, "queue_full");
        let gate = Gate::new();
        gate.open(2, 8);
        let (text, _) = m.encode(Some(&model), &gate, None);
        for line in [
            "kiln_inference_request_success_total{model=\"squeezenet\",version=\"3\"} 1",
            "kiln_inference_request_failure_total{model=\"squeezenet\",version=\"3\",reason=\"queue_full\"} 1",
            "kiln_inference_queue_duration_seconds_count{model=\"squeezenet\",version=\"3\"} 1",
            "kiln_inference_compute_duration_seconds_count{model=\"squeezenet\",version=\"3\"} 1",
            "kiln_inference_workers{model=\"squeezenet\",version=\"3\"} 2",
            "kiln_inference_exec_total{model=\"squeezenet\",version=\"3\"} 1",
            "kiln_inference_queue_capacity{model=\"squeezenet\",version=\"3\"} 8",
            "kiln_inference_pending_requests{model=\"squeezenet\",version=\"3\"} 0",
            "kiln_inference_inflight_requests{model=\"squeezenet\",version=\"3\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        let queried = kiln_endpoints::test_support::dashboard_metrics("kiln_inference_");
        assert!(queried.len() >= 8, "the chart's serving row: {queried:?}");
        let missing = kiln_endpoints::test_support::not_exported(&queried, &text);
        assert!(
            missing.is_empty(),
            "the dashboard queries {missing:?}, which the server does not export"
        );
        match kiln_endpoints::test_support::promtool_check(&text) {
            Ok(()) => {}
            Err(why) => kiln_endpoints::test_support::skip(&why),
        }
    }
}
