//! The host's pid of a process of this agent, which NVML names its compute processes by. An
//! agent in the host's PID namespace (a bare host, or a pod with `hostPID`) knows it: it is the
//! pid. An agent in a container's own PID namespace reads it from the host's procfs mounted at
//! [`HOST_PROC`] (the chart's GPU DaemonSet mounts the node's `/proc` there read-only): the
//! `NSpid` line of a process's status lists its pid in every PID namespace from the procfs's
//! (the host's: first) to its own (last). Anything else is unknown, with the reason, never a
//! guess. The decision ([`choose`]) and the parsing are pure; [`host_pid`] reads.

use std::path::Path;

/// Where the node's procfs is mounted in the GPU agent's pod.
pub const HOST_PROC: &str = "/host/proc";

/// The inode of the kernel's initial PID namespace (`PROC_PID_INIT_INO`, fixed since Linux
/// 3.8): `/proc/self/ns/pid` reads `pid:[4026531836]` exactly in the host's PID namespace.
pub const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// The pids of the `NSpid:` line of a `/proc/<pid>/status`, outermost namespace first; `None`
/// without one (kernels before 4.1) or when it is malformed.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Option<Vec<u32>> = line.split_whitespace().map(|p| p.parse().ok()).collect();
    pids.filter(|p| !p.is_empty())
}

