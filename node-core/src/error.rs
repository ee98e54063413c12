//! kiln-agent's error type. Every variant maps to one [`FailureReason`], which is what status,
//! Events and metric labels carry; the message says what to fix. Where a typed error caused it
//! (an I/O error, the store's error, a JSON error) the variant keeps it as its `#[source]`, so
//! `source()` walks to it; kiln's own refusals are text only, and so is an error that crossed
//! the engine's process boundary ([`Error::InEngine`]: a cause cannot cross a process). The
//! message is the same either way. Types only; touches nothing.

use std::path::Path;

use kiln_crds::FailureReason;

/// A typed cause kept as a variant's `#[source]`.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias for the agent.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can stop the agent's pipeline.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input YAML or a field in it cannot be acted on.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// The input could not be read or parsed (I/O, YAML, JSON): an [`Error::InvalidSpec`] that
    /// keeps its cause.
    #[error("invalid spec: {message}")]
    SpecUnreadable {
        message: String,
        #[source]
        source: Cause,
    },
    /// A URI could not be read.
    #[error("cannot fetch {uri}: {message}")]
    SourceUnavailable {
        uri: String,
        message: String,
        /// The typed error this one came from, if any.
        #[source]
        source: Option<Cause>,
    },
    /// Bytes did not match their declared digest or size.
    #[error("{what}: {message}")]
    HashMismatch {
        what: String,
        message: String,
        /// The typed error this one came from, if any.
        #[source]
        source: Option<Cause>,
    },
    /// An artifact's attestation is missing or not signed by a trusted key.
    #[error("untrusted {what}: {message}")]
    SignatureInvalid {
        what: String,
        message: String,
        /// The typed error this one came from, if any.
        #[source]
        source: Option<Cause>,
    },
    /// The model uses operators the backend cannot run.
    #[error("unsupported operator(s) for backend {backend}: {}", operators.join(", "))]
    UnsupportedOperator {
        backend: String,
        operators: Vec<String>,
    },
    /// The artifact does not fit this machine.
    #[error("incompatible hardware: {0}")]
    IncompatibleHardware(String),
    /// The artifact was built by another backend version or runtime.
    #[error("incompatible runtime: {0}")]
    IncompatibleRuntime(String),
    /// The backend could not compile the model.
    #[error("compile failed: {0}")]
    CompileFailed(String),
    /// The artifact could not be loaded.
    #[error("load failed: {0}")]
    LoadFailed(String),
    /// Running the fixtures failed.
    #[error("warmup failed: {0}")]
    WarmupFailed(String),
    /// An output was outside tolerance.
    #[error("parity exceeded: {0}")]
    ParityExceeded(String),
    /// A language model's tokenizer disagrees with the fixture's reference tokenizer.
    #[error("tokenizer mismatch: {0}")]
    TokenizerMismatch(String),
    /// The chat template is not the one the fixture was rendered with.
    #[error("chat template mismatch: {0}")]
    ChatTemplateMismatch(String),
    /// Steady-state latency above budget.
    #[error("latency budget exceeded: {0}")]
    LatencyBudgetExceeded(String),

    #[error("memory budget exceeded: {0}")]
    MemoryBudgetExceeded(String),
    /// A step ran past its deadline.
    #[error("timeout: {0}")]
    Timeout(String),
    /// The engine's process was killed by a signal, aborted, or exited without an answer.
    #[error("engine crashed: {0}")]
    EngineCrashed(String),
    /// The engine's process could not be started, fed or waited for: an
    /// [`Error::EngineCrashed`] that keeps the I/O or JSON error that caused it.
    #[error("engine crashed: {message}")]
    EngineUnreachable {
        message: String,
        #[source]
        source: Cause,
    },
    /// The engine's process answered, but not in the checked format (malformed, truncated,
    /// oversized): never trusted, counted as a crash of the engine.
    #[error("engine crashed: its answer was refused: {0}")]
    EngineAnswer(String),
    /// An error the engine's process reported, with the reason it classified it as; `message`
    /// is that error's whole text.
    #[error("{message}")]
    InEngine {
        reason: FailureReason,
        message: String,
    },
    /// The store could not be used.
    #[error("store {location} unavailable: {message}")]
    StoreUnavailable {
        location: String,
        message: String,
        /// The typed error this one came from, if any.
        #[source]
        source: Option<Cause>,
    },
    /// The node cache's filesystem cannot take the artifact (the store's message says where).
    #[error("{message}")]
    InsufficientStorage {
        /// Bytes still to be written.
        needed: u64,
        /// Bytes free.
        free: u64,
        message: String,
    },
    /// `backend.kind: auto`: no engine candidate passed; the reason is the one most candidates
    /// failed with, the message names every candidate's.
    #[error("no engine candidate passed: {message}")]
    NoCandidate {
        reason: FailureReason,
        message: String,
    },
}

