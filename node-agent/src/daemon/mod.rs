//! `kiln-agent run`, the DaemonSet: watches only what concerns its node (its Node and KilnNode by
//! name, pods by `spec.nodeName`, CompiledTargets), probes the hardware, and runs a pass (see
//! `agent.rs`) on every change and every `--resync` seconds, until SIGTERM.
//! Touches the apiserver (watches; writes only through `writes.rs`), the node cache, the store
//! (read only) and the metrics endpoint.

pub mod agent;
pub mod deadline;
pub mod decide;
pub mod gate;
pub mod pods;
pub mod serving;
pub mod target;
pub mod writes;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kiln_crds::{CompiledTarget, KilnNode};
use kube::runtime::reflector::{self, Store as Reader};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use kiln_engines::backend;
use kiln_engines::host::probe;
use kiln_engines::metrics::Metrics;
use kiln_engines::pipeline::fetch::{Fetcher, SourceRegistry};

/// Everything `run` takes from the command line.
pub struct Config {
    /// This node's name (downward API).
    pub node_name: String,
    /// Node cache directory (hostPath).
    pub cache: PathBuf,
    /// Store URL: a path, `file:///path` or `oci://HOST[:PORT]/REPOSITORY`.
    pub store: String,
    /// How to reach an `oci://` store's registry.
    pub registry: kiln_store::RegistryOptions,
    /// Base directory for relative `file://` URIs of fixtures.
    pub source_base: PathBuf,
    /// Where `/metrics`, `/healthz`, `/readyz` listen.
    pub listen: SocketAddr,
    /// Seconds before a failed artifact is tried again.
    pub retry: Duration,
    /// Seconds between passes when nothing changes.
    pub resync: Duration,
    /// Bounds on fixture fetches.
    pub fetch: kiln_engines::pipeline::fetch::FetchLimits,
    /// Whose attestations an artifact needs.
    pub trust: kiln_store::attest::Trust,
    /// Per-step deadlines of one target.
    pub deadlines: deadline::Deadlines,
}

/// Runs until SIGTERM/SIGINT: serve the metrics, open the store and the cache, probe, own the
/// KilnNode, watch, resume from the last rows, then pass on every change.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Arc::new(kiln_endpoints::Health::new(
        "watches not synced or KilnNode not written",
    ));
    let stop = Stop::on_signal();
    serve_metrics(config.listen, Arc::new(registry), health.clone(), &stop);

    let store = kiln_store::open(&config.store, &config.registry)?;
    let cache = kiln_node_core::cache::Cache::open(&config.cache)?;
    let fetcher = Fetcher::new(cache.blobs(), metrics.clone(), config.fetch.clone())?
        .with_registry(SourceRegistry::of_store(&config.store, &config.registry));
    let hardware = tokio::task::block_in_place(|| probe::probe(backend::runtimes()));
    tracing::info!(node = %config.node_name, cpu = %hardware.cpu_level, gpus = hardware.accelerators.len(), "probed this node");
    let kiln_nodes: Api<KilnNode> = Api::all(client.clone());
    let owner = writes::node_owner(&Api::all(client.clone()), &config.node_name).await?;
    writes::ensure_kiln_node(&kiln_nodes, &config.node_name, owner).await?;

    let changed = Arc::new(Notify::new());
    let Watched {
        nodes,
        pods,
        targets,
        own_kiln_node: _own_kiln_node,
    } = watch(&client, &config.node_name, &kiln_nodes, &changed).await?;
    let mut agent = agent::Agent {
        node: config.node_name.clone(),
        client,
        nodes,
        targets,
        pods,
        store,
        trust: config.trust.clone(),
        cache,
        fetcher,
        source_base: config.source_base.clone(),
        retry: config.retry,
        deadlines: config.deadlines,
        metrics,
        hardware,
        probed_at: Instant::now(),
        states: BTreeMap::new(),
        published: None,
        pulled: BTreeMap::new(),
        serving: serving::Serving::new(changed.clone()),
    };
    resume(&mut agent, &kiln_nodes, &config.node_name).await?;
    agent.publish().await;
    pass_until_stopped(&mut agent, &health, &changed, config.resync, &stop).await;
    Ok(())
}

/// Resolves for every waiter once SIGTERM or SIGINT arrived.
struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    /// Listens for the signal from now on.
    fn on_signal() -> Self {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            kiln_endpoints::shutdown_signal().await;
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        });
        Self(stop_rx)
    }

    /// A future that resolves at the signal.
    fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }
}

