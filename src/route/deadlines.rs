//! The router's queue of batch deadlines: which open batch's time is up next.
//!
//! A batch's deadline is its first message's arrival plus its topic's batch time, and
//! messages arrive in (nearly) time order, so the deadlines of all batches sharing one
//! batch time arrive nearly in order too. One first-in first-out queue per distinct batch
//! time then holds them sorted at the cost of an append, and the next deadline is the
//! earliest of a few queue fronts. A binary heap over every open batch (40,000 at 10,000
//! topics with keyed partitions) instead pays a walk down its levels per pop, each step a
//! cache miss once the heap outgrows the cache: a third of the router's time at 10,000
//! topics (doc/performance.md, round twenty).
//!
//! A deadline that arrives earlier than the back of its queue (an input's clock read a
//! little before another's, or an earlier arrival lowering an open batch's deadline) is
//! inserted in order; such an entry is only ever a short way from the back.
//!
//! Entries are hints: a batch sent early by size or count keeps its entry until it falls
//! due, and the caller checks the batch's own deadline then (as with the heap before).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// See the module documentation. `K` identifies a batch.
#[derive(Debug)]
pub struct Deadlines<K> {
    /// One queue per distinct batch time, each sorted by deadline (oldest first). There
    /// are as many as distinct batch times in the configuration: a handful.
    queues: Vec<(Duration, VecDeque<(Instant, K)>)>,
}

impl<K> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines { queues: Vec::new() }
    }
}

impl<K: Copy> Deadlines<K> {
    /// Queues `key`'s deadline `at`, that of a batch with batch time `time`.
    pub fn push(&mut self, time: Duration, at: Instant, key: K) {
        let q = match self.queues.iter().position(|(t, _)| *t == time) {
            Some(i) => &mut self.queues[i].1,
            None => {
                self.queues.push((time, VecDeque::new()));
                let last = self.queues.len() - 1;
                &mut self.queues[last].1
            }
        };
        if q.back().is_none_or(|&(b, _)| b <= at) {
            q.push_back((at, key));
        } else {
            // Equal deadlines keep their arrival order.
            let i = q.partition_point(|&(d, _)| d <= at);
            q.insert(i, (at, key));
        }
    }

    /// The earliest deadline queued, and the queue holding it.
    fn earliest(&self) -> Option<(Instant, usize)> {
        self.queues
            .iter()
            .enumerate()
            .filter_map(|(i, (_, q))| Some((q.front()?.0, i)))
            .min()
    }

    /// The earliest deadline queued.
    pub fn next(&self) -> Option<Instant> {
        self.earliest().map(|(at, _)| at)
    }

    /// Takes the entry with the earliest deadline if that is at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, K)> {
        let (_, i) = self.earliest().filter(|&(at, _)| at <= now)?;
        let q = &mut self.queues[i].1;
        let e = q.pop_front();
        if q.is_empty() {
            // Give the buffer back: at 10,000 topics a burst leaves a long queue behind.
            q.shrink_to(INITIAL_KEEP);
        }
        e
    }

    /// Entries queued, stale ones included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.queues.iter().map(|(_, q)| q.len()).sum()
    }

    pub fn clear(&mut self) {
        self.queues.clear();
    }
}

/// Entries an empty queue keeps room for.
const INITIAL_KEEP: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn pops_only_what_is_due_in_deadline_order_across_batch_times() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        d.push(ms(100), t0 + ms(100), 1u32);
        d.push(ms(1000), t0 + ms(1000), 2);
        d.push(ms(100), t0 + ms(150), 3);
        d.push(ms(5), t0 + ms(20), 4);
        assert_eq!(d.next(), Some(t0 + ms(20)));
        assert_eq!(d.pop_due(t0 + ms(10)), None);
        assert_eq!(d.pop_due(t0 + ms(200)), Some((t0 + ms(20), 4)));
        assert_eq!(d.pop_due(t0 + ms(200)), Some((t0 + ms(100), 1)));
        assert_eq!(d.pop_due(t0 + ms(200)), Some((t0 + ms(150), 3)));
        assert_eq!(d.pop_due(t0 + ms(200)), None);
        assert_eq!(d.next(), Some(t0 + ms(1000)));
        assert_eq!(d.len(), 1);
        d.clear();
        assert_eq!(d.next(), None);
    }

    #[test]
    fn an_earlier_deadline_is_inserted_in_order() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        d.push(ms(100), t0 + ms(100), 1u32);
        d.push(ms(100), t0 + ms(103), 2);
        d.push(ms(100), t0 + ms(101), 3);
        d.push(ms(100), t0 + ms(101), 4);
        d.push(ms(100), t0 + ms(99), 5);
        let order: Vec<u32> = std::iter::from_fn(|| d.pop_due(t0 + ms(200)))
            .map(|(_, k)| k)
            .collect();
        assert_eq!(order, [5, 1, 3, 4, 2]);
    }

    proptest! {
        /// Against a sorted list: the same entries come out, each only once due, earliest
        /// first, whatever the order and batch times they were queued with.
        #[test]
        fn matches_a_sorted_list(
            ops in prop::collection::vec((0u64..4, 0u64..400, any::<bool>()), 0..300)
        ) {
            let t0 = Instant::now();
            let times = [ms(5), ms(100), ms(250), ms(1000)];
            let mut d = Deadlines::default();
            let mut model: Vec<(Instant, usize)> = Vec::new();
            let mut now = t0;
            for (i, &(which, at_ms, advance)) in ops.iter().enumerate() {
                if advance {
                    now += ms(at_ms / 4);
                    let mut got = Vec::new();
                    while let Some(e) = d.pop_due(now) {
                        got.push(e);
                    }
                    model.sort_by_key(|&(at, k)| (at, k));
                    let due: Vec<_> = model.iter().copied().filter(|&(at, _)| at <= now).collect();
                    model.retain(|&(at, _)| at > now);
                    let got_sorted = {
                        let mut g = got.clone();
                        g.sort_by_key(|&(at, k)| (at, k));
                        g
                    };
                    prop_assert_eq!(&got_sorted, &due);
                    prop_assert!(got.windows(2).all(|w| w[0].0 <= w[1].0));
                } else {
                    let at = t0 + ms(at_ms);
                    d.push(times[which as usize], at, i);
                    model.push((at, i));
                }
                prop_assert_eq!(d.next(), model.iter().map(|&(at, _)| at).min());
                prop_assert_eq!(d.len(), model.len());
            }
        }
    }
}
