//! The idempotent producer in the router: new batches go through the sequencer, which
//! seals them (producer id, epoch, sequence) and releases them in order, at most five per
//! partition unacknowledged; producer ids are asked of the fetcher; and a sealed batch that
//! comes back is resent in order, renumbered after a gap, or waits for a new epoch (see
//! [`crate::deliver::idempotence`] and doc/errors.md).

use super::Router;
use crate::deliver::idempotence::{Mode, Sealable};
use crate::kafka::errors::{classify, error_name, sequence_action, ErrorAction, SequenceAction};
use crate::pipeline::{
    count_failed_attempt, Batch, FetchRequest, IdRequest, PartKey, ProducerIdError, ReturnReason,
};
use crate::report::discards;
use crate::report::metrics::{Counter, DiscardReason, Idempotence, QueueState};
use std::time::{Duration, Instant};

/// Pause before asking again when the fetcher's queue was full.
const ID_REQUEST_RETRY: Duration = Duration::from_millis(50);
/// Longest a partition stays parked as unsendable without being looked at again.
const SEQ_UNPARK_MAX: Duration = Duration::from_secs(1);

impl Router {
    /// A new batch (counted as SendWait) for its partition: with idempotence it is sealed
    /// and sent at once if its partition may send now, or waits in the sequencer for its
    /// turn; without, it goes to the leader at once.
    pub(super) fn send_new(&mut self, batch: Batch) {
        if self.seq.mode() == Mode::Off {
            return self.dispatch(batch);
        }
        let sendable = self.leader_sendable(batch.part());
        if let Some(sealed) = self.seq.submit_or_seal(batch, sendable) {
            self.dispatch(sealed);
        }
    }

    /// Whether a partition may send: its leader is known and not known to be down.
    fn leader_sendable(&mut self, k: PartKey) -> bool {
        let leader = self.view(k.0).and_then(|v| v.leader_of(k.1));
        leader.is_some_and(|l| self.brokers.get(&l).is_none_or(|b| b.up))
    }

    /// Hands the batches the sequencer releases, sealed, to their leaders' dispatchers.
    pub(super) fn pump_sequence(&mut self) {
        if matches!(self.seq.mode(), Mode::Off) || self.seq.idle() {
            // Nothing dirty and nothing parked (the common case, batches sealing at once):
            // not even the clock is read.
            return;
        }
        // Partitions parked as unsendable are looked at again when leaders or brokers
        // changed, and at least every SEQ_UNPARK_MAX (in case a change went unseen).
        let now = Instant::now();
        let view = (self.cluster.generation, self.broker_changes);
        if view != self.seq_unparked.0
            || now.saturating_duration_since(self.seq_unparked.1) >= SEQ_UNPARK_MAX
        {
            self.seq.unpark_all();
            self.seq_unparked = (view, now);
        }
        // A partition may send when its leader is known and not known to be down.
        let mut dirty = std::mem::take(&mut self.dirty_scan);
        dirty.clear();
        dirty.extend(self.seq.dirty_parts());
        if dirty.is_empty() {
            self.dirty_scan = dirty;
            return;
        }
        let mut sendable = std::mem::take(&mut self.sendable);
        sendable.clear();
        for &k in &dirty {
            if self.leader_sendable(k) {
                sendable.insert(k, ());
            }
        }
        let mut out = std::mem::take(&mut self.sealed);
        self.seq.ready(now, |k| sendable.contains_key(&k), &mut out);
        self.sendable = sendable;
        self.dirty_scan = dirty;
        for b in out.drain(..) {
            self.dispatch(b);
        }
        self.sealed = out;
    }

    /// A sealed batch to route again once metadata is fresh. It stays in flight for the
    /// sequencer meanwhile, so its partition sends nothing before it but what was already
    /// out; [`Router::reroute_sealed`] decides when the metadata comes.
    fn await_metadata_sealed(&mut self, batch: Batch, now: Instant) {
        self.awaiting_metadata.push(batch);
        self.want_full_fetch(now);
    }

    /// A sealed batch under fresh metadata: its topic is gone (discarded as `bad_topic`,
    /// leaving a gap the partition is renumbered over), or it waits in the sequencer for
    /// its partition's leader.
    pub(super) fn reroute_sealed(&mut self, batch: Batch) {
        let k = batch.part();
        self.seq.on_back(k);
        if self.view(k.0).is_none() {
            let seq = batch.seq;
            self.discard_batch(batch, DiscardReason::BadTopic);
            if let Some(seq) = seq {
                self.metrics.inc(Counter::SequenceRewind);
                self.seq.lost(k, seq);
            }
            return;
        }
        self.seq.hold(batch, None, false);
    }

