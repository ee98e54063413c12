//! What a `NodePublishVolume` or `NodeUnpublishVolume` request asks, checked as hostile input
//! (pure): every refusal is a message for `INVALID_ARGUMENT` that says what to fix.

use std::path::{Component, Path, PathBuf};

pub use kiln_crds::names::{is_dns1123_label, is_dns1123_subdomain};

use super::proto::csi::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, volume_capability::AccessType,
};

/// `volume_context` keys the kubelet sets for an inline volume of a pod (`podInfoOnMount`).
pub const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// The pod's namespace.
pub const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// The pod's name.
pub const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// The pod's uid.
pub const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
/// The one attribute a user sets: the CompiledTarget, in the pod's namespace.
pub const TARGET: &str = "target";
/// The prefix of the keys the kubelet adds (service account tokens, the pod's identity).
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// A publish request that passed every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    /// The kubelet's id of the volume: one safe path component.
    pub volume_id: String,
    /// Where the volume goes: under the kubelet's `pods/` directory.
    pub target_path: PathBuf,
    /// The pod's namespace, where the target is looked up.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid.
    pub pod_uid: String,
    /// The CompiledTarget's name.
    pub target: String,
}

/// An unpublish request that passed every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpublish {
    /// The kubelet's id of the volume.
    pub volume_id: String,
    /// Where the volume was mounted.
    pub target_path: PathBuf,
}

/// Checks a publish request; `pods` is the kubelet's pods directory, which every target path
/// must lie under.
pub fn publish(req: &NodePublishVolumeRequest, pods: &Path) -> Result<Publish, String> {
    let volume_id = volume_id(&req.volume_id)?;
    let target_path = target_path(&req.target_path, pods)?;
    let capability = req.volume_capability.as_ref().ok_or(
        "volume_capability is missing: the kubelet sends one for every volume; csi.kiln.dev \
         serves a filesystem (mount) volume",
    )?;
    match capability.access_type {
        Some(AccessType::Mount(_)) => {}
        Some(AccessType::Block(_)) => {
            return Err(
                "csi.kiln.dev serves a read-only directory, not a block device: use \
                 a filesystem volume (volumeMode Filesystem)"
                    .into(),
            );
        }
        None => return Err("volume_capability has no access type: want mount".into()),
    }
    if !req.readonly {
        return Err(
            "csi.kiln.dev volumes are read-only: set readOnly: true on the pod's \
             csi volume (volumes[].csi.readOnly)"
                .into(),
        );
    }
    let ctx = &req.volume_context;
    if ctx.get(EPHEMERAL).map(String::as_str) != Some("true") {
        return Err(format!(
            "csi.kiln.dev serves only inline volumes of a pod (volumes[].csi), not \
             PersistentVolumes: {EPHEMERAL} is not \"true\""
        ));
    }
    let pod_info =
        |key: &str| {
            ctx.get(key).filter(|v| !v.is_empty()).cloned().ok_or_else(|| {
            format!(
                "{key} is missing: the CSIDriver csi.kiln.dev must set podInfoOnMount: true \
                 (the chart does)"
            )
        })
        };
    let (namespace, pod, pod_uid) = (
        pod_info(POD_NAMESPACE)?,
        pod_info(POD_NAME)?,
        pod_info(POD_UID)?,
    );
    if let Some(key) = ctx
        .keys()
        .find(|k| k.as_str() != TARGET && !k.starts_with(KUBELET_PREFIX))
    {
        return Err(format!(
            "unknown volumeAttributes key {key:?}: csi.kiln.dev takes only {TARGET:?} (the \
             CompiledTarget's name)"
        ));
    }
    let target = ctx.get(TARGET).ok_or_else(|| {
        format!(
            "volumeAttributes has no {TARGET:?}: name the CompiledTarget (in the pod's \
             namespace) whose artifact to mount"
        )
    })?;
    if !is_dns1123_subdomain(target) {
        return Err(format!(
            "volumeAttributes {TARGET:?} = {target:?} is not a CompiledTarget name (lowercase \
             letters, digits, '-' and '.', at most 253 characters, starting and ending with a \
             letter or digit)"
        ));
    }
    if !is_dns1123_label(&namespace) {
        return Err(format!(
            "{POD_NAMESPACE} {namespace:?} is not a namespace name"
        ));
    }
    Ok(Publish {
        volume_id,
        target_path,
        namespace,
        pod,
        pod_uid,
        target: target.clone(),
    })
}

/// Checks an unpublish request; `pods` as for [`publish`].
pub fn unpublish(req: &NodeUnpublishVolumeRequest, pods: &Path) -> Result<Unpublish, String> {
    Ok(Unpublish {
        volume_id: volume_id(&req.volume_id)?,
        target_path: target_path(&req.target_path, pods)?,
    })
}

/// A volume id names a directory of `published/`: one path component of at most 128 safe
/// characters, not starting with a dot (the kubelet's are `csi-<sha256 hex>`).
pub fn volume_id(id: &str) -> Result<String, String> {
    let safe = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if id.is_empty() || id.len() > 128 || id.starts_with('.') || !id.bytes().all(safe) {
        return Err(format!(
            "volume_id {id:?} is not 1 to 128 letters, digits, '-', '_' or '.' (not starting \
             with '.')"
        ));
    }
    Ok(id.to_string())
}

