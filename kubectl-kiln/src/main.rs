//! kubectl-kiln: a kubectl plugin (copy it onto PATH, as krew does; run as `kubectl kiln`).
//! `status`, `history`, `rollback` and `why` read the cluster's own objects (CompiledTarget,
//! KilnNodes, Events); `rollback` and `unpin` write one field, `spec.rollout.pinnedRevision`,
//! by server-side apply under the field manager `kubectl-kiln`.

mod render;
mod report;
mod serving;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::{CompiledTarget, KilnNode};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Serialize;

use report::EventLine;

/// Field manager of the pin this plugin applies.
const MANAGER: &str = "kubectl-kiln";

#[derive(Parser)]
#[command(
    name = "kubectl-kiln",
    bin_name = "kubectl kiln",
    version,
    about = "kiln from kubectl: where a CompiledTarget stands on every class and node, its \
             revisions, rollback to a known-good one, and why something is not ready"
)]
struct Cli {
    /// Namespace of the CompiledTarget (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    /// Human tables.
    Table,
    /// JSON, for scripts.
    Json,
    /// YAML, for scripts.
    Yaml,
}

#[derive(Subcommand)]
enum Command {
    /// Classes x nodes x revision: phase, reason, revision served, fallback, parity error,
    /// load/warmup times. Exits 1 when the target is not Ready.
    Status {
        /// CompiledTarget name.
        target: String,
    },
    /// Revisions, newest first: compile keys, digests, known-good, when recorded, which nodes
    /// serve them now.
    History {
        /// CompiledTarget name.
        target: String,
    },
    /// Pins the newest known-good revision older than the current one (or --to N) in
    /// spec.rollout.pinnedRevision, by server-side apply as field manager `kubectl-kiln`.
    /// `kubectl kiln unpin` hands serving back to the newest revision.
    Rollback {
        /// CompiledTarget name.
        target: String,
        /// The revision to pin.
        #[arg(long)]
        to: Option<i64>,
        /// Pin a revision that is not known-good.
        #[arg(long)]
        force: bool,
        /// Take the field from another field manager that set it (a GitOps tool will set it
        /// back on its next sync: change it in git instead).
        #[arg(long)]
        force_conflicts: bool,
        /// Wait until every node that reports on the target serves the revision, Ready, and
        /// print how long that took.
        #[arg(long)]
        wait: bool,
        /// Longest wait, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Removes this plugin's pin (spec.rollout.pinnedRevision): nodes serve the newest revision.
    Unpin {
        /// CompiledTarget name.
        target: String,
    },
    /// Why a node (KilnNode name), a CompiledTarget or a serving pod is not ready: reason,
    /// message, the failing step, the last Events. `node/NAME`, `target/NAME` or `pod/NAME`
    /// picks the kind; a bare name is looked up as a node first, then as a target.
    Why {
        /// NODE, TARGET, node/NODE, target/TARGET or pod/POD.
        name: String,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn client(cli: &Cli) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?
        }
        None if cli.context.is_some() => Config::from_kubeconfig(&options).await?,
        None => Config::infer().await?,
    };
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((Client::try_from(config)?, ns))
}

/// Prints `value` as the chosen output; `text` renders the table.
fn print<T: Serialize>(
    output: Output,
    value: &T,
    text: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    match output {
        Output::Table => print!("{}", text(value)),
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(value)?),
    }
    Ok(())
}

async fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    let (client, ns) = client(cli).await?;
    let s = Session {
        targets: Api::namespaced(client.clone(), &ns),
        kiln_nodes: Api::all(client.clone()),
        client,
        ns,
        output: cli.output,
    };
    match &cli.command {
        Command::Status { target } => status(&s, target).await,
        Command::History { target } => history(&s, target).await,
        Command::Rollback {
            target,
            to,
            force,
            force_conflicts,
            wait,
            timeout,
        } => {
            let wait = wait.then_some(*timeout);
            rollback(&s, target, (*to, *force), *force_conflicts, wait).await
        }
        Command::Unpin { target } => unpin(&s, target).await,
        Command::Why { name } => why(&s, name).await,
    }
}

