//! Counters, per-topic accounting and discard reports: the one place every role records what
//! happened to messages, and the only source the status server reads.
//!
//! Hot-path calls (`inc`, `received`, `delivered`, `queue_add`, a known `topic_id`) are atomics
//! only: no allocation and no global mutex. Discard reports (§10.2 of the reference) take a
//! mutex, because discards are the rare path.

//!
//! This file holds [`Metrics`] itself; the counter catalogue is in `counters.rs`, the
//! lock-free per-topic slots in `topic_table.rs`, the discard-report periods in
//! `discard_reports.rs`, and the commit point and latency hooks in `tracking.rs`.

mod brokers;
mod counters;
mod discard_reports;
mod spool_stats;
mod topic_table;
mod tracking;

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::PerTopicMetrics;
use crate::pipeline::{TopicId, NO_TOPIC};
use crate::spool::SpoolStats;
pub use brokers::{BrokerProtocol, BrokerTable};
pub use counters::{Counter, DiscardReason};
use discard_reports::{add_range, Periods};
pub use discard_reports::{DiscardReport, DiscardReports, TopicRange, LRU_CAPACITY};

use topic_table::TopicTable;

/// Life-cycle states whose per-topic counts `/queues` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueState {
    New,
    Batch,
    SendWait,
    AckWait,
}

/// Start-up progress, as `/health` reports it. Only ever moves forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Health {
    Starting,
    InputsOpen,
    Ready,
}

/// Settings the metrics need; built from the validated config.
#[derive(Clone, Debug)]
pub struct MetricsConfig {
    /// Length of one discard-report period.
    pub discard_report_interval: Duration,
    /// Raw prefixes kept in discard reports are truncated to this many bytes.
    pub bad_msg_prefix_size: usize,
    /// Most distinct topics tracked (besides ""); `topic_id` returns `None` beyond it.
    pub max_topics: usize,
    /// Version string served in every status response.
    pub version: String,
    /// Track commit points and the oldest unacknowledged age (`commit_points.enable`).
    pub commit_points: bool,
    /// Which `/metrics` families are per topic (`status.per_topic_metrics`).
    pub per_topic_metrics: PerTopicMetrics,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            discard_report_interval: Duration::from_secs(600),
            bad_msg_prefix_size: 256,
            max_topics: 10_000,
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit_points: true,
            per_topic_metrics: PerTopicMetrics::Accounting,
        }
    }
}

/// The idempotent producer's state, as monitoring sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idempotence {
    /// Waiting for the first producer id.
    Pending = 0,
    /// Batches carry a producer id and sequence numbers.
    On = 1,
    /// Getting a new epoch or producer id; nothing is sent meanwhile.
    Resetting = 2,
    /// Turned off in the configuration.
    Disabled = 3,
    /// The cluster refused it; delivery continues without (as Dory did).
    Unsupported = 4,
}

impl Idempotence {
    fn from_u8(v: u8) -> Idempotence {
        match v {
            1 => Idempotence::On,
            2 => Idempotence::Resetting,
            3 => Idempotence::Disabled,
            4 => Idempotence::Unsupported,
            _ => Idempotence::Pending,
        }
    }

    /// The `state` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Idempotence::Pending => "pending",
            Idempotence::On => "on",
            Idempotence::Resetting => "resetting",
            Idempotence::Disabled => "disabled",
            Idempotence::Unsupported => "unsupported",
        }
    }
}

/// Message counts per queue state of one topic (gauges: they go up and down).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub new: i64,
    pub batch: i64,
    pub send_wait: i64,
    pub ack_wait: i64,
}

/// One topic's accounting at one moment; see `Metrics::snapshot_topics`.
#[derive(Clone, Debug)]
pub struct TopicSnapshot {
    pub id: TopicId,
    pub name: Arc<[u8]>,
    pub received: u64,
    pub delivered: u64,
    /// Indexed by `DiscardReason::index`.
    pub discarded: [u64; DiscardReason::COUNT],
    pub possible_duplicates: u64,
    /// Messages of idempotent batches in doubt that are sent again under the same
    /// sequence (see [`Metrics::resent_in_doubt`]).
    pub resent_in_doubt: u64,
    /// `received - delivered - sum(discarded)`; never negative when callers count
    /// `received` before the outcome (see `snapshot_topics`).
    pub in_flight: i64,
    pub queued: QueueCounts,
}

impl TopicSnapshot {
    /// Discards of this topic under one reason.
    pub fn discarded(&self, reason: DiscardReason) -> u64 {
        self.discarded[reason.index()]
    }

    /// Discards of this topic under all reasons.
    pub fn discarded_total(&self) -> u64 {
        self.discarded.iter().sum()
    }
}

