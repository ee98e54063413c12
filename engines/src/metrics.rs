//! The agent's Prometheus metrics, in one prometheus-client registry: the same registry the
//! DaemonSet serves on `/metrics` and `local --metrics-file` dumps. Labels are bounded: class,
//! backend, reason, policy, result — never error text. The one exception is the per-target ready
//! gauge (see [`TargetLabels`]). Touches only the registry it registers into.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use kiln_crds::FailureReason;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A failure reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// One of the failure reasons.
    pub reason: String,
}

impl ReasonLabel {
    /// The label of `reason`.
    pub fn of(reason: FailureReason) -> Self {
        Self {
            reason: reason.as_str().into(),
        }
    }
}

/// A registry mirror passed over, and why (`unavailable`, `not_found`, `hash_mismatch`,
/// `invalid`): bounded by the configured mirrors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MirrorLabels {
    /// The mirror's `HOST[:PORT]`.
    pub mirror: String,
    /// Why.
    pub reason: String,
}

/// The outcome of a check of a serving pod: `warm` or the gate's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `warm`, `ServingUnreachable`, `ServingMalformed`, `ServingMismatch`,
    /// `ServingParityExceeded`, `ServingUnauthorized` (`kiln_crds::conditions::gate_reasons`).
    pub result: String,
}

/// Backend and result of a compile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CompileLabels {
    /// Backend name.
    pub backend: String,
    /// `success`, `failure` or `cached`.
    pub result: String,
}

/// Node class of a measurement.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// Class id.
    pub class: String,
}

/// One target on this node. Target namespace and name as labels are bounded: an agent exports
/// one series per CompiledTarget that selects its node (a handful — each is a model loaded on the
/// node), series are removed when a target stops selecting the node, and "is model X ready on
/// node Y" is the question operators page on.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    /// CompiledTarget namespace.
    pub namespace: String,
    /// CompiledTarget name.
    pub target: String,
    /// Class whose artifact is served (or wanted).
    pub class: String,
}

/// One target's engine on this node and an execution provider (bounded like
/// [`TargetLabels`], times the five [`kiln_crds::placement::PROVIDERS`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    /// CompiledTarget namespace.
    pub namespace: String,
    /// CompiledTarget name.
    pub target: String,
    /// Class whose artifact ran.
    pub class: String,
    /// Short provider name.
    pub provider: String,
}

/// One target's served engine on this node (bounded: [`TargetLabels`] times [`ENGINES`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabels {
    /// CompiledTarget namespace.
    pub namespace: String,
    /// CompiledTarget name.
    pub target: String,
    /// Class whose artifact serves.
    pub class: String,
    /// One of [`ENGINES`].
    pub engine: String,
}

/// The engine label values; anything else reads as `other`.
pub const ENGINES: [&str; 5] = [
    "tract",
    "onnxruntime/cpu",
    "onnxruntime/cuda",
    "onnxruntime/tensorrt",
    "other",
];

/// Why a fallback was taken and which policy took it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    /// The failure reason of the artifact asked for.
    pub reason: String,
    /// `PreviousKnownGood` or `Class`.
    pub policy: String,
}

