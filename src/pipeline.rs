//! Every type that crosses a channel between roles, and every channel capacity, so the
//! whole data flow reads on one screen:
//!
//! ```text
//! inputs ──Vec<Msg>──▶ router ──Batch──▶ dispatcher (one per broker)
//!   ▲ pool leases   ◀─ emptied Vec<Msg> (reuse)
//!   │                    ▲  ▲                 │
//!   │                    │  └──Outcome────────┘  (retry / reroute; delivered and discarded
//!   │                    │                         messages are counted where they end)
//!   │                    └──FetchResponse── metadata fetcher ◀──FetchRequest── router
//!   │                       (metadata, and producer ids for the idempotent producer)
//!   └── supervisor: signals, Control::Shutdown to the router, stop flags to inputs
//! ```
//!
//! Also the ids those types carry and every role shares: [`TopicId`], [`PartKey`], a
//! sealed batch's [`Seq`], [`IdRequest`] and a message's [`SpoolRef`].
//!
//! Imports: the pool (a message's payload lease) and [`crate::kafka`] (the metadata an
//! answer carries); no role, so every role may import it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::pool::Lease;

/// Index into the topic table. `NO_TOPIC` (0) stands for "" (no parsable topic).
pub type TopicId = u32;

/// The topic id of input that has no parsable topic (malformed, unsupported, unclean).
pub const NO_TOPIC: TopicId = 0;

/// A partition: (topic id, partition id).
pub type PartKey = (TopicId, i32);

/// A sealed batch's identity in the broker's eyes (idempotence, see
/// [`crate::deliver::idempotence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seq {
    pub producer_id: i64,
    pub epoch: i16,
    pub base: i32,
    /// It went out under this identity on a connection that was lost before the answer:
    /// the broker may have written it.
    pub uncertain: bool,
}

/// The producer identity to present when asking for a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdRequest {
    /// A new producer id (first start, fenced, or epoch exhausted).
    Fresh,
    /// Bump the epoch of this producer id (KIP-360, InitProducerId v3+).
    Bump { producer_id: i64, epoch: i16 },
}

