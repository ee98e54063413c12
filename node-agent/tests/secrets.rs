//! No credential given to kiln-agent is readable by the processes it starts
//! (`kiln_agent::secrets`): an `exec` compiler run by `kiln-agent local` reads the environment,
//! command line and memory of each of its ancestors up to kiln-agent, as root and as an ordinary
//! user, and finds neither the registry password nor the user name.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use common::{AGENT, Case};
use serde_json::Value;

/// The credentials, written whole only here: the compiler's script joins its needles from parts,
/// so that the spec kiln-agent reads does not hold them.
const PASSWORD: &str = "kiln-test-secret-5eb1d0";
const USERNAME: &str = "kiln-test-user-93ac7e";

/// The compiler: for its parent, grandparent, … up to the `kiln-agent local` process, one line
/// `ANCESTOR <comm> environ=<…> cmdline=<…> mem=<…>`, each `clean`, `LEAK` or `denied`; then
/// it hands the model over unchanged.
const SCRIPT: &str = r#"python3 - <<'PY'
import os
needles = [("kiln-test-" + "secret-" + "5eb1d0").encode(), ("kiln-test-" + "user-" + "93ac7e").encode()]
def look(data):
    return "LEAK" if any(n in data for n in needles) else "clean"
def read(path):
    try:
        with open(path, "rb") as f:
            return look(f.read())
    except OSError:
        return "denied"
def memory(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return "denied"
    found, tail = "clean", b""
    for line in maps:
        fields = line.split()
        if not fields[1].startswith("r") or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        while start < end:
            n = min(end - start, 16 << 20)
            try:
                mem.seek(start)
                chunk = mem.read(n)
            except OSError:
                break
            if look(tail + chunk) == "LEAK":
                found = "LEAK"
            tail, start = chunk[-64:], start + n
    return found
pid = os.getppid()
for _ in range(6):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    parent = int(stat[stat.rindex(")") + 2:].split()[1])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    print(f"ANCESTOR {comm} environ={read(f'/proc/{pid}/environ')} cmdline={look(b' '.join(argv))} mem={memory(pid)}", flush=True)
    if b"local" in argv:
        break
    pid = parent
PY
cp "$KILN_MODEL" "$KILN_ARTIFACT""#;

/// Runs the case's `local` as `uid` (None: as this process), with the credentials in its
/// environment; returns the ancestors' lines, the outcome and stderr.
fn run_as(case: &Case, uid: Option<u32>) -> (Vec<String>, Value, String) {
    std::fs::write(case.path("kiln.yaml"), case.yaml()).expect("yaml");
    let mut cmd = Command::new(uid.map_or_else(|| AGENT.into(), |_| case.path("kiln-agent")));
    cmd.args(["local", "--output", "json", "--store"])
        .arg(case.store())
        .arg(case.path("kiln.yaml"))
        .env("KILN_REGISTRY_PASSWORD", PASSWORD)
        .env("KILN_REGISTRY_USERNAME", USERNAME);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid).env("HOME", case.path("."));
    }
    let out = cmd.output().expect("run kiln-agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let outcome: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no JSON outcome ({e}): {stdout}\n{stderr}"));
    let lines: Vec<String> = stderr
        .lines()
        .filter_map(|l| l.find("ANCESTOR ").map(|i| l[i..].to_string()))
        // Not the script itself, which kiln-agent logs as the compiler's command.
        .filter(|l| !l.contains('{'))
        .collect();
    (lines, outcome, stderr)
}

