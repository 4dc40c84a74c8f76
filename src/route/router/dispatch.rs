//! Completed batches to dispatchers: choosing the partition of an AnyPartition batch
//! (round-robin), handing a batch to its leader's dispatcher, and the per-broker backlog
//! that absorbs a full dispatcher queue.

use super::{BatchKey, Broker, Router};
use crate::deliver::dispatcher;
use crate::pipeline::{Batch, Msg, TopicId, DISPATCH_CHANNEL_CAP};
use crate::report::metrics::{DiscardReason, QueueState};
use crate::route::batcher::OpenBatch;
use crossbeam_channel::TrySendError;
use std::collections::VecDeque;
use std::time::Instant;

impl Router {
    /// A completed batch: choose the partition (AnyPartition) and send it to its leader.
    pub(super) fn emit(&mut self, key: BatchKey, msgs: Vec<Msg>) {
        let (t, partition) = key;
        let n = msgs.len() as i64;
        self.metrics.queue_add(t, QueueState::Batch, -n);
        let partition = match partition {
            Some(p) => Some(p),
            None => self.round_robin(t),
        };
        match partition {
            Some(p) => {
                self.metrics.queue_add(t, QueueState::SendWait, n);
                self.send_new(Batch::new(t, p, msgs));
            }
            None => self.discard_msgs(msgs, DiscardReason::NoAvailablePartitions),
        }
    }

    pub(super) fn round_robin(&mut self, t: TopicId) -> Option<i32> {
        self.view(t)?;
        let brokers = &self.brokers;
        let slot = &mut self.topics[t as usize];
        let view = slot.view.as_ref()?;
        view.next_round_robin(&mut slot.rr, |b| brokers.get(&b).is_none_or(|x| x.up))
    }

    /// Sends a batch (already counted as SendWait) to its partition's leader, or holds it.
    pub(super) fn dispatch(&mut self, batch: Batch) {
        let leader = self
            .view(batch.topic)
            .and_then(|v| v.leader_of(batch.partition));
        let Some(leader) = leader else {
            if batch.seq.is_some() {
                // Sealed: it belongs to this partition; wait for its leader.
                return self.hold_sealed(batch);
            }
            // The partition vanished: route it again with fresh metadata.
            self.awaiting_metadata.push(batch);
            self.want_full_fetch(Instant::now());
            return;
        };
        if !self.brokers.contains_key(&leader) {
            let Some(info) = self.cluster.brokers.get(&leader).cloned() else {
                if batch.seq.is_some() {
                    return self.hold_sealed(batch);
                }
                self.awaiting_metadata.push(batch);
                self.want_full_fetch(Instant::now());
                return;
            };
            let handle = dispatcher::spawn(
                leader,
                info.host,
                info.port,
                self.dcfg.clone(),
                self.metrics,
                self.ch.to_router.clone(),
            );
            self.broker_changes += 1;
            self.brokers.insert(
                leader,
                Broker {
                    handle,
                    up: true,
                    queued: 0,
                    backlog: VecDeque::new(),
                },
            );
            self.publish_brokers();
        }
        let b = self.brokers.get_mut(&leader).expect("inserted above");
        if !b.up || !b.backlog.is_empty() || b.queued >= DISPATCH_CHANNEL_CAP {
            b.backlog.push_back(batch);
            return;
        }
        match b.handle.try_send(batch) {
            Ok(()) => b.queued += 1,
            Err(TrySendError::Full(batch)) => b.backlog.push_back(batch),
            Err(TrySendError::Disconnected(batch)) => {
                // The dispatcher thread ended (it only does so when told to stop).
                log::error!("dispatcher for broker {leader} is gone; rerouting");
                self.brokers.remove(&leader);
                self.broker_changes += 1;
                if batch.seq.is_some() {
                    return self.hold_sealed(batch);
                }
                self.awaiting_metadata.push(batch);
                self.want_full_fetch(Instant::now());
            }
        }
    }

    pub(super) fn flush_backlog(&mut self, broker: i32) {
        let Some(b) = self.brokers.get_mut(&broker) else {
            return;
        };
        while b.up && b.queued < DISPATCH_CHANNEL_CAP {
            let Some(batch) = b.backlog.pop_front() else {
                break;
            };
            match b.handle.try_send(batch) {
                Ok(()) => b.queued += 1,
                Err(TrySendError::Full(batch)) | Err(TrySendError::Disconnected(batch)) => {
                    b.backlog.push_front(batch);
                    break;
                }
            }
        }
    }

    pub(super) fn flush_all_batches(&mut self) {
        for key in self.open_batch_keys() {
            if let Some(msgs) = self.open_batch_if_any(key).map(OpenBatch::take) {
                self.emit(key, msgs);
            }
        }
        let brokers: Vec<i32> = self.combined.keys().copied().collect();
        for b in brokers {
            let msgs = self.combined.get_mut(&b).map(OpenBatch::take);
            if let Some(msgs) = msgs.filter(|m| !m.is_empty()) {
                self.emit_combined(b, msgs);
            }
        }
        self.expiries.clear();
        self.next_batch_expiry = None;
    }
}
