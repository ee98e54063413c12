//! Per-step deadlines for the agent, so that one slow or hostile target (a source that trickles
//! bytes just under the read timeout, a model that takes an hour to load or warm) cannot hold the
//! node's other targets: past its deadline a step is `Timeout` for its own target and the agent
//! goes on. An async step is cancelled; load and warmup run in the engine's own process
//! (`kiln_engines::pipeline::isolate`), whose whole process group is killed when its deadline passes.
//! Pure plumbing: runs what it is given; touches nothing itself.

use std::future::Future;
use std::time::Duration;

use kiln_node_core::error::{Error, Result};

/// How long each step of preparing one target may take.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// Pulling the artifact and fetching the fixture.
    pub pull: Duration,
    /// Loading and warming the engine.
    pub warm: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            pull: Duration::from_secs(1800),
            warm: Duration::from_secs(600),
        }
    }
}

/// `step`, or `Timeout` naming `what` and the `flag` that sets the limit.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    flag: &str,
    step: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, step)
        .await
        .unwrap_or_else(|_| Err(late(limit, what, flag)))
}

fn late(limit: Duration, what: &str, flag: &str) -> Error {
    Error::Timeout(format!(
        "{what} took longer than {}s ({flag}); the agent went on with its other targets",
        limit.as_secs()
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_past_its_deadline_is_a_timeout_and_others_go_on() {
        let started = std::time::Instant::now();
        let slow = within(
            Duration::from_millis(50),
            "pulling t",
            "--pull-deadline-seconds",
            async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            },
        )
        .await
        .unwrap_err();
        assert_eq!(slow.reason(), kiln_crds::FailureReason::Timeout);
        assert!(
            slow.to_string().contains("--pull-deadline-seconds"),
            "{slow}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "waited for the slow step"
        );
    }
}
