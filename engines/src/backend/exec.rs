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
//! in the build manifest. Of kiln-agent's environment it gets only an allow-list ([`PASSED`]:
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

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_crds::compiled_target::Precision;

use super::tract::Tract;
use super::{Backend, CompileRequest, Compiled, Engine, InputInfo, Shapes};
use kiln_node_core::error::{Error, Result};

/// Lines of compiler output kept for the build manifest.
const LOG_LINES: usize = 200;
/// Longest compiler output line kept whole; longer ones are split.
const MAX_LINE: u64 = 4 << 10;
/// Lines quoted in a failure message (the operator shows it in a condition).
const TAIL_LINES: usize = 12;
/// Bytes of those lines quoted at most, their end: a line is cut at 4 KiB of raw output, but
/// each byte that is not UTF-8 becomes a 3-byte replacement character.
const TAIL_BYTES: usize = 8 << 10;
/// The only variables of kiln-agent's environment a compiler gets (besides [`PASSED_PREFIXES`]
/// and its own `KILN_*` contract): what finds programs and libraries, locale and time, never
/// credentials (a registry password, a cloud token, the signing key's path).
const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "OMP_NUM_THREADS",
];
/// Families of variables passed on: locale, and which GPU the compiler may use.
const PASSED_PREFIXES: &[&str] = &["LC_", "CUDA_", "NVIDIA_"];
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
            .take(LOG_LINES)
            .rev()
            // The compiler container wrote this file: bound its lines as the reader does.
            .map(|l| l.chars().take(MAX_LINE as usize).collect())
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
        // Children this process had before the compiler (another engine's worker) are not the
        // compiler's and are left alone.
        let before = children_of(rustix::process::getpid().as_raw_nonzero().get());
        tracing::info!(command = ?self.command, "running the compiler");
        let mut child = cmd.spawn().map_err(|e| {
            Error::CompileFailed(format!(
                "cannot start backend.command {program:?}: {e}; it must be an executable in backend.image (PATH is {:?})",
                std::env::var("PATH").unwrap_or_default()
            ))
        })?;
        let (status, log) = watch(&mut child, req.timeout, &before);
        check_exit(program, status, req.timeout, &log)?;
        check_artifact(program, onnx, &log)?;
        Ok(log)
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

/// The compiler's command: the allow-listed environment and the `KILN_*` contract, output
/// piped, in a process group of its own.
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
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .envs(std::env::vars_os().filter(|(name, _)| name.to_str().is_some_and(passed)))
        .args(args)
        .current_dir(work)
        .env("KILN_MODEL", model)
        .env("KILN_ARTIFACT", onnx)
        .env("KILN_WORK", work)
        .env("KILN_PRECISION", req.precision.as_str())
        .env("KILN_PROFILES", profiles)
        .env("KILN_FLAGS", flags)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group: on a deadline, and after it exits, whatever it started goes
    // too (a straggler holding its output open would otherwise hang the log readers).
    // What leaves the group (setsid) is reparented to this process, a child subreaper, and
    // killed after it as well.
    cmd.process_group(0);
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::warn!(error = %e, "cannot become a child subreaper; a compiler's setsid children may outlive it");
    }
    cmd
}

/// Reads the compiler's output while waiting for it (up to `timeout`), then kills its
/// process group and the orphans it left (processes not in `before`); returns how it ended
/// (`None`: still running at the deadline) and its last [`LOG_LINES`] output lines.
fn watch(
    child: &mut std::process::Child,
    timeout: Option<Duration>,
    before: &[i32],
) -> (
    std::io::Result<Option<std::process::ExitStatus>>,
    Vec<String>,
) {
    let log = std::sync::Mutex::new(VecDeque::with_capacity(LOG_LINES));
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let status = std::thread::scope(|s| {
        for stream in [
            stdout.map(|o| Box::new(o) as Box<dyn Read + Send>),
            stderr.map(|e| Box::new(e) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let log = &log;
            s.spawn(move || read_lines(stream, log));
        }
        let status = wait(child, timeout);
        if let Ok(pid) = i32::try_from(child.id())
            && let Some(pid) = rustix::process::Pid::from_raw(pid)
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        kill_orphans(before);
        status
    });
    (
        status,
        log.into_inner().unwrap_or_else(|p| p.into_inner()).into(),
    )
}

/// Logs each line of `stream` and keeps the last [`LOG_LINES`] in `log`, until it ends.
fn read_lines(stream: Box<dyn Read + Send>, log: &std::sync::Mutex<VecDeque<String>>) {
    // Bytes, not UTF-8 lines: a stray non-UTF-8 byte must neither end the reading (the
    // compiler would block on a full pipe) nor fail the compile.
    let mut reader = BufReader::new(stream);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        // At most MAX_LINE bytes at a time: a line without end is cut, not held.
        match reader.by_ref().take(MAX_LINE).read_until(b'\n', &mut raw) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = printable(String::from_utf8_lossy(&raw).trim_end_matches(['\n', '\r']));
        tracing::info!(target: "compiler", "{line}");
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() == LOG_LINES {
            log.pop_front();
        }
        log.push_back(line);
    }
}

