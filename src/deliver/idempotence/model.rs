//! The sequencer checked against a model of the brokers (test only): a partition leader's
//! duplicate detection as KIP-98 describes it, a world of leaders, connections and faults
//! (retriable errors, lost connections, timeouts, brokers dying with answers outstanding,
//! leader moves, forgotten producers, rejected batches), and a property test that any
//! interleaving of them lands every message once, in order.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use proptest::prelude::*;

use super::tests::TB;
use super::*;

/// What a Kafka partition leader keeps per producer id (KIP-98): its epoch, the next
/// sequence it expects, and the last five batches for duplicate detection.
#[derive(Default)]
struct ProducerEntry {
    epoch: i16,
    next: i32,
    window: VecDeque<(i32, usize)>,
}

/// A Kafka partition, replicated: its log, and per producer id what KIP-98 keeps (its
/// epoch, the next sequence, the last five batches), which a new leader has too.
#[derive(Default)]
struct ModelPartition {
    log: Vec<u64>,
    /// Each batch written, in log order: (producer id, epoch, base sequence, records).
    stored: Vec<(i64, i16, i32, usize)>,
    producers: HashMap<i64, ProducerEntry>,
}

const NONE: i16 = 0;
const OOS: i16 = 45;
const DUP: i16 = 46;
const BAD_EPOCH: i16 = 47;
const UNKNOWN_PID: i16 = 59;
const TOO_LARGE: i16 = 10;

impl ModelPartition {
    /// The broker's answer to a produce of `b`; `reject` makes it refuse a batch it
    /// would otherwise write (MESSAGE_TOO_LARGE), after duplicate detection.
    fn produce(&mut self, b: &TB, reject: bool) -> i16 {
        let s = b.seq.expect("only sealed batches are sent");
        let n = b.ids.len();
        match self.producers.get_mut(&s.producer_id) {
            Some(e) if s.epoch < e.epoch => return BAD_EPOCH,
            Some(e) if s.epoch == e.epoch => {
                if e.window.contains(&(s.base, n)) {
                    return DUP;
                }
                if s.base != e.next {
                    return OOS;
                }
            }
            Some(_) | None => {
                if s.base != 0 {
                    return if self.producers.contains_key(&s.producer_id) {
                        OOS
                    } else {
                        UNKNOWN_PID
                    };
                }
                self.producers.insert(
                    s.producer_id,
                    ProducerEntry {
                        epoch: s.epoch,
                        ..Default::default()
                    },
                );
            }
        }
        if reject {
            return TOO_LARGE;
        }
        let e = self.producers.get_mut(&s.producer_id).expect("inserted");
        e.next = seq_add(s.base, n);
        e.window.push_back((s.base, n));
        if e.window.len() > 5 {
            e.window.pop_front();
        }
        self.log.extend(&b.ids);
        self.stored.push((s.producer_id, s.epoch, s.base, n));
        NONE
    }
}

/// What happens to the oldest request on one connection.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The broker answers (a leader that moved away answers NOT_LEADER).
    Answer,
    /// A retriable error (e.g. NOT_ENOUGH_REPLICAS): not written.
    Retriable,
    /// The broker takes the request, then the connection is lost: every request out
    /// on it comes back in doubt, only the first written.
    LostAfterFirst,
    /// A timeout: the connection is closed before the broker took anything; every
    /// request on it comes back in doubt.
    Timeout,
    /// The broker dies with answers outstanding: it wrote every request on the
    /// connection (as its rules allow), no answer arrives, all come back in doubt.
    DiesWithAnswersOutstanding,
    /// The leader appends, then its replicas do not confirm in time: REQUEST_TIMED_OUT
    /// or NOT_ENOUGH_REPLICAS_AFTER_APPEND, which leave the batch in doubt
    /// (`kafka::errors::may_be_written`).
    AppendedThenTimedOut,
    /// The broker forgot the producer (retention removed its batches, KIP-360), then
    /// answers.
    ForgetsProducer,
    /// MESSAGE_TOO_LARGE after duplicate detection: discarded.
    Reject,
}

