//! The sender thread (`dispatcher-<id>`): connects (with backoff), takes batches from the
//! router, packs them into Produce requests, writes them and hands each written request to
//! the connection's ack reader.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select_biased, Receiver, Sender};

use super::acks::Receiver_;
use super::{debug_log, fail_in_flight, give_back, DispatcherConfig, InFlight, Part, Shared};
use crate::config::policy::CodecName;
use crate::deliver::backoff::Backoff;
use crate::deliver::refusal;
use crate::fasthash::FastMap;
use crate::kafka::compression::{Codec, Compression};
use crate::kafka::connection::{ConnError, Connection, SecurityFailure};
use crate::kafka::message_set::{Magic, MessageSetWriter};
use crate::kafka::produce::ProduceRequestWriter;
use crate::kafka::record_batch::{CompressionOutcome, RecordBatchWriter};
use crate::kafka::{PRODUCE_LEGACY_VERSIONS, PRODUCE_VERSIONS};
use crate::pipeline::{
    Batch, Outcome, ReturnReason, TopicId, KAFKA_MSG_OVERHEAD, RECORD_BATCH_OVERHEAD,
};
use crate::report::liveness::{Heartbeat, TICK as HEARTBEAT_TICK};
use crate::report::metrics::{BrokerProtocol, Counter, Metrics, QueueState};
use crate::report::msg_debug::DebugFile;

/// While encoding a record, how many records ahead to prefetch payload bytes.
const PREFETCH_AHEAD: usize = 8;
/// Minimum interval between two log lines about the same broker's connection failures.
const CONNECT_LOG_INTERVAL: Duration = Duration::from_secs(30);

enum SessionEnd {
    /// The router closed the queue: stop.
    Closed,
    /// The connection failed: reconnect.
    Lost,
}

/// The sender thread's state (named with a trailing underscore to keep `Sender` for the
/// channel type).
pub(super) struct Sender_ {
    pub(super) id: i32,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) cfg: Arc<DispatcherConfig>,
    pub(super) metrics: &'static Metrics,
    pub(super) from_router: Receiver<Batch>,
    pub(super) to_router: Sender<Outcome>,
    pub(super) shared: Arc<Shared>,
    /// Batches taken from the queue but not yet sent.
    pub(super) carry: VecDeque<Batch>,
    pub(super) correlation_id: i32,
    pub(super) buf: Vec<u8>,
    /// Uncompressed records of a batch being compressed.
    pub(super) scratch: Vec<u8>,
    /// Where each partition sits in the request being gathered (reused; a request may
    /// hold thousands of partitions when there are many topics).
    pub(super) part_index: FastMap<(TopicId, i32), usize>,
    pub(super) zstd_warned: AtomicBool,
    /// Whether speaking an old Produce version (Kafka 0.10) to this broker was logged.
    pub(super) heartbeat: Heartbeat,
}

