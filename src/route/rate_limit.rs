//! Dory's per-topic rate limiter: a fixed-window message counter. The router keeps one per
//! limited topic and checks it after the topic, size and availability checks, so messages
//! discarded for other reasons use no quota.

use std::time::{Duration, Instant};

/// A fixed window of `interval` that lets through at most `max_count` messages.
///
/// The first window starts at the first message checked. When a message arrives at or
/// after `window_start + interval`, the window advances by the largest whole number of
/// intervals that keeps its start at or before the message, and the count restarts. Every
/// checked message counts, including the ones refused; a message is refused iff the count,
/// with it, exceeds `max_count` (so `max_count == 0` refuses everything). A message older
/// than the window start (messages can reach the router slightly out of order) counts in
/// the current window.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    interval: Duration,
    max_count: u64,
    window_start: Option<Instant>,
    count: u64,
}

impl RateLimiter {
    /// A limiter of `max_count` messages per `interval`. A zero interval makes every
    /// message its own window (allowed iff `max_count > 0`).
    pub fn new(interval: Duration, max_count: u64) -> RateLimiter {
        RateLimiter {
            interval,
            max_count,
            window_start: None,
            count: 0,
        }
    }

    /// Counts a message created at `now` and tells whether it may pass.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.window_start {
            None => {
                self.window_start = Some(now);
                self.count = 0;
            }
            Some(start) => {
                let elapsed = now.saturating_duration_since(start);
                if elapsed >= self.interval {
                    // start + k·interval for the largest k with that ≤ now, i.e. now minus
                    // the remainder of elapsed / interval.
                    let rem = elapsed
                        .as_nanos()
                        .checked_rem(self.interval.as_nanos())
                        .unwrap_or(0);
                    // rem < interval, which is a Duration, so it fits in one.
                    let rem = Duration::new(
                        u64::try_from(rem / 1_000_000_000).unwrap_or(u64::MAX),
                        (rem % 1_000_000_000) as u32,
                    );
                    self.window_start = Some(now.checked_sub(rem).unwrap_or(now));
                    self.count = 0;
                }
            }
        }
        self.count = self.count.saturating_add(1);
        self.count <= self.max_count
    }

    /// Start of the current window, once a message has been checked.
    #[cfg(test)]
    pub fn window_start(&self) -> Option<Instant> {
        self.window_start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn window_starts_at_first_message_and_counts_every_check() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(SEC, 3);
        assert!(l.allow(t0 + Duration::from_millis(500)));
        assert_eq!(l.window_start(), Some(t0 + Duration::from_millis(500)));
        assert!(l.allow(t0 + Duration::from_millis(900)));
        assert!(l.allow(t0 + Duration::from_millis(1400)));
        // 4th and 5th in the window [0.5 s, 1.5 s): refused, and still counted.
        assert!(!l.allow(t0 + Duration::from_millis(1450)));
        assert!(!l.allow(t0 + Duration::from_millis(1499)));
        // Exactly at window_start + interval: a new window.
        assert!(l.allow(t0 + Duration::from_millis(1500)));
        assert_eq!(l.window_start(), Some(t0 + Duration::from_millis(1500)));
    }

    #[test]
    fn window_advances_by_whole_intervals() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(SEC, 1);
        assert!(l.allow(t0));
        assert!(!l.allow(t0 + Duration::from_millis(999)));
        // 3.7 s later: window start moves to t0 + 3 s, not to the message time.
        assert!(l.allow(t0 + Duration::from_millis(3700)));
        assert_eq!(l.window_start(), Some(t0 + 3 * SEC));
        assert!(!l.allow(t0 + Duration::from_millis(3999)));
        assert!(l.allow(t0 + 4 * SEC));
        assert_eq!(l.window_start(), Some(t0 + 4 * SEC));
    }

    #[test]
    fn max_zero_refuses_everything() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(SEC, 0);
        for i in 0..5 {
            assert!(!l.allow(t0 + i * SEC));
        }
    }

    #[test]
    fn older_messages_count_in_the_current_window() {
        let t0 = Instant::now() + 10 * SEC;
        let mut l = RateLimiter::new(SEC, 2);
        assert!(l.allow(t0));
        assert!(l.allow(t0 - Duration::from_millis(200)));
        assert!(!l.allow(t0 - 5 * SEC));
        assert_eq!(l.window_start(), Some(t0));
    }

    #[test]
    fn zero_interval_makes_each_message_its_own_window() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(Duration::ZERO, 1);
        assert!(l.allow(t0));
        assert!(l.allow(t0));
        assert!(l.allow(t0 + SEC));
    }

    #[test]
    fn long_intervals_do_not_overflow() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(Duration::from_secs(86_400 * 365), 1);
        assert!(l.allow(t0));
        assert!(!l.allow(t0 + Duration::from_secs(86_400)));
        let later = t0 + Duration::from_secs(86_400 * 365 * 2 + 5);
        assert!(l.allow(later));
        assert_eq!(
            l.window_start(),
            Some(t0 + Duration::from_secs(86_400 * 365 * 2))
        );
    }

    proptest! {
        /// Against a model on whole milliseconds: window start = first + k·interval.
        #[test]
        fn prop_matches_model(interval_ms in 1u64..500, max in 0u64..5,
                              steps in proptest::collection::vec(0u64..700, 1..60)) {
            let t0 = Instant::now();
            let mut l = RateLimiter::new(Duration::from_millis(interval_ms), max);
            let mut t = 0u64;
            let mut start: Option<u64> = None;
            let mut count = 0u64;
            for step in steps {
                t += step;
                match start {
                    None => { start = Some(t); count = 0; }
                    Some(s) if t >= s + interval_ms => {
                        start = Some(s + (t - s) / interval_ms * interval_ms);
                        count = 0;
                    }
                    Some(_) => {}
                }
                count += 1;
                prop_assert_eq!(l.allow(t0 + Duration::from_millis(t)), count <= max);
                prop_assert_eq!(l.window_start(), start.map(|s| t0 + Duration::from_millis(s)));
            }
        }
    }
}
