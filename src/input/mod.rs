//! Inputs: the sockets clients write to. One thread per socket (and one per stream
//! connection); each decodes Dory's client format, counts every message it receives,
//! copies accepted ones into the pool and hands them to the router in batches.
//!
//! Channels: writes `Vec<Msg>` batches to the router and takes emptied ones back for reuse
//! (types and capacities in [`crate::pipeline`]); reads a stop flag from the supervisor.
//!
//! Imports: settings, the pipeline types, the pool, [`crate::fasthash`],
//! [`crate::report`] (counting what it receives and discards), [`crate::spool`] (spooled
//! topics are written before they are handed on) and [`crate::route`]'s `SharedRouter`
//! (an input routes its own batches while the router is idle). Never [`crate::kafka`] or
//! [`crate::deliver`]: an input knows nothing of Kafka. [`wire`] (the
//! client format) is also used by `dory send` and the fuzz targets.

pub mod datagram;
pub mod stream;
pub mod topic_cache;
mod unstack;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::report::discard_log::{DiscardInfo, DiscardKind};

use crossbeam_channel::{Receiver, Sender};

use crate::pipeline::{Msg, SpoolRef, TopicId, INPUT_BATCH_MAX, NO_TOPIC};
use crate::pool::{Lease, Pool};
use crate::report::commit_points::tracking_key;
use crate::report::metrics::{now_ms, Counter, DiscardReason, Metrics, QueueState};
use crate::route::SharedRouter;
use crate::spool::format::{encode_record, RecordRef};
use crate::spool::Spool;
use wire::{ClientMsg, Kind, WireError};

/// How often blocked input threads look at the stop flag.
pub const STOP_POLL: Duration = Duration::from_millis(100);

/// Errors opening an input: fatal at start-up, naming the socket.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot remove stale socket file {path}: {source}")]
    Unlink {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot bind {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot set mode {mode:o} on {path}: {source}")]
    Chmod {
        path: PathBuf,
        mode: u32,
        source: std::io::Error,
    },
    #[error(
        "input.max_datagram_msg_size = {size}: the kernel refuses datagrams that large ({reason})"
    )]
    DatagramSize { size: usize, reason: String },
    #[error("cannot start input thread: {0}")]
    Thread(std::io::Error),
}

/// Which input a message came through, for counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Datagram,
    UnixStream,
    Tcp,
    /// Replayed from the spool at start.
    Spool,
}

/// What every input needs: where messages go and how they are counted. Each input
/// thread has its own clone.
#[derive(Clone)]
pub struct InputCtx {
    pub metrics: &'static Metrics,
    pub pool: &'static Pool,
    pub to_router: Sender<Vec<Msg>>,
    /// The router's shared state: batches are routed on the input's thread when the
    /// router is idle (see [`SharedRouter`]); `None`: always through `to_router`.
    pub router: Option<Arc<SharedRouter>>,
    /// Emptied batches the router gave back, reused before allocating new ones.
    pub spare_batches: Receiver<Vec<Msg>>,
    pub stop: Arc<AtomicBool>,
    /// Topic ids this thread has looked up (and whether each is spooled), sparing the
    /// shared topic table's lock. Only names the table gave an id are kept, so it holds at
    /// most `input.max_topics` + 1 names: a client inventing names fills the table, not
    /// this. It must hold them all: with more topics in use than it holds, clients sending
    /// to each in turn would miss it every time. It checks the last topic found first:
    /// clients mostly send runs of one topic, and comparing a name costs less than hashing
    /// it.
    pub topic_cache: std::cell::RefCell<topic_cache::TopicCache>,
    /// Reused for grouping each batch by topic in `flush`.
    pub groups: std::cell::RefCell<crate::pipeline::TopicGroups>,
    /// Arrival time for the messages being accepted, when the input read them together
    /// (one clock read per batch); `None`: read the clock per message.
    pub batch_clock: std::cell::Cell<Option<Instant>>,
    /// Counters for the batch being collected, added to the metrics in `flush`.
    pub counts: std::cell::RefCell<PendingCounts>,
    /// The durable spool, when any topic is spooled.
    pub spool: Option<&'static Spool>,
    /// The spooled messages of the batch being collected, encoded as they are accepted.
    pub spool_batch: std::cell::RefCell<SpoolBatch>,
    /// Scratch for [`InputCtx::accept_many`].
    pub leases: std::cell::RefCell<LeaseScratch>,
}

