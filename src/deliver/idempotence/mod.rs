//! Idempotent delivery (KIP-98, KIP-360): the producer id and epoch, each partition's
//! sequence numbers, and the per-partition send window that keeps them valid across
//! retries, reroutes and lost connections.
//!
//! Pure state, no threads or sockets. The router owns one [`Sequencer`]: it submits each
//! completed batch, asks [`Sequencer::ready`] which batches may go out (sealing new ones
//! with the next sequence numbers), and reports what comes back. The rules:
//!
//! - A batch is *sealed* (producer id, epoch, base sequence) when it first leaves the
//!   router, and keeps that identity through every resend, to whichever broker leads its
//!   partition then, so the broker can recognise a resend of what it already wrote.
//! - At most [`MAX_IN_FLIGHT_PER_PARTITION`] sealed batches of a partition are out at once
//!   (the broker remembers the last five per producer and partition).
//! - When a sealed batch comes back unacknowledged, nothing more of its partition goes out
//!   until every batch of the partition that is out has come back; then the held batches
//!   go again, lowest sequence first, before any new batch. So the broker sees each
//!   partition's sequences in order.
//! - A sealed batch that is discarded unwritten leaves a gap: the partition *rewinds*, and
//!   the held batches after it are sealed again from the gap's base.
//! - When the broker has lost our state (UNKNOWN_PRODUCER_ID, an OUT_OF_ORDER_SEQUENCE_NUMBER
//!   on the first unacknowledged batch) or fenced us, or a gap cannot be proved unwritten,
//!   the whole producer *resets*: once nothing is out, a new epoch (or producer id) is
//!   fetched and every partition starts again at sequence 0, held batches first.
//!
//! The unit tests are at the end; `model.rs` checks the sequencer against a model of the
//! brokers' duplicate detection under any interleaving of faults (a property test).

use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::time::Instant;

use crate::fasthash::{FastMap, FoldHash};
use crate::pipeline::{Batch, IdRequest, PartKey, Seq};
use window::Window;

mod window;

/// Sealed batches per partition that may be unacknowledged at once: brokers keep the
/// sequence metadata of the last five batches per producer and partition.
pub const MAX_IN_FLIGHT_PER_PARTITION: usize = 5;

/// Sequence numbers wrap to 0 after `i32::MAX`, as the Java producer does.
const SEQ_SPACE: i64 = 1 << 31;

/// What the sequencer needs of a batch.
pub trait Sealable {
    fn part(&self) -> PartKey;
    /// Records in the batch (each takes one sequence number).
    fn records(&self) -> usize;
    fn seq(&self) -> Option<Seq>;
    fn set_seq(&mut self, seq: Option<Seq>);
}

impl Sealable for Batch {
    fn part(&self) -> PartKey {
        (self.topic, self.partition)
    }
    fn records(&self) -> usize {
        self.msgs.len()
    }
    fn seq(&self) -> Option<Seq> {
        self.seq
    }
    fn set_seq(&mut self, seq: Option<Seq>) {
        self.seq = seq;
    }
}

/// `seq + n` in Kafka's wrapping sequence space.
pub fn seq_add(seq: i32, n: usize) -> i32 {
    let n = (n as u64 % SEQ_SPACE as u64) as i64;
    ((i64::from(seq) + n) % SEQ_SPACE) as i32
}

/// How far `to` lies after `from` in the wrapping sequence space.
fn seq_distance(from: i32, to: i32) -> u32 {
    (i64::from(to) - i64::from(from)).rem_euclid(SEQ_SPACE) as u32
}

/// The producer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Waiting for the first producer id (`asked`: the request is out): batches queue.
    Pending { asked: bool },
    /// Sealing with this identity.
    On { producer_id: i64, epoch: i16 },
    /// A new epoch (or a new producer id if `fresh_id`) is needed. Nothing goes out until
    /// every sealed batch is back; then [`Sequencer::id_request_due`] says to ask for one.
    Resetting {
        producer_id: i64,
        epoch: i16,
        fresh_id: bool,
        asked: bool,
    },
    /// The cluster does not support idempotence: batches go unsealed.
    Off,
}

