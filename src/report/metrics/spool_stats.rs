//! The durable spool on the metrics: the spool's own figures ([`SpoolStats`], written by
//! the spool through [`SpoolReport`], read by the status pages), and the per-topic values
//! (recovered messages, the synced point), which live in the topic table.

use std::sync::atomic::Ordering;

use super::Metrics;
use crate::pipeline::TopicId;
use crate::spool::{SpoolReport, SpoolSnapshot, SpoolStats};

/// "No synced point yet" in a topic's atomic.
pub(super) const NO_POINT: i64 = i64::MIN;

impl Metrics {
    /// The spool's values, to update (the spool role) or read.
    pub fn spool(&self) -> &SpoolStats {
        &self.spool
    }

    /// Marks the spool as configured: the status pages then show it.
    pub fn enable_spool(&self) {
        self.spool.enable();
    }

    /// `None` when no spool is configured.
    pub fn spool_snapshot(&self) -> Option<SpoolSnapshot> {
        self.spool.snapshot()
    }

    /// `n` messages of topic `t` were replayed from the spool at start.
    pub fn recovered(&self, t: TopicId, n: u64) {
        self.topics
            .stats(t)
            .recovered
            .fetch_add(n, Ordering::Relaxed);
        SpoolStats::add(&self.spool.recovered, n);
    }

    /// Topic `t` goes through the spool: its commit point is capped by its synced point.
    pub fn set_spooled(&self, t: TopicId) {
        self.topics.stats(t).spooled.store(true, Ordering::Relaxed);
    }

    /// Sets topic `t`'s synced point: every message of it with a tracking key ≤ `point`
    /// that was received is on disk (or was received before the spool was on for it).
    pub fn set_synced_point(&self, t: TopicId, point: i64) {
        self.topics
            .stats(t)
            .synced_point
            .store(point, Ordering::Release);
    }

    /// Topic `t`'s synced point, if it is spooled and has one.
    pub fn synced_point(&self, t: TopicId) -> Option<i64> {
        let s = self.topics.stats(t);
        if !s.spooled.load(Ordering::Relaxed) {
            return None;
        }
        Some(s.synced_point.load(Ordering::Acquire)).filter(|&p| p != NO_POINT)
    }

    /// Per spooled topic: (name, recovered, synced point), sorted by name.
    pub fn spool_topics(&self) -> Vec<(std::sync::Arc<[u8]>, u64, Option<i64>)> {
        let mut out = Vec::new();
        for id in 1..self.topics.len() {
            let Ok(id) = TopicId::try_from(id) else { break };
            let s = self.topics.stats(id);
            let recovered = s.recovered.load(Ordering::Relaxed);
            if s.spooled.load(Ordering::Relaxed) || recovered > 0 {
                out.push((s.name(), recovered, self.synced_point(id)));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

impl SpoolReport for Metrics {
    fn spool_stats(&self) -> &SpoolStats {
        &self.spool
    }

    fn set_synced_point(&self, topic: TopicId, point: i64) {
        Metrics::set_synced_point(self, topic, point);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::MetricsConfig;
    use super::*;
    use crate::pipeline::Msg;
    use crate::pool::Pool;

    #[test]
    fn a_spooled_topics_commit_point_is_capped_by_its_synced_point() {
        let pool = Pool::new_static(1 << 16).expect("pool");
        let m = Metrics::new(MetricsConfig::default());
        let (a, b) = (m.topic_id(b"a").expect("id"), m.topic_id(b"b").expect("id"));
        let now = Instant::now();
        for t in [a, b] {
            let batch: Vec<Msg> = (100..110)
                .map(|ts| Msg::for_test(pool, t, ts, 1, now))
                .collect();
            m.track_received(t, batch.iter());
            m.track_delivered(t, &batch, now);
        }
        // Not spooled: a synced point is ignored.
        m.set_synced_point(a, 104);
        assert_eq!(m.synced_point(a), None);
        let p = m.commit_points(now).expect("on");
        assert_eq!(
            (p.topics[0].commit_point, p.overall),
            (Some(109), Some(109))
        );
        m.set_spooled(a);
        assert_eq!(m.synced_point(a), Some(104));
        let p = m.commit_points(now).expect("on");
        assert_eq!(
            p.topics[0].commit_point,
            Some(104),
            "acknowledged, not yet synced"
        );
        assert_eq!(
            p.topics[1].commit_point,
            Some(109),
            "topic b is not spooled"
        );
        assert_eq!(p.overall, Some(104));
        m.set_synced_point(a, 200);
        let p = m.commit_points(now).expect("on");
        assert_eq!(p.topics[0].commit_point, Some(109), "synced beyond: no cap");
        assert_eq!(
            m.spool_snapshot().map(|s| s.bytes),
            None,
            "no spool configured"
        );
        m.enable_spool();
        m.recovered(a, 3);
        assert_eq!(m.spool_snapshot().map(|s| s.recovered), Some(3));
        assert_eq!(m.spool_topics()[0].1, 3);
    }
}