#[derive(Debug, Clone)]
enum Op {
    /// `n` records for partition `p`; `direct`: through [`Sequencer::submit_or_seal`]
    /// (sealed at once when the partition may send), else queued for `ready`.
    Submit(usize, usize, bool),
    /// Settle the oldest request of partition `p` on the connection to broker `b`.
    /// `pump`: the router looks for batches to send before the next event (else the
    /// next event comes first, as when the router handles several in one turn).
    Deliver(usize, usize, Fault, bool),
    /// The partition's leadership moves to the other broker.
    MoveLeader(usize),
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        6 => Just(Fault::Answer),
        1 => Just(Fault::Retriable),
        1 => Just(Fault::LostAfterFirst),
        1 => Just(Fault::Timeout),
        1 => Just(Fault::DiesWithAnswersOutstanding),
        1 => Just(Fault::AppendedThenTimedOut),
        1 => Just(Fault::ForgetsProducer),
        1 => Just(Fault::Reject),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..4usize, any::<bool>()).prop_map(|(p, n, d)| Op::Submit(p, n, d)),
        6 => (0..3usize, 0..2usize, fault(), prop::bool::weighted(0.75))
            .prop_map(|(p, b, f, pump)| Op::Deliver(p, b, f, pump)),
        1 => (0..3usize).prop_map(Op::MoveLeader),
    ]
}

/// A record's identity in the broker's eyes: (producer id, epoch, sequence).
type RecordId = (i64, i16, i32);

struct World {
    seq: Sequencer<TB>,
    /// Per partition: the replicated partition, the connection to each of its two
    /// brokers, and which of them leads.
    brokers: Vec<ModelPartition>,
    wire: Vec<[VecDeque<TB>; 2]>,
    leader: Vec<usize>,
    next_id: u64,
    next_pid: i64,
    epochs: HashMap<i64, i16>,
    discarded: BTreeMap<u64, u32>,
    flagged: HashMap<u64, u32>,
    /// Every identity each record was written under, and the records acknowledged.
    written_as: HashMap<u64, HashSet<RecordId>>,
    acked: HashSet<u64>,
    id_fail_once: bool,
    now: Instant,
}

impl World {
    fn new(parts: usize) -> World {
        World {
            seq: Sequencer::new(),
            brokers: (0..parts).map(|_| ModelPartition::default()).collect(),
            wire: (0..parts).map(|_| Default::default()).collect(),
            leader: vec![0; parts],
            next_id: 0,
            next_pid: 1000,
            epochs: HashMap::new(),
            discarded: BTreeMap::new(),
            flagged: HashMap::new(),
            written_as: HashMap::new(),
            acked: HashSet::new(),
            id_fail_once: true,
            now: Instant::now(),
        }
    }

