//! A partition's send window (see [`super::Part`]): the base sequences of its sealed
//! batches from the oldest unacknowledged one on, inline.

/// Room in a partition's window: [`super::MAX_IN_FLIGHT_PER_PARTITION`] and some slack. The
/// window never holds more than five entries (a batch is sealed only while it holds fewer,
/// and resealing replaces entries one for one); the model test checks this.
const WINDOW_ROOM: usize = 7;

/// A partition's send window, inline: sealing and acknowledging a batch allocate nothing
/// (with 40,000 partitions, a heap buffer per window cost a malloc and a free per batch).
/// Entries are base sequences, oldest first, with a bit each for "acknowledged".
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Window {
    bases: [i32; WINDOW_ROOM],
    /// Bit `i`: entry `i` is acknowledged.
    acked: u8,
    len: u8,
}

impl Window {
    pub(super) fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.acked = 0;
    }

    /// Appends an unacknowledged entry. Full cannot happen (see [`WINDOW_ROOM`]); if it
    /// did, the oldest entry would make room, so the window stays bounded either way.
    pub(super) fn push(&mut self, base: i32) {
        debug_assert!(self.len() < WINDOW_ROOM, "window overflow");
        if self.len() == WINDOW_ROOM {
            self.remove(0);
        }
        self.bases[self.len()] = base;
        self.acked &= !(1 << self.len);
        self.len += 1;
    }

    fn remove(&mut self, i: usize) {
        let n = self.len();
        self.bases.copy_within(i + 1..n, i);
        let low = self.acked & ((1u8 << i) - 1);
        let high = (self.acked >> 1) & !((1u8 << i) - 1);
        self.acked = low | high;
        self.len -= 1;
    }

    /// Keeps the entries whose base satisfies `keep`, in order.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(i32) -> bool) {
        let mut i = 0;
        while i < self.len() {
            if keep(self.bases[i]) {
                i += 1;
            } else {
                self.remove(i);
            }
        }
    }

    /// Marks the entry at `base` acknowledged, then drops acknowledged entries from the
    /// front.
    pub(super) fn ack(&mut self, base: i32) {
        if let Some(i) = self.bases[..self.len()].iter().position(|&b| b == base) {
            self.acked |= 1 << i;
        }
        let front = (!self.acked).trailing_zeros().min(u32::from(self.len)) as usize;
        if front > 0 {
            let n = self.len();
            self.bases.copy_within(front..n, 0);
            self.acked >>= front;
            self.len -= front as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::MAX_IN_FLIGHT_PER_PARTITION;
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone)]
    enum WinOp {
        Push(i32),
        Ack(i32),
        /// Keep entries whose base is not `r` modulo 3.
        Retain(i32),
        Clear,
    }

    proptest! {
        /// The inline window behaves as the queue of (base, acknowledged) it replaced.
        #[test]
        fn the_window_behaves_as_a_queue(ops in proptest::collection::vec(
            prop_oneof![
                4 => (0..12i32).prop_map(WinOp::Push),
                4 => (0..12i32).prop_map(WinOp::Ack),
                1 => (0..3i32).prop_map(WinOp::Retain),
                1 => Just(WinOp::Clear),
            ],
            0..60,
        )) {
            let mut w = Window::default();
            let mut q: VecDeque<(i32, bool)> = VecDeque::new();
            for op in ops {
                match op {
                    WinOp::Push(b) if q.len() < MAX_IN_FLIGHT_PER_PARTITION => {
                        w.push(b);
                        q.push_back((b, false));
                    }
                    WinOp::Push(_) => {}
                    WinOp::Ack(b) => {
                        w.ack(b);
                        if let Some(e) = q.iter_mut().find(|e| e.0 == b) {
                            e.1 = true;
                        }
                        while q.front().is_some_and(|e| e.1) {
                            q.pop_front();
                        }
                    }
                    WinOp::Retain(r) => {
                        w.retain(|b| b.rem_euclid(3) != r);
                        q.retain(|e| e.0.rem_euclid(3) != r);
                    }
                    WinOp::Clear => {
                        w.clear();
                        q.clear();
                    }
                }
                let got: Vec<(i32, bool)> = (0..w.len())
                    .map(|i| (w.bases[i], w.acked & (1 << i) != 0))
                    .collect();
                let want: Vec<(i32, bool)> = q.iter().copied().collect();
                prop_assert_eq!(got, want);
                prop_assert_eq!(u32::from(w.acked) >> w.len, 0, "no stale bits");
            }
        }
    }
}
