//! What dispatchers report back: connection state, finished batches, and returned batches
//! to retry, back off or reroute.

use super::Router;
use crate::config::policy::Partitioner;
use crate::deliver::backoff::retry_delay;
use crate::deliver::idempotence::Mode;
use crate::pipeline::{Batch, Msg, Outcome, ProducerIdError, ReturnReason};
use crate::report::metrics::{DiscardReason, QueueState};
use std::time::{Duration, Instant};

impl Router {
    pub(super) fn on_outcome(&mut self, o: Outcome) {
        match o {
            Outcome::Finished { broker, n } => {
                if let Some(b) = self.brokers.get_mut(&broker) {
                    b.queued = b.queued.saturating_sub(n);
                }
                self.flush_backlog(broker);
            }
            Outcome::Connection { broker, up } => {
                if let Some(b) = self.brokers.get_mut(&broker) {
                    b.up = up;
                    self.broker_changes += 1;
                }
                if up {
                    self.flush_backlog(broker);
                } else {
                    self.unqueue_led_by(broker);
                    self.want_full_fetch(Instant::now());
                }
            }
            Outcome::NoProducerIds { broker, why } => {
                if self.seq.mode() != Mode::Off {
                    self.on_producer_id(Err(ProducerIdError::Unsupported(format!(
                        "broker {broker} {why}"
                    ))));
                }
            }
            Outcome::Acked { acks } => {
                for (k, seq, records) in acks {
                    self.seq.on_ack(k, seq, records);
                }
            }
            Outcome::Returned {
                broker,
                reason,
                batches,
            } => {
                for batch in batches {
                    if batch.seq.is_some() {
                        self.on_returned_sealed(reason, batch);
                    } else {
                        self.on_returned(reason, batch);
                    }
                }
                self.flush_backlog(broker);
            }
        }
    }

    pub(super) fn on_returned(&mut self, reason: ReturnReason, mut batch: Batch) {
        let now = Instant::now();
        if self.shutdown.is_some_and(|d| now >= d) {
            self.discard_batch(batch, DiscardReason::Shutdown);
            return;
        }
        if batch.msgs.iter().any(|m| m.maybe_sent) {
            let (dups, rest): (Vec<Msg>, Vec<Msg>) =
                batch.msgs.into_iter().partition(|m| m.maybe_sent);
            crate::report::discards::possible_duplicates(self.metrics, &dups);
            batch.msgs = rest;
            batch.msgs.extend(dups.into_iter().map(|mut m| {
                m.maybe_sent = false;
                m
            }));
        }
        match reason {
            ReturnReason::Retry | ReturnReason::Rejected { .. } => self.dispatch(batch),
            ReturnReason::Backoff => {
                let d = self.backoff_for(&batch);
                self.delayed.push((now + d, batch));
            }
            ReturnReason::Reroute | ReturnReason::ConnectionLost | ReturnReason::Stopped => {
                self.awaiting_metadata.push(batch);
                self.want_full_fetch(now);
            }
        }
    }

    /// How long a batch waits before it is resent after a transient broker error: the
    /// randomized exponential backoff for its most-tried message.
    pub(super) fn backoff_for(&mut self, batch: &Batch) -> Duration {
        let attempts = batch
            .msgs
            .iter()
            .map(|m| m.failed_attempts)
            .max()
            .unwrap_or(1);
        retry_delay(
            attempts,
            self.cfg.delivery.retry_backoff,
            self.cfg.delivery.retry_backoff_max,
            &mut self.rng,
        )
    }

    /// Routes a returned batch again under the current metadata: AnyPartition messages to
    /// a fresh round-robin choice, PartitionKey messages by their key.
    pub(super) fn reroute(&mut self, batch: Batch) {
        if batch.seq.is_some() {
            // Sealed: its sequence belongs to its partition; only the leader may change.
            return self.reroute_sealed(batch);
        }
        let t = batch.topic;
        match self.view(t).map(|v| v.has_usable()) {
            None => {
                self.discard_batch(batch, DiscardReason::BadTopic);
                return;
            }
            Some(false) => {
                self.discard_batch(batch, DiscardReason::NoAvailablePartitions);
                return;
            }
            Some(true) => {}
        }
        let policy = self.policy(t);
        let mut any = Vec::new();
        let mut keyed: Vec<(i32, Vec<Msg>)> = Vec::new();
        for m in batch.msgs {
            let keyed_by = m.partition_key.is_some()
                || (policy.partitioner == Partitioner::Murmur2 && m.key_len() > 0);
            if !keyed_by {
                any.push(m);
                continue;
            }
            let p = self
                .keyed_partition(t, &m, &policy)
                .unwrap_or(batch.partition);
            match keyed.iter_mut().find(|(q, _)| *q == p) {
                Some((_, v)) => v.push(m),
                None => keyed.push((p, vec![m])),
            }
        }
        if !any.is_empty() {
            match self.round_robin(t) {
                Some(p) => self.send_new(Batch::new(t, p, any)),
                None => self.discard_staged(
                    any,
                    DiscardReason::NoAvailablePartitions,
                    QueueState::SendWait,
                ),
            }
        }
        for (p, msgs) in keyed {
            self.send_new(Batch::new(t, p, msgs));
        }
    }
}
