//! The operator's Prometheus metrics in one prometheus-client registry, served on `/metrics`.
//! Labels are bounded: category, class, result, reason — never object names or error text.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// An error category ([`crate::error::Error::category`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabel {
    /// Category.
    pub category: String,
}

/// Class and outcome of a compile Job.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// Class id (bounded by the fleet's hardware variety).
    pub class: String,
    /// `created`, `succeeded`, `failed`.
    pub result: String,
    /// Failure reason, empty unless failed.
    pub reason: String,
}

/// Every metric the operator records. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    reconcile_seconds: Histogram,
    reconcile_errors: Family<CategoryLabel, Counter>,
    jobs: Family<JobLabels, Counter>,
    cache_hits: Counter,
    classes: Gauge,
    writes: Family<CategoryLabel, Counter>,
    ready_nodes: Family<ClassLabel, Gauge>,
    promotions: Counter,
    untrusted: Counter,
    held: Counter,
}

/// A node class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// Class id (bounded by the fleet's hardware variety).
    pub class: String,
}

impl Metrics {
    /// Registers every metric under `kiln_operator_`.
    pub fn register(registry: &mut Registry) -> Self {
        let inner = Inner {
            reconcile_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            reconcile_errors: Family::default(),
            jobs: Family::default(),
            cache_hits: Counter::default(),
            classes: Gauge::default(),
            writes: Family::default(),
            ready_nodes: Family::default(),
            promotions: Counter::default(),
            untrusted: Counter::default(),
            held: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("kiln_operator");
        r.register(
            "reconcile_duration_seconds",
            "Time per CompiledTarget reconcile",
            inner.reconcile_seconds.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles by error category",
            inner.reconcile_errors.clone(),
        );
        r.register(
            "compile_jobs",
            "Compile Jobs by class and result",
            inner.jobs.clone(),
        );
        r.register(
            "compile_cache_hits",
            "Classes whose artifact the store already held when the operator first looked",
            inner.cache_hits.clone(),
        );
        r.register(
            "classes",
            "Node classes across all CompiledTargets, at the last reconcile of each",
            inner.classes.clone(),
        );
        r.register(
            "api_writes",
            "Writes the operator sent to the API, by kind",
            inner.writes.clone(),
        );
        r.register(
            "ready_nodes",
            "Nodes ready on their target's current revision, summed over targets, by class",
            inner.ready_nodes.clone(),
        );
        r.register(
            "revision_promotions",
            "Revisions promoted to known-good (rollout.promoteAtReadyPercent of every class ready)",
            inner.promotions.clone(),
        );
        r.register(
            "untrusted_entries",
            "Stored entries refused (to be rebuilt): attestation missing or not signed by --trust-key, or build manifest corrupt",
            inner.untrusted.clone(),
        );
        r.register(
            "status_writes_held",
            "Status changes held back because the target's status was written less than --status-write-interval-ms ago (they go out with the next write)",
            inner.held.clone(),
        );
        Self {
            inner: Arc::new(inner),
        }
    }

    /// One reconcile took `seconds`.
    pub fn reconciled(&self, seconds: f64) {
        self.inner.reconcile_seconds.observe(seconds);
    }

    /// One reconcile failed.
    pub fn error(&self, category: &str) {
        self.inner
            .reconcile_errors
            .get_or_create(&CategoryLabel {
                category: category.into(),
            })
            .inc();
    }

    /// A compile Job was created, succeeded or failed.
    pub fn job(&self, class: &str, result: &str, reason: &str) {
        self.inner
            .jobs
            .get_or_create(&JobLabels {
                class: class.into(),
                result: result.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// A class was found compiled without a Job of this operator's.
    pub fn cache_hit(&self) {
        self.inner.cache_hits.inc();
    }

    /// Adjusts the class gauge by `delta`.
    pub fn classes(&self, delta: i64) {
        self.inner.classes.inc_by(delta);
    }

    /// Adjusts the ready nodes of `class` by `delta`.
    pub fn ready_nodes(&self, class: &str, delta: i64) {
        self.inner
            .ready_nodes
            .get_or_create(&ClassLabel {
                class: class.into(),
            })
            .inc_by(delta);
    }

    /// A stored entry was refused: its attestation, or its build manifest, did not verify.
    pub fn untrusted_entry(&self) {
        self.inner.untrusted.inc();
    }

    /// A status change was held back by the write interval ([`crate::recall::pace`]).
    pub fn held(&self) {
        self.inner.held.inc();
    }

    /// A revision became known-good.
    pub fn promoted(&self) {
        self.inner.promotions.inc();
    }

    /// One write of `kind` (`job`, `status`, `node`, `event`, `delete`).
    pub fn write(&self, kind: &str) {
        self.inner
            .writes
            .get_or_create(&CategoryLabel {
                category: kind.into(),
            })
            .inc();
    }
}