/// Every metric the agent records. Cheap to clone; clones share the series.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    fetched_bytes: Counter,
    verify_failures: Family<ReasonLabel, Counter>,
    mirror_skips: Family<MirrorLabels, Counter>,
    failures: Family<ReasonLabel, Counter>,
    compiles: Family<CompileLabels, Counter>,
    compile_seconds: Histogram,
    load_seconds: Family<ClassLabel, Histogram>,
    warmup_seconds: Family<ClassLabel, Histogram>,
    fixture_latency: Family<ClassLabel, Histogram>,
    parity_max_abs_error: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    ready: Family<ClassLabel, Gauge>,
    pull_bytes: Counter,
    pull_seconds: Histogram,
    compat_rejections: Family<ReasonLabel, Counter>,
    target_ready: Family<TargetLabels, Gauge>,
    fallbacks: Family<FallbackLabels, Counter>,
    fail_closed: Family<ReasonLabel, Counter>,
    revision_ready_seconds: Histogram,
    partition_nodes: Family<ProviderLabels, Gauge>,
    partitions: Family<TargetLabels, Gauge>,
    fallback_share: Family<TargetLabels, Gauge<f64, AtomicU64>>,
    fallback_time_share: Family<TargetLabels, Gauge<f64, AtomicU64>>,
    fallback_shape_nodes: Family<TargetLabels, Gauge>,
    fallback_compute_nodes: Family<TargetLabels, Gauge>,
    kernel_seconds: Family<ProviderLabels, Gauge<f64, AtomicU64>>,
    transfers: Family<TargetLabels, Gauge>,
    transfer_seconds: Family<TargetLabels, Gauge<f64, AtomicU64>>,
    peak_memory: Family<TargetLabels, Gauge>,
    peak_device_memory: Family<TargetLabels, Gauge>,
    prefill_seconds: Family<TargetLabels, Gauge<f64, AtomicU64>>,
    decode_tokens_per_second: Family<TargetLabels, Gauge<f64, AtomicU64>>,
    served_revision: Family<TargetLabels, Gauge>,
    served_engine: Family<EngineLabels, Gauge>,
    serving_checks: Family<ResultLabel, Counter>,
    serving_first_request_ratio: Family<TargetLabels, Gauge<f64, AtomicU64>>,
}

fn seconds_histogram() -> Histogram {
    // 1 ms to ~9 min.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

impl Inner {
    /// Every series empty, the histograms with their buckets.
    fn new() -> Self {
        Self {
            fetched_bytes: Counter::default(),
            verify_failures: Family::default(),
            mirror_skips: Family::default(),
            failures: Family::default(),
            compiles: Family::default(),
            compile_seconds: seconds_histogram(),
            load_seconds: Family::new_with_constructor(seconds_histogram),
            warmup_seconds: Family::new_with_constructor(seconds_histogram),
            fixture_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 2.0, 20))
            }),
            parity_max_abs_error: Family::default(),
            ready: Family::default(),
            pull_bytes: Counter::default(),
            pull_seconds: seconds_histogram(),
            compat_rejections: Family::default(),
            target_ready: Family::default(),
            fallbacks: Family::default(),
            fail_closed: Family::default(),
            revision_ready_seconds: seconds_histogram(),
            partition_nodes: Family::default(),
            partitions: Family::default(),
            fallback_share: Family::default(),
            fallback_time_share: Family::default(),
            fallback_shape_nodes: Family::default(),
            fallback_compute_nodes: Family::default(),
            kernel_seconds: Family::default(),
            transfers: Family::default(),
            transfer_seconds: Family::default(),
            peak_memory: Family::default(),
            peak_device_memory: Family::default(),
            prefill_seconds: Family::default(),
            decode_tokens_per_second: Family::default(),
            served_revision: Family::default(),
            served_engine: Family::default(),
            serving_checks: Family::default(),
            serving_first_request_ratio: Family::default(),
        }
    }

    /// Every reason appears at zero, so alerts and rate() see the series before the first
    /// failure.
    fn zero_reasons(&self) {
        for reason in FailureReason::ALL {
            let label = ReasonLabel::of(reason);
            let _ = self.failures.get_or_create(&label);
            let _ = self.verify_failures.get_or_create(&label);
            let _ = self.fail_closed.get_or_create(&label);
        }
    }
}

impl Metrics {
    /// Registers every metric under `kiln_agent_` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let inner = Inner::new();
        let r = registry.sub_registry_with_prefix("kiln_agent");
        register_pipeline(r, &inner);
        register_engine(r, &inner);
        register_placement(r, &inner);
        register_rollout(r, &inner);
        inner.zero_reasons();
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Counts fetched bytes.
    pub fn fetched(&self, bytes: u64) {
        self.inner.fetched_bytes.inc_by(bytes);
    }

