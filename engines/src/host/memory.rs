//! The agent's heap has a ceiling. A 200-byte ONNX model can ask tract for a 40 GB tensor (a
//! `ConstantOfShape` of `[100000, 100000]`); with Linux overcommit the allocation succeeds and
//! filling it takes the whole machine until the kernel kills the process — in the DaemonSet that
//! is every target on the node, again after each restart. The binary's global allocator is a
//! `cap::Cap` over the system allocator, handed to [`install`]: it counts the bytes live on the heap
//! and refuses (returns null for) an allocation that would pass the ceiling. tract allocates
//! tensors itself and panics on a null pointer ("failed to allocate Layout { size: … }"), which
//! [`crate::backend::guard`] turns into `CompileFailed`/`LoadFailed`/`WarmupFailed` with
//! [`explain`]'s words; a refused `Vec` growth aborts the process (Rust's stable behaviour), which
//! is still the process and not the node.
//!
//! The ceiling is `--memory-limit` (`KILN_MEMORY_LIMIT`), by default 80% of the smaller of the
//! cgroup's `memory.max` and the machine's memory: the rest is for what the counter does not see
//! (stacks, mapped files, device drivers). It bounds the heap of the whole process — in the
//! agent, all its targets together — and is a backstop, not a scheduler: the container's memory
//! limit remains the hard one.

use std::alloc::System;
use std::sync::OnceLock;

pub use cap::Cap;

static HEAP: OnceLock<&'static Cap<System>> = OnceLock::new();

/// Puts `heap` (the binary's `#[global_allocator]`) under a ceiling of `bytes` (never below
/// what is live now) and remembers it for [`explain`].
pub fn install(heap: &'static Cap<System>, bytes: usize) {
    let _ = heap.set_limit(bytes.max(heap.allocated()));
    let _ = HEAP.set(heap);
}

/// The ceiling [`install`] set, `None` when none is (or it is unbounded): what the engine's
/// process is given as its kernel-enforced limit ([`crate::pipeline::isolate`]).
pub fn limit() -> Option<usize> {
    HEAP.get()
        .map(|heap| heap.limit())
        .filter(|&l| l != usize::MAX)
}

/// What a panic's `message` should add when it reports a failed allocation that the ceiling
/// refused: the size asked for (when the message says it, as tract's does) and the ceiling.
/// `None` when the message is not about an allocation or no ceiling is installed.
pub fn explain(message: &str) -> Option<String> {
    explain_for(HEAP.get()?, message)
}

fn explain_for(heap: &Cap<System>, message: &str) -> Option<String> {
    let limit = heap.limit();
    if limit == usize::MAX || !message.contains("allocat") {
        return None;
    }
    let asked = message
        .split_once("size: ")
        .and_then(|(_, rest)| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .filter(|&size| size > heap.remaining());
    let what = asked.map_or_else(
        || "an allocation was refused".to_string(),
        |size| format!("an allocation of {} was refused", human(size)),
    );
    Some(format!(
        "{what}: it would take the heap past this process's memory limit of {} \
         (--memory-limit / KILN_MEMORY_LIMIT); the model needs more memory than that, or is hostile",
        human(limit)
    ))
}

/// The default ceiling: 80% of the smaller of the cgroup's memory limit and the machine's
/// memory; `None` (unbounded) when neither can be read.
pub fn default_limit() -> Option<usize> {
    usize::try_from(available()? / 5 * 4).ok()
}

/// The memory this process may use: the smaller of its cgroup's limit and the machine's
/// memory.
pub fn available() -> Option<u64> {
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse::<u64>().ok());
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib.saturating_mul(1024))
    });
    match (cgroup, total) {
        (Some(c), Some(t)) => Some(c.min(t)),
        (c, t) => c.or(t),
    }
}

/// The peak resident memory of this process over a window, above its resident set at the
/// start: what an engine loaded and warmed in the window added. Linux: the window starts by
/// resetting the peak (`5` into `/proc/self/clear_refs`); where that is not allowed there is no
/// honest figure and [`PeakWindow::peak_bytes`] is `None`. The agent loads and warms one engine
/// at a time, so the window sees only that engine (and what it freed is not subtracted).
pub struct PeakWindow {
    start_rss: u64,
}

impl PeakWindow {
    /// Starts a window; `None` where the peak cannot be reset or read. The peak is reset
    /// first and the resident set read after it, so both describe the same moment: memory the
    /// process gives back in between (another thread freeing, the allocator trimming) cannot
    /// leave the reset peak below the baseline and the engine's figure at zero.
    pub fn start() -> Option<Self> {
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        let start_rss = status_bytes("VmRSS:")?;
        Some(Self { start_rss })
    }

    /// Peak resident bytes since the start, above the resident set at the start.
    pub fn peak_bytes(&self) -> Option<u64> {
        Some(peak_rss()?.saturating_sub(self.start_rss))
    }
}

/// The peak resident set of this process (`VmHWM`), in bytes; `PeakWindow::start` resets it.
pub fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}

/// Parses a byte count: an integer with an optional `K`/`M`/`G`/`T` (powers of 1000) or
/// `Ki`/`Mi`/`Gi`/`Ti` (powers of 1024) suffix, as Kubernetes quantities write them.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 3Gi, 500M, 1073741824)"))?;
    let unit: u64 = match suffix {
        "" => 1,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        other => {
            return Err(format!(
                "{s:?} is not a byte count: unknown unit {other:?} (K, M, G, T, Ki, Mi, Gi, Ti)"
            ));
        }
    };
    n.checked_mul(unit)
        .and_then(|b| usize::try_from(b).ok())
        .filter(|&b| b > 0)
        .ok_or_else(|| {
            format!("{s:?} is not a byte count this machine can hold (zero or too large)")
        })
}

/// `bytes` for people: 40.0 GB, 2.1 GB, 512.0 MB.
pub fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_like_quantities_and_junk_is_refused() {
        assert_eq!(parse_bytes("3Gi"), Ok(3 << 30));
        assert_eq!(parse_bytes("500M"), Ok(500_000_000));
        assert_eq!(parse_bytes("1073741824"), Ok(1 << 30));
        for bad in [
            "",
            "0",
            "-1",
            "3GB",
            "1.5Gi",
            "Gi",
            "99999999999999999999",
            "20000000Ti",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn only_a_refused_allocation_is_explained() {
        // A ceiling of 1 MB with nothing live (not this binary's allocator).
        let heap = Cap::new(System, 1_000_000);
        let explain = |message| explain_for(&heap, message);
        let tract = "failed to allocate Layout { size: 40000000000, align: 64 (1 << 6) }";
        let said = explain(tract).expect("explained");
        assert!(
            said.contains("an allocation of 40.0 GB was refused"),
            "{said}"
        );
        assert!(said.contains("memory limit of 1.0 MB"), "{said}");
        // A failed allocation that fits under the ceiling was not the ceiling's doing: no size.
        let small = explain("failed to allocate Layout { size: 10, align: 1 }").expect("said");
        assert!(!small.contains("of 10 bytes"), "{small}");
        assert_eq!(explain("index out of bounds: the len is 3"), None);
    }
}
