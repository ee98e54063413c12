//! What this replica just wrote, standing in for caches that do not show it yet: the status of
//! each target (until the watch delivers the object the write replaced, or a later one) and the
//! node labels it set (for [`LABEL_MEMO`]). Shared by the reconciles (through
//! [`crate::context::Context`]) and the Node watch (an echo of this replica's own label write
//! wakes no target). No client; reads the monotonic clock for the label window.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kiln_crds::{CompiledTarget, CompiledTargetStatus};
use kube::ResourceExt;

/// (node, label key) → the value this replica wrote there, and when.
pub type LabelMemo = BTreeMap<(String, String), Written>;

/// A node label value this replica wrote.
pub struct Written {
    /// The value (`None`: removed).
    value: Option<String>,
    /// When.
    at: Instant,
}

/// Target uid → the status this replica wrote on it, and the resourceVersion of the object that
/// status replaced.
pub type StatusMemo = std::collections::HashMap<String, (String, CompiledTargetStatus)>;

/// `target` as this replica last wrote it. A reconcile that starts before the watch delivers the
/// target's own status write (a node label or a Job woke it) would see the old status, and write
/// the same status and publish the same Events again: on 1,000 new targets, 1.9 status writes
/// and Events each. While the cache still holds the resourceVersion the write replaced, the
/// written status stands in for the cached one; any other version (the echo, or somebody
/// else's write) ends the memo.
pub fn as_written<'a>(
    target: &'a CompiledTarget,
    uid: &str,
    written: &Mutex<StatusMemo>,
) -> std::borrow::Cow<'a, CompiledTarget> {
    let Ok(mut memo) = written.lock() else {
        return std::borrow::Cow::Borrowed(target);
    };
    match memo.get(uid) {
        Some((replaced, status)) if target.metadata.resource_version.as_ref() == Some(replaced) => {
            let mut fresher = target.clone();
            fresher.status = Some(status.clone());
            std::borrow::Cow::Owned(fresher)
        }
        Some(_) => {
            memo.remove(uid);
            std::borrow::Cow::Borrowed(target)
        }
        None => std::borrow::Cow::Borrowed(target),
    }
}

/// How long a node label this replica set is trusted over a cache that does not show it yet.
pub const LABEL_MEMO: Duration = Duration::from_secs(30);

/// Records that this replica applied `status` on `target` (the object as the cache held it).
pub fn wrote_status(
    written: &Mutex<StatusMemo>,
    target: &CompiledTarget,
    status: &CompiledTargetStatus,
) {
    if let (Some(uid), Some(replaced), Ok(mut memo)) = (
        target.uid(),
        target.metadata.resource_version.clone(),
        written.lock(),
    ) {
        memo.insert(uid, (replaced, status.clone()));
    }
}