/// The last [`TAIL_LINES`] of `log`, at most [`TAIL_BYTES`] of their end, for a failure
/// message.
fn tail(log: &[String]) -> String {
    if log.is_empty() {
        return "(no output)".to_string();
    }
    let text = log[log.len().saturating_sub(TAIL_LINES)..].join(" | ");
    let mut cut = text.len().saturating_sub(TAIL_BYTES);
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    if cut == 0 {
        text
    } else {
        format!("…{}", &text[cut..])
    }
}

/// `Timeout` when the compiler ran past its deadline, `CompileFailed` when waiting failed or
/// it did not exit 0.
fn check_exit(
    program: &str,
    status: std::io::Result<Option<std::process::ExitStatus>>,
    timeout: Option<Duration>,
    log: &[String],
) -> Result<()> {
    let status = match status {
        Ok(Some(status)) => status,
        Ok(None) => {
            return Err(Error::Timeout(format!(
                "backend.command {program:?} still ran after compile.activeDeadlineSeconds ({}s) and was killed; its last output: {}",
                timeout.map_or(0, |t| t.as_secs()),
                tail(log)
            )));
        }
        Err(e) => {
            return Err(Error::CompileFailed(format!(
                "waiting for {program:?}: {e}"
            )));
        }
    };
    if !status.success() {
        return Err(Error::CompileFailed(format!(
            "backend.command {program:?} {}; its last output: {}",
            describe(status),
            tail(log)
        )));
    }
    Ok(())
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
            tail(log)
        ))),
        _ => Err(Error::CompileFailed(format!(
            "backend.command {program:?} exited 0 but wrote no model to $KILN_ARTIFACT ({}); its last output: {}",
            onnx.display(),
            tail(log)
        ))),
    }
}

/// Whether kiln-agent's variable `name` is passed on to a compiler (an allow-list: anything
/// not named here, `KILN_REGISTRY_PASSWORD` among them, stays behind).
fn passed(name: &str) -> bool {
    PASSED.contains(&name) || PASSED_PREFIXES.iter().any(|p| name.starts_with(p))
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

/// Kills and reaps every process reparented to this one but those in `keep`: what a compiler
/// detached from its process group (setsid) and left running. Rounds, because killing one
/// reparents its children.
fn kill_orphans(keep: &[i32]) {
    use rustix::process::{Pid, Signal, WaitOptions, getpid, kill_process, waitpid};
    let me = getpid().as_raw_nonzero().get();
    for _ in 0..16 {
        let mut orphans = children_of(me);
        orphans.retain(|pid| !keep.contains(pid));
        if orphans.is_empty() {
            return;
        }
        for raw in orphans {
            if let Some(pid) = Pid::from_raw(raw) {
                tracing::warn!(pid = raw, "killing a process the compiler left running");
                let _ = kill_process(pid, Signal::KILL);
                let _ = waitpid(Some(pid), WaitOptions::empty());
            }
        }
    }
}

/// Pids whose parent is `ppid` (from `/proc/*/stat`).
fn children_of(ppid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let rest = &stat[stat.rfind(')')? + 1..];
        let parent: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (parent == ppid).then_some(pid)
    })
    .collect()
}

/// Waits for `child` up to `timeout`; `None` when it ran past it (it is then killed and reaped).
fn wait(
    child: &mut std::process::Child,
    timeout: Option<Duration>,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let Some(timeout) = timeout else {
        return child.wait().map(Some);
    };
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            child.kill()?;
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "failed".to_string(),
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

/// A compiler's output line as kiln repeats it (logs, failure messages, status): control
/// characters other than tab become U+FFFD, so a hostile compiler cannot forge log lines, move a
/// terminal's cursor or hide text in `kubectl describe` with escape sequences.
fn printable(line: &str) -> String {
    line.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allow_listed_variables_reach_a_compiler() {
        for name in [
            "PATH",
            "HOME",
            "LC_ALL",
            "CUDA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH",
        ] {
            assert!(passed(name), "{name}");
        }
        for name in [
            "KILN_REGISTRY_PASSWORD",
            "KILN_REGISTRY_USERNAME",
            "KILN_SIGNING_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "HF_TOKEN",
            "RUST_LOG",
            "PATHX",
            "",
        ] {
            assert!(!passed(name), "{name}");
        }
    }

    #[test]
    fn compiler_output_cannot_carry_control_characters() {
        assert_eq!(printable("ok\tdone"), "ok\tdone");
        assert_eq!(
            printable("\u{1b}[2K\rCompileFailed: fake\u{7}"),
            "\u{FFFD}[2K\u{FFFD}CompileFailed: fake\u{FFFD}"
        );
        assert_eq!(printable("naïve ✓"), "naïve ✓");
    }
}
