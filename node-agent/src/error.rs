//! kiln-agent's error type. Every variant maps to one [`FailureReason`], which is what status,
//! Events and metric labels carry; the message says what to fix. Types only; touches nothing.

use std::path::Path;

use kiln_crds::FailureReason;

/// Result alias for the agent.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can stop the agent's pipeline.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input YAML or a field in it cannot be acted on.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// A URI could not be read.
    #[error("cannot fetch {uri}: {message}")]
    SourceUnavailable { uri: String, message: String },
    /// Bytes did not match their declared digest or size.
    #[error("{what}: {message}")]
    HashMismatch { what: String, message: String },
    /// An artifact's attestation is missing or not signed by a trusted key.
    #[error("untrusted {what}: {message}")]
    SignatureInvalid { what: String, message: String },
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
    StoreUnavailable { location: String, message: String },
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
            Self::InvalidSpec(_) => FailureReason::InvalidSpec,
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
            Self::LatencyBudgetExceeded(_) => FailureReason::LatencyBudgetExceeded,
            Self::MemoryBudgetExceeded(_) => FailureReason::MemoryBudgetExceeded,
            Self::Timeout(_) => FailureReason::Timeout,
            Self::EngineCrashed(_) | Self::EngineAnswer(_) => FailureReason::EngineCrashed,
            Self::InEngine { reason, .. } => *reason,
            Self::StoreUnavailable { .. } => FailureReason::StoreUnavailable,
            Self::NoCandidate { reason, .. } => *reason,
        }
    }

    /// A store error at `path`.
    pub fn store(path: impl AsRef<Path>, err: impl std::fmt::Display) -> Self {
        Self::StoreUnavailable {
            location: path.as_ref().display().to_string(),
            message: err.to_string(),
        }
    }
}

/// tract errors carry their whole context chain; keep all of it in the message.
pub fn chain(err: &tract_onnx::prelude::TractError) -> String {
    format!("{err:#}")
}

/// The store's errors (kiln-store, shared with the operator, which must not link an ML runtime)
/// become the agent's, reason for reason.
impl From<kiln_store::Error> for Error {
    fn from(err: kiln_store::Error) -> Self {
        match err {
            kiln_store::Error::Unavailable { location, message } => {
                Error::StoreUnavailable { location, message }
            }
            kiln_store::Error::InvalidUrl { .. } => Error::InvalidSpec(err.to_string()),
            kiln_store::Error::SignatureInvalid { what, message } => {
                Error::SignatureInvalid { what, message }
            }
            kiln_store::Error::HashMismatch { what, message } => {
                Error::HashMismatch { what, message }
            }
            kiln_store::Error::Refused {
                what,
                mismatch,
                dest,
            } => Error::HashMismatch {
                what,
                message: mismatch.refusal(&dest),
            },
        }
    }
}
