//! Commit points and delivery latency: per topic, the newest client timestamp `T` such that
//! every message of the topic with a timestamp ≤ `T` that dory received has been
//! acknowledged by Kafka or counted as discarded; the age of the oldest unacknowledged
//! message; and a receipt → acknowledgement latency histogram.
//!
//! # What `T` is, exactly
//!
//! Each message gets a *tracking key* when an input hands it on:
//! `key = min(client timestamp, receipt time)` (milliseconds since the epoch, the receipt
//! time read once per input batch). A topic's unresolved keys are a multiset;
//!
//! * `T = (smallest unresolved key) − 1` while anything is unresolved,
//! * `T = largest key ever seen` once everything is resolved,
//! * no `T` before the topic's first message.
//!
//! Every unresolved message has `key > T`, and `timestamp ≥ key`, so `T` never reaches the
//! timestamp of a message still held: after a crash, only messages with timestamps > `T`
//! can be lost. Choices, and why:
//!
//! * **Future timestamps** (a client clock ahead of the host's) are tracked at the receipt
//!   time, so one such message cannot push `T` past the present: `T` claims nothing about
//!   messages that have not been sent yet. Once it is resolved `T` may sit at the receipt
//!   time, below that message's own timestamp: conservative, never wrong.
//! * **Out-of-order timestamps** need nothing special: the multiset is ordered by key, not
//!   by arrival, so an old timestamp still held keeps `T` below it however late it came.
//! * **Late arrivals**: `T` covers the messages received *so far*. A message that arrives
//!   with a key ≤ the topic's current `T` (a slow client, a clock behind, or two inputs
//!   racing) legitimately moves `T` back below itself. Such messages are counted per
//!   topic (`late_arrivals`), so monitoring can tell how often a `T` it saw was later
//!   undercut.
//!
//! The overall commit point is the same over all topics together: `(smallest unresolved
//! key of any topic) − 1`, or the largest key of any topic when nothing is unresolved.
//!
//! # Cost
//!
//! No per-message lock or allocation, and nothing per topic on an input's thread: an input
//! appends its whole batch to one log (one lock per input batch; consecutive messages of a
//! topic with equal key and arrival are one entry), and whoever next needs a topic's
//! tracker (an acknowledgement or discard resolving messages, a status or state file read)
//! first applies the whole log, topic by topic ([`Tracking::settle`]). Applying before
//! resolving or reading keeps every guarantee above: a message is in its topic's multiset
//! before anything resolves it or computes a commit point, so `T` never passes it. With
//! many topics this matters: the trackers' memory is touched by the thread that resolves
//! (the acknowledgement reader, on another CPU), not also by the input, the daemon's
//! busiest thread, which otherwise waits for those lines to come back from the other
//! core. Consecutive equal keys (messages of the same millisecond) and equal arrival times
//! (one input batch) are merged into one multiset update, so a batch touches a few entries
//! of a sorted deque, not one per message (`multiset.rs`).
//!
//! This file holds the tracker ([`TopicTrack`], pure), the shared per-topic cell and the
//! hooks ([`Tracking`]); `latency.rs` the latency histogram; `state_file.rs` the state file
//! and the thread that writes it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::pipeline::{Msg, TopicGroups};

mod multiset;
mod state_file;

use multiset::RunSet;

pub use crate::latency::{LatencyHistogram, LatencySnapshot, LATENCY_BOUNDS};
pub use state_file::{StateFile, StateWriter};

/// The tracking key of a message: its client timestamp, but never later than its receipt.
pub fn tracking_key(timestamp: i64, receipt_ms: i64) -> i64 {
    timestamp.min(receipt_ms)
}

/// Consecutive equal values of a stream, counted: `push` returns the previous run when the
/// value changes, `finish` the last one.
struct RunLength<T> {
    run: Option<(T, u64)>,
}

impl<T: PartialEq + Copy> RunLength<T> {
    fn new() -> Self {
        RunLength { run: None }
    }

