//! Credentials out of reach of the processes kiln-agent starts. A process's environment as it
//! was exec'd (`/proc/PID/environ`) and its command line stay readable by every process of the
//! same user, and by root, for its whole life: a compiler (or engine) child could read
//! kiln-agent's registry password from `/proc/$PPID/environ` however carefully the child's own
//! environment was allow-listed. So, before anything else, a kiln-agent that was given a
//! credential in its environment or on its command line re-executes itself without it
//! ([`reexec`]), handing it over in an anonymous memory file (memfd) whose descriptor number is
//! in `KILN_SECRETS_FD`; the new image takes it from there and closes it ([`take`]), and makes
//! itself non-dumpable ([`harden`]): its `/proc` entries and memory then belong to root, so a
//! child of the same user cannot read the credential from its memory either (root still can:
//! nothing protects a process's memory from root). The one re-exec also sets
//! `ORT_DISABLE_TELEMETRY` when ONNX Runtime may load (it must be set before the library
//! loads, and setting a variable in a running process is unsafe).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicBool, Ordering};

/// The credentials kiln-agent reads: environment variable and the flag that sets the same.
pub const CREDENTIALS: [(&str, &str); 2] = [
    ("KILN_REGISTRY_USERNAME", "--registry-username"),
    ("KILN_REGISTRY_PASSWORD", "--registry-password"),
];

/// The variable that names the descriptor of the memfd the credentials were handed over in.
pub const FD_VAR: &str = "KILN_SECRETS_FD";

/// The memfd's name (`/proc/self/fd/N` links to `/memfd:<name> (deleted)`).
const MEMFD_NAME: &str = "kiln-secrets";

/// Credentials taken out of the environment and command line, by variable name.
#[derive(Default)]
pub struct Secrets(BTreeMap<String, OsString>);

impl Secrets {
    /// The credential of `variable`, if one was handed over.
    pub fn get(&self, variable: &str) -> Option<&OsStr> {
        self.0.get(variable).map(OsString::as_os_str)
    }

