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
//! One folder per role of the diagram: [`input`] (the `input-*` threads), [`route`] (the
//! router and its `metadata` fetcher), [`deliver`] (the `dispatcher-N` threads), [`report`]
//! (metrics, discards, the `status` server) and the pure Kafka codec in [`kafka`]. Shared
//! by all of them: [`config`], [`pipeline`] and [`pool`]. Each folder's `mod.rs` says what
//! the role owns, which channels it reads and writes, and what it must never import.
//!
//! Modules in reading order: [`cli`] and [`config`] (flags and TOML → validated settings),
//! [`daemon`] (the supervisor) and [`notify`] (its systemd notifications), [`pipeline`]
//! (every type that crosses a channel), [`pool`], [`input`], [`route`], [`deliver`],
//! [`report`], the durable [`spool`] (a per-topic write-ahead log and its `spool-sync`
//! thread), the pure Kafka codec in
//! [`kafka`], and [`send`] (the `dory send` client). [`fasthash`] is a hashing utility the
//! inputs and the router share.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod deliver;
pub mod fasthash;
pub mod input;
pub mod kafka;
pub mod latency;
pub mod notify;
pub mod pipeline;
pub mod pool;
pub mod prefetch;
pub mod report;
pub mod route;
pub mod send;
pub mod spool;
