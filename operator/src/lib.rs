//! kiln-operator: node classes, content-addressed compile Jobs and honest status for
//! CompiledTargets. Never links an ML runtime: the compile itself runs in `kiln-agent compile`.
//!
//! From the top down (a module uses only those below it):
//!
//! * [`wiring`] — the process: watch caches, the two controllers, leader election, endpoints,
//!   shutdown. Plumbing only.
//! * [`controller`], [`model`] — one reconcile: gather the inputs, run the plan, hand the
//!   result to [`writes`], the only module that writes to the API.
//! * [`context`] — what every reconcile shares (only the type).
//! * [`watch`] — what the watch caches keep of each object, and which targets a change concerns.
//! * [`recall`] — what one replica remembers between passes: its own writes, store lookups, the
//!   compile-slot ledger, when each target's status was last written.
//! * [`job`] — the compile Job as an object, and reading it back.
//! * [`plan`] — the decision, pure: classes and compile keys, Jobs, revisions, rollout and
//!   readiness, conditions, Events.
//! * [`metrics`], [`telemetry`], [`error`] — shared by all.

pub mod context;
pub mod controller;
pub mod error;
pub mod job;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod recall;
pub mod telemetry;
pub mod watch;
pub mod wiring;
pub mod writes;