/// Most messages [`InputCtx::accept_many`] allocates for under one pool lock (a
/// `recvmmsg` batch: see `datagram::RECV_BATCH`).
pub const ACCEPT_CHUNK: usize = 32;

/// A decoded message with its topic id, waiting for its pool blocks.
#[derive(Clone, Copy)]
struct Admitted<'a> {
    msg: ClientMsg<'a>,
    topic: TopicId,
    spooled: bool,
}

impl Admitted<'_> {
    fn payload_len(&self) -> usize {
        self.msg.key.len() + self.msg.value.len()
    }
}

/// Leases allocated for the messages being taken ([`InputCtx::accept_many`]), reused.
#[derive(Default)]
pub struct LeaseScratch(Vec<Option<Lease>>);

impl Clone for LeaseScratch {
    /// Each input thread starts with an empty one of its own.
    fn clone(&self) -> Self {
        LeaseScratch::default()
    }
}

/// Spool records of the batch being collected; buffers reused from batch to batch.
#[derive(Debug, Default)]
pub struct SpoolBatch {
    bytes: Vec<u8>,
    /// Index in the batch of each record's message, in record order.
    msg_idx: Vec<usize>,
    keys: Vec<(TopicId, i64)>,
    holds: Vec<SpoolRef>,
}

impl Clone for SpoolBatch {
    /// Each input thread starts with empty buffers of its own.
    fn clone(&self) -> Self {
        SpoolBatch::default()
    }
}

/// Per-batch counts, so the shared counters are touched once per batch.
#[derive(Debug, Default, Clone)]
pub struct PendingCounts {
    any_partition: u64,
    partition_key: u64,
    source: Option<Source>,
}

impl InputCtx {
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Decodes one client message and, if valid and there is pool room, appends it to
    /// `out`. Every outcome is counted: received, and either queued or discarded.
    pub fn accept(&self, bytes: &[u8], source: Source, out: &mut Vec<Msg>) {
        match wire::parse(bytes) {
            Ok(msg) => {
                if let Some(a) = self.admit(msg, source) {
                    let lease = self.pool.alloc(a.payload_len());
                    self.take(a, lease, out);
                }
            }
            Err(e) => self.reject(e, bytes),
        }
    }

