//! Reading compile Jobs back: their state from Job conditions, and for a failed one the
//! classified reason from the worker's termination message (`Reason: message`, written by
//! `kiln-agent compile`) or, when the worker never got that far, from what the kubelet says.
//! Pure: objects in, [`JobView`] out.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kiln_crds::FailureReason;

use super::{ANN_ATTEMPT, ANN_KEY, COMPILER_CONTAINER};
use crate::plan::{JobState, JobView};

/// Longest failure message kept in status (conditions stay readable, objects stay small).
const MAX_MESSAGE: usize = 900;

/// How a Job ended, from its conditions: `Some(Ok(()))` complete, `Some(Err(reason))` failed.
pub fn outcome(job: &Job) -> Option<Result<(), String>> {
    let conds = job.status.as_ref()?.conditions.as_ref()?;
    let is = |t: &str| conds.iter().find(|c| c.type_ == t && c.status == "True");
    if is("Complete").is_some() {
        return Some(Ok(()));
    }
    is("Failed").map(|c| Err(c.reason.clone().unwrap_or_default()))
}

/// The view the plan needs; `failure` is the classified failure for a failed Job.
pub fn view(job: &Job, failure: Option<(FailureReason, String)>) -> Option<JobView> {
    let ann = job.metadata.annotations.as_ref()?;
    let compile_key = ann.get(ANN_KEY)?.clone();
    let attempt = ann.get(ANN_ATTEMPT)?.parse().ok()?;
    let status = job.status.as_ref();
    let finished_at = status.and_then(|s| {
        s.completion_time.clone().or_else(|| {
            s.conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Failed" && c.status == "True")?
                .last_transition_time
                .clone()
        })
    });
    let state = match outcome(job) {
        None => JobState::Active,
        Some(Ok(())) => JobState::Succeeded,
        Some(Err(job_reason)) => {
            let (reason, message) = failure.unwrap_or_else(|| failure_reason(&job_reason, None));
            JobState::Failed { reason, message }
        }
    };
    Some(JobView {
        name: job.metadata.name.clone()?,
        compile_key,
        attempt,
        state,
        finished_at,
        deleting: job.metadata.deletion_timestamp.is_some(),
    })
}

/// The failure of a Job whose Job condition reason is `job_reason`, given its pod (if found).
pub fn failure_reason(job_reason: &str, pod: Option<&Pod>) -> (FailureReason, String) {
    // The publisher (`compile`), or an exec Job's compiler init container when that is what
    // failed (the publisher then never ran).
    let status = pod.and_then(|p| p.status.as_ref());
    let terminated_in = |statuses: Option<&Vec<ContainerStatus>>, name: &str| {
        statuses
            .and_then(|cs| cs.iter().find(|c| c.name == name))
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone())
    };
    let terminated = terminated_in(
        status.and_then(|s| s.container_statuses.as_ref()),
        "compile",
    )
    .or_else(|| {
        terminated_in(
            status.and_then(|s| s.init_container_statuses.as_ref()),
            COMPILER_CONTAINER,
        )
        .filter(|t| t.exit_code != 0)
    });
    let terminated = terminated.as_ref();
    let pod_reason = pod
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.reason.clone())
        .unwrap_or_default();
    if job_reason == "DeadlineExceeded" || pod_reason == "DeadlineExceeded" {
        return (
            FailureReason::Timeout,
            "the compile Job ran past its deadline; raise spec.compile.activeDeadlineSeconds or give it more resources".into(),
        );
    }
    let Some(term) = terminated else {
        return (
            FailureReason::CompileFailed,
            format!("the compile Job failed ({job_reason}) before its container reported anything"),
        );
    };
    let text = term.message.clone().unwrap_or_default();
    if term.reason.as_deref() == Some("OOMKilled") {
        return (
            FailureReason::CompileFailed,
            "the compiler ran out of memory (OOMKilled); raise spec.compile.resources.limits.memory".into(),
        );
    }
    // `kiln-agent compile` writes `Reason: message` as its termination message.
    let (reason, message) = text
        .split_once(": ")
        .and_then(|(r, m)| {
            serde_json::from_value::<FailureReason>(serde_json::Value::String(r.trim().into()))
                .ok()
                .map(|r| (r, m.trim().to_string()))
        })
        .unwrap_or_else(|| {
            // No classified message: the worker crashed; what the kubelet kept of its log is the
            // best explanation there is.
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            (
                FailureReason::CompileFailed,
                format!(
                    "compile worker exited {}; log tail: {}",
                    term.exit_code,
                    tail.join(" | ")
                ),
            )
        });
    (reason, truncate(&message))
}

fn truncate(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut cut = MAX_MESSAGE;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn terminated(name: &str, code: i32, message: &str) -> serde_json::Value {
        serde_json::json!({"name": name, "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": code, "message": message}}})
    }

    #[test]
    fn an_exec_compiler_failure_is_read_from_its_init_container() {
        let p = pod(serde_json::json!({"status": {
            "initContainerStatuses": [terminated("kiln-tools", 0, ""), terminated(COMPILER_CONTAINER, 1, "CompileFailed: backend.command \"x\" exited with status 3")],
            "containerStatuses": [{"name": "compile", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]
        }}));
        let (reason, message) = failure_reason("BackoffLimitExceeded", Some(&p));
        assert_eq!(reason, FailureReason::CompileFailed);
        assert!(message.contains("exited with status 3"), "{message}");
        // The publisher's verdict wins when it ran.
        let p = pod(serde_json::json!({"status": {
            "initContainerStatuses": [terminated(COMPILER_CONTAINER, 0, "Compiled: handed over")],
            "containerStatuses": [terminated("compile", 1, "ParityExceeded: y off by 3")]
        }}));
        let (reason, _) = failure_reason("BackoffLimitExceeded", Some(&p));
        assert_eq!(reason, FailureReason::ParityExceeded);
    }
}
