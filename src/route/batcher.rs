//! Batch completion: when a per-topic (or per-partition) batch of messages is ready to
//! send. Pure logic, no threads: the router owns one [`OpenBatch`] per batching key.
//!
//! Dory's algorithm (reference §3.2) with two deliberate changes:
//!
//! - The time limit runs from each message's *arrival* at the daemon, not from the
//!   client's timestamp, so a client with a skewed clock cannot defeat (or stall)
//!   batching.
//! - Adding a message completes a batch by count or bytes only, never by time. The router
//!   applies the time limit from its timers, once it has routed the input queued so far
//!   (up to a cap; `Router::on_timers`). Dory checked it per message, so when the daemon
//!   fell behind by more than the time limit, every message arrived late, completed its
//!   batch at once and went alone: a request per message or two, which made the daemon
//!   fall further behind (doc/performance.md, "Round seventeen"). Checked after the
//!   queued input, late messages still travel together.

use std::time::{Duration, Instant};

use crate::config::BatchLimits;
use crate::pipeline::{Msg, KAFKA_MSG_OVERHEAD, RECORD_BATCH_OVERHEAD};

/// What to do with a message handed to [`OpenBatch::add`].
#[derive(Debug, Default)]
pub struct Emit {
    /// A completed batch (the previous content, possibly including the new message).
    pub batch: Option<Vec<Msg>>,
    /// The new message, to be sent on its own.
    pub alone: Option<Msg>,
}

/// Messages collected for one batching key, with Dory's counters.
#[derive(Debug, Default)]
pub struct OpenBatch {
    msgs: Vec<Msg>,
    bytes: u64,
    /// Σ(key + value + 26): the size Kafka will see, capped by `message_max_bytes`.
    kafka_bytes: usize,
    /// The earliest arrival of its messages plus the time limit: the batch's deadline
    /// (see `deadline`).
    expires: Option<Instant>,
    /// `expires` changed since [`OpenBatch::take_new_deadline`] last looked.
    new_deadline: bool,
    /// Length of the last batch taken: the next one reserves that much (and an eighth more)
    /// at its first message instead of growing by doubling (each growth copies the batch
    /// so far).
    last_len: usize,
}

/// Most messages reserved ahead for a new batch (4,096 `Msg`s, 352 KiB of address space):
/// a default batch (256 KiB) of messages of 72 bytes or more needs no regrowth, each of
/// which would copy the batch so far (at 1,024, every default batch of 100-byte messages
/// regrew twice, copying 270 KiB). A reservation is address space until the batch fills
/// it, so many batching keys reserving after one big batch each cost little memory.
const RESERVE_MAX: usize = 4096;

impl OpenBatch {
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// When the time limit completes this batch, if it is on and the batch is not empty.
    pub fn deadline(&self) -> Option<Instant> {
        self.expires
    }

    /// The batch's deadline if it is new (first message, or an earlier arrival) since the
    /// last call: for a timer queue that must hear of each deadline once.
    pub fn take_new_deadline(&mut self) -> Option<Instant> {
        if !std::mem::take(&mut self.new_deadline) {
            return None;
        }
        self.expires
    }

    pub fn take(&mut self) -> Vec<Msg> {
        self.bytes = 0;
        self.kafka_bytes = 0;
        self.expires = None;
        self.new_deadline = false;
        self.last_len = self.msgs.len();
        std::mem::take(&mut self.msgs)
    }

    fn push(&mut self, m: Msg, time: Option<Duration>) {
        if self.msgs.capacity() == 0 {
            // An eighth more than last time: batches completed by size vary in count.
            let want = self.last_len + self.last_len / 8;
            self.msgs.reserve_exact(want.clamp(1, RESERVE_MAX));
        }
        self.bytes += m.batch_size() as u64;
        self.kafka_bytes += m.payload.len() + KAFKA_MSG_OVERHEAD;
        if let Some(e) = time.and_then(|t| m.arrival.checked_add(t)) {
            if self.expires.is_none_or(|cur| e < cur) {
                self.expires = Some(e);
                self.new_deadline = true;
            }
        }
        self.msgs.push(m);
        // The next message's slot, written when this key gets its next message: with many
        // keys that is long after this one, and the slot's memory is cold.
        self.prefetch_next();
    }

    /// Hints the slot the next message will be written to (nothing before the batch's
    /// first message reserves one).
    #[inline]
    pub fn prefetch_next(&self) {
        if self.msgs.len() < self.msgs.capacity() {
            // One past the last message, inside the reservation: a hint, never read.
            let slot = self.msgs.as_ptr().wrapping_add(self.msgs.len());
            crate::prefetch::bytes(slot, std::mem::size_of::<Msg>());
        }
    }

    fn take_nonempty(&mut self) -> Option<Vec<Msg>> {
        (!self.msgs.is_empty()).then(|| self.take())
    }