    /// Fills the registry flags clap left empty (their variables were taken out of the
    /// environment before it ran) with the credentials handed over.
    pub fn fill(&self, registry: &mut kiln_store::RegistryArgs) {
        let text = |v: &str| self.get(v).and_then(OsStr::to_str).map(str::to_string);
        if registry.registry_username.is_none() {
            registry.registry_username = text(CREDENTIALS[0].0);
        }
        if registry.registry_password.is_none() {
            registry.registry_password = text(CREDENTIALS[1].0);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Drop for Secrets {
    /// Overwrites the values, so that freed heap does not keep them for a reader of this
    /// process's memory.
    fn drop(&mut self) {
        for value in self.0.values_mut() {
            let mut bytes = std::mem::take(value).into_vec();
            bytes.fill(0);
            std::hint::black_box(&bytes);
        }
    }
}

/// Splits command-line arguments into those kept and the credentials given as flags
/// (`--registry-password VALUE` or `--registry-password=VALUE`), by variable name. Nothing after
/// `--` is a flag.
pub fn split_args(args: Vec<OsString>) -> (Vec<OsString>, Vec<(String, OsString)>) {
    let mut kept = Vec::with_capacity(args.len());
    let mut taken = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(args.by_ref());
            break;
        }
        let bytes = arg.as_bytes();
        let found = CREDENTIALS.iter().find_map(|(var, flag)| {
            if bytes == flag.as_bytes() {
                Some((*var, None))
            } else {
                let rest = bytes.strip_prefix(flag.as_bytes())?.strip_prefix(b"=")?;
                Some((*var, Some(OsString::from_vec(rest.to_vec()))))
            }
        });
        match found {
            Some((var, Some(value))) => taken.push((var.to_string(), value)),
            // A flag without its value is left for clap to refuse.
            Some((var, None)) => match args.next() {
                Some(value) => taken.push((var.to_string(), value)),
                None => kept.push(arg),
            },
            None => kept.push(arg),
        }
    }
    (kept, taken)
}

/// `NAME=VALUE\0` per credential: what the memfd holds.
fn encode(secrets: &Secrets) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in &secrets.0 {
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// The inverse of [`encode`]; only the names of [`CREDENTIALS`] are taken.
fn decode(bytes: &[u8]) -> Secrets {
    let mut secrets = Secrets::default();
    for entry in bytes.split(|b| *b == 0) {
        let Some(eq) = entry.iter().position(|b| *b == b'=') else {
            continue;
        };
        let (name, value) = (&entry[..eq], &entry[eq + 1..]);
        if let Some((var, _)) = CREDENTIALS.iter().find(|(v, _)| v.as_bytes() == name) {
            secrets
                .0
                .insert((*var).to_string(), OsString::from_vec(value.to_vec()));
        }
    }
    secrets
}

static TAKEN: AtomicBool = AtomicBool::new(false);

/// In the image [`reexec`] started: the credentials handed over in the memfd named by
/// `KILN_SECRETS_FD`, which is closed (and emptied) before this returns. None without the
/// variable, or where it names no memfd of kiln-agent's making: a descriptor number set by hand,
/// or inherited by a child after the memfd was closed, is neither read nor closed. Only the
/// first call takes anything.
pub fn take() -> Secrets {
    let Some(fd) = std::env::var_os(FD_VAR)
        .and_then(|v| v.to_str()?.parse::<i32>().ok())
        .filter(|fd| *fd > 2)
    else {
        return Secrets::default();
    };
    let ours = std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|link| {
        link.as_os_str()
            .as_bytes()
            .starts_with(format!("/memfd:{MEMFD_NAME} ").as_bytes())
    });
    if !ours || TAKEN.swap(true, Ordering::SeqCst) {
        return Secrets::default();
    }
    // SAFETY: `fd` is open (its /proc link exists) and is the memfd the kiln-agent that exec'd
    // this image created and left open for it; nothing in this process owns it yet: this
    // function is the only code that reads FD_VAR, and TAKEN lets only its first call get here.
    // The OwnedFd is the descriptor's one owner and closes it when dropped below.
    #[allow(unsafe_code)]
    let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut file = std::fs::File::from(owned);
    // Read at its exact size: a growing buffer would leave copies behind in freed heap.
    let size = file.metadata().map_or(0, |m| m.len());
    let mut bytes = vec![0u8; usize::try_from(size).unwrap_or(0).min(1 << 20)];
    if let Err(e) = file.rewind().and_then(|()| file.read_exact(&mut bytes)) {
        eprintln!("kiln-agent: cannot read the credentials handed over in {FD_VAR}={fd}: {e}");
    }
    let _ = file.set_len(0);
    drop(file);
    let secrets = decode(&bytes);
    bytes.fill(0);
    std::hint::black_box(&bytes);
    secrets
}

/// Re-executes this binary (same process, same arguments but credential flags) when it holds a
/// credential in its environment or on its command line, or when ONNX Runtime may load
/// (`ort_may_load`) and `ORT_DISABLE_TELEMETRY` is unset. The credentials, with those `handed`
/// over to this image, go to the new one in a memfd. Returns when nothing needs it; exits when
/// the re-exec fails with credentials to hide (never running on with them readable).
pub fn reexec(ort_may_load: bool, handed: &Secrets) {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "kiln-agent".into());
    let (kept, from_args) = split_args(args.collect());
    let in_env: Vec<&str> = CREDENTIALS
        .iter()
        .map(|(var, _)| *var)
        .filter(|var| std::env::var_os(var).is_some())
        .collect();
    let telemetry = ort_may_load && std::env::var_os("ORT_DISABLE_TELEMETRY").is_none();
    if !telemetry && from_args.is_empty() && in_env.is_empty() {
        return;
    }
    let mut secrets = Secrets(handed.0.clone());
    for var in &in_env {
        if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            secrets.0.insert((*var).to_string(), value);
        }
    }
    secrets.0.extend(from_args);
    // /proc/self/exe: this very binary, even if its path was replaced since it started.
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0(arg0).args(kept);
    if telemetry {
        cmd.env("ORT_DISABLE_TELEMETRY", "1");
    }
    for var in &in_env {
        cmd.env_remove(var);
    }
    // Kept open until exec: the new image inherits it (a memfd made without MFD_CLOEXEC).
    let memfd = if secrets.is_empty() {
        cmd.env_remove(FD_VAR);
        None
    } else {
        match hand_over(&secrets) {
            Ok(file) => {
                use std::os::fd::AsRawFd;
                cmd.env(FD_VAR, file.as_raw_fd().to_string());
                Some(file)
            }
            Err(e) => fail(&format!("cannot hand the credentials over in a memfd: {e}")),
        }
    };
    let err = cmd.exec();
    drop(memfd);
    if !secrets.is_empty() {
        fail(&format!(
            "cannot re-execute without the credentials in its environment ({err})"
        ));
    }
    eprintln!(
        "kiln-agent: cannot re-execute with ORT_DISABLE_TELEMETRY=1 ({err}); set it to keep ONNX Runtime from sending telemetry"
    );
}