    fn push(&mut self, v: T, count: u64) -> Option<(T, u64)> {
        match &mut self.run {
            Some((cur, n)) if *cur == v => {
                *n += count;
                None
            }
            _ => self.run.replace((v, count)),
        }
    }

    fn finish(self) -> Option<(T, u64)> {
        self.run
    }
}

/// One topic's unresolved messages: the pure state behind its commit point and its oldest
/// unacknowledged age. Messages are given as `(tracking key, arrival)` pairs; arrival is
/// any monotonic millisecond count (the caller's clock), used only for the oldest age.
#[derive(Clone, Debug, Default)]
pub struct TopicTrack {
    /// Unresolved tracking keys (ms since the epoch) → how many messages have that key.
    keys: RunSet<i64>,
    /// Arrival (caller's ms clock) of the unresolved messages → how many.
    arrivals: RunSet<u64>,
    /// Messages received and not yet resolved (the sum of `keys`' counts).
    unresolved: u64,
    /// Largest key ever received.
    max_key: Option<i64>,
    /// Messages that arrived with a key ≤ the commit point of the moment.
    late: u64,
}

impl TopicTrack {
    pub fn new() -> Self {
        TopicTrack::default()
    }

    /// Registers received messages. Returns how many of them were late arrivals (key ≤ the
    /// commit point before this call).
    pub fn receive(&mut self, msgs: impl IntoIterator<Item = (i64, u64)>) -> u64 {
        self.receive_runs(msgs.into_iter().map(|(key, arrival)| (key, arrival, 1)))
    }

    /// [`TopicTrack::receive`] for runs of messages: `(key, arrival, how many)`.
    pub fn receive_runs(&mut self, runs: impl IntoIterator<Item = (i64, u64, u64)>) -> u64 {
        let before = self.commit_point();
        let (mut keys, mut arrivals) = (RunLength::new(), RunLength::new());
        let (mut n, mut late) = (0u64, 0u64);
        for (key, arrival, count) in runs {
            n += count;
            if before.is_some_and(|t| key <= t) {
                late += count;
            }
            self.max_key = self.max_key.max(Some(key));
            if let Some((v, c)) = keys.push(key, count) {
                self.keys.add(v, c);
            }
            if let Some((v, c)) = arrivals.push(arrival, count) {
                self.arrivals.add(v, c);
            }
        }
        if let Some((v, c)) = keys.finish() {
            self.keys.add(v, c);
        }
        if let Some((v, c)) = arrivals.finish() {
            self.arrivals.add(v, c);
        }
        self.unresolved += n;
        self.late += late;
        late
    }

    /// Resolves messages (acknowledged or discarded), given as they were received. Keys and
    /// arrivals that are not held are ignored, so resolving a message that was never
    /// registered cannot make a count negative.
    pub fn resolve(&mut self, msgs: impl IntoIterator<Item = (i64, u64)>) {
        let (mut keys, mut arrivals) = (RunLength::new(), RunLength::new());
        let mut removed = 0u64;
        for (key, arrival) in msgs {
            if let Some((v, c)) = keys.push(key, 1) {
                removed += self.keys.remove(v, c);
            }
            if let Some((v, c)) = arrivals.push(arrival, 1) {
                self.arrivals.remove(v, c);
            }
        }
        if let Some((v, c)) = keys.finish() {
            removed += self.keys.remove(v, c);
        }
        if let Some((v, c)) = arrivals.finish() {
            self.arrivals.remove(v, c);
        }
        self.unresolved = self.unresolved.saturating_sub(removed);
    }

    /// The commit point `T` (see the module doc); `None` before the first message, or
    /// while a message with the smallest representable key is unresolved.
    pub fn commit_point(&self) -> Option<i64> {
        match self.min_unresolved() {
            Some(k) => k.checked_sub(1),
            None => self.max_key,
        }
    }

    /// The smallest unresolved tracking key.
    pub fn min_unresolved(&self) -> Option<i64> {
        self.keys.first()
    }

    /// The largest tracking key ever received.
    pub fn max_key(&self) -> Option<i64> {
        self.max_key
    }

