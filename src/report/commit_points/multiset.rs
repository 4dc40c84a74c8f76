//! The counted multiset behind a topic's tracker: how many unresolved messages have each
//! tracking key (or arrival time), and which is the smallest.
//!
//! Keys arrive almost in order (they are milliseconds, and each input reads the clock once
//! per batch) and mostly leave oldest first, so the values sit in a deque of `(value,
//! count)` runs sorted by value: a message adds to the newest run or starts one at the
//! back, and resolving the oldest pops the front. That is a compare and a store in memory
//! the topic touched last time, where a `BTreeMap` walked a node (three cache lines) and
//! allocated or freed one each time the topic emptied; at 1,000 topics, about one message
//! per topic per input batch, the maps were the input thread's largest cost.
//!
//! Values out of order are still exact:
//!
//! * a value within [`NEAR`] runs of either end is inserted in place (moving at most
//!   that many runs);
//! * a value further inside moves the whole set into a `BTreeMap` (the old structure),
//!   where it stays until the set empties: a client whose clock is far behind another's
//!   costs what it did before, never a long shift per message.
//!
//! A run resolved from the middle (acknowledgements of partitions finish in any order)
//! becomes a tombstone (count 0) instead of shifting its neighbours; the ends are never
//! tombstones, so the front is always the smallest value held, and tombstones are swept
//! out once they are the majority.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};

/// How far from either end of the deque (in runs) a value is still inserted in place.
const NEAR: usize = 64;

/// Tombstones are swept once there are more than this many and they outnumber live runs.
const SWEEP_MIN: usize = 64;

/// Capacity (runs) an emptied deque keeps; a larger one is shrunk to it, so a burst's
/// backlog does not keep its memory per topic.
const KEEP: usize = 16;

/// A multiset of `T` with counts (see the module doc).
#[derive(Clone, Debug)]
pub struct RunSet<T> {
    /// Runs sorted by value, strictly increasing; neither end has count 0.
    runs: VecDeque<(T, u64)>,
    /// Runs of count 0 inside `runs`.
    tombstones: usize,
    /// Everything, while the set holds values too far out of order for the deque; then
    /// `runs` is empty.
    tree: BTreeMap<T, u64>,
}

impl<T> Default for RunSet<T> {
    fn default() -> Self {
        RunSet {
            runs: VecDeque::new(),
            tombstones: 0,
            tree: BTreeMap::new(),
        }
    }
}

impl<T: Ord + Copy> RunSet<T> {
    /// The smallest value held.
    pub fn first(&self) -> Option<T> {
        match self.tree.first_key_value() {
            Some((&v, _)) => Some(v),
            None => self.runs.front().map(|&(v, _)| v),
        }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.tree.is_empty()
    }

