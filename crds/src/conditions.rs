//! kstatus-shaped conditions: `Ready`, `Reconciling`, `Stalled` plus kiln's domain conditions,
//! kept in a list keyed by `type` so server-side apply merges them per condition.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The object is in its desired state.
pub const READY: &str = "Ready";
/// The controller is working towards the desired state.
pub const RECONCILING: &str = "Reconciling";
/// Progress stopped until somebody changes the spec or the environment.
pub const STALLED: &str = "Stalled";
/// Every class has a compiled artifact.
pub const COMPILED: &str = "Compiled";
/// Serving continues on a fallback, not the artifact asked for.
pub const DEGRADED: &str = "Degraded";

/// Condition reasons the operator writes, other than a [`crate::FailureReason`] (a classified
/// compile or node failure is its own reason: `HashMismatch`, `CompileFailed`, …). One constant
/// per string, so that status, Events and the tests that read them agree.
pub mod reasons {
    // CompiledTarget: progress and health.

    /// Every class has `rollout.promoteAtReadyPercent` of its nodes ready on the current revision.
    pub const READY: &str = "Ready";
    /// Every class is compiled; nodes are still pulling, loading or warming it.
    pub const WARMING: &str = "Warming";
    /// Every class is compiled; no node of a class short of its threshold has reported yet.
    pub const WAITING_FOR_NODES: &str = "WaitingForNodes";
    /// Every class is compiled (the `Compiled` condition).
    pub const COMPILED: &str = "Compiled";
    /// Some class's compile Job is running.
    pub const COMPILING: &str = "Compiling";
    /// Classes wait for a compile slot and none of the target's compiles runs.
    pub const QUEUED: &str = "Queued";
    /// A class's compile failed and is retried after the backoff.
    pub const RETRYING: &str = "Retrying";
    /// Every selected node has settled, too few are ready, and the failing ones gave no reason.
    pub const NODES_FAILED: &str = "NodesFailed";
    /// Selected nodes have no class yet: their agent has not reported their hardware.
    pub const WAITING_FOR_NODE_FACTS: &str = "WaitingForNodeFacts";

    // CompiledTarget: `Degraded`.

    /// `Degraded=False`: nodes serve what the spec asks for.
    pub const AS_SPECIFIED: &str = "AsSpecified";
    /// `Degraded=True`: nodes serve a fallback instead of the current revision.
    pub const FALLBACK: &str = "Fallback";
    /// `Degraded=True`: the current spec does not compile; the previous revision is served.
    pub const PREVIOUS_REVISION: &str = "PreviousRevision";
    /// Degraded, Ready, Stalled: `rollout.autoRollback` serves a known-good revision because the
    /// newest failed on nodes.
    pub const AUTO_ROLLED_BACK: &str = "AutoRolledBack";

    // CompiledTarget: the spec cannot be acted on (`Stalled=True`).

    /// `spec.nodeSelector` matches no node.
    pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";
    /// None of the selected nodes carries one of `spec.classLabelKeys`.
    pub const CLASS_KEY_NOT_FOUND: &str = "ClassKeyNotFound";
    /// `spec.modelRef` names no ModelArtifact in the target's namespace.
    pub const MODEL_NOT_FOUND: &str = "ModelNotFound";
    /// `spec.modelRef.namespace` is not the target's own namespace.
    pub const MODEL_IN_OTHER_NAMESPACE: &str = "ModelInOtherNamespace";
    /// The operator's compile workers do not have the backend.
    pub const BACKEND_UNAVAILABLE: &str = "BackendUnavailable";
    /// `spec.warmup.fixtureVersion` is not among the model's fixtures.
    pub const FIXTURE_NOT_FOUND: &str = "FixtureNotFound";
    /// A shape profile does not bind the model's symbolic dims.
    pub const INVALID_PROFILE: &str = "InvalidProfile";
    /// `spec.compile` asks for more resources, or other tolerations, than the operator allows.
    pub const COMPILE_REQUEST_REFUSED: &str = "CompileRequestRefused";

    // ModelArtifact.

    /// The declaration can be acted on (its problems are [`crate::FailureReason::InvalidSpec`]).
    pub const ACCEPTED: &str = "Accepted";
}

/// Reasons of a serving pod's `kiln.dev/warm` condition (the agent writes them; `kubectl describe
/// pod` shows them), other than a node row's phase (`Pending`, `Warming`, …) or a
/// [`crate::FailureReason`] passed through from the row or the pod's own check.
pub mod gate_reasons {
    /// The node serves the target's artifact as specified, and the pod's endpoint (when it names
    /// a server) gave the golden answers.
    pub const READY: &str = "Ready";
    /// The node serves a fallback the target's policy allows.
    pub const DEGRADED: &str = "Degraded";
    /// The pod's annotations cannot be acted on (no `kiln.dev/target`, an unknown protocol, …).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The named CompiledTarget does not exist or does not select this node.
    pub const NOT_SELECTED: &str = "NotSelected";
    /// The node is ready; the pod's server has not answered yet (its containers are not ready).
    pub const WAITING_FOR_SERVER: &str = "WaitingForServer";
    /// The pod's server is being sent the fixture's samples.
    pub const WARMING_SERVER: &str = "WarmingServer";
    /// The pod's server did not answer (connection refused, timeout, not ready).
    pub const SERVING_UNREACHABLE: &str = "ServingUnreachable";
    /// It answered, but not in the protocol the pod names.
    pub const SERVING_MALFORMED: &str = "ServingMalformed";
    /// It serves something else: another model, template, tokenizer, inputs or outputs.
    pub const SERVING_MISMATCH: &str = "ServingMismatch";
    /// Its answers are outside the target's tolerances.
    pub const SERVING_PARITY_EXCEEDED: &str = "ServingParityExceeded";
    /// It refused the agent's credentials (401, 403), or the API key the pod names
    /// (`kiln.dev/api-key-secret`) could not be read.
    pub const SERVING_UNAUTHORIZED: &str = "ServingUnauthorized";
}

/// A condition whose status is a bool.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

/// Puts `new` into `conditions`, keeping the old transition time when the status did not change,
/// so that re-reconciling an unchanged object writes identical status.
pub fn upsert(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            *old = new;
        }
        None => conditions.push(new),
    }
}

/// Whether the condition of that type is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("timestamp"))
    }

    #[test]
    fn upsert_keeps_transition_time_when_status_is_unchanged() {
        let mut conds = vec![condition(READY, false, "Compiling", "a", Some(1), at(10))];
        upsert(
            &mut conds,
            condition(READY, false, "Warming", "b", Some(2), at(20)),
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, at(10));
        assert_eq!(conds[0].reason, "Warming");
        upsert(
            &mut conds,
            condition(READY, true, "Ready", "c", Some(2), at(30)),
        );
        assert_eq!(conds[0].last_transition_time, at(30));
        assert!(is_true(&conds, READY));
        upsert(
            &mut conds,
            condition(STALLED, false, "Progressing", "", Some(2), at(30)),
        );
        assert_eq!(conds.len(), 2);
    }
}