    /// Messages received and not yet resolved.
    pub fn unresolved(&self) -> u64 {
        self.unresolved
    }

    /// Arrival of the oldest unresolved message (the caller's ms clock).
    pub fn oldest_arrival(&self) -> Option<u64> {
        self.arrivals.first()
    }

    /// Late arrivals so far (see [`TopicTrack::receive`]).
    pub fn late(&self) -> u64 {
        self.late
    }
}

/// A topic's `(smallest unresolved key, largest key)`: what [`overall`] needs of it.
pub type Bounds = (Option<i64>, Option<i64>);

/// The overall commit point from each topic's bounds.
pub fn overall(topics: impl IntoIterator<Item = Bounds>) -> Option<i64> {
    let (mut min_unresolved, mut max_key) = (None::<i64>, None::<i64>);
    for (lo, hi) in topics {
        if let Some(lo) = lo {
            min_unresolved = Some(min_unresolved.map_or(lo, |m| m.min(lo)));
        }
        max_key = max_key.max(hi);
    }
    match min_unresolved {
        Some(k) => k.checked_sub(1),
        None => max_key,
    }
}

// ----- shared per-topic state -----

/// What inputs, ack readers and the status thread share for one topic.
#[derive(Debug, Default)]
pub struct TopicCell {
    track: Mutex<TopicTrack>,
    pub latency: LatencyHistogram,
}

impl TopicCell {
    /// The topic's tracker, locked. A panic while it was held leaves a consistent-enough
    /// multiset (each update is a few map operations), so poisoning is ignored.
    pub fn track(&self) -> MutexGuard<'_, TopicTrack> {
        self.track.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

thread_local! {
    /// The last arrival this thread converted for [`Tracking::pairs`]: `(anchor, arrival,
    /// milliseconds from anchor to arrival)`. Keyed by the anchor too, so two trackers on
    /// one thread (tests) never share a conversion.
    static LAST_ARRIVAL: std::cell::Cell<Option<(Instant, Instant, u64)>> =
        const { std::cell::Cell::new(None) };
}

/// Milliseconds from `anchor` to `at` (0 before it).
fn arrival_ms(anchor: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(anchor).as_millis()).unwrap_or(u64::MAX)
}

/// The daemon-wide part of tracking: whether it is on, the clock arrival times are counted
/// on, and the state file's error count. The hooks take one topic's messages of one batch.
#[derive(Debug)]
pub struct Tracking {
    enabled: bool,
    /// Arrivals are kept as milliseconds since this instant.
    anchor: Instant,
    file_errors: AtomicU64,
    /// Received messages not yet applied to their topics' trackers.
    pending: Pending,
}

/// Runs of received messages logged by inputs and not yet applied to their topics'
/// trackers (see the module doc, "Cost").
#[derive(Debug, Default)]
struct Pending {
    log: Mutex<Vec<Logged>>,
    /// Held while applying, so that no one reads or resolves a tracker while runs taken
    /// from the log are still on their way to it.
    applying: Mutex<Applying>,
    /// Runs logged and not yet applied: zero means every run logged before is in its
    /// tracker. Raised under the log's lock, lowered only once the runs are applied.
    unapplied: AtomicUsize,
}

/// Scratch for applying the log, reused: the runs taken from it (swapped with the log's
/// buffer) and their grouping by topic.
#[derive(Debug, Default)]
struct Applying {
    runs: Vec<Logged>,
    groups: TopicGroups,
}

/// Consecutive messages of one topic with the same tracking key and arrival.
#[derive(Debug, Clone, Copy)]
struct Logged {
    topic: u32,
    count: u32,
    key: i64,
    arrival: u64,
}

/// Logged runs past which the logging input applies the log itself: no reader or
/// resolver has come by (no acknowledgements for a while), and the log stays small.
const PENDING_MAX: usize = 1 << 16;

impl Tracking {
    pub fn new(enabled: bool) -> Self {
        Tracking {
            enabled,
            anchor: Instant::now(),
            file_errors: AtomicU64::new(0),
            pending: Pending::default(),
        }
    }

