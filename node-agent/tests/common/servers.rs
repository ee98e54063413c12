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

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A runtime for reqwest, which is built without a default crypto provider; kiln uses ring.
pub fn runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Runtime::new().expect("rt")
}
