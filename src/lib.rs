//! dory: a Kafka producer daemon, wire-compatible with the Dory daemon's clients.
//!
//! ```text
//!  clients ─UNIX dgram──▶ [input-dgram] ─┐
//!  clients ─UNIX stream─▶ [input-stream]─┼─Vec<Msg>─▶ [router] ─Batch─▶ [dispatcher-N] ◀─TCP─▶ broker N
//!  clients ─TCP 127.0.0.1▶ [input-tcp] ──┘              │  ▲  ▲                │
//!                                                        │  │  └──Outcome──────┘ (retry/reroute)
//!                       [metadata] ◀─MetaRequest─────────┘  └─MetaResponse─ [metadata]
//!  pool: key+value bytes, preallocated; a message's lease is freed when it is acked or discarded
//!  [status] HTTP: reads the metrics; POST /metadata_update asks the router for a refresh
//!  supervisor (main thread): signals → stop inputs → router drains → dispatchers stop
//! ```
//!
//! Modules in reading order: [`cli`] and [`config`] (flags and TOML → validated settings),
//! [`daemon`] (the supervisor), [`pipeline`] (every type that crosses a channel),
//! [`pool`], [`input`], [`router`] with [`batcher`] and [`cluster`], [`metadata`],
//! [`dispatcher`], [`metrics`] and [`status`], and the pure Kafka codec in [`kafka`].

pub mod backoff;
pub mod batcher;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod discard_log;
pub mod discards;
pub mod dispatcher;
pub mod fasthash;
pub mod input;
pub mod kafka;
pub mod metadata;
pub mod metrics;
pub mod msg_debug;
pub mod partitioner;
pub mod pipeline;
pub mod policy;
pub mod pool;
pub mod rate_limit;
pub mod router;
pub mod send;
pub mod status;