    /// A sealed batch that cannot go to a dispatcher now: back to the sequencer.
    pub(super) fn hold_sealed(&mut self, batch: Batch) {
        self.seq.on_back(batch.part());
        self.seq.hold(batch, None, false);
        self.want_full_fetch(Instant::now());
    }

    /// Batches not sealed yet whose partition is led by `broker` (just lost): routed again
    /// like any returned batch, so AnyPartition messages can go to another partition.
    pub(super) fn unqueue_led_by(&mut self, broker: i32) {
        for k in self.seq.queued_parts() {
            let led = self.view(k.0).and_then(|v| v.leader_of(k.1)) == Some(broker);
            if led {
                let batches = self.seq.take_queued(k);
                self.awaiting_metadata.extend(batches);
            }
        }
    }

    /// Asks the fetcher for a producer id when the sequencer needs one.
    pub(super) fn request_producer_id(&mut self) {
        let now = Instant::now();
        if self.id_retry_at.is_some_and(|t| now < t) {
            return;
        }
        let resetting = matches!(self.seq.mode(), Mode::Resetting { .. });
        let Some(req) = self.seq.id_request_due() else {
            return;
        };
        if resetting {
            self.metrics.inc(match req {
                IdRequest::Bump { .. } => Counter::ProducerEpochBumpRequested,
                IdRequest::Fresh => Counter::ProducerIdResetRequested,
            });
            self.metrics.set_idempotence(Idempotence::Resetting, -1, -1);
        }
        if self
            .ch
            .to_meta
            .try_send(FetchRequest::ProducerId(req))
            .is_err()
        {
            self.seq.id_request_failed();
            self.id_retry_at = Some(now + ID_REQUEST_RETRY);
        }
    }

    /// The fetcher's answer to InitProducerId.
    pub(super) fn on_producer_id(&mut self, result: Result<(i64, i16), ProducerIdError>) {
        let metrics = self.metrics;
        match result {
            // An answer to a request sent before idempotence fell back (a broker without
            // producer ids joined): it stays off.
            Ok(_) if self.seq.mode() == Mode::Off => {}
            Ok((id, epoch)) => {
                self.id_backoff.reset();
                self.id_retry_at = None;
                self.id_failures = 0;
                let reset = matches!(self.seq.mode(), Mode::Resetting { .. });
                self.seq.producer_ready(id, epoch, |b| {
                    // Out under the old identity on a lost connection: the broker cannot
                    // recognise the resend under the new one.
                    discards::possible_duplicates(metrics, &b.msgs);
                });
                metrics.inc(Counter::ProducerIdReceived);
                metrics.set_idempotence(Idempotence::On, id, epoch);
                log::info!(
                    "idempotent producer: id {id}, epoch {epoch}{}",
                    if reset { " (after a reset)" } else { "" }
                );
            }
            Err(ProducerIdError::Unsupported(e)) => {
                log::warn!(
                    "idempotence off: {e}; delivering without producer ids, so a resend after a lost connection may duplicate (counted as possible duplicates)"
                );
                metrics.inc(Counter::IdempotenceFallback);
                metrics.set_idempotence(Idempotence::Unsupported, -1, -1);
                let mut out = Vec::new();
                self.seq.disable(&mut out, |b| {
                    discards::possible_duplicates(metrics, &b.msgs)
                });
                for b in out {
                    self.dispatch(b);
                }
            }
            Err(ProducerIdError::Transient(e)) => {
                self.id_failures += 1;
                if self.id_failures == 1 || self.id_failures % 20 == 0 {
                    log::warn!(
                        "no producer id yet (attempt {}): {e}; batches wait",
                        self.id_failures
                    );
                }
                self.seq.id_request_failed();
                self.id_retry_at = Some(Instant::now() + self.id_backoff.next_delay());
            }
        }
    }

