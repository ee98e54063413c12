//! The agent's only writes to the apiserver: create its own KilnNode, server-side apply its
//! status (field manager `kiln-agent`), and patch the `kiln.dev/warm` condition of pods on its
//! own node. Callers decide when; this module never writes unchanged state on its own.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::labels::WARM_CONDITION;
use kiln_crds::{KilnNode, KilnNodeSpec, KilnNodeStatus};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::gate::Warm;

/// Field manager of every agent write.
pub const MANAGER: &str = "kiln-agent";

/// Creates the node's KilnNode unless it exists.
pub async fn ensure_kiln_node(api: &Api<KilnNode>, name: &str) -> kube::Result<()> {
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let node = KilnNode::new(name, KilnNodeSpec::default());
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {
            tracing::info!(kiln_node = name, "created KilnNode");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Applies the whole status; the agent owns every field of it.
pub async fn apply_status(
    api: &Api<KilnNode>,
    name: &str,
    status: &KilnNodeStatus,
) -> kube::Result<()> {
    api.patch_status(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(kiln_crds::status_apply::<KilnNode>(status)),
    )
    .await
    .map(|_| ())
}

/// Sets the pod's `kiln.dev/warm` condition (strategic merge: the conditions list merges by
/// type, so the kubelet's own conditions are untouched).
pub async fn patch_gate(api: &Api<Pod>, name: &str, warm: &Warm, now: Time) -> kube::Result<()> {
    let patch = serde_json::json!({
        "status": {"conditions": [{
            "type": WARM_CONDITION,
            "status": if warm.status { "True" } else { "False" },
            "reason": warm.reason,
            "message": warm.message,
            "lastTransitionTime": now,
        }]}
    });
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch_status(name, &params, &Patch::Strategic(patch))
        .await
        .map(|_| ())
}
