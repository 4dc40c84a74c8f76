//! One dispatcher per broker: owns the connection, packs batches into Produce requests,
//! pipelines them, and settles each partition's outcome.
//!
//! A dispatcher is two threads sharing one connection, because blocking I/O cannot wait
//! on a socket and a channel at once: the *sender* (`dispatcher-<id>`) connects, takes
//! batches from the router, encodes and writes requests; the *receiver*
//! (`dispatcher-<id>-acks`, one per connection) reads responses in order. The sender hands
//! each written request to the receiver through a bounded channel, which bounds the
//! requests in flight. Delivered and discarded messages are counted here; whatever must be
//! sent again goes back to the router with the reason.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select_biased, Receiver, Sender, TrySendError};

use crate::config::policy::{CodecName, Policies};
use crate::config::Config;
use crate::deliver::backoff::Backoff;
use crate::kafka::compression::{Codec, Compression};
use crate::kafka::connection::{ConnError, Connection};
use crate::kafka::errors::{classify, error_name, ErrorAction};
use crate::kafka::produce::{self, ProduceRequestWriter};
use crate::kafka::record_batch::{CompressionOutcome, RecordBatchWriter};
use crate::kafka::PRODUCE_VERSIONS;
use crate::pipeline::{Batch, Msg, Outcome, ReturnReason, DISPATCH_CHANNEL_CAP};
use crate::report::discards;
use crate::report::metrics::{Counter, DiscardReason, Metrics, QueueState, TopicId};
use crate::report::msg_debug::DebugFile;
use crate::route::batcher::{KAFKA_MSG_OVERHEAD, RECORD_BATCH_OVERHEAD};

/// Largest Produce response we accept (a response lists only partitions we sent).
const MAX_RESPONSE_SIZE: usize = 16 << 20;
/// While encoding a record, how many records ahead to prefetch payload bytes.
const PREFETCH_AHEAD: usize = 8;
/// Minimum interval between two log lines about the same broker's connection failures.
const CONNECT_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The dispatcher's slice of the configuration.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub client_id: Option<String>,
    pub acks: i16,
    pub replication_timeout_ms: i32,
    pub connect_timeout: Duration,
    pub socket_timeout: Duration,
    pub max_in_flight: usize,
    pub request_data_limit: usize,
    pub message_max_bytes: usize,
    pub max_failed_attempts: u32,
    pub reconnect_backoff: Duration,
    pub reconnect_backoff_max: Duration,
    pub policies: Policies,
}

impl DispatcherConfig {
    pub fn from_config(c: &Config) -> DispatcherConfig {
        DispatcherConfig {
            client_id: c.kafka.client_id.clone(),
            acks: c.kafka.acks,
            replication_timeout_ms: i32::try_from(c.kafka.replication_timeout.as_millis())
                .unwrap_or(i32::MAX),
            connect_timeout: c.kafka.connect_timeout,
            socket_timeout: c.kafka.socket_timeout,
            max_in_flight: c.kafka.max_in_flight_requests,
            request_data_limit: c.batching.produce_request_data_limit,
            message_max_bytes: c.batching.message_max_bytes,
            max_failed_attempts: c.delivery.max_failed_delivery_attempts,
            reconnect_backoff: c.delivery.retry_backoff,
            reconnect_backoff_max: c.delivery.retry_backoff_max,
            policies: c.policies.clone(),
        }
    }
}

/// What the router and the dispatcher threads share: the abort switch and the live
/// connection, so an abort can cut a blocked read or write at once.
#[derive(Default)]
struct Shared {
    abort: AtomicBool,
    conn: Mutex<Option<Connection>>,
}

impl Shared {
    fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        if let Ok(guard) = self.conn.lock() {
            if let Some(c) = guard.as_ref() {
                let _ = c.shutdown();
            }
        }
    }
    fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }
    fn set_conn(&self, c: Option<Connection>) {
        if let Ok(mut guard) = self.conn.lock() {
            *guard = c;
        }
    }
}

/// The router's end of a dispatcher.
pub struct DispatcherHandle {
    pub host: String,
    pub port: u16,
    tx: Sender<Batch>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A dispatcher whose queue is closed: it finishes what it holds, then stops.
pub struct ClosingDispatcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl DispatcherHandle {
    pub fn try_send(&self, b: Batch) -> Result<(), TrySendError<Batch>> {
        self.tx.try_send(b)
    }

