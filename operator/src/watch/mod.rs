//! The watches' side of the operator, pure: what the caches keep of each object ([`lean`]) and
//! which targets a Node, KilnNode or Job change concerns ([`triggers`]). [`crate::wiring`] wires
//! them into the reflectors.

pub mod lean;
pub mod triggers;
