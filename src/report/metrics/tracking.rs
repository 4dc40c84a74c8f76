//! Commit points and delivery latency on the metrics: the hooks the inputs call once per
//! batch and the ack readers and discards once per topic per batch, and what the status
//! pages read. The tracking itself is [`crate::report::commit_points`]; each topic's state
//! lives in its slot of the topic table.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use super::Metrics;
use crate::pipeline::{Msg, TopicId, NO_TOPIC};
use crate::report::commit_points::{LatencySnapshot, Points};

impl Metrics {
    /// Messages (`commit_key` set; any topics, in the order received) enter commit-point
    /// tracking: logged, to be applied to their topics' trackers before anything resolves
    /// or reads one (see [`crate::report::commit_points`], "Cost"). Must be called before
    /// `received` counts them, so that a commit point never covers a message counted as
    /// received. Topic "" is not tracked.
    pub fn track_received_all<'a>(&self, msgs: impl IntoIterator<Item = &'a Msg>) {
        if self.tracking.log_received(msgs, NO_TOPIC) {
            self.settle_tracking();
        }
    }

    /// [`Metrics::track_received_all`] for messages of one topic.
    pub fn track_received<'a>(&self, t: TopicId, msgs: impl Iterator<Item = &'a Msg>) {
        if t != NO_TOPIC {
            self.track_received_all(msgs);
        }
    }

    /// Applies the messages logged as received to their topics' trackers.
    fn settle_tracking(&self) {
        self.tracking.settle(|t| &self.topics.stats(t).delivery);
    }

    /// Messages of topic `t` were acknowledged at `now`: latency, and resolved. (Topic ""
    /// is never delivered: the router discards its messages.)
    pub fn track_delivered(&self, t: TopicId, msgs: &[Msg], now: Instant) {
        if t != NO_TOPIC {
            self.settle_tracking();
            self.tracking
                .delivered(&self.topics.stats(t).delivery, msgs, now);
        }
    }

    /// Messages of topic `t` were discarded: resolved.
    pub fn track_discarded(&self, t: TopicId, msgs: &[Msg]) {
        if t != NO_TOPIC {
            self.settle_tracking();
            self.tracking.resolve(&self.topics.stats(t).delivery, msgs);
        }
    }

    /// Every tracked topic's commit point at `now` and the overall one; `None` when commit
    /// points are off.
    pub fn commit_points(&self, now: Instant) -> Option<Points> {
        if !self.tracking.enabled() {
            return None;
        }
        self.settle_tracking();
        let mut topics = Vec::new();
        let mut bounds = Vec::new();
        for id in 1..self.topics.len() {
            let Ok(id) = TopicId::try_from(id) else { break };
            let s = self.topics.stats(id);
            if let Some((mut p, mut b)) = self.tracking.point(s.name(), &s.delivery, now) {
                // A spooled topic's commit point also stays at or below its synced point:
                // what it covers survives a machine crash (see crate::spool).
                if let Some(synced) = self.synced_point(id) {
                    if p.commit_point.is_some_and(|cp| cp > synced) {
                        p.commit_point = Some(synced);
                        let above = synced.saturating_add(1);
                        b.0 = Some(b.0.map_or(above, |lo| lo.min(above)));
                    }
                }
                topics.push(p);
                bounds.push(b);
            }
        }
        Some(Points::new(topics, bounds))
    }

    /// Failed writes of the commit points state file.
    pub fn commit_points_file_errors(&self) -> &AtomicU64 {
        self.tracking.file_errors()
    }

    /// Receipt → acknowledgement latency of topic `t`'s delivered messages.
    pub fn latency(&self, t: TopicId) -> LatencySnapshot {
        self.topics.stats(t).delivery.latency.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{DiscardReason, MetricsConfig};
    use super::*;
    use crate::pool::Pool;
    use crate::report::discards;

    fn msg(pool: &'static Pool, topic: TopicId, ts: i64, arrival: Instant) -> Msg {
        Msg::for_test(pool, topic, ts, 1, arrival)
    }

    /// Registers an input batch as the input does: per topic.
    fn receive(m: &Metrics, batch: &[Msg]) {
        for t in [NO_TOPIC, 1, 2] {
            m.track_received(t, batch.iter().filter(|x| x.topic == t));
        }
    }

    #[test]
    fn acknowledged_and_discarded_messages_resolve_per_topic() {
        let pool = Pool::new_static(1 << 16).expect("pool");
        let m = Metrics::new(MetricsConfig::default());
        let (a, b) = (m.topic_id(b"a").expect("id"), m.topic_id(b"b").expect("id"));
        let t0 = Instant::now();
        let mut batch = vec![
            msg(pool, a, 100, t0),
            msg(pool, b, 50, t0),
            msg(pool, a, 90, t0),
            msg(pool, NO_TOPIC, 10, t0),
        ];
        receive(&m, &batch);
        let p = m.commit_points(t0 + Duration::from_millis(30)).expect("on");
        assert_eq!(p.topics.len(), 2, "topic \"\" is not tracked: {p:?}");
        assert_eq!(
            (p.topics[0].commit_point, p.topics[0].unresolved),
            (Some(89), 2)
        );
        assert_eq!(p.topics[0].oldest_unacked, Duration::from_millis(30));
        assert_eq!(
            (p.topics[1].commit_point, p.topics[1].unresolved),
            (Some(49), 1)
        );
        assert_eq!((p.overall, p.unresolved), (Some(49), 3));

        let none = batch.pop().expect("the \"\" message");
        discards::discard(&m, vec![none], DiscardReason::BadTopic);
        let b_msgs = vec![batch.remove(1)];
        discards::discard(&m, b_msgs, DiscardReason::KafkaError);
        let p = m.commit_points(t0).expect("on");
        assert_eq!(
            p.topics[1].commit_point,
            Some(50),
            "b resolved by its discard"
        );
        assert_eq!(p.overall, Some(89), "a still holds 90 and 100");

        m.track_delivered(a, &batch, t0 + Duration::from_millis(3));
        let p = m.commit_points(t0).expect("on");
        assert_eq!(p.topics[0].commit_point, Some(100));
        assert_eq!(p.topics[0].oldest_unacked, Duration::ZERO);
        assert_eq!((p.overall, p.unresolved), (Some(100), 0));
        let h = m.latency(a);
        assert_eq!((h.count(), h.cumulative[1]), (2, 0));
        assert_eq!(h.cumulative[2], 2, "3 ms is in the 5 ms bucket");
        assert_eq!(m.latency(b).count(), 0, "discards are not deliveries");
    }

    #[test]
    fn switched_off_tracks_no_commit_points_but_still_latency() {
        let pool = Pool::new_static(1 << 16).expect("pool");
        let m = Metrics::new(MetricsConfig {
            commit_points: false,
            ..MetricsConfig::default()
        });
        let a = m.topic_id(b"a").expect("id");
        let batch = vec![msg(pool, a, 100, Instant::now())];
        receive(&m, &batch);
        assert_eq!(m.commit_points(Instant::now()), None);
        m.track_delivered(a, &batch, Instant::now());
        assert_eq!(m.latency(a).count(), 1);
    }

    /// Two input threads and two ack readers on the same topics at once: nothing is lost or
    /// counted twice, and once all is resolved each commit point is its newest key.
    #[test]
    fn concurrent_inputs_and_ack_readers() {
        let pool = Pool::new_static(4 << 20).expect("pool");
        let m: &'static Metrics = Box::leak(Box::new(Metrics::new(MetricsConfig::default())));
        let topics = [m.topic_id(b"a").expect("id"), m.topic_id(b"b").expect("id")];
        let (tx, rx) = crossbeam_channel::bounded::<Vec<Msg>>(16);
        let inputs: Vec<_> = (0..2i64)
            .map(|i| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for n in 0..200i64 {
                        let at = Instant::now();
                        let batch: Vec<Msg> = (0..16i64)
                            .map(|k| {
                                let t = topics[usize::from(k % 2 == 0)];
                                msg(pool, t, 1_000 + n * 10 + i * 3 + k % 5, at)
                            })
                            .collect();
                        receive(m, &batch);
                        tx.send(batch).expect("ack readers alive");
                    }
                })
            })
            .collect();
        drop(tx);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || {
                    while let Ok(mut batch) = rx.recv() {
                        // One ack per topic: the topic's messages are one slice.
                        batch.sort_by_key(|x| x.topic);
                        let split = batch.partition_point(|x| x.topic == topics[0]);
                        let (first, second) = batch.split_at(split);
                        m.track_delivered(topics[0], first, Instant::now());
                        m.track_delivered(topics[1], second, Instant::now());
                        let _ = m.commit_points(Instant::now());
                    }
                })
            })
            .collect();
        for h in inputs.into_iter().chain(readers) {
            h.join().expect("no panic");
        }
        let p = m.commit_points(Instant::now()).expect("on");
        assert_eq!(p.unresolved, 0);
        let newest = 1_000 + 199 * 10 + 3 + 4;
        assert_eq!(p.overall, Some(newest));
        for (t, id) in p.topics.iter().zip(topics) {
            assert_eq!(m.latency(id).count(), 2 * 200 * 8);
            assert!(t.commit_point >= Some(newest - 4), "{t:?}");
        }
    }
}
