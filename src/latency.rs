//! A latency histogram with fixed buckets, shown as a Prometheus histogram: receipt →
//! acknowledgement per topic (commit points, updated once per acknowledged batch) and the
//! spool's group commits. Imports nothing of dory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

    /// Adds `other`'s observations (one histogram over both).
    pub fn merge(&mut self, other: &LatencySnapshot) {
        for (a, b) in self.cumulative.iter_mut().zip(other.cumulative) {
            *a = a.saturating_add(b);
        }
        self.sum = self.sum.saturating_add(other.sum);
    }
}

impl LatencyHistogram {
    /// Records one batch: `(latency, how many messages had it)` pairs. A batch's latencies
    /// mostly share a bucket, so each run of equal buckets is one atomic add (a batch
    /// costs two adds, not a pass over every bucket: with thousands of topics this runs
    /// once per small batch).
    pub fn record(&self, latencies: impl IntoIterator<Item = (Duration, u64)>) {
        // (bucket, messages) of the current run; no bucket before the first pair.
        let mut run = (BUCKETS, 0u64);
        let mut sum = 0u64;
        for (l, n) in latencies {
            let b = bucket(l);
            if b != run.0 {
                self.add_run(run);
                run = (b, 0);
            }
            run.1 += n;
            let micros = u64::try_from(l.as_micros()).unwrap_or(u64::MAX);
            sum = sum.saturating_add(micros.saturating_mul(n));
        }
        self.add_run(run);
        if sum > 0 {
            self.sum_micros.fetch_add(sum, Ordering::Relaxed);
        }
    }

    /// Adds `n` messages to bucket `b` (nothing for an empty run).
    fn add_run(&self, (b, n): (usize, u64)) {
        if n > 0 {
            self.counts[b].fetch_add(n, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_le_bounds() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_millis(1)), 0);
        assert_eq!(bucket(Duration::from_micros(1_001)), 1);
        assert_eq!(bucket(Duration::from_secs(60)), 14);
        assert_eq!(bucket(Duration::from_secs(61)), 15);
        let h = LatencyHistogram::default();
        h.record([
            (Duration::from_micros(500), 1),
            (Duration::from_millis(3), 2),
            (Duration::from_secs(100), 1),
        ]);
        let s = h.snapshot();
        assert_eq!(s.count(), 4);
        assert_eq!(&s.cumulative[..4], &[1, 1, 3, 3]);
        assert_eq!(s.cumulative[14], 3);
        assert_eq!(s.sum, Duration::from_micros(500 + 6_000 + 100_000_000));
    }

    #[test]
    fn runs_of_one_bucket_and_empty_pairs_are_counted_once_each() {
        let h = LatencyHistogram::default();
        let ms = Duration::from_millis;
        h.record([(ms(2), 1), (ms(2), 3), (ms(0), 2), (ms(2), 1), (ms(40), 0)]);
        h.record([]);
        h.record([(ms(40), 0)]);
        let s = h.snapshot();
        assert_eq!(s.count(), 7);
        assert_eq!(
            &s.cumulative[..5],
            &[2, 7, 7, 7, 7],
            "2 at <= 1 ms, 5 at <= 2.5 ms"
        );
        assert_eq!(s.sum, ms(10));
    }
}