impl Sender_ {
    pub(super) fn run(mut self) {
        let mut backoff = Backoff::new(self.cfg.reconnect_backoff, self.cfg.reconnect_backoff_max);
        let mut down_since: Option<Instant> = None;
        let mut last_log: Option<(Instant, Option<SecurityFailure>)> = None;
        loop {
            self.heartbeat.beat();
            if self.shared.aborted() {
                self.stop();
                return;
            }
            match self.connect() {
                Ok((conn, version)) => {
                    backoff.reset();
                    if let Some(since) = down_since.take() {
                        log::info!(
                            "broker {} ({}:{}) reachable again after {:?}",
                            self.id,
                            self.host,
                            self.port,
                            since.elapsed()
                        );
                        self.report(Outcome::Connection {
                            broker: self.id,
                            up: true,
                        });
                    }
                    match self.session(conn, version) {
                        SessionEnd::Closed => {
                            self.stop();
                            return;
                        }
                        SessionEnd::Lost => {
                            down_since = Some(Instant::now());
                            self.report(Outcome::Connection {
                                broker: self.id,
                                up: false,
                            });
                            self.give_back_carry();
                        }
                    }
                }
                Err(e) => {
                    let addr = format!("{}:{}", self.host, self.port);
                    let who = format!("broker {} ({addr})", self.id);
                    let refused = refusal::note(self.metrics, &who, &addr, &e);
                    // Once per interval, and at once when the kind of failure changes.
                    let kind = e.security_failure();
                    if last_log
                        .is_none_or(|(t, k)| k != kind || t.elapsed() >= CONNECT_LOG_INTERVAL)
                    {
                        match refused {
                            Some(sentence) => log::error!("{sentence}"),
                            None => log::warn!("{who}: cannot connect: {e}"),
                        }
                        last_log = Some((Instant::now(), kind));
                    }
                    if down_since.is_none() {
                        down_since = Some(Instant::now());
                        self.report(Outcome::Connection {
                            broker: self.id,
                            up: false,
                        });
                    }
                    self.give_back_carry();
                    // Wait out the backoff, handing back anything routed to us meanwhile.
                    let until = Instant::now() + backoff.next_delay();
                    loop {
                        self.heartbeat.beat();
                        if self.shared.aborted() {
                            break;
                        }
                        // Wakes every heartbeat tick while waiting.
                        let wake = until.min(Instant::now() + HEARTBEAT_TICK);
                        match self.from_router.recv_deadline(wake) {
                            Ok(b) => {
                                self.taken(1);
                                give_back(
                                    &self.to_router,
                                    self.id,
                                    ReturnReason::ConnectionLost,
                                    vec![b],
                                );
                            }
                            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                                if Instant::now() >= until {
                                    break;
                                }
                            }
                            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                                self.stop();
                                return;
                            }
                        }
                    }
                }
            }
        }
    }

    /// The connection is gone: batches taken for it but not written go back to the router.
    fn give_back_carry(&mut self) {
        let carry: Vec<Batch> = self.carry.drain(..).collect();
        give_back(
            &self.to_router,
            self.id,
            ReturnReason::ConnectionLost,
            carry,
        );
    }

    fn report(&self, o: Outcome) {
        let _ = self.to_router.send(o);
    }

    /// Tells the router `n` batches left its queue.
    fn taken(&self, n: usize) {
        if n > 0 {
            self.report(Outcome::Finished { broker: self.id, n });
        }
    }

    /// Stopping: everything not sent goes back to the router.
    fn stop(&mut self) {
        let mut left: Vec<Batch> = self.carry.drain(..).collect();
        let mut n = 0;
        while let Ok(b) = self.from_router.try_recv() {
            left.push(b);
            n += 1;
        }
        self.taken(n);
        give_back(&self.to_router, self.id, ReturnReason::Stopped, left);
    }

    fn connect(&mut self) -> Result<(Connection, i16), ConnError> {
        self.metrics.inc(Counter::ConnectorStartConnect);
        let conn = Connection::connect(
            &self.host,
            self.port,
            self.cfg.connect_timeout,
            &self.cfg.security,
        )
        .inspect_err(|e| {
            if e.security_failure().is_none() {
                self.metrics.inc(Counter::ConnectorConnectFail)
            }
        })?;
        self.metrics.inc(Counter::ConnectorConnectSuccess);
        conn.set_timeouts(Some(self.cfg.socket_timeout), Some(self.cfg.socket_timeout))?;
        let (conn, neg) = conn.handshake_or_assume(
            self.cfg.client_id.as_deref(),
            self.cfg.socket_timeout,
            self.cfg.broker_version,
            || {
                let c = Connection::connect(
                    &self.host,
                    self.port,
                    self.cfg.connect_timeout,
                    &self.cfg.security,
                )?;
                c.set_timeouts(Some(self.cfg.socket_timeout), Some(self.cfg.socket_timeout))?;
                Ok(c)
            },
        )?;
        refusal::passed(self.metrics, &format!("{}:{}", self.host, self.port));
        let version =
            crate::kafka::negotiate_produce(neg.api_versions.get(crate::kafka::API_KEY_PRODUCE))
                .ok_or_else(|| {
                    ConnError::Io(std::io::Error::other(format!(
                "broker supports no Produce version in {}..={} (Kafka 0.8 or later is required)",
                PRODUCE_LEGACY_VERSIONS.min, PRODUCE_VERSIONS.max
            )))
                })?;
        let magic = Magic::for_produce_version(version).map_or(2, Magic::byte);
        let protocol = BrokerProtocol {
            address: format!("{}:{}", self.host, self.port),
            produce_version: version,
            magic,
            assumed: neg.assumed.map(|v| v.name()),
        };
        if magic < 2 {
            // Sealed batches already queued here go out without their identity; the router
            // turns idempotence off for the whole cluster (a partition may move between
            // this broker and a newer one), counted and logged once.
            self.report(Outcome::NoProducerIds {
                broker: self.id,
                why: format!(
                    "speaks Produce v{version} with {}, which carries no producer id",
                    protocol.format_name()
                ),
            });
        }
        // Said once per broker, and again only if it changes (an upgrade under the same id).
        if self
            .metrics
            .broker_protocols()
            .set(self.id, protocol.clone())
        {
            let format = protocol.format_name();
            match neg.assumed {
                Some(v) => log::warn!(
                    "broker {} ({}): closed the connection on ApiVersions; taken for Kafka {} (kafka.broker_version): speaking Produce v{version} with {format} (no idempotence, no zstd)",
                    self.id,
                    protocol.address,
                    v.name()
                ),
                None if magic < 2 => log::warn!(
                    "broker {} ({}): offers Produce v2 at most (Kafka 0.10): speaking Produce v{version} with {format} (no idempotence, no zstd)",
                    self.id,
                    protocol.address
                ),
                None => log::info!(
                    "broker {} ({}): speaking Produce v{version} with {format}",
                    self.id,
                    protocol.address
                ),
            }
        }
        Ok((conn, version))
    }

    /// Runs one connection until it fails or the router closes the queue.
    fn session(&mut self, conn: Connection, version: i16) -> SessionEnd {
        let reader = match conn.try_clone() {
            Ok(r) => r,
            Err(e) => {
                log::warn!("broker {}: {e}", self.id);
                return SessionEnd::Lost;
            }
        };
        match conn.try_clone() {
            Ok(c) => self.shared.set_conn(Some(c)),
            Err(e) => {
                log::warn!("broker {}: {e}", self.id);
                return SessionEnd::Lost;
            }
        }
        let mut conn = conn;
        let (to_acks, from_sender) = bounded::<InFlight>(self.cfg.max_in_flight.saturating_sub(2));
        let (dead_tx, dead_rx) = bounded::<()>(1);
        let receiver = Receiver_ {
            id: self.id,
            conn: reader,
            cfg: self.cfg.clone(),
            metrics: self.metrics,
            to_router: self.to_router.clone(),
            heartbeat: self.metrics.liveness().register(
                format!("dispatcher-{}-acks", self.id),
                self.cfg.io_quiet_max(),
            ),
        };
        let acks = match std::thread::Builder::new()
            .name(format!("dispatcher-{}-acks", self.id))
            .spawn(move || receiver.run(from_sender, dead_tx))
        {
            Ok(h) => h,
            Err(e) => {
                log::error!("broker {}: cannot start receiver thread: {e}", self.id);
                self.shared.set_conn(None);
                return SessionEnd::Lost;
            }
        };
        if self.shared.aborted() {
            let _ = conn.shutdown();
        }
        let end = loop {
            self.heartbeat.beat();
            let first = match self.carry.pop_front() {
                Some(b) => b,
                None => {
                    select_biased! {
                        recv(dead_rx) -> _ => break SessionEnd::Lost,
                        recv(self.from_router) -> b => match b {
                            Ok(b) => {
                                self.taken(1);
                                b
                            }
                            Err(_) => break SessionEnd::Closed,
                        },
                        default(HEARTBEAT_TICK) => continue,
                    }
                }
            };
            if dead_rx.try_recv().is_ok() {
                self.carry.push_front(first);
                break SessionEnd::Lost;
            }
            let parts = self.gather(first, version);
            self.correlation_id = self.correlation_id.wrapping_add(1);
            self.encode(&parts, version);
            if let Err(e) = conn.send(&self.buf) {
                log::warn!("broker {}: write failed: {e}", self.id);
                // Not fully written, so not received: send again elsewhere, no duplicate.
                for p in parts.into_iter().rev() {
                    self.carry.push_front(p.into_batch());
                }
                break SessionEnd::Lost;
            }
            self.metrics.inc(Counter::SendProduceRequestOk);
            for p in &parts {
                debug_log(self.metrics, DebugFile::Send, &p.name, &p.msgs);
                let n = p.msgs.len() as i64;
                self.metrics.queue_add(p.topic, QueueState::SendWait, -n);
                self.metrics.queue_add(p.topic, QueueState::AckWait, n);
            }
            let entry = InFlight {
                correlation_id: self.correlation_id,
                version,
                parts,
            };
            if let Err(e) = to_acks.send(entry) {
                // The receiver ended: the connection is gone, and this request was written.
                let entry = e.into_inner();
                fail_in_flight(&self.to_router, self.metrics, self.id, entry);
                break SessionEnd::Lost;
            }
        };
        drop(to_acks);
        if matches!(end, SessionEnd::Lost) {
            let _ = conn.shutdown();
        }
        if acks.join().is_err() {
            log::error!("broker {}: receiver thread panicked", self.id);
        }
        self.shared.set_conn(None);
        end
    }

    /// The next batch to send: a carried one first, else one from the router's queue.
    fn next_queued(&mut self) -> Option<Batch> {
        self.carry.pop_front().or_else(|| {
            let b = self.from_router.try_recv().ok();
            if b.is_some() {
                self.taken(1);
            }
            b
        })
    }

    /// Takes more queued batches after `first` while they fit in one request.
    fn gather(&mut self, first: Batch, version: i16) -> Vec<Part> {
        let mut parts: Vec<Part> = Vec::new();
        // Sealed batches of partitions already in this request, in queue order: a later
        // request takes them (at most four per partition: the router keeps at most five
        // sealed batches of a partition unacknowledged).
        let mut deferred: Vec<Batch> = Vec::new();
        let mut data = 0usize;
        let mut next = Some(first);
        let overhead = entry_overhead(version);
        while let Some(mut b) = next.take() {
            if overhead > KAFKA_MSG_OVERHEAD {
                // MessageSet v1 entries are longer than the router sized them (Dory's 26
                // bytes, MessageSet v0's): keep a partition's set within message_max_bytes,
                // the rest going in the next request (never sealed: no idempotence here).
                let keep = fitting_prefix(
                    b.msgs.iter().map(|m| m.payload.len()),
                    overhead,
                    self.cfg.message_max_bytes,
                );
                if keep < b.msgs.len() {
                    let rest = b.msgs.split_off(keep);
                    self.carry
                        .push_front(Batch::new(b.topic, b.partition, rest));
                }
            }
            let bytes = b.payload_bytes();
            let kafka = b.msgs.len() * overhead + bytes;
            if !parts.is_empty() && data + bytes > self.cfg.request_data_limit {
                self.carry.push_front(b);
                break;
            }
            let at = self.part_index.get(&(b.topic, b.partition)).copied();
            match at.map(|i| &mut parts[i]) {
                Some(p) if p.seq.is_some() || b.seq.is_some() => {
                    // A sealed batch is a record batch of its own, and a partition has one
                    // record batch per request.
                    deferred.push(b);
                    next = self.next_queued();
                    continue;
                }
                Some(p) => {
                    if p.kafka_bytes + kafka + RECORD_BATCH_OVERHEAD > self.cfg.message_max_bytes {
                        // Would make the partition's record batch too large for the broker.
                        self.carry.push_front(b);
                        break;
                    }
                    p.kafka_bytes += kafka;
                    p.msgs.extend(b.msgs);
                }
                None => {
                    self.part_index.insert((b.topic, b.partition), parts.len());
                    parts.push(Part {
                        topic: b.topic,
                        name: self.metrics.topic_name(b.topic),
                        partition: b.partition,
                        msgs: b.msgs,
                        kafka_bytes: kafka,
                        seq: b.seq,
                    });
                }
            }
            data += bytes;
            if data >= self.cfg.request_data_limit {
                break;
            }
            next = self.next_queued();
        }
        for b in deferred.into_iter().rev() {
            self.carry.push_front(b);
        }
        self.part_index.clear();
        // Group by topic for the request layout (a topic's id stands for its name, and
        // compares faster). A partition appears once, so the order is total.
        parts.sort_unstable_by_key(|p| (p.topic, p.partition));
        parts
    }

    /// The compression for one partition's records: the topic's codec when the record set
    /// reaches its `min_size` (Σ key + value + 26, Dory's rule) and the broker can read it.
    fn compression_for(&self, p: &Part, version: i16) -> Compression {
        let c = self.cfg.policies.for_topic(&p.name).compression;
        let codec = match c.codec {
            CodecName::None => return Compression::NONE,
            CodecName::Gzip => Codec::Gzip,
            CodecName::Snappy => Codec::Snappy,
            CodecName::Lz4 => Codec::Lz4,
            CodecName::Zstd => Codec::Zstd,
        };
        if p.kafka_bytes < c.min_size {
            self.metrics.inc(Counter::MsgSetCompressionNo);
            return Compression::NONE;
        }
        if version < codec.min_produce_version() {
            self.metrics.inc(Counter::MsgSetZstdUnsupportedByBroker);
            if !self.zstd_warned.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "broker {}: topic [{}] is configured for {} but the broker speaks Produce v{version} (v{} needed); sending uncompressed",
                    self.id,
                    String::from_utf8_lossy(&p.name),
                    codec.name(),
                    codec.min_produce_version()
                );
            }
            return Compression::NONE;
        }
        Compression::new(codec, c.level).unwrap_or(Compression { codec, level: None })
    }

    fn encode(&mut self, parts: &[Part], version: i16) {
        let mut buf = std::mem::take(&mut self.buf);
        let mut scratch = std::mem::take(&mut self.scratch);
        self.encode_into(parts, version, &mut buf, &mut scratch);
        self.buf = buf;
        self.scratch = scratch;
    }

    fn encode_into(
        &mut self,
        parts: &[Part],
        version: i16,
        buf: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) {
        buf.clear();
        let topic_count = parts
            .iter()
            .enumerate()
            .filter(|(i, p)| *i == 0 || parts[i - 1].topic != p.topic)
            .count();
        let mut w = ProduceRequestWriter::begin(
            buf,
            version,
            self.correlation_id,
            self.cfg.client_id.as_deref(),
            self.cfg.acks,
            self.cfg.replication_timeout_ms,
            topic_count,
        );
        let mut i = 0;
        while i < parts.len() {
            let j = parts[i..]
                .iter()
                .position(|p| p.topic != parts[i].topic)
                .map_or(parts.len(), |k| i + k);
            w.begin_topic(buf, &parts[i].name, j - i);
            for p in &parts[i..j] {
                w.begin_partition(buf, p.partition);
                let base_ts = p.msgs.first().map_or(0, |m| m.timestamp);
                let compression = self.compression_for(p, version);
                if let Some(magic) = Magic::for_produce_version(version) {
                    // A broker of Kafka 0.10 or older: no producer identity to carry (such
                    // clusters offer no InitProducerId, so nothing is sealed).
                    let mut ms = MessageSetWriter::begin(magic, compression, scratch);
                    for m in &p.msgs {
                        let (k, v) = (m.key_len(), m.value_len());
                        let target = ms.records_buf(buf, scratch);
                        ms.append_parts(
                            target,
                            m.timestamp,
                            (k > 0).then_some(k),
                            |b| m.payload.copy_to(0, k, b),
                            Some(v),
                            |b| m.payload.copy_to(k, v, b),
                        );
                    }
                    let threshold = u32::from(self.cfg.policies.size_threshold_percent);
                    let outcome = ms.finish(buf, scratch, threshold);
                    self.count_compression(outcome);
                    w.end_partition(buf);
                    continue;
                }
                let mut rb = RecordBatchWriter::begin_with(buf, base_ts, compression, scratch);
                if let Some(s) = p.seq {
                    rb.set_producer(buf, s.producer_id, s.epoch, s.base);
                }
                for (i, m) in p.msgs.iter().enumerate() {
                    if let Some(ahead) = p.msgs.get(i + PREFETCH_AHEAD) {
                        ahead.payload.prefetch();
                    }
                    let k = m.key_len();
                    let v = m.value_len();
                    // An empty key goes out as a null key, as Dory does.
                    let key_len = (k > 0).then_some(k);
                    let target = rb.records_buf(buf, scratch);
                    rb.append_parts(
                        target,
                        m.timestamp,
                        key_len,
                        Some(v),
                        |b| m.payload.copy_to(0, k, b),
                        |b| m.payload.copy_to(k, v, b),
                    );
                }
                let threshold = u32::from(self.cfg.policies.size_threshold_percent);
                let outcome = rb.finish_compressed(buf, scratch, threshold);
                self.count_compression(outcome);
                w.end_partition(buf);
            }
            i = j;
        }
        w.finish(buf);
    }

    /// Counts how a batch or message set was compressed (Dory's counters).
    fn count_compression(&self, outcome: CompressionOutcome) {
        match outcome {
            CompressionOutcome::Uncompressed => {}
            CompressionOutcome::Compressed { .. } => {
                self.metrics.inc(Counter::MsgSetCompressionYes)
            }
            CompressionOutcome::NotCompressible { .. } => {
                self.metrics.inc(Counter::MsgSetNotCompressible)
            }
            CompressionOutcome::Error(e) => {
                self.metrics.inc(Counter::MsgSetCompressionError);
                log::error!(
                    "broker {}: compression failed, sent uncompressed: {e}",
                    self.id
                );
            }
        }
    }
}