struct Part<B> {
    /// Base sequence of the next batch to seal.
    next_seq: i32,
    /// The sequence after the last acknowledged batch: what the broker expects next, as
    /// far as we know.
    acked_next: i32,
    /// Sealed batches out with dispatchers.
    in_flight: u32,
    /// Base sequences of the sealed batches from the oldest unacknowledged one on, and
    /// whether each is acknowledged. A broker detects duplicates among the last five
    /// batches it wrote, so a new batch is sealed only while this holds fewer than five:
    /// a resend of the oldest then still falls inside the broker's memory.
    window: Window,
    /// Batches not sealed yet, in the order they must go.
    queued: VecDeque<B>,
    /// What must go again, boxed and only while there is some: most partitions never
    /// resend, and this keeps each entry of the map (40,000 at 10,000 topics) small.
    resend: Option<Box<Resend<B>>>,
}

struct Resend<B> {
    /// Sealed batches back from dispatchers, to send again.
    held: Vec<B>,
    /// A sealed batch at this base was discarded unwritten: the held batches are sealed
    /// again from here.
    rewind: Option<i32>,
    /// Held batches wait until then (a broker asked us to back off).
    not_before: Option<Instant>,
}

impl<B> Default for Part<B> {
    fn default() -> Self {
        Part {
            next_seq: 0,
            acked_next: 0,
            in_flight: 0,
            window: Window::default(),
            queued: VecDeque::new(),
            resend: None,
        }
    }
}

impl<B: Sealable> Part<B> {
    fn must_resend(&self) -> bool {
        self.resend
            .as_ref()
            .is_some_and(|r| r.rewind.is_some() || !r.held.is_empty())
    }

    /// The resend state, allocated if there is none yet.
    fn resend_mut(&mut self) -> &mut Resend<B> {
        self.resend.get_or_insert_with(|| {
            Box::new(Resend {
                held: Vec::new(),
                rewind: None,
                not_before: None,
            })
        })
    }

    fn held(&self) -> &[B] {
        self.resend.as_ref().map_or(&[], |r| &r.held)
    }

    fn rewind(&self) -> Option<i32> {
        self.resend.as_ref().and_then(|r| r.rewind)
    }

    fn not_before(&self) -> Option<Instant> {
        self.resend.as_ref().and_then(|r| r.not_before)
    }

    /// How far a sealed sequence lies behind the next one to assign: every sealed batch
    /// is within the last few batches, so this orders them oldest first (largest).
    fn age(&self, base: i32) -> u32 {
        seq_distance(base, self.next_seq)
    }

    /// Orders held batches by their sequence, oldest first.
    fn sort_held(&mut self) {
        let next = self.next_seq;
        if let Some(r) = &mut self.resend {
            r.held.sort_by_key(|b| {
                std::cmp::Reverse(b.seq().map_or(u32::MAX, |s| seq_distance(s.base, next)))
            });
        }
    }

    /// Seals the held batches from `base` on again, in order, from `base`: those before
    /// it keep their sequence (they precede the gap).
    fn reseal_held(&mut self, producer_id: i64, epoch: i16, base: i32) {
        let (old_next, gap_age) = (self.next_seq, seq_distance(base, self.next_seq));
        self.window.retain(|b| seq_distance(b, old_next) > gap_age);
        let mut next = base;
        let held: &mut [B] = match &mut self.resend {
            Some(r) => &mut r.held,
            None => &mut [],
        };
        for b in held {
            if b.seq()
                .is_some_and(|s| seq_distance(s.base, old_next) > gap_age)
            {
                continue;
            }
            self.window.push(next);
            b.set_seq(Some(Seq {
                producer_id,
                epoch,
                base: next,
                uncertain: false,
            }));
            next = seq_add(next, b.records());
        }
        self.next_seq = next;
    }

    /// Seals `b` as the partition's next batch and counts it out.
    fn seal(&mut self, b: &mut B, producer_id: i64, epoch: i16) {
        b.set_seq(Some(Seq {
            producer_id,
            epoch,
            base: self.next_seq,
            uncertain: false,
        }));
        self.window.push(self.next_seq);
        self.next_seq = seq_add(self.next_seq, b.records());
        self.in_flight += 1;
    }

    /// Takes every held batch, in order, and frees the resend state.
    fn take_held(&mut self) -> Vec<B> {
        self.resend.take().map(|r| r.held).unwrap_or_default()
    }
}