    /// Closes the queue; the dispatcher sends what it holds and stops.
    pub fn close(self) -> ClosingDispatcher {
        let DispatcherHandle { shared, thread, .. } = self;
        ClosingDispatcher { shared, thread }
    }

    /// Closes the queue and lets the threads end on their own.
    pub fn detach(self) {
        drop(self.close());
    }
}

impl ClosingDispatcher {
    /// Cuts the connection: whatever is unacknowledged comes back to the router.
    pub fn abort(&self) {
        self.shared.abort();
    }
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("a dispatcher thread panicked");
            }
        }
    }
}

/// Starts the dispatcher for broker `id` at `host:port`.
pub fn spawn(
    id: i32,
    host: String,
    port: u16,
    cfg: Arc<DispatcherConfig>,
    metrics: &'static Metrics,
    to_router: Sender<Outcome>,
) -> DispatcherHandle {
    let (tx, rx) = bounded(DISPATCH_CHANNEL_CAP);
    let shared = Arc::new(Shared::default());
    let sender = Sender_ {
        id,
        host: host.clone(),
        port,
        cfg,
        metrics,
        from_router: rx,
        to_router,
        shared: shared.clone(),
        carry: VecDeque::new(),
        correlation_id: 0,
        buf: Vec::new(),
        scratch: Vec::new(),
        zstd_warned: AtomicBool::new(false),
    };
    let thread = std::thread::Builder::new()
        .name(format!("dispatcher-{id}"))
        .spawn(move || sender.run())
        .map_err(|e| log::error!("cannot start dispatcher thread for broker {id}: {e}"))
        .ok();
    DispatcherHandle {
        host,
        port,
        tx,
        shared,
        thread,
    }
}

/// Messages for one partition within one request.
struct Part {
    topic: TopicId,
    name: Arc<[u8]>,
    partition: i32,
    msgs: Vec<Msg>,
    kafka_bytes: usize,
}

/// A request written to the broker, waiting for its response.
struct InFlight {
    correlation_id: i32,
    version: i16,
    parts: Vec<Part>,
}

enum SessionEnd {
    /// The router closed the queue: stop.
    Closed,
    /// The connection failed: reconnect.
    Lost,
}

/// The sender thread's state (named with a trailing underscore to keep `Sender` for the
/// channel type).
struct Sender_ {
    id: i32,
    host: String,
    port: u16,
    cfg: Arc<DispatcherConfig>,
    metrics: &'static Metrics,
    from_router: Receiver<Batch>,
    to_router: Sender<Outcome>,
    shared: Arc<Shared>,
    /// Batches taken from the queue but not yet sent.
    carry: VecDeque<Batch>,
    correlation_id: i32,
    buf: Vec<u8>,
    /// Uncompressed records of a batch being compressed.
    scratch: Vec<u8>,
    zstd_warned: AtomicBool,
}

/// Routes a set of batches back to the router (their messages are in the SendWait state).
fn give_back(to_router: &Sender<Outcome>, broker: i32, reason: ReturnReason, batches: Vec<Batch>) {
    if batches.is_empty() {
        return;
    }
    let n = batches.len();
    if to_router
        .send(Outcome::Returned {
            broker,
            reason,
            batches,
        })
        .is_err()
    {
        // The router is gone only at the very end of shutdown, after it stopped waiting
        // for us; the messages are dropped with the process. Log them so the loss shows.
        log::error!("router gone; {n} batch(es) not returned");
    }
}