/// What every command reads through: the cluster, the namespace, the output format.
struct Session {
    client: Client,
    ns: String,
    targets: Api<CompiledTarget>,
    kiln_nodes: Api<KilnNode>,
    output: Output,
}

impl Session {
    /// The CompiledTarget `name` of the namespace; its absence is an error that says so.
    async fn target(&self, name: &str) -> anyhow::Result<CompiledTarget> {
        self.targets.get_opt(name).await?.ok_or_else(|| {
            anyhow::anyhow!(
                "no CompiledTarget {name} in namespace {} (-n picks another)",
                self.ns
            )
        })
    }

    /// Every KilnNode.
    async fn nodes(&self) -> anyhow::Result<Vec<KilnNode>> {
        Ok(self.kiln_nodes.list(&ListParams::default()).await?.items)
    }
}

/// Exit status 0 when ready, 1 when not.
fn ready_code(ready: bool) -> ExitCode {
    if ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `status`: classes x nodes x revision, and the target's serving pods; exit 1 when not Ready.
async fn status(s: &Session, target: &str) -> anyhow::Result<ExitCode> {
    let t = s.target(target).await?;
    let nodes = s.nodes().await?;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let pods = pods.list(&ListParams::default()).await?.items;
    let status = StatusWithPods {
        serving_pods: serving::serving_pods(&s.ns, target, &pods, &nodes),
        status: report::status(&t, &nodes),
    };
    print(s.output, &status, |w| {
        format!(
            "{}{}",
            render::status(&w.status),
            serving::render(&w.serving_pods)
        )
    })?;
    Ok(ready_code(status.status.ready))
}

/// `status`'s report: the target's, and its serving pods.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusWithPods {
    #[serde(flatten)]
    status: report::Status,
    serving_pods: Vec<serving::ServingPod>,
}

