//! Routing: the router thread and everything it decides with. It owns the cluster view
//! (brokers, partitions, leaders), validates topics, applies per-topic rate limits, chooses
//! partitions, batches messages and hands each batch to the dispatcher of the partition's
//! leader; batches that come back are routed again. The metadata fetcher is its helper
//! thread, so the router never blocks on the network.
//!
//! Channels: reads `Vec<Msg>` from the inputs (and hands emptied vectors back), `Outcome`
//! from the dispatchers, `MetaResponse` from the fetcher, `Control` from the supervisor and
//! `StatusRequest` from the status server; writes `Batch` to the dispatchers and
//! `MetaRequest` to the fetcher (all in [`crate::pipeline`]).
//!
//! Imports: settings, the pipeline types, the pool, [`crate::report`] (counting and
//! discards), [`crate::deliver`] (the router starts and stops the dispatchers; backoff) and
//! [`crate::kafka`] (metadata, in the fetcher). Never [`crate::input`] or
//! [`crate::spool`]: inputs reach the router through the channel or `SharedRouter`.
//!
//! Reading order: [`router`] (with its parts in `router/`), then the pure decision logic it
//! uses, private to this role: `batcher.rs` (when a batch is complete), `deadlines.rs`
//! (which batch's time is up next), `cluster.rs` (the cluster view and partition choice),
//! `partitioner.rs` (Java's murmur2 key partitioner), `rate_limit.rs`; and [`fetcher`],
//! the metadata thread.

mod batcher;
mod cluster;
mod deadlines;
pub mod fetcher;
mod partitioner;
mod rate_limit;
pub mod router;

pub use router::{Router, RouterChannels, RouterEvents, SharedRouter};
