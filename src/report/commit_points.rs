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
//! No per-message lock or allocation: an input registers each topic's messages of one input
//! batch under that topic's lock, and an acknowledgement or discard resolves a batch the
//! same way. Consecutive equal keys (messages of the same millisecond) and equal arrival
//! times (one input batch) are merged into one multiset update, so a batch touches a few
//! `BTreeMap` entries, not one per message.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select_biased, tick, Sender};
use serde::Serialize;

use crate::pipeline::Msg;

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

    fn push(&mut self, v: T) -> Option<(T, u64)> {
        match &mut self.run {
            Some((cur, n)) if *cur == v => {
                *n += 1;
                None
            }
            _ => self.run.replace((v, 1)),
        }
    }

    fn finish(self) -> Option<(T, u64)> {
        self.run
    }
}

/// Adds `n` copies of `v` to a multiset.
fn add<T: Ord>(set: &mut BTreeMap<T, u64>, v: T, n: u64) {
    *set.entry(v).or_insert(0) += n;
}

/// Removes up to `n` copies of `v` from a multiset; returns how many were there to remove.
fn remove<T: Ord>(set: &mut BTreeMap<T, u64>, v: T, n: u64) -> u64 {
    match set.entry(v) {
        Entry::Occupied(mut e) => {
            let have = *e.get();
            if have <= n {
                e.remove();
                have
            } else {
                *e.get_mut() -= n;
                n
            }
        }
        Entry::Vacant(_) => 0,
    }
}

/// One topic's unresolved messages: the pure state behind its commit point and its oldest
/// unacknowledged age. Messages are given as `(tracking key, arrival)` pairs; arrival is
/// any monotonic millisecond count (the caller's clock), used only for the oldest age.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicTrack {
    /// Unresolved tracking keys (ms since the epoch) → how many messages have that key.
    keys: BTreeMap<i64, u64>,
    /// Arrival (caller's ms clock) of the unresolved messages → how many.
    arrivals: BTreeMap<u64, u64>,
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
        let before = self.commit_point();
        let (mut keys, mut arrivals) = (RunLength::new(), RunLength::new());
        let (mut n, mut late) = (0u64, 0u64);
        for (key, arrival) in msgs {
            n += 1;
            if before.is_some_and(|t| key <= t) {
                late += 1;
            }
            self.max_key = self.max_key.max(Some(key));
            if let Some((v, c)) = keys.push(key) {
                add(&mut self.keys, v, c);
            }
            if let Some((v, c)) = arrivals.push(arrival) {
                add(&mut self.arrivals, v, c);
            }
        }
        if let Some((v, c)) = keys.finish() {
            add(&mut self.keys, v, c);
        }
        if let Some((v, c)) = arrivals.finish() {
            add(&mut self.arrivals, v, c);
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
            if let Some((v, c)) = keys.push(key) {
                removed += remove(&mut self.keys, v, c);
            }
            if let Some((v, c)) = arrivals.push(arrival) {
                remove(&mut self.arrivals, v, c);
            }
        }
        if let Some((v, c)) = keys.finish() {
            removed += remove(&mut self.keys, v, c);
        }
        if let Some((v, c)) = arrivals.finish() {
            remove(&mut self.arrivals, v, c);
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
        self.keys.first_key_value().map(|(&k, _)| k)
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
        self.arrivals.first_key_value().map(|(&a, _)| a)
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

// ----- delivery latency -----

/// Upper bounds of the latency histogram's buckets (Prometheus `le`), 1 ms to 60 s in
/// 1-2.5-5 steps; above the last is the `+Inf` bucket.
pub const LATENCY_BOUNDS: [Duration; 15] = [
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(25),
    Duration::from_secs(60),
];

/// Buckets including `+Inf`.
const BUCKETS: usize = LATENCY_BOUNDS.len() + 1;

/// The bucket of one latency: the first whose bound is ≥ it.
fn bucket(latency: Duration) -> usize {
    LATENCY_BOUNDS.partition_point(|b| *b < latency)
}

/// Receipt → acknowledgement latency of one topic's delivered messages. Updated once per
/// acknowledged batch: one atomic add per non-empty bucket.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Per bucket (not cumulative); the last is `+Inf`.
    counts: [AtomicU64; BUCKETS],
    sum_micros: AtomicU64,
}