    /// Counts a failed verification.
    pub fn verify_failure(&self, reason: FailureReason) {
        self.inner
            .verify_failures
            .get_or_create(&ReasonLabel::of(reason))
            .inc();
    }

    /// Counts a registry mirror passed over.
    pub fn mirror_skipped(&self, skip: &kiln_store::MirrorSkip) {
        self.inner
            .mirror_skips
            .get_or_create(&MirrorLabels {
                mirror: skip.mirror.clone(),
                reason: skip.reason.into(),
            })
            .inc();
    }

    /// Counts a pipeline failure.
    pub fn failure(&self, reason: FailureReason) {
        self.inner
            .failures
            .get_or_create(&ReasonLabel::of(reason))
            .inc();
    }

    /// Counts a compile outcome and, when it ran, its duration.
    pub fn compile(&self, backend: &str, result: &str, seconds: Option<f64>) {
        self.inner
            .compiles
            .get_or_create(&CompileLabels {
                backend: backend.into(),
                result: result.into(),
            })
            .inc();
        if let Some(s) = seconds {
            self.inner.compile_seconds.observe(s);
        }
    }

    /// Records load time.
    pub fn load(&self, class: &str, seconds: f64) {
        self.inner
            .load_seconds
            .get_or_create(&class_label(class))
            .observe(seconds);
    }

    /// Records warmup: total time, each fixture latency and the parity error.
    pub fn warmup(&self, class: &str, seconds: f64, latencies: &[f64], parity_max_abs_error: f64) {
        let label = class_label(class);
        self.inner
            .warmup_seconds
            .get_or_create(&label)
            .observe(seconds);
        let histogram = self.inner.fixture_latency.get_or_create(&label);
        for l in latencies {
            histogram.observe(*l);
        }
        self.inner
            .parity_max_abs_error
            .get_or_create(&label)
            .set(parity_max_abs_error);
    }

    /// Records which provider ran which nodes of a target's engine on this node.
    pub fn placement(&self, labels: &TargetLabels, placement: &kiln_crds::placement::Placement) {
        for provider in kiln_crds::placement::PROVIDERS {
            let series = provider_labels(labels, provider);
            match placement.nodes.get(provider) {
                Some(n) => {
                    self.inner.partition_nodes.get_or_create(&series).set(*n);
                }
                None => {
                    self.inner.partition_nodes.remove(&series);
                }
            }
        }
        self.inner
            .partitions
            .get_or_create(labels)
            .set(placement.partitions);
        self.inner
            .fallback_share
            .get_or_create(labels)
            .set(placement.fallback_share);
        self.placement_work(labels, placement);
    }

    /// Records the kernel time, the CPU's shape and compute nodes and the transfers of a
    /// target's engine on this node.
    fn placement_work(&self, labels: &TargetLabels, p: &kiln_crds::placement::Placement) {
        let inner = &self.inner;
        for provider in kiln_crds::placement::PROVIDERS {
            let series = provider_labels(labels, provider);
            match p.kernel_seconds.get(provider) {
                Some(s) => {
                    inner.kernel_seconds.get_or_create(&series).set(*s);
                }
                None => {
                    inner.kernel_seconds.remove(&series);
                }
            }
        }
        let gauges = [
            (&inner.fallback_shape_nodes, p.shape_node_count),
            (&inner.fallback_compute_nodes, p.compute_node_count),
            (&inner.transfers, p.transfer_count),
        ];
        for (gauge, value) in gauges {
            gauge.get_or_create(labels).set(value);
        }
        inner
            .fallback_time_share
            .get_or_create(labels)
            .set(p.fallback_time_share);
        inner
            .transfer_seconds
            .get_or_create(labels)
            .set(p.transfer_seconds);
    }