/// Bytes each message adds to a partition's record set besides its key and value, as
/// counted against `message_max_bytes`: Dory's 26 (exact for MessageSet v0, more than a
/// RecordBatch record takes), or MessageSet v1's 34 (v0's plus the timestamp).
fn entry_overhead(produce_version: i16) -> usize {
    Magic::for_produce_version(produce_version).map_or(KAFKA_MSG_OVERHEAD, |m| {
        m.entry_overhead().max(KAFKA_MSG_OVERHEAD)
    })
}

/// How many of the leading messages (key + value sizes `sizes`) fit in one record set of
/// at most `limit` bytes at `overhead` bytes each plus the set's own header; at least one
/// (a message too large alone is the broker's to refuse, and counted then).
fn fitting_prefix(sizes: impl Iterator<Item = usize>, overhead: usize, limit: usize) -> usize {
    let mut total = RECORD_BATCH_OVERHEAD;
    let mut n = 0;
    for size in sizes {
        total += overhead + size;
        if total > limit && n > 0 {
            break;
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_overhead_by_produce_version() {
        assert_eq!(entry_overhead(0), 26);
        assert_eq!(entry_overhead(1), 26);
        assert_eq!(entry_overhead(2), 34);
        for v in 3..=8 {
            assert_eq!(entry_overhead(v), KAFKA_MSG_OVERHEAD);
        }
    }

    #[test]
    fn fitting_prefix_keeps_the_set_within_the_limit() {
        // 61 + 3 × (34 + 100) = 463.
        let sizes = [100usize; 10];
        assert_eq!(fitting_prefix(sizes.iter().copied(), 34, 463), 3);
        assert_eq!(fitting_prefix(sizes.iter().copied(), 34, 462), 2);
        assert_eq!(fitting_prefix(sizes.iter().copied(), 34, 10_000), 10);
        // The first message goes even when too large alone.
        assert_eq!(fitting_prefix([5_000usize, 1].into_iter(), 34, 1_000), 1);
        assert_eq!(fitting_prefix(std::iter::empty(), 34, 1_000), 0);
        // A batch the router sized at 26 bytes a message, re-counted at 34: split.
        let limit = RECORD_BATCH_OVERHEAD + 10 * (26 + 100);
        assert_eq!(fitting_prefix(sizes.iter().copied(), 26, limit), 10);
        assert!(fitting_prefix(sizes.iter().copied(), 34, limit) < 10);
    }
}
