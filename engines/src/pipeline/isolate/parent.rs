//! The parent's side: start `kiln-agent engine` with the job, its limits and an allow-listed
//! environment in a process group of its own, read its answer and stderr (both bounded), kill
//! the group at the deadline and once the child has ended, and judge what came back
//! ([`crate::pipeline::isolate::exit`]). Blocking: call it from a blocking thread.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::pipeline::isolate::exit::{Ended, Seen, judge};
use crate::pipeline::isolate::limits::{Limits, passes_env};
use crate::pipeline::isolate::task::{Answer, MAX_ANSWER_BYTES, Request, Task};
use kiln_node_core::error::{Error, Result};

static IN_PROCESS: OnceLock<fn(Task) -> Answer> = OnceLock::new();

/// Runs engine steps in this process with `execute` (the child's own
/// `kiln_agent::cmd::engine::execute`, handed in by `main` so that this module does not depend
/// on the pipeline it runs) instead of a child (`--engine-in-process`): only for measuring what
/// the child costs; a crash then takes the whole process, as before.
pub fn run_in_process(execute: fn(Task) -> Answer) {
    let _ = IN_PROCESS.set(execute);
}

/// The most stderr bytes of one child forwarded into the logs; the rest is counted.
const MAX_FORWARDED: usize = 256 << 10;
/// How much of the end of its stderr a message quotes.
const TAIL: usize = 2 << 10;
/// How long the parent waits for the child's pipes to close once it is gone.
const DRAIN: Duration = Duration::from_secs(5);

/// The line the child writes on stderr once its engine is loaded (and warmup begins).
pub const LOADED: &str = "kiln-agent engine: loaded";

/// Runs `job` ("`what`", for messages) in a child under [`Limits::for_step`] of `deadline`.
pub fn run(job: Task, what: &str, deadline: Duration) -> Result<Answer> {
    run_with(job, what, deadline, || {})
}

/// [`run`], calling `loaded` when the child says its engine is loaded ([`LOADED`]).
pub fn run_with(
    job: Task,
    what: &str,
    deadline: Duration,
    loaded: impl FnOnce() + Send + 'static,
) -> Result<Answer> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let limits = Limits::for_step(deadline, cores, crate::host::memory::limit());
    let answer_of = |answer: &[u8], ended, killed_at_deadline, oversized, stderr_tail: &str| {
        judge(&Seen {
            what,
            ended,
            killed_at_deadline,
            answer,
            oversized,
            stderr_tail,
            limits: &limits,
        })
    };
    if let Some(execute) = IN_PROCESS.get() {
        let answer = execute(job);
        let bytes = serde_json::to_vec(&answer)
            .map_err(|e| Error::EngineAnswer(format!("cannot encode: {e}")))?;
        return answer_of(&bytes, Ended::Code(0), false, false, "");
    }
    let request = serde_json::to_vec(&Request { limits, job })
        .map_err(|e| Error::engine_unreachable(format!("{what}: cannot encode the job: {e}"), e))?;
    let mut child = spawn(&limits).map_err(|e| {
        Error::engine_unreachable(format!("{what}: cannot start the engine's process: {e}"), e)
    })?;
    let pid = child.id();
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_group(pid);
        return Err(Error::EngineCrashed(format!(
            "{what}: the engine's pipes are missing"
        )));
    };
    std::thread::spawn(move || stdin.write_all(&request));
    let answer = drain(move || read_bounded(stdout));
    let log = drain(move || forward(stderr, pid, loaded));
    let waited = wait_until(&mut child, limits.deadline);
    // Whatever it spawned dies with it (the group is its pid).
    kill_group(pid);
    let (status, killed) = waited.map_err(|e| {
        Error::engine_unreachable(format!("{what}: cannot wait for the engine: {e}"), e)
    })?;
    let (bytes, oversized) = answer.recv_timeout(DRAIN).unwrap_or_default();
    let tail = log.recv_timeout(DRAIN).unwrap_or_default();
    let ended = match (status.code(), status.signal()) {
        (Some(code), _) => Ended::Code(code),
        (None, Some(signal)) => Ended::Signal(signal),
        (None, None) => Ended::Code(-1),
    };
    let answer = answer_of(&bytes, ended, killed, oversized, &tail)?;
    tracing::debug!(
        engine_pid = pid,
        peak_rss_bytes = answer.peak_rss_bytes,
        "{what}: the engine's process answered"
    );
    Ok(answer)
}

