//! The engine interface every backend implements and every caller uses: the [`Backend`] and
//! [`Engine`] traits and the plain types they take and return. Types only, below the backends
//! (which implement it) and `mod.rs` (which picks one), so neither reaches up to the other.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_crds::compiled_target::Precision;

use crate::backend::tensor::HostTensor;
use kiln_node_core::error::Result;

/// Input name → concrete shape.
pub type Shapes = BTreeMap<String, Vec<usize>>;

/// What a compile needs.
pub struct CompileRequest<'a> {
    /// The verified source model file.
    pub model: &'a Path,
    /// Profile name → concrete input shapes (bound and bounds-checked).
    pub profiles: &'a BTreeMap<String, Shapes>,
    /// Numeric precision.
    pub precision: Precision,
    /// The execution provider for the class ([`kiln_crds::compiled_target::Backend::provider_for`]).
    pub provider: kiln_crds::compiled_target::ExecutionProvider,
    /// Backend flags.
    pub flags: &'a BTreeMap<String, String>,
    /// Where to write the artifact.
    pub out: &'a Path,
    /// How long a foreign compiler may run (`spec.compile.activeDeadlineSeconds`).
    pub timeout: Option<std::time::Duration>,
    /// What `llamacpp` quantisation `auto` fits (`None`: nothing, as for `exec`'s inner build).
    pub memory_budget: Option<MemoryFit>,
    /// The verified chat template given beside a GGUF source (its `chatTemplate` asset), which
    /// `llamacpp` carries in the artifact in place of the GGUF's own.
    pub chat_template: Option<&'a Path>,
    /// The ModelArtifact's declaration, for a source that names no tensors (an MLIR function's
    /// arguments and results are bound to its inputs and outputs in order); `None` where the
    /// model file names them.
    pub declared: Option<&'a kiln_crds::model_artifact::ModelArtifactSpec>,
}

/// The memory figures a compile for a class knows: what `llamacpp` quantisation `auto` fits
/// (`backend/llamacpp/fit.rs` decides from them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryFit {
    /// `warmup.memoryBudget` in bytes.
    pub budget: Option<u64>,
    /// The class's facts: its host memory (`kiln.dev/memory-gib`) and GPU memory
    /// (`nvidia.com/gpu.memory`) where the target's class keys name them.
    pub class: kiln_crds::class::ClassFacts,
}

/// What a compile reports.
#[derive(Debug, Default)]
pub struct Compiled {
    /// Output names, in order.
    pub outputs: Vec<String>,
    /// What the converter did, line by line.
    pub log: Vec<String>,
    /// Why the artifact depends on the build machine's instruction set, when it does: it is
    /// then bound to that machine's CPU level.
    pub machine_bound: Option<String>,
    /// What the compile resolved (e.g. the weight type `auto` chose, sizes), recorded in the
    /// build manifest's `backendOptions` beside the target's settings.
    pub resolved: BTreeMap<String, String>,
}

/// A compiler and loader for one kind of engine.
pub trait Backend: Send + Sync {
    /// Backend name as in `CompiledTarget.spec.backend.kind`.
    fn name(&self) -> &'static str;
    /// Version of the backend library.
    fn version(&self) -> String;
    /// What the compile key names as the backend version: the version, and for a library
    /// loaded at run time also its bytes (`1.31.1@sha256:<hex>`).
    fn identity(&self) -> String {
        self.version()
    }
    /// sha256 of a library loaded at run time (recorded in the build manifest).
    fn runtime_digest(&self) -> Option<String> {
        None
    }
    /// Media type of its artifacts.
    fn media_type(&self) -> &'static str;
    /// Compiles `req.model` into `req.out`.
    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled>;
    /// Loads an artifact this backend compiled, ready to run.
    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>>;
    /// The source model executed as written, unoptimised: the reference fixtures are made with.
    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>>;
    /// The graph inputs the model file declares.
    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>>;
    /// The graph's inputs and outputs as far as the model file states them, for checking the
    /// ModelArtifact's declaration.
    fn interface(&self, model: &Path) -> Result<GraphInterface>;
}

/// A loaded engine.
pub trait Engine: Send + Sync {
    /// Runs one batch of named inputs and returns the named outputs.
    fn run(&self, inputs: &BTreeMap<String, HostTensor>) -> Result<BTreeMap<String, HostTensor>>;
    /// Names and shapes of the inputs of each compiled profile.
    fn profiles(&self) -> Vec<(String, Shapes)>;
    /// Element type of each input (the same in every profile), for checking fixtures.
    fn input_dtypes(&self) -> BTreeMap<String, safetensors::Dtype>;
    /// Which provider ran which nodes, once the engine has run (`None` before, or for an engine
    /// that cannot tell).
    fn placement(&self) -> Option<kiln_crds::placement::Placement> {
        None
    }
    /// Whether the engine replays work it captured on an earlier run (CUDA graphs) rather than
    /// computing each run anew: then only inputs that differ between runs show that a replay
    /// reads the new ones (`pipeline::warmup::check_replay_samples`).
    fn replays_captured_work(&self) -> bool {
        false
    }
    /// A language model's prefill and decode figures from its last run (`None` for other
    /// engines).
    fn generation(&self) -> Option<Generation> {
        None
    }
    /// A language model's own tokenizer and chat template (`None` for other engines).
    fn tokenizer(&self) -> Option<&dyn Tokenizer> {
        None
    }
    /// Whether runs may go through this one engine at once, each on one core (tract: a run
    /// keeps its state to itself). `false`: one run at a time, which already uses the cores or
    /// the device (ONNX Runtime's intra-op threads, llama.cpp's context), so a server that
    /// wants more at once loads more engines.
    fn shareable(&self) -> bool {
        false
    }
}

/// The tokenizer and chat template a language model carries (inside its GGUF), as warmup and
/// `kiln-agent fixtures` use them.
pub trait Tokenizer {
    /// Token ids of `text`: a plain prompt gets the model's own leading special tokens; a
    /// prompt the chat template rendered (`rendered`) carries them already.
    fn encode(&self, text: &str, rendered: bool) -> Result<Vec<i32>>;
    /// One token's text, special tokens spelled out (for messages).
    fn piece(&self, id: i32) -> String;
    /// The text of `ids` (special tokens left out).
    fn decode(&self, ids: &[i32]) -> Result<String>;
    /// The chat template, `None` when the model has none.
    fn chat_template(&self) -> Option<String>;
    /// `messages` (role, content) rendered by the chat template, ready for the assistant's turn.
    fn render(&self, messages: &[(String, String)]) -> Result<String>;
}

/// What a language model's run measured.
pub use kiln_crds::llamacpp::Generation;

/// One graph input as the model file declares it.
#[derive(Clone, Debug)]
pub struct InputInfo {
    /// Input name.
    pub name: String,
    /// Element type.
    pub dtype: safetensors::Dtype,
    /// Extents; `None` for a symbolic dim.
    pub dims: Vec<Option<usize>>,
}

/// A graph's inputs and outputs, in order.
#[derive(Clone, Debug, Default)]
pub struct GraphInterface {
    /// Graph inputs.
    pub inputs: Vec<TensorInfo>,
    /// Graph outputs.
    pub outputs: Vec<TensorInfo>,
}

/// One graph input or output, with what the model file leaves open as `None`.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type; `None` when the file does not state it.
    pub dtype: Option<safetensors::Dtype>,
    /// Dims (`None` inside for a symbolic dim); `None` when the rank is not stated.
    pub dims: Option<Vec<Option<usize>>>,
}
