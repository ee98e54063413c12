//! The CSI node plugin's real gRPC servers over unix sockets, driven by tonic clients as the
//! kubelet drives them: identity and registration, invalid requests, publish refused before the
//! node's row is Ready and for a target not on the node, unpublish idempotent. As root it also
//! mounts: published read-only with the verified bytes, idempotent, a corrupt cache refused, a
//! writable mount left by a killed publish replaced, unpublished with nothing left; an artifact
//! hashed once for the node's pods (bytes read, from /proc/self/io) and a write to it caught. The rows come
//! from a fixed list here; the e2e test (`e2e/tests/csi.sh`) reads them from a real apiserver.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use kiln_crds::kiln_node::{NodePhase, NodeTargetStatus};
use kiln_csi::proto::csi::{
    GetPluginInfoRequest, NodeGetInfoRequest, NodePublishVolumeRequest, NodeUnpublishVolumeRequest,
    ProbeRequest, VolumeCapability, identity_client::IdentityClient, node_client::NodeClient,
    volume_capability,
};
use kiln_csi::proto::registration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use kiln_csi::{Config, node::Rows};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const NODE: &str = "node-1";
const VOLUME: &str = "csi-0123abcd";

/// Rows the test sets.
#[derive(Clone, Default)]
struct Fixed(Arc<Mutex<Option<Vec<NodeTargetStatus>>>>);

impl Fixed {
    fn set(&self, phase: NodePhase, digest: &str) {
        *self.0.lock().expect("lock") = Some(vec![NodeTargetStatus {
            namespace: "serving".into(),
            name: "squeezenet".into(),
            revision: 2,
            class: "cpu".into(),
            phase,
            artifact_digest: Some(digest.into()),
            ..Default::default()
        }]);
    }
}

impl Rows for Fixed {
    async fn rows(&self, _: &str) -> Result<Option<Vec<NodeTargetStatus>>, String> {
        Ok(self.0.lock().expect("lock").clone())
    }
}

