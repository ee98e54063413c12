//! Wiring: watch caches, the two controllers, leader election, the HTTP endpoints and graceful
//! shutdown. Everything here is plumbing; decisions live in `plan` and `admission`, writes in `writes`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kiln_crds::{CompiledTarget, KilnNode, ModelArtifact};
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::{PredicateConfig, predicates};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;

use crate::context::Context;
use crate::controller;
use crate::job::{JobSettings, MANAGED_BY};
use crate::metrics::Metrics;
use crate::plan::Settings;
use crate::watch::triggers::Triggers;
use kiln_endpoints::Health;

/// How often readiness labels of deleted targets are looked for (in the caches; no API reads).
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Leader election settings.
pub struct Election {
    /// Lease name.
    pub lease: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity.
    pub identity: String,
}

/// Everything `run` needs from the command line.
pub struct Config {
    /// The artifact store; the operator only looks keys up.
    pub store: Arc<dyn kiln_store::Store>,
    /// The keys stored entries must be signed by.
    pub trust: kiln_store::attest::Trust,
    /// Store lookups remembered (empty; sized and bounded by the flags).
    pub lookups: crate::recall::lookups::LookupCache,
    /// Plan settings.
    pub settings: Settings,
    /// Job settings.
    pub job_settings: JobSettings,
    /// Where `/metrics`, `/healthz`, `/readyz` listen.
    pub listen: SocketAddr,
    /// Leader election, unless disabled.
    pub election: Option<Election>,
    /// CompiledTargets reconciled at once.
    pub concurrency: u16,
    /// The shortest time between two status writes of one target ([`crate::recall::pace`]).
    pub status_interval: std::time::Duration,
}

/// Runs until SIGTERM/SIGINT or, with leader election, until leadership is lost.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let registry = Arc::new(registry);
    let health = Arc::new(Health::new("caches not synced"));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    tokio::spawn(http_task(
        config.listen,
        registry.clone(),
        health.clone(),
        stopped(),
    ));
    tokio::spawn(stop_on_signal(stop_tx.clone()));

    // Leader election: only the holder of the Lease creates Jobs or writes status.
    let mut lease = None;
    if let Some(e) = &config.election {
        match lead(&client, e, &health, stop_tx.clone(), stopped()).await? {
            Some(leading) => lease = Some(leading),
            None => return Ok(()),
        }
    }
    let result = controllers(client, &config, metrics, health, stopped).await;
    if let Some(leading) = lease {
        hand_over(leading).await;
    }
    tracing::info!("stopped");
    result
}

/// Stops everything on SIGTERM or SIGINT.
async fn stop_on_signal(stop: tokio::sync::watch::Sender<bool>) {
    kiln_endpoints::shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = stop.send(true);
}

/// This replica holding the Lease: the manager's view of it, the manager's task, and the task
/// that stops everything when leadership is lost.
struct Leading {
    leading: tokio::sync::watch::Receiver<bool>,
    task: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    monitor: tokio::task::JoinHandle<()>,
}

