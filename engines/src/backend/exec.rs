//! The `exec` backend: a foreign compiler (any program in any image: an ONNX optimiser,
//! quantiser, converter) turns the verified source into an ONNX model; kiln then builds that
//! model with tract exactly as the built-in backend does, so the artifact, its parity check
//! against the source's fixtures and its loading on the nodes are kiln's own.
//!
//! The contract, for the image author: `backend.command` runs without a shell, in a fresh
//! working directory, with
//! * `KILN_MODEL` — a read-only copy of the verified source model (`$KILN_WORK/model.onnx`),
//! * `KILN_ARTIFACT` — where to write the resulting ONNX model,
//! * `KILN_WORK` — scratch space (its working directory),
//! * `KILN_PRECISION`, `KILN_PROFILES` (profile → input → shape, JSON), `KILN_FLAGS` (JSON).
//!
//! Exit status 0 and a non-empty `KILN_ARTIFACT` mean success; anything else is
//! `CompileFailed` with the last lines of its output; past `compile.activeDeadlineSeconds` it is
//! killed with everything it started (`Timeout`). Its output is logged line by line and kept
//! in the build manifest. Of kiln-agent's environment it gets only an allow-list ([`subprocess`]:
//! paths, locale, GPU selection), so no credential reaches it. It runs in its own process group,
//! and kiln-agent is a child subreaper: when the compiler exits or times out, its group is
//! killed and then every process reparented to kiln-agent (a child that detached with `setsid`).
//!
//! In a compile Job the compiler never shares a container with anything secret: an init
//! container (the compiler image, kiln-agent injected, no store, no credentials, no signing key)
//! runs it and leaves `compiled.onnx` and its log in a handoff emptyDir; the publisher container
//! (the agent image) then builds that model with tract, checks parity, stores and signs —
//! the compiler's output is just another untrusted model to it. In local mode the compiler runs
//! here, in a scratch directory outside the store.
//! May touch: a scratch directory of its own, the handoff directory and the compiler process
//! group it starts; never the store or the apiserver.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use kiln_crds::compiled_target::Precision;

use super::subprocess;
use super::tract::Tract;
use super::{Backend, CompileRequest, Compiled, Engine, InputInfo, Shapes};
use kiln_node_core::error::{Error, Result};

/// The compiler's model in a handoff directory.
pub const HANDOFF_MODEL: &str = "compiled.onnx";
/// The compiler's output lines (JSON array) in a handoff directory.
const HANDOFF_LOG: &str = "compiler-log.json";
/// Largest compiler log read back from a handoff directory.
const MAX_HANDOFF_LOG: u64 = 1 << 20;

/// A compiler command (run in `backend.image` in a compile Job, on this machine in local mode).
pub struct Exec {
    /// argv of the compiler.
    pub command: Vec<String>,
    /// Where the compiler container of this Job left its model; `None`: run the compiler here.
    pub handoff: Option<std::path::PathBuf>,
}

impl Exec {
    /// The compiler container's step: runs the compiler on the verified source and leaves its
    /// model and log in `dir` for the publisher.
    pub fn hand_off(&self, req: &CompileRequest<'_>, dir: &Path) -> Result<()> {
        let work = dir.join("work");
        std::fs::create_dir_all(&work).map_err(|e| Error::store(&work, e))?;
        let log = self.run_compiler(req, &work, &dir.join(HANDOFF_MODEL))?;
        let json = serde_json::to_vec(&log).unwrap_or_default();
        let path = dir.join(HANDOFF_LOG);
        std::fs::write(&path, json).map_err(|e| Error::store(&path, e))?;
        // Its scratch is not the publisher's business.
        let _ = std::fs::remove_dir_all(&work);
        Ok(())
    }

    /// The publisher's side: copies the handed-off model next to `out` (the compiler container
    /// has exited; the copy is what gets built) and reads the log, bounded.
    fn take_handoff(&self, dir: &Path, onnx: &Path) -> Result<Vec<String>> {
        let model = dir.join(HANDOFF_MODEL);
        // The compiler container wrote the handoff directory: a link there would make this
        // container, which holds the keys, read a file of its own choosing.
        if let Ok(m) = std::fs::symlink_metadata(&model)
            && !m.is_file()
        {
            return Err(Error::CompileFailed(format!(
                "the compiler container left {} at {}, not a file",
                not_a_file(&m),
                model.display()
            )));
        }
        std::fs::copy(&model, onnx).map_err(|e| {
            Error::CompileFailed(format!(
                "the compiler container left no model at {} ({e}); see its log",
                model.display()
            ))
        })?;
        let log = std::fs::File::open(dir.join(HANDOFF_LOG))
            .ok()
            .and_then(|f| {
                let mut bytes = Vec::new();
                f.take(MAX_HANDOFF_LOG).read_to_end(&mut bytes).ok()?;
                serde_json::from_slice::<Vec<String>>(&bytes).ok()
            })
            .unwrap_or_default();
        Ok(log
            .into_iter()
            .rev()
            .take(subprocess::LOG_LINES)
            .rev()
            // The compiler container wrote this file: bound its lines as the reader does.
            .map(|l| l.chars().take(subprocess::MAX_LINE as usize).collect())
            .collect())
    }

