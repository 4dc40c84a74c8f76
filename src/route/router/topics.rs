//! Metadata: scheduling fetches (periodic, on demand, degraded), applying a response to the
//! cluster view and broker addresses, and resolving (or giving up) topic lookups.

use super::{jittered, Router, TopicSlot, BAD_TOPIC_MEMORY, MIN_REFRESH_GAP, TOPIC_LOOKUP_RETRY};
use crate::pipeline::{Batch, FetchRequest, MetaRequest, MetaResponse, TopicId};
use crate::report::metrics::{DiscardReason, QueueState};
use std::sync::Arc;
use std::time::Instant;

impl Router {
    pub(super) fn want_full_fetch(&mut self, at: Instant) {
        let earliest = self
            .last_full_fetch
            .map_or(at, |l| at.max(l + MIN_REFRESH_GAP));
        self.full_fetch_at = Some(self.full_fetch_at.map_or(earliest, |x| x.min(earliest)));
    }

    pub(super) fn start_due_fetches(&mut self) {
        let now = Instant::now();
        if !self.full_fetch_in_flight && self.full_fetch_at.is_some_and(|t| now >= t) {
            let req = MetaRequest {
                topics: None,
                autocreate: false,
                seq: self.full_fetch_seq + 1,
            };
            if self
                .ch
                .to_meta
                .try_send(FetchRequest::Metadata(req))
                .is_ok()
            {
                self.full_fetch_seq += 1;
                self.full_fetch_in_flight = true;
                self.full_fetch_at = None;
                self.last_full_fetch = Some(now);
            }
        }
        if !self.have_metadata {
            return;
        }
        // Topic lookups: with auto-creation, ask for the topics themselves (which asks the
        // broker to create them); without, the next all-topics fetch answers the question.
        let autocreate = self.cfg.delivery.topic_autocreate;
        let answer_seq = self.full_fetch_seq + 1;
        let mut wanted: Vec<Arc<[u8]>> = Vec::new();
        self.prune_lookups();
        for &i in &self.lookups {
            let slot = &mut self.topics[i];
            let Some(l) = slot.lookup.as_mut() else {
                continue;
            };
            if l.next_try.is_none_or(|t| now < t) {
                continue;
            }
            l.next_try = None;
            l.asked_at.get_or_insert(now);
            l.answer_seq = answer_seq;
            let name = slot
                .name
                .get_or_insert_with(|| self.metrics.topic_name(i as TopicId))
                .clone();
            wanted.push(name);
        }
        if wanted.is_empty() {
            return;
        }
        if !autocreate {
            self.want_full_fetch(now);
            return;
        }
        let req = MetaRequest {
            topics: Some(wanted.clone()),
            autocreate: true,
            seq: 0,
        };
        if self
            .ch
            .to_meta
            .try_send(FetchRequest::Metadata(req))
            .is_err()
        {
            // The fetcher is busy: ask again shortly.
            for slot in &mut self.topics {
                if slot.name.as_ref().is_some_and(|n| wanted.contains(n)) {
                    if let Some(l) = slot.lookup.as_mut() {
                        l.next_try = Some(now + TOPIC_LOOKUP_RETRY);
                    }
                }
            }
        }
    }

