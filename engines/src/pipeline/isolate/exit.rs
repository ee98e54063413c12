//! What an engine's process came back with, judged: its answer, or why there is none. Pure.

use kiln_crds::FailureReason;

use crate::host::memory::human;
use crate::pipeline::isolate::limits::Limits;
use crate::pipeline::isolate::task::{Answer, MAX_ANSWER_BYTES, Outcome};
use kiln_node_core::error::{Error, Result};

/// How the process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

/// Everything the parent saw of one engine step.
pub struct Seen<'a> {
    /// What the step was, for messages (`loading and warming target ns/name`).
    pub what: &'a str,
    /// How the process ended.
    pub ended: Ended,
    /// The parent killed it when its deadline passed.
    pub killed_at_deadline: bool,
    /// Its stdout, at most [`MAX_ANSWER_BYTES`] of it.
    pub answer: &'a [u8],
    /// It wrote more than [`MAX_ANSWER_BYTES`].
    pub oversized: bool,
    /// The end of its stderr.
    pub stderr_tail: &'a str,
    /// The limits it ran under.
    pub limits: &'a Limits,
}

/// The child's answer when it ended well and answered in the checked format, else the error
/// that says how it ended.
pub fn judge(seen: &Seen<'_>) -> Result<Answer> {
    let what = seen.what;
    let tail = last_words(seen.stderr_tail);
    if seen.killed_at_deadline {
        return Err(Error::Timeout(format!(
            "{what} ran past its deadline of {}s; the engine's process group was killed{tail}",
            seen.limits.deadline.as_secs()
        )));
    }
    if seen.ended == Ended::Signal(SIGXCPU) {
        return Err(Error::Timeout(format!(
            "{what} used up its CPU time limit of {}s (RLIMIT_CPU) and was stopped{tail}",
            seen.limits.cpu_seconds
        )));
    }
    if let Some(limit) = seen.limits.memory_bytes
        && seen.ended != Ended::Code(0)
        && allocation_failed(seen.stderr_tail)
    {
        return Err(over_limit(what, limit, None, &describe(seen.ended)));
    }
    match seen.ended {
        Ended::Code(0) => {}
        ended => {
            return Err(Error::EngineCrashed(format!(
                "{what}: the engine's process {}{tail}",
                describe(ended)
            )));
        }
    }
    let answer = parse(seen.answer, seen.oversized)?;
    match (&answer.outcome, seen.limits.memory_bytes) {
        (Outcome::Failed { reason, message }, Some(limit))
            if *reason != FailureReason::MemoryBudgetExceeded && allocation_failed(message) =>
        {
            Err(over_limit(
                what,
                limit,
                answer.peak_rss_bytes,
                &format!("failed: {message}"),
            ))
        }
        (Outcome::Failed { reason, message }, _) => Err(Error::InEngine {
            reason: *reason,
            message: message.clone(),
        }),
        _ => Ok(answer),
    }
}

/// The answer document, refused when oversized, truncated or malformed.
fn parse(bytes: &[u8], oversized: bool) -> Result<Answer> {
    if oversized {
        return Err(Error::EngineAnswer(format!(
            "it is larger than {}",
            human(MAX_ANSWER_BYTES as usize)
        )));
    }
    if bytes.is_empty() {
        return Err(Error::EngineAnswer("the process exited without one".into()));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        Error::EngineAnswer(format!(
            "not the checked format ({e}; {} bytes)",
            bytes.len()
        ))
    })
}

fn over_limit(what: &str, limit: u64, peak: Option<u64>, how: &str) -> Error {
    let bytes = |b: u64| human(usize::try_from(b).unwrap_or(usize::MAX));
    let peak = peak
        .map(|p| format!(" (its resident set peaked at {})", bytes(p)))
        .unwrap_or_default();
    Error::MemoryBudgetExceeded(format!(
        "{what}: the engine's process hit its memory limit of {} (RLIMIT_DATA, from --memory-limit / KILN_MEMORY_LIMIT){peak} and {how}; the model needs more memory than that, or is hostile",
        bytes(limit)
    ))
}

/// Whether `text` (an error message or stderr) says an allocation was refused: Rust's abort
/// on a refused allocation, C++'s `std::bad_alloc`, ONNX Runtime's allocator, `ENOMEM`.
pub fn allocation_failed(text: &str) -> bool {
    const SIGNS: &[&str] = &[
        "memory allocation of ",
        "bad_alloc",
        "bad allocation",
        "Failed to allocate memory",
        "Cannot allocate memory",
        "out of memory",
    ];
    SIGNS.iter().any(|s| text.contains(s))
}

const SIGXCPU: i32 = 24;

/// "was killed by signal SIGSEGV (11)", "exited with status 3".
pub fn describe(ended: Ended) -> String {
    match ended {
        Ended::Code(code) => format!("exited with status {code} without an answer"),
        Ended::Signal(9) => {
            "was killed by signal SIGKILL (9): the kernel's out-of-memory killer or another process"
                .into()
        }
        Ended::Signal(n) => format!("was killed by signal {} ({n})", signal_name(n)),
    }
}

