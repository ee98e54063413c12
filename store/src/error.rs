//! The store's one error type; every variant maps to one [`FailureReason`]. With it, why a
//! verified write refused its bytes ([`Mismatch`], re-exported by `staged`). Where a typed error
//! (I/O, JSON, the registry client's) caused an `Unavailable`, it is kept as the `#[source]`;
//! the message is the same either way. Types only; touches nothing.

use std::path::Path;

use kiln_crds::FailureReason;

/// A typed cause kept as a variant's `#[source]`.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias for store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in a store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store could not be reached, read or written (a path or a registry URL).
    #[error("store {location} unavailable: {message}")]
    Unavailable {
        location: String,
        message: String,
        /// The typed error this one came from, if any.
        #[source]
        source: Option<Cause>,
    },
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
    /// The destination's filesystem has too little free space for the bytes still to come;
    /// nothing was written (or what was is removed).
    #[error(
        "{what}: needs {needed} more bytes, {free} free on the filesystem of {}",
        .dir.display()
    )]
    InsufficientStorage {
        what: String,
        dir: std::path::PathBuf,
        needed: u64,
        free: u64,
    },
    /// The store URL cannot be used.
    #[error("store URL {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
}

impl Error {
    /// The store at `location` cannot be used, for the reason `message` gives (no typed cause).
    pub fn unavailable(location: impl std::fmt::Display, message: impl std::fmt::Display) -> Self {
        Self::Unavailable {
            location: location.to_string(),
            message: message.to_string(),
            source: None,
        }
    }

    /// The store at `location` cannot be used because of `err` (kept as the source).
    pub fn unavailable_by(
        location: impl std::fmt::Display,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let message = err.to_string();
        Self::unavailable_because(location, message, err)
    }

    /// The store at `location` cannot be used: `message` says what failed, `err` (kept as the
    /// source) caused it.
    pub fn unavailable_because(
        location: impl std::fmt::Display,
        message: String,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Unavailable {
            location: location.to_string(),
            message,
            source: Some(Box::new(err)),
        }
    }

    /// A store error at a filesystem path, caused by `err` (kept as the source).
    pub fn store(
        path: impl AsRef<std::path::Path>,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::unavailable_by(path.as_ref().display(), err)
    }

    /// [`Error::store`] with what to do about it after the cause's text.
    pub fn store_hint(
        path: impl AsRef<std::path::Path>,
        err: impl std::error::Error + Send + Sync + 'static,
        hint: &str,
    ) -> Self {
        Self::store_because(path, format!("{err}; {hint}"), err)
    }

    /// A store error at a filesystem path: `message` says what failed, `err` (kept as the
    /// source) caused it.
    pub fn store_because(
        path: impl AsRef<std::path::Path>,
        message: String,
        err: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::unavailable_because(path.as_ref().display(), message, err)
    }

    /// The shared failure reason for status, Events and metric labels.
    pub fn reason(&self) -> FailureReason {
        match self {
            Self::Unavailable { .. } => FailureReason::StoreUnavailable,
            Self::HashMismatch { .. } | Self::Refused { .. } => FailureReason::HashMismatch,
            Self::InvalidUrl { .. } => FailureReason::InvalidSpec,
            Self::SignatureInvalid { .. } => FailureReason::SignatureInvalid,
            Self::InsufficientStorage { .. } => FailureReason::InsufficientStorage,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn an_io_failure_keeps_the_io_error_as_its_source_and_its_text() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let err = Error::store_hint("/s/tmp", io, "pass a writable --store");
        assert_eq!(
            err.to_string(),
            "store /s/tmp unavailable: denied; pass a writable --store"
        );
        assert_eq!(err.reason(), FailureReason::StoreUnavailable);
        let cause = err.source().expect("a source");
        let io = cause
            .downcast_ref::<std::io::Error>()
            .expect("the io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);

        let json = serde_json::from_slice::<u32>(b"{").unwrap_err();
        let text = json.to_string();
        let err = Error::unavailable_by("signer", json);
        assert_eq!(err.to_string(), format!("store signer unavailable: {text}"));
        assert!(err.source().unwrap().is::<serde_json::Error>());
    }

    #[test]
    fn a_refusal_in_words_has_no_source() {
        let err = Error::unavailable("registry", "download broke off");
        assert_eq!(
            err.to_string(),
            "store registry unavailable: download broke off"
        );
        assert!(err.source().is_none());
    }
}