    /// Each record's identity in batch `b`.
    fn identities(b: &TB) -> impl Iterator<Item = (u64, RecordId)> + '_ {
        let s = b.seq.expect("sealed");
        b.ids
            .iter()
            .enumerate()
            .map(move |(j, id)| (*id, (s.producer_id, s.epoch, seq_add(s.base, j))))
    }

    /// A batch goes out. No record acknowledged goes again, and a record keeps the
    /// identity it may be stored under: it goes under another only if every other
    /// identity it is stored under was counted as a possible duplicate.
    fn check_send(&self, b: &TB) {
        for (id, ident) in Self::identities(b) {
            assert!(
                !self.acked.contains(&id),
                "id {id} sent again after its ack"
            );
            let others = self
                .written_as
                .get(&id)
                .map_or(0, |w| w.iter().filter(|i| **i != ident).count());
            let flags = self.flagged.get(&id).copied().unwrap_or(0) as usize;
            assert!(
                others <= flags,
                "id {id} sent as {ident:?}, but stored under {:?} and counted {flags} time(s)",
                self.written_as.get(&id)
            );
        }
    }

    fn pump(&mut self) {
        if let Some(req) = self.seq.id_request_due() {
            if std::mem::take(&mut self.id_fail_once) {
                self.seq.id_request_failed();
                return self.pump();
            }
            let (pid, epoch) = match req {
                IdRequest::Fresh => {
                    self.next_pid += 1;
                    (self.next_pid, 0)
                }
                IdRequest::Bump { producer_id, epoch } => {
                    assert_eq!(self.epochs[&producer_id], epoch);
                    (producer_id, epoch + 1)
                }
            };
            self.epochs.insert(pid, epoch);
            let flagged = &mut self.flagged;
            self.seq.producer_ready(pid, epoch, |b| {
                for id in &b.ids {
                    *flagged.entry(*id).or_default() += 1;
                }
            });
        }
        let mut out = Vec::new();
        self.seq.ready(self.now, |_| true, &mut out);
        for b in out {
            self.send(b);
        }
        for p in self.seq.parts.values() {
            assert!(
                p.window.len() <= MAX_IN_FLIGHT_PER_PARTITION,
                "a window holds {} entries",
                p.window.len()
            );
        }
    }

    /// A sealed batch goes to its partition's leader.
    fn send(&mut self, b: TB) {
        self.check_send(&b);
        let i = b.part.1 as usize;
        self.wire[i][self.leader[i]].push_back(b);
    }

    /// The broker of partition `i` handles `b`; what it writes is remembered.
    fn write(&mut self, i: usize, b: &TB, reject: bool) -> i16 {
        let code = self.brokers[i].produce(b, reject);
        if code == NONE {
            for (id, ident) in Self::identities(b) {
                self.written_as.entry(id).or_default().insert(ident);
            }
        }
        code
    }

    /// Every request left on connection `w` of partition `i` comes back in doubt.
    fn lose_connection(&mut self, i: usize, w: usize) {
        while let Some(b) = self.wire[i][w].pop_front() {
            self.seq.on_back(b.part);
            self.seq.hold(b, None, true);
        }
    }

    fn deliver(&mut self, i: usize, w: usize, fault: Fault) {
        let Some(b) = self.wire[i][w].pop_front() else {
            return;
        };
        let k = b.part;
        let s = b.seq.expect("sealed");
        if w != self.leader[i] {
            // NOT_LEADER_OR_FOLLOWER: not written; rerouted once metadata says where.
            self.seq.on_back(k);
            self.seq.hold(b, None, false);
            return;
        }
        match fault {
            Fault::Retriable => {
                self.seq.on_back(k);
                self.seq.hold(b, None, false);
            }
            Fault::LostAfterFirst => {
                self.write(i, &b, false);
                self.wire[i][w].push_front(b);
                self.lose_connection(i, w);
            }
            Fault::Timeout => {
                self.wire[i][w].push_front(b);
                self.lose_connection(i, w);
            }
            Fault::AppendedThenTimedOut => {
                self.write(i, &b, false);
                self.seq.on_back(k);
                self.seq.hold(b, None, true);
            }
            Fault::DiesWithAnswersOutstanding => {
                self.write(i, &b, false);
                let rest: Vec<TB> = self.wire[i][w].drain(..).collect();
                for r in &rest {
                    self.write(i, r, false);
                }
                self.wire[i][w].push_back(b);
                self.wire[i][w].extend(rest);
                self.lose_connection(i, w);
            }
            // Only when nothing is in doubt: a broker forgets a producer whose batches
            // are all acknowledged and removed by retention.
            Fault::ForgetsProducer
                if !s.uncertain
                    && self.wire[i].iter().all(VecDeque::is_empty)
                    && self.seq.parts[&k].held().is_empty() =>
            {
                self.brokers[i].producers.clear();
                self.answer(b, false);
            }
            Fault::Reject => self.answer(b, true),
            Fault::Answer | Fault::ForgetsProducer => self.answer(b, false),
        }
    }

    fn answer(&mut self, b: TB, reject: bool) {
        let i = b.part.1 as usize;
        let k = b.part;
        let s = b.seq.expect("sealed");
        match self.write(i, &b, reject) {
            NONE | DUP => {
                self.acked.extend(&b.ids);
                self.seq.on_ack(k, s, b.ids.len())
            }
            OOS => {
                if self.seq.is_first_unacked(k, s) {
                    self.seq.request_reset(false);
                }
                self.seq.on_back(k);
                self.seq.hold(b, None, false);
            }
            BAD_EPOCH => {
                self.seq.request_reset(true);
                self.seq.on_back(k);
                self.seq.hold(b, None, false);
            }
            UNKNOWN_PID => {
                self.seq.request_reset(false);
                self.seq.on_back(k);
                self.seq.hold(b, None, false);
            }
            TOO_LARGE => {
                self.seq.on_back(k);
                self.seq.lost(k, s);
                for id in &b.ids {
                    *self.discarded.entry(*id).or_default() += 1;
                }
            }
            other => panic!("unexpected answer {other}"),
        }
    }
}

