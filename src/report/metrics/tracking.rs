//! Commit points and delivery latency on the metrics: the hooks the inputs, ack readers and
//! discards call once per topic per batch, and what the status pages read. The tracking
//! itself is [`crate::report::commit_points`]; each topic's state lives in its slot of the
//! topic table.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use super::{Metrics, TopicId, NO_TOPIC};
use crate::pipeline::Msg;
use crate::report::commit_points::{LatencySnapshot, Points};

impl Metrics {
    /// Messages of topic `t` (one input batch's share, `commit_key` set) enter commit-point
    /// tracking. Must be called before `received` counts them, so that a commit point never
    /// covers a message counted as received. Topic "" is not tracked.
    pub fn track_received<'a>(&self, t: TopicId, msgs: impl Iterator<Item = &'a Msg>) {
        if t != NO_TOPIC {
            self.tracking.receive(&self.topics.stats(t).delivery, msgs);
        }
    }

    /// Messages of topic `t` were acknowledged at `now`: latency, and resolved.
    pub fn track_delivered(&self, t: TopicId, msgs: &[Msg], now: Instant) {
        let cell = &self.topics.stats(t).delivery;
        if t == NO_TOPIC {
            cell.latency.record(
                msgs.iter()
                    .map(|m| now.saturating_duration_since(m.arrival)),
            );
        } else {
            self.tracking.delivered(cell, msgs, now);
        }
    }

    /// Messages of topic `t` were discarded: resolved.
    pub fn track_discarded(&self, t: TopicId, msgs: &[Msg]) {
        if t != NO_TOPIC {
            self.tracking.resolve(&self.topics.stats(t).delivery, msgs);
        }
    }

    /// Every tracked topic's commit point at `now` and the overall one; `None` when commit
    /// points are off.
    pub fn commit_points(&self, now: Instant) -> Option<Points> {
        if !self.tracking.enabled() {
            return None;
        }
        let mut topics = Vec::new();
        let mut bounds = Vec::new();
        for id in 1..self.topics.len() {
            let Ok(id) = TopicId::try_from(id) else { break };
            let s = self.topics.stats(id);
            if let Some((p, b)) = self.tracking.point(s.name(), &s.delivery, now) {
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