impl Error {
    /// The shared failure reason for status, Events and metric labels.
    pub fn reason(&self) -> FailureReason {
        match self {
            Self::InvalidSpec(_) | Self::SpecUnreadable { .. } => FailureReason::InvalidSpec,
            Self::SourceUnavailable { .. } => FailureReason::SourceUnavailable,
            Self::HashMismatch { .. } => FailureReason::HashMismatch,
            Self::SignatureInvalid { .. } => FailureReason::SignatureInvalid,
            Self::UnsupportedOperator { .. } => FailureReason::UnsupportedOperator,
            Self::IncompatibleHardware(_) => FailureReason::IncompatibleHardware,
            Self::IncompatibleRuntime(_) => FailureReason::IncompatibleRuntime,
            Self::CompileFailed(_) => FailureReason::CompileFailed,
            Self::LoadFailed(_) => FailureReason::LoadFailed,
            Self::WarmupFailed(_) => FailureReason::WarmupFailed,
            Self::ParityExceeded(_) => FailureReason::ParityExceeded,
            Self::TokenizerMismatch(_) => FailureReason::TokenizerMismatch,
            Self::ChatTemplateMismatch(_) => FailureReason::ChatTemplateMismatch,
            Self::LatencyBudgetExceeded(_) => FailureReason::LatencyBudgetExceeded,
            Self::MemoryBudgetExceeded(_) => FailureReason::MemoryBudgetExceeded,
            Self::Timeout(_) => FailureReason::Timeout,
            Self::EngineCrashed(_) | Self::EngineUnreachable { .. } | Self::EngineAnswer(_) => {
                FailureReason::EngineCrashed
            }
            Self::InEngine { reason, .. } => *reason,
            Self::StoreUnavailable { .. } => FailureReason::StoreUnavailable,
            Self::InsufficientStorage { .. } => FailureReason::InsufficientStorage,
            Self::NoCandidate { reason, .. } => *reason,
        }
    }

    /// [`Error::SpecUnreadable`]: `message` says what, `err` (kept as the source) caused it.
    pub fn spec_unreadable(
        message: String,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::SpecUnreadable {
            message,
            source: Box::new(err),
        }
    }

    /// [`Error::EngineUnreachable`]: `message` says what, `err` (kept as the source) caused it.
    pub fn engine_unreachable(
        message: String,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::EngineUnreachable {
            message,
            source: Box::new(err),
        }
    }

    /// A store error at `path`, caused by `err` (kept as the source).
    pub fn store(
        path: impl AsRef<Path>,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::StoreUnavailable {
            location: path.as_ref().display().to_string(),
            message: err.to_string(),
            source: Some(Box::new(err)),
        }
    }

    /// [`Error::store`] with what to do about it after the cause's text.
    pub fn store_hint(
        path: impl AsRef<Path>,
        err: impl std::error::Error + Send + Sync + 'static,
        hint: &str,
    ) -> Self {
        Self::StoreUnavailable {
            location: path.as_ref().display().to_string(),
            message: format!("{err}; {hint}"),
            source: Some(Box::new(err)),
        }
    }

    /// `uri` could not be read because of `err` (kept as the source).
    pub fn source_unavailable(
        uri: impl Into<String>,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let message = err.to_string();
        Self::source_failed(uri, message, err)
    }

    /// `uri` could not be read: `message` says why, `err` (kept as the source) caused it.
    pub fn source_failed(
        uri: impl Into<String>,
        message: String,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::SourceUnavailable {
            uri: uri.into(),
            message,
            source: Some(Box::new(err)),
        }
    }
}

/// An error with those of its causes whose text it does not already say. reqwest's own text
/// omits its causes ("error sending request" says not whether a timeout, a refused redirect or
/// TLS stopped it); the agent's and the store's errors already say their `#[source]`'s text,
/// so printing their chain this way (not with anyhow's `{:#}`) does not repeat it.
pub fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// tract's errors (`TractError` is `anyhow::Error`) carry their whole context chain; keep all
/// of it in the message.
pub fn chain(err: &anyhow::Error) -> String {
    format!("{err:#}")
}

