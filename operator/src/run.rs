//! Wiring: watch caches, the two controllers, leader election, the HTTP endpoints and graceful
//! shutdown. Everything here is plumbing; decisions live in `plan` and `admission`, writes in `writes`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kiln_crds::{CompiledTarget, KilnNode, ModelArtifact};
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::utils::{PredicateConfig, predicates};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;

use crate::controller::{self, Context};
use crate::job::{JobSettings, MANAGED_BY};
use crate::metrics::Metrics;
use crate::plan::Settings;
use crate::triggers::Triggers;
use kiln_serve::Health;

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
    pub lookups: crate::lookups::LookupCache,
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
    {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            kiln_serve::shutdown_signal().await;
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        });
    }

    // Leader election: only the holder of the Lease creates Jobs or writes status.
    let mut lease = None;
    if let Some(e) = &config.election {
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &e.lease)
            .with_namespace(&e.namespace)
            .with_identity(&e.identity)
            .with_duration(15)
            .with_grace(5)
            .build()
            .await?;
        let (mut leading, task) = manager.watch().await;
        // Standing by is healthy and ready: the replica serves probes and metrics.
        health.ready.store(true, Ordering::Relaxed);
        tracing::info!(identity = %e.identity, lease = %e.lease, "waiting for leadership");
        let stop = stopped();
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
            return Ok(());
        }
        tracing::info!("leading");
        let stop_tx = stop_tx.clone();
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
        lease = Some((leading, task, monitor));
    }

    let result = controllers(client, &config, metrics, health, stopped).await;
    if let Some((leading, task, monitor)) = lease {
        // Closing every receiver ends the lease task; then hand the Lease over at once instead of
        // making the next leader wait for it to expire.
        monitor.abort();
        drop(leading);
        let release = async {
            if let Ok(Ok(m)) = task.await {
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
    tracing::info!("stopped");
    result
}

async fn http_task(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
    stop: impl std::future::Future<Output = ()>,
) {
    if let Err(e) = kiln_serve::serve(addr, registry, health, stop).await {
        tracing::error!(%e, %addr, "cannot serve metrics and probes");
    }
}

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
    let store = config.store.clone();
    let wc = watcher::Config::default();

    // Caches the plan reads, with fields it never looks at dropped to keep memory flat.
    let (nodes, nodes_w) = reflector::store::<Node>();
    let node_stream = watcher(Api::<Node>::all(client.clone()), wc.clone())
        .default_backoff()
        .modify(|n| {
            n.managed_fields_mut().clear();
            n.status = None;
            n.spec = None;
        })
        .reflect(nodes_w)
        .filter_map(changed(
            |n: &Node| crate::triggers::fingerprint(&n.metadata.labels),
            |n: &mut Node| n.metadata.labels = None,
        ));
    let (kiln_nodes, kiln_w) = reflector::store::<KilnNode>();
    let kiln_stream = watcher(Api::<KilnNode>::all(client.clone()), wc.clone())
        .default_backoff()
        .modify(|n| {
            n.managed_fields_mut().clear();
            if let Some(s) = n.status.as_mut() {
                s.conditions.clear();
            }
        })
        .reflect(kiln_w)
        .filter_map(changed(
            |k: &KilnNode| crate::triggers::fingerprint(&k.status),
            |k: &mut KilnNode| k.status = None,
        ));
    let (models, models_w) = reflector::store::<ModelArtifact>();
    let model_stream = watcher(Api::<ModelArtifact>::all(client.clone()), wc.clone())
        .default_backoff()
        .modify(|m| m.managed_fields_mut().clear())
        .reflect(models_w)
        .touched_objects()
        .predicate_filter(predicates::generation, PredicateConfig::default());
    let (jobs, jobs_w) = reflector::store::<Job>();
    let job_stream = watcher(
        Api::<Job>::all(client.clone()),
        wc.clone()
            .labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)),
    )
    .default_backoff()
    .modify(|j| {
        j.managed_fields_mut().clear();
        if let Some(s) = j.spec.as_mut() {
            s.template = Default::default();
        }
    })
    .reflect(jobs_w)
    .touched_objects();

    let reporter = Reporter {
        controller: "kiln-operator".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context {
        client: client.clone(),
        nodes: nodes.clone(),
        kiln_nodes: kiln_nodes.clone(),
        models: models.clone(),
        jobs: jobs.clone(),
        synced: synced_rx,
        store,
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
    });

    // Our own reflector rather than `Controller::new`'s, to learn when it has listed without
    // waiting on the store, which the controller itself waits on (see `Context::synced`).
    let (targets, targets_w) = reflector::store::<CompiledTarget>();
    let (listed_tx, targets_listed) = tokio::sync::watch::channel(false);
    let target_stream = watcher(Api::<CompiledTarget>::all(client.clone()), wc.clone())
        .default_backoff()
        .reflect(targets_w)
        .inspect(move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                let _ = listed_tx.send(true);
            }
        })
        .applied_objects();
    let target_ctl = Controller::for_stream(target_stream, targets.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency));
    let (t1, t2, t3, t4) = (
        targets.clone(),
        targets.clone(),
        targets.clone(),
        targets.clone(),
    );
    let triggers = Arc::new(Triggers::default());
    let (g1, g2) = (triggers.clone(), triggers);
    let own = ctx.clone();
    let target_ctl = target_ctl
        .watches_stream(retried(job_stream, "Job"), move |j: Job| {
            crate::triggers::job(&j, &t4)
        })
        .watches_stream(retried(node_stream, "Node"), move |n: Node| {
            // A deleted Node arrives without labels (a live one always has the kubelet's).
            if n.metadata.labels.is_none() {
                crate::writes::forget_node(&own.labelled, &n.name_any());
            }
            g1.node(&n, &t1, |node, key, value| {
                crate::writes::wrote_label(&own.labelled, node, key, value)
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
        .graceful_shutdown_on(stopped());

    let model_ctl = Controller::new(Api::<ModelArtifact>::all(client.clone()), wc)
        .graceful_shutdown_on(stopped())
        .run(
            crate::model::reconcile,
            crate::model::error_policy,
            Arc::new(client.clone()),
        );

    let ready = {
        let health = health.clone();
        let (nodes, kiln_nodes, models, jobs) = (
            nodes.clone(),
            kiln_nodes.clone(),
            models.clone(),
            jobs.clone(),
        );
        async move {
            let _ = futures::join!(
                nodes.wait_until_ready(),
                kiln_nodes.wait_until_ready(),
                models.wait_until_ready(),
                jobs.wait_until_ready()
            );
            let _ = synced_tx.send(true);
            health.ready.store(true, Ordering::Relaxed);
            tracing::info!("caches synced; reconciling");
        }
    };
    tokio::spawn(ready);
    // Readiness labels of deleted targets (no finalizer: this also catches deletions while no
    // operator ran) and their metrics go in a sweep over the caches; it writes only stale labels.
    let sweeper = {
        let (ctx, targets, mut stop) = (ctx.clone(), targets.clone(), Box::pin(stopped()));
        let (mut synced, mut listed) = (ctx.synced.clone(), targets_listed);
        async move {
            let _ = synced.wait_for(|s| *s).await;
            let _ = listed.wait_for(|s| *s).await;
            loop {
                controller::sweep(&ctx, &targets).await;
                tokio::select! {
                    () = tokio::time::sleep(SWEEP_EVERY) => {}
                    () = &mut stop => return,
                }
            }
        }
    };
    tokio::spawn(sweeper);
    futures::join!(
        controller::drain(target_ctl.run(controller::reconcile, controller::error_policy, ctx)),
        controller::drain(model_ctl)
    );
    Ok(())
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