struct Plugin {
    _tmp: tempfile::TempDir,
    config: Config,
    rows: Fixed,
    digest: String,
    served: tokio::task::JoinHandle<anyhow::Result<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A cache holding one artifact whose pass recorded a fixture, and the plugin serving it.
async fn start() -> Plugin {
    start_with(b"the compiled engine").await
}

/// [`start`] with the artifact's bytes.
async fn start_with(bytes: &[u8]) -> Plugin {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path();
    let cache = root.join("cache");
    let digest = kiln_store::staged::sha256_bytes(bytes);
    let fixture = b"fixture bytes".as_slice();
    let fixture_digest = kiln_store::staged::sha256_bytes(fixture);
    let dir = cache.join("artifacts").join(&digest);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::create_dir_all(cache.join("blobs")).expect("blobs");
    std::fs::write(dir.join("artifact"), bytes).expect("artifact");
    let manifest = serde_json::json!({
        "manifestVersion": 1, "compileKey": "0".repeat(64), "artifactDigest": digest,
        "artifactSize": bytes.len(), "mediaType": "application/vnd.kiln.tract.nnef.v1.tar",
        "backend": "tract", "backendVersion": "0", "toolVersion": "0", "precision": "fp32",
        "profiles": {}, "class": {},
        "host": {"arch": "amd64", "cpuLevel": "x", "cores": 1, "memoryBytes": 1},
        "flags": {}, "inputs": {}, "outputs": [], "unsupportedOperators": [],
        "parityMaxAbsError": null, "compileSeconds": 0.0, "converterLog": []
    });
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).expect("manifest");
    std::fs::write(cache.join("blobs").join(&fixture_digest), fixture).expect("blob");
    let index = serde_json::json!({"targets": {"serving/squeezenet": [{
        "revision": 2, "class": "cpu", "compileKey": "k", "digest": digest, "passedAt": 1,
        "generation": 1, "fixtureDigest": fixture_digest
    }]}});
    std::fs::write(cache.join("index.json"), index.to_string()).expect("index");
    let kubelet = root.join("kubelet");
    std::fs::create_dir_all(kubelet.join("pods")).expect("pods");
    let config = Config {
        endpoint: root.join("csi").join("csi.sock"),
        kubelet_endpoint: kubelet.join("plugins/csi.kiln.dev/csi.sock"),
        registration_dir: kubelet.join("plugins_registry"),
        kubelet_dir: kubelet,
        node: NODE.into(),
        cache,
    };
    // A stale socket from a previous run is replaced.
    std::fs::create_dir_all(root.join("csi")).expect("csi dir");
    drop(std::os::unix::net::UnixListener::bind(&config.endpoint).expect("stale"));
    let rows = Fixed::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(kiln_csi::serve(config.clone(), rows.clone(), async move {
        let _ = stopped.await;
    }));
    for _ in 0..100 {
        if config.registration_socket().exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Plugin {
        _tmp: tmp,
        config,
        rows,
        digest,
        served,
        stop: Some(stop),
    }
}

async fn channel(path: &Path) -> Channel {
    connect(path, "http://localhost").await
}

/// The `:authority` the kubelet's registration client sends: grpc-go 1.72's `encodeAuthority` of
/// the socket's path (it dials the bare path with no authority override).
fn grpc_go_authority(path: &Path) -> String {
    let keep = |b: u8| b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]@".contains(&b);
    path.display()
        .to_string()
        .bytes()
        .map(|b| {
            if keep(b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn connect(path: &Path, origin: &str) -> Channel {
    let path = path.to_path_buf();
    Endpoint::try_from(origin.to_string())
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .expect("connect")
}

impl Plugin {
    fn target_path(&self) -> PathBuf {
        self.config
            .kubelet_dir
            .join("pods/uid-1/volumes/kubernetes.io~csi/model/mount")
    }

    fn publish_request(&self) -> NodePublishVolumeRequest {
        self.publish_request_for(VOLUME, &self.target_path())
    }

    /// Pod `uid`'s volume `volume`: its target path and the request.
    fn second_pod(&self, volume: &str, uid: &str) -> (PathBuf, NodePublishVolumeRequest) {
        let path = self
            .config
            .kubelet_dir
            .join(format!("pods/{uid}/volumes/kubernetes.io~csi/model/mount"));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("kubelet's parent");
        let mut req = self.publish_request_for(volume, &path);
        req.volume_context
            .insert("csi.storage.k8s.io/pod.uid".into(), uid.into());
        (path, req)
    }

    fn publish_request_for(&self, volume: &str, target: &Path) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: volume.into(),
            target_path: target.display().to_string(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(volume_capability::AccessType::Mount(Default::default())),
                access_mode: None,
            }),
            readonly: true,
            volume_context: [
                ("csi.storage.k8s.io/ephemeral", "true"),
                ("csi.storage.k8s.io/pod.namespace", "serving"),
                ("csi.storage.k8s.io/pod.name", "web-0"),
                ("csi.storage.k8s.io/pod.uid", "uid-1"),
                ("target", "squeezenet"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        }
    }

    async fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(channel(&self.config.endpoint).await)
    }

    async fn publish(&self, req: NodePublishVolumeRequest) -> Result<(), tonic::Status> {
        self.node().await.node_publish_volume(req).await.map(|_| ())
    }

    async fn unpublish(&self) -> Result<(), tonic::Status> {
        self.unpublish_of(VOLUME, &self.target_path()).await
    }

    async fn unpublish_of(&self, volume: &str, target: &Path) -> Result<(), tonic::Status> {
        let req = NodeUnpublishVolumeRequest {
            volume_id: volume.into(),
            target_path: target.display().to_string(),
        };
        self.node()
            .await
            .node_unpublish_volume(req)
            .await
            .map(|_| ())
    }

    /// The node cache's copy of the artifact, `artifacts/<digest>/artifact`.
    fn cached_artifact(&self) -> PathBuf {
        self.config
            .cache
            .join("artifacts")
            .join(&self.digest)
            .join("artifact")
    }

    fn published(&self) -> PathBuf {
        self.config.cache.join("published").join(VOLUME)
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.served).await.expect("join")
    }
}

#[tokio::test]
async fn identity_registration_and_refusals_before_ready() {
    let p = start().await;
    let info = IdentityClient::new(channel(&p.config.endpoint).await)
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.name, "csi.kiln.dev");
    let probe = IdentityClient::new(channel(&p.config.endpoint).await)
        .probe(ProbeRequest {})
        .await
        .expect("probe");
    assert_eq!(probe.into_inner().ready, Some(true));
    // As the kubelet calls it: the socket's path, percent-encoded, as the authority.
    let origin = format!(
        "http://{}",
        grpc_go_authority(&p.config.registration_socket())
    );
    let reg = RegistrationClient::new(connect(&p.config.registration_socket(), &origin).await)
        .get_info(InfoRequest {})
        .await
        .expect("registration")
        .into_inner();
    assert_eq!(
        (
            reg.r#type.as_str(),
            reg.name.as_str(),
            reg.supported_versions
        ),
        ("CSIPlugin", "csi.kiln.dev", vec!["1.0.0".to_string()])
    );
    assert_eq!(
        reg.endpoint,
        p.config.kubelet_endpoint.display().to_string()
    );
    let id = p.node().await.node_get_info(NodeGetInfoRequest {}).await;
    assert_eq!(id.expect("node info").into_inner().node_id, NODE);