    /// Records the GPU memory this process held at its peak around a target's engine.
    pub fn peak_device_memory(&self, labels: &TargetLabels, bytes: u64) {
        self.inner
            .peak_device_memory
            .get_or_create(labels)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Records a language model's prefill time and decode rate from its warmup.
    pub fn generation(&self, labels: &TargetLabels, g: &crate::backend::Generation) {
        let inner = &self.inner;
        inner
            .prefill_seconds
            .get_or_create(labels)
            .set(g.prefill_seconds);
        inner
            .decode_tokens_per_second
            .get_or_create(labels)
            .set(g.decode_tokens_per_second);
    }

    /// Records the peak memory a target's engine added in load and warmup.
    pub fn peak_memory(&self, labels: &TargetLabels, bytes: u64) {
        self.inner
            .peak_memory
            .get_or_create(labels)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets the ready state of a class.
    pub fn ready(&self, class: &str, ready: bool) {
        self.inner
            .ready
            .get_or_create(&class_label(class))
            .set(i64::from(ready));
    }
}

impl Metrics {
    /// Counts an artifact pulled into the node cache.
    pub fn pulled(&self, bytes: u64, seconds: f64) {
        self.inner.pull_bytes.inc_by(bytes);
        self.inner.pull_seconds.observe(seconds);
    }

    /// Counts an artifact refused as incompatible.
    pub fn compat_rejection(&self, reason: FailureReason) {
        self.inner
            .compat_rejections
            .get_or_create(&ReasonLabel::of(reason))
            .inc();
    }

    /// Sets whether a target is served on this node, and which revision (`None`: none).
    pub fn target_ready(&self, labels: &TargetLabels, served: Option<i64>) {
        self.inner
            .target_ready
            .get_or_create(labels)
            .set(i64::from(served.is_some()));
        match served {
            Some(revision) => {
                self.inner
                    .served_revision
                    .get_or_create(labels)
                    .set(revision);
            }
            None => {
                self.inner.served_revision.remove(labels);
            }
        }
    }

    /// Sets which engine serves a target on this node (`None`: none, or not known).
    pub fn served_engine(&self, labels: &TargetLabels, engine: Option<&str>) {
        let engine = engine.map(|e| {
            ENGINES
                .iter()
                .find(|k| **k == e)
                .copied()
                .unwrap_or("other")
        });
        for e in ENGINES {
            let series = engine_labels(labels, e);
            if Some(e) == engine {
                self.inner.served_engine.get_or_create(&series).set(1);
            } else {
                self.inner.served_engine.remove(&series);
            }
        }
    }

    /// Drops the series of a target that no longer selects this node.
    pub fn forget_target(&self, labels: &TargetLabels) {
        self.served_engine(labels, None);
        self.inner.target_ready.remove(labels);
        self.inner.served_revision.remove(labels);
        self.inner.partitions.remove(labels);
        self.inner.fallback_share.remove(labels);
        self.inner.fallback_time_share.remove(labels);
        self.inner.fallback_shape_nodes.remove(labels);
        self.inner.fallback_compute_nodes.remove(labels);
        self.inner.transfers.remove(labels);
        self.inner.transfer_seconds.remove(labels);
        self.inner.peak_memory.remove(labels);
        self.inner.peak_device_memory.remove(labels);
        self.inner.prefill_seconds.remove(labels);
        self.inner.decode_tokens_per_second.remove(labels);
        self.inner.serving_first_request_ratio.remove(labels);
        for provider in kiln_crds::placement::PROVIDERS {
            let series = provider_labels(labels, provider);
            self.inner.partition_nodes.remove(&series);
            self.inner.kernel_seconds.remove(&series);
        }
    }

    /// Counts a fallback.
    pub fn fallback(&self, reason: FailureReason, policy: &str) {
        self.inner
            .fallbacks
            .get_or_create(&FallbackLabels {
                reason: reason.as_str().into(),
                policy: policy.into(),
            })
            .inc();
    }

    /// Counts a target left not ready.
    pub fn fail_closed(&self, reason: FailureReason) {
        self.inner
            .fail_closed
            .get_or_create(&ReasonLabel::of(reason))
            .inc();
    }

    /// Counts a finished check of a serving pod through its endpoint; a warm one sets the
    /// target's first-request-after-warm to p50 ratio through the server.
    pub fn serving_check(&self, labels: &TargetLabels, result: &str, first_to_p50: Option<f64>) {
        self.inner
            .serving_checks
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
        if let Some(ratio) = first_to_p50 {
            self.inner
                .serving_first_request_ratio
                .get_or_create(labels)
                .set(ratio);
        }
    }

    /// Records the time from first seeing a revision to serving it.
    pub fn revision_ready(&self, seconds: f64) {
        self.inner.revision_ready_seconds.observe(seconds);
    }
}

/// The pipeline's series: fetch, verify, compile, load, warmup, parity and ready per class.
fn register_pipeline(r: &mut Registry, inner: &Inner) {
    r.register(
        "fetched_bytes",
        "Bytes fetched and verified from sources and stores",
        inner.fetched_bytes.clone(),
    );
    r.register(
        "verify_failures",
        "Verifications that failed, by reason",
        inner.verify_failures.clone(),
    );
    r.register(
        "failures",
        "Pipeline failures, by reason",
        inner.failures.clone(),
    );
    r.register(
        "registry_mirror_skips",
        "Pulls a registry mirror could not serve verified, by mirror and reason (the next mirror or the registry served them)",
        inner.mirror_skips.clone(),
    );
    r.register(
        "compiles",
        "Compiles, by backend and result (cached: reused from the store)",
        inner.compiles.clone(),
    );
    r.register(
        "compile_seconds",
        "Time to compile a model",
        inner.compile_seconds.clone(),
    );
    r.register(
        "load_seconds",
        "Time to load a compiled engine",
        inner.load_seconds.clone(),
    );
    r.register(
        "warmup_seconds",
        "Time to run all warmup iterations",
        inner.warmup_seconds.clone(),
    );
    r.register(
        "fixture_latency_seconds",
        "Latency of one fixture run during warmup",
        inner.fixture_latency.clone(),
    );
    r.register(
        "parity_max_abs_error",
        "Largest absolute output error against golden fixtures",
        inner.parity_max_abs_error.clone(),
    );
    r.register(
        "ready",
        "1 when the engine is verified, loaded and warmed",
        inner.ready.clone(),
    );
}

/// A target's engine on this node: its partitions, revision, engine and memory.
fn register_engine(r: &mut Registry, inner: &Inner) {
    r.register(
        "partition_nodes",
        "Graph nodes each execution provider ran in the engine's first warmup run",
        inner.partition_nodes.clone(),
    );
    r.register(
        "partitions",
        "Runs of consecutive nodes on one execution provider (1: one provider ran everything)",
        inner.partitions.clone(),
    );
    r.register(
        "served_revision",
        "The target revision this node serves (Ready, or Degraded on a fallback); no series while it serves none",
        inner.served_revision.clone(),
    );
    r.register(
        "served_engine",
        "1 for the engine that serves a target on this node (tract, onnxruntime/cpu, onnxruntime/cuda, ...); no series while none serves or the engine is unknown",
        inner.served_engine.clone(),
    );
    r.register(
        "engine_peak_memory_bytes",
        "Resident memory a target's engine added at its peak during load and warmup",
        inner.peak_memory.clone(),
    );
    r.register(
        "fallback_share",
        "Share of graph nodes the CPU ran although another execution provider was requested",
        inner.fallback_share.clone(),
    );
}

/// The node's artifact pulls, compatibility refusals, readiness per target and fallbacks.
fn register_rollout(r: &mut Registry, inner: &Inner) {
    r.register(
        "artifact_pull_bytes",
        "Artifact bytes pulled and verified into the node cache",
        inner.pull_bytes.clone(),
    );
    r.register(
        "artifact_pull_seconds",
        "Time to pull and verify an artifact into the node cache",
        inner.pull_seconds.clone(),
    );
    r.register(
        "compatibility_rejections",
        "Artifacts refused before loading because they do not fit this device or runtime",
        inner.compat_rejections.clone(),
    );
    r.register(
        "target_ready",
        "1 when the target is served on this node (Ready, or Degraded on a fallback)",
        inner.target_ready.clone(),
    );
    r.register(
        "fallbacks",
        "Fallbacks taken after the asked-for artifact failed, by reason and policy",
        inner.fallbacks.clone(),
    );
    r.register(
        "serving_checks",
        "Checks of serving pods through their own endpoint (fixture samples, parity), by result",
        inner.serving_checks.clone(),
    );
    r.register(
        "serving_first_request_ratio",
        "The first request through a serving pod's server after it was warmed, over the p50 through it",
        inner.serving_first_request_ratio.clone(),
    );
    r.register(
        "fail_closed",
        "Targets left not ready on this node (no fallback served), by reason",
        inner.fail_closed.clone(),
    );
    r.register(
        "revision_ready_seconds",
        "Time from first seeing a target revision to serving it ready",
        inner.revision_ready_seconds.clone(),
    );
}

/// The placement and device memory series: CPU fallback, kernel time, transfers, language
/// model figures, GPU memory.
fn register_placement(r: &mut Registry, inner: &Inner) {
    r.register(
        "fallback_time_share",
        "Share of the first run's kernel time on the CPU although another execution provider was requested",
        inner.fallback_time_share.clone(),
    );
    r.register(
        "fallback_shape_nodes",
        "CPU fallback nodes that only compute shapes (Shape, Size, or small rank <= 1 tensors)",
        inner.fallback_shape_nodes.clone(),
    );
    r.register(
        "fallback_compute_nodes",
        "CPU fallback nodes that compute (what cpuFallback Forbidden refuses)",
        inner.fallback_compute_nodes.clone(),
    );
    r.register(
        "partition_kernel_seconds",
        "Kernel time of each execution provider in the engine's first warmup run",
        inner.kernel_seconds.clone(),
    );
    r.register(
        "partition_transfers",
        "Copies between execution providers (Memcpy nodes) in the engine's first warmup run",
        inner.transfers.clone(),
    );
    r.register(
        "partition_transfer_seconds",
        "Kernel time of the copies between execution providers in the engine's first warmup run",
        inner.transfer_seconds.clone(),
    );
    r.register(
        "prefill_seconds",
        "A language model's time to first token (the fixture prompt's forward pass) in its warmup",
        inner.prefill_seconds.clone(),
    );
    r.register(
        "decode_tokens_per_second",
        "A language model's greedy decode rate after the first token in its warmup",
        inner.decode_tokens_per_second.clone(),
    );
    r.register(
        "engine_peak_device_memory_bytes",
        "GPU memory the agent's process held at its peak after load and warmup of a target's engine (NVML)",
        inner.peak_device_memory.clone(),
    );
}

fn provider_labels(labels: &TargetLabels, provider: &str) -> ProviderLabels {
    ProviderLabels {
        namespace: labels.namespace.clone(),
        target: labels.target.clone(),
        class: labels.class.clone(),
        provider: provider.into(),
    }
}

fn engine_labels(labels: &TargetLabels, engine: &str) -> EngineLabels {
    EngineLabels {
        namespace: labels.namespace.clone(),
        target: labels.target.clone(),
        class: labels.class.clone(),
        engine: engine.to_string(),
    }
}

fn class_label(class: &str) -> ClassLabel {
    ClassLabel {
        class: class.into(),
    }
}
