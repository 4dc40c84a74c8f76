//! Delivery: one dispatcher per broker. It owns that broker's connection, packs batches
//! into Produce requests and writes them (the sender thread), reads the responses in order
//! and settles each partition's messages (the ack-reader thread): delivered, discarded, or
//! handed back to the router to send again. [`idempotence`] is the idempotent producer's
//! sequencing: pure state the router owns and consults (its sealed batches are what the
//! dispatcher stamps with producer id, epoch and sequence).
//!
//! Channels: reads `Batch` from the router; writes `Outcome` (returned batches, connection
//! state, finished batches) to the router (types in [`crate::pipeline`]).
//!
//! Imports: settings, the pipeline types, [`crate::report`] (counting, discards, message
//! debug), [`crate::kafka`] (codec and connection) and [`crate::fasthash`]. Never
//! [`crate::route`], [`crate::input`] or [`crate::spool`]: it knows only the batches it
//! is given. (`tests/structure.rs` checks every role's imports.) [`backoff`] is `pub`
//! because the router and the metadata fetcher use it too, as is [`refusal`] (connections
//! refused for TLS or SASL reasons).
//!
//! Reading order: [`dispatcher`] (with `dispatcher/sender.rs` and `dispatcher/acks.rs`),
//! [`idempotence`], [`backoff`], [`refusal`].

pub mod backoff;
pub mod dispatcher;
pub mod idempotence;
pub mod refusal;
