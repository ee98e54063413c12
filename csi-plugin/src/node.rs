//! The CSI Node service: `NodePublishVolume` checks the request ([`super::request`]), reads
//! the node's row ([`Rows`]), admits or refuses ([`super::admit`]), builds the volume and proves its
//! artifact ([`super::layout`]: hashed, unless the plugin's proof of that inode still holds,
//! [`super::seals`]) and bind-mounts it read-only ([`super::mount`]); `NodeUnpublishVolume`
//! undoes that. Both are idempotent, and one volume has one operation at a time (another gets
//! `ABORTED`, which the kubelet retries).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kiln_crds::KilnNode;
use kiln_crds::kiln_node::NodeTargetStatus;
use tonic::{Request, Response, Status};

use super::admit::{Admission, admit};
use super::layout::{self, BuildError, Check, Sources};
use super::mount;
use super::proto::csi::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse, node_server,
};
use super::request::{self, Publish};
use super::seals::{self, Proof, Seals};
use kiln_node_core::cache::View;

/// Where the plugin reads a node's KilnNode rows.
pub trait Rows: Send + Sync + 'static {
    /// The rows of `node`'s KilnNode; `Ok(None)` when it has none; `Err` with a message when
    /// it cannot be read.
    fn rows(
        &self,
        node: &str,
    ) -> impl std::future::Future<Output = Result<Option<Vec<NodeTargetStatus>>, String>> + Send;
}

/// The apiserver: a GET of the node's KilnNode (the plugin's account may only `get` them).
pub struct KubeRows(pub kube::Api<KilnNode>);

impl Rows for KubeRows {
    async fn rows(&self, node: &str) -> Result<Option<Vec<NodeTargetStatus>>, String> {
        match self.0.get_opt(node).await {
            Ok(found) => Ok(found.map(|k| k.status.map(|s| s.targets).unwrap_or_default())),
            Err(e) => Err(format!("cannot read KilnNode {node}: {e}")),
        }
    }
}

/// The Node service of one node.
pub struct Node<R> {
    /// This node's name: the node id, and the KilnNode read.
    node: String,
    /// The node cache (read only; `published/` is the plugin's).
    cache: View,
    /// The kubelet's pods directory: every target path lies under it.
    pods: PathBuf,
    /// The node's rows.
    rows: R,
    /// Volumes with an operation under way.
    busy: Arc<Mutex<BTreeSet<String>>>,
    /// What the plugin proved of each cached artifact.
    seals: Arc<Seals>,
}

impl<R: Rows> Node<R> {
    /// The service for `node`, with the cache at `cache` and the kubelet's root directory
    /// `kubelet_dir`.
    pub fn new(node: String, cache: &Path, kubelet_dir: &Path, rows: R) -> Self {
        Self {
            node,
            cache: View::new(cache),
            pods: kubelet_dir.join("pods"),
            rows,
            busy: Arc::default(),
            seals: Arc::default(),
        }
    }

    fn published(&self, volume_id: &str) -> PathBuf {
        self.cache.root().join("published").join(volume_id)
    }

    /// Marks `volume_id` busy until the guard drops, or `ABORTED` when it already is.
    fn hold(&self, volume_id: &str) -> Result<Busy, Status> {
        let mut set = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if !set.insert(volume_id.to_string()) {
            return Err(Status::aborted(format!(
                "an operation on volume {volume_id} is under way; try again"
            )));
        }
        Ok(Busy {
            set: self.busy.clone(),
            id: volume_id.to_string(),
        })
    }

