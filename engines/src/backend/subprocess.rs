//! A compiler run as a child process, as every compile that calls a foreign tool runs it (`exec`'s
//! `backend.command`, IREE's importer and compiler): only an allow-list of kiln-agent's
//! environment ([`PASSED`]: paths, locale, GPU selection), so no credential reaches it; its own
//! process group, killed with whatever it started when it exits or passes its deadline (and, for
//! a foreign compiler, every process it detached with `setsid`, reparented to kiln-agent, a child
//! subreaper: [`Orphans`]); its
//! output logged line by line, control characters neutralised, the last lines kept for the build
//! manifest and failure messages.
//! May touch: the processes it starts; nothing on disk.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_node_core::error::{Error, Result};

/// Lines of compiler output kept for the build manifest.
pub(crate) const LOG_LINES: usize = 200;
/// Longest compiler output line kept whole; longer ones are split.
pub(crate) const MAX_LINE: u64 = 4 << 10;
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

/// A command for `program` with the allow-listed environment only, no stdin, output piped, in
/// a process group of its own.
pub(crate) fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .envs(std::env::vars_os().filter(|(name, _)| name.to_str().is_some_and(passed)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own process group: on a deadline, and after it exits, whatever it started goes too (a
    // straggler holding its output open would otherwise hang the log readers).
    cmd.process_group(0);
    cmd
}

/// What happens, after a tool ends, to processes it detached from its group (`setsid`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Orphans {
    /// This process becomes a child subreaper, and every child it gained during the run is
    /// killed and reaped: for a foreign compiler, in a process that runs nothing else at once
    /// (the engine's child, the compile Job's container).
    Kill,
    /// Only the group is killed: for a known tool, in a process where other threads may start
    /// children of their own.
    Leave,
}

/// How a tool run ended: its exit (`Ok(None)`: still running at the deadline, then killed) and
/// its last output lines.
pub(crate) struct Ran {
    pub(crate) status: std::io::Result<Option<std::process::ExitStatus>>,
    pub(crate) log: Vec<String>,
}

/// Starts `cmd` (made by [`command`]) and watches it to the end or `timeout`; `Err` only when it
/// cannot be started. With [`Orphans::Kill`], children this process had before (another
/// engine's worker) are left alone.
pub(crate) fn run(
    cmd: &mut Command,
    timeout: Option<Duration>,
    orphans: Orphans,
) -> std::io::Result<Ran> {
    let before = match orphans {
        Orphans::Kill => {
            if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                tracing::warn!(error = %e, "cannot become a child subreaper; a compiler's setsid children may outlive it");
            }
            Some(children_of(
                rustix::process::getpid().as_raw_nonzero().get(),
            ))
        }
        Orphans::Leave => None,
    };
    let mut child = cmd.spawn()?;
    let (status, log) = watch(&mut child, timeout, before.as_deref());
    Ok(Ran { status, log })
}

/// Reads the compiler's output while waiting for it (up to `timeout`), then kills its
/// process group and, given `before`, the orphans it left (processes not in it); returns how it ended
/// (`None`: still running at the deadline) and its last [`LOG_LINES`] output lines.
fn watch(
    child: &mut std::process::Child,
    timeout: Option<Duration>,
    before: Option<&[i32]>,
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
        if let Some(before) = before {
            kill_orphans(before);
        }
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
pub(crate) fn tail(log: &[String]) -> String {
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

/// `Timeout` when the tool ran past its deadline, `CompileFailed` when waiting failed or it
/// did not exit 0; `what` names it in the message (`backend.command "x"`, `iree-compile`).
pub(crate) fn check_exit(
    what: &str,
    status: std::io::Result<Option<std::process::ExitStatus>>,
    timeout: Option<Duration>,
    log: &[String],
) -> Result<()> {
    let status = match status {
        Ok(Some(status)) => status,
        Ok(None) => {
            return Err(Error::Timeout(format!(
                "{what} still ran after compile.activeDeadlineSeconds ({}s) and was killed; its last output: {}",
                timeout.map_or(0, |t| t.as_secs()),
                tail(log)
            )));
        }
        Err(e) => {
            return Err(Error::CompileFailed(format!("waiting for {what}: {e}")));
        }
    };
    if !status.success() {
        return Err(Error::CompileFailed(format!(
            "{what} {}; its last output: {}",
            describe(status),
            tail(log)
        )));
    }
    Ok(())
}

/// Whether kiln-agent's variable `name` is passed on to a compiler (an allow-list: anything
/// not named here, `KILN_REGISTRY_PASSWORD` among them, stays behind).
fn passed(name: &str) -> bool {
    PASSED.contains(&name) || PASSED_PREFIXES.iter().any(|p| name.starts_with(p))
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

/// A compiler's output line as kiln repeats it (logs, failure messages, status): control
/// characters other than tab become U+FFFD, so a hostile compiler cannot forge log lines, move a
/// terminal's cursor or hide text in `kubectl describe` with escape sequences.
pub(crate) fn printable(line: &str) -> String {
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