/// Per-partition sequence state and send windows for an idempotent producer.
pub struct Sequencer<B> {
    mode: Mode,
    parts: FastMap<PartKey, Part<B>>,
    /// Partitions that may have something to send.
    dirty: HashSet<PartKey, BuildHasherDefault<FoldHash>>,
    /// Partitions with something to send whose leader was not sendable when last looked
    /// at: not looked at again until [`Sequencer::unpark_all`] (the caller's view of
    /// leaders changed) or an event of their own marks them dirty. Without this, every
    /// call rescanned every partition of a broker that is down.
    parked: HashSet<PartKey, BuildHasherDefault<FoldHash>>,
    /// Sealed batches out with dispatchers, all partitions.
    in_flight: usize,
    /// Reused key buffer for [`Sequencer::ready`].
    scan: Vec<PartKey>,
}

impl<B: Sealable> Default for Sequencer<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Sealable> Sequencer<B> {
    pub fn new() -> Self {
        Sequencer {
            mode: Mode::Pending { asked: false },
            parts: FastMap::default(),
            dirty: HashSet::default(),
            parked: HashSet::default(),
            in_flight: 0,
            scan: Vec::new(),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Sealed batches out with dispatchers.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// A completed batch for its partition, not sealed yet: it waits for
    /// [`Sequencer::ready`].
    pub fn submit(&mut self, b: B) {
        let k = b.part();
        self.parts.entry(k).or_default().queued.push_back(b);
        self.dirty.insert(k);
    }

    /// A completed batch for its partition, sealed and handed back at once if it may go
    /// now: `sendable` (its leader is known and reachable), a producer id is in use, and
    /// its partition has nothing waiting before it and room in its window. Otherwise it
    /// waits as with [`Sequencer::submit`]. This is the common case, and it touches only
    /// the partition's own entry (no scan, no dirty mark).
    pub fn submit_or_seal(&mut self, mut b: B, sendable: bool) -> Option<B> {
        let Mode::On { producer_id, epoch } = self.mode else {
            self.submit(b);
            return None;
        };
        let k = b.part();
        let p = self.parts.entry(k).or_default();
        if !sendable
            || !p.queued.is_empty()
            || p.must_resend()
            || p.window.len() >= MAX_IN_FLIGHT_PER_PARTITION
        {
            p.queued.push_back(b);
            self.dirty.insert(k);
            return None;
        }
        p.seal(&mut b, producer_id, epoch);
        self.in_flight += 1;
        Some(b)
    }

    /// Moves the batches that may go out now into `out`, sealed, in the order they must be
    /// sent. `sendable` says whether a partition's leader is known and reachable. Every
    /// batch handed out is in flight until [`Sequencer::on_ack`] or [`Sequencer::on_back`].
    pub fn ready(
        &mut self,
        now: Instant,
        mut sendable: impl FnMut(PartKey) -> bool,
        out: &mut Vec<B>,
    ) {
        let Mode::On { producer_id, epoch } = self.mode else {
            return;
        };
        let mut scan = std::mem::take(&mut self.scan);
        scan.clear();
        scan.extend(self.dirty.iter().copied());
        for &k in &scan {
            let Some(p) = self.parts.get_mut(&k) else {
                self.dirty.remove(&k);
                continue;
            };
            if p.must_resend() {
                if p.in_flight > 0 {
                    // Wait for every batch out to come back; on_ack/on_back mark it again.
                    self.dirty.remove(&k);
                    continue;
                }
                if p.not_before().is_some_and(|t| now < t) {
                    continue;
                }
                if !sendable(k) {
                    self.dirty.remove(&k);
                    self.parked.insert(k);
                    continue;
                }
                p.sort_held();
                if let Some(base) = p.resend_mut().rewind.take() {
                    p.reseal_held(producer_id, epoch, base);
                }
                let mut held = p.take_held();
                let n = held.len();
                p.in_flight += n as u32;
                self.in_flight += n;
                out.append(&mut held);
            }
            if p.queued.is_empty() {
                self.dirty.remove(&k);
                continue;
            }
            if !sendable(k) {
                self.dirty.remove(&k);
                self.parked.insert(k);
                continue;
            }
            while p.window.len() < MAX_IN_FLIGHT_PER_PARTITION {
                let Some(mut b) = p.queued.pop_front() else {
                    break;
                };
                p.seal(&mut b, producer_id, epoch);
                self.in_flight += 1;
                out.push(b);
            }
            if p.queued.is_empty() {
                // Give the buffer back: with many partitions most sit empty between
                // batches (about 190 bytes each, 7.7 MB at 40,000 partitions).
                p.queued.shrink_to_fit();
            }
            if p.queued.is_empty() || p.window.len() >= MAX_IN_FLIGHT_PER_PARTITION {
                // Nothing left, or the window is full: an ack marks it again.
                self.dirty.remove(&k);
            }
        }
        self.scan = scan;
    }

    /// The earliest time a held batch may go again, for the router's timer.
    pub fn next_due(&self) -> Option<Instant> {
        self.dirty
            .iter()
            .filter_map(|k| self.parts.get(k)?.not_before())
            .min()
    }

    fn came_back(&mut self, k: PartKey) -> Option<&mut Part<B>> {
        let p = self.parts.get_mut(&k)?;
        debug_assert!(p.in_flight > 0, "a batch came back that was not out");
        p.in_flight = p.in_flight.saturating_sub(1);
        self.in_flight = self.in_flight.saturating_sub(1);
        // Something may go now: the window has room again, or everything out is back for
        // a resend. A partition with nothing waiting is left alone (the common case).
        if !p.queued.is_empty() || p.must_resend() {
            self.dirty.insert(k);
        }
        Some(p)
    }

    /// A sealed batch of `records` records was acknowledged (also as a duplicate).
    pub fn on_ack(&mut self, k: PartKey, seq: Seq, records: usize) {
        let mode = self.mode;
        let Some(p) = self.came_back(k) else {
            return;
        };
        if p.rewind().is_some_and(|r| p.age(seq.base) <= p.age(r)) {
            // The broker took a batch after a gap we thought it never wrote: our view of
            // its sequence is wrong, so start afresh.
            self.request_reset(false);
            return;
        }
        let current = match mode {
            Mode::On { producer_id, epoch }
            | Mode::Resetting {
                producer_id, epoch, ..
            } => seq.producer_id == producer_id && seq.epoch == epoch,
            _ => false,
        };
        if !current {
            return;
        }
        let end = seq_add(seq.base, records);
        if seq_distance(p.acked_next, end) <= seq_distance(p.acked_next, p.next_seq) {
            p.acked_next = end;
        }
        p.window.ack(seq.base);
    }

    /// A sealed batch came back without an acknowledgement; the caller then holds it
    /// ([`Sequencer::hold`]), discards it ([`Sequencer::lost`]), or both for parts of it.
    pub fn on_back(&mut self, k: PartKey) {
        self.came_back(k);
    }

    /// Keeps a sealed batch to send again (after `not_before`, if given). `uncertain`: it
    /// was out on a connection lost before the answer, so it may have been written.
    pub fn hold(&mut self, mut b: B, not_before: Option<Instant>, uncertain: bool) {
        let k = b.part();
        if uncertain {
            if let Some(mut s) = b.seq() {
                s.uncertain = true;
                b.set_seq(Some(s));
            }
        }
        let r = self.parts.entry(k).or_default().resend_mut();
        if let Some(t) = not_before {
            r.not_before = Some(r.not_before.map_or(t, |x| x.max(t)));
        }
        r.held.push(b);
        self.dirty.insert(k);
    }

    /// Records of a sealed batch (identity `seq`) were discarded. If the batch cannot
    /// have been written, the partition rewinds to its base; if it may have been written
    /// (it was once out on a lost connection), only a new epoch makes the sequence safe.
    pub fn lost(&mut self, k: PartKey, seq: Seq) {
        if seq.uncertain {
            self.request_reset(false);
            return;
        }
        let Some(p) = self.parts.get_mut(&k) else {
            return;
        };
        let rewind = match p.rewind() {
            Some(r) if p.age(r) >= p.age(seq.base) => r,
            _ => seq.base,
        };
        p.resend_mut().rewind = Some(rewind);
        self.dirty.insert(k);
    }

    /// Whether `seq` is the first unacknowledged batch of its partition: an
    /// OUT_OF_ORDER_SEQUENCE_NUMBER for it means the broker lost our sequence, whereas for
    /// a later batch it only means an earlier one failed first.
    pub fn is_first_unacked(&self, k: PartKey, seq: Seq) -> bool {
        let current = matches!(self.mode, Mode::On { producer_id, epoch }
            if producer_id == seq.producer_id && epoch == seq.epoch);
        current
            && self
                .parts
                .get(&k)
                .is_some_and(|p| p.rewind().is_none() && p.acked_next == seq.base)
    }

    /// Asks for a new epoch (or, with `fresh_id`, a new producer id) once nothing is out.
    pub fn request_reset(&mut self, fresh_id: bool) {
        self.mode = match self.mode {
            Mode::On { producer_id, epoch } => Mode::Resetting {
                producer_id,
                epoch,
                fresh_id,
                asked: false,
            },
            Mode::Resetting {
                producer_id,
                epoch,
                fresh_id: f,
                asked,
            } => Mode::Resetting {
                producer_id,
                epoch,
                fresh_id: f || fresh_id,
                asked,
            },
            m => m,
        };
    }

    /// The InitProducerId request to send now, if one is due: at start, or while
    /// resetting once nothing is out. Once each time; again after
    /// [`Sequencer::id_request_failed`].
    pub fn id_request_due(&mut self) -> Option<IdRequest> {
        if let Mode::Pending { asked } = &mut self.mode {
            if *asked {
                return None;
            }
            *asked = true;
            return Some(IdRequest::Fresh);
        }
        let Mode::Resetting {
            producer_id,
            epoch,
            fresh_id,
            asked,
        } = &mut self.mode
        else {
            return None;
        };
        if *asked || self.in_flight > 0 {
            return None;
        }
        *asked = true;
        Some(if *fresh_id || *epoch == i16::MAX {
            IdRequest::Fresh
        } else {
            IdRequest::Bump {
                producer_id: *producer_id,
                epoch: *epoch,
            }
        })
    }

    /// The request for a producer id failed; [`Sequencer::id_request_due`] asks again.
    pub fn id_request_failed(&mut self) {
        if let Mode::Pending { asked } | Mode::Resetting { asked, .. } = &mut self.mode {
            *asked = false;
        }
    }

    /// A producer id and epoch arrived. After a reset every partition starts again at
    /// sequence 0 with its held batches first; `on_uncertain` sees each held batch that
    /// may have been written under its old identity (a resend may now duplicate it).
    pub fn producer_ready(
        &mut self,
        producer_id: i64,
        epoch: i16,
        mut on_uncertain: impl FnMut(&B),
    ) {
        match self.mode {
            Mode::Pending { .. } => {}
            Mode::Resetting { .. } => {
                for (k, p) in &mut self.parts {
                    p.sort_held();
                    for b in p.held() {
                        if b.seq().is_some_and(|s| s.uncertain) {
                            on_uncertain(b);
                        }
                    }
                    if let Some(r) = &mut p.resend {
                        for b in &mut r.held {
                            b.set_seq(None);
                        }
                        r.rewind = None;
                    }
                    p.acked_next = 0;
                    p.window.clear();
                    p.reseal_held(producer_id, epoch, 0);
                    self.dirty.insert(*k);
                }
            }
            Mode::On { .. } | Mode::Off => return,
        }
        self.mode = Mode::On { producer_id, epoch };
    }

    /// The cluster cannot do idempotence: from now on batches go unsealed. Every batch
    /// the sequencer holds moves to `out`, unsealed, in order; `on_uncertain` sees those
    /// that may have been written already.
    pub fn disable(&mut self, out: &mut Vec<B>, mut on_uncertain: impl FnMut(&B)) {
        self.mode = Mode::Off;
        for (_, mut p) in self.parts.drain() {
            p.sort_held();
            for mut b in p.take_held().into_iter().chain(p.queued.drain(..)) {
                if b.seq().is_some_and(|s| s.uncertain) {
                    on_uncertain(&b);
                }
                b.set_seq(None);
                out.push(b);
            }
        }
        self.dirty.clear();
        self.parked.clear();
    }

    /// The caller's view of which leaders are sendable changed (metadata, a broker up or
    /// down): parked partitions are looked at again.
    pub fn unpark_all(&mut self) {
        self.dirty.extend(self.parked.drain());
    }

    /// Partitions with batches not sealed yet.
    pub fn queued_parts(&self) -> Vec<PartKey> {
        self.parts
            .iter()
            .filter(|(_, p)| !p.queued.is_empty())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Takes back the batches of `k` not sealed yet (to route them elsewhere, e.g. when
    /// the partition's leader is unreachable). Sealed batches stay: their sequence belongs
    /// to this partition.
    pub fn take_queued(&mut self, k: PartKey) -> Vec<B> {
        self.parts
            .get_mut(&k)
            .map(|p| p.queued.drain(..).collect())
            .unwrap_or_default()
    }

    /// Whether no partition is dirty or parked: [`Sequencer::ready`] and
    /// [`Sequencer::unpark_all`] would do nothing.
    pub fn idle(&self) -> bool {
        self.dirty.is_empty() && self.parked.is_empty()
    }

    /// Partitions that may have something to send (for [`Sequencer::ready`]'s
    /// `sendable`).
    pub fn dirty_parts(&self) -> impl Iterator<Item = PartKey> + '_ {
        self.dirty.iter().copied()
    }

    /// Every batch held or queued (for discarding at shutdown).
    pub fn drain(&mut self, out: &mut Vec<B>) {
        for p in self.parts.values_mut() {
            out.append(&mut p.take_held());
            out.extend(p.queued.drain(..));
        }
    }

    /// Batches held or queued (not out with dispatchers).
    pub fn waiting(&self) -> usize {
        self.parts
            .values()
            .map(|p| p.held().len() + p.queued.len())
            .sum()
    }
}

#[cfg(test)]
mod model;

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[derive(Debug)]
    pub(super) struct TB {
        pub(super) part: PartKey,
        pub(super) ids: Vec<u64>,
        pub(super) seq: Option<Seq>,
    }

    impl Sealable for TB {
        fn part(&self) -> PartKey {
            self.part
        }
        fn records(&self) -> usize {
            self.ids.len()
        }
        fn seq(&self) -> Option<Seq> {
            self.seq
        }
        fn set_seq(&mut self, seq: Option<Seq>) {
            self.seq = seq;
        }
    }

    /// A sequencer with producer id and epoch `id`, and two batches of partition (1, 0)
    /// sealed and taken out: (sequencer, first batch, second batch).
    fn two_sealed(id: (i64, i16), a: Vec<u64>, b: Vec<u64>) -> (Sequencer<TB>, TB, TB) {
        let mut s: Sequencer<TB> = Sequencer::new();
        s.id_request_due();
        s.producer_ready(id.0, id.1, |_| {});
        for ids in [a, b] {
            s.submit(TB {
                part: (1, 0),
                ids,
                seq: None,
            });
        }
        let mut out = Vec::new();
        s.ready(Instant::now(), |_| true, &mut out);
        let b1 = out.pop().expect("second batch sealed");
        let b0 = out.pop().expect("first batch sealed");
        (s, b0, b1)
    }

    #[test]
    fn sequence_space_wraps_like_kafka() {
        assert_eq!(seq_add(0, 5), 5);
        assert_eq!(seq_add(i32::MAX, 1), 0);
        assert_eq!(seq_add(i32::MAX - 1, 3), 1);
        assert_eq!(seq_distance(i32::MAX, 0), 1);
        assert_eq!(seq_distance(5, 5), 0);
        assert_eq!(seq_distance(6, 5), (SEQ_SPACE - 1) as u32);
    }

    #[test]
    fn healthy_path_seals_contiguous_sequences_with_five_in_flight() {
        let mut s: Sequencer<TB> = Sequencer::new();
        assert_eq!(s.id_request_due(), Some(IdRequest::Fresh));
        assert_eq!(s.id_request_due(), None);
        for i in 0..7u64 {
            s.submit(TB {
                part: (1, 0),
                ids: vec![2 * i, 2 * i + 1],
                seq: None,
            });
        }
        let mut out = Vec::new();
        s.ready(Instant::now(), |_| true, &mut out);
        assert!(out.is_empty(), "nothing is sealed before the producer id");
        s.producer_ready(42, 0, |_| panic!("nothing uncertain"));
        s.ready(Instant::now(), |_| true, &mut out);
        let bases: Vec<i32> = out.iter().map(|b| b.seq.unwrap().base).collect();
        assert_eq!(bases, [0, 2, 4, 6, 8]);
        assert_eq!(s.in_flight(), 5);
        let first = out.remove(0);
        s.on_ack((1, 0), first.seq.unwrap(), 2);
        let mut more = Vec::new();
        s.ready(Instant::now(), |_| true, &mut more);
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].seq.unwrap().base, 10);
    }