    /// Runs the compiler; returns its output lines, or `CompileFailed` with their tail.
    fn run_compiler(
        &self,
        req: &CompileRequest<'_>,
        work: &Path,
        onnx: &Path,
    ) -> Result<Vec<String>> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| Error::InvalidSpec("backend kind exec needs backend.command".into()))?;
        let model = private_copy(req.model, work)?;
        let mut cmd = compiler_command(program, args, req, work, &model, onnx);
        tracing::info!(command = ?self.command, "running the compiler");
        let ran = subprocess::run(&mut cmd, req.timeout, subprocess::Orphans::Kill).map_err(|e| {
            Error::CompileFailed(format!(
                "cannot start backend.command {program:?}: {e}; it must be an executable in backend.image (PATH is {:?})",
                std::env::var("PATH").unwrap_or_default()
            ))
        })?;
        subprocess::check_exit(
            &format!("backend.command {program:?}"),
            ran.status,
            req.timeout,
            &ran.log,
        )?;
        check_artifact(program, onnx, &ran.log)?;
        Ok(ran.log)
    }
}

/// A private, read-only copy of the verified source in `work`, named like what it is: tools
/// that go by the extension find `.onnx`, and nothing the compiler does reaches the verified
/// blob cache.
fn private_copy(source: &Path, work: &Path) -> Result<std::path::PathBuf> {
    let model = work.join("model.onnx");
    std::fs::copy(source, &model)
        .and_then(|_| {
            let mut perms = std::fs::metadata(&model)?.permissions();
            perms.set_readonly(true);
            std::fs::set_permissions(&model, perms)
        })
        .map_err(|e| Error::store(&model, e))?;
    Ok(model)
}

/// The compiler's command ([`subprocess::command`]) with the `KILN_*` contract.
fn compiler_command(
    program: &str,
    args: &[String],
    req: &CompileRequest<'_>,
    work: &Path,
    model: &Path,
    onnx: &Path,
) -> Command {
    let profiles = serde_json::to_string(req.profiles).unwrap_or_default();
    let flags = serde_json::to_string(req.flags).unwrap_or_default();
    let mut cmd = subprocess::command(program);
    cmd.args(args)
        .current_dir(work)
        .env("KILN_MODEL", model)
        .env("KILN_ARTIFACT", onnx)
        .env("KILN_WORK", work)
        .env("KILN_PRECISION", req.precision.as_str())
        .env("KILN_PROFILES", profiles)
        .env("KILN_FLAGS", flags);
    cmd
}

/// `CompileFailed` unless the compiler left a non-empty regular file at `onnx`.
fn check_artifact(program: &str, onnx: &Path, log: &[String]) -> Result<()> {
    // Not followed: a link would have kiln read (and build, store, sign) whatever file it
    // names, which the compiler could not read itself in a compile Job's own container.
    match std::fs::symlink_metadata(onnx) {
        Ok(m) if m.is_file() && m.len() > 0 => Ok(()),
        Ok(m) if !m.is_file() => Err(Error::CompileFailed(format!(
            "backend.command {program:?} left {} at $KILN_ARTIFACT ({}), not a file; write the model itself there; its last output: {}",
            not_a_file(&m),
            onnx.display(),
            subprocess::tail(log)
        ))),
        _ => Err(Error::CompileFailed(format!(
            "backend.command {program:?} exited 0 but wrote no model to $KILN_ARTIFACT ({}); its last output: {}",
            onnx.display(),
            subprocess::tail(log)
        ))),
    }
}

/// What a path that should be a file is instead, for messages.
fn not_a_file(m: &std::fs::Metadata) -> &'static str {
    let kind = m.file_type();
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "something other than a file"
    }
}

impl Backend for Exec {
    fn name(&self) -> &'static str {
        "exec"
    }

    /// The runtime that loads the result: tract.
    fn version(&self) -> String {
        Tract.version()
    }

    fn media_type(&self) -> &'static str {
        Tract.media_type()
    }

    fn compile(&self, req: &CompileRequest<'_>) -> Result<Compiled> {
        let parent = req.out.parent().unwrap_or(Path::new("."));
        let onnx = parent.join(HANDOFF_MODEL);
        let mut log = match &self.handoff {
            Some(dir) => self.take_handoff(dir, &onnx)?,
            None => {
                // Not under the store's directory: a compiler writes only its own scratch.
                let work = tempfile::Builder::new()
                    .prefix("kiln-exec-")
                    .tempdir()
                    .map_err(|e| Error::store(std::env::temp_dir(), e))?;
                self.run_compiler(req, work.path(), &onnx)?
            }
        };
        // The compiler's ONNX, built per profile by tract: fp32 graph (the compiler applied the
        // precision), no flags (they were the compiler's).
        let built = Tract
            .compile(&CompileRequest {
                model: &onnx,
                profiles: req.profiles,
                precision: Precision::Fp32,
                provider: req.provider,
                flags: &BTreeMap::new(),
                out: req.out,
                timeout: None,
                memory_budget: None,
                chat_template: None,
                declared: None,
            })
            .map_err(|e| match e {
                Error::CompileFailed(m) => Error::CompileFailed(format!(
                    "the model backend.command wrote cannot be built: {m}"
                )),
                other => other,
            })?;
        log.extend(built.log);
        Ok(Compiled {
            outputs: built.outputs,
            log,
            machine_bound: built.machine_bound,
            resolved: built.resolved,
        })
    }

    fn load(&self, artifact: &Path) -> Result<Box<dyn Engine>> {
        Tract.load(artifact)
    }

    fn reference(&self, model: &Path, shapes: &Shapes) -> Result<Box<dyn Engine>> {
        Tract.reference(model, shapes)
    }

    fn inputs(&self, model: &Path) -> Result<Vec<InputInfo>> {
        Tract.inputs(model)
    }

    fn interface(&self, model: &Path) -> Result<super::GraphInterface> {
        Tract.interface(model)
    }
}