/// A message's hold on its spool segment (see [`crate::spool`]): while any exists, the
/// segment is kept. Dropped with the message (acknowledged or discarded).
#[derive(Debug)]
pub struct SpoolRef(&'static AtomicU64);

impl SpoolRef {
    /// A hold counted in `slot` (the segment's count of unresolved messages), which the
    /// caller has already incremented.
    pub fn new(slot: &'static AtomicU64) -> SpoolRef {
        SpoolRef(slot)
    }
}

impl Drop for SpoolRef {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Messages an input hands over in one channel send (inputs batch what is already queued
/// in the socket, so the per-message channel cost is amortised).
pub const INPUT_BATCH_MAX: usize = 128;
/// Capacity of the inputs → router channel, in input batches.
pub const INPUT_CHANNEL_CAP: usize = 1024;
/// Emptied input batches the router hands back for reuse: an input fills a buffer that is
/// already in a CPU cache instead of fresh memory.
pub const SPARE_BATCHES_CAP: usize = 64;
/// Capacity of each router → dispatcher channel, in batches.
pub const DISPATCH_CHANNEL_CAP: usize = 256;
/// Capacity of the dispatchers → router outcome channel.
pub const OUTCOME_CHANNEL_CAP: usize = 1024;
/// Capacity of the router ↔ metadata fetcher channels.
pub const META_CHANNEL_CAP: usize = 16;
/// Capacity of the status → router request channel.
pub const STATUS_CHANNEL_CAP: usize = 16;

/// Kafka's per-record overhead as Dory counts it when sizing a message for
/// `message_max_bytes` (the router, for batches and `too_long`; dispatchers, when packing
/// batches into a request).
pub const KAFKA_MSG_OVERHEAD: usize = 26;
/// A RecordBatch v2 header, counted with the record overheads above.
pub const RECORD_BATCH_OVERHEAD: usize = 61;

/// One client message, from the moment an input accepted it until it is acknowledged or
/// discarded. Its key and value live in the pool; dropping the message frees them.
#[derive(Debug)]
pub struct Msg {
    pub topic: TopicId,
    /// `Some` for Dory PartitionKey messages: the client's key for partition choice.
    pub partition_key: Option<i32>,
    /// The client's timestamp (ms since the epoch): the Kafka record's CreateTime.
    pub timestamp: i64,
    /// When the input accepted it: starts the batch clock (not the client's timestamp).
    pub arrival: Instant,
    /// Its commit-point tracking key, `min(timestamp, receipt time)` in ms since the epoch
    /// (see [`crate::report::commit_points`]); set by the input as it hands the message on.
    pub commit_key: i64,
    /// Key bytes followed by value bytes.
    pub payload: Lease,
    pub key_len: u32,
    /// Failed delivery attempts so far (error acknowledgements).
    pub failed_attempts: u32,
    /// Fully written to a connection that was lost before the broker answered: a resend
    /// may duplicate it.
    pub maybe_sent: bool,
    /// For a spooled topic: the message's hold on its spool segment, released when the
    /// message is dropped (acknowledged or discarded).
    pub spool: Option<SpoolRef>,
}

impl Msg {
    pub fn key_len(&self) -> usize {
        self.key_len as usize
    }
    pub fn value_len(&self) -> usize {
        self.payload.len() - self.key_len as usize
    }
    /// Bytes as Dory's batching limits count them: key + value, at least 1.
    pub fn batch_size(&self) -> usize {
        self.payload.len().max(1)
    }
}

#[cfg(test)]
impl Msg {
    /// A message of `len` value bytes (no key) for unit tests, its commit key its timestamp.
    pub(crate) fn for_test(
        pool: &'static crate::pool::Pool,
        topic: TopicId,
        timestamp: i64,
        len: usize,
        arrival: Instant,
    ) -> Msg {
        Msg {
            topic,
            partition_key: None,
            timestamp,
            arrival,
            commit_key: timestamp,
            payload: pool.alloc(len).expect("test pool has room"),
            key_len: 0,
            failed_attempts: 0,
            maybe_sent: false,
            spool: None,
        }
    }
}

/// Drops messages, returning their pool space with one lock for the lot.
pub fn free_msgs(msgs: Vec<Msg>) {
    let Some(pool) = msgs.first().map(|m| m.payload.pool()) else {
        return;
    };
    pool.free_many(msgs.into_iter().map(|m| m.payload));
}

/// Counts one more failed attempt on each message and splits off those past
/// `max_failed` attempts: (to send again, to discard as `attempt_limit`).
pub fn count_failed_attempt(msgs: Vec<Msg>, max_failed: u32) -> (Vec<Msg>, Vec<Msg>) {
    let mut keep = Vec::new();
    let mut over = Vec::new();
    for mut m in msgs {
        m.failed_attempts += 1;
        if m.failed_attempts > max_failed {
            over.push(m);
        } else {
            keep.push(m);
        }
    }
    (keep, over)
}

/// Messages bound for one partition of one topic.
#[derive(Debug)]
pub struct Batch {
    pub topic: TopicId,
    pub partition: i32,
    pub msgs: Vec<Msg>,
    /// With idempotence: the producer id, epoch and base sequence the batch was sealed
    /// with. A sealed batch goes out as one record batch, never merged or split.
    pub seq: Option<Seq>,
}

impl Batch {
    /// A batch not sealed (yet).
    pub fn new(topic: TopicId, partition: i32, msgs: Vec<Msg>) -> Batch {
        Batch {
            topic,
            partition,
            msgs,
            seq: None,
        }
    }

    pub fn payload_bytes(&self) -> usize {
        self.msgs.iter().map(|m| m.payload.len()).sum()
    }
}

/// Why a dispatcher hands messages back to the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnReason {
    /// Kafka said to send them again to the same broker (e.g. CORRUPT_MESSAGE).
    Retry,
    /// A transient broker condition: resend after a backoff.
    Backoff,
    /// Leadership or partition availability changed: refresh metadata, then reroute.
    Reroute,
    /// The connection failed or could not be made; route again once metadata is fresh.
    ConnectionLost,
    /// The dispatcher is stopping (shutdown) with these still unsent or unacknowledged.
    Stopped,
    /// A sealed batch (idempotence) the broker answered with error `code`: the router
    /// decides, because the partition's sequence depends on it. No attempt is counted yet.
    Rejected { code: i16 },
}

/// Dispatcher → router.
#[derive(Debug)]
pub enum Outcome {
    /// Messages to route again.
    Returned {
        broker: i32,
        reason: ReturnReason,
        batches: Vec<Batch>,
    },
    /// The connection to `broker` is usable (true) or lost (false).
    Connection { broker: i32, up: bool },
    /// The dispatcher finished `n` batches (acknowledged or discarded): room in its queue.
    Finished { broker: i32, n: usize },
    /// Sealed batches acknowledged (delivered, or recognised as duplicates): each
    /// partition's identity and record count, so the router can move its window.
    Acked { acks: Vec<(PartKey, Seq, usize)> },
    /// `broker` speaks a Produce version without producer ids (Kafka 0.8–0.10): the
    /// cluster cannot keep idempotence's promise, so the router turns it off (once).
    NoProducerIds { broker: i32, why: String },
}

/// Router → metadata fetcher.
#[derive(Debug, Clone)]
pub struct MetaRequest {
    /// `None`: every topic. `Some`: just these (and ask for auto-creation if `autocreate`).
    pub topics: Option<Vec<Arc<[u8]>>>,
    pub autocreate: bool,
    /// Numbers all-topics fetches, so a lookup knows which answer came after its question.
    pub seq: u64,
}

/// Metadata fetcher → router.
#[derive(Debug)]
pub struct MetaResponse {
    pub request: MetaRequest,
    pub result: Result<crate::kafka::MetadataResponse, String>,
}

/// Router → metadata fetcher: what to fetch.
#[derive(Debug, Clone)]
pub enum FetchRequest {
    Metadata(MetaRequest),
    /// InitProducerId for the idempotent producer.
    ProducerId(IdRequest),
}

/// Metadata fetcher → router.
#[derive(Debug)]
pub enum FetchResponse {
    Metadata(MetaResponse),
    ProducerId(Result<(i64, i16), ProducerIdError>),
}

/// Why no producer id came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerIdError {
    /// The cluster cannot do idempotence (too old, or not permitted): fall back.
    Unsupported(String),
    /// Try again later (no broker reachable, coordinator loading, ...).
    Transient(String),
}

/// Supervisor → router.
#[derive(Debug, Clone, Copy)]
pub enum Control {
    /// Stop: inputs are closing; deliver what is held until `deadline`, then discard.
    Shutdown { deadline: Instant },
}

/// Status server → router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusRequest {
    /// `POST /metadata_update`: refresh metadata now.
    MetadataUpdate,
}