/// Waits for the Lease (standing by is healthy and ready: the replica serves probes and
/// metrics); `None` when `stop` came first (the Lease is released). Once leading, losing the
/// Lease sends `stop_tx`, so that only one replica writes.
async fn lead(
    client: &Client,
    e: &Election,
    health: &Health,
    stop_tx: tokio::sync::watch::Sender<bool>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Option<Leading>> {
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &e.lease)
        .with_namespace(&e.namespace)
        .with_identity(&e.identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await?;
    let (mut leading, task) = manager.watch().await;
    health.ready.store(true, Ordering::Relaxed);
    tracing::info!(identity = %e.identity, lease = %e.lease, "waiting for leadership");
    tokio::pin!(stop);
    let won = loop {
        if *leading.borrow_and_update() {
            break true;
        }
        tokio::select! {
            changed = leading.changed() => if changed.is_err() { break false },
            () = &mut stop => break false,
        }
    };
    if !won {
        drop(leading);
        if let Ok(Ok(m)) = task.await {
            let _ = m.release().await;
        }
        return Ok(None);
    }
    tracing::info!("leading");
    let mut watch = leading.clone();
    let monitor = tokio::spawn(async move {
        while watch.changed().await.is_ok() {
            if !*watch.borrow() {
                tracing::error!("lost leadership; stopping so that only one replica writes");
                let _ = stop_tx.send(true);
                return;
            }
        }
    });
    Ok(Some(Leading {
        leading,
        task,
        monitor,
    }))
}

/// Closing every receiver ends the lease task; then the Lease is handed over at once instead of
/// making the next leader wait for it to expire (at most 5 s, then it expires).
async fn hand_over(lease: Leading) {
    lease.monitor.abort();
    drop(lease.leading);
    let release = async {
        if let Ok(Ok(m)) = lease.task.await {
            let _ = m.release().await;
        }
    };
    if tokio::time::timeout(std::time::Duration::from_secs(5), release)
        .await
        .is_err()
    {
        tracing::warn!("lease not released in 5 s; it will expire");
    }
}

async fn http_task(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
    stop: impl std::future::Future<Output = ()>,
) {
    if let Err(e) = kiln_endpoints::serve(addr, registry, health, stop).await {
        tracing::error!(%e, %addr, "cannot serve metrics and probes");
    }
}

/// The two controllers and the tasks around them, until `stopped` resolves: watch the caches,
/// share them in one [`Context`], wire each watch to the targets it concerns, mark ready once
/// listed, sweep what deleted targets left, and drain both controllers.
async fn controllers<F, Fut>(
    client: Client,
    config: &Config,
    metrics: Metrics,
    health: Arc<Health>,
    stopped: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + Sync + 'static,
{
    let (nodes, node_stream) = node_cache(&client);
    let (kiln_nodes, kiln_stream) = kiln_node_cache(&client);
    let (models, model_stream) = model_cache(&client);
    let (jobs, job_stream) = job_cache(&client);
    let caches = Caches {
        nodes,
        kiln_nodes,
        models,
        jobs,
    };
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(context(&client, config, metrics, &caches, synced_rx));
    let (targets, targets_listed, target_stream) = target_cache(&client);

    let target_ctl = Controller::for_stream(target_stream, targets.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency));
    let watched = (job_stream, node_stream, kiln_stream, model_stream);
    let target_ctl =
        with_triggers(target_ctl, &targets, &ctx, watched).graceful_shutdown_on(stopped());
    let model_ctl = Controller::new(
        Api::<ModelArtifact>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stopped())
    .run(
        crate::model::reconcile,
        crate::model::error_policy,
        Arc::new(client.clone()),
    );

    tokio::spawn(mark_synced(caches, synced_tx, health));
    tokio::spawn(sweep_deleted(
        ctx.clone(),
        targets,
        targets_listed,
        stopped(),
    ));
    futures::join!(
        controller::drain(target_ctl.run(controller::reconcile, controller::error_policy, ctx)),
        controller::drain(model_ctl)
    );
    Ok(())
}

/// Which targets each watched change concerns (`crate::watch::triggers`): a compile Job's owner, the
/// targets selecting a Node whose labels changed (not on the echo of this replica's own label
/// write) or a KilnNode whose status changed, the targets of a ModelArtifact.
fn with_triggers(
    ctl: Controller<CompiledTarget>,
    targets: &Store<CompiledTarget>,
    ctx: &Arc<Context>,
    watched: (
        impl Stream<Item = Watched<Job>> + Send + 'static,
        impl Stream<Item = Watched<Node>> + Send + 'static,
        impl Stream<Item = Watched<KilnNode>> + Send + 'static,
        impl Stream<Item = Watched<ModelArtifact>> + Send + 'static,
    ),
) -> Controller<CompiledTarget> {
    let (t1, t2, t3, t4) = (
        targets.clone(),
        targets.clone(),
        targets.clone(),
        targets.clone(),
    );
    let triggers = Arc::new(Triggers::default());
    let (g1, g2) = (triggers.clone(), triggers);
    let own = ctx.clone();
    let (job_stream, node_stream, kiln_stream, model_stream) = watched;
    ctl.watches_stream(retried(job_stream, "Job"), move |j: Job| {
        crate::watch::triggers::job(&j, &t4)
    })
    .watches_stream(retried(node_stream, "Node"), move |n: Node| {
        // A deleted Node arrives without labels (a live one always has the kubelet's).
        if n.metadata.labels.is_none() {
            crate::recall::memo::forget_node(&own.labelled, &n.name_any());
        }
        g1.node(&n, &t1, |node, key, value| {
            crate::recall::memo::wrote_label(&own.labelled, node, key, value)
        })
    })
    .watches_stream(retried(kiln_stream, "KilnNode"), move |k: KilnNode| {
        g2.kiln_node(&k, &t2)
    })
    .watches_stream(
        retried(model_stream, "ModelArtifact"),
        move |m: ModelArtifact| {
            controller::targets_of_model(&t3, &m.namespace().unwrap_or_default(), &m.name_any())
        },
    )
}

/// The four caches the plan reads.
struct Caches {
    nodes: Store<Node>,
    kiln_nodes: Store<KilnNode>,
    models: Store<ModelArtifact>,
    jobs: Store<Job>,
}

/// Every object of kind `K` the watch `config` selects, retried with backoff.
fn watch_all<K>(
    client: &Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + use<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + 'static,
{
    watcher(Api::<K>::all(client.clone()), config).default_backoff()
}

/// One item of a cache's trigger stream: an object, or the error of the watch behind it.
type Watched<K> = Result<K, watcher::Error>;

/// Nodes, trimmed to name and labels ([`crate::watch::lean::node`]); a Node triggers when its labels
/// change or it goes.
fn node_cache(client: &Client) -> (Store<Node>, impl Stream<Item = Watched<Node>> + use<>) {
    let (store, writer) = reflector::store::<Node>();
    let stream = watch_all::<Node>(client, watcher::Config::default())
        .modify(crate::watch::lean::node)
        .reflect(writer)
        .filter_map(changed(
            |n: &Node| crate::watch::triggers::fingerprint(&n.metadata.labels),
            |n: &mut Node| n.metadata.labels = None,
        ));
    (store, stream)
}

/// KilnNodes, trimmed to what readiness reads ([`crate::watch::lean::kiln_node`]); one triggers when
/// that changes or it goes.
fn kiln_node_cache(
    client: &Client,
) -> (
    Store<KilnNode>,
    impl Stream<Item = Watched<KilnNode>> + use<>,
) {
    let (store, writer) = reflector::store::<KilnNode>();
    let stream = watch_all::<KilnNode>(client, watcher::Config::default())
        .modify(crate::watch::lean::kiln_node)
        .reflect(writer)
        .filter_map(changed(
            |k: &KilnNode| crate::watch::triggers::fingerprint(&k.status),
            |k: &mut KilnNode| k.status = None,
        ));
    (store, stream)
}

/// ModelArtifacts; one triggers when its generation changes.
fn model_cache(
    client: &Client,
) -> (
    Store<ModelArtifact>,
    impl Stream<Item = Watched<ModelArtifact>> + use<>,
) {
    let (store, writer) = reflector::store::<ModelArtifact>();
    let stream = watch_all::<ModelArtifact>(client, watcher::Config::default())
        .modify(crate::watch::lean::model)
        .reflect(writer)
        .touched_objects()
        .predicate_filter(predicates::generation, PredicateConfig::default());
    (store, stream)
}

/// The operator's own compile Jobs (by label), less their pod template ([`crate::watch::lean::job`]);
/// every change triggers.
fn job_cache(client: &Client) -> (Store<Job>, impl Stream<Item = Watched<Job>> + use<>) {
    let (store, writer) = reflector::store::<Job>();
    let stream = watch_all::<Job>(
        client,
        watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)),
    )
    .modify(crate::watch::lean::job)
    .reflect(writer)
    .touched_objects();
    (store, stream)
}

