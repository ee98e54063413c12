//! What the engine's process is asked ([`Task`]) and what it answers ([`Answer`]): serde JSON,
//! each bounded in size where it is read. Types only.

use std::path::PathBuf;

use kiln_crds::BuildManifest;
use kiln_crds::class::ClassFacts;
use kiln_crds::compiled_target::Warmup;
use kiln_crds::engine::EngineCandidate;
use kiln_crds::kiln_node::HardwareFacts;
use kiln_crds::{CompiledTarget, FailureReason, ModelArtifact};
use serde::{Deserialize, Serialize};

use crate::pipeline::isolate::limits::Limits;
use crate::pipeline::warmup::WarmupReport;

/// The most bytes of a job the child reads.
pub const MAX_TASK_BYTES: u64 = 16 << 20;
/// The most bytes of an answer the parent reads; more is refused as oversized.
pub const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// What the child reads on stdin: its limits and its step.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// The limits it sets on itself before anything else.
    pub limits: Limits,
    /// The step.
    pub job: Task,
}

/// One step of one engine.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "job", rename_all = "camelCase")]
pub enum Task {
    /// Load a verified artifact and warm it with the fixture.
    LoadWarm(Box<LoadWarm>),
    /// Compile a verified model with one backend and check parity on the fixture.
    Compile(Box<Compile>),
    /// Run a source model unoptimised for a fixture's golden outputs (`kiln-agent fixtures`)
    /// and write the fixture file.
    Reference(Box<Reference>),
}

/// [`Task::Reference`]: `kiln-agent fixtures`' request.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    /// The source model.
    pub model: PathBuf,
    /// Fixture version to record.
    pub version: String,
    /// Shapes of inputs with symbolic dims.
    pub shapes: crate::backend::Shapes,
    /// Given input tensors (safetensors), one file per sample in order.
    pub given: Vec<PathBuf>,
    /// How many samples to make.
    pub samples: usize,
    /// Seed for random inputs.
    pub seed: u64,
    /// Tolerances to suggest.
    pub tolerance: Option<kiln_crds::compiled_target::Tolerance>,
    /// Which runtime runs the reference: tract, ONNX Runtime on the CPU, or llama.cpp.
    pub runtime: kiln_crds::compiled_target::BackendKind,
    /// Where the fixture file goes.
    pub out: PathBuf,
    /// A language model's prompt as text instead of inputs (`--prompt`, `--chat`).
    #[serde(default)]
    pub text: Option<crate::pipeline::text::TextRequest>,
}

/// A verified fixture file the child parses again, after checking its sha256.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct FixtureRef {
    /// The file in the blob cache.
    pub path: PathBuf,
    /// Its sha256, as verified by the parent.
    pub sha256: String,
}

/// [`Task::LoadWarm`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct LoadWarm {
    /// The target's backend, for [`crate::backend::for_artifact`].
    pub backend: kiln_crds::compiled_target::Backend,
    /// The verified build manifest.
    pub manifest: BuildManifest,
    /// The verified artifact.
    pub artifact: PathBuf,
    /// The warmup fixture.
    pub fixture: FixtureRef,
    /// The target's warmup settings.
    pub warmup: Warmup,
}

/// [`Task::Compile`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Compile {
    /// The ModelArtifact (URIs are not fetched again).
    pub model: ModelArtifact,
    /// The CompiledTarget, its backend the concrete one to compile with.
    pub target: CompiledTarget,
    /// The staged model file (`model.onnx` beside its declared assets).
    pub model_file: PathBuf,
    /// The warmup fixture.
    pub fixture: FixtureRef,
    /// The class's facts.
    pub class: ClassFacts,
    /// This machine's facts.
    pub host: HardwareFacts,
    /// Where the artifact goes.
    pub out: PathBuf,
    /// Its compile key.
    pub key: String,
    /// Also load and warm it for the target's iterations (an `auto` candidate's measurement).
    pub measure: bool,
}

/// The child's whole answer.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// What the step produced, or why it failed.
    pub outcome: Outcome,
    /// The child's peak resident set (`VmHWM`), bytes.
    pub peak_rss_bytes: Option<u64>,
}

/// [`Answer::outcome`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// [`Task::LoadWarm`] passed.
    Warmed(Box<Warmed>),
    /// [`Task::Compile`] passed.
    Compiled(Box<Compiled>),
    /// [`Task::Reference`] wrote the fixture file, of this sha256.
    Made {
        /// sha256 of the file written.
        sha256: String,
    },
    /// The step failed, classified by the child.
    Failed {
        /// The reason.
        reason: FailureReason,
        /// The error's whole text.
        message: String,
    },
}

/// What a load and warmup measured in the child.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Warmed {
    /// Seconds to load.
    pub load_seconds: f64,
    /// GPU memory the child held after load (NVML).
    pub device_after_load: Option<u64>,
    /// The warmup, with the child's peak memory above its baseline.
    pub report: WarmupReport,
}

/// What a compile produced in the child.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Compiled {
    /// The build manifest of the artifact written at [`Compile::out`].
    pub manifest: BuildManifest,
    /// The measurement, when [`Compile::measure`] asked for it.
    pub measured: Option<EngineCandidate>,
}