/// A batch's messages grouped by topic in one pass, in their order within each topic:
/// per-topic work then costs O(messages) instead of a scan of the batch per topic, which
/// with many topics (a batch of 128 messages over 128 topics) was quadratic. The buffers
/// are kept from batch to batch.
#[derive(Debug, Default)]
pub struct TopicGroups {
    /// Per topic id: 1 + the topic's index in `groups`, 0 when absent (reset after use).
    slot_of: Vec<u32>,
    /// (topic, first index in `order`, count).
    groups: Vec<(TopicId, u32, u32)>,
    /// Message indices, topic by topic.
    order: Vec<u32>,
    /// Each group's next free place in `order` while filling.
    fill: Vec<u32>,
    /// 0, 1, 2, ...: the indices when the whole batch is one topic (the common case),
    /// which then needs no second pass.
    identity: Vec<u32>,
}

impl Clone for TopicGroups {
    /// Each input thread starts with empty buffers of its own.
    fn clone(&self) -> Self {
        TopicGroups::default()
    }
}

impl TopicGroups {
    /// Groups `msgs` (at most `u32::MAX` of them).
    pub fn group(&mut self, msgs: &[Msg]) {
        self.group_topics(msgs.iter().map(|m| m.topic));
    }

    /// Groups any items by topic, given each item's topic in order (at most `u32::MAX`
    /// items; `topics` is walked twice).
    pub fn group_topics(&mut self, topics: impl Iterator<Item = TopicId> + Clone) {
        for &(t, _, _) in &self.groups {
            self.slot_of[t as usize] = 0;
        }
        self.groups.clear();
        let mut len = 0;
        for topic in topics.clone() {
            len += 1;
            let t = topic as usize;
            if self.slot_of.len() <= t {
                self.slot_of.resize(t + 1, 0);
            }
            match self.slot_of[t] {
                0 => {
                    self.groups.push((topic, 0, 1));
                    self.slot_of[t] = self.groups.len() as u32;
                }
                g => self.groups[g as usize - 1].2 += 1,
            }
        }
        if self.groups.len() == 1 {
            while self.identity.len() < len {
                self.identity.push(self.identity.len() as u32);
            }
            return;
        }
        let mut start = 0;
        for g in &mut self.groups {
            g.1 = start;
            start += g.2;
        }
        self.order.clear();
        self.order.resize(len, 0);
        self.fill.clear();
        self.fill.extend(self.groups.iter().map(|g| g.1));
        for (i, topic) in topics.enumerate() {
            let g = self.slot_of[topic as usize] as usize - 1;
            self.order[self.fill[g] as usize] = i as u32;
            self.fill[g] += 1;
        }
    }