/// All counters and accounting of the daemon. Created once, shared as `&'static`.
pub struct Metrics {
    counters: Box<[AtomicU64]>,
    topics: TopicTable,
    reports: Mutex<Periods>,
    bad_msg_prefix_size: usize,
    interval_secs: u64,
    version: String,
    per_topic_metrics: PerTopicMetrics,
    pid: u32,
    start_secs: u64,
    last_discard_query_secs: AtomicU64,
    metadata_updated_ms: AtomicU64,
    metadata_modified_ms: AtomicU64,
    health: AtomicU8,
    /// The idempotent producer: [`Idempotence`] state, producer id and epoch.
    idempotence: AtomicU8,
    producer_id: std::sync::atomic::AtomicI64,
    producer_epoch: std::sync::atomic::AtomicI64,
    pool_capacity: AtomicU64,
    pool_used: AtomicU64,
    /// The live pool, once attached: its gauges are then read at scrape time.
    live_pool: std::sync::OnceLock<&'static crate::pool::Pool>,
    /// The discard log, when configured.
    discard_log: std::sync::OnceLock<crate::report::discard_log::DiscardLogSender>,
    /// Message debug logging (always present; refuses requests when not configured).
    msg_debug: std::sync::OnceLock<Arc<crate::report::msg_debug::MsgDebug>>,
    /// Commit points: on or off, and their clock.
    tracking: crate::report::commit_points::Tracking,
    /// Brokers the router knows, and those whose dispatcher is connected (`/health`'s
    /// neighbour for the systemd status line).
    brokers_known: AtomicU64,
    brokers_up: AtomicU64,
    /// The protocol each broker was last found to speak.
    broker_protocols: BrokerTable,
    /// Every role thread's heartbeat, for the watchdog.
    liveness: crate::report::liveness::Liveness,
    /// The durable spool's values.
    spool: SpoolStats,
    /// Brokers refusing us for TLS or SASL reasons, for `/health`.
    security: Mutex<SecurityState>,
    /// While metadata fetches fail with none succeeding since: the last one's reason and
    /// how many failed in a row, for `/health`.
    metadata_failure: Mutex<Option<(String, u64)>>,
}

/// Longest reason [`Metrics::metadata_fetch_failed`] keeps (one line per broker tried can
/// add up with many bootstrap brokers).
const METADATA_FAILURE_MAX: usize = 1_000;

/// Per broker address (`host:port`): why it refuses us, or that it last let us in.
#[derive(Default)]
struct SecurityState {
    failing: std::collections::BTreeMap<String, String>,
    usable: std::collections::BTreeSet<String>,
}

impl Metrics {
    pub fn new(config: MetricsConfig) -> Self {
        let start_secs = now_secs();
        let interval_secs = config.discard_report_interval.as_secs().max(1);
        Metrics {
            counters: (0..Counter::COUNT).map(|_| AtomicU64::new(0)).collect(),
            topics: TopicTable::new(config.max_topics),
            reports: Mutex::new(Periods::new(start_secs, interval_secs)),
            bad_msg_prefix_size: config.bad_msg_prefix_size,
            interval_secs,
            version: config.version,
            per_topic_metrics: config.per_topic_metrics,
            pid: std::process::id(),
            start_secs,
            last_discard_query_secs: AtomicU64::new(start_secs),
            metadata_updated_ms: AtomicU64::new(0),
            metadata_modified_ms: AtomicU64::new(0),
            health: AtomicU8::new(Health::Starting as u8),
            idempotence: AtomicU8::new(Idempotence::Pending as u8),
            producer_id: std::sync::atomic::AtomicI64::new(-1),
            producer_epoch: std::sync::atomic::AtomicI64::new(-1),
            pool_capacity: AtomicU64::new(0),
            pool_used: AtomicU64::new(0),
            live_pool: std::sync::OnceLock::new(),
            discard_log: std::sync::OnceLock::new(),
            msg_debug: std::sync::OnceLock::new(),
            tracking: crate::report::commit_points::Tracking::new(config.commit_points),
            brokers_known: AtomicU64::new(0),
            brokers_up: AtomicU64::new(0),
            broker_protocols: BrokerTable::default(),
            liveness: crate::report::liveness::Liveness::new(),
            spool: SpoolStats::default(),
            security: Mutex::new(SecurityState::default()),
            metadata_failure: Mutex::new(None),
        }
    }

    // ----- threads and brokers -----

    /// What each broker speaks (set by its dispatcher on connecting; the status pages).
    pub fn broker_protocols(&self) -> &BrokerTable {
        &self.broker_protocols
    }

