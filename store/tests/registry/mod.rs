//! A real distribution registry for tests (Debian's `docker-registry`; Distribution 3 for the
//! pull-through cache): `registry serve` with a temp config on 127.0.0.1:<free port>, filesystem
//! storage in a temp dir (so a test can flip a byte in a stored blob), optionally behind
//! htpasswd basic auth. Killed on drop.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = "/usr/bin/docker-registry";

/// A running registry.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry without auth, or `None` (with the reason printed) when the binary is
    /// absent and this is not root, so it cannot be installed. As root (CI runs
    /// scripts/test.sh as root, which installs it) a missing binary fails the test.
    pub fn start() -> Option<Self> {
        Self::start_with(None)
    }

    /// Starts a registry that accepts only `user`/`password` (bcrypt htpasswd via `htpasswd`).
    pub fn start_with_auth(user: &str, password: &str) -> Option<Self> {
        Self::start_with(Some((user, password)))
    }

    /// Starts a registry that writes its access log (to [`Registry::log`]).
    pub fn start_logged() -> Option<Self> {
        Self::start_configured(None, "", "  accesslog:\n    disabled: false\n")
    }

    /// Starts the CNCF Distribution registry 3 (scripts/ensure/distribution.sh: built from the
    /// Go module proxy, cached) as a pull-through cache of the registry at `origin`
    /// (`proxy.remoteurl`), anonymous to it; `None` after saying why it could not be built (a
    /// failure under `CI=true`). 3, not Debian's 2.8: 2.8 fetches a cold blob twice.
    pub fn start_proxy(origin: SocketAddr) -> Option<Self> {
        let binary = ensured("distribution")?;
        let proxy = format!("proxy:\n  remoteurl: http://{origin}\n");
        Self::start_binary(&binary, None, &proxy, "  accesslog:\n    disabled: false\n")
    }

    fn start_with(auth: Option<(&str, &str)>) -> Option<Self> {
        Self::start_configured(auth, "", "  accesslog:\n    disabled: true\n")
    }

    fn start_configured(auth: Option<(&str, &str)>, extra: &str, access: &str) -> Option<Self> {
        if !available() {
            return None;
        }
        Self::start_binary(Path::new(BINARY), auth, extra, access)
    }

    fn start_binary(
        binary: &Path,
        auth: Option<(&str, &str)>,
        extra: &str,
        access: &str,
    ) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\n{access}storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  secret: kiln-test-secret\n{extra}",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = auth {
            let htpasswd = dir.path().join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .expect(
                    "htpasswd (apache2-utils) is needed; scripts/ensure-packages.sh installs it",
                );
            assert!(out.status.success(), "htpasswd failed: {out:?}");
            std::fs::write(&htpasswd, &out.stdout).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: kiln-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the registry");
        let mut registry = Self { child, addr, dir };
        registry.wait_ready();
        Some(registry)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the registry exited ({status}): {}", self.log());
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the registry did not listen on {}: {}",
            self.addr,
            self.log()
        );
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Body bytes of every successful GET of a blob in the access log, and how many there were.
    pub fn blob_bytes_served(&self) -> (u64, usize) {
        let log = self.log();
        let sizes: Vec<u64> = log
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/sha256:"))
            .filter_map(|l| {
                // ... "GET /v2/... HTTP/1.1" 200 12345 "" "agent"
                let after = l.split("HTTP/1.1\" ").nth(1)?;
                let mut fields = after.split(' ');
                let status = fields.next()?;
                let size = fields.next()?.parse().ok()?;
                matches!(status, "200" | "206").then_some(size)
            })
            .collect();
        (sizes.iter().sum(), sizes.len())
    }

    /// How many times the access log shows each blob (`sha256:<hex>`) served whole or in part.
    pub fn blob_gets(&self) -> std::collections::BTreeMap<String, usize> {
        let mut gets = std::collections::BTreeMap::new();
        for l in self.log().lines().filter(|l| l.contains("\"GET /v2/")) {
            let Some((_, rest)) = l.split_once("/blobs/") else {
                continue;
            };
            let digest: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
            let served = l
                .split("HTTP/1.1\" ")
                .nth(1)
                .is_some_and(|a| a.starts_with("200 ") || a.starts_with("206 "));
            if served {
                *gets.entry(digest).or_insert(0) += 1;
            }
        }
        gets
    }

    /// The store URL for repository `repo`.
    pub fn url(&self, repo: &str) -> String {
        format!("oci://{}/{repo}", self.addr)
    }

    /// The file holding blob `sha256:<hex>` in the registry's storage.
    pub fn blob_path(&self, hex: &str) -> PathBuf {
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Storage root.
    pub fn storage(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the registry (the port is then refused).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The tool `scripts/ensure/TOOL.sh` builds (from the Go module proxy, cached), or `None` after
/// saying why (a failure under `CI=true`).
pub fn ensured(tool: &str) -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../scripts/ensure/{tool}.sh"));
    match Command::new(&script).output() {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).trim().into()),
        other => {
            let why = format!(
                "no {tool} (scripts/ensure/{tool}.sh needs the Go module proxy once): {other:?}"
            );
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

fn available() -> bool {
    if Path::new(BINARY).exists() {
        return true;
    }
    // Root can install it (scripts/test.sh does), so absence there is a failure, not a skip;
    // under CI (`CI=true`) nothing skips.
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if root || ci {
        panic!(
            "{BINARY} is missing; run scripts/ensure-packages.sh (scripts/test.sh does) to install Debian's docker-registry"
        );
    }
    eprintln!(
        "SKIPPED: {BINARY} is missing and this is not root; install Debian's docker-registry (scripts/ensure-packages.sh) to run the registry tests"
    );
    false
}
