//! Reporting: what happened to messages, and the ways to look at it. [`metrics`] is the one
//! place every role records counts (received, delivered, discarded by reason, queues,
//! health); [`discards`] ends a message as a counted discard; [`discard_log`] writes one
//! line per discard on its own thread; [`msg_debug`] follows selected topics through the
//! daemon on request; [`commit_points`] tracks, per topic, the newest timestamp below which
//! everything is resolved, the oldest unacknowledged age and the delivery latency (and writes
//! the commit points to a state file on its own thread); [`status`] serves it all over HTTP;
//! [`liveness`] holds the role threads' heartbeats the supervisor checks for the systemd
//! watchdog.
//!
//! Channels: the status server writes `StatusRequest` to the router
//! ([`crate::pipeline`]); the discard log thread reads its own line channel; the
//! commit-points thread reads only its stop channel and a timer. Everything
//! else is shared memory read and written through [`metrics::Metrics`].
//!
//! Imports: nothing from [`crate::input`], [`crate::route`], [`crate::deliver`] or
//! [`crate::kafka`]; only settings, the pipeline types (`Msg`, `TopicId`,
//! `StatusRequest`), the pool (whose fill level it reports), [`crate::latency`] and the
//! spool's figures ([`crate::spool::SpoolStats`], which it shows). Every role but the spool
//! may import it. (`tests/structure.rs` checks every role's imports.)
//!
//! Reading order: [`metrics`], [`discards`], [`commit_points`], [`discard_log`],
//! [`msg_debug`], [`status`], [`liveness`].

pub mod commit_points;
pub mod discard_log;
pub mod discards;
pub mod liveness;
pub mod metrics;
pub mod msg_debug;
pub mod status;