/// The inode of a `pid:[N]` namespace link.
pub fn parse_ns_link(link: &str) -> Option<u64> {
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The host pid of `pid` (a pid in this agent's namespace): `pid` itself when this agent's PID
/// namespace (`own_ns`) is the host's; else the first entry of its `NSpid` as the host's procfs
/// shows it (`host_view`), which must have more than one level (one level means that procfs is
/// not the host's) and end with `pid`. Pure.
pub fn choose(own_ns: Option<u64>, pid: u32, host_view: Option<&[u32]>) -> Result<u32, String> {
    if own_ns == Some(INIT_PID_NS) {
        return Ok(pid);
    }
    let own = own_ns.map_or("an unreadable PID namespace".to_string(), |n| {
        format!("PID namespace pid:[{n}]")
    });
    match host_view {
        None => Err(format!(
            "the agent runs in {own}, not the host's, and no host procfs at {HOST_PROC} names pid {pid} (NVML names processes by host pid): mount the node's /proc there (chart agent.gpu.hostProc) or run the agent with hostPID"
        )),
        Some([.., last]) if *last != pid => Err(format!(
            "the host procfs at {HOST_PROC} shows pid {last} for this process, not {pid}: not this agent's view"
        )),
        Some(view) if view.len() < 2 => Err(format!(
            "{HOST_PROC} shows pid {pid} in one PID namespace only, so it is not the host's procfs while the agent runs in {own}"
        )),
        Some(view) => Ok(view[0]),
    }
}

/// The host pid of `pid` (this process when `None`), or why it cannot be known.
pub fn host_pid(pid: Option<u32>) -> Result<u32, String> {
    let own = std::process::id();
    let pid = pid.unwrap_or(own);
    let own_ns = std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| parse_ns_link(&l.to_string_lossy()));
    if own_ns == Some(INIT_PID_NS) {
        return Ok(pid);
    }
    let host = Path::new(HOST_PROC);
    let view = if pid == own {
        read_nspid(&host.join("self"))
    } else {
        find_in(host, pid, own_ns)?
    };
    choose(own_ns, pid, view.as_deref())
}

fn read_nspid(dir: &Path) -> Option<Vec<u32>> {
    parse_nspid(&std::fs::read_to_string(dir.join("status")).ok()?)
}

/// The `NSpid` of the one host process whose innermost pid is `pid` and whose PID namespace is
/// this agent's (`own_ns`); none found is `None`, more than one an error.
fn find_in(host: &Path, pid: u32, own_ns: Option<u64>) -> Result<Option<Vec<u32>>, String> {
    let Some(own_ns) = own_ns else {
        return Ok(None);
    };
    let Ok(entries) = std::fs::read_dir(host) else {
        return Ok(None);
    };
    let mut found: Vec<Vec<u32>> = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let numeric = entry.file_name().to_string_lossy().parse::<u32>().is_ok();
        let Some(view) = numeric.then(|| read_nspid(&dir)).flatten() else {
            continue;
        };
        let ns = std::fs::read_link(dir.join("ns/pid"))
            .ok()
            .and_then(|l| parse_ns_link(&l.to_string_lossy()));
        if view.last() == Some(&pid) && ns == Some(own_ns) {
            found.push(view);
        }
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        n => Err(format!(
            "{n} processes in {HOST_PROC} have pid {pid} in this agent's PID namespace"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tkiln-agent\nTgid:\t7\nNgid:\t0\nPid:\t7\nPPid:\t0\nNStgid:\t48213\t7\nNSpid:\t48213\t7\nNSpgid:\t48213\t7\n";

    #[test]
    fn nspid_is_read_outermost_first() {
        assert_eq!(parse_nspid(STATUS), Some(vec![48213, 7]));
        assert_eq!(parse_nspid("Pid:\t7\nNSpid:\t7\n"), Some(vec![7]));
        assert_eq!(parse_nspid("Pid:\t7\n"), None, "kernel without NSpid");
        assert_eq!(parse_nspid("NSpid:\t7\tx\n"), None, "malformed");
        assert_eq!(parse_nspid("NSpid:\n"), None, "empty");
        assert_eq!(parse_ns_link("pid:[4026531836]"), Some(INIT_PID_NS));
        assert_eq!(parse_ns_link("net:[4026531836]"), None);
        assert_eq!(parse_ns_link("pid:[x]"), None);
    }

    #[test]
    fn in_the_host_namespace_the_pid_is_the_host_pid() {
        assert_eq!(choose(Some(INIT_PID_NS), 48213, None), Ok(48213));
        // Even with a host view at hand: the namespace decides.
        assert_eq!(choose(Some(INIT_PID_NS), 7, Some(&[7])), Ok(7));
    }

    #[test]
    fn in_a_container_the_host_procfs_gives_the_outermost_pid() {
        let ns = Some(4026532500);
        assert_eq!(choose(ns, 7, Some(&[48213, 7])), Ok(48213));
        // Nested: a child in a namespace of its own below the agent's.
        assert_eq!(choose(ns, 3, Some(&[48230, 12, 3])), Ok(48230));
    }

    #[test]
    fn anything_else_is_unknown_with_the_reason_never_a_wrong_pid() {
        let ns = Some(4026532500);
        let err = choose(ns, 7, None).expect_err("no host procfs");
        assert!(
            err.contains("pid:[4026532500]") && err.contains("agent.gpu.hostProc"),
            "{err}"
        );
        // A procfs of the container's own namespace shows one level: not the host's.
        let err = choose(ns, 7, Some(&[7])).expect_err("one level");
        assert!(err.contains("one PID namespace only"), "{err}");
        // A view of another process.
        let err = choose(ns, 7, Some(&[48213, 8])).expect_err("another process");
        assert!(err.contains("not 7"), "{err}");
        let err = choose(None, 7, None).expect_err("namespace unreadable");
        assert!(err.contains("unreadable"), "{err}");
    }

    /// A stand-in host procfs: `<pid>/status` with an NSpid line, `<pid>/ns/pid` a link.
    fn fake_proc(entries: &[(u32, &str, u64)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (pid, nspid, ns) in entries {
            let p = dir.path().join(pid.to_string());
            std::fs::create_dir_all(p.join("ns")).expect("mkdir");
            std::fs::write(p.join("status"), format!("Pid:\t{pid}\nNSpid:\t{nspid}\n"))
                .expect("status");
            std::os::unix::fs::symlink(format!("pid:[{ns}]"), p.join("ns/pid")).expect("link");
        }
        std::fs::create_dir_all(dir.path().join("sys")).expect("a non-pid entry");
        dir
    }

    #[test]
    fn a_child_is_found_by_its_pid_in_this_namespace_and_only_there() {
        let proc = fake_proc(&[
            (5000, "5000\t7", 42),
            // Another container's process with the same inner pid.
            (5001, "5001\t7", 43),
            (5002, "5002\t8", 42),
        ]);
        assert_eq!(find_in(proc.path(), 7, Some(42)), Ok(Some(vec![5000, 7])));
        assert_eq!(find_in(proc.path(), 9, Some(42)), Ok(None), "not there");
        assert_eq!(
            find_in(proc.path(), 7, None),
            Ok(None),
            "own namespace unknown"
        );
        let twice = fake_proc(&[(5000, "5000\t7", 42), (5003, "5003\t7", 42)]);
        let err = find_in(twice.path(), 7, Some(42)).expect_err("ambiguous");
        assert!(err.contains("2 processes"), "{err}");
    }
}
