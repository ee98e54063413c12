//! The operator's error type: one variant per write or read that can fail, each naming the
//! object it failed on, with the cause kept as its `#[source]`. `category()` is the bounded
//! label for metrics and logs. Types only: nothing here talks to the API.

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An object lacks a field the API always sets (name, namespace, uid).
    #[error("{kind} without {field}")]
    Malformed {
        /// Kind of the object.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// The artifact store could not say whether it holds a compile key.
    #[error("looking up compile key {key} in the artifact store: {source}")]
    StoreLookup {
        /// The compile key.
        key: String,
        /// What the store said.
        #[source]
        source: kiln_store::Error,
    },
    /// A compile Job could not be created.
    #[error("creating Job {namespace}/{name}: {source}")]
    CreateJob {
        /// Namespace of the Job (the target's).
        namespace: String,
        /// Job name.
        name: String,
        /// What the API said.
        #[source]
        source: kube::Error,
    },
    /// A stale compile Job could not be deleted.
    #[error("deleting Job {namespace}/{name}: {source}")]
    DeleteJob {
        /// Namespace of the Job.
        namespace: String,
        /// Job name.
        name: String,
        /// What the API said.
        #[source]
        source: kube::Error,
    },
    /// A node label (class or readiness) could not be set or removed.
    #[error("patching label {key} of node {node}: {source}")]
    PatchNodeLabel {
        /// Node name.
        node: String,
        /// Label key.
        key: String,
        /// What the API said.
        #[source]
        source: kube::Error,
    },
    /// The status of a CompiledTarget or ModelArtifact could not be applied.
    #[error("applying the status of {kind} {namespace}/{name}: {source}")]
    ApplyStatus {
        /// Kind of the object.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What the API said.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Bounded category for metric labels and logs, one of a fixed set:
    ///
    /// * `api`: the API server answered with an error status (conflict, forbidden, invalid…);
    /// * `client`: a request got no answer (connection, TLS, timeout, a body that did not parse);
    /// * `store`: the artifact store could not be read;
    /// * `malformed`: an object lacked a field the API always sets.
    ///
    /// Which object failed is in the message, never in the label.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Malformed { .. } => "malformed",
            Self::StoreLookup { .. } => "store",
            Self::CreateJob { source, .. }
            | Self::DeleteJob { source, .. }
            | Self::PatchNodeLabel { source, .. }
            | Self::ApplyStatus { source, .. } => match source {
                kube::Error::Api(_) => "api",
                _ => "client",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("no", "Forbidden").with_code(403),
        ))
    }

    #[test]
    fn messages_name_the_object_and_categories_stay_bounded() {
        let e = Error::CreateJob {
            namespace: "ml".into(),
            name: "t-abc-1".into(),
            source: refused(),
        };
        assert!(
            e.to_string().starts_with("creating Job ml/t-abc-1: "),
            "{e}"
        );
        assert_eq!(e.category(), "api");
        assert!(std::error::Error::source(&e).is_some(), "the cause is kept");
        let e = Error::PatchNodeLabel {
            node: "gpu-1".into(),
            key: "kiln.dev/class".into(),
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        };
        assert_eq!(e.category(), "client");
        assert!(
            e.to_string().contains("kiln.dev/class of node gpu-1"),
            "{e}"
        );
        let e = Error::Malformed {
            kind: "CompiledTarget",
            field: "uid",
        };
        assert_eq!(
            (e.category(), e.to_string().as_str()),
            ("malformed", "CompiledTarget without uid")
        );
    }
}
