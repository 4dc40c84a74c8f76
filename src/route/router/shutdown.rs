//! Shutdown: knowing when everything is delivered, discarding what is still held at the
//! deadline, and stopping the dispatchers.

use super::{Broker, Router, DISPATCHER_JOIN_GRACE, SHUTDOWN_TICK};
use crate::pipeline::{Batch, Outcome};
use crate::report::metrics::{DiscardReason, QueueState};
use crate::route::batcher::OpenBatch;
use std::time::Instant;

impl Router {
    pub(super) fn shutdown_finished(&mut self) -> bool {
        let Some(deadline) = self.shutdown else {
            return false;
        };
        if self.inputs_open {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        // Done when nothing is in flight anywhere (counted by the metrics).
        self.metrics.total_in_flight() == 0
    }

    /// Past the deadline: everything the router holds is discarded as `shutdown`.
    pub(super) fn discard_everything_held(&mut self) {
        for key in self.open_batch_keys() {
            if let Some(msgs) = self.open_batch_if_any(key).map(OpenBatch::take) {
                self.discard_staged(msgs, DiscardReason::Shutdown, QueueState::Batch);
            }
        }
        for b in self.combined.keys().copied().collect::<Vec<_>>() {
            if let Some(msgs) = self.combined.get_mut(&b).map(OpenBatch::take) {
                self.discard_staged(msgs, DiscardReason::Shutdown, QueueState::Batch);
            }
        }
        for i in 0..self.topics.len() {
            if let Some(l) = self.topics[i].lookup.take() {
                self.discard_staged(l.msgs, DiscardReason::Shutdown, QueueState::New);
            }
        }
        for (_, b) in std::mem::take(&mut self.delayed) {
            self.discard_batch(b, DiscardReason::Shutdown);
        }
        for b in std::mem::take(&mut self.awaiting_metadata) {
            self.discard_batch(b, DiscardReason::Shutdown);
        }
        let mut sequenced = Vec::new();
        self.seq.drain(&mut sequenced);
        for b in sequenced {
            self.discard_batch(b, DiscardReason::Shutdown);
        }
        let backlogs: Vec<Batch> = self
            .brokers
            .values_mut()
            .flat_map(|b| b.backlog.drain(..))
            .collect();
        for b in backlogs {
            self.discard_batch(b, DiscardReason::Shutdown);
        }
    }

    /// Stops every dispatcher: closes their queues, aborts their connections if the
    /// deadline has passed, and takes back (and discards) what they return.
    pub(super) fn stop_dispatchers(&mut self) {
        let deadline = self.shutdown.unwrap_or_else(Instant::now);
        let brokers: Vec<Broker> = self.brokers.drain().map(|(_, b)| b).collect();
        let mut handles = Vec::new();
        for b in brokers {
            for batch in b.backlog {
                self.discard_batch(batch, DiscardReason::Shutdown);
            }
            handles.push(b.handle.close());
        }
        loop {
            let now = Instant::now();
            if now >= deadline {
                for h in &handles {
                    h.abort();
                }
            }
            while let Ok(o) = self.ch.from_dispatchers.try_recv() {
                if let Outcome::Returned { batches, .. } = o {
                    for b in batches {
                        self.discard_batch(b, DiscardReason::Shutdown);
                    }
                }
            }
            if handles.iter().all(|h| h.is_finished()) {
                break;
            }
            if now >= deadline + DISPATCHER_JOIN_GRACE {
                log::error!("dispatchers did not stop in time; leaving them");
                break;
            }
            if let Ok(Outcome::Returned { batches, .. }) =
                self.ch.from_dispatchers.recv_timeout(SHUTDOWN_TICK)
            {
                for b in batches {
                    self.discard_batch(b, DiscardReason::Shutdown);
                }
            }
        }
        for h in handles {
            h.join();
        }
        while let Ok(o) = self.ch.from_dispatchers.try_recv() {
            if let Outcome::Returned { batches, .. } = o {
                for b in batches {
                    self.discard_batch(b, DiscardReason::Shutdown);
                }
            }
        }
        self.discard_everything_held();
        let left = self.metrics.total_in_flight();
        if left != 0 {
            log::error!("{left} message(s) still counted in flight at exit");
        }
    }
}
