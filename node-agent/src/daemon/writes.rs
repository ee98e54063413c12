//! The agent's only writes to the apiserver: create its own KilnNode, server-side apply its
//! status (field manager `kiln-agent`), and patch the `kiln.dev/warm` condition of pods on its
//! own node. Callers decide when; this module never writes unchanged state on its own.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kiln_crds::labels::WARM_CONDITION;
use kiln_crds::{KilnNode, KilnNodeSpec, KilnNodeStatus};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::gate::GateCondition;

/// Field manager of every agent write.
pub const MANAGER: &str = "kiln-agent";

/// Creates the node's KilnNode unless it exists, owned by its Node (when `owner` names it), so
/// that Kubernetes' garbage collector deletes it with the Node: a node that leaves the cluster
/// leaves no KilnNode behind.
pub async fn ensure_kiln_node(
    api: &Api<KilnNode>,
    name: &str,
    owner: Option<OwnerReference>,
) -> kube::Result<()> {
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let mut node = KilnNode::new(name, KilnNodeSpec::default());
    node.metadata.owner_references = owner.map(|o| vec![o]);
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {
            tracing::info!(kiln_node = name, "created KilnNode");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The owner reference to `node`'s Node object, read by a list with a field selector (what the
/// agent's RBAC allows); `None` when the Node is not found.
pub async fn node_owner(api: &Api<Node>, node: &str) -> kube::Result<Option<OwnerReference>> {
    let params = kube::api::ListParams::default().fields(&format!("metadata.name={node}"));
    let list = api.list(&params).await?;
    Ok(list.items.into_iter().next().and_then(|n| owner_ref(&n)))
}

/// The owner reference to a Node (not a controller, blocking nothing).
pub fn owner_ref(node: &Node) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.metadata.name.clone()?,
        uid: node.metadata.uid.clone()?,
        controller: None,
        block_owner_deletion: None,
    })
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
pub async fn patch_gate(
    api: &Api<Pod>,
    name: &str,
    warm: &GateCondition,
    now: Time,
) -> kube::Result<()> {
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