/// The store's errors (kiln-store, shared with the operator, which must not link an ML runtime)
/// become the agent's, reason for reason.
impl From<kiln_store::Error> for Error {
    fn from(err: kiln_store::Error) -> Self {
        match &err {
            kiln_store::Error::Unavailable {
                location, message, ..
            } => Error::StoreUnavailable {
                location: location.clone(),
                message: message.clone(),
                source: Some(Box::new(err)),
            },
            kiln_store::Error::InvalidUrl { .. } => Error::InvalidSpec(err.to_string()),
            kiln_store::Error::InsufficientStorage { needed, free, .. } => {
                Error::InsufficientStorage {
                    needed: *needed,
                    free: *free,
                    message: err.to_string(),
                }
            }
            kiln_store::Error::SignatureInvalid { what, message } => Error::SignatureInvalid {
                what: what.clone(),
                message: message.clone(),
                source: Some(Box::new(err)),
            },
            kiln_store::Error::HashMismatch { what, message } => Error::HashMismatch {
                what: what.clone(),
                message: message.clone(),
                source: Some(Box::new(err)),
            },
            kiln_store::Error::Refused {
                what,
                mismatch,
                dest,
            } => Error::HashMismatch {
                what: what.clone(),
                message: mismatch.refusal(dest),
                source: Some(Box::new(err)),
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// The first cause in `err`'s `source()` chain that is an `E`.
    fn find<E: std::error::Error + 'static>(err: &Error) -> Option<&E> {
        let mut next = err.source();
        while let Some(cause) = next {
            if let Some(found) = cause.downcast_ref::<E>() {
                return Some(found);
            }
            next = cause.source();
        }
        None
    }

    #[test]
    fn an_io_failure_keeps_the_io_error_as_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        let err = std::fs::read(&missing)
            .map_err(|e| Error::store(&missing, e))
            .unwrap_err();
        let io = find::<std::io::Error>(&err).expect("the chain reaches the io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(err.reason(), FailureReason::StoreUnavailable);
        assert_eq!(
            err.to_string(),
            format!("store {} unavailable: {io}", missing.display())
        );

        let err = Error::store_hint(&missing, std::io::Error::other("denied"), "fix it");
        assert!(err.to_string().ends_with("unavailable: denied; fix it"));
        assert_eq!(find::<std::io::Error>(&err).unwrap().to_string(), "denied");

        let err = Error::source_unavailable("file:///x", std::io::Error::other("gone"));
        assert_eq!(err.to_string(), "cannot fetch file:///x: gone");
        assert_eq!(err.reason(), FailureReason::SourceUnavailable);
        assert!(find::<std::io::Error>(&err).is_some());
    }

    #[test]
    fn a_store_failure_keeps_the_store_error_and_its_reason() {
        let cases = [
            (
                kiln_store::Error::unavailable("oci://r/x", "HTTP 503"),
                FailureReason::StoreUnavailable,
                "store oci://r/x unavailable: HTTP 503",
            ),
            (
                kiln_store::Error::HashMismatch {
                    what: "blob".into(),
                    message: "short".into(),
                },
                FailureReason::HashMismatch,
                "blob: short",
            ),
            (
                kiln_store::Error::SignatureInvalid {
                    what: "entry".into(),
                    message: "unknown key".into(),
                },
                FailureReason::SignatureInvalid,
                "untrusted entry: unknown key",
            ),
            (
                kiln_store::Error::Refused {
                    what: "artifact".into(),
                    mismatch: kiln_store::staged::Mismatch::TooLarge { expected: 3 },
                    dest: "/c/a".into(),
                },
                FailureReason::HashMismatch,
                "artifact: more than the expected 3 bytes arrived; refusing the rest; nothing was written to /c/a",
            ),
        ];
        for (store, reason, message) in cases {
            let store_text = store.to_string();
            let err = Error::from(store);
            assert_eq!(err.reason(), reason, "{message}");
            assert_eq!(err.to_string(), message);
            let kept = find::<kiln_store::Error>(&err).expect("the chain reaches the store error");
            assert_eq!(kept.to_string(), store_text);
        }
    }

    #[test]
    fn a_store_io_failure_chains_through_the_store_error_to_the_io_error() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
        let err = Error::from(kiln_store::Error::store("/s/blobs", io));
        assert_eq!(err.to_string(), "store /s/blobs unavailable: disk full");
        assert!(find::<kiln_store::Error>(&err).is_some());
        let io = find::<std::io::Error>(&err).expect("the chain reaches the io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
    }

    #[test]
    fn an_engine_that_cannot_be_started_keeps_the_io_error() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let err = Error::engine_unreachable("compile: cannot start: denied".into(), io);
        assert_eq!(
            err.to_string(),
            "engine crashed: compile: cannot start: denied"
        );
        assert_eq!(err.reason(), FailureReason::EngineCrashed);
        assert!(find::<std::io::Error>(&err).is_some());
    }

    #[test]
    fn printing_the_chain_does_not_repeat_a_cause_the_message_says() {
        let io = std::io::Error::other("disk full");
        let err = anyhow::Error::from(Error::from(kiln_store::Error::store("/s", io)))
            .context("cannot open the store");
        assert_eq!(
            with_causes(err.as_ref()),
            "cannot open the store: store /s unavailable: disk full"
        );
        let plain = anyhow::Error::from(std::io::Error::other("gone")).context("reading x");
        assert_eq!(with_causes(plain.as_ref()), "reading x: gone");
    }

    #[test]
    fn kilns_own_refusals_have_no_source() {
        let err = Error::from(kiln_store::Error::InvalidUrl {
            url: "ftp://x".into(),
            message: "unsupported scheme".into(),
        });
        assert_eq!(err.reason(), FailureReason::InvalidSpec);
        assert!(err.source().is_none());
        assert!(Error::InvalidSpec("no".into()).source().is_none());
    }
}
