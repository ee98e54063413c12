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