    pub(super) fn on_metadata(&mut self, resp: MetaResponse) {
        let now = Instant::now();
        let full = resp.request.topics.is_none();
        if full {
            self.full_fetch_in_flight = false;
        }
        let md = match resp.result {
            Ok(md) => md,
            Err(e) => {
                log::warn!("metadata fetch failed: {e}");
                if full {
                    let d = self.fetch_backoff.next_delay();
                    self.full_fetch_at = Some(now + d);
                }
                self.retry_lookups(&resp.request, now);
                return;
            }
        };
        self.fetch_backoff.reset();
        let changed = if full {
            self.cluster.install_full(&md)
        } else {
            self.cluster.install_partial(&md)
        };
        self.metrics
            .metadata_updated(changed || !self.have_metadata);
        if full {
            self.next_periodic_refresh =
                now + jittered(self.cfg.delivery.metadata_refresh_interval, &mut self.rng);
            if !self.have_metadata {
                // /health turns 200 from this (and the inputs being open).
                self.have_metadata = true;
                log::info!(
                    "metadata: {} brokers, {} topics",
                    self.cluster.brokers.len(),
                    self.cluster.topics.len()
                );
            }
        }
        if changed {
            self.update_broker_addresses();
        }
        // While a topic in use has partitions without a usable leader (a broker left,
        // a leader election is under way), look again soon, backing off, so a broker
        // that returns gets its partitions back within seconds, not at the next
        // periodic refresh.
        if full {
            if self.degraded() {
                let d = self.degraded_backoff.next_delay();
                self.next_periodic_refresh = self.next_periodic_refresh.min(now + d);
            } else {
                self.degraded_backoff.reset();
            }
        }
        self.resolve_lookups(&resp.request, now);
        // Everything waiting for fresh metadata goes out again.
        for batch in std::mem::take(&mut self.awaiting_metadata) {
            self.reroute(batch);
        }
        // Backlogs of brokers that are down may now belong elsewhere.
        let down: Vec<i32> = self
            .brokers
            .iter()
            .filter(|(_, b)| !b.up && !b.backlog.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in down {
            let held: Vec<Batch> = self
                .brokers
                .get_mut(&id)
                .map(|b| b.backlog.drain(..).collect())
                .unwrap_or_default();
            for batch in held {
                let leader = self
                    .view(batch.topic)
                    .and_then(|v| v.leader_of(batch.partition));
                if leader == Some(id) {
                    if let Some(b) = self.brokers.get_mut(&id) {
                        b.backlog.push_back(batch);
                    }
                } else {
                    self.reroute(batch);
                }
            }
        }
    }

    /// Whether a topic we route to has partitions that cannot take writes.
    pub(super) fn degraded(&self) -> bool {
        self.topics.iter().any(|slot| {
            slot.name
                .as_ref()
                .and_then(|n| self.cluster.topics.get(n))
                .is_some_and(|v| v.usable.len() < v.partition_count)
        })
    }

    /// A dispatcher's broker changed address: stop it; a new one starts on next use.
    pub(super) fn update_broker_addresses(&mut self) {
        let stale: Vec<i32> = self
            .brokers
            .iter()
            .filter(|(id, b)| {
                self.cluster
                    .brokers
                    .get(id)
                    .is_none_or(|i| i.host != b.handle.host || i.port != b.handle.port)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some(b) = self.brokers.remove(&id) {
                self.broker_changes += 1;
                log::info!("broker {id} left the metadata or moved; stopping its dispatcher");
                for batch in b.backlog {
                    self.awaiting_metadata.push(batch);
                }
                // Dropping the handle closes its channel; the dispatcher returns what it
                // holds as Stopped, which is rerouted.
                b.handle.detach();
            }
        }
    }

    /// Whether `req` asked about the topic in `slot`.
    pub(super) fn asked(req: &MetaRequest, slot: &TopicSlot) -> bool {
        match &req.topics {
            None => slot
                .lookup
                .as_ref()
                .is_some_and(|l| l.answer_seq <= req.seq),
            Some(names) => slot.name.as_ref().is_some_and(|n| names.contains(n)),
        }
    }

    /// A fetch failed: the topics it asked about are asked again shortly.
    pub(super) fn retry_lookups(&mut self, req: &MetaRequest, now: Instant) {
        for slot in &mut self.topics {
            if !Self::asked(req, slot) {
                continue;
            }
            if let Some(l) = slot.lookup.as_mut() {
                if l.asked_at.is_some() && l.next_try.is_none() {
                    l.next_try = Some(now + TOPIC_LOOKUP_RETRY);
                }
            }
        }
    }

    /// After metadata arrived: release held messages of topics now known; discard those
    /// whose topic is definitely unknown; keep asking for topics being created.
    pub(super) fn resolve_lookups(&mut self, req: &MetaRequest, now: Instant) {
        let autocreate = self.cfg.delivery.topic_autocreate;
        let wait = self.cfg.delivery.unknown_topic_wait;
        for i in 0..self.topics.len() {
            if self.topics[i].lookup.is_none() {
                continue;
            }
            let t = i as TopicId;
            if self.view(t).is_some() {
                let lookup = self.topics[i].lookup.take().expect("checked above");
                for m in lookup.msgs {
                    // Through the normal checks (size, availability); `accept` expects
                    // the message in the New state, where it is.
                    self.accept(m, now);
                }
                continue;
            }
            let asked = Self::asked(req, &self.topics[i]);
            let slot = &mut self.topics[i];
            let l = slot.lookup.as_mut().expect("checked above");
            if l.asked_at.is_none() {
                // Held before the first metadata: ask now.
                if l.next_try.is_none() {
                    l.next_try = Some(now);
                }
                continue;
            }
            if !asked {
                continue;
            }
            if autocreate && !l.expired(now, wait) {
                // Being created: brokers answer LEADER_NOT_AVAILABLE or list the topic
                // without leaders for a moment. Keep asking until the wait runs out.
                l.next_try = Some(now + TOPIC_LOOKUP_RETRY);
                continue;
            }
            self.give_up_lookup(i, now);
        }
    }

    /// The topic is unknown (or could not be created): discard what was held for it.
    pub(super) fn give_up_lookup(&mut self, i: usize, now: Instant) {
        let Some(lookup) = self.topics[i].lookup.take() else {
            return;
        };
        self.topics[i].bad_until = Some(now + BAD_TOPIC_MEMORY);
        let reason = if self.cfg.delivery.topic_autocreate {
            DiscardReason::AutocreateFailed
        } else {
            DiscardReason::BadTopic
        };
        let name = self.metrics.topic_name(i as TopicId);
        log::warn!(
            "discarding {} message(s) for unknown topic [{}] ({})",
            lookup.msgs.len(),
            String::from_utf8_lossy(&name),
            reason.as_str()
        );
        self.discard_staged(lookup.msgs, reason, QueueState::New);
    }
}