    /// Whether commit points (and the oldest unacknowledged age) are tracked.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Failed state file writes.
    pub fn file_errors(&self) -> &AtomicU64 {
        &self.file_errors
    }

    /// `(tracking key, arrival ms)` of a message, for a batch at a time: messages of one
    /// input batch share one arrival reading, so it is converted once per run, and the
    /// last conversion is remembered on the thread for the next call (an input batch is
    /// tracked topic by topic: with many topics, one call per message).
    fn pairs(&self) -> impl FnMut(&Msg) -> (i64, u64) {
        let anchor = self.anchor;
        let mut last = LAST_ARRIVAL
            .get()
            .filter(|&(a, _, _)| a == anchor)
            .map(|(_, at, ms)| (at, ms));
        move |m| {
            let ms = match last {
                Some((at, ms)) if at == m.arrival => ms,
                _ => {
                    let ms = arrival_ms(anchor, m.arrival);
                    last = Some((m.arrival, ms));
                    LAST_ARRIVAL.set(Some((anchor, m.arrival, ms)));
                    ms
                }
            };
            (m.commit_key, ms)
        }
    }

    /// Logs received messages (their `commit_key` set; any topics, in the order received)
    /// to be applied to their topics' trackers by the next [`Tracking::settle`]; messages
    /// of `untracked` (topic "") are left out. Returns whether the log has grown past
    /// `PENDING_MAX` runs (65,536), when the caller should settle it.
    pub fn log_received<'a>(
        &self,
        msgs: impl IntoIterator<Item = &'a Msg>,
        untracked: u32,
    ) -> bool {
        if !self.enabled {
            return false;
        }
        let mut pairs = self.pairs();
        let mut log = self
            .pending
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = log.len();
        let mut run: Option<Logged> = None;
        for m in msgs {
            if m.topic == untracked {
                continue;
            }
            let (key, arrival) = pairs(m);
            match &mut run {
                Some(r)
                    if r.topic == m.topic
                        && r.key == key
                        && r.arrival == arrival
                        && r.count < u32::MAX =>
                {
                    r.count += 1;
                }
                _ => {
                    if let Some(r) = run.replace(Logged {
                        topic: m.topic,
                        count: 1,
                        key,
                        arrival,
                    }) {
                        log.push(r);
                    }
                }
            }
        }
        log.extend(run);
        // Raised before the lock is let go: a settle that takes these runs lowers it after.
        self.pending
            .unapplied
            .fetch_add(log.len() - before, Ordering::Release);
        log.len() > PENDING_MAX
    }

    /// Applies every logged run to its topic's tracker (`cell` gives a topic's cell).
    /// Call before resolving or reading any tracker. Cheap when nothing is logged.
    pub fn settle<'c>(&self, cell: impl Fn(u32) -> &'c TopicCell) {
        if self.pending.unapplied.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut applying = self
            .pending
            .applying
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(
            &mut *self
                .pending
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            &mut applying.runs,
        );
        // Each topic's runs in one visit, in log order (late arrivals are judged against
        // the topic's commit point before the visit).
        let Applying { runs, groups } = &mut *applying;
        groups.group_topics(runs.iter().map(|r| r.topic));
        for (topic, idx) in groups.iter() {
            cell(topic).track().receive_runs(idx.iter().map(|&i| {
                let r = &runs[i as usize];
                (r.key, r.arrival, u64::from(r.count))
            }));
        }
        self.pending
            .unapplied
            .fetch_sub(applying.runs.len(), Ordering::Release);
        applying.runs.clear();
    }

    /// Resolves messages of one topic (discarded).
    pub fn resolve(&self, cell: &TopicCell, msgs: &[Msg]) {
        if self.enabled {
            cell.track().resolve(msgs.iter().map(self.pairs()));
        }
    }

    /// Messages of one topic acknowledged at `now`: their latencies (one per run of equal
    /// arrivals), then resolved.
    pub fn delivered(&self, cell: &TopicCell, msgs: &[Msg], now: Instant) {
        cell.latency
            .record(msgs.chunk_by(|a, b| a.arrival == b.arrival).map(|run| {
                (
                    now.saturating_duration_since(run[0].arrival),
                    run.len() as u64,
                )
            }));
        self.resolve(cell, msgs);
    }

    /// One topic's point at `now`, with its `(min_unresolved, max_key)` for [`overall`];
    /// `None` if the topic has never had a message tracked.
    pub fn point(
        &self,
        name: Arc<[u8]>,
        cell: &TopicCell,
        now: Instant,
    ) -> Option<(TopicPoint, Bounds)> {
        let t = cell.track();
        t.max_key()?;
        let age = t
            .oldest_arrival()
            .map_or(0, |a| arrival_ms(self.anchor, now).saturating_sub(a));
        Some((
            TopicPoint {
                name,
                commit_point: t.commit_point(),
                unresolved: t.unresolved(),
                oldest_unacked: Duration::from_millis(age),
                late_arrivals: t.late(),
            },
            (t.min_unresolved(), t.max_key()),
        ))
    }
}

