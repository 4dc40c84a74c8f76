//! The topic table: topic names interned to [`TopicId`]s, each with its per-topic atomics.
//! Lookups of a known topic take a read lock; the counters themselves are lock-free.

use crate::pipeline::{TopicId, NO_TOPIC};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

/// Topic slots are allocated in segments of this many, so a topic table sized for
/// `max_topics` costs memory only for the topics that exist.
const SEGMENT: usize = 64;

/// Per-topic atomics. Slots live in fixed segments that are never moved or freed, so the hot
/// path reaches them without a lock.
pub(super) struct TopicStats {
    pub(super) name: OnceLock<Arc<[u8]>>,
    pub(super) received: AtomicU64,
    pub(super) delivered: AtomicU64,
    pub(super) discarded: [AtomicU64; super::DiscardReason::COUNT],
    pub(super) possible_duplicates: AtomicU64,
    /// Messages in doubt (perhaps stored), kept under their sequence to be sent again.
    pub(super) resent_in_doubt: AtomicU64,
    pub(super) queued: [AtomicI64; 4],
    /// Commit point tracker and delivery latency.
    pub(super) delivery: crate::report::commit_points::TopicCell,
    /// Messages replayed from the spool at start.
    pub(super) recovered: AtomicU64,
    /// The topic goes through the spool.
    pub(super) spooled: AtomicBool,
    /// The spool's synced point ([`super::spool_stats::NO_POINT`]: none yet).
    pub(super) synced_point: AtomicI64,
}

impl Default for TopicStats {
    fn default() -> Self {
        TopicStats {
            name: OnceLock::new(),
            received: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            discarded: Default::default(),
            possible_duplicates: AtomicU64::new(0),
            resent_in_doubt: AtomicU64::new(0),
            queued: Default::default(),
            delivery: Default::default(),
            recovered: AtomicU64::new(0),
            spooled: AtomicBool::new(false),
            synced_point: AtomicI64::new(super::spool_stats::NO_POINT),
        }
    }
}

impl TopicStats {
    pub(super) fn name(&self) -> Arc<[u8]> {
        self.name
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::from(&b""[..]))
    }
}

pub(super) struct TopicTable {
    by_name: RwLock<HashMap<Arc<[u8]>, TopicId>>,
    segments: Box<[OnceLock<Box<[TopicStats]>>]>,
    /// Ids handed out so far (including `NO_TOPIC`); published after the slot is set up.
    len: AtomicU32,
    max_topics: usize,
    /// Whether the table being full was logged (once: every refused message is counted).
    full_logged: AtomicBool,
}

impl TopicTable {
    pub(super) fn new(max_topics: usize) -> Self {
        // Ids are u32 and id 0 is "", so at most u32::MAX - 1 real topics.
        let max_topics = max_topics.min(u32::MAX as usize - 1);
        let slots = max_topics + 1;
        let segments: Box<[OnceLock<Box<[TopicStats]>>]> = (0..slots.div_ceil(SEGMENT))
            .map(|_| OnceLock::new())
            .collect();
        let table = TopicTable {
            by_name: RwLock::new(HashMap::new()),
            segments,
            len: AtomicU32::new(1),
            max_topics,
            full_logged: AtomicBool::new(false),
        };
        // Segment 0 always exists, so `NO_TOPIC` and the fallback below are always valid.
        let no_topic = table.segment(0);
        let _ = no_topic[0].name.set(Arc::from(&b""[..]));
        table
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire) as usize
    }

    fn segment(&self, index: usize) -> &[TopicStats] {
        self.segments[index].get_or_init(|| (0..SEGMENT).map(|_| TopicStats::default()).collect())
    }

    /// The slot of `id` if its segment exists, set up or not.
    #[inline]
    fn slot(&self, id: TopicId) -> Option<&TopicStats> {
        let i = id as usize;
        self.segments
            .get(i / SEGMENT)
            .and_then(OnceLock::get)
            .map(|seg| &seg[i % SEGMENT])
    }

    /// The slot of `id`. An id never handed out is a caller bug; it falls back to `NO_TOPIC`
    /// so that its messages are still counted consistently.
    pub(super) fn stats(&self, id: TopicId) -> &TopicStats {
        match self.slot(id) {
            Some(s) if s.name.get().is_some() => s,
            _ => &self.segment(0)[0],
        }
    }

    /// Starts loading the lines of `id`'s slot that counting a message in and out of the
    /// queue states writes (see [`crate::prefetch`]): with thousands of topics a topic's
    /// slot is cold by the time it comes round again. Nothing happens for an id without a
    /// slot.
    #[inline]
    pub(super) fn prefetch(&self, id: TopicId) {
        let Some(s) = self.slot(id) else {
            return;
        };
        crate::prefetch::line(&s.name);
        crate::prefetch::line(&s.received);
        crate::prefetch::bytes(&s.queued, std::mem::size_of_val(&s.queued));
    }

    /// Starts loading all of `id`'s slot: settling an acknowledgement touches most of it
    /// (the queue states, the delivered count, the commit point and latency cells).
    #[inline]
    pub(super) fn prefetch_all(&self, id: TopicId) {
        if let Some(s) = self.slot(id) {
            crate::prefetch::bytes(s, std::mem::size_of::<TopicStats>());
        }
    }

    pub(super) fn max_topics(&self) -> usize {
        self.max_topics
    }

    pub(super) fn intern(&self, name: &[u8]) -> Option<TopicId> {
        if name.is_empty() {
            return Some(NO_TOPIC);
        }
        let read = self.by_name.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = read.get(name) {
            return Some(id);
        }
        drop(read);
        let mut write = self.by_name.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = write.get(name) {
            return Some(id);
        }
        let next = self.len.load(Ordering::Relaxed);
        if next as usize > self.max_topics {
            if !self.full_logged.swap(true, Ordering::Relaxed) {
                log::error!(
                    "topic table full: {} distinct topic names seen; messages for further \
                     new topics are discarded as bad_topic under topic \"\" (raise \
                     input.max_topics)",
                    self.max_topics
                );
            }
            return None;
        }
        let name: Arc<[u8]> = Arc::from(name);
        let i = next as usize;
        let _ = self.segment(i / SEGMENT)[i % SEGMENT]
            .name
            .set(Arc::clone(&name));
        write.insert(name, next);
        self.len.store(next + 1, Ordering::Release);
        Some(next)
    }

    pub(super) fn sorted_by_name<V: Copy>(&self, map: &HashMap<TopicId, V>) -> Vec<(Arc<[u8]>, V)> {
        let mut v: Vec<(Arc<[u8]>, V)> = map
            .iter()
            .map(|(&t, &val)| (self.stats(t).name(), val))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}