/// The name of a Linux signal number.
pub fn signal_name(n: i32) -> &'static str {
    match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => "an unnamed signal",
    }
}

/// The last lines of stderr for a message: `; it said: …`, or nothing.
fn last_words(tail: &str) -> String {
    const MAX: usize = 600;
    let tail = tail.trim();
    if tail.is_empty() {
        return String::new();
    }
    let start = tail.len().saturating_sub(MAX);
    let start = (start..tail.len())
        .find(|&i| tail.is_char_boundary(i))
        .unwrap_or(tail.len());
    format!("; its last words: {}", &tail[start..])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits() -> Limits {
        Limits {
            memory_bytes: Some(2 << 30),
            cpu_seconds: 120,
            deadline: Duration::from_secs(60),
        }
    }

    fn seen<'a>(ended: Ended, answer: &'a [u8], stderr: &'a str, l: &'a Limits) -> Seen<'a> {
        Seen {
            what: "warming t",
            ended,
            killed_at_deadline: false,
            answer,
            oversized: false,
            stderr_tail: stderr,
            limits: l,
        }
    }

    fn reason(r: Result<Answer>) -> (FailureReason, String) {
        let e = r.expect_err("an error");
        (e.reason(), e.to_string())
    }

    #[test]
    fn a_signal_is_a_crash_naming_it() {
        let l = limits();
        let (r, m) = reason(judge(&seen(Ended::Signal(11), b"", "", &l)));
        assert_eq!(r, FailureReason::EngineCrashed);
        assert!(m.contains("signal SIGSEGV (11)"), "{m}");
        let (r, m) = reason(judge(&seen(Ended::Signal(6), b"", "boom\n", &l)));
        assert_eq!(r, FailureReason::EngineCrashed);
        assert!(m.contains("SIGABRT (6)") && m.contains("boom"), "{m}");
        let (r, m) = reason(judge(&seen(Ended::Code(3), b"", "", &l)));
        assert_eq!(r, FailureReason::EngineCrashed);
        assert!(m.contains("status 3"), "{m}");
    }

    #[test]
    fn deadline_and_cpu_limit_are_timeouts() {
        let l = limits();
        let mut s = seen(Ended::Signal(9), b"", "", &l);
        s.killed_at_deadline = true;
        let (r, m) = reason(judge(&s));
        assert_eq!(r, FailureReason::Timeout);
        assert!(m.contains("deadline of 60s"), "{m}");
        let (r, m) = reason(judge(&seen(Ended::Signal(24), b"", "", &l)));
        assert_eq!(r, FailureReason::Timeout);
        assert!(m.contains("CPU time limit of 120s"), "{m}");
    }

    #[test]
    fn a_refused_allocation_names_the_limit() {
        let l = limits();
        let abort = "memory allocation of 4294967296 bytes failed\n";
        let (r, m) = reason(judge(&seen(Ended::Signal(6), b"", abort, &l)));
        assert_eq!(r, FailureReason::MemoryBudgetExceeded);
        assert!(m.contains("memory limit of 2.1 GB"), "{m}");
        let failed = serde_json::to_vec(&Answer {
            outcome: Outcome::Failed {
                reason: FailureReason::WarmupFailed,
                message: "warmup failed: onnxruntime: bad allocation".into(),
            },
            peak_rss_bytes: Some(1),
        })
        .expect("json");
        let (r, m) = reason(judge(&seen(Ended::Code(0), &failed, "", &l)));
        assert_eq!(r, FailureReason::MemoryBudgetExceeded);
        assert!(m.contains("bad allocation"), "{m}");
        assert!(m.contains("peaked at 1 bytes"), "{m}");
        // Without a limit there is no limit to name: the child's own reason stands.
        let none = Limits {
            memory_bytes: None,
            ..l
        };
        let (r, _) = reason(judge(&seen(Ended::Code(0), &failed, "", &none)));
        assert_eq!(r, FailureReason::WarmupFailed);
    }

    #[test]
    fn a_malformed_truncated_or_oversized_answer_is_refused() {
        let l = limits();
        let good = serde_json::to_vec(&Answer {
            outcome: Outcome::Failed {
                reason: FailureReason::ParityExceeded,
                message: "parity exceeded: y".into(),
            },
            peak_rss_bytes: None,
        })
        .expect("json");
        let (r, m) = reason(judge(&seen(Ended::Code(0), &good, "", &l)));
        assert_eq!(r, FailureReason::ParityExceeded);
        assert_eq!(m, "parity exceeded: y");
        for bad in [
            &good[..good.len() / 2],
            b"{\"outcome\": 7}",
            b"",
            b"\xff\xfe",
        ] {
            let (r, m) = reason(judge(&seen(Ended::Code(0), bad, "", &l)));
            assert_eq!(r, FailureReason::EngineCrashed, "{m}");
            assert!(m.contains("answer was refused"), "{m}");
        }
        let mut s = seen(Ended::Code(0), &good, "", &l);
        s.oversized = true;
        let (_, m) = reason(judge(&s));
        assert!(m.contains("larger than"), "{m}");
    }
}
