//! The ModelArtifact controller: kstatus conditions saying whether the declaration can be acted
//! on. Admission (schema + CEL) already refused most bad input; what is left is checked here.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_crds::conditions::{READY, RECONCILING, STALLED, condition, reasons, upsert};
use kiln_crds::{FailureReason, ModelArtifact, ModelArtifactStatus};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};

use crate::context::MANAGER;
use crate::error::Error;

/// The status a ModelArtifact should have. Pure.
pub fn status(model: &ModelArtifact, now: Time) -> ModelArtifactStatus {
    let old = model.status.clone().unwrap_or_default();
    let generation = model.metadata.generation;
    let mut conditions = old.conditions.clone();
    let problem = if model.spec.fixtures.is_empty() {
        Some("the model has no fixtures; add at least one fixture version so nodes can verify it")
    } else {
        None
    };
    let (ready, reason, message) = match problem {
        Some(p) => (false, FailureReason::InvalidSpec.as_str(), p.to_string()),
        None => (
            true,
            reasons::ACCEPTED,
            format!(
                "source sha256:{}, {} fixture version(s), {} asset(s)",
                model.spec.source.sha256,
                model.spec.fixtures.len(),
                model.spec.assets.len()
            ),
        ),
    };
    upsert(
        &mut conditions,
        condition(
            READY,
            ready,
            reason,
            message.clone(),
            generation,
            now.clone(),
        ),
    );
    upsert(
        &mut conditions,
        condition(
            STALLED,
            !ready,
            reason,
            if ready { String::new() } else { message },
            generation,
            now.clone(),
        ),
    );
    upsert(
        &mut conditions,
        condition(RECONCILING, false, reason, "", generation, now),
    );
    ModelArtifactStatus {
        observed_generation: generation,
        conditions,
    }
}

/// Reconciles one ModelArtifact: writes status only when it changes.
pub async fn reconcile(model: Arc<ModelArtifact>, client: Arc<Client>) -> Result<Action, Error> {
    let ns = model.namespace().ok_or(Error::Malformed {
        kind: "ModelArtifact",
        field: "namespace",
    })?;
    let new = status(&model, Time(k8s_openapi::jiff::Timestamp::now()));
    if Some(&new) != model.status.as_ref() {
        let api: Api<ModelArtifact> = Api::namespaced((*client).clone(), &ns);
        let body = kiln_crds::status_apply::<ModelArtifact>(&new);
        api.patch_status(
            &model.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::ApplyStatus {
            kind: "ModelArtifact",
            namespace: ns.clone(),
            name: model.name_any(),
            source,
        })?;
    }
    Ok(Action::await_change())
}

/// Retries a failed ModelArtifact reconcile after a pause.
pub fn error_policy(_: Arc<ModelArtifact>, err: &Error, _: Arc<Client>) -> Action {
    tracing::warn!(category = err.category(), %err, "ModelArtifact reconcile failed");
    Action::requeue(Duration::from_secs(15))
}
