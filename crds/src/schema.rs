//! Schema fragments shared by the resources: patterns that the apiserver enforces.

/// A lowercase hex sha256 digest.
pub const SHA256_PATTERN: &str = "^[0-9a-f]{64}$";
/// The URI schemes kiln fetches from.
pub const URI_PATTERN: &str = "^(https|oci|file)://.+$";