    #[test]
    fn a_partition_entry_stays_small_and_frees_its_resend_state() {
        // One entry per partition: 40,000 at 10,000 topics of 4 partitions.
        assert!(std::mem::size_of::<Part<TB>>() <= 88);
        let (mut s, b0, b1) = two_sealed((1, 0), vec![0], vec![1]);
        for b in [b0, b1] {
            s.on_back((1, 0));
            s.hold(b, None, false);
        }
        assert!(s.parts[&(1, 0)].resend.is_some());
        let mut out = Vec::new();
        s.ready(Instant::now(), |_| true, &mut out);
        assert_eq!(out.len(), 2, "the held batches go again");
        assert!(
            s.parts[&(1, 0)].resend.is_none(),
            "and their state is freed"
        );
    }

    #[test]
    fn a_failed_batch_waits_for_its_partition_then_goes_first() {
        let mut s: Sequencer<TB> = Sequencer::new();
        s.id_request_due();
        s.producer_ready(1, 0, |_| {});
        for i in 0..3u64 {
            s.submit(TB {
                part: (1, 0),
                ids: vec![i],
                seq: None,
            });
        }
        let mut out = Vec::new();
        s.ready(Instant::now(), |_| true, &mut out);
        let b2 = out.pop().unwrap();
        let b1 = out.pop().unwrap();
        let b0 = out.pop().unwrap();
        s.on_back((1, 0));
        s.hold(b0, None, false);
        s.submit(TB {
            part: (1, 0),
            ids: vec![3],
            seq: None,
        });
        let mut again = Vec::new();
        s.ready(Instant::now(), |_| true, &mut again);
        assert!(
            again.is_empty(),
            "two batches of the partition are still out"
        );
        s.on_back((1, 0));
        s.hold(b2, None, false);
        s.on_back((1, 0));
        s.hold(b1, None, false);
        s.ready(Instant::now(), |_| true, &mut again);
        let order: Vec<(u64, i32)> = again
            .iter()
            .map(|b| (b.ids[0], b.seq.unwrap().base))
            .collect();
        assert_eq!(order, [(0, 0), (1, 1), (2, 2), (3, 3)]);
    }