// ----- reading out -----

/// One topic's state as the status pages and the state file show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicPoint {
    pub name: Arc<[u8]>,
    pub commit_point: Option<i64>,
    pub unresolved: u64,
    /// Age of the oldest unresolved message (zero when none).
    pub oldest_unacked: Duration,
    pub late_arrivals: u64,
}

/// Every tracked topic's state at one moment (topics sorted by name), and the overall one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Points {
    pub overall: Option<i64>,
    pub unresolved: u64,
    pub oldest_unacked: Duration,
    pub topics: Vec<TopicPoint>,
}

impl Points {
    /// Builds the overall values from the topics' (the caller passes each topic's
    /// `(min_unresolved, max_key)` alongside, as [`overall`] needs).
    pub fn new(mut topics: Vec<TopicPoint>, bounds: impl IntoIterator<Item = Bounds>) -> Points {
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Points {
            overall: overall(bounds),
            unresolved: topics.iter().map(|t| t.unresolved).sum(),
            oldest_unacked: topics
                .iter()
                .map(|t| t.oldest_unacked)
                .max()
                .unwrap_or_default(),
            topics,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_topic_has_no_commit_point() {
        let t = TopicTrack::new();
        assert_eq!(t.commit_point(), None);
        assert_eq!(t.unresolved(), 0);
        assert_eq!(t.oldest_arrival(), None);
    }

    #[test]
    fn commit_point_stops_below_the_oldest_unresolved_key() {
        let mut t = TopicTrack::new();
        t.receive([(100, 1), (100, 1), (105, 1), (103, 2)]);
        assert_eq!(t.commit_point(), Some(99));
        assert_eq!(t.unresolved(), 4);
        assert_eq!(t.oldest_arrival(), Some(1));
        t.resolve([(100, 1), (100, 1)]);
        assert_eq!(t.commit_point(), Some(102), "103 is still held");
        t.resolve([(103, 2)]);
        assert_eq!(t.commit_point(), Some(104));
        assert_eq!(t.oldest_arrival(), Some(1));
        t.resolve([(105, 1)]);
        assert_eq!(t.commit_point(), Some(105), "all resolved: the newest key");
        assert_eq!((t.unresolved(), t.oldest_arrival()), (0, None));
    }

    #[test]
    fn late_arrivals_lower_the_commit_point_and_are_counted() {
        let mut t = TopicTrack::new();
        t.receive([(200, 0)]);
        t.resolve([(200, 0)]);
        assert_eq!(t.commit_point(), Some(200));
        assert_eq!(t.receive([(150, 5), (200, 5), (201, 5)]), 2);
        assert_eq!(t.late(), 2);
        assert_eq!(t.commit_point(), Some(149));
        t.resolve([(150, 5), (200, 5), (201, 5)]);
        assert_eq!(t.commit_point(), Some(201));
    }

    #[test]
    fn future_timestamps_are_tracked_at_receipt() {
        assert_eq!(tracking_key(5_000, 1_000), 1_000);
        assert_eq!(tracking_key(900, 1_000), 900);
        let mut t = TopicTrack::new();
        t.receive([(tracking_key(i64::MAX, 1_000), 0)]);
        t.resolve([(1_000, 0)]);
        assert_eq!(t.commit_point(), Some(1_000));
    }

    #[test]
    fn unregistered_resolves_are_ignored() {
        let mut t = TopicTrack::new();
        t.receive([(10, 0)]);
        t.resolve([(11, 1), (12, 3)]);
        assert_eq!((t.unresolved(), t.commit_point()), (1, Some(9)));
        assert_eq!(t.oldest_arrival(), Some(0));
    }

    #[test]
    fn smallest_key_gives_no_commit_point() {
        let mut t = TopicTrack::new();
        t.receive([(i64::MIN, 0)]);
        assert_eq!(t.commit_point(), None);
        assert_eq!(overall([(Some(i64::MIN), Some(i64::MIN))]), None);
    }

    #[test]
    fn overall_is_the_lowest_bound_over_topics() {
        assert_eq!(overall([]), None);
        assert_eq!(overall([(None, Some(300)), (None, Some(200))]), Some(300));
        assert_eq!(
            overall([(None, Some(300)), (Some(250), Some(400))]),
            Some(249)
        );
        assert_eq!(
            overall([(Some(500), Some(600)), (None, None), (Some(250), Some(400))]),
            Some(249)
        );
    }

    #[test]
    fn runs_touch_few_entries() {
        let mut t = TopicTrack::new();
        t.receive((0..1000).map(|i| (1_000 + i / 500, 7)));
        assert_eq!(t.keys.len(), 2);
        assert_eq!(t.arrivals.len(), 1);
        assert_eq!(t.unresolved(), 1000);
    }

    #[test]
    fn logged_messages_reach_their_trackers_when_settled() {
        let pool = crate::pool::Pool::new_static(1 << 16).expect("pool");
        let tracking = Tracking::new(true);
        let cells = [
            TopicCell::default(),
            TopicCell::default(),
            TopicCell::default(),
        ];
        let at = Instant::now();
        let msg = |topic, key| Msg::for_test(pool, topic, key, 1, at);
        // Topic 0 stands for "" here: never tracked.
        let batch = [
            msg(1, 100),
            msg(1, 100),
            msg(2, 50),
            msg(1, 100),
            msg(0, 7),
            msg(1, 90),
        ];
        assert!(!tracking.log_received(&batch, 0));
        assert_eq!(
            tracking.pending.unapplied.load(Ordering::Relaxed),
            4,
            "runs: (1, 100) x2, (2, 50), (1, 100), (1, 90)"
        );
        assert_eq!(cells[1].track().unresolved(), 0, "logged, not yet applied");
        tracking.settle(|t| &cells[t as usize]);
        assert_eq!(tracking.pending.unapplied.load(Ordering::Relaxed), 0);
        let (a, b) = (cells[1].track(), cells[2].track());
        assert_eq!(
            (a.unresolved(), a.commit_point(), a.late()),
            (4, Some(89), 0)
        );
        assert_eq!((b.unresolved(), b.commit_point()), (1, Some(49)));
        assert_eq!(cells[0].track().unresolved(), 0);
        drop((a, b));
        // Settling again with nothing logged changes nothing.
        tracking.settle(|t| &cells[t as usize]);
        assert_eq!(cells[1].track().unresolved(), 4);
        // Later runs judged late against the commit point when they are applied.
        tracking.resolve(&cells[1], &batch[..2]);
        assert!(!tracking.log_received(&[msg(1, 80)], 0));
        tracking.settle(|t| &cells[t as usize]);
        assert_eq!(
            cells[1].track().late(),
            1,
            "80 is below the commit point 89"
        );
        assert_eq!(cells[1].track().commit_point(), Some(79));
    }

    #[test]
    fn a_long_log_asks_to_be_settled() {
        let pool = crate::pool::Pool::new_static(1 << 16).expect("pool");
        let tracking = Tracking::new(true);
        let at = Instant::now();
        let (a, b) = (
            Msg::for_test(pool, 1, 10, 0, at),
            Msg::for_test(pool, 1, 20, 0, at),
        );
        // Alternating keys: every message a run of its own.
        let runs = |n| [&a, &b].into_iter().cycle().take(n);
        assert!(!tracking.log_received(runs(PENDING_MAX), 0));
        assert!(tracking.log_received(runs(1), 0));
        let cell = TopicCell::default();
        tracking.settle(|_| &cell);
        assert_eq!(cell.track().unresolved(), PENDING_MAX as u64 + 1);
        assert!(
            !Tracking::new(false).log_received(runs(PENDING_MAX + 1), 0),
            "off: nothing logged"
        );
    }

    #[test]
    fn trackers_on_one_thread_do_not_share_arrival_conversions() {
        let pool = crate::pool::Pool::new_static(1 << 16).expect("pool");
        let base = Instant::now();
        let earlier = base
            .checked_sub(Duration::from_secs(1))
            .expect("uptime over 1 s");
        let tracker = |anchor| Tracking {
            enabled: true,
            anchor,
            file_errors: AtomicU64::new(0),
            pending: Pending::default(),
        };
        let (a, b) = (tracker(base), tracker(earlier));
        let (cell_a, cell_b) = (TopicCell::default(), TopicCell::default());
        let arrival = base + Duration::from_millis(5);
        let msg = Msg::for_test(pool, 1, 1_000, 1, arrival);
        let receive = |t: &Tracking, cell: &TopicCell| {
            t.log_received(std::iter::once(&msg), 0);
            t.settle(|_| cell);
        };
        // The same arrival, converted against two anchors one second apart, in turn.
        receive(&a, &cell_a);
        receive(&b, &cell_b);
        receive(&a, &cell_a);
        let now = base + Duration::from_millis(10);
        for (t, cell) in [(&a, &cell_a), (&b, &cell_b)] {
            let (p, _) = t.point(Arc::from(&b"t"[..]), cell, now).expect("tracked");
            assert_eq!(p.oldest_unacked, Duration::from_millis(5));
        }
    }

    /// One step of a random interleaving on several topics.
    #[derive(Clone, Debug)]
    enum Op {
        /// Advance the clock, then an input batch: `(topic, timestamp offset from now)`.
        Receive(u64, Vec<(usize, i64)>),
        /// Acknowledge the unresolved messages of one topic at these positions (mod len).
        Ack(usize, Vec<usize>),
        /// Discard unresolved messages of any topic at these positions (mod len).
        Discard(Vec<usize>),
    }

    const TOPICS: usize = 3;

    fn op() -> impl Strategy<Value = Op> {
        // Timestamps from 10 s in the past to 5 s in the future of the receipt clock.
        let msg = (0..TOPICS, -10_000i64..5_000);
        prop_oneof![
            (0u64..50, prop::collection::vec(msg, 1..40)).prop_map(|(d, m)| Op::Receive(d, m)),
            (0..TOPICS, prop::collection::vec(any::<usize>(), 0..20))
                .prop_map(|(t, p)| Op::Ack(t, p)),
            prop::collection::vec(any::<usize>(), 0..10).prop_map(Op::Discard),
        ]
    }

    /// A held message in the model: `(topic, timestamp, key, arrival)`.
    type Held = (usize, i64, i64, u64);

    fn check(tracks: &[TopicTrack], held: &[Held], max_key: &[Option<i64>]) {
        for (t, track) in tracks.iter().enumerate() {
            let mine: Vec<&Held> = held.iter().filter(|h| h.0 == t).collect();
            let cp = track.commit_point();
            for &&(_, ts, key, _) in &mine {
                let cp = cp.expect("a commit point once messages exist");
                assert!(key > cp, "unresolved key {key} not above T {cp}");
                assert!(ts > cp, "unresolved timestamp {ts} not above T {cp}");
            }
            assert_eq!(track.unresolved(), mine.len() as u64);
            assert_eq!(
                track.oldest_arrival(),
                mine.iter().map(|h| h.3).min(),
                "oldest arrival"
            );
            let want = match mine.iter().map(|h| h.2).min() {
                Some(k) => Some(k - 1),
                None => max_key[t],
            };
            assert_eq!(cp, want, "T is exactly the bound, not just below it");
        }
        let all = overall(tracks.iter().map(|t| (t.min_unresolved(), t.max_key())));
        if let Some(all) = all {
            assert!(held.iter().all(|h| h.2 > all && h.1 > all));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Random interleavings of receive, acknowledge and discard over three topics, with
        /// out-of-order and future timestamps: every unresolved message stays above `T`
        /// (per topic and overall), and once everything resolves `T` is the newest key,
        /// which is the newest timestamp when none was in the future.
        #[test]
        fn commit_point_never_passes_an_unresolved_message(ops in prop::collection::vec(op(), 1..60)) {
            let mut tracks = vec![TopicTrack::new(); TOPICS];
            let mut held: Vec<Held> = Vec::new();
            let mut max_key = [None::<i64>; TOPICS];
            let mut max_ts = [None::<i64>; TOPICS];
            let mut future = [false; TOPICS];
            let mut now: i64 = 1_700_000_000_000;
            let mut arrival: u64 = 0;
            for op in ops {
                match op {
                    Op::Receive(dt, msgs) => {
                        now += dt as i64;
                        arrival += dt;
                        for t in 0..TOPICS {
                            let batch: Vec<(i64, u64)> = msgs
                                .iter()
                                .filter(|m| m.0 == t)
                                .map(|&(_, off)| {
                                    let ts = now + off;
                                    let key = tracking_key(ts, now);
                                    held.push((t, ts, key, arrival));
                                    max_key[t] = max_key[t].max(Some(key));
                                    max_ts[t] = max_ts[t].max(Some(ts));
                                    future[t] |= ts > now;
                                    (key, arrival)
                                })
                                .collect();
                            tracks[t].receive(batch);
                        }
                    }
                    Op::Ack(t, picks) => {
                        let mut idx: Vec<usize> = held
                            .iter()
                            .enumerate()
                            .filter(|(_, h)| h.0 == t)
                            .map(|(i, _)| i)
                            .collect();
                        let mut chosen = Vec::new();
                        for p in picks {
                            if idx.is_empty() {
                                break;
                            }
                            chosen.push(idx.swap_remove(p % idx.len()));
                        }
                        chosen.sort_unstable_by(|a, b| b.cmp(a));
                        let batch: Vec<(i64, u64)> = chosen
                            .into_iter()
                            .map(|i| {
                                let h = held.swap_remove(i);
                                (h.2, h.3)
                            })
                            .collect();
                        tracks[t].resolve(batch);
                    }
                    Op::Discard(picks) => {
                        for p in picks {
                            if held.is_empty() {
                                break;
                            }
                            let h = held.swap_remove(p % held.len());
                            tracks[h.0].resolve([(h.2, h.3)]);
                        }
                    }
                }
                check(&tracks, &held, &max_key);
            }
            // Resolve everything, in a random-ish (reversed) order.
            while let Some(h) = held.pop() {
                tracks[h.0].resolve([(h.2, h.3)]);
            }
            check(&tracks, &held, &max_key);
            for t in 0..TOPICS {
                prop_assert_eq!(tracks[t].commit_point(), max_key[t]);
                if !future[t] {
                    prop_assert_eq!(tracks[t].commit_point(), max_ts[t], "the newest timestamp");
                }
                prop_assert!(tracks[t].keys.is_empty() && tracks[t].arrivals.is_empty());
            }
            prop_assert_eq!(
                overall(tracks.iter().map(|t| (t.min_unresolved(), t.max_key()))),
                max_key.iter().copied().max().flatten()
            );
        }
    }
}