    /// Each topic of the last grouped batch with its messages' indices, in order.
    pub fn iter(&self) -> impl Iterator<Item = (TopicId, &[u32])> + '_ {
        let single = self.groups.len() == 1;
        self.groups.iter().map(move |&(t, start, n)| {
            if single {
                return (t, &self.identity[..n as usize]);
            }
            let start = start as usize;
            (t, &self.order[start..start + n as usize])
        })
    }
}

/// Marks the calling thread as throughput work for the scheduler (`SCHED_BATCH`): when it
/// is woken it does not preempt the thread running on that CPU, typically the input that
/// woke it, but waits for that thread to sleep or yield, or for its time slice to end.
/// Used by the router and the dispatchers: an input woken by clients is what keeps
/// clients from blocking, so it keeps its CPU. Any thread may ask this; failure (not Linux,
/// a seccomp filter) only logs.
pub fn batch_scheduling(thread: &str) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        log::debug!(
            "{thread}: cannot use SCHED_BATCH: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod batch_scheduling_tests {
    #[test]
    fn only_the_calling_thread_becomes_batch() {
        // SAFETY (both calls): pid 0 is the calling thread; no pointers.
        let policy = || unsafe { libc::sched_getscheduler(0) };
        let before = policy();
        let inside = std::thread::spawn(move || {
            super::batch_scheduling("test");
            policy()
        })
        .join()
        .expect("thread");
        assert_eq!(inside, libc::SCHED_BATCH);
        assert_eq!(policy(), before, "the caller's own policy is untouched");
    }
}

#[cfg(test)]
mod topic_groups_tests {
    use super::*;
    use crate::pool::Pool;
    use proptest::prelude::*;

    proptest! {
        /// Same groups as a naive scan, topics in first-seen order, indices in order,
        /// over two batches through the same buffers.
        #[test]
        fn groups_like_a_scan(a in prop::collection::vec(0u32..40, 0..200),
                              b in prop::collection::vec(0u32..300, 0..200)) {
            static POOL: std::sync::OnceLock<&'static Pool> = std::sync::OnceLock::new();
            let pool = *POOL.get_or_init(|| Pool::new_static(1 << 16).expect("pool"));
            let now = Instant::now();
            let mut g = TopicGroups::default();
            for topics in [a, b] {
                let msgs: Vec<Msg> =
                    topics.iter().map(|&t| Msg::for_test(pool, t, 0, 0, now)).collect();
                g.group(&msgs);
                let mut naive: Vec<(TopicId, Vec<u32>)> = Vec::new();
                for (i, &t) in topics.iter().enumerate() {
                    match naive.iter_mut().find(|(nt, _)| *nt == t) {
                        Some((_, v)) => v.push(i as u32),
                        None => naive.push((t, vec![i as u32])),
                    }
                }
                let got: Vec<(TopicId, Vec<u32>)> =
                    g.iter().map(|(t, idx)| (t, idx.to_vec())).collect();
                prop_assert_eq!(got, naive);
                free_msgs(msgs);
            }
        }
    }

    #[test]
    fn one_topic_batches_between_mixed_ones() {
        let pool = Pool::new_static(1 << 16).expect("pool");
        let now = Instant::now();
        let mut g = TopicGroups::default();
        for topics in [vec![7u32; 5], vec![1, 2, 1], vec![7; 9], vec![3; 2]] {
            let msgs: Vec<Msg> = topics
                .iter()
                .map(|&t| Msg::for_test(pool, t, 0, 0, now))
                .collect();
            g.group(&msgs);
            let got: Vec<(TopicId, Vec<u32>)> = g.iter().map(|(t, i)| (t, i.to_vec())).collect();
            let want: Vec<(TopicId, Vec<u32>)> = if topics == [1, 2, 1] {
                vec![(1, vec![0, 2]), (2, vec![1])]
            } else {
                vec![(topics[0], (0..topics.len() as u32).collect())]
            };
            assert_eq!(got, want);
            free_msgs(msgs);
        }
    }
}
