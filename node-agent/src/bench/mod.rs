//! What the benchmark subcommands measure (`kiln-agent bench-verify`, `bench-pull`): each
//! against the peer tool or the physical bound measured in the same run. The subcommands in
//! [`crate::cmd`] print the figures; nothing else calls this.

pub mod pull;
pub mod verify;
