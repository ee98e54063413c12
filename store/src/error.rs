//! The store's one error type; every variant maps to one [`FailureReason`]. With it, why a
//! verified write refused its bytes ([`Mismatch`], re-exported by `staged`). Types only;
//! touches nothing.

use std::path::Path;

use kiln_crds::FailureReason;

/// Result alias for store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in a store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store could not be reached, read or written (a path or a registry URL).
    #[error("store {location} unavailable: {message}")]
    Unavailable { location: String, message: String },
    /// Bytes (an artifact or a manifest) do not match the digest or size they were asked for.
    #[error("{what}: {message}")]
    HashMismatch { what: String, message: String },
    /// A verified write refused its bytes: they are not what was expected, and nothing was
    /// written to `dest`.
    #[error("{what}: {}", .mismatch.refusal(.dest))]
    Refused {
        what: String,
        mismatch: Mismatch,
        dest: std::path::PathBuf,
    },
    /// An entry's attestation is missing, not signed by a trusted key, or about something else.
    #[error("{what}: {message}")]
    SignatureInvalid { what: String, message: String },
    /// The store URL cannot be used.
    #[error("store URL {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
}

impl Error {
    /// The store at `location` cannot be used.
    pub fn unavailable(location: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        Self::Unavailable {
            location: location.to_string(),
            message: err.to_string(),
        }
    }

    /// A store error at a filesystem path.
    pub fn store(path: impl AsRef<std::path::Path>, err: impl std::fmt::Display) -> Self {
        Self::unavailable(path.as_ref().display(), err)
    }

    /// The shared failure reason for status, Events and metric labels.
    pub fn reason(&self) -> FailureReason {
        match self {
            Self::Unavailable { .. } => FailureReason::StoreUnavailable,
            Self::HashMismatch { .. } | Self::Refused { .. } => FailureReason::HashMismatch,
            Self::InvalidUrl { .. } => FailureReason::InvalidSpec,
            Self::SignatureInvalid { .. } => FailureReason::SignatureInvalid,
        }
    }
}

/// Why a verified write refused its bytes (see [`Error::Refused`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// More bytes arrived than the expected size; the rest was refused.
    #[error("more than the expected {expected} bytes arrived; refusing the rest")]
    TooLarge {
        /// The expected size.
        expected: u64,
    },
    /// The bytes ended short of the expected size.
    #[error(
        "got {got} bytes, expected {expected}; the transfer was cut short or the stored blob is truncated"
    )]
    Short {
        /// Bytes that arrived.
        got: u64,
        /// The expected size.
        expected: u64,
    },
    /// The bytes hash to something else.
    #[error("sha256 mismatch: expected {expected}, got {got}; the stored bytes are corrupt")]
    Digest {
        /// sha256 of what arrived.
        got: String,
        /// The expected sha256.
        expected: String,
    },
}

impl Mismatch {
    /// The store's message for a refused write of `dest`.
    pub fn refusal(&self, dest: &Path) -> String {
        format!("{self}; nothing was written to {}", dest.display())
    }
}