    // Invalid requests: refused with what to fix, before anything is read.
    let mut writable = p.publish_request();
    writable.readonly = false;
    let e = p.publish(writable).await.expect_err("writable");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("set readOnly: true"),
        "{}",
        e.message()
    );
    let mut outside = p.publish_request();
    outside.target_path = "/etc".into();
    let e = p.publish(outside).await.expect_err("outside");
    assert_eq!(e.code(), Code::InvalidArgument);

    // No KilnNode, no row, a row warming: refused, saying why; nothing published.
    let e = p.publish(p.publish_request()).await.expect_err("no node");
    assert_eq!(e.code(), Code::Unavailable);
    p.rows.set(NodePhase::Warming, &p.digest);
    let e = p.publish(p.publish_request()).await.expect_err("warming");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        "CompiledTarget serving/squeezenet is Warming on node node-1 (revision 2): not mounted \
         until it is Ready"
    );
    let mut other = p.publish_request();
    other
        .volume_context
        .insert("target".into(), "absent".into());
    let e = p.publish(other).await.expect_err("absent");
    assert!(
        e.message()
            .contains("serving/absent has no row on node node-1"),
        "{}",
        e.message()
    );
    assert!(!p.published().exists() && !p.target_path().exists());

    // Unpublishing what was never published succeeds.
    p.unpublish().await.expect("idempotent");
    p.unpublish().await.expect("idempotent");
    p.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_refused_registration_ends_the_plugin_with_an_error() {
    let p = start().await;
    RegistrationClient::new(channel(&p.config.registration_socket()).await)
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "version 9 not supported".into(),
        })
        .await
        .expect("notified");
    let served = tokio::time::timeout(std::time::Duration::from_secs(10), &mut { p }.served)
        .await
        .expect("ended")
        .expect("join");
    let e = served.expect_err("a failed registration is an error");
    assert!(e.to_string().contains("version 9 not supported"), "{e}");
}

/// Whether this process may mount (root); otherwise the test is skipped, saying why (a failure
/// under CI=true).
fn can_mount() -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root {
        kiln_endpoints::test_support::skip(
            "mounting needs root (CAP_SYS_ADMIN); run as root to test the mounts",
        );
    }
    root
}

/// Unmounts (lazily) whatever a failed assertion left mounted at the path.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        while kiln_csi::mount::at(&self.0).ok().flatten().is_some() {
            if rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH).is_err() {
                break;
            }
        }
    }
}

#[tokio::test]
async fn publishes_read_only_and_unpublishes_with_nothing_left() {
    if !can_mount() {
        return;
    }
    let p = start().await;
    let target = p.target_path();
    // The kubelet's pods directory is a shared mount (the kubelet makes its root rshared), with a
    // peer standing for the host's and the kubelet's view of it.
    let pods = p.config.kubelet_dir.join("pods");
    let peer = p.config.kubelet_dir.join("peer");
    std::fs::create_dir_all(&peer).expect("peer");
    let _pods = Unmount(pods.clone());
    let _peer = Unmount(peer.clone());
    rustix::mount::mount_bind(&pods, &pods).expect("self-bind");
    rustix::mount::mount_change(&pods, rustix::mount::MountPropagationFlags::SHARED)
        .expect("shared");
    rustix::mount::mount_bind(&pods, &peer).expect("peer");
    let _guard = Unmount(target.clone());
    std::fs::create_dir_all(target.parent().expect("parent")).expect("kubelet's parent");
    p.rows.set(NodePhase::Ready, &p.digest);
    p.publish(p.publish_request()).await.expect("published");
    let mounted = kiln_csi::mount::at(&target).expect("mountinfo");
    assert_eq!(mounted.map(|m| m.read_only), Some(true));
    // Read-only in the peer too: the read-only flag travels with the propagated mount.
    let seen = peer.join(target.strip_prefix(&pods).expect("under pods"));
    let propagated = kiln_csi::mount::at(&seen).expect("mountinfo");
    assert_eq!(
        propagated.map(|m| m.read_only),
        Some(true),
        "the propagated copy"
    );
    let (got, _) = kiln_store::staged::sha256_file(&target.join("artifact")).expect("hash");
    assert_eq!(got, p.digest);
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(target.join("kiln.json")).expect("kiln.json"))
            .expect("json");
    assert_eq!(info["digest"], p.digest.as_str());
    assert_eq!(
        (info["revision"].as_i64(), info["node"].as_str()),
        (Some(2), Some(NODE))
    );
    assert_eq!(
        std::fs::read(target.join("fixture.safetensors")).expect("fixture"),
        b"fixture bytes"
    );
    let write = std::fs::write(target.join("x"), b"x").expect_err("read-only");
    assert_eq!(
        write.raw_os_error(),
        Some(rustix::io::Errno::ROFS.raw_os_error())
    );
    // Again: nothing to do, still one read-only mount.
    p.publish(p.publish_request()).await.expect("idempotent");
    p.unpublish().await.expect("unpublished");
    assert!(kiln_csi::mount::at(&target).expect("mountinfo").is_none());
    assert!(!target.exists() && !p.published().exists());
    p.unpublish().await.expect("idempotent");

    // A publish killed between its bind and its remount left a writable mount: replaced.
    std::fs::create_dir_all(&target).expect("target");
    let scratch = p.config.cache.join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    rustix::mount::mount_bind(&scratch, &target).expect("writable bind");
    p.publish(p.publish_request())
        .await
        .expect("published over it");
    let mounted = kiln_csi::mount::at(&target).expect("mountinfo");
    assert_eq!(mounted.map(|m| m.read_only), Some(true));
    assert!(target.join("kiln.json").exists());
    p.unpublish().await.expect("unpublished");
    assert!(kiln_csi::mount::at(&target).expect("mountinfo").is_none());

    // The cached bytes changed: HashMismatch, nothing mounted, nothing left.
    let cached = p.cached_artifact();
    std::fs::write(&cached, b"the compiled engin3").expect("flip");
    let e = p.publish(p.publish_request()).await.expect_err("corrupt");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().starts_with("HashMismatch"), "{}", e.message());
    assert!(kiln_csi::mount::at(&target).expect("mountinfo").is_none());
    assert!(!p.published().exists());
    p.stop().await.expect("clean stop");
}