/// CompiledTargets, less their managed fields ([`crate::watch::lean::target`]), through our own
/// reflector rather than `Controller::new`'s, to learn when it has listed (the receiver turns true) without waiting on the store, which the controller
/// itself waits on (see `Context::synced`).
fn target_cache(
    client: &Client,
) -> (
    Store<CompiledTarget>,
    tokio::sync::watch::Receiver<bool>,
    impl Stream<Item = Watched<CompiledTarget>> + use<>,
) {
    let (store, writer) = reflector::store::<CompiledTarget>();
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let stream = watch_all::<CompiledTarget>(client, watcher::Config::default())
        .modify(crate::watch::lean::target)
        .reflect(writer)
        .inspect(move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                let _ = listed_tx.send(true);
            }
        })
        .applied_objects();
    (store, listed, stream)
}

/// What every reconcile shares, with empty memos and ledger.
fn context(
    client: &Client,
    config: &Config,
    metrics: Metrics,
    caches: &Caches,
    synced: tokio::sync::watch::Receiver<bool>,
) -> Context {
    let reporter = Reporter {
        controller: "kiln-operator".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    Context {
        client: client.clone(),
        nodes: caches.nodes.clone(),
        kiln_nodes: caches.kiln_nodes.clone(),
        models: caches.models.clone(),
        jobs: caches.jobs.clone(),
        synced,
        store: config.store.clone(),
        trust: config.trust.clone(),
        settings: config.settings.clone(),
        job_settings: config.job_settings.clone(),
        metrics,
        recorder: Recorder::new(client.clone(), reporter),
        class_counts: std::sync::Mutex::new(BTreeMap::new()),
        labelled: std::sync::Mutex::new(BTreeMap::new()),
        ready_counts: std::sync::Mutex::new(BTreeMap::new()),
        compile_slots: std::sync::Mutex::new(BTreeMap::new()),
        written: std::sync::Mutex::new(Default::default()),
        lookups: std::sync::Mutex::new(config.lookups.clone()),
        pacer: crate::recall::pace::Pacer::new(config.status_interval),
    }
}

/// Once the four caches have listed: reconciles may decide (`synced`) and `/readyz` says ready.
async fn mark_synced(
    caches: Caches,
    synced: tokio::sync::watch::Sender<bool>,
    health: Arc<Health>,
) {
    let _ = futures::join!(
        caches.nodes.wait_until_ready(),
        caches.kiln_nodes.wait_until_ready(),
        caches.models.wait_until_ready(),
        caches.jobs.wait_until_ready()
    );
    let _ = synced.send(true);
    health.ready.store(true, Ordering::Relaxed);
    tracing::info!("caches synced; reconciling");
}

/// Readiness labels of deleted targets (no finalizer: this also catches deletions while no
/// operator ran) and their metrics go in a sweep over the caches, every [`SWEEP_EVERY`] once
/// the caches and the targets have listed, until `stop`; it writes only stale labels.
async fn sweep_deleted(
    ctx: Arc<Context>,
    targets: Store<CompiledTarget>,
    mut listed: tokio::sync::watch::Receiver<bool>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut synced = ctx.synced.clone();
    let _ = synced.wait_for(|s| *s).await;
    let _ = listed.wait_for(|s| *s).await;
    tokio::pin!(stop);
    loop {
        controller::sweep(&ctx, &targets).await;
        tokio::select! {
            () = tokio::time::sleep(SWEEP_EVERY) => {}
            () = &mut stop => return,
        }
    }
}

/// A trigger stream without its errors, each logged: the watcher behind it already retries with
/// backoff, so an error is news, not an event. Handing errors to the controller's queue instead
/// stalled every trigger after an apiserver restart (kube-runtime 5.0: the queue's error branch
/// and its scheduler branch share one peeked stream; the fault table's apiserver-restart case
/// sat for minutes with watch sockets unread until this).
fn retried<T: Send + 'static>(
    stream: impl futures::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    kind: &'static str,
) -> impl futures::Stream<Item = Result<T, watcher::Error>> + Send + 'static {
    stream.filter_map(move |r| {
        std::future::ready(match r {
            Ok(obj) => Some(Ok(obj)),
            Err(e) => {
                tracing::warn!(kind, error = %e, "watch error; the watcher retries with backoff");
                None
            }
        })
    })
}

/// A watch-event filter that passes an object when `fingerprint` changes and always when it is
/// deleted, stripped by `gone`. (kube's predicate filters drop deletions, and a deleted node
/// changes classes.)
#[allow(clippy::type_complexity)]
fn changed<K>(
    fingerprint: impl Fn(&K) -> u64 + Send + 'static,
    gone: impl Fn(&mut K) + Send + 'static,
) -> impl FnMut(
    Result<watcher::Event<K>, watcher::Error>,
) -> std::future::Ready<Option<Result<K, watcher::Error>>>
where
    K: kube::Resource + Clone,
{
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    move |event| {
        let out = match event {
            Err(e) => Some(Err(e)),
            Ok(watcher::Event::Delete(mut obj)) => {
                seen.remove(&obj.meta().name.clone().unwrap_or_default());
                // Downstream sees a deleted object as one that lost what it contributed.
                gone(&mut obj);
                Some(Ok(obj))
            }
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                let name = obj.meta().name.clone().unwrap_or_default();
                let print = fingerprint(&obj);
                (seen.insert(name, print) != Some(print)).then_some(Ok(obj))
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
        };
        std::future::ready(out)
    }
}
