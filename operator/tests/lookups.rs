//! The operator's store lookups go through its lookup cache: reconciling a target again asks the
//! store nothing about a key it found missing moments ago (the registry is not polled on every
//! reconcile), and `--store-miss-recheck-seconds 0` asks every time, as without the cache.
//! Real reconciles over watch-cache stores and a real filesystem store; the API client points at
//! a closed port (the writes fail after the lookups, which is all this counts).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kiln_crds::{BuildManifest, CompiledTarget, ModelArtifact};
use kiln_operator::context::Context;
use kiln_operator::controller;
use kiln_operator::metrics::Metrics;
use kiln_operator::plan::Settings;
use kiln_operator::recall::lookups::LookupCache;
use kiln_store::{ArtifactRef, Entry, Store};
use kube::runtime::reflector;
use kube::runtime::watcher;

/// A filesystem store that counts lookups.
struct Counting {
    inner: Arc<dyn Store>,
    lookups: AtomicUsize,
}

#[async_trait::async_trait]
impl Store for Counting {
    fn location(&self) -> String {
        self.inner.location()
    }
    async fn check_writable(&self) -> kiln_store::Result<()> {
        self.inner.check_writable().await
    }
    async fn lookup(&self, key: &str) -> kiln_store::Result<Option<Entry>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.lookup(key).await
    }
    async fn stage(&self, a: &Path, m: &BuildManifest) -> kiln_store::Result<Entry> {
        self.inner.stage(a, m).await
    }
    async fn tag(&self, e: &Entry, replace: bool) -> kiln_store::Result<Entry> {
        self.inner.tag(e, replace).await
    }
    async fn put_attestation(&self, k: &str, d: &str, e: &[u8]) -> kiln_store::Result<()> {
        self.inner.put_attestation(k, d, e).await
    }
    async fn attestation(&self, k: &str, d: &str) -> kiln_store::Result<Option<Vec<u8>>> {
        self.inner.attestation(k, d).await
    }
    async fn pull(&self, r: &ArtifactRef, dest: &Path) -> kiln_store::Result<BuildManifest> {
        self.inner.pull(r, dest).await
    }
    fn scratch(&self) -> kiln_store::Result<tempfile::TempDir> {
        self.inner.scratch()
    }
    fn blob_cache(&self) -> Option<PathBuf> {
        self.inner.blob_cache()
    }
}

fn store_of<K>(objects: Vec<K>) -> reflector::Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

fn context(store: Arc<Counting>, dir: &Path, miss_recheck: Duration) -> Arc<Context> {
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    let model: ModelArtifact =
        serde_saphyr::from_str(include_str!("fixtures/model.yaml")).expect("model.yaml");
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gpu-0", "labels": {
            "kubernetes.io/arch": "amd64", "kiln.dev/cpu-level": "x86-64-v3",
            "nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "9", "nvidia.com/cuda.driver-version.major": "550"}}
    }))
    .expect("node");
    let mut registry = prometheus_client::registry::Registry::default();
    Arc::new(Context {
        client: client.clone(),
        nodes: store_of(vec![node]),
        kiln_nodes: store_of(vec![]),
        models: store_of(vec![model]),
        jobs: store_of(vec![]),
        synced: tokio::sync::watch::channel(true).1,
        store,
        trust: Default::default(),
        settings: Settings::default(),
        job_settings: common::job_settings(dir),
        metrics: Metrics::register(&mut registry),
        recorder: common::recorder(client),
        class_counts: Default::default(),
        labelled: Default::default(),
        ready_counts: Default::default(),
        compile_slots: Default::default(),
        written: Default::default(),
        lookups: std::sync::Mutex::new(LookupCache::new(16, miss_recheck)),
        pacer: kiln_operator::recall::pace::Pacer::new(Duration::ZERO),
    })
}

/// Lookups made by `passes` reconciles of the fixture target.
async fn lookups_after(passes: usize, miss_recheck: Duration) -> usize {
    let dir = tempfile::tempdir().expect("tempdir");
    let inner = kiln_store::open(
        &dir.path().display().to_string(),
        &kiln_store::RegistryOptions::default(),
    )
    .expect("store");
    let store = Arc::new(Counting {
        inner,
        lookups: AtomicUsize::new(0),
    });
    let ctx = context(store.clone(), dir.path(), miss_recheck);
    let target: CompiledTarget =
        serde_saphyr::from_str(include_str!("fixtures/target.yaml")).expect("target.yaml");
    for _ in 0..passes {
        // The writes after the lookups fail (no apiserver): only the lookups count here.
        let _ = controller::reconcile(Arc::new(target.clone()), ctx.clone()).await;
    }
    store.lookups.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_not_asked_again_on_every_reconcile() {
    let once = lookups_after(1, Duration::from_secs(300)).await;
    assert_eq!(once, 1, "one class, one key looked up");
    assert_eq!(
        lookups_after(5, Duration::from_secs(300)).await,
        1,
        "four more reconciles asked the store nothing"
    );
    assert_eq!(
        lookups_after(5, Duration::ZERO).await,
        5,
        "recheck 0: every reconcile asks, as without the cache"
    );
}