fn target_path(path: &str, pods: &Path) -> Result<PathBuf, String> {
    let p = Path::new(path);
    // Written as it resolves: no '..', and no '.', '//' or trailing '/' that `components` would
    // hide (mountinfo names the path plainly, and the idempotence check compares with it).
    let plain = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && p.components().collect::<PathBuf>().as_os_str() == p.as_os_str();
    if !plain || !p.starts_with(pods) || p == pods {
        return Err(format!(
            "target_path {path:?} is not a plain absolute path (no '.', '..' or '//') under the \
             kubelet's pods directory {} (set --kubelet-dir to the kubelet's --root-dir)",
            pods.display()
        ));
    }
    Ok(p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::csi::{VolumeCapability, volume_capability};

    const PODS: &str = "/var/lib/kubelet/pods";
    const TARGET_PATH: &str = "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/model/mount";

    fn good() -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: format!("csi-{}", "a".repeat(64)),
            target_path: TARGET_PATH.into(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(volume_capability::MountVolume::default())),
                access_mode: None,
            }),
            readonly: true,
            volume_context: [
                (EPHEMERAL, "true"),
                (POD_NAMESPACE, "serving"),
                (POD_NAME, "web-0"),
                (POD_UID, "uid-1"),
                ("csi.storage.k8s.io/serviceAccount.name", "default"),
                (TARGET, "squeezenet"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        }
    }

    fn refused(edit: impl FnOnce(&mut NodePublishVolumeRequest)) -> String {
        let mut req = good();
        edit(&mut req);
        publish(&req, Path::new(PODS)).expect_err("refused")
    }

    #[test]
    fn a_pods_inline_read_only_volume_is_accepted() {
        let p = publish(&good(), Path::new(PODS)).expect("accepted");
        assert_eq!(
            (p.namespace.as_str(), p.pod.as_str(), p.target.as_str()),
            ("serving", "web-0", "squeezenet")
        );
        assert_eq!(p.target_path, Path::new(TARGET_PATH));
    }

    #[test]
    fn every_refusal_says_what_to_fix() {
        assert!(refused(|r| r.readonly = false).contains("set readOnly: true"));
        assert!(refused(|r| r.volume_capability = None).contains("volume_capability"));
        let block = refused(|r| {
            r.volume_capability = Some(VolumeCapability {
                access_type: Some(AccessType::Block(Default::default())),
                access_mode: None,
            })
        });
        assert!(block.contains("not a block device"), "{block}");
        let pv = refused(|r| {
            r.volume_context.remove(EPHEMERAL);
        });
        assert!(pv.contains("not PersistentVolumes"), "{pv}");
        let pod_info = refused(|r| {
            r.volume_context.remove(POD_UID);
        });
        assert!(pod_info.contains("podInfoOnMount: true"), "{pod_info}");
        let none = refused(|r| {
            r.volume_context.remove(TARGET);
        });
        assert!(none.contains("name the CompiledTarget"), "{none}");
        let typo = refused(|r| {
            r.volume_context.insert("traget".into(), "x".into());
        });
        assert!(
            typo.contains("unknown volumeAttributes key \"traget\""),
            "{typo}"
        );
        for bad in ["", "Squeeze", "a/b", "../x", "-a", "a..b", &"a".repeat(254)] {
            let msg = refused(|r| {
                r.volume_context.insert(TARGET.into(), bad.into());
            });
            assert!(
                msg.contains("is not a CompiledTarget name"),
                "{bad:?}: {msg}"
            );
        }
    }

    #[test]
    fn volume_ids_and_target_paths_cannot_leave_their_directories() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            ".hidden",
            "a b",
            &"a".repeat(129),
        ] {
            let msg = refused(|r| r.volume_id = bad.into());
            assert!(msg.contains("volume_id"), "{bad:?}: {msg}");
        }
        for bad in [
            "relative/path",
            "/etc",
            "/var/lib/kubelet/pods",
            "/var/lib/kubelet/pods/../../../etc",
            "/var/lib/kubelet/pods/uid/./mount",
            "/var/lib/kubelet/pods//uid/mount",
            "/var/lib/kubelet/pods/uid/mount/",
            "/var/lib/kubelet/podsx/uid",
        ] {
            let msg = refused(|r| r.target_path = bad.into());
            assert!(msg.contains("--kubelet-dir"), "{bad:?}: {msg}");
        }
        let un = NodeUnpublishVolumeRequest {
            volume_id: "../x".into(),
            target_path: TARGET_PATH.into(),
        };
        assert!(unpublish(&un, Path::new(PODS)).is_err());
    }

    #[test]
    fn dns1123() {
        assert!(is_dns1123_subdomain("a.b-c.d0"));
        assert!(!is_dns1123_subdomain("a_b"));
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(!is_dns1123_label("a."));
    }
}
