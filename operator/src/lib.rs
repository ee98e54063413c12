//! kiln-operator: node classes, content-addressed compile Jobs and honest status for
//! CompiledTargets. Never links an ML runtime: the compile itself runs in `kiln-agent compile`.

pub mod admission;
pub mod classes;
pub mod context;
pub mod controller;
pub mod error;
pub mod job;
pub mod lean;
pub mod lookups;
pub mod memo;
pub mod metrics;
pub mod model;
pub mod observe;
pub mod pace;
pub mod plan;
pub mod readiness;
pub mod run;
pub mod telemetry;
pub mod triggers;
pub mod writes;