/// Bytes this process has read through `read(2)` and the like so far (`rchar`, page cache
/// included): what a hash of the artifact cannot avoid.
fn bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("rchar")
}

#[tokio::test]
async fn an_artifact_is_hashed_once_per_node_and_any_write_is_caught() {
    if !can_mount() {
        return;
    }
    const SIZE: usize = 64 << 20;
    let bytes: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let p = start_with(&bytes).await;
    p.rows.set(NodePhase::Ready, &p.digest);
    let (first, second) = (
        p.second_pod("csi-first", "uid-a"),
        p.second_pod("csi-second", "uid-b"),
    );
    let _guards = (Unmount(first.0.clone()), Unmount(second.0.clone()));
    // The first pod's volume: the artifact hashed, every byte read.
    let before = bytes_read();
    p.publish(first.1.clone()).await.expect("first");
    let hashed = bytes_read() - before;
    assert!(hashed >= SIZE as u64, "the first mount read {hashed} bytes");
    // The second pod's: the plugin's proof holds, the artifact is not read again.
    let before = bytes_read();
    p.publish(second.1.clone()).await.expect("second");
    let again = bytes_read() - before;
    assert!(
        again < SIZE as u64 / 4,
        "the second mount read {again} bytes"
    );
    let (got, _) = kiln_store::staged::sha256_file(&second.0.join("artifact")).expect("hash");
    assert_eq!(got, p.digest, "the same verified bytes");
    // The plugin's own unlink of the first volume keeps the proof.
    p.unpublish_of("csi-first", &first.0)
        .await
        .expect("unpublished");
    let before = bytes_read();
    p.publish(first.1.clone()).await.expect("first again");
    assert!(
        bytes_read() - before < SIZE as u64 / 4,
        "re-read after its own unlink"
    );
    // A byte flipped in the cache with its modification time set back: the change time moved,
    // so the next mount hashes and refuses it.
    let cached = p.cached_artifact();
    let stamp = kiln_store::staged::Stamp::of(&cached).expect("stat");
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&cached)
            .expect("open");
        f.seek(std::io::SeekFrom::Start(SIZE as u64 / 2))
            .expect("seek");
        f.write_all(&[bytes[SIZE / 2] ^ 1]).expect("flip");
    }
    let mtime = rustix::fs::Timespec {
        tv_sec: stamp.mtime_ns / 1_000_000_000,
        tv_nsec: stamp.mtime_ns % 1_000_000_000,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &cached,
        &rustix::fs::Timestamps {
            last_access: mtime,
            last_modification: mtime,
        },
        rustix::fs::AtFlags::empty(),
    )
    .expect("set the time back");
    let third = p.second_pod("csi-third", "uid-c");
    let _third = Unmount(third.0.clone());
    let e = p.publish(third.1).await.expect_err("corrupt");
    assert!(e.message().starts_with("HashMismatch"), "{}", e.message());
    assert!(kiln_csi::mount::at(&third.0).expect("mountinfo").is_none());
    for (volume, path) in [("csi-first", &first.0), ("csi-second", &second.0)] {
        p.unpublish_of(volume, path).await.expect("unpublished");
    }
    p.stop().await.expect("clean stop");
}
