//! The operator's error type. `category()` is the bounded label for metrics and logs.

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// The artifact store could not be read.
    #[error("artifact store: {0}")]
    Store(#[source] kiln_store::Error),
    /// An object lacks a field the API always sets (name, namespace, uid).
    #[error("object without {0}")]
    Malformed(&'static str),
}

impl Error {
    /// Bounded category for metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube(kube::Error::Api(_)) => "api",
            Self::Kube(_) => "client",
            Self::Store(_) => "store",
            Self::Malformed(_) => "malformed",
        }
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Self::Kube(e)
    }
}
