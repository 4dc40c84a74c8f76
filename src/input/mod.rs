//! Inputs: the sockets clients write to. One thread per socket (and one per stream
//! connection); each decodes Dory's client format, counts every message it receives,
//! copies accepted ones into the pool and hands them to the router in batches.
//!
//! Channels: writes `Vec<Msg>` batches to the router and takes emptied ones back for reuse
//! (types and capacities in [`crate::pipeline`]); reads a stop flag from the supervisor.
//!
//! Imports: settings, the pipeline types, the pool, [`crate::fasthash`] and
//! [`crate::report`] (counting what it receives and discards). Never [`crate::kafka`],
//! [`crate::route`] or [`crate::deliver`]: an input knows nothing of Kafka. [`wire`] (the
//! client format) is also used by `dory send` and the fuzz targets.

pub mod datagram;
pub mod stream;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::report::discard_log::{DiscardInfo, DiscardKind};

use crossbeam_channel::{Receiver, Sender};

use crate::pipeline::{Msg, INPUT_BATCH_MAX};
use crate::pool::Pool;
use crate::report::commit_points::tracking_key;
use crate::report::metrics::{
    now_ms, Counter, DiscardReason, Metrics, QueueState, TopicId, NO_TOPIC,
};
use wire::{ClientMsg, Kind, WireError};

/// Most topic ids an input thread remembers (the cache is cleared when full, so a client
/// inventing topic names cannot make it grow without bound).
const TOPIC_CACHE_MAX: usize = 4096;

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
}

/// What every input needs: where messages go and how they are counted. Each input
/// thread has its own clone.
#[derive(Clone)]
pub struct InputCtx {
    pub metrics: &'static Metrics,
    pub pool: &'static Pool,
    pub to_router: Sender<Vec<Msg>>,
    /// Emptied batches the router gave back, reused before allocating new ones.
    pub spare_batches: Receiver<Vec<Msg>>,
    pub stop: Arc<AtomicBool>,
    /// Topic ids this thread has looked up, sparing the shared topic table's lock.
    pub topic_cache: std::cell::RefCell<crate::fasthash::FastMap<Vec<u8>, TopicId>>,
    /// Arrival time for the messages being accepted, when the input read them together
    /// (one clock read per batch); `None`: read the clock per message.
    pub batch_clock: std::cell::Cell<Option<Instant>>,
    /// Counters for the batch being collected, added to the metrics in `flush`.
    pub counts: std::cell::RefCell<PendingCounts>,
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
        let m = self.metrics;
        match wire::parse(bytes) {
            Ok(msg) => self.accept_parsed(msg, source, out),
            Err(e) => {
                m.received(NO_TOPIC, 1);
                if let Some(log) = m.discard_log() {
                    let info = match e {
                        WireError::Malformed(_) => DiscardInfo::Malformed,
                        WireError::UnsupportedApiKey(k) => DiscardInfo::ApiKey(k),
                        WireError::UnsupportedVersion { version, .. } => {
                            DiscardInfo::Version(version)
                        }
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
        }
    }

    fn accept_parsed(&self, msg: ClientMsg<'_>, source: Source, out: &mut Vec<Msg>) {
        let m = self.metrics;
        {
            let mut c = self.counts.borrow_mut();
            match msg.kind {
                Kind::AnyPartition => c.any_partition += 1,
                Kind::PartitionKey(_) => c.partition_key += 1,
            }
        }
        let cached = self.topic_cache.borrow().get(msg.topic).copied();
        let topic = cached.or_else(|| {
            let id = m.topic_id(msg.topic)?;
            let mut cache = self.topic_cache.borrow_mut();
            if cache.len() >= TOPIC_CACHE_MAX {
                cache.clear();
            }
            cache.insert(msg.topic.to_vec(), id);
            Some(id)
        });
        let Some(topic) = topic else {
            // The topic table is full (a client inventing topic names): count it under "".
            m.received(NO_TOPIC, 1);
            m.discarded(
                NO_TOPIC,
                DiscardReason::BadTopic,
                1,
                msg.timestamp,
                msg.timestamp,
            );
            return;
        };
        let len = msg.key.len() + msg.value.len();
        let Some(mut payload) = self.pool.alloc(len) else {
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
        // Received, MsgCreate, forwarded and New are counted for the batch in `flush`,
        // before the router can see (and settle) any of these messages.
        self.counts.borrow_mut().source = Some(source);
        out.push(Msg {
            topic,
            partition_key: match msg.kind {
                Kind::AnyPartition => None,
                Kind::PartitionKey(k) => Some(k),
            },
            timestamp: msg.timestamp,
            arrival: self.batch_clock.get().unwrap_or_else(Instant::now),
            // Set for the whole batch in `flush`, with the batch's receipt time.
            commit_key: msg.timestamp,
            payload,
            key_len: u32::try_from(msg.key.len())
                .expect("a key fits in a client message, so in u32"),
            failed_attempts: 0,
            maybe_sent: false,
        });
    }

    /// Hands a batch to the router (blocking while its queue is full: backpressure),
    /// counting it first.
    pub fn flush(&self, out: &mut Vec<Msg>) {
        let m = self.metrics;
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
        if out.is_empty() {
            return;
        }
        let source = self.counts.borrow().source;
        let n = out.len() as u64;
        m.add(Counter::MsgCreate, n);
        if let Some(source) = source {
            m.add(
                match source {
                    Source::Datagram => Counter::UnixDgInputAgentForwardMsg,
                    Source::UnixStream => Counter::UnixStreamInputForwardMsg,
                    Source::Tcp => Counter::TcpInputForwardMsg,
                },
                n,
            );
        }
        // Per topic: a batch holds few topics, so a short list is enough. The batch's
        // receipt time caps each commit-point key (a future timestamp cannot push a commit
        // point past the present).
        let receipt_ms = i64::try_from(now_ms()).unwrap_or(i64::MAX);
        let mut per_topic: Vec<(TopicId, u64)> = Vec::new();
        for msg in out.iter_mut() {
            msg.commit_key = tracking_key(msg.timestamp, receipt_ms);
            match per_topic.iter_mut().find(|(t, _)| *t == msg.topic) {
                Some((_, n)) => *n += 1,
                None => per_topic.push((msg.topic, 1)),
            }
        }
        for (t, n) in per_topic {
            // Tracked before counted as received: a commit point never passes a message
            // that the counters show as received (see report::commit_points).
            m.track_received(t, out.iter().filter(|msg| msg.topic == t));
            m.received(t, n);
            m.queue_add(t, QueueState::New, n as i64);
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
