//! The artifact store lives in `kiln-store`, shared with the operator (which must not link an ML
//! runtime); this module re-exports it and maps its errors onto the agent's.

pub use kiln_store::{ArtifactRef, Entry, FsStore, RegistryOptions, Store};

use crate::error::Error;

impl From<kiln_store::Error> for Error {
    fn from(err: kiln_store::Error) -> Self {
        match err {
            kiln_store::Error::Unavailable { location, message } => {
                Error::StoreUnavailable { location, message }
            }
            kiln_store::Error::InvalidUrl { .. } => Error::InvalidSpec(err.to_string()),
            kiln_store::Error::HashMismatch { what, message } => {
                Error::HashMismatch { what, message }
            }
        }
    }
}
