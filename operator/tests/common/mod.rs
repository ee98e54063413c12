//! What the operator's tests that build a reconcile `Context` by hand share.
#![allow(dead_code)]

use std::path::Path;

use kiln_operator::job::{JobSettings, JobStore};
use kube::runtime::events::{Recorder, Reporter};

/// Compile Job settings for a filesystem store at `dir`, pull policy Never.
pub fn job_settings(dir: &Path) -> JobSettings {
    JobSettings {
        image_pull_policy: "Never".into(),
        store: JobStore::HostPath(dir.display().to_string()),
        sources_host_path: None,
        run_as_user: 65532,
        active_deadline_seconds: 60,
        ttl_seconds_after_finished: 60,
        signing_secret: None,
        service_account: None,
        source_trust_secret: None,
        require_source_signature: false,
    }
}

/// An Event recorder reporting as `kiln-operator`.
pub fn recorder(client: kube::Client) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "kiln-operator".into(),
            instance: None,
        },
    )
}