    /// Adds `m` under `limits`; `max_batch_kafka_bytes` keeps a batch within what the broker
    /// accepts as one record batch. Completes a batch by count or bytes; one whose time is
    /// up is completed by the caller ([`OpenBatch::deadline`]), after the rest of the
    /// messages it is routing now.
    pub fn add(&mut self, m: Msg, limits: &BatchLimits, max_batch_kafka_bytes: usize) -> Emit {
        if limits.time.is_none() && limits.messages.is_none() && limits.bytes.is_none() {
            return Emit {
                batch: None,
                alone: Some(m),
            };
        }
        let sz = m.batch_size() as u64;
        let kafka_sz = m.payload.len() + KAFKA_MSG_OVERHEAD;
        if let Some(b) = limits.bytes {
            if sz >= b {
                return Emit {
                    batch: self.take_nonempty(),
                    alone: Some(m),
                };
            }
        }
        let over_bytes = limits.bytes.is_some_and(|b| self.bytes + sz > b);
        let over_kafka = !self.msgs.is_empty()
            && self.kafka_bytes + kafka_sz + RECORD_BATCH_OVERHEAD > max_batch_kafka_bytes;
        if over_bytes || over_kafka {
            let batch = self.take_nonempty();
            if limits.messages.is_some_and(|n| n <= 1) {
                return Emit {
                    batch,
                    alone: Some(m),
                };
            }
            self.push(m, limits.time);
            return Emit { batch, alone: None };
        }
        self.push(m, limits.time);
        let done = limits.messages.is_some_and(|n| self.msgs.len() as u64 >= n)
            || limits.bytes.is_some_and(|b| self.bytes >= b);
        Emit {
            batch: if done { self.take_nonempty() } else { None },
            alone: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;

    fn pool() -> &'static Pool {
        Pool::new_static(1 << 20).expect("pool")
    }

    fn msg(p: &'static Pool, len: usize, arrival: Instant) -> Msg {
        Msg::for_test(p, 1, 0, len, arrival)
    }

    fn limits(time_ms: Option<u64>, n: Option<u64>, b: Option<u64>) -> BatchLimits {
        BatchLimits {
            time: time_ms.map(Duration::from_millis),
            messages: n,
            bytes: b,
        }
    }

    #[test]
    fn no_limits_sends_alone() {
        let p = pool();
        let now = Instant::now();
        let mut b = OpenBatch::default();
        let e = b.add(msg(p, 10, now), &limits(None, None, None), 1_000_000);
        assert!(e.alone.is_some() && e.batch.is_none());
        assert!(b.is_empty());
    }

    #[test]
    fn hinting_the_next_slot_changes_nothing() {
        let p = pool();
        let now = Instant::now();
        let l = limits(None, Some(3), None);
        let mut b = OpenBatch::default();
        // Nothing reserved yet, then a slot inside the reservation, then a full one.
        b.prefetch_next();
        assert!(b.add(msg(p, 1, now), &l, 1_000_000).batch.is_none());
        b.prefetch_next();
        assert_eq!(b.len(), 1);
        assert!(b.add(msg(p, 1, now), &l, 1_000_000).batch.is_none());
        b.msgs.shrink_to_fit();
        b.prefetch_next();
        let e = b.add(msg(p, 1, now), &l, 1_000_000);
        assert_eq!(e.batch.map(|v| v.len()), Some(3));
    }

    #[test]
    fn count_limit_completes_batch() {
        let p = pool();
        let now = Instant::now();
        let l = limits(None, Some(3), None);
        let mut b = OpenBatch::default();
        assert!(b.add(msg(p, 1, now), &l, 1_000_000).batch.is_none());
        assert!(b.add(msg(p, 1, now), &l, 1_000_000).batch.is_none());
        let e = b.add(msg(p, 1, now), &l, 1_000_000);
        assert_eq!(e.batch.map(|v| v.len()), Some(3));
        assert!(b.is_empty());
    }

    #[test]
    fn byte_limit_overflow_starts_new_batch() {
        let p = pool();
        let now = Instant::now();
        let l = limits(None, None, Some(100));
        let mut b = OpenBatch::default();
        assert!(b.add(msg(p, 60, now), &l, 1_000_000).batch.is_none());
        let e = b.add(msg(p, 60, now), &l, 1_000_000);
        assert_eq!(e.batch.map(|v| v.len()), Some(1));
        assert!(e.alone.is_none());
        assert_eq!(b.len(), 1);
        // A message as large as the limit goes alone, flushing the open batch.
        let e = b.add(msg(p, 100, now), &l, 1_000_000);
        assert_eq!(e.batch.map(|v| v.len()), Some(1));
        assert!(e.alone.is_some());
        assert!(b.is_empty());
    }

    #[test]
    fn a_batch_as_long_as_the_last_fills_without_regrowth() {
        let p = pool();
        let now = Instant::now();
        let l = limits(None, Some(3000), None);
        let mut b = OpenBatch::default();
        let add = |b: &mut OpenBatch| b.add(msg(p, 1, now), &l, 1_000_000).batch;
        for _ in 0..2999 {
            assert!(add(&mut b).is_none());
        }
        drop(add(&mut b).expect("the 3000th message completes the batch"));
        // The next batch reserves the last one's length (and an eighth) at its first
        // message, so the Vec it ends in is the one first allocated: no copy on the way.
        assert!(add(&mut b).is_none());
        let reserved = b.msgs.capacity();
        assert!(reserved >= 3000, "reserved {reserved}");
        let first = b.msgs.as_ptr();
        for _ in 0..2998 {
            assert!(add(&mut b).is_none());
        }
        let batch = add(&mut b).expect("the 3000th message completes the batch");
        assert_eq!(batch.len(), 3000);
        assert_eq!(batch.capacity(), reserved);
        assert_eq!(batch.as_ptr(), first);
    }

    #[test]
    fn empty_message_counts_as_one_byte() {
        let p = pool();
        let now = Instant::now();
        let l = limits(None, None, Some(2));
        let mut b = OpenBatch::default();
        assert!(b.add(msg(p, 0, now), &l, 1_000_000).batch.is_none());
        let e = b.add(msg(p, 0, now), &l, 1_000_000);
        assert_eq!(e.batch.map(|v| v.len()), Some(2));
    }

    #[test]
    fn time_limit_uses_arrival_and_is_left_to_the_caller() {
        let p = pool();
        let t0 = Instant::now();
        let l = limits(Some(50), None, None);
        let mut b = OpenBatch::default();
        assert!(b.add(msg(p, 1, t0), &l, 1_000_000).batch.is_none());
        assert_eq!(b.deadline(), Some(t0 + Duration::from_millis(50)));
        // Arriving after the deadline, it joins the batch: the caller completes it.
        let later = t0 + Duration::from_millis(60);
        let e = b.add(msg(p, 1, later), &l, 1_000_000);
        assert!(e.batch.is_none() && e.alone.is_none());
        assert_eq!(b.len(), 2);
        assert_eq!(b.deadline(), Some(t0 + Duration::from_millis(50)));
    }

    #[test]
    fn late_messages_batch_together_up_to_the_size_limit() {
        // A backlog: every message arrived long before its time limit ran out. They fill
        // batches by size as if on time; none goes alone.
        let p = pool();
        let long_ago = Instant::now();
        let l = limits(Some(5), None, Some(100));
        let mut b = OpenBatch::default();
        let mut sizes = Vec::new();
        for _ in 0..10 {
            let e = b.add(msg(p, 30, long_ago), &l, 1_000_000);
            assert!(e.alone.is_none());
            sizes.extend(e.batch.map(|v| v.len()));
        }
        assert_eq!(sizes, [3, 3, 3]);
        assert_eq!(b.len(), 1);
        assert_eq!(b.deadline(), Some(long_ago + Duration::from_millis(5)));
        // With a one-message limit, overflow still sends the message alone.
        let one = limits(Some(5), Some(1), Some(100));
        let mut b = OpenBatch::default();
        let e = b.add(msg(p, 30, long_ago), &one, 1_000_000);
        assert_eq!(e.batch.map(|v| v.len()), Some(1));
    }

    #[test]
    fn kafka_size_cap_splits_batches() {
        let p = pool();
        let now = Instant::now();
        let l = limits(None, None, Some(1 << 20));
        let mut b = OpenBatch::default();
        let cap = RECORD_BATCH_OVERHEAD + 2 * (100 + KAFKA_MSG_OVERHEAD);
        assert!(b.add(msg(p, 100, now), &l, cap).batch.is_none());
        assert!(b.add(msg(p, 100, now), &l, cap).batch.is_none());
        let e = b.add(msg(p, 100, now), &l, cap);
        assert_eq!(e.batch.map(|v| v.len()), Some(2));
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn each_new_deadline_is_reported_once() {
        let p = pool();
        let t0 = Instant::now();
        let l = limits(Some(100), None, None);
        let mut b = OpenBatch::default();
        let ms = Duration::from_millis;
        assert_eq!(b.take_new_deadline(), None);
        b.add(msg(p, 1, t0 + ms(10)), &l, 1_000_000);
        assert_eq!(b.take_new_deadline(), Some(t0 + ms(110)));
        assert_eq!(b.take_new_deadline(), None);
        // A later arrival keeps the deadline; an earlier one (a retried message) moves it.
        b.add(msg(p, 1, t0 + ms(20)), &l, 1_000_000);
        assert_eq!(b.take_new_deadline(), None);
        b.add(msg(p, 1, t0), &l, 1_000_000);
        assert_eq!(b.take_new_deadline(), Some(t0 + ms(100)));
        assert_eq!(b.deadline(), Some(t0 + ms(100)));
        // Taken (its time up): the next message starts a new deadline.
        assert_eq!(b.take().len(), 3);
        assert_eq!(b.take_new_deadline(), None);
        b.add(msg(p, 1, t0 + ms(150)), &l, 1_000_000);
        assert_eq!(b.take_new_deadline(), Some(t0 + ms(250)));
    }
}