    /// The role threads' heartbeats.
    pub fn liveness(&self) -> &crate::report::liveness::Liveness {
        &self.liveness
    }

    /// Publishes how many brokers the router knows and how many of their dispatchers are
    /// connected.
    pub fn set_brokers(&self, known: usize, up: usize) {
        self.brokers_known.store(known as u64, Ordering::Relaxed);
        self.brokers_up.store(up as u64, Ordering::Relaxed);
    }

    /// (brokers known, brokers up).
    pub fn brokers(&self) -> (u64, u64) {
        (
            self.brokers_known.load(Ordering::Relaxed),
            self.brokers_up.load(Ordering::Relaxed),
        )
    }

    // ----- broker connection security -----

    /// Records that the broker at `addr` refused us (TLS or SASL); `reason` is the sentence
    /// `/health` shows, e.g. "cannot authenticate to broker 1 (h:9093): ...".
    pub fn security_failed(&self, addr: &str, reason: String) {
        if let Ok(mut s) = self.security.lock() {
            s.usable.remove(addr);
            s.failing.insert(addr.to_owned(), reason);
        }
    }

    /// Records that a connection to the broker at `addr` passed TLS and SASL.
    pub fn security_ok(&self, addr: &str) {
        if let Ok(mut s) = self.security.lock() {
            if s.failing.remove(addr).is_some() || !s.usable.contains(addr) {
                s.usable.insert(addr.to_owned());
            }
        }
    }

    /// Why no broker can be used, when every broker we tried refused us for TLS or SASL
    /// reasons (and none let us in since): one line per refusing broker.
    pub fn security_problem(&self) -> Option<String> {
        let s = self.security.lock().ok()?;
        if s.failing.is_empty() || !s.usable.is_empty() {
            return None;
        }
        Some(s.failing.values().cloned().collect::<Vec<_>>().join("\n"))
    }

    // ----- metadata fetches -----

    /// A metadata fetch failed at every broker it tried; `why` names each broker and its
    /// error. Kept, cut to 1,000 bytes (`METADATA_FAILURE_MAX`), until a fetch succeeds.
    pub fn metadata_fetch_failed(&self, why: &str) {
        let mut end = why.len().min(METADATA_FAILURE_MAX);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        let why = if end < why.len() {
            format!("{}…", &why[..end])
        } else {
            why.to_owned()
        };
        let mut f = self
            .metadata_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let failures = f.as_ref().map_or(0, |(_, n)| *n).saturating_add(1);
        *f = Some((why, failures));
    }