/// `history`: revisions, newest first.
async fn history(s: &Session, target: &str) -> anyhow::Result<ExitCode> {
    let t = s.target(target).await?;
    print(s.output, &report::history(&t, &s.nodes().await?), |h| {
        render::history(h)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `rollback`: pins the revision `report::rollback_to` picks for (`--to`, `--force`); with
/// `wait` (seconds), waits until every node serves it, Ready.
async fn rollback(
    s: &Session,
    target: &str,
    (to, force): (Option<i64>, bool),
    force_conflicts: bool,
    wait: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let t = s.target(target).await?;
    let n = report::rollback_to(&t, to, force).map_err(|e| anyhow::anyhow!("{target}: {e}"))?;
    let started = Instant::now();
    pin(&s.targets, target, Some(n), force_conflicts).await?;
    let mut done = Rollback {
        target: format!("{}/{target}", s.ns),
        pinned_revision: n,
        served_after_seconds: None,
    };
    if let Some(timeout) = wait {
        let deadline = started + Duration::from_secs(timeout);
        loop {
            // The rows name the target by namespace and name: only the nodes change.
            if report::serves(&t, &s.nodes().await?, n) {
                done.served_after_seconds = Some(started.elapsed().as_secs_f64());
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "revision {n} pinned, but not every node serves it after {timeout} s; `kubectl kiln status {target}` shows where each stands"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    print(s.output, &done, |d| match d.served_after_seconds {
        Some(s) => format!(
            "{}: pinned revision {}; every node serves it, Ready, {s:.3} s after the pin\n",
            d.target, d.pinned_revision
        ),
        None => format!(
            "{}: pinned revision {} (--wait waits until every node serves it)\n",
            d.target, d.pinned_revision
        ),
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `unpin`: removes this plugin's pin.
async fn unpin(s: &Session, target: &str) -> anyhow::Result<ExitCode> {
    s.target(target).await?;
    pin(&s.targets, target, None, false).await?;
    println!(
        "{}/{target}: unpinned; nodes serve the newest revision",
        s.ns
    );
    Ok(ExitCode::SUCCESS)
}

/// `why`: a node (looked up first, unless `target/` says otherwise) or a target, with its last
/// Events; exit 1 when not ready.
async fn why(s: &Session, name: &str) -> anyhow::Result<ExitCode> {
    let (kind, name) = match name.split_once('/') {
        Some(("node" | "nodes" | "kilnnode" | "kilnnodes", n)) => (Some("node"), n),
        Some(("target" | "compiledtarget" | "compiledtargets", n)) => (Some("target"), n),
        Some(("pod" | "pods", n)) => return why_pod(s, n).await,
        Some((other, _)) => anyhow::bail!("{other}/: use node/NAME, target/NAME or pod/NAME"),
        None => (None, name),
    };
    let node = match kind {
        Some("target") => None,
        _ => s.kiln_nodes.get_opt(name).await?,
    };
    let why = match (node, kind) {
        (Some(node), _) => {
            let events = events(&s.client, None, None, name).await?;
            report::why_node(&node, events)
        }
        (None, Some("node")) => {
            anyhow::bail!("no KilnNode {name}: is kiln-agent running on that node?")
        }
        (None, _) => {
            let t = s.target(name).await?;
            let events = events(&s.client, Some(&s.ns), Some("CompiledTarget"), name).await?;
            report::why_target(&t, &s.nodes().await?, events)
        }
    };
    print(s.output, &why, render::why)?;
    Ok(ready_code(why.ready))
}

/// `why pod/NAME`: a serving pod of the namespace, with its last Events (a refused mount among
/// them); exit 1 when not Ready.
async fn why_pod(s: &Session, name: &str) -> anyhow::Result<ExitCode> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let pod = pods
        .get_opt(name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no pod {name} in namespace {} (-n picks another)", s.ns))?;
    let events = events(&s.client, Some(&s.ns), Some("Pod"), name).await?;
    let why = serving::why_pod(&pod, &s.nodes().await?, events);
    print(s.output, &why, render::why)?;
    Ok(ready_code(why.ready))
}

/// What `rollback` did.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Rollback {
    target: String,
    pinned_revision: i64,
    served_after_seconds: Option<f64>,
}

/// Applies `spec.rollout.pinnedRevision = n` as this plugin's field manager; `None` applies an
/// empty configuration, which removes the pin this manager owns.
async fn pin(
    targets: &Api<CompiledTarget>,
    name: &str,
    n: Option<i64>,
    force: bool,
) -> anyhow::Result<()> {
    let mut body = serde_json::json!({
        "apiVersion": "kiln.dev/v1alpha1",
        "kind": "CompiledTarget",
        "metadata": {"name": name},
    });
    if let Some(n) = n {
        body["spec"] = serde_json::json!({"rollout": {"pinnedRevision": n}});
    }
    let mut params = PatchParams::apply(MANAGER);
    if force {
        params = params.force();
    }
    match targets.patch(name, &params, &Patch::Apply(&body)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => anyhow::bail!(
            "{name}: another field manager set spec.rollout.pinnedRevision ({}); change it where that manager applies it (git), or pass --force-conflicts",
            e.message
        ),
        Err(e) => Err(e.into()),
    }
}

/// The newest Events about `name` (a CompiledTarget in `ns`, or with `ns` None a node), newest
/// first.
async fn events(
    client: &Client,
    ns: Option<&str>,
    kind: Option<&str>,
    name: &str,
) -> anyhow::Result<Vec<EventLine>> {
    let api: Api<Event> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let kind = kind
        .map(|k| format!(",involvedObject.kind={k}"))
        .unwrap_or_default();
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}{kind}")))
        .await?;
    let lines = list
        .items
        .into_iter()
        .map(|e| EventLine {
            time: e
                .last_timestamp
                .or(e.event_time.map(|t| Time(t.0)))
                .or(e.first_timestamp)
                .or(e.metadata.creation_timestamp),
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
        })
        .collect();
    Ok(report::newest(lines, 10))
}
