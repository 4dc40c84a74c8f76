//! Reporting: what happened to messages, and the ways to look at it. [`metrics`] is the one
//! place every role records counts (received, delivered, discarded by reason, queues,
//! health); [`discards`] ends a message as a counted discard; [`discard_log`] writes one
//! line per discard on its own thread; [`msg_debug`] follows selected topics through the
//! daemon on request; [`status`] serves it all over HTTP. Later: commit points.
//!
//! Channels: the status server writes `StatusRequest` to the router
//! ([`crate::pipeline`]); the discard log thread reads its own line channel. Everything
//! else is shared memory read and written through [`metrics::Metrics`].
//!
//! Imports: nothing from [`crate::input`], [`crate::route`], [`crate::deliver`] or
//! [`crate::kafka`]; only settings, the pipeline types (`Msg`, `StatusRequest`) and the
//! pool (whose fill level it reports). Every role may import it.
//!
//! Reading order: [`metrics`], [`discards`], [`discard_log`], [`msg_debug`], [`status`].

pub mod discard_log;
pub mod discards;
pub mod metrics;
pub mod msg_debug;
pub mod status;