fn python3() -> bool {
    Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Checks the ancestors' lines: kiln-agent itself was reached and nothing leaked; for an
/// ordinary user (`kiln_agent_denied`) reading kiln-agent's (the last ancestor's) environment
/// and memory was denied, for root they were read and clean.
fn check(lines: &[String], stderr: &str, kiln_agent_denied: bool) {
    assert!(
        lines.len() >= 2,
        "the compiler reports its parent and kiln-agent: {lines:?}\n{stderr}"
    );
    for line in lines {
        assert!(!line.contains("LEAK"), "a credential is readable: {line}");
    }
    let agent = lines.last().expect("kiln-agent's line");
    if kiln_agent_denied {
        assert!(
            agent.contains("environ=denied") && agent.contains("mem=denied"),
            "an ordinary user's compiler cannot read kiln-agent's environment or memory: {agent}"
        );
    } else {
        // Root reads everything: there must be nothing to find.
        assert!(
            agent.contains("environ=clean") && agent.contains("mem=clean"),
            "{agent}"
        );
    }
    assert!(!stderr.contains(PASSWORD), "{stderr}");
}

#[test]
fn a_compiler_cannot_read_credentials_from_kiln_agent() {
    if !python3() {
        kiln_endpoints::test_support::skip(
            "the compiler of this test is a python3 script, and there is no python3",
        );
        return;
    }
    let case = Case::exec(SCRIPT);
    let (lines, outcome, stderr) = run_as(&case, None);
    assert_eq!(outcome["ready"], true, "{outcome}\n{stderr}");
    let root = rustix::process::geteuid().is_root();
    check(&lines, &stderr, false);
    eprintln!("as uid {}: {lines:?}", rustix::process::geteuid().as_raw());
    if !root {
        kiln_endpoints::test_support::skip(&format!(
            "the run as another user: only root can start kiln-agent as one (this is uid {})",
            rustix::process::geteuid().as_raw()
        ));
        return;
    }
    // As an ordinary user (nobody's uid, which needs no account): kiln-agent and the case's
    // files copied where that user can read and write them.
    let nobody = 65534;
    let case = Case::exec(SCRIPT);
    std::fs::copy(AGENT, case.path("kiln-agent")).expect("copy kiln-agent");
    chown_all(case.dir.path(), nobody);
    let (lines, outcome, stderr) = run_as(&case, Some(nobody));
    assert_eq!(outcome["ready"], true, "{outcome}\n{stderr}");
    eprintln!("as uid {nobody}: {lines:?}");
    check(&lines, &stderr, true);
}

fn chown_all(dir: &Path, uid: u32) {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).expect("chown");
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            chown_all(&path, uid);
        } else {
            std::os::unix::fs::chown(&path, Some(uid), Some(uid)).expect("chown");
        }
    }
}

#[test]
fn credentials_taken_off_the_environment_and_command_line_still_reach_the_registry_client() {
    // `compile` of a real spec into a registry store: the user name given alone is refused for
    // want of a password; both given get past that check (and fail later, at a registry that is
    // not there). So both survived the re-exec that took them off the environment and flags.
    let case = Case::mlp(4);
    std::fs::write(case.path("kiln.yaml"), case.yaml()).expect("yaml");
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&case.yaml()).expect("yaml");
    let spec = serde_json::json!({"model": docs[0], "target": docs[1]}).to_string();
    let run = |key: &str, args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(AGENT)
            .args([
                "compile",
                "--store",
                "oci://127.0.0.1:9/kiln/x",
                "--spec",
                &spec,
            ])
            .args(["--class-facts", "{}", "--compile-key", key])
            .arg("--source-base")
            .arg(case.dir.path())
            .arg("--termination-log")
            .arg(case.path("termination-log"))
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("run kiln-agent");
        std::fs::read_to_string(case.path("termination-log"))
            .unwrap_or_else(|_| String::from_utf8_lossy(&out.stderr).to_string())
    };
    // The key this worker computes, from its refusal of a wrong one.
    let refused = run("wrong", &[], &[]);
    let key = refused
        .split("computes compile key ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("{refused}"))
        .to_string();
    let together = "must be set together";
    let alone = run(&key, &["--registry-username", USERNAME], &[]);
    assert!(alone.contains(together), "{alone}");
    let both_flags = run(
        &key,
        &[
            "--registry-username",
            USERNAME,
            &format!("--registry-password={PASSWORD}"),
        ],
        &[],
    );
    assert!(!both_flags.contains(together), "{both_flags}");
    assert!(both_flags.contains("127.0.0.1:9"), "{both_flags}");
    let both_env = run(
        &key,
        &[],
        &[
            ("KILN_REGISTRY_USERNAME", USERNAME),
            ("KILN_REGISTRY_PASSWORD", PASSWORD),
        ],
    );
    assert!(!both_env.contains(together), "{both_env}");
    assert!(!both_flags.contains(PASSWORD) && !both_env.contains(PASSWORD));
}
