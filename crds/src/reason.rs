//! The one failure-reason enum: status conditions, Events and metric labels all use it, so a
//! reason seen in `kubectl describe` is the same string an alert matches on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why a compile, a verification, a load or a warmup did not succeed.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum FailureReason {
    /// The source, an asset or a fixture could not be fetched.
    SourceUnavailable,
    /// Bytes did not hash to the declared sha256 (or had the wrong size).
    HashMismatch,
    /// A signature did not verify.
    SignatureInvalid,
    /// The model uses an operator the backend cannot run.
    UnsupportedOperator,
    /// The device does not match the class the artifact was built for.
    IncompatibleHardware,
    /// The installed runtime or driver does not match the artifact's build manifest.
    IncompatibleRuntime,
    /// The backend failed to compile the model.
    CompileFailed,
    /// The artifact could not be loaded.
    LoadFailed,
    /// Running the warmup fixtures failed.
    WarmupFailed,
    /// An output differed from its golden value beyond atol/rtol.
    ParityExceeded,
    /// A language model's own tokenizer gave other token ids for the fixture's text than the
    /// reference tokenizer did, or detokenized its continuation to other text (the first
    /// differing position and both pieces are in the message).
    TokenizerMismatch,
    /// The chat template that renders a fixture's chat messages is not the one the fixture was
    /// made with (both sha256 digests are in the message).
    ChatTemplateMismatch,
    /// Warmup latency exceeded the configured budget.
    LatencyBudgetExceeded,
    /// The engine's peak memory in load and warmup exceeded `warmup.memoryBudget`.
    MemoryBudgetExceeded,
    /// A step ran past its deadline.
    Timeout,
    /// The engine's process (a child of kiln-agent) was killed by a signal, aborted or exited
    /// without a well-formed answer; the signal or exit status is in the message.
    EngineCrashed,
    /// The artifact store could not be read or written.
    StoreUnavailable,
    /// The node cache's filesystem has too little free space for the artifact, even after
    /// evicting what may go (the bytes needed and free are in the message).
    InsufficientStorage,
    /// The spec cannot be acted on as written.
    InvalidSpec,
}

impl FailureReason {
    /// Every reason, for pre-registering metric label values.
    pub const ALL: [FailureReason; 19] = [
        Self::SourceUnavailable,
        Self::HashMismatch,
        Self::SignatureInvalid,
        Self::UnsupportedOperator,
        Self::IncompatibleHardware,
        Self::IncompatibleRuntime,
        Self::CompileFailed,
        Self::LoadFailed,
        Self::WarmupFailed,
        Self::ParityExceeded,
        Self::TokenizerMismatch,
        Self::ChatTemplateMismatch,
        Self::LatencyBudgetExceeded,
        Self::MemoryBudgetExceeded,
        Self::Timeout,
        Self::EngineCrashed,
        Self::StoreUnavailable,
        Self::InsufficientStorage,
        Self::InvalidSpec,
    ];

    /// The CamelCase name used in conditions, Events and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SourceUnavailable => "SourceUnavailable",
            Self::HashMismatch => "HashMismatch",
            Self::SignatureInvalid => "SignatureInvalid",
            Self::UnsupportedOperator => "UnsupportedOperator",
            Self::IncompatibleHardware => "IncompatibleHardware",
            Self::IncompatibleRuntime => "IncompatibleRuntime",
            Self::CompileFailed => "CompileFailed",
            Self::LoadFailed => "LoadFailed",
            Self::WarmupFailed => "WarmupFailed",
            Self::ParityExceeded => "ParityExceeded",
            Self::TokenizerMismatch => "TokenizerMismatch",
            Self::ChatTemplateMismatch => "ChatTemplateMismatch",
            Self::LatencyBudgetExceeded => "LatencyBudgetExceeded",
            Self::MemoryBudgetExceeded => "MemoryBudgetExceeded",
            Self::Timeout => "Timeout",
            Self::EngineCrashed => "EngineCrashed",
            Self::StoreUnavailable => "StoreUnavailable",
            Self::InsufficientStorage => "InsufficientStorage",
            Self::InvalidSpec => "InvalidSpec",
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialised_name_is_the_label_value() {
        for r in FailureReason::ALL {
            assert_eq!(
                serde_json::to_value(r).expect("serialise"),
                serde_json::json!(r.as_str())
            );
        }
    }
}
