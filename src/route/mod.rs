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
//! [`crate::kafka`] (metadata, in the fetcher). Never [`crate::input`]: inputs only reach
//! the router through the channel.
//!
//! Reading order: [`router`] (with its `router/` parts), [`batcher`], [`cluster`],
//! [`partitioner`], [`rate_limit`], [`fetcher`].

pub mod batcher;
pub mod cluster;
pub mod fetcher;
pub mod partitioner;
pub mod rate_limit;
pub mod router;

pub use router::{Router, RouterChannels};