/// `kiln-agent engine`, this very binary, with only the allowed environment.
fn spawn(limits: &Limits) -> std::io::Result<Child> {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("kiln-agent-engine")
        .env_clear()
        .envs(std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(passes_env)))
        .env(
            "ORT_DISABLE_TELEMETRY",
            std::env::var_os("ORT_DISABLE_TELEMETRY").unwrap_or_else(|| "1".into()),
        )
        .args(["--log-format", "plain"]);
    if let Some(lib) = crate::backend::onnxruntime::library_path() {
        cmd.arg("--onnxruntime-lib").arg(lib);
    }
    if let Some(bytes) = limits.memory_bytes {
        cmd.arg("--memory-limit").arg(bytes.to_string());
    }
    cmd.arg("engine")
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// Runs `f` on its own thread; its result arrives on the channel (or never, if a pipe stays
/// open because something escaped the group).
fn drain<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// Up to [`MAX_ANSWER_BYTES`] of `r`, and whether there was more (read and dropped, so the
/// child never blocks on a full pipe).
fn read_bounded(r: impl Read) -> (Vec<u8>, bool) {
    let mut bytes = Vec::new();
    let mut r = r;
    let _ = (&mut r).take(MAX_ANSWER_BYTES).read_to_end(&mut bytes);
    let more = std::io::copy(&mut r, &mut std::io::sink()).unwrap_or(0);
    (bytes, more > 0)
}

/// Forwards the child's stderr into the logs line by line (at most [`MAX_FORWARDED`] bytes),
/// calls `loaded` at the [`LOADED`] line, and returns its last [`TAIL`] bytes.
fn forward(mut r: impl Read, pid: u32, loaded: impl FnOnce()) -> String {
    let mut loaded = Some(loaded);
    let mut tail: Vec<u8> = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    let (mut forwarded, mut dropped) = (0usize, 0usize);
    let mut buf = [0u8; 8192];
    let emit = |line: &[u8], forwarded: &mut usize, dropped: &mut usize| {
        if *forwarded + line.len() > MAX_FORWARDED {
            *dropped += line.len();
            return;
        }
        *forwarded += line.len();
        tracing::info!(
            engine_pid = pid,
            "engine: {}",
            String::from_utf8_lossy(line).trim_end()
        );
    };
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > 2 * TAIL {
            tail.drain(..tail.len() - TAIL);
        }
        for &b in &buf[..n] {
            if b == b'\n' || line.len() >= TAIL {
                if line == LOADED.as_bytes()
                    && let Some(f) = loaded.take()
                {
                    f();
                }
                emit(&line, &mut forwarded, &mut dropped);
                line.clear();
            } else {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        emit(&line, &mut forwarded, &mut dropped);
    }
    if dropped > 0 {
        tracing::warn!(
            engine_pid = pid,
            dropped_bytes = dropped,
            "engine: stderr beyond {MAX_FORWARDED} bytes was not logged"
        );
    }
    let start = tail.len().saturating_sub(TAIL);
    String::from_utf8_lossy(&tail[start..]).into_owned()
}

/// Waits for the child; past `deadline` kills its group and says so.
fn wait_until(child: &mut Child, deadline: Duration) -> std::io::Result<(ExitStatus, bool)> {
    let started = Instant::now();
    let mut nap = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((status, false));
        }
        if started.elapsed() >= deadline {
            kill_group(child.id());
            return Ok((child.wait()?, true));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(50));
    }
}

/// SIGKILL to the process group `pid` leads; a group already gone is fine.
fn kill_group(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn stderr_is_forwarded_bounded_and_says_when_the_engine_loaded() {
        let seen = Arc::new(AtomicBool::new(false));
        let flag = seen.clone();
        let text = format!("warming soon\n{LOADED}\nlast words");
        let tail = forward(text.as_bytes(), 1, move || {
            flag.store(true, Ordering::SeqCst)
        });
        assert!(seen.load(Ordering::SeqCst));
        assert!(tail.ends_with("last words"), "{tail}");
        let long = vec![b'x'; 10 * TAIL];
        assert_eq!(forward(&long[..], 1, || {}).len(), TAIL);
    }

    #[test]
    fn an_oversized_answer_is_drained_and_flagged() {
        let big = vec![b'{'; MAX_ANSWER_BYTES as usize + 10];
        let (bytes, more) = read_bounded(&big[..]);
        assert_eq!(bytes.len() as u64, MAX_ANSWER_BYTES);
        assert!(more);
        let (bytes, more) = read_bounded(&b"{}"[..]);
        assert_eq!((bytes.as_slice(), more), (&b"{}"[..], false));
    }
}
