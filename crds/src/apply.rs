//! The body of a server-side apply of a kiln resource's status subresource, the one shape the
//! operator and the agent both send. Pure: builds a value, sends nothing.

use std::borrow::Cow;

use kube::Resource;
use kube::core::object::HasStatus;
use serde::Serialize;

/// `{"apiVersion", "kind", "status"}`: what `Api::patch_status` with `Patch::Apply` needs
/// (apply wants the type's identity in the body; metadata comes from the URL).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusApply<'a, S> {
    /// `kiln.dev/v1alpha1`.
    pub api_version: Cow<'static, str>,
    /// The resource's kind.
    pub kind: Cow<'static, str>,
    /// The whole status, as the field manager owns it.
    pub status: &'a S,
}

/// The apply body for `status` of a `K`: `status_apply::<CompiledTarget>(&status)`.
pub fn status_apply<K>(status: &K::Status) -> StatusApply<'_, K::Status>
where
    K: Resource<DynamicType = ()> + HasStatus,
{
    StatusApply {
        api_version: K::api_version(&()),
        kind: K::kind(&()),
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CompiledTarget, CompiledTargetStatus, KilnNode, KilnNodeStatus};

    #[test]
    fn names_the_type_and_carries_the_status() {
        let status = CompiledTargetStatus {
            revision: Some(3),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(status_apply::<CompiledTarget>(&status)).expect("json"),
            serde_json::json!({
                "apiVersion": "kiln.dev/v1alpha1",
                "kind": "CompiledTarget",
                "status": {"revision": 3},
            })
        );
        let node = KilnNodeStatus::default();
        let body = serde_json::to_value(status_apply::<KilnNode>(&node)).expect("json");
        assert_eq!(
            (&body["apiVersion"], &body["kind"]),
            (
                &serde_json::json!("kiln.dev/v1alpha1"),
                &serde_json::json!("KilnNode")
            )
        );
    }
}
