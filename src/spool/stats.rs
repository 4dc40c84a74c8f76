//! What the spool reports: its own gauges and counters ([`SpoolStats`], which the status
//! pages read), and each spooled topic's synced point, through [`SpoolReport`]. The
//! spool imports nothing of `report`: `report::metrics::Metrics` implements the trait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::latency::{LatencyHistogram, LatencySnapshot};
use crate::pipeline::TopicId;

/// Where the spool reports.
pub trait SpoolReport: Sync {
    /// The spool-wide figures, to update.
    fn spool_stats(&self) -> &SpoolStats;
    /// Sets topic `topic`'s synced point: every message of it with a tracking key ≤
    /// `point` that was received is on disk (or was received before the spool was on for
    /// it).
    fn set_synced_point(&self, topic: TopicId, point: i64);
}

/// Spool-wide values.
#[derive(Debug, Default)]
pub struct SpoolStats {
    enabled: AtomicBool,
    /// Bytes of segment files on disk (active, unresolved and spare).
    pub bytes: AtomicU64,
    /// Segment files on disk.
    pub segments: AtomicU64,
    /// Segments holding unresolved messages (the active one included).
    pub live_segments: AtomicU64,
    pub appended_records: AtomicU64,
    pub synced_records: AtomicU64,
    /// Messages replayed at start.
    pub recovered: AtomicU64,
    /// Bytes recovery skipped (torn or corrupt records).
    pub corrupt_bytes: AtomicU64,
    /// Segment files recovery could not use (future format, bad header) and moved aside.
    pub unreadable_segments: AtomicU64,
    /// Failed segment creations and writes (each also a `spool_full` discard).
    pub write_errors: AtomicU64,
    pub sync_errors: AtomicU64,
    /// Latency of each group commit (`fdatasync` of every dirty segment).
    pub sync_latency: LatencyHistogram,
}

/// A copy of [`SpoolStats`] for the status pages.
#[derive(Debug, Clone)]
pub struct SpoolSnapshot {
    pub bytes: u64,
    pub segments: u64,
    pub live_segments: u64,
    pub appended_records: u64,
    pub synced_records: u64,
    pub recovered: u64,
    pub corrupt_bytes: u64,
    pub unreadable_segments: u64,
    pub write_errors: u64,
    pub sync_errors: u64,
    pub sync_latency: LatencySnapshot,
}

impl SpoolStats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Ordering::Relaxed);
    }

    /// One group commit took `d`.
    pub fn synced(&self, d: Duration) {
        self.sync_latency.record([(d, 1)]);
    }

    /// Marks the spool as configured: the status pages then show it.
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    /// `None` when no spool is configured.
    pub fn snapshot(&self) -> Option<SpoolSnapshot> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Some(SpoolSnapshot {
            bytes: g(&self.bytes),
            segments: g(&self.segments),
            live_segments: g(&self.live_segments),
            appended_records: g(&self.appended_records),
            synced_records: g(&self.synced_records),
            recovered: g(&self.recovered),
            corrupt_bytes: g(&self.corrupt_bytes),
            unreadable_segments: g(&self.unreadable_segments),
            write_errors: g(&self.write_errors),
            sync_errors: g(&self.sync_errors),
            sync_latency: self.sync_latency.snapshot(),
        })
    }
}