/// Claims the write of `node`'s label `key` as `value` (`None`: removal): false when this
/// replica wrote that value within the window (nothing to patch). Forgets expired writes.
pub fn claim_label(
    labelled: &Mutex<LabelMemo>,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> bool {
    let memo = (node.to_string(), key.to_string());
    let want = value.map(str::to_string);
    labelled
        .lock()
        .map(|mut m| {
            m.retain(|_, w| w.at.elapsed() < LABEL_MEMO);
            let fresh = m.get(&memo).is_some_and(|w| w.value == want);
            if !fresh {
                let written = Written {
                    value: want.clone(),
                    at: Instant::now(),
                };
                m.insert(memo.clone(), written);
            }
            !fresh
        })
        .unwrap_or(true)
}

/// Gives a claim back: the patch of `node`'s label `key` wrote nothing.
pub fn release_label(labelled: &Mutex<LabelMemo>, node: &str, key: &str) {
    if let Ok(mut m) = labelled.lock() {
        m.remove(&(node.to_string(), key.to_string()));
    }
}

/// Whether this replica set `node`'s label `key` to `value` (`None`: removed it) within the
/// memo's window: a Node event showing it is the echo of that write.
pub fn wrote_label(
    labelled: &Mutex<LabelMemo>,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> bool {
    labelled.lock().is_ok_and(|m| {
        m.get(&(node.to_string(), key.to_string()))
            .is_some_and(|w| w.at.elapsed() < LABEL_MEMO && w.value.as_deref() == value)
    })
}

/// Forgets what this replica wrote on `node`, which was deleted: a Node registering again under
/// that name starts without those labels, and the memo must not stand in for them.
pub fn forget_node(labelled: &Mutex<LabelMemo>, node: &str) {
    if let Ok(mut m) = labelled.lock() {
        m.retain(|(n, _), _| n != node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(resource_version: &str, revision: i64) -> CompiledTarget {
        let mut t: CompiledTarget = serde_json::from_value(serde_json::json!({
            "apiVersion": "kiln.dev/v1alpha1",
            "kind": "CompiledTarget",
            "metadata": {"name": "t", "namespace": "ml", "uid": "u",
                         "resourceVersion": resource_version},
            "spec": {"modelRef": {"name": "m"}, "backend": {"kind": "tract"}, "profiles": [],
                     "warmup": {"fixtureVersion": "v1"}},
        }))
        .expect("target");
        t.status = Some(CompiledTargetStatus {
            revision: Some(revision),
            ..Default::default()
        });
        t
    }

    #[test]
    fn a_written_status_stands_in_until_the_cache_moves_past_what_it_replaced() {
        let written = Mutex::new(StatusMemo::new());
        let cached = target("10", 1);
        // Nothing written: the cache is the truth.
        assert_eq!(as_written(&cached, "u", &written).status, cached.status);
        let mine = CompiledTargetStatus {
            revision: Some(2),
            ..Default::default()
        };
        written
            .lock()
            .expect("memo")
            .insert("u".into(), ("10".into(), mine.clone()));
        // The cache still holds version 10, which the write replaced: the write stands in.
        assert_eq!(
            as_written(&cached, "u", &written).status.as_ref(),
            Some(&mine)
        );
        // Another uid is not this target.
        assert_eq!(as_written(&cached, "v", &written).status, cached.status);
        // The echo (or anybody's later write) arrives: the cache wins and the memo ends.
        let echoed = target("11", 2);
        assert_eq!(as_written(&echoed, "u", &written).status, echoed.status);
        assert!(written.lock().expect("memo").is_empty());
        assert_eq!(as_written(&cached, "u", &written).status, cached.status);
    }

    #[test]
    fn only_a_value_this_replica_wrote_recently_is_an_echo() {
        let labelled = Mutex::new(LabelMemo::new());
        let key = |n: &str| (n.to_string(), "kiln.dev/class".to_string());
        labelled.lock().expect("memo").insert(
            key("n1"),
            Written {
                value: Some("a".into()),
                at: Instant::now(),
            },
        );
        labelled.lock().expect("memo").insert(
            key("n2"),
            Written {
                value: None,
                at: Instant::now(),
            },
        );
        assert!(wrote_label(&labelled, "n1", "kiln.dev/class", Some("a")));
        assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", Some("b")));
        assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", None));
        assert!(!wrote_label(&labelled, "n1", "other", Some("a")));
        assert!(wrote_label(&labelled, "n2", "kiln.dev/class", None));
        // A deleted node's labels went with it: nothing it had is an echo any more, and the
        // other nodes' memos stay.
        forget_node(&labelled, "n1");
        assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", Some("a")));
        assert!(wrote_label(&labelled, "n2", "kiln.dev/class", None));
        assert!(!wrote_label(&labelled, "n3", "kiln.dev/class", Some("a")));
        // Past the memo's window it is nobody's echo.
        if let Some(old) = Instant::now().checked_sub(LABEL_MEMO) {
            labelled.lock().expect("memo").insert(
                key("n1"),
                Written {
                    value: Some("a".into()),
                    at: old,
                },
            );
            assert!(!wrote_label(&labelled, "n1", "kiln.dev/class", Some("a")));
        }
    }
}