impl Sender_ {
    fn run(mut self) {
        let mut backoff = Backoff::new(self.cfg.reconnect_backoff, self.cfg.reconnect_backoff_max);
        let mut down_since: Option<Instant> = None;
        let mut last_log: Option<Instant> = None;
        loop {
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
                            let carry: Vec<Batch> = self.carry.drain(..).collect();
                            give_back(
                                &self.to_router,
                                self.id,
                                ReturnReason::ConnectionLost,
                                carry,
                            );
                        }
                    }
                }
                Err(e) => {
                    if last_log.is_none_or(|t| t.elapsed() >= CONNECT_LOG_INTERVAL) {
                        log::warn!(
                            "broker {} ({}:{}): cannot connect: {e}",
                            self.id,
                            self.host,
                            self.port
                        );
                        last_log = Some(Instant::now());
                    }
                    if down_since.is_none() {
                        down_since = Some(Instant::now());
                        self.report(Outcome::Connection {
                            broker: self.id,
                            up: false,
                        });
                    }
                    let carry: Vec<Batch> = self.carry.drain(..).collect();
                    give_back(
                        &self.to_router,
                        self.id,
                        ReturnReason::ConnectionLost,
                        carry,
                    );
                    // Wait out the backoff, handing back anything routed to us meanwhile.
                    let until = Instant::now() + backoff.next_delay();
                    loop {
                        if self.shared.aborted() {
                            break;
                        }
                        match self.from_router.recv_deadline(until) {
                            Ok(b) => {
                                self.taken(1);
                                give_back(
                                    &self.to_router,
                                    self.id,
                                    ReturnReason::ConnectionLost,
                                    vec![b],
                                );
                            }
                            Err(crossbeam_channel::RecvTimeoutError::Timeout) => break,
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
        let mut conn = Connection::connect(&self.host, self.port, self.cfg.connect_timeout)
            .inspect_err(|_| self.metrics.inc(Counter::ConnectorConnectFail))?;
        self.metrics.inc(Counter::ConnectorConnectSuccess);
        conn.set_timeouts(Some(self.cfg.socket_timeout), Some(self.cfg.socket_timeout))?;
        let neg = conn.handshake(self.cfg.client_id.as_deref(), self.cfg.socket_timeout)?;
        let version = crate::kafka::negotiate(
            PRODUCE_VERSIONS,
            neg.api_versions.get(crate::kafka::API_KEY_PRODUCE),
        )
        .ok_or_else(|| {
            ConnError::Io(std::io::Error::other(format!(
                "broker supports no Produce version in {}..={} (Kafka 0.11 or later is required)",
                PRODUCE_VERSIONS.min, PRODUCE_VERSIONS.max
            )))
        })?;
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
                    }
                }
            };
            if dead_rx.try_recv().is_ok() {
                self.carry.push_front(first);
                break SessionEnd::Lost;
            }
            let parts = self.gather(first);
            self.correlation_id = self.correlation_id.wrapping_add(1);
            self.encode(&parts, version);
            if let Err(e) = conn.send(&self.buf) {
                log::warn!("broker {}: write failed: {e}", self.id);
                // Not fully written, so not received: send again elsewhere, no duplicate.
                for p in parts.into_iter().rev() {
                    self.carry.push_front(Batch {
                        topic: p.topic,
                        partition: p.partition,
                        msgs: p.msgs,
                    });
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

    /// Takes more queued batches after `first` while they fit in one request.
    fn gather(&mut self, first: Batch) -> Vec<Part> {
        let mut parts: Vec<Part> = Vec::new();
        let mut data = 0usize;
        let mut next = Some(first);
        while let Some(b) = next.take() {
            let bytes = b.payload_bytes();
            let kafka = b.msgs.len() * KAFKA_MSG_OVERHEAD + bytes;
            if !parts.is_empty() && data + bytes > self.cfg.request_data_limit {
                self.carry.push_front(b);
                break;
            }
            match parts
                .iter_mut()
                .find(|p| p.topic == b.topic && p.partition == b.partition)
            {
                Some(p) => {
                    if p.kafka_bytes + kafka + RECORD_BATCH_OVERHEAD > self.cfg.message_max_bytes {
                        // Would make the partition's record batch too large for the broker.
                        self.carry.push_front(b);
                        break;
                    }
                    p.kafka_bytes += kafka;
                    p.msgs.extend(b.msgs);
                }
                None => parts.push(Part {
                    topic: b.topic,
                    name: self.metrics.topic_name(b.topic),
                    partition: b.partition,
                    msgs: b.msgs,
                    kafka_bytes: kafka,
                }),
            }
            data += bytes;
            if data >= self.cfg.request_data_limit {
                break;
            }
            next = self.carry.pop_front().or_else(|| {
                let b = self.from_router.try_recv().ok();
                if b.is_some() {
                    self.taken(1);
                }
                b
            });
        }
        // Group by topic for the request layout.
        parts.sort_by(|a, b| a.name.cmp(&b.name).then(a.partition.cmp(&b.partition)));
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
            .filter(|(i, p)| *i == 0 || parts[i - 1].name != p.name)
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
                .position(|p| p.name != parts[i].name)
                .map_or(parts.len(), |k| i + k);
            w.begin_topic(buf, &parts[i].name, j - i);
            for p in &parts[i..j] {
                w.begin_partition(buf, p.partition);
                let base_ts = p.msgs.first().map_or(0, |m| m.timestamp);
                let compression = self.compression_for(p, version);
                let mut rb = RecordBatchWriter::begin_with(buf, base_ts, compression, scratch);
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
                match rb.finish_compressed(buf, scratch, threshold) {
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
                w.end_partition(buf);
            }
            i = j;
        }
        w.finish(buf);
    }
}

/// A request whose fate is unknown (written, connection lost before the answer): its
/// messages go back for rerouting, flagged as possible duplicates.
fn fail_in_flight(to_router: &Sender<Outcome>, metrics: &Metrics, broker: i32, entry: InFlight) {
    let batches: Vec<Batch> = entry
        .parts
        .into_iter()
        .map(|mut p| {
            let n = p.msgs.len() as i64;
            metrics.queue_add(p.topic, QueueState::AckWait, -n);
            metrics.queue_add(p.topic, QueueState::SendWait, n);
            for m in &mut p.msgs {
                m.maybe_sent = true;
            }
            Batch {
                topic: p.topic,
                partition: p.partition,
                msgs: p.msgs,
            }
        })
        .collect();
    give_back(to_router, broker, ReturnReason::ConnectionLost, batches);
}

/// The receiver thread: reads responses for one connection, in order.
struct Receiver_ {
    id: i32,
    conn: Connection,
    cfg: Arc<DispatcherConfig>,
    metrics: &'static Metrics,
    to_router: Sender<Outcome>,
}

#[derive(Debug, thiserror::Error)]
enum ResponseError {
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("cannot decode produce response: {0}")]
    Decode(#[from] crate::kafka::DecodeError),
    #[error("correlation id {got} does not match the request's {expected}")]
    Correlation { expected: i32, got: i32 },
    #[error("response does not answer topic [{topic}] partition {partition}")]
    Missing { topic: String, partition: i32 },
}

impl Receiver_ {
    fn run(mut self, from_sender: Receiver<InFlight>, dead: Sender<()>) {
        let mut frame = Vec::new();
        while let Ok(entry) = from_sender.recv() {
            match self.read_response(&entry, &mut frame) {
                Ok(resp) => self.settle(entry, &resp),
                Err(e) => {
                    log::warn!("broker {}: connection lost: {e}", self.id);
                    self.metrics.inc(match &e {
                        ResponseError::Conn(ConnError::Io(io))
                            if matches!(
                                io.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            Counter::ConnectorSocketTimeout
                        }
                        ResponseError::Conn(ConnError::Io(_)) => Counter::ConnectorSocketError,
                        ResponseError::Correlation { .. } => Counter::CorrelationIdMismatch,
                        _ => Counter::BadProduceResponse,
                    });
                    let _ = self.conn.shutdown();
                    let _ = dead.try_send(());
                    fail_in_flight(&self.to_router, self.metrics, self.id, entry);
                    // The sender stops writing once it sees `dead`; what it already wrote
                    // is in doubt too.
                    while let Ok(entry) = from_sender.recv() {
                        fail_in_flight(&self.to_router, self.metrics, self.id, entry);
                    }
                    return;
                }
            }
        }
    }

    fn read_response(
        &mut self,
        entry: &InFlight,
        frame: &mut Vec<u8>,
    ) -> Result<produce::ProduceResponse, ResponseError> {
        self.conn.recv_frame(frame, MAX_RESPONSE_SIZE)?;
        let resp = produce::decode_response(frame, entry.version)?;
        if resp.correlation_id != entry.correlation_id {
            return Err(ResponseError::Correlation {
                expected: entry.correlation_id,
                got: resp.correlation_id,
            });
        }
        for p in &entry.parts {
            let answered = resp.topics.iter().any(|t| {
                t.name.as_slice() == &p.name[..]
                    && t.partitions.iter().any(|q| q.partition == p.partition)
            });
            if !answered {
                return Err(ResponseError::Missing {
                    topic: String::from_utf8_lossy(&p.name).into_owned(),
                    partition: p.partition,
                });
            }
        }
        Ok(resp)
    }

    /// Applies each partition's error code to its messages.
    fn settle(&mut self, entry: InFlight, resp: &produce::ProduceResponse) {
        let mut retry = Vec::new();
        let mut backoff = Vec::new();
        let mut reroute = Vec::new();
        for p in entry.parts {
            let code = resp
                .topics
                .iter()
                .filter(|t| t.name.as_slice() == &p.name[..])
                .flat_map(|t| t.partitions.iter())
                .find(|q| q.partition == p.partition)
                .map_or(-1, |q| q.error_code);
            let n = p.msgs.len() as u64;
            self.metrics
                .queue_add(p.topic, QueueState::AckWait, -(n as i64));
            self.metrics.inc(Counter::for_ack_error(code));
            if code == 0 {
                debug_log(self.metrics, DebugFile::GotAck, &p.name, &p.msgs);
                self.metrics.delivered(p.topic, n);
                self.metrics.add(Counter::MsgDestroy, n);
                crate::pipeline::free_msgs(p.msgs);
                continue;
            }
            let action = classify(code);
            if action == ErrorAction::Discard {
                log::error!(
                    "broker {}: discarding {n} message(s) of topic [{}] partition {}: {} ({code})",
                    self.id,
                    String::from_utf8_lossy(&p.name),
                    p.partition,
                    error_name(code)
                );
                discards::discard(self.metrics, p.msgs, DiscardReason::KafkaError);
                continue;
            }
            // A failed attempt: count it; past the limit the message is discarded.
            let (keep, over): (Vec<Msg>, Vec<Msg>) = p
                .msgs
                .into_iter()
                .partition_map_attempts(self.cfg.max_failed_attempts);
            if !over.is_empty() {
                log::error!(
                    "broker {}: discarding {} message(s) of topic [{}] after {} failed attempts (last error {})",
                    self.id,
                    over.len(),
                    String::from_utf8_lossy(&p.name),
                    self.cfg.max_failed_attempts + 1,
                    error_name(code)
                );
                discards::discard(self.metrics, over, DiscardReason::AttemptLimit);
            }
            if keep.is_empty() {
                continue;
            }
            self.metrics
                .queue_add(p.topic, QueueState::SendWait, keep.len() as i64);
            let batch = Batch {
                topic: p.topic,
                partition: p.partition,
                msgs: keep,
            };
            match action {
                ErrorAction::Retry => retry.push(batch),
                ErrorAction::Backoff => backoff.push(batch),
                _ => reroute.push(batch),
            }
            log::warn!(
                "broker {}: topic [{}] partition {}: {} ({code}); sending again",
                self.id,
                String::from_utf8_lossy(&p.name),
                p.partition,
                error_name(code)
            );
        }
        give_back(&self.to_router, self.id, ReturnReason::Retry, retry);
        give_back(&self.to_router, self.id, ReturnReason::Backoff, backoff);
        give_back(&self.to_router, self.id, ReturnReason::Reroute, reroute);
    }
}

/// Writes the messages to a message debug file, if debug logging is on for the topic.
fn debug_log(metrics: &Metrics, file: DebugFile, topic: &[u8], msgs: &[Msg]) {
    let Some(d) = metrics.msg_debug().filter(|d| d.active()) else {
        return;
    };
    if !d.enabled_for(topic) {
        return;
    }
    let (mut key, mut value) = (Vec::new(), Vec::new());
    for m in msgs {
        key.clear();
        value.clear();
        m.payload.copy_to(0, m.key_len(), &mut key);
        m.payload.copy_to(m.key_len(), m.value_len(), &mut value);
        d.log(file, m.timestamp, topic, &key, &value);
    }
}

/// Counts one more failed attempt on each message and splits off those past the limit.
trait PartitionAttempts {
    fn partition_map_attempts(self, max_failed: u32) -> (Vec<Msg>, Vec<Msg>);
}

impl<I: Iterator<Item = Msg>> PartitionAttempts for I {
    fn partition_map_attempts(self, max_failed: u32) -> (Vec<Msg>, Vec<Msg>) {
        let mut keep = Vec::new();
        let mut over = Vec::new();
        for mut m in self {
            m.failed_attempts += 1;
            if m.failed_attempts > max_failed {
                over.push(m);
            } else {
                keep.push(m);
            }
        }
        (keep, over)
    }
}