/// `/metrics`, `/healthz`, `/readyz` on `listen`, until the signal.
fn serve_metrics(
    listen: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<kiln_endpoints::Health>,
    stop: &Stop,
) {
    let stop = stop.stopped();
    tokio::spawn(async move {
        if let Err(e) = kiln_endpoints::serve(listen, registry, health, stop).await {
            tracing::error!(error = %e, %listen, "metrics endpoint failed");
        }
    });
}

/// The caches the agent reads, each filled by a watch that wakes the pass loop.
struct Watched {
    nodes: Reader<Node>,
    pods: Reader<Pod>,
    targets: Reader<CompiledTarget>,
    /// The agent's own KilnNode: a deletion is noticed and it is written again.
    own_kiln_node: Reader<KilnNode>,
}

/// Watches what concerns this node only, except CompiledTargets (any may select it), and waits
/// until the caches have synced.
async fn watch(
    client: &Client,
    node_name: &str,
    kiln_nodes: &Api<KilnNode>,
    changed: &Arc<Notify>,
) -> anyhow::Result<Watched> {
    let own = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let on_node = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let (nodes, w) = reflector::store();
    spawn_watch(
        reflector(w, Api::<Node>::all(client.clone()), own.clone()),
        changed.clone(),
    );
    let (pods, w) = reflector::store();
    spawn_watch(
        reflector(w, Api::<Pod>::all(client.clone()), on_node),
        changed.clone(),
    );
    let (targets, w) = reflector::store();
    spawn_watch(
        reflector(
            w,
            Api::<CompiledTarget>::all(client.clone()),
            watcher::Config::default(),
        ),
        changed.clone(),
    );
    let (own_kiln_node, w) = reflector::store::<KilnNode>();
    spawn_watch(reflector(w, kiln_nodes.clone(), own), changed.clone());
    wait_ready(&nodes, &pods, &targets).await?;
    Ok(Watched {
        nodes,
        pods,
        targets,
        own_kiln_node,
    })
}

/// A restarted agent starts from the rows it last reported, so serving pods do not flap; no
/// row is trusted, though: the first pass prepares every target again (re-verifying cached
/// artifacts) while a served row keeps serving, and a failure there takes effect as usual.
async fn resume(
    agent: &mut agent::Agent,
    kiln_nodes: &Api<KilnNode>,
    node_name: &str,
) -> anyhow::Result<()> {
    if let Some(status) = kiln_nodes.get_opt(node_name).await?.and_then(|k| k.status) {
        for row in &status.targets {
            agent
                .states
                .entry(decide::TargetKey::new(&row.namespace, &row.name))
                .or_default()
                .row = row.clone();
        }
        agent.published = Some(status);
    }
    Ok(())
}

/// A pass on every change and every `resync`, until the signal; ready while the KilnNode is
/// written.
async fn pass_until_stopped(
    agent: &mut agent::Agent,
    health: &kiln_endpoints::Health,
    changed: &Notify,
    resync: Duration,
    stop: &Stop,
) {
    health
        .ready
        .store(agent.published.is_some(), Ordering::Relaxed);
    let stop = stop.stopped();
    tokio::pin!(stop);
    loop {
        // A pass in flight is dropped at shutdown: status stays as last written, and the next
        // agent re-verifies everything before it reports again.
        tokio::select! {
            () = agent.pass() => {}
            () = &mut stop => break,
        }
        health
            .ready
            .store(agent.published.is_some(), Ordering::Relaxed);
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(resync) => {}
            () = &mut stop => break,
        }
    }
}

fn reflector<K>(
    writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Arc<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .touched_objects()
        .map(|r| r.map(Arc::new))
}

/// Drives a watch; every event wakes the pass loop. Errors are retried by the backoff.
fn spawn_watch<K: Send + 'static>(
    stream: impl Stream<Item = Result<Arc<K>, watcher::Error>> + Send + 'static,
    changed: Arc<Notify>,
) {
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                tracing::warn!(error = %e, "watch error; retrying");
            }
            changed.notify_one();
        }
    });
}

async fn wait_ready(
    nodes: &Reader<Node>,
    pods: &Reader<Pod>,
    targets: &Reader<CompiledTarget>,
) -> anyhow::Result<()> {
    let all = async {
        nodes.wait_until_ready().await?;
        pods.wait_until_ready().await?;
        targets.wait_until_ready().await
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .map_err(|_| {
            anyhow::anyhow!("watches did not sync within 120 s; check RBAC and the apiserver")
        })??;
    Ok(())
}
