//! What every reconcile shares: the client, the watched caches, the store, settings, metrics,
//! and the memos of what this replica wrote. Only the type; built once in [`crate::wiring`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kiln_crds::{KilnNode, ModelArtifact};
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::job::JobSettings;
use crate::metrics::Metrics;
use crate::plan::Settings;
use crate::recall::admission::TakenSlots;
use crate::recall::lookups::LookupCache;
use crate::recall::memo::{LabelMemo, StatusMemo};
use crate::recall::pace::Pacer;

/// Field manager for everything the operator applies.
pub const MANAGER: &str = "kiln-operator";

/// What every reconcile shares.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Watched Nodes.
    pub nodes: Store<Node>,
    /// Watched KilnNodes (hardware facts for nodes without GPU labels).
    pub kiln_nodes: Store<KilnNode>,
    /// Watched ModelArtifacts.
    pub models: Store<ModelArtifact>,
    /// Watched compile Jobs (only those the operator labels as its own).
    pub jobs: Store<Job>,
    /// True once the four caches above have listed. Wait on this, never on the stores: a store's
    /// `wait_until_ready` wakes only its most recent waiter (kube-runtime 5.0's `DelayedInit` is
    /// a oneshot receiver with one waker slot), so concurrent waiters can hang for good.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// The artifact store, read-only from here.
    pub store: Arc<dyn kiln_store::Store>,
    /// The keys a stored entry's attestation must be signed by (none: unsigned is accepted).
    pub trust: kiln_store::attest::Trust,
    /// Plan settings.
    pub settings: Settings,
    /// Job settings.
    pub job_settings: JobSettings,
    /// Metrics.
    pub metrics: Metrics,
    /// Event recorder.
    pub recorder: Recorder,
    /// Class count each target had at its last reconcile, for the classes gauge.
    pub class_counts: Mutex<BTreeMap<String, i64>>,
    /// Node labels this replica wrote recently, (node, key) → value (`None`: removed): many
    /// targets share a node, and until the watch delivers the patched Node each of them would
    /// patch it again.
    pub labelled: Mutex<LabelMemo>,
    /// Ready nodes per class each target had at its last reconcile, for the ready-nodes gauge.
    pub ready_counts: Mutex<BTreeMap<String, BTreeMap<String, i64>>>,
    /// Compile slots this replica took for Jobs the Job cache may not show yet (the slot
    /// ledger, [`crate::recall::admission`]). Counting the running compiles and taking slots happen under this
    /// lock, so that reconciles of different targets (they run at once) cannot each take the
    /// same free slot of `--max-concurrent-compiles`; the Jobs are then created outside it.
    pub compile_slots: Mutex<TakenSlots>,
    /// Statuses this replica wrote that the target cache may not show yet ([`crate::recall::memo::as_written`]).
    pub written: Mutex<StatusMemo>,
    /// Store lookups remembered by compile key ([`crate::recall::lookups`]): verified entries for good,
    /// misses until a Job of the key finishes or `--store-miss-recheck-seconds` pass.
    pub lookups: Mutex<LookupCache>,
    /// When each target's status was last written, to write it at most once per
    /// `--status-write-interval-ms` ([`crate::recall::pace`]).
    pub pacer: Pacer,
}