fn run(parts: usize, ops: &[Op]) -> World {
    let mut w = World::new(parts);
    let mut submitted: Vec<Vec<u64>> = vec![Vec::new(); parts];
    for op in ops {
        match *op {
            Op::Submit(p, n, direct) => {
                let p = p % parts;
                let ids: Vec<u64> = (w.next_id..w.next_id + n as u64).collect();
                w.next_id += n as u64;
                submitted[p].extend(&ids);
                let b = TB {
                    part: (7, p as i32),
                    ids,
                    seq: None,
                };
                if !direct {
                    w.seq.submit(b);
                } else if let Some(b) = w.seq.submit_or_seal(b, true) {
                    w.send(b);
                }
            }
            Op::Deliver(p, b, fault, _) => w.deliver(p % parts, b, fault),
            Op::MoveLeader(p) => w.leader[p % parts] ^= 1,
        }
        if !matches!(op, Op::Deliver(_, _, _, false)) {
            w.pump();
        }
    }
    // Then a healthy network until everything is settled.
    for _ in 0..10_000 {
        w.pump();
        let Some((i, b)) = (0..parts)
            .flat_map(|i| [(i, 0), (i, 1)])
            .find(|&(i, b)| !w.wire[i][b].is_empty())
        else {
            break;
        };
        w.deliver(i, b, Fault::Answer);
    }
    assert_eq!(w.seq.in_flight(), 0, "nothing may stay out");
    assert_eq!(w.seq.waiting(), 0, "nothing may stay held or queued");
    assert!(
        matches!(w.seq.mode(), Mode::On { .. }),
        "{:?}",
        w.seq.mode()
    );
    for (p, ids) in submitted.iter().enumerate() {
        let log = &w.brokers[p].log;
        let mut count: HashMap<u64, u32> = HashMap::new();
        for id in log {
            *count.entry(*id).or_default() += 1;
        }
        for id in ids {
            let written = count.get(id).copied().unwrap_or(0);
            let dropped = w.discarded.get(id).copied().unwrap_or(0);
            // Every copy beyond the first was counted as a possible duplicate, and
            // nothing is both missing and uncounted.
            let flags = w.flagged.get(id).copied().unwrap_or(0);
            assert!(
                dropped <= 1 && written + dropped >= 1 && written + dropped <= 1 + flags,
                "id {id}: written {written}, discarded {dropped}, flagged {flags}, log {log:?}"
            );
        }
        // Order per partition: first appearances follow submission order.
        let mut seen = HashSet::new();
        let firsts: Vec<u64> = log.iter().copied().filter(|id| seen.insert(*id)).collect();
        assert!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "partition {p} out of order: {firsts:?}"
        );
        // In the order the broker stored them, each identity's sequences run from 0
        // without a gap or an overlap.
        let mut next: HashMap<(i64, i16), i32> = HashMap::new();
        for &(pid, epoch, base, n) in &w.brokers[p].stored {
            let want = next.entry((pid, epoch)).or_insert(0);
            assert_eq!(
                base, *want,
                "partition {p}: producer {pid} epoch {epoch} stored at sequence {base}, \
                 expected {want}: {:?}",
                w.brokers[p].stored
            );
            *want = seq_add(base, n);
        }
    }
    w
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// Any interleaving of sends, acknowledgements, retriable errors, lost connections,
    /// timeouts, brokers dying with answers outstanding, leader moves, forgotten
    /// producers and rejected batches: every record stored once (or counted), in
    /// order, under a sequence it keeps from its first send until its ack unless
    /// counted, and gapless per identity in the broker's log.
    #[test]
    fn every_message_lands_once_in_order(ops in proptest::collection::vec(op(), 0..120)) {
        run(3, &ops);
    }
}
