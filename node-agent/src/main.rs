//! kiln-agent: `run` (the DaemonSet), `serve` (a serving pod's model server), `local` (whole pipeline, no cluster), `compile` (the compile Job's worker), `install` (its
//! init container for foreign compiler images), `fixtures`, `probe`, `bench-verify`,
//! `bench-pull`, and the hidden `engine` (an engine's own process,
//! `kiln_engines::pipeline::isolate`). This file only parses the command line,
//! sets up logging and dispatches; each subcommand lives in `kiln_agent::cmd`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kiln_agent::{cmd, secrets};
use kiln_endpoints::logging::{self, LogFormat};
use kiln_engines::host::memory;

#[derive(Parser)]
#[command(
    name = "kiln-agent",
    version,
    about = "kiln node agent: compile, verify, load, warm, report ready"
)]
struct Cli {
    /// Log format on stderr (default: json for `run`, plain otherwise).
    #[arg(long, env = "KILN_LOG_FORMAT", value_enum, global = true)]
    log_format: Option<LogFormat>,
    /// Ceiling on this process's heap (e.g. 3Gi): an allocation past it is refused, so a model
    /// that asks for more fails classified instead of exhausting the machine. Default: 80% of the
    /// smaller of the cgroup memory limit and the machine's memory.
    #[arg(long, env = "KILN_MEMORY_LIMIT", global = true, value_parser = memory::parse_bytes)]
    memory_limit: Option<usize>,
    /// The ONNX Runtime 1.31 shared library for `backend.kind: onnxruntime`
    /// (`libonnxruntime.so.1.31.1` from the PyPI onnxruntime wheel; scripts/ensure-onnxruntime.sh
    /// fetches it). Default: `ORT_DYLIB_PATH`. Without it only tract targets run.
    #[arg(long, env = "KILN_ONNXRUNTIME_LIB", global = true)]
    onnxruntime_lib: Option<std::path::PathBuf>,
    /// Run engines (compile, load, warmup) in this process instead of a child: only to measure
    /// what the child costs (scripts/bench/isolation.sh); a crashing engine then takes the
    /// whole process.
    #[arg(long, env = "KILN_ENGINE_IN_PROCESS", global = true, hide = true)]
    engine_in_process: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The node agent (DaemonSet): pull, verify, load and warm the artifact of every
    /// CompiledTarget that selects this node; report on its KilnNode and pod readiness gates.
    Run(cmd::run::Args),
    /// Run the whole pipeline on this machine for one ModelArtifact + CompiledTarget YAML.
    /// Without FILE, runs the embedded example (SqueezeNet from the ONNX test data).
    Local(cmd::local::Args),
    /// Make a versioned fixture file (safetensors) from a model, with golden outputs from the
    /// reference execution.
    Fixtures(cmd::fixtures::Args),
    /// Compile Job worker: compile one (ModelArtifact, CompiledTarget, class) into the store and
    /// print the build manifest as JSON. The operator sets every input in the Job's environment.
    Compile(cmd::compile::Args),
    /// Init container of a compile Job with a foreign compiler image: copy this binary, its
    /// dynamic loader and libraries into DIR (an emptyDir the compiler container mounts) and
    /// check that the copy runs.
    Install(cmd::install::Args),
    /// Write a fresh ECDSA P-256 key pair for artifact attestations into DIR: `signing.key`
    /// (the compile Jobs' Secret) and `signing.pub` (operator, agents, `--trust-key`).
    Keygen(cmd::keygen::Args),
    /// Serve the model of a csi.kiln.dev volume over the Open Inference Protocol v2 (REST), with
    /// the engine and settings the node's agent verified and warmed.
    Serve(cmd::serve::Args),
    /// Print this machine's hardware facts and class labels as JSON.
    Probe,
    /// Measure a verified pull of a large artifact from a local docker-registry into a cache
    /// directory against `curl -o` followed by `sha256sum`, in the same run.
    BenchPull(cmd::bench_pull::Args),
    /// Measure streaming sha256 verification against sha256sum and openssl on one file.
    BenchVerify(cmd::bench_verify::Args),
    /// The engine's process (kiln_engines::pipeline::isolate): one compile or load-and-warm step, its job
    /// on stdin, its answer on stdout. Started by kiln-agent itself, never by hand.
    #[command(hide = true)]
    Engine,
}

#[global_allocator]
static HEAP: memory::Cap<std::alloc::System> = memory::Cap::new(std::alloc::System, usize::MAX);

/// Whether ONNX Runtime may load in this process: then `ORT_DISABLE_TELEMETRY=1` must be in the
/// environment before it does. ONNX Runtime's official Linux builds carry Microsoft's 1DS
/// telemetry: it uploads to `mobile.events.data.microsoft.com` and keeps a session file in
/// `$TMPDIR` unless that variable is set (the runtime API's switch only mutes some events).
fn onnxruntime_may_load(onnxruntime_lib: Option<&std::path::Path>) -> bool {
    onnxruntime_lib.is_some() || std::env::var_os("ORT_DYLIB_PATH").is_some_and(|v| !v.is_empty())
}

fn main() -> ExitCode {
    // Credentials a re-executed image was handed (kiln_agent::secrets), before anything else.
    let handed = secrets::take();
    let mut cli = Cli::parse();
    // No credential stays where a child could read it (environment, command line), and the
    // telemetry switch is set before ONNX Runtime can load: one re-exec when either needs it.
    secrets::reexec(
        onnxruntime_may_load(cli.onnxruntime_lib.as_deref()),
        &handed,
    );
    match &mut cli.command {
        Command::Run(args) => handed.fill(args.registry_mut()),
        Command::Compile(args) => handed.fill(args.registry_mut()),
        _ => {}
    }
    // The engine's process holds no credential, and measures its own peak memory through
    // /proc/self/clear_refs, which a non-dumpable process of an ordinary user may not write.
    if !matches!(cli.command, Command::Engine) {
        secrets::harden();
    }
    drop(handed);
    if let Some(limit) = cli.memory_limit.or_else(memory::default_limit) {
        memory::install(&HEAP, limit);
    }
    let default_format = match cli.command {
        Command::Run(_) => LogFormat::Json,
        _ => LogFormat::Plain,
    };
    if let Err(e) = logging::init(cli.log_format.unwrap_or(default_format)) {
        eprintln!("kiln-agent: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    kiln_engines::backend::onnxruntime::configure(cli.onnxruntime_lib);
    if cli.engine_in_process {
        kiln_engines::pipeline::isolate::parent::run_in_process(kiln_agent::cmd::engine::execute);
    }
    // reqwest is built without a default crypto provider; kiln uses ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Run(args) => cmd::run::main(args),
        Command::Local(args) => cmd::local::main(args),
        Command::Fixtures(args) => cmd::fixtures::main(args),
        Command::Compile(args) => cmd::compile::main(args),
        Command::Install(args) => cmd::install::main(args),
        Command::Keygen(args) => cmd::keygen::main(args),
        Command::Serve(args) => cmd::serve::main(args),
        Command::Probe => cmd::probe::main(),
        Command::BenchPull(args) => cmd::bench_pull::main(args),
        Command::BenchVerify(args) => cmd::bench_verify::main(args),
        Command::Engine => kiln_agent::cmd::engine::main(),
    }
}