fn fail(message: &str) -> ! {
    eprintln!("kiln-agent: {message}; refusing to run with credentials its children could read");
    std::process::exit(1);
}

/// A memfd (inherited across exec) holding `secrets`, positioned at its start.
fn hand_over(secrets: &Secrets) -> std::io::Result<std::fs::File> {
    let fd = rustix::fs::memfd_create(MEMFD_NAME, rustix::fs::MemfdFlags::empty())?;
    let mut file = std::fs::File::from(fd);
    let mut bytes = encode(secrets);
    let written = file.write_all(&bytes).and_then(|()| file.rewind());
    bytes.fill(0);
    std::hint::black_box(&bytes);
    written.map(|()| file)
}

/// Makes this process non-dumpable: its `/proc/PID` entries (environ, mem, maps, fd) become
/// root's, and processes of the same user can no longer read its memory or ptrace it.
pub fn harden() {
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!(
            "kiln-agent: cannot make itself non-dumpable ({e}); its children of the same user could read its memory"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn credential_flags_are_taken_in_both_forms_and_nothing_after_the_separator() {
        let (kept, taken) = split_args(os(&[
            "run",
            "--registry-password",
            "hunter2",
            "--registry-username=alice",
            "--store",
            "oci://r/x",
            "--registry-passwordx=1",
            "--",
            "--registry-password",
            "stays",
        ]));
        assert_eq!(
            kept,
            os(&[
                "run",
                "--store",
                "oci://r/x",
                "--registry-passwordx=1",
                "--",
                "--registry-password",
                "stays"
            ])
        );
        assert_eq!(
            taken,
            vec![
                (
                    "KILN_REGISTRY_PASSWORD".to_string(),
                    OsString::from("hunter2")
                ),
                (
                    "KILN_REGISTRY_USERNAME".to_string(),
                    OsString::from("alice")
                ),
            ]
        );
        // A flag without a value stays for clap to refuse.
        let (kept, taken) = split_args(os(&["run", "--registry-password"]));
        assert_eq!(kept, os(&["run", "--registry-password"]));
        assert!(taken.is_empty());
    }

    #[test]
    fn the_memfd_round_trips_only_known_credentials() {
        let mut s = Secrets::default();
        s.0.insert("KILN_REGISTRY_PASSWORD".into(), "p=ss\u{e9}".into());
        s.0.insert("KILN_REGISTRY_USERNAME".into(), "alice".into());
        let mut bytes = encode(&s);
        bytes.extend_from_slice(b"LD_PRELOAD=/tmp/evil.so\0garbage\0");
        let back = decode(&bytes);
        assert_eq!(
            back.get("KILN_REGISTRY_PASSWORD"),
            Some(OsStr::new("p=ss\u{e9}"))
        );
        assert_eq!(
            back.get("KILN_REGISTRY_USERNAME"),
            Some(OsStr::new("alice"))
        );
        assert_eq!(back.0.len(), 2);
        let mut registry = kiln_store::RegistryArgs::default();
        back.fill(&mut registry);
        assert_eq!(registry.registry_username.as_deref(), Some("alice"));
        assert_eq!(registry.registry_password.as_deref(), Some("p=ss\u{e9}"));
        // A flag given after the re-exec wins over what was handed over.
        let mut registry = kiln_store::RegistryArgs {
            registry_password: Some("flag".into()),
            ..Default::default()
        };
        back.fill(&mut registry);
        assert_eq!(registry.registry_password.as_deref(), Some("flag"));
    }
}