    /// [`InputCtx::accept`] for several messages read together (one `recvmmsg`): the pool
    /// blocks for up to [`ACCEPT_CHUNK`] of them are taken under one lock
    /// ([`Pool::alloc_each`]), with the same outcome as one at a time.
    pub fn accept_many<'a>(
        &self,
        messages: impl IntoIterator<Item = &'a [u8]>,
        source: Source,
        out: &mut Vec<Msg>,
    ) {
        let mut admitted = [None::<Admitted<'a>>; ACCEPT_CHUNK];
        let mut n = 0;
        for bytes in messages {
            match wire::parse(bytes) {
                Ok(msg) => {
                    if let Some(a) = self.admit(msg, source) {
                        admitted[n] = Some(a);
                        n += 1;
                        if n == ACCEPT_CHUNK {
                            self.take_all(&admitted, out);
                            n = 0;
                        }
                    }
                }
                Err(e) => self.reject(e, bytes),
            }
        }
        self.take_all(&admitted[..n], out);
    }

    /// Allocates for `admitted` with one pool lock, then takes each in order.
    fn take_all(&self, admitted: &[Option<Admitted<'_>>], out: &mut Vec<Msg>) {
        if admitted.is_empty() {
            return;
        }
        let admitted = admitted.iter().flatten();
        let mut leases = self.leases.borrow_mut();
        leases.0.clear();
        self.pool
            .alloc_each(admitted.clone().map(Admitted::payload_len), &mut leases.0);
        // Start bringing every first block into cache before the first copy: they come
        // from memory (the pool hands out the blocks freed longest ago).
        for lease in leases.0.iter().flatten() {
            lease.prefetch();
        }
        // And each topic's counters, written when the batch is counted in (`flush`): with
        // thousands of topics they are cold.
        for a in admitted.clone() {
            self.metrics.prefetch_topic(a.topic);
        }
        for (i, &a) in admitted.enumerate() {
            let lease = leases.0[i].take();
            self.take(a, lease, out);
        }
    }

    /// Counts a message that failed to decode and discards it.
    fn reject(&self, e: WireError, bytes: &[u8]) {
        let m = self.metrics;
        m.received(NO_TOPIC, 1);
        if let Some(log) = m.discard_log() {
            let info = match e {
                WireError::Malformed(_) => DiscardInfo::Malformed,
                WireError::UnsupportedApiKey(k) => DiscardInfo::ApiKey(k),
                WireError::UnsupportedVersion { version, .. } => DiscardInfo::Version(version),
            };
            log.log_input(SystemTime::now(), info, bytes);
        }
        match e {
            WireError::Malformed(_) => {
                m.inc(Counter::InputAgentDiscardMsgMalformed);
                m.input_discard(DiscardReason::Malformed, bytes);
            }
            WireError::UnsupportedApiKey(_) => {
                m.inc(Counter::InputAgentDiscardMsgUnsupportedApiKey);
                m.input_discard(DiscardReason::UnsupportedApiKey, bytes);
            }
            WireError::UnsupportedVersion { api_key, version } => {
                m.inc(if api_key == wire::API_KEY_PARTITION_KEY {
                    Counter::InputAgentDiscardPartitionKeyMsgUnsupportedApiVersion
                } else {
                    Counter::InputAgentDiscardAnyPartitionMsgUnsupportedApiVersion
                });
                m.unsupported_version(version, bytes);
            }
        }
    }

    /// Counts a decoded message and finds its topic id; `None` if it was discarded (the
    /// topic table is full).
    fn admit<'a>(&self, msg: ClientMsg<'a>, source: Source) -> Option<Admitted<'a>> {
        {
            let mut c = self.counts.borrow_mut();
            match msg.kind {
                Kind::AnyPartition => c.any_partition += 1,
                Kind::PartitionKey(_) => c.partition_key += 1,
            }
            // Counted as forwarded in `flush` if it gets there.
            c.source = Some(source);
        }
        let Some((topic, spooled)) = self.topic(msg.topic) else {
            self.topic_table_full(msg.timestamp);
            return None;
        };
        Some(Admitted {
            msg,
            topic,
            spooled,
        })
    }

    /// Copies an admitted message into its pool blocks and appends it to `out`; counted
    /// and discarded if the pool had no room (`lease` is `None`).
    fn take(&self, a: Admitted<'_>, lease: Option<Lease>, out: &mut Vec<Msg>) {
        let m = self.metrics;
        let Admitted {
            msg,
            topic,
            spooled,
        } = a;
        let Some(mut payload) = lease else {
            m.received(topic, 1);
            if let Some(log) = m.discard_log() {
                let kind = DiscardKind::Discard(DiscardInfo::NoMem);
                log.log(
                    SystemTime::now(),
                    msg.timestamp,
                    kind,
                    msg.topic,
                    msg.key,
                    msg.value,
                );
            }
            m.inc(Counter::InputAgentDiscardMsgNoMem);
            m.discarded(
                topic,
                DiscardReason::NoMemory,
                1,
                msg.timestamp,
                msg.timestamp,
            );
            return;
        };
        payload.write_at(0, msg.key);
        payload.write_at(msg.key.len(), msg.value);
        let partition_key = match msg.kind {
            Kind::AnyPartition => None,
            Kind::PartitionKey(k) => Some(k),
        };
        if spooled {
            let rec = RecordRef {
                partition_key,
                timestamp: msg.timestamp,
                topic: msg.topic,
                key: msg.key,
                value: msg.value,
            };
            let mut sb = self.spool_batch.borrow_mut();
            if !encode_record(&rec, &mut sb.bytes) {
                // Cannot happen within the configured message sizes; counted if it does.
                drop(sb);
                m.received(topic, 1);
                m.discarded(
                    topic,
                    DiscardReason::SpoolFull,
                    1,
                    msg.timestamp,
                    msg.timestamp,
                );
                return;
            }
            sb.msg_idx.push(out.len());
        }
        // Received, MsgCreate and forwarded (and New, for a batch that waits in the
        // router's queue) are counted for the batch in `flush`, before the router can see
        // (and settle) any of these messages.
        out.push(Msg {
            topic,
            partition_key,
            timestamp: msg.timestamp,
            arrival: self.batch_clock.get().unwrap_or_else(Instant::now),
            // Set for the whole batch in `flush`, with the batch's receipt time.
            commit_key: msg.timestamp,
            payload,
            key_len: u32::try_from(msg.key.len())
                .expect("a key fits in a client message, so in u32"),
            failed_attempts: 0,
            maybe_sent: false,
            spool: None,
        });
    }

    /// A message whose topic has no id because the topic table is full (a client inventing
    /// topic names): received and discarded as `bad_topic` under topic "".
    fn topic_table_full(&self, timestamp: i64) {
        self.metrics.received(NO_TOPIC, 1);
        self.metrics
            .discarded(NO_TOPIC, DiscardReason::BadTopic, 1, timestamp, timestamp);
    }

    /// The topic's id and whether it is spooled; `None` when the topic table is full.
    #[inline]
    fn topic(&self, name: &[u8]) -> Option<(TopicId, bool)> {
        if let Some(hit) = self.topic_cache.borrow_mut().get(name) {
            return Some(hit);
        }
        self.topic_uncached(name)
    }

    #[cold]
    fn topic_uncached(&self, name: &[u8]) -> Option<(TopicId, bool)> {
        let id = self.metrics.topic_id(name)?;
        let spooled = id != NO_TOPIC && self.spool.is_some_and(|s| s.spooled(name));
        if spooled {
            self.metrics.set_spooled(id);
        }
        let mut cache = self.topic_cache.borrow_mut();
        if cache.len() > self.metrics.max_topics() {
            // Cannot happen (every cached name has its own id); bounded all the same.
            cache.clear();
        }
        cache.insert(name, id, spooled);
        Some((id, spooled))
    }

    /// Takes one message replayed from the spool (at start, before the inputs open): like
    /// an accepted one, but it already has its place in the spool (`hold`), and it waits
    /// for pool space instead of being discarded (the router is running and frees it).
    pub fn replay(&self, rec: RecordRef<'_>, hold: SpoolRef, out: &mut Vec<Msg>) {
        let m = self.metrics;
        let Some((topic, _)) = self.topic(rec.topic) else {
            self.topic_table_full(rec.timestamp);
            return;
        };
        let len = rec.key.len() + rec.value.len();
        let Some(mut payload) = self.alloc_waiting(len, out) else {
            m.received(topic, 1);
            m.inc(Counter::InputAgentDiscardMsgNoMem);
            m.discarded(
                topic,
                DiscardReason::NoMemory,
                1,
                rec.timestamp,
                rec.timestamp,
            );
            return;
        };
        payload.write_at(0, rec.key);
        payload.write_at(rec.key.len(), rec.value);
        self.counts.borrow_mut().source = Some(Source::Spool);
        out.push(Msg {
            topic,
            partition_key: rec.partition_key,
            timestamp: rec.timestamp,
            arrival: Instant::now(),
            commit_key: rec.timestamp,
            payload,
            key_len: u32::try_from(rec.key.len()).unwrap_or(u32::MAX),
            failed_attempts: 0,
            maybe_sent: false,
            spool: Some(hold),
        });
    }

    /// Pool space for a replayed message: hands on what is collected and waits while the
    /// pool is full. `None` only if the message is larger than the whole pool.
    fn alloc_waiting(&self, len: usize, out: &mut Vec<Msg>) -> Option<Lease> {
        if len > self.pool.capacity_bytes() {
            return None;
        }
        let mut logged = false;
        loop {
            if let Some(p) = self.pool.alloc(len) {
                return Some(p);
            }
            if !out.is_empty() {
                self.flush(out);
                continue;
            }
            if !logged {
                log::info!("spool recovery: message pool full; waiting for deliveries");
                logged = true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Appends the batch's spooled messages to the spool and gives each its hold; those
    /// the spool could not take are counted and discarded as `spool_full`. With
    /// `fsync_interval_ms = 0`, returns only once they are on disk.
    fn spool_out(&self, out: &mut Vec<Msg>) {
        let Some(spool) = self.spool else { return };
        let mut sb = self.spool_batch.borrow_mut();
        if sb.msg_idx.is_empty() {
            return;
        }
        let SpoolBatch {
            bytes,
            msg_idx,
            keys,
            holds,
        } = &mut *sb;
        keys.clear();
        keys.extend(msg_idx.iter().map(|&i| (out[i].topic, out[i].commit_key)));
        let done = spool.append(bytes, keys, holds);
        for (hold, &i) in holds.drain(..).zip(msg_idx.iter()) {
            out[i].spool = Some(hold);
        }
        if done.written < msg_idx.len() {
            let failed = take_indices(out, &msg_idx[done.written..]);
            let m = self.metrics;
            for msg in &failed {
                m.received(msg.topic, 1);
            }
            m.add(Counter::MsgCreate, failed.len() as u64);
            crate::report::discards::discard(m, failed, DiscardReason::SpoolFull);
        }
        if done.written > 0 && spool.sync_each_batch() {
            spool.sync_to(done.seq);
        }
        bytes.clear();
        msg_idx.clear();
    }

    /// Hands a batch to the router (blocking while its queue is full: backpressure),
    /// counting it first.
    ///
    /// An input reading many messages at once stamps them with one clock read
    /// (`batch_clock`). Handing a batch on can take long (the router's channel full, the
    /// spool syncing), so the clock is read again after it: messages read later are not
    /// stamped as if they had arrived before the wait. Stamped early, they would look late
    /// to the batcher, and every late message completing its batch at once makes batches
    /// of one or two messages under exactly the load that needs them large.
    pub fn flush(&self, out: &mut Vec<Msg>) {
        self.hand_on(out);
        if self.batch_clock.get().is_some() {
            self.batch_clock.set(Some(Instant::now()));
        }
    }

    fn hand_on(&self, out: &mut Vec<Msg>) {
        let m = self.metrics;
        let source = self.counts.borrow().source;
        {
            let mut c = self.counts.borrow_mut();
            if c.any_partition > 0 {
                m.add(Counter::InputAgentProcessAnyPartitionMsg, c.any_partition);
            }
            if c.partition_key > 0 {
                m.add(Counter::InputAgentProcessPartitionKeyMsg, c.partition_key);
            }
            *c = PendingCounts::default();
        }
        // The batch's receipt time caps each commit-point key (a future timestamp cannot
        // push a commit point past the present).
        let receipt_ms = i64::try_from(now_ms()).unwrap_or(i64::MAX);
        for msg in out.iter_mut() {
            msg.commit_key = tracking_key(msg.timestamp, receipt_ms);
        }
        // Spooled messages are on the spool before they count as received.
        self.spool_out(out);
        if out.is_empty() {
            return;
        }
        let n = out.len() as u64;
        m.add(Counter::MsgCreate, n);
        let forwarded = match source {
            Some(Source::Datagram) => Some(Counter::UnixDgInputAgentForwardMsg),
            Some(Source::UnixStream) => Some(Counter::UnixStreamInputForwardMsg),
            Some(Source::Tcp) => Some(Counter::TcpInputForwardMsg),
            Some(Source::Spool) | None => None,
        };
        if let Some(c) = forwarded {
            m.add(c, n);
        }
        // Tracked before counted as received: a commit point never passes a message that
        // the counters show as received (see report::commit_points).
        m.track_received_all(out.iter());
        // Per topic, each topic's messages found by one grouping pass.
        let mut groups = self.groups.borrow_mut();
        groups.group(out);
        for (t, idx) in groups.iter() {
            let n = idx.len() as u64;
            m.received(t, n);
            if source == Some(Source::Spool) {
                // Replayed: Kafka may already have them (see spool::recovery).
                let (lo, hi) = idx
                    .iter()
                    .map(|&i| out[i as usize].timestamp)
                    .fold((i64::MAX, i64::MIN), |(lo, hi), ts| {
                        (lo.min(ts), hi.max(ts))
                    });
                m.recovered(t, n);
                m.possible_duplicates(t, n, lo, hi);
            }
        }
        if let Some(r) = &self.router {
            // Routed here, they never wait in the `new` state.
            if r.try_route(out) {
                return;
            }
        }
        // They wait in the `new` state until the router takes them.
        for (t, idx) in groups.iter() {
            m.queue_add(t, QueueState::New, idx.len() as i64);
        }
        drop(groups);
        if let Some(r) = &self.router {
            r.queue();
        }
        let fresh = self
            .spare_batches
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(INPUT_BATCH_MAX));
        let batch = std::mem::replace(out, fresh);
        if let Err(e) = self.to_router.send(batch) {
            // Only if the router died: count the loss rather than hide it.
            let msgs = e.into_inner();
            log::error!("router is gone; discarding {} message(s)", msgs.len());
            for msg in &msgs {
                self.metrics.queue_add(msg.topic, QueueState::New, -1);
            }
            crate::report::discards::discard(self.metrics, msgs, DiscardReason::Shutdown);
        }
    }
}

/// Removes the messages at `idx` (ascending) from `batch`, keeping the others' order.
fn take_indices(batch: &mut Vec<Msg>, idx: &[usize]) -> Vec<Msg> {
    let mut taken = Vec::with_capacity(idx.len());
    let mut next = idx.iter().peekable();
    let all = std::mem::take(batch);
    for (i, msg) in all.into_iter().enumerate() {
        if next.peek() == Some(&&i) {
            next.next();
            taken.push(msg);
        } else {
            batch.push(msg);
        }
    }
    taken
}

/// A read that ended because the socket's timeout ([`STOP_POLL`]) ran out (or a signal):
/// time to look at the stop flag, not an error.
pub fn is_poll_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

/// Removes a stale socket file (any file at `path`); a missing one is fine.
pub fn remove_stale(path: &Path) -> Result<(), InputError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(InputError::Unlink {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Applies the configured permission bits to a socket file.
pub fn set_mode(path: &Path, mode: Option<u32>) -> Result<(), InputError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(
            |source| InputError::Chmod {
                path: path.to_path_buf(),
                mode,
                source,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::metrics::MetricsConfig;

    fn ctx() -> (InputCtx, Receiver<Vec<Msg>>) {
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new(MetricsConfig::default())));
        let pool = Pool::new_static(1 << 20).expect("pool");
        let (to_router, from_inputs) = crossbeam_channel::bounded(16);
        let (_spare_tx, spare_batches) = crossbeam_channel::bounded(1);
        let ctx = InputCtx {
            router: None,
            metrics,
            pool,
            to_router,
            spare_batches,
            stop: Arc::new(AtomicBool::new(false)),
            topic_cache: Default::default(),
            groups: Default::default(),
            batch_clock: Default::default(),
            counts: Default::default(),
            spool: None,
            spool_batch: Default::default(),
            leases: Default::default(),
        };
        (ctx, from_inputs)
    }

    fn datagram(topic: &str, value: &str) -> Vec<u8> {
        let mut d = Vec::new();
        wire::encode_any_partition(&mut d, topic.as_bytes(), 1, b"", value.as_bytes())
            .expect("encodes");
        d
    }

    #[test]
    fn messages_read_after_a_flush_are_stamped_after_it() {
        let (ctx, from_inputs) = ctx();
        let mut out = Vec::new();
        // A round of reads began long ago (the input then waited on a full channel).
        let round = Instant::now() - Duration::from_secs(1);
        ctx.batch_clock.set(Some(round));
        ctx.accept(&datagram("t", "early"), Source::UnixStream, &mut out);
        let before_flush = Instant::now();
        ctx.flush(&mut out);
        ctx.accept(&datagram("t", "late"), Source::UnixStream, &mut out);
        ctx.flush(&mut out);
        let early = from_inputs.try_recv().expect("first batch");
        let late = from_inputs.try_recv().expect("second batch");
        assert_eq!(early[0].arrival, round);
        assert!(
            late[0].arrival >= before_flush,
            "stamped as of the round's start"
        );
        // Without a batch clock, each message reads the clock itself; flush sets none.
        ctx.batch_clock.set(None);
        ctx.flush(&mut out);
        assert_eq!(ctx.batch_clock.get(), None);
    }

    #[test]
    fn topic_ids_hold_across_runs_and_alternations() {
        let (ctx, from_inputs) = ctx();
        let names = [
            "alpha", "beta", "alpha", "alpha", "gamma", "beta", "alph", "alphaa",
        ];
        let mut out = Vec::new();
        for (i, name) in names.iter().enumerate() {
            ctx.accept(&datagram(name, &i.to_string()), Source::Datagram, &mut out);
        }
        ctx.flush(&mut out);
        let batch = from_inputs.try_recv().expect("one batch");
        assert_eq!(batch.len(), names.len());
        for (msg, name) in batch.iter().zip(names) {
            assert_eq!(
                ctx.metrics.topic_id(name.as_bytes()),
                Some(msg.topic),
                "{name}"
            );
        }
        // Prefixes and extensions of a cached name are other topics.
        let ids: std::collections::HashSet<TopicId> = batch.iter().map(|m| m.topic).collect();
        assert_eq!(ids.len(), 5);
        crate::pipeline::free_msgs(batch);
    }

    #[test]
    fn every_topic_in_use_stays_cached() {
        let (ctx, from_inputs) = ctx();
        // More topics than a few thousand, sent to in turn (as the bench's 10,000 are).
        let topics = 6_000;
        let mut out = Vec::new();
        for round in 0..2 {
            for t in 0..topics {
                ctx.accept(&datagram(&format!("t{t}"), "v"), Source::Datagram, &mut out);
                if out.len() == INPUT_BATCH_MAX {
                    ctx.flush(&mut out);
                    crate::pipeline::free_msgs(from_inputs.try_recv().expect("a batch"));
                }
            }
            assert_eq!(ctx.topic_cache.borrow().len(), topics, "round {round}");
        }
        ctx.flush(&mut out);
        while let Ok(b) = from_inputs.try_recv() {
            crate::pipeline::free_msgs(b);
        }
    }
}