    /// A sealed batch came back unacknowledged: resend it in order, renumber its partition
    /// after discarding it, or get a new epoch first (doc/errors.md).
    pub(super) fn on_returned_sealed(&mut self, reason: ReturnReason, mut batch: Batch) {
        let now = Instant::now();
        let k = batch.part();
        let Some(mut seq) = batch.seq else {
            return self.on_returned(reason, batch);
        };
        if self.shutdown.is_some_and(|d| now >= d) {
            self.seq.on_back(k);
            self.discard_batch(batch, DiscardReason::Shutdown);
            return;
        }
        if self.seq.mode() == Mode::Off {
            self.seq.on_back(k);
            batch.seq = None;
            return self.on_returned(reason, batch);
        }
        // In doubt (out on a connection lost before the answer, or answered after the
        // append): the broker may have it, and will recognise the resend under the same
        // sequence, so it is no possible duplicate (counted apart, for brokers that do not
        // deduplicate).
        if batch.msgs.iter().any(|m| m.maybe_sent) {
            seq.uncertain = true;
            batch.seq = Some(seq);
            self.metrics.resent_in_doubt(k.0, batch.msgs.len() as u64);
        }
        for m in &mut batch.msgs {
            m.maybe_sent = false;
        }
        let code = match reason {
            ReturnReason::Rejected { code } => code,
            ReturnReason::Reroute | ReturnReason::ConnectionLost | ReturnReason::Stopped => {
                return self.await_metadata_sealed(batch, now);
            }
            ReturnReason::Retry | ReturnReason::Backoff => {
                self.seq.on_back(k);
                self.seq.hold(batch, None, false);
                return;
            }
        };
        let name = self.metrics.topic_name(k.0);
        let topic = String::from_utf8_lossy(&name).into_owned();
        if let Some(action) = sequence_action(code) {
            self.seq.on_back(k);
            match action {
                SequenceAction::AlreadyWritten => {}
                SequenceAction::OutOfOrder => {
                    self.metrics.inc(Counter::AckOutOfOrderSequence);
                    if self.seq.is_first_unacked(k, seq) {
                        log::warn!(
                            "topic [{topic}] partition {}: the broker lost our sequence (OUT_OF_ORDER_SEQUENCE_NUMBER at {}); bumping the epoch",
                            k.1, seq.base
                        );
                        self.seq.request_reset(false);
                    }
                }
                SequenceAction::BumpEpoch | SequenceAction::NewProducerId => {
                    let fresh = action == SequenceAction::NewProducerId;
                    log::warn!(
                        "topic [{topic}] partition {}: {} ({code}); {}",
                        k.1,
                        error_name(code),
                        if fresh {
                            "getting a new producer id"
                        } else {
                            "bumping the epoch"
                        }
                    );
                    self.seq.request_reset(fresh);
                }
            }
            self.seq.hold(batch, None, false);
            return;
        }
        let action = classify(code);
        if action == ErrorAction::Discard {
            log::error!(
                "discarding {} message(s) of topic [{topic}] partition {}: {} ({code})",
                batch.msgs.len(),
                k.1,
                error_name(code)
            );
            self.seq.on_back(k);
            self.discard_batch(batch, DiscardReason::KafkaError);
            self.metrics.inc(Counter::SequenceRewind);
            self.seq.lost(k, seq);
            return;
        }
        let max = self.cfg.delivery.max_failed_delivery_attempts;
        let (keep, over) = count_failed_attempt(std::mem::take(&mut batch.msgs), max);
        batch.msgs = keep;
        if over.is_empty() && action == ErrorAction::RefreshAndReroute {
            // Wait for fresh metadata: the leader moved, or the topic is gone.
            return self.await_metadata_sealed(batch, now);
        }
        self.seq.on_back(k);
        if !over.is_empty() {
            log::error!(
                "discarding {} message(s) of topic [{topic}] after {} failed attempts (last error {})",
                over.len(),
                max + 1,
                error_name(code)
            );
            if seq.uncertain {
                // Discarded, yet perhaps stored: counted as possibly delivered too.
                discards::possible_duplicates(self.metrics, &over);
            }
            self.discard_staged(over, DiscardReason::AttemptLimit, QueueState::SendWait);
            // A gap in the sequence: what follows is numbered again from it.
            self.metrics.inc(Counter::SequenceRewind);
            self.seq.lost(k, seq);
        }
        if batch.msgs.is_empty() {
            return;
        }
        let not_before = (action == ErrorAction::Backoff).then(|| now + self.backoff_for(&batch));
        self.seq.hold(batch, not_before, false);
    }
}