    /// A metadata fetch succeeded: what [`Metrics::metadata_fetch_failed`] kept is cleared.
    pub fn metadata_fetch_succeeded(&self) {
        *self
            .metadata_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// While metadata fetches fail and none has succeeded since: the last one's reason and
    /// how many failed in a row.
    pub fn metadata_failure(&self) -> Option<(String, u64)> {
        self.metadata_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    // ----- the idempotent producer -----

    /// Publishes the producer's state (and its id and epoch, -1 when it has none).
    pub fn set_idempotence(&self, state: Idempotence, producer_id: i64, epoch: i16) {
        self.producer_id.store(producer_id, Ordering::Relaxed);
        self.producer_epoch
            .store(i64::from(epoch), Ordering::Relaxed);
        self.idempotence.store(state as u8, Ordering::Relaxed);
    }

    /// (state, producer id, epoch).
    pub fn idempotence(&self) -> (Idempotence, i64, i64) {
        (
            Idempotence::from_u8(self.idempotence.load(Ordering::Relaxed)),
            self.producer_id.load(Ordering::Relaxed),
            self.producer_epoch.load(Ordering::Relaxed),
        )
    }

    // ----- named counters -----

    pub fn inc(&self, c: Counter) {
        self.add(c, 1);
    }

    pub fn add(&self, c: Counter, n: u64) {
        self.counters[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.counters[c as usize].load(Ordering::Relaxed)
    }

    // ----- topics -----

    /// Interns a topic name. `None` once `max_topics` distinct topics exist: the caller then
    /// accounts the message under `NO_TOPIC`. The empty name is always `NO_TOPIC`.
    pub fn topic_id(&self, name: &[u8]) -> Option<TopicId> {
        self.topics.intern(name)
    }

    /// Most topic names the table gives ids to (`input.max_topics`; "" has its own).
    pub fn max_topics(&self) -> usize {
        self.topics.max_topics()
    }

    /// The name of an interned topic ("" for `NO_TOPIC` or an id never handed out).
    pub fn topic_name(&self, id: TopicId) -> Arc<[u8]> {
        self.topics.stats(id).name()
    }

    // ----- per-message accounting (hot path) -----
    //
    // Orderings: `received` is Relaxed; every outcome (`delivered`, `discarded`) is a Release
    // increment, and `snapshot_topics` reads outcomes with Acquire before it reads `received`.
    // Each message's `received` increment happens before its outcome (same thread, or handed
    // over through a channel), so a snapshot that sees an outcome also sees its receipt.

    /// `n` messages of topic `t` entered the daemon. Must be called before their outcome.
    pub fn received(&self, t: TopicId, n: u64) {
        self.topics
            .stats(t)
            .received
            .fetch_add(n, Ordering::Relaxed);
    }

    /// `n` messages of topic `t` were acknowledged by Kafka.
    pub fn delivered(&self, t: TopicId, n: u64) {
        self.topics
            .stats(t)
            .delivered
            .fetch_add(n, Ordering::Release);
    }

    /// `n` messages of topic `t` were discarded. Goes to the current report's per-topic map
    /// (count, min/max client timestamp), except `BadTopic`, which goes to the bad-topic count
    /// and the recent-bad-topic list; `RateLimit` also goes to the rate-limit counts. Does not
    /// touch named counters (`DiscardLongMsg` ...): the call site knows which one applies.
    pub fn discarded(&self, t: TopicId, reason: DiscardReason, n: u64, min_ts: i64, max_ts: i64) {
        self.count_discard(t, reason, n);
        let name = (reason == DiscardReason::BadTopic).then(|| self.topic_name(t));
        let mut periods = self.periods();
        let r = &mut periods.current;
        match name {
            Some(name) => {
                r.bad_topic += n;
                r.recent_bad_topics.push(&name);
            }
            None => {
                add_range(&mut r.discards, t, n, min_ts, max_ts);
                if reason == DiscardReason::RateLimit {
                    *r.rate_limit.entry(t).or_insert(0) += n;
                }
            }
        }
    }

    /// One input message without a parsed topic was discarded: counted under `NO_TOPIC` (the
    /// caller has already called `received(NO_TOPIC, 1)`) and in the report. `Malformed` keeps
    /// the prefix in the recent-malformed list; `UnsupportedApiKey` and `UnsupportedVersion`
    /// only count (use `unsupported_version` to fill the per-version list); `UncleanDisconnect`
    /// is taken as a UNIX stream one (use `unclean_disconnect` to say which). Any other reason
    /// goes to the per-topic map under "" with the current time as timestamp.
    pub fn input_discard(&self, reason: DiscardReason, raw_prefix: &[u8]) {
        if reason == DiscardReason::UncleanDisconnect {
            self.unclean_disconnect(false, raw_prefix);
            return;
        }
        self.count_discard(NO_TOPIC, reason, 1);
        let prefix = self.prefix(raw_prefix);
        let mut periods = self.periods();
        let r = &mut periods.current;
        match reason {
            DiscardReason::Malformed => {
                r.malformed += 1;
                r.recent_malformed.push(prefix);
            }
            DiscardReason::UnsupportedApiKey => r.unsupported_api_key += 1,
            DiscardReason::UnsupportedVersion => r.unsupported_version += 1,
            _ => {
                let now = i64::try_from(now_ms()).unwrap_or(i64::MAX);
                add_range(&mut r.discards, NO_TOPIC, 1, now, now);
            }
        }
    }

    /// One input message with an unsupported API version was discarded (see `input_discard`).
    /// The report keeps no prefixes of these; `raw_prefix` is for the discard log.
    pub fn unsupported_version(&self, version: i16, raw_prefix: &[u8]) {
        let _ = raw_prefix;
        self.count_discard(NO_TOPIC, DiscardReason::UnsupportedVersion, 1);
        let mut periods = self.periods();
        let r = &mut periods.current;
        r.unsupported_version += 1;
        *r.unsupported_versions.entry(version).or_insert(0) += 1;
    }

    /// A stream client left in the middle of a message: one discard under `NO_TOPIC` (the
    /// caller has already called `received(NO_TOPIC, 1)`), counted per transport with the
    /// partial bytes in the recent list.
    pub fn unclean_disconnect(&self, tcp: bool, partial: &[u8]) {
        self.count_discard(NO_TOPIC, DiscardReason::UncleanDisconnect, 1);
        let prefix = self.prefix(partial);
        let mut periods = self.periods();
        let r = &mut periods.current;
        if tcp {
            r.tcp_unclean += 1;
            r.recent_tcp_unclean.push(prefix);
        } else {
            r.unix_stream_unclean += 1;
            r.recent_unix_stream_unclean.push(prefix);
        }
    }

    /// Records a "topic value" sample of a message too long for Kafka. The discard itself is
    /// counted by `discarded(t, TooLong, ..)`.
    pub fn too_long_sample(&self, topic: &[u8], value: &[u8]) {
        let limit = self.bad_msg_prefix_size;
        let mut sample = Vec::with_capacity(limit.min(topic.len() + 1 + value.len()));
        sample.extend_from_slice(topic);
        sample.push(b' ');
        sample.extend_from_slice(value);
        sample.truncate(limit);
        self.periods().current.recent_too_long.push(&sample);
    }

    /// `n` messages of topic `t` were sent but never acknowledged, and are being sent again.
    pub fn possible_duplicates(&self, t: TopicId, n: u64, min_ts: i64, max_ts: i64) {
        self.topics
            .stats(t)
            .possible_duplicates
            .fetch_add(n, Ordering::Relaxed);
        add_range(&mut self.periods().current.duplicates, t, n, min_ts, max_ts);
    }

    /// `n` messages of topic `t`, in an idempotent batch in doubt (its connection failed
    /// with the request out, or the broker answered after appending it, see
    /// `kafka::errors::may_be_written`), are kept under their producer id, epoch and
    /// sequence to be sent again. A broker that implements KIP-98 stores them once;
    /// one that does not deduplicate stores each resend again. Not possible duplicates:
    /// those are counted by [`Metrics::possible_duplicates`] when a resend goes under a
    /// new identity.
    pub fn resent_in_doubt(&self, t: TopicId, n: u64) {
        self.topics
            .stats(t)
            .resent_in_doubt
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Starts loading topic `t`'s counters that [`Metrics::received`] and
    /// [`Metrics::queue_add`] write: a hint, for a batch's topics before they are counted.
    #[inline]
    pub fn prefetch_topic(&self, t: TopicId) {
        self.topics.prefetch(t);
    }

    /// Starts loading all of topic `t`'s counters: a hint for the next partition of a
    /// response while the acknowledgement thread settles this one.
    #[inline]
    pub fn prefetch_topic_ack(&self, t: TopicId) {
        self.topics.prefetch_all(t);
    }

    /// Moves `delta` messages of topic `t` into (positive) or out of (negative) a state.
    pub fn queue_add(&self, t: TopicId, state: QueueState, delta: i64) {
        self.topics.stats(t).queued[state as usize].fetch_add(delta, Ordering::Relaxed);
    }

    // ----- daemon state -----

    /// A metadata fetch succeeded; `modified` when it replaced the metadata.
    pub fn metadata_updated(&self, modified: bool) {
        let now = now_ms();
        self.metadata_updated_ms.store(now, Ordering::Relaxed);
        if modified {
            self.metadata_modified_ms.store(now, Ordering::Relaxed);
        }
    }

    /// (last updated, last modified), milliseconds since the epoch; 0 before the first fetch.
    pub fn metadata_times_ms(&self) -> (u64, u64) {
        (
            self.metadata_updated_ms.load(Ordering::Relaxed),
            self.metadata_modified_ms.load(Ordering::Relaxed),
        )
    }

    /// Records start-up progress. Health only moves forward, so roles may report in any order.
    pub fn set_health(&self, h: Health) {
        self.health.fetch_max(h as u8, Ordering::Relaxed);
    }

    /// Ready once inputs are open and the first metadata fetch succeeded (either reported as
    /// `Ready`, or `InputsOpen` plus a `metadata_updated`).
    pub fn health(&self) -> Health {
        match self.health.load(Ordering::Relaxed) {
            0 => Health::Starting,
            1 if self.metadata_updated_ms.load(Ordering::Relaxed) == 0 => Health::InputsOpen,
            _ => Health::Ready,
        }
    }

    /// Message pool gauges, in bytes.
    pub fn set_pool(&self, capacity: usize, used: usize) {
        self.pool_capacity.store(
            u64::try_from(capacity).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.pool_used
            .store(u64::try_from(used).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Writes discards to this log from now on.
    pub fn attach_discard_log(&self, log: crate::report::discard_log::DiscardLogSender) {
        let _ = self.discard_log.set(log);
    }

    pub fn discard_log(&self) -> Option<&crate::report::discard_log::DiscardLogSender> {
        self.discard_log.get()
    }

    /// Shares message debug logging with every role and the status server.
    pub fn attach_msg_debug(&self, d: Arc<crate::report::msg_debug::MsgDebug>) {
        let _ = self.msg_debug.set(d);
    }

    pub fn msg_debug(&self) -> Option<&crate::report::msg_debug::MsgDebug> {
        self.msg_debug.get().map(|d| &**d)
    }

    /// Reads the pool's gauges live from now on (instead of [`Metrics::set_pool`]).
    pub fn attach_pool(&self, pool: &'static crate::pool::Pool) {
        let _ = self.live_pool.set(pool);
    }

    /// (capacity, used) of the message pool, in bytes.
    pub fn pool(&self) -> (u64, u64) {
        if let Some(p) = self.live_pool.get() {
            return (p.capacity_bytes() as u64, p.used_bytes() as u64);
        }
        (
            self.pool_capacity.load(Ordering::Relaxed),
            self.pool_used.load(Ordering::Relaxed),
        )
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Which `/metrics` families are per topic.
    pub fn per_topic_metrics(&self) -> PerTopicMetrics {
        self.per_topic_metrics
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    /// Process start, seconds since the epoch.
    pub fn start_secs(&self) -> u64 {
        self.start_secs
    }

    /// Length of one discard-report period.
    pub fn discard_report_interval(&self) -> Duration {
        Duration::from_secs(self.interval_secs)
    }

    // ----- reading -----

    /// Every topic's accounting (including "" as `NO_TOPIC`), in id order.
    pub fn snapshot_topics(&self) -> Vec<TopicSnapshot> {
        let count = self.topics.len();
        let mut out = Vec::with_capacity(count);
        for id in 0..count {
            let Ok(id) = TopicId::try_from(id) else { break };
            let s = self.topics.stats(id);
            // Outcomes first (Acquire), `received` last: every message counts `received`
            // before its outcome, so the `received` read here covers every outcome read above
            // and `in_flight` is never negative. Reading `received` first would race with a
            // message that arrives and completes between the reads.
            let delivered = s.delivered.load(Ordering::Acquire);
            let mut discarded = [0u64; DiscardReason::COUNT];
            for (d, a) in discarded.iter_mut().zip(s.discarded.iter()) {
                *d = a.load(Ordering::Acquire);
            }
            let received = s.received.load(Ordering::Acquire);
            let done = discarded
                .iter()
                .fold(delivered, |acc, d| acc.wrapping_add(*d));
            // Two's complement: a (buggy) surplus of outcomes shows as a negative count
            // instead of wrapping to a huge one.
            let in_flight = received.wrapping_sub(done) as i64;
            let q = |state: QueueState| s.queued[state as usize].load(Ordering::Relaxed);
            out.push(TopicSnapshot {
                id,
                name: s.name(),
                received,
                delivered,
                discarded,
                possible_duplicates: s.possible_duplicates.load(Ordering::Relaxed),
                resent_in_doubt: s.resent_in_doubt.load(Ordering::Relaxed),
                in_flight,
                queued: QueueCounts {
                    new: q(QueueState::New),
                    batch: q(QueueState::Batch),
                    send_wait: q(QueueState::SendWait),
                    ack_wait: q(QueueState::AckWait),
                },
            });
        }
        out
    }

    /// Messages received but neither delivered nor discarded yet, over all topics.
    pub fn total_in_flight(&self) -> i64 {
        self.snapshot_topics().iter().map(|t| t.in_flight).sum()
    }

    /// Copies the discard reports out, first rolling the periods forward to `now_secs`.
    pub fn discard_reports(&self, now_secs: u64) -> DiscardReports {
        let mut periods = self.periods();
        periods.advance(now_secs);
        DiscardReports {
            interval: self.discard_report_interval(),
            current: periods.current.export(&self.topics),
            finished: periods.finished.as_ref().map(|r| r.export(&self.topics)),
        }
    }

    /// Remembers that a monitor read the discard reports.
    pub fn note_discard_query(&self, now_secs: u64) {
        self.last_discard_query_secs
            .fetch_max(now_secs, Ordering::Relaxed);
    }

    /// For the periodic check of §10.2: when no discard query arrived in the last interval,
    /// counts `NoDiscardQuery` and returns true (the caller logs the warning).
    pub fn check_discard_query(&self, now_secs: u64) -> bool {
        let last = self.last_discard_query_secs.load(Ordering::Relaxed);
        let overdue = now_secs.saturating_sub(last) > self.interval_secs;
        if overdue {
            self.inc(Counter::NoDiscardQuery);
        }
        overdue
    }

    // ----- helpers -----

    fn count_discard(&self, t: TopicId, reason: DiscardReason, n: u64) {
        self.topics.stats(t).discarded[reason.index()].fetch_add(n, Ordering::Release);
    }

    fn prefix<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        &raw[..raw.len().min(self.bad_msg_prefix_size)]
    }

    /// The reports, rolled forward to now. A panic while holding the lock leaves the reports
    /// consistent enough to keep counting, so poisoning is ignored.
    fn periods(&self) -> MutexGuard<'_, Periods> {
        let mut p = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        p.advance(now_secs());
        p
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn now_secs() -> u64 {
    now_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn metadata_failures_count_up_until_a_fetch_succeeds() {
        let m = Metrics::new(MetricsConfig::default());
        assert_eq!(m.metadata_failure(), None);
        m.metadata_fetch_failed("a:9092: connection refused");
        m.metadata_fetch_failed("b:9092: timed out");
        assert_eq!(m.metadata_failure(), Some(("b:9092: timed out".into(), 2)));
        m.metadata_fetch_succeeded();
        assert_eq!(m.metadata_failure(), None);
        m.metadata_fetch_failed("c:9092: refused");
        assert_eq!(m.metadata_failure(), Some(("c:9092: refused".into(), 1)));
    }

    #[test]
    fn a_long_metadata_failure_is_cut_on_a_character_boundary() {
        let m = Metrics::new(MetricsConfig::default());
        // 'é' is two bytes: the cut at METADATA_FAILURE_MAX falls inside one.
        let long = format!("x{}", "é".repeat(METADATA_FAILURE_MAX));
        m.metadata_fetch_failed(&long);
        let (why, n) = m.metadata_failure().expect("kept");
        assert_eq!(n, 1);
        assert!(why.ends_with('…'), "{why}");
        assert!(
            why.len() <= METADATA_FAILURE_MAX + '…'.len_utf8(),
            "{}",
            why.len()
        );
        assert!(long.starts_with(why.trim_end_matches('…')));
    }

    fn metrics() -> Metrics {
        Metrics::new(MetricsConfig {
            bad_msg_prefix_size: 8,
            ..MetricsConfig::default()
        })
    }

    #[test]
    fn counters_add_and_get() {
        let m = metrics();
        m.inc(Counter::MsgCreate);
        m.add(Counter::MsgCreate, 4);
        assert_eq!(m.get(Counter::MsgCreate), 5);
        assert_eq!(m.get(Counter::MsgDestroy), 0);
    }

    #[test]
    fn topics_are_interned_and_capped() {
        let m = Metrics::new(MetricsConfig {
            max_topics: 70,
            ..MetricsConfig::default()
        });
        assert_eq!(m.topic_id(b""), Some(NO_TOPIC));
        let a = m.topic_id(b"a");
        assert_eq!(a, Some(1));
        assert_eq!(m.topic_id(b"a"), a);
        for i in 2..=70 {
            assert_eq!(m.topic_id(format!("t{i}").as_bytes()), Some(i));
        }
        assert_eq!(m.topic_id(b"one too many"), None);
        assert_eq!(&*m.topic_name(70), b"t70");
        assert_eq!(&*m.topic_name(NO_TOPIC), b"");
        assert_eq!(&*m.topic_name(999), b"");
        // A hint for any id, with a slot or not (70 is in the second segment, 999 past
        // the table, u32::MAX far past it), changes nothing and never panics.
        for id in [NO_TOPIC, 1, 70, 999, TopicId::MAX] {
            m.prefetch_topic(id);
        }
        assert_eq!(&*m.topic_name(70), b"t70");
        // An unknown id is counted as NO_TOPIC rather than lost.
        m.received(999, 1);
        assert_eq!(m.snapshot_topics()[0].received, 1);
        assert_eq!(m.snapshot_topics().len(), 71);
    }

    #[test]
    fn accounting_and_in_flight() {
        let m = metrics();
        let t = m.topic_id(b"t").unwrap();
        m.received(t, 10);
        m.delivered(t, 4);
        m.discarded(t, DiscardReason::KafkaError, 2, 5, 9);
        m.discarded(t, DiscardReason::BadTopic, 1, 1, 1);
        m.possible_duplicates(t, 3, 1, 2);
        m.queue_add(t, QueueState::AckWait, 3);
        m.queue_add(t, QueueState::AckWait, -1);
        let s = &m.snapshot_topics()[1];
        assert_eq!(&*s.name, b"t");
        assert_eq!((s.received, s.delivered, s.discarded_total()), (10, 4, 3));
        assert_eq!(s.discarded(DiscardReason::KafkaError), 2);
        assert_eq!(s.in_flight, 3);
        assert_eq!(s.possible_duplicates, 3);
        assert_eq!(s.queued.ack_wait, 2);
        assert_eq!(m.total_in_flight(), 3);
    }

    #[test]
    fn reports_collect_discards() {
        let m = metrics();
        let t = m.topic_id(b"zz").unwrap();
        let u = m.topic_id(b"aa").unwrap();
        m.discarded(t, DiscardReason::RateLimit, 2, 10, 20);
        m.discarded(t, DiscardReason::RateLimit, 1, 5, 15);
        m.discarded(u, DiscardReason::Shutdown, 1, 7, 7);
        m.discarded(t, DiscardReason::BadTopic, 3, 0, 0);
        m.received(NO_TOPIC, 6);
        m.input_discard(DiscardReason::Malformed, b"0123456789");
        m.input_discard(DiscardReason::UnsupportedApiKey, b"x");
        m.unsupported_version(3, b"x");
        m.unsupported_version(3, b"x");
        m.unclean_disconnect(true, b"tcp");
        m.too_long_sample(b"topic", b"value-long");
        let r = m.discard_reports(now_secs()).current;
        assert_eq!(r.id, 0);
        assert_eq!(r.start_secs, m.start_secs());
        assert_eq!(r.malformed_count, 1);
        assert_eq!(r.recent_malformed, vec![Box::from(&b"01234567"[..])]);
        assert_eq!(r.unsupported_api_key_count, 1);
        assert_eq!(
            (r.unsupported_version_count, r.unsupported_versions.clone()),
            (2, vec![(3, 2)])
        );
        assert_eq!((r.tcp_unclean_count, r.unix_stream_unclean_count), (1, 0));
        assert_eq!(r.recent_tcp_unclean.len(), 1);
        assert_eq!(r.bad_topic_count, 3);
        assert_eq!(r.recent_bad_topics, vec![Box::from(&b"zz"[..])]);
        assert_eq!(r.recent_too_long, vec![Box::from(&b"topic va"[..])]);
        assert_eq!(r.rate_limit, vec![(Arc::from(&b"zz"[..]), 3)]);
        let names: Vec<&[u8]> = r.discard_topics.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, vec![&b"aa"[..], &b"zz"[..]]);
        assert_eq!(
            r.discard_topics[1].1,
            TopicRange {
                count: 3,
                min_timestamp: 5,
                max_timestamp: 20
            }
        );
        let none = &m.snapshot_topics()[0];
        assert_eq!(none.discarded_total(), 5);
        assert_eq!(none.in_flight, 1);
    }

    #[test]
    fn health_moves_forward() {
        let m = metrics();
        assert_eq!(m.health(), Health::Starting);
        m.set_health(Health::InputsOpen);
        assert_eq!(m.health(), Health::InputsOpen);
        m.metadata_updated(true);
        assert_eq!(m.health(), Health::Ready);
        let m = metrics();
        m.set_health(Health::Ready);
        m.set_health(Health::InputsOpen);
        assert_eq!(m.health(), Health::Ready);
    }

    #[test]
    fn discard_query_check() {
        let m = metrics();
        let s = m.start_secs();
        assert!(!m.check_discard_query(s + 600));
        assert!(m.check_discard_query(s + 601));
        assert_eq!(m.get(Counter::NoDiscardQuery), 1);
        m.note_discard_query(s + 601);
        assert!(!m.check_discard_query(s + 700));
    }

    #[test]
    fn invariant_holds_under_concurrent_updates() {
        let m: &'static Metrics = Box::leak(Box::new(metrics()));
        let topics: Vec<TopicId> = (0..4)
            .map(|i| m.topic_id(format!("topic{i}").as_bytes()).unwrap())
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        // The workers start once the checker has scraped once, so it scrapes while they
        // work even when the machine runs it late (on 2 busy cores it once never ran).
        let start = Arc::new(std::sync::Barrier::new(4));
        let checker = {
            let stop = Arc::clone(&stop);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let mut scrapes = 0u64;
                loop {
                    for s in m.snapshot_topics() {
                        assert!(s.in_flight >= 0, "negative in_flight: {s:?}");
                        let sum = s.delivered + s.discarded_total();
                        assert_eq!(s.received, sum + s.in_flight as u64);
                    }
                    scrapes += 1;
                    if scrapes == 1 {
                        start.wait();
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                scrapes
            })
        };
        let workers: Vec<_> = (0..3)
            .map(|w| {
                let topics = topics.clone();
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..20_000u64 {
                        let t = topics[(i as usize + w) % topics.len()];
                        m.received(t, 1);
                        match i % 5 {
                            0 => m.discarded(t, DiscardReason::KafkaError, 1, 1, 1),
                            1 => m.discarded(t, DiscardReason::Shutdown, 1, 1, 1),
                            _ => m.delivered(t, 1),
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert!(checker.join().unwrap() > 0);
        let total: u64 = m.snapshot_topics().iter().map(|s| s.received).sum();
        assert_eq!(total, 60_000);
        assert_eq!(m.total_in_flight(), 0);
    }
}