/// A histogram read out: cumulative counts per bound (`+Inf` last) and the sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub cumulative: [u64; BUCKETS],
    pub sum: Duration,
}

impl LatencySnapshot {
    /// Messages observed (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.cumulative[BUCKETS - 1]
    }
}

impl LatencyHistogram {
    /// Records one batch of latencies.
    pub fn record(&self, latencies: impl IntoIterator<Item = Duration>) {
        let mut counts = [0u64; BUCKETS];
        let mut sum = 0u64;
        for l in latencies {
            counts[bucket(l)] += 1;
            sum = sum.saturating_add(u64::try_from(l.as_micros()).unwrap_or(u64::MAX));
        }
        for (a, &n) in self.counts.iter().zip(&counts) {
            if n > 0 {
                a.fetch_add(n, Ordering::Relaxed);
            }
        }
        if sum > 0 {
            self.sum_micros.fetch_add(sum, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let mut cumulative = [0u64; BUCKETS];
        let mut total = 0u64;
        for (c, a) in cumulative.iter_mut().zip(&self.counts) {
            total += a.load(Ordering::Relaxed);
            *c = total;
        }
        LatencySnapshot {
            cumulative,
            sum: Duration::from_micros(self.sum_micros.load(Ordering::Relaxed)),
        }
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

/// The daemon-wide part of tracking: whether it is on, the clock arrival times are counted
/// on, and the state file's error count. The hooks take one topic's messages of one batch.
#[derive(Debug)]
pub struct Tracking {
    enabled: bool,
    /// Arrivals are kept as milliseconds since this instant.
    anchor: Instant,
    file_errors: AtomicU64,
}

impl Tracking {
    pub fn new(enabled: bool) -> Self {
        Tracking {
            enabled,
            anchor: Instant::now(),
            file_errors: AtomicU64::new(0),
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

    fn arrival_ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.anchor).as_millis()).unwrap_or(u64::MAX)
    }

    fn pairs<'a>(&'a self, msgs: &'a [Msg]) -> impl Iterator<Item = (i64, u64)> + 'a {
        msgs.iter()
            .map(|m| (m.commit_key, self.arrival_ms(m.arrival)))
    }

    /// Registers messages of one topic as received (their `commit_key` set).
    pub fn receive<'a>(&self, cell: &TopicCell, msgs: impl Iterator<Item = &'a Msg>) {
        if self.enabled {
            cell.track()
                .receive(msgs.map(|m| (m.commit_key, self.arrival_ms(m.arrival))));
        }
    }

    /// Resolves messages of one topic (discarded).
    pub fn resolve(&self, cell: &TopicCell, msgs: &[Msg]) {
        if self.enabled {
            cell.track().resolve(self.pairs(msgs));
        }
    }

    /// Messages of one topic acknowledged at `now`: their latencies, then resolved.
    pub fn delivered(&self, cell: &TopicCell, msgs: &[Msg], now: Instant) {
        cell.latency.record(
            msgs.iter()
                .map(|m| now.saturating_duration_since(m.arrival)),
        );
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
            .map_or(0, |a| self.arrival_ms(now).saturating_sub(a));
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

// ----- the state file -----

/// The state file's content: the commit points only (ages and counts change all the time
/// and are for live monitoring).
#[derive(Debug, Serialize)]
struct StateJson<'a> {
    version: &'a str,
    pid: u32,
    /// When this file was written, ms since the epoch.
    written: u64,
    overall: Option<i64>,
    topics: Vec<StateTopicJson>,
}

#[derive(Debug, Serialize)]
struct StateTopicJson {
    topic: String,
    commit_point: Option<i64>,
}

/// What a state file holds apart from its write time, to tell whether it changed.
type StateKey = (Option<i64>, Vec<(Arc<[u8]>, Option<i64>)>);

fn state_key(p: &Points) -> StateKey {
    (
        p.overall,
        p.topics
            .iter()
            .map(|t| (Arc::clone(&t.name), t.commit_point))
            .collect(),
    )
}

/// The latest commit points on disk, replaced atomically (write `<path>.tmp`, fsync,
/// rename over `<path>`, fsync the directory), so a reader after a crash finds either the
/// previous or the new content, never a torn one.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    tmp: PathBuf,
    version: String,
    last: Option<StateKey>,
}

/// `<path><suffix>`, in the same directory (so a rename stays on one file system).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

impl StateFile {
    /// At start-up: keeps the previous run's file (if any) as `<path>.prev`, so the last
    /// commit point before a crash survives a restart, then writes an empty state. An
    /// error here means the path is unusable.
    pub fn create(path: &Path, version: &str) -> io::Result<StateFile> {
        if path.exists() {
            std::fs::rename(path, with_suffix(path, ".prev"))?;
        }
        let mut f = StateFile {
            path: path.to_path_buf(),
            tmp: with_suffix(path, ".tmp"),
            version: version.to_string(),
            last: None,
        };
        f.write(&Points::default(), 0)?;
        Ok(f)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `points` unless the commit points equal the last written ones; returns
    /// whether it wrote.
    pub fn write(&mut self, points: &Points, now_ms: u64) -> io::Result<bool> {
        let key = state_key(points);
        if self.last.as_ref() == Some(&key) {
            return Ok(false);
        }
        let doc = StateJson {
            version: &self.version,
            pid: std::process::id(),
            written: now_ms,
            overall: points.overall,
            topics: points
                .topics
                .iter()
                .map(|t| StateTopicJson {
                    topic: String::from_utf8_lossy(&t.name).into_owned(),
                    commit_point: t.commit_point,
                })
                .collect(),
        };
        let mut bytes = serde_json::to_vec_pretty(&doc).map_err(io::Error::other)?;
        bytes.push(b'\n');
        write_atomic(&self.path, &self.tmp, &bytes)?;
        self.last = Some(key);
        Ok(true)
    }
}

/// Replaces `path` with `bytes` through `tmp`: a reader sees the old or the new content.
fn write_atomic(path: &Path, tmp: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(tmp, path)?;
    // The rename is durable once the directory is.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Minimum interval between two log lines about state file errors.
const FILE_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The thread (`commit-points`) that writes the state file at its interval, when changed,
/// and once more when stopped.
pub struct StateWriter {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl StateWriter {
    /// Starts the thread. `points` reads the current state; `errors` counts failed writes.
    pub fn spawn(
        mut file: StateFile,
        interval: Duration,
        mut points: impl FnMut() -> Points + Send + 'static,
        errors: &'static AtomicU64,
    ) -> io::Result<StateWriter> {
        let (stop, stopped) = bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("commit-points".into())
            .spawn(move || {
                let ticks = tick(interval);
                let mut last_log: Option<Instant> = None;
                let mut write = |file: &mut StateFile| {
                    if let Err(e) = file.write(&points(), crate::report::metrics::now_ms()) {
                        errors.fetch_add(1, Ordering::Relaxed);
                        if last_log.is_none_or(|t| t.elapsed() >= FILE_ERROR_LOG_INTERVAL) {
                            log::error!(
                                "cannot write commit points to {}: {e}",
                                file.path().display()
                            );
                            last_log = Some(Instant::now());
                        }
                    }
                };
                loop {
                    select_biased! {
                        recv(stopped) -> _ => {
                            write(&mut file);
                            return;
                        }
                        recv(ticks) -> _ => write(&mut file),
                    }
                }
            })?;
        Ok(StateWriter {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Writes the final state (if changed) and waits for the thread to end.
    pub fn stop(mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("commit-points thread panicked");
            }
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
    fn latency_buckets_are_le_bounds() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_millis(1)), 0);
        assert_eq!(bucket(Duration::from_micros(1_001)), 1);
        assert_eq!(bucket(Duration::from_secs(60)), 14);
        assert_eq!(bucket(Duration::from_secs(61)), 15);
        let h = LatencyHistogram::default();
        h.record([
            Duration::from_micros(500),
            Duration::from_millis(3),
            Duration::from_millis(3),
            Duration::from_secs(100),
        ]);
        let s = h.snapshot();
        assert_eq!(s.count(), 4);
        assert_eq!(&s.cumulative[..4], &[1, 1, 3, 3]);
        assert_eq!(s.cumulative[14], 3);
        assert_eq!(s.sum, Duration::from_micros(500 + 6_000 + 100_000_000));
    }

    #[test]
    fn runs_touch_few_entries() {
        let mut t = TopicTrack::new();
        t.receive((0..1000).map(|i| (1_000 + i / 500, 7)));
        assert_eq!(t.keys.len(), 2);
        assert_eq!(t.arrivals.len(), 1);
        assert_eq!(t.unresolved(), 1000);
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
                prop_assert_eq!(tracks[t].keys.len() + tracks[t].arrivals.len(), 0);
            }
            prop_assert_eq!(
                overall(tracks.iter().map(|t| (t.min_unresolved(), t.max_key()))),
                max_key.iter().copied().max().flatten()
            );
        }
    }

    fn point(name: &str, cp: Option<i64>) -> TopicPoint {
        TopicPoint {
            name: Arc::from(name.as_bytes()),
            commit_point: cp,
            unresolved: 0,
            oldest_unacked: Duration::ZERO,
            late_arrivals: 0,
        }
    }

    fn read_json(path: &Path) -> serde_json::Value {
        let text = std::fs::read_to_string(path).expect("state file readable");
        serde_json::from_str(&text).expect("state file is JSON")
    }

    #[test]
    fn state_file_keeps_the_previous_run_and_writes_only_changes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cp.json");
        std::fs::write(&path, "previous run\n").expect("seed an old file");
        let mut f = StateFile::create(&path, "9.9").expect("create");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cp.json.prev")).expect("prev kept"),
            "previous run\n"
        );
        let v = read_json(&path);
        assert_eq!(v["overall"], serde_json::Value::Null);
        assert_eq!(v["topics"], serde_json::json!([]));
        assert_eq!(v["version"], "9.9");

        let p = Points::new(
            vec![point("b", Some(200)), point("a", Some(100))],
            [(None, Some(200)), (None, Some(100))],
        );
        assert!(f.write(&p, 1234).expect("write"));
        let v = read_json(&path);
        assert_eq!(v["written"], 1234);
        assert_eq!(v["overall"], 200);
        assert_eq!(
            v["topics"],
            serde_json::json!([
                {"topic": "a", "commit_point": 100},
                {"topic": "b", "commit_point": 200},
            ])
        );
        assert!(
            !f.write(&p, 5678).expect("unchanged"),
            "nothing new to write"
        );
        assert_eq!(read_json(&path)["written"], 1234);
        let mut q = p.clone();
        q.topics[0].unresolved = 7;
        assert!(!f.write(&q, 5678).expect("unchanged"), "only T matters");
        q.topics[0].commit_point = Some(150);
        assert!(f.write(&q, 5678).expect("changed"));
        assert_eq!(read_json(&path)["topics"][0]["commit_point"], 150);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn state_file_in_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let e = StateFile::create(&dir.path().join("no/such/dir/cp.json"), "v").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn state_writer_writes_on_its_interval_and_at_stop() {
        static ERRORS: AtomicU64 = AtomicU64::new(0);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cp.json");
        let f = StateFile::create(&path, "v").expect("create");
        let cp = Arc::new(AtomicU64::new(10));
        let w = {
            let cp = Arc::clone(&cp);
            StateWriter::spawn(
                f,
                Duration::from_millis(10),
                move || {
                    let t = cp.load(Ordering::SeqCst) as i64;
                    Points::new(vec![point("a", Some(t))], [(None, Some(t))])
                },
                &ERRORS,
            )
            .expect("spawn")
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_json(&path)["overall"] != 10 {
            assert!(Instant::now() < deadline, "the writer never wrote");
            std::thread::sleep(Duration::from_millis(5));
        }
        cp.store(20, Ordering::SeqCst);
        w.stop();
        assert_eq!(
            read_json(&path)["overall"],
            20,
            "final state written at stop"
        );
        assert_eq!(ERRORS.load(Ordering::SeqCst), 0);
    }
}