    #[test]
    fn a_discarded_gap_rewinds_the_partition() {
        let (mut s, b0, b1) = two_sealed((1, 0), vec![0, 1], vec![2]);
        s.on_back((1, 0));
        s.lost((1, 0), b0.seq.unwrap());
        s.on_back((1, 0));
        s.hold(b1, None, false);
        let mut again = Vec::new();
        s.ready(Instant::now(), |_| true, &mut again);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].seq.unwrap().base, 0, "sealed again into the gap");
        assert_eq!(
            s.mode(),
            Mode::On {
                producer_id: 1,
                epoch: 0
            }
        );
    }

    #[test]
    fn losing_a_batch_that_may_be_written_bumps_the_epoch() {
        let (mut s, b0, b1) = two_sealed((9, 3), vec![0], vec![1]);
        s.on_back((1, 0));
        s.hold(b0, None, true);
        s.on_back((1, 0));
        s.hold(b1, None, true);
        let mut again = Vec::new();
        s.ready(Instant::now(), |_| true, &mut again);
        let b0 = again.remove(0);
        s.on_back((1, 0));
        s.lost((1, 0), b0.seq.unwrap());
        assert!(matches!(s.mode(), Mode::Resetting { .. }));
        assert_eq!(s.id_request_due(), None, "one batch is still out");
        let b1 = again.remove(0);
        s.on_back((1, 0));
        s.hold(b1, None, false);
        assert_eq!(
            s.id_request_due(),
            Some(IdRequest::Bump {
                producer_id: 9,
                epoch: 3
            })
        );
        let mut flagged: Vec<u64> = Vec::new();
        s.producer_ready(9, 4, |b| flagged.extend(&b.ids));
        assert_eq!(
            flagged,
            [1],
            "the held batch may have been written under epoch 3"
        );
        let mut last = Vec::new();
        s.ready(Instant::now(), |_| true, &mut last);
        assert_eq!(
            last[0].seq.unwrap(),
            Seq {
                producer_id: 9,
                epoch: 4,
                base: 0,
                uncertain: false
            }
        );
    }

    #[test]
    fn disabling_hands_back_everything_unsealed_in_order() {
        let mut s: Sequencer<TB> = Sequencer::new();
        s.submit(TB {
            part: (1, 0),
            ids: vec![0],
            seq: None,
        });
        s.submit(TB {
            part: (1, 0),
            ids: vec![1],
            seq: None,
        });
        let mut out = Vec::new();
        s.disable(&mut out, |_| panic!("nothing was sent"));
        assert_eq!(out.iter().map(|b| b.ids[0]).collect::<Vec<_>>(), [0, 1]);
        assert!(out.iter().all(|b| b.seq.is_none()));
        assert_eq!(s.mode(), Mode::Off);
    }

    #[test]
    fn unsendable_partitions_are_parked_until_unparked_or_marked() {
        let mut s: Sequencer<TB> = Sequencer::new();
        s.id_request_due();
        s.producer_ready(1, 0, |_| {});
        s.submit(TB {
            part: (1, 0),
            ids: vec![0],
            seq: None,
        });
        let mut out = Vec::new();
        let mut asked = 0;
        s.ready(
            Instant::now(),
            |_| {
                asked += 1;
                false
            },
            &mut out,
        );
        assert!(out.is_empty());
        assert_eq!(asked, 1);
        assert_eq!(s.dirty_parts().count(), 0, "parked, not dirty");
        // Not asked again while parked...
        s.ready(
            Instant::now(),
            |_| panic!("a parked partition was looked at"),
            &mut out,
        );
        assert!(out.is_empty());
        // ...until the leaders may have changed.
        s.unpark_all();
        s.ready(Instant::now(), |_| true, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].seq.map(|q| q.base), Some(0));
        // An event of its own (a new batch) brings a parked partition back too.
        s.submit(TB {
            part: (2, 0),
            ids: vec![1],
            seq: None,
        });
        s.ready(Instant::now(), |_| false, &mut out);
        assert_eq!(out.len(), 1);
        s.submit(TB {
            part: (2, 0),
            ids: vec![2],
            seq: None,
        });
        s.ready(Instant::now(), |_| true, &mut out);
        assert_eq!(out.len(), 3, "both batches of (2, 0) once it is sendable");
    }

    #[test]
    fn a_batch_is_sealed_at_once_only_when_nothing_waits_before_it() {
        let tb = |ids: Vec<u64>| TB {
            part: (1, 0),
            ids,
            seq: None,
        };
        let mut s: Sequencer<TB> = Sequencer::new();
        assert!(
            s.submit_or_seal(tb(vec![0]), true).is_none(),
            "no producer id yet"
        );
        s.id_request_due();
        s.producer_ready(1, 0, |_| {});
        let mut out = Vec::new();
        s.ready(Instant::now(), |_| true, &mut out);
        assert_eq!(out.len(), 1, "the queued one goes first");
        let mut bases = vec![out[0].seq.unwrap().base];
        for i in 1..5u64 {
            let b = s.submit_or_seal(tb(vec![2 * i, 2 * i + 1]), true);
            bases.push(b.expect("room in the window").seq.unwrap().base);
        }
        assert_eq!(bases, [0, 1, 3, 5, 7]);
        assert_eq!(s.in_flight(), 5);
        assert_eq!(s.dirty_parts().count(), 0, "the direct path marks nothing");
        assert!(
            s.submit_or_seal(tb(vec![10]), true).is_none(),
            "the window is full"
        );
        assert!(
            s.submit_or_seal(tb(vec![11]), true).is_none(),
            "one waits, so the next waits behind it"
        );
        let first = out.pop().unwrap();
        s.on_ack((1, 0), first.seq.unwrap(), 1);
        assert!(
            s.submit_or_seal(tb(vec![12]), true).is_none(),
            "a slot opened, but two wait before it"
        );
        s.ready(Instant::now(), |_| true, &mut out);
        assert_eq!(out.len(), 1, "one slot opened");
        assert_eq!(out[0].ids, [10]);
        assert_eq!(out[0].seq.unwrap().base, 9);
        // Acknowledging with nothing waiting marks nothing for the next scan.
        let mut s: Sequencer<TB> = Sequencer::new();
        s.id_request_due();
        s.producer_ready(1, 0, |_| {});
        let b = s.submit_or_seal(tb(vec![0]), true).unwrap();
        assert!(
            s.submit_or_seal(
                TB {
                    part: (2, 0),
                    ids: vec![1],
                    seq: None
                },
                false
            )
            .is_none(),
            "not sendable"
        );
        s.on_ack((1, 0), b.seq.unwrap(), 1);
        assert_eq!(s.dirty_parts().collect::<Vec<_>>(), [(2, 0)]);
        // A batch back for a resend makes new ones wait until it went again.
        let b = s.submit_or_seal(tb(vec![2]), true).unwrap();
        s.on_back((1, 0));
        s.hold(b, None, false);
        assert!(s.submit_or_seal(tb(vec![3]), true).is_none());
        s.ready(Instant::now(), |_| true, &mut out);
        let ids: Vec<_> = out[1..].iter().map(|b| b.ids.clone()).collect();
        assert_eq!(ids, [vec![1], vec![2], vec![3]]);
    }
}
