//! Servers a test starts as processes of their own (`kiln-agent serve`, llama.cpp's
//! llama-server), and the runtime its HTTP client needs.

use std::process::Child;

/// A running server process and its port, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now, for a server process to bind. Not from `bind(0)`: that port is
/// in the kernel's ephemeral range, which every outgoing connection draws its source port from,
/// so between our close and the server's bind a client elsewhere could take it (a flake seen
/// under load). This one is below that range, free when checked, and never handed out twice
/// in this test process; a collision with another process is then a bind error the server
/// reports, not a silent talk to the wrong peer.
pub fn free_port() -> u16 {
    use std::sync::Mutex;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000u16, low.saturating_sub(10_000).max(1));
    let mut given = GIVEN.lock().expect("ports");
    // A start that differs between the test processes cargo runs side by side.
    let mut port = first + (std::process::id() as u16).wrapping_mul(7919) % span;
    for _ in 0..span {
        port = if port + 1 >= first + span {
            first
        } else {
            port + 1
        };
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port in {first}..{}", first + span)
}

/// A runtime for reqwest, which is built without a default crypto provider; kiln uses ring.
pub fn runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Runtime::new().expect("rt")
}