    async fn publish(&self, p: Publish) -> Result<(), Status> {
        let dir = self.published(&p.volume_id);
        let (target_path, done) = (p.target_path.clone(), dir.join(layout::INFO));
        if blocking(move || already_published(&target_path, &done)).await? {
            tracing::info!(volume = %p.volume_id, "already published");
            return Ok(());
        }
        let rows = self
            .rows
            .rows(&self.node)
            .await
            .map_err(Status::unavailable)?;
        let serving = match admit(&self.node, &p.namespace, &p.target, rows.as_deref()) {
            Admission::Mount(s) => s,
            Admission::Refuse(r) => {
                tracing::warn!(volume = %p.volume_id, pod = %format!("{}/{}", p.namespace, p.pod), reason = r.reason, message = %r.message, "not published");
                return Err(Status::new(r.code, r.message));
            }
        };
        let key = format!("{}/{}", p.namespace, p.target);
        let (artifact, manifest) = self
            .cache
            .artifact(&serving.digest)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        let fixture = self
            .cache
            .known_good(&key, serving.revision, &serving.digest)
            .and_then(|k| k.fixture_digest)
            .and_then(|d| Some((self.cache.blob(&d).ok()?, d)));
        let src = Sources {
            artifact,
            manifest,
            fixture,
        };
        let node = self.node.clone();
        let started = Instant::now();
        let (volume, revision) = (p.volume_id.clone(), serving.revision);
        let slot = self.seals.slot(&src.artifact);
        let hashed = blocking(move || {
            // A self-bind a killed publish left on the volume's directory goes first.
            while mount::at(&dir).ok().flatten().is_some() {
                mount::unmount(&dir).map_err(|e| Status::internal(format!("{}: {e}", dir.display())))?;
            }
            let mut proof = seals::lock(&slot);
            let check = match kiln_store::staged::Stamp::of(&src.artifact) {
                Ok(now) if seals::vouches(proof.as_ref(), &serving.digest, &now) => Check::Sealed(now),
                _ => Check::Hash,
            };
            let built = layout::build(&dir, &src, &p, &serving, &node, check).map_err(|e| {
                *proof = None;
                match e {
                    BuildError::NotCached(m) => Status::failed_precondition(m),
                    BuildError::HashMismatch(m) => Status::failed_precondition(m),
                    BuildError::Io(m) => Status::internal(m),
                }
            })?;
            *proof = Some(Proof { digest: serving.digest.clone(), stamp: built.stamp });
            drop(proof);
            let mounted = std::fs::create_dir_all(&p.target_path)
                .and_then(|()| mount::bind_read_only(&dir, &p.target_path));
            mounted.map_err(|e| {
                let _ = layout::remove(&dir);
                Status::internal(format!(
                    "bind-mounting {} read-only onto {}: {e}",
                    dir.display(),
                    p.target_path.display()
                ))
            })?;
            Ok(built.hashed)
        })
        .await
        .inspect_err(|s| tracing::warn!(volume = %volume, target = %key, message = %s.message(), "not published"))?;
        tracing::info!(volume = %volume, target = %key, revision, hashed, seconds = started.elapsed().as_secs_f64(), "published read-only");
        Ok(())
    }

    async fn unpublish(&self, volume_id: String, target_path: PathBuf) -> Result<(), Status> {
        let dir = self.published(&volume_id);
        let seals = self.seals.clone();
        blocking(move || {
            // A mount over a mount (a retried publish that raced) goes too; bounded.
            for _ in 0..8 {
                match mount::at(&target_path) {
                    Ok(Some(_)) => mount::unmount(&target_path).map_err(|e| {
                        Status::internal(format!("unmounting {}: {e}", target_path.display()))
                    })?,
                    Ok(None) => break,
                    Err(e) => return Err(Status::internal(format!("reading mountinfo: {e}"))),
                }
            }
            match std::fs::remove_dir(&target_path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Status::internal(format!(
                        "removing {}: {e}",
                        target_path.display()
                    )));
                }
                _ => {}
            }
            while mount::at(&dir).ok().flatten().is_some() {
                mount::unmount(&dir)
                    .map_err(|e| Status::internal(format!("{}: {e}", dir.display())))?;
            }
            let linked = std::fs::metadata(dir.join(layout::ARTIFACT)).ok();
            layout::remove(&dir)
                .map_err(|e| Status::internal(format!("removing {}: {e}", dir.display())))?;
            if let Some(meta) = linked {
                use std::os::unix::fs::MetadataExt;
                seals.unlinked(meta.dev(), meta.ino());
            }
            Ok(())
        })
        .await?;
        tracing::info!(volume = %volume_id, "unpublished");
        Ok(())
    }
}

/// Published already: a read-only mount at the target and a complete volume behind it. A
/// writable mount (a publish killed between bind and remount) or one without a complete volume
/// is unmounted, and the publish starts again.
fn already_published(target: &Path, done: &Path) -> Result<bool, Status> {
    let m = mount::at(target).map_err(|e| Status::internal(format!("reading mountinfo: {e}")))?;
    match m {
        Some(mount::Mounted { read_only: true }) if done.exists() => Ok(true),
        Some(_) => {
            tracing::warn!(target = %target.display(), "a writable or incomplete mount is there; unmounting it");
            mount::unmount(target)
                .map_err(|e| Status::internal(format!("unmounting {}: {e}", target.display())))?;
            Ok(false)
        }
        None => Ok(false),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("the plugin's worker thread failed: {e}")))?
}

/// A volume marked busy; unmarked on drop.
struct Busy {
    set: Arc<Mutex<BTreeSet<String>>>,
    id: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

#[tonic::async_trait]
impl<R: Rows> node_server::Node for Node<R> {
    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let p = request::publish(req.get_ref(), &self.pods).map_err(|m| {
            tracing::warn!(volume = %req.get_ref().volume_id, message = %m, "invalid publish request");
            Status::invalid_argument(m)
        })?;
        let _busy = self.hold(&p.volume_id)?;
        self.publish(p).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let u = request::unpublish(req.get_ref(), &self.pods).map_err(Status::invalid_argument)?;
        let _busy = self.hold(&u.volume_id)?;
        self.unpublish(u.volume_id, u.target_path).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // No staging, no stats, no expansion: a publish is the whole job.
        Ok(Response::new(NodeGetCapabilitiesResponse::default()))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node.clone(),
            ..Default::default()
        }))
    }
}