    /// Distinct values held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.runs.len() - self.tombstones + self.tree.len()
    }

    /// Whether the set has moved to its `BTreeMap`.
    #[cfg(test)]
    fn in_tree(&self) -> bool {
        !self.tree.is_empty()
    }

    /// Adds `n` copies of `v`.
    pub fn add(&mut self, v: T, n: u64) {
        if !self.tree.is_empty() {
            *self.tree.entry(v).or_insert(0) += n;
            return;
        }
        match self.runs.back_mut() {
            None => return self.runs.push_back((v, n)),
            Some(back) if back.0 < v => return self.runs.push_back((v, n)),
            Some(back) if back.0 == v => return back.1 += n,
            Some(_) => {}
        }
        match self.runs.binary_search_by(|r| r.0.cmp(&v)) {
            Ok(i) => {
                let run = &mut self.runs[i];
                if run.1 == 0 {
                    self.tombstones -= 1;
                }
                run.1 += n;
            }
            Err(i) if i.min(self.runs.len() - i) <= NEAR => self.runs.insert(i, (v, n)),
            Err(_) => {
                self.tree = self.runs.drain(..).filter(|r| r.1 > 0).collect();
                self.tombstones = 0;
                *self.tree.entry(v).or_insert(0) += n;
            }
        }
    }

    /// Removes up to `n` copies of `v`; returns how many were there to remove.
    pub fn remove(&mut self, v: T, n: u64) -> u64 {
        if !self.tree.is_empty() {
            return match self.tree.entry(v) {
                Entry::Occupied(mut e) => {
                    let have = *e.get();
                    if have <= n {
                        e.remove();
                        have
                    } else {
                        *e.get_mut() -= n;
                        n
                    }
                }
                Entry::Vacant(_) => 0,
            };
        }
        let i = match self.runs.front() {
            Some(f) if f.0 == v => 0,
            _ => match self.runs.binary_search_by(|r| r.0.cmp(&v)) {
                Ok(i) => i,
                Err(_) => return 0,
            },
        };
        let count = &mut self.runs[i].1;
        let removed = (*count).min(n);
        *count -= removed;
        if *count == 0 && removed > 0 {
            self.emptied(i);
        }
        removed
    }

    /// Run `i` has just reached count 0: drop it if at an end (with any tombstones it
    /// uncovers), else leave a tombstone.
    fn emptied(&mut self, i: usize) {
        let last = self.runs.len() - 1;
        if i == 0 || i == last {
            let end = |runs: &mut VecDeque<(T, u64)>| {
                if i == 0 {
                    runs.pop_front();
                    runs.front().is_some_and(|r| r.1 == 0)
                } else {
                    runs.pop_back();
                    runs.back().is_some_and(|r| r.1 == 0)
                }
            };
            while end(&mut self.runs) {
                self.tombstones -= 1;
            }
            if self.runs.is_empty() && self.runs.capacity() > 2 * KEEP {
                self.runs.shrink_to(KEEP);
            }
        } else {
            self.tombstones += 1;
            if self.tombstones > SWEEP_MIN && 2 * self.tombstones > self.runs.len() {
                self.runs.retain(|r| r.1 > 0);
                self.tombstones = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn in_order_values_stay_in_the_deque() {
        let mut s = RunSet::default();
        for v in 0..1000u64 {
            s.add(v / 3, 1);
        }
        assert!(!s.in_tree());
        assert_eq!((s.len(), s.first()), (334, Some(0)));
        for v in 0..1000u64 {
            assert_eq!(s.remove(v / 3, 1), 1);
        }
        assert!(s.is_empty());
        assert!(
            s.runs.capacity() <= 2 * KEEP,
            "an emptied deque gives back its memory"
        );
    }

    #[test]
    fn middle_removals_leave_tombstones_that_are_swept() {
        let mut s = RunSet::default();
        for v in 0..1000i64 {
            s.add(v, 2);
        }
        // Two runs in three resolved from the middle: tombstones, then a sweep.
        for v in (1..999).filter(|v| v % 3 != 0) {
            assert_eq!(s.remove(v, 5), 2, "only what was there");
        }
        assert_eq!(s.len(), 334);
        assert!(s.runs.len() < 1000, "swept");
        assert_eq!(s.remove(0, 2), 2);
        assert_eq!(s.first(), Some(3));
        assert_eq!(s.remove(998, 1), 0, "a resolved run holds nothing");
    }

    #[test]
    fn a_value_far_out_of_order_moves_the_set_to_a_tree_until_it_empties() {
        let mut s = RunSet::default();
        for v in (1_000..3_000i64).step_by(2) {
            s.add(v, 1);
        }
        for v in [2_991, 1_005, 0] {
            s.add(v, 1);
            assert!(!s.in_tree(), "{v}: near an end, inserted in place");
        }
        assert_eq!(s.remove(2_000, 1), 1);
        s.add(2_000, 1);
        assert!(!s.in_tree(), "a tombstone in the middle revived");
        s.add(2_001, 1);
        assert!(s.in_tree(), "about 500 runs from either end");
        assert_eq!((s.len(), s.first()), (1_004, Some(0)));
        for v in (1_000..3_000i64).step_by(2).chain([2_991, 1_005, 0]) {
            assert_eq!(s.remove(v, 1), 1);
        }
        assert_eq!(s.remove(2_001, 9), 1);
        assert!(s.is_empty() && !s.in_tree());
        s.add(7, 1);
        assert_eq!(
            (s.first(), s.in_tree()),
            (Some(7), false),
            "back in the deque"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Random adds and removes, mostly near the newest value but sometimes far behind,
        /// against a `BTreeMap` model: the same counts, the same smallest value, and
        /// `remove` returns what the model had.
        #[test]
        fn behaves_as_a_counted_multiset(
            ops in prop::collection::vec((any::<bool>(), 0u8..4, 0i64..400, 1u64..4), 1..800),
        ) {
            let mut s = RunSet::default();
            let mut model: BTreeMap<i64, u64> = BTreeMap::new();
            let mut now = 0i64;
            for (add, kind, x, n) in ops {
                // kind 0–1: near the clock; 2: anywhere behind it; 3: a value held.
                let v = match kind {
                    0 | 1 => now + x % 8 - 4,
                    2 => now - x,
                    _ => model.keys().nth(x as usize % model.len().max(1)).copied().unwrap_or(now),
                };
                if add {
                    now += x % 3;
                    s.add(v, n);
                    *model.entry(v).or_insert(0) += n;
                } else {
                    let have = model.get(&v).copied().unwrap_or(0);
                    let want = have.min(n);
                    if have > n {
                        model.insert(v, have - n);
                    } else {
                        model.remove(&v);
                    }
                    prop_assert_eq!(s.remove(v, n), want);
                }
                prop_assert_eq!(s.first(), model.keys().next().copied());
                prop_assert_eq!(s.len(), model.len());
                prop_assert_eq!(s.is_empty(), model.is_empty());
                prop_assert!(s.runs.front().is_none_or(|r| r.1 > 0));
                prop_assert!(s.runs.back().is_none_or(|r| r.1 > 0));
                prop_assert_eq!(s.tombstones, s.runs.iter().filter(|r| r.1 == 0).count());
            }
            let held: Vec<(i64, u64)> = if s.tree.is_empty() {
                s.runs.iter().copied().filter(|r| r.1 > 0).collect()
            } else {
                s.tree.iter().map(|(&v, &c)| (v, c)).collect()
            };
            prop_assert_eq!(held, model.into_iter().collect::<Vec<_>>());
        }
    }
}
