//! Randomized exponential backoff for reconnects, metadata retries and retried sends, and
//! the small PRNG behind it (xorshift; jitter needs no cryptographic quality).

use std::time::Duration;

/// xorshift64*: a tiny, fast generator for jitter and shuffles.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// Seeded from the clock and the thread, so daemons on many hosts do not step in time.
    pub fn from_entropy() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let local = 0u8;
        let addr = &local as *const u8 as u64;
        Rng::seeded(t ^ addr.rotate_left(32) ^ u64::from(std::process::id()))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[lo, hi]` (inclusive).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Delay doubles from `initial` up to `max`; each delay is drawn from ±50 % around the
/// nominal value, so reconnecting clients do not synchronise.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    nominal: Duration,
    rng: Rng,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
            nominal: initial,
            rng: Rng::from_entropy(),
        }
    }

    pub fn reset(&mut self) {
        self.nominal = self.initial;
    }

    /// The next delay: never zero, never above `max`.
    pub fn next_delay(&mut self) -> Duration {
        let n = self.nominal.as_millis() as u64;
        let d = self.rng.range(n / 2, n + n / 2).max(1);
        self.nominal = (self.nominal * 2).min(self.max);
        Duration::from_millis(d).min(self.max)
    }
}

/// Delay before resending a message that has failed `attempts` times.
pub fn retry_delay(attempts: u32, initial: Duration, max: Duration, rng: &mut Rng) -> Duration {
    let shift = attempts.saturating_sub(1).min(16);
    let nominal = initial.saturating_mul(1 << shift).min(max);
    let n = nominal.as_millis() as u64;
    Duration::from_millis(rng.range(n / 2, n + n / 2).max(1)).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let delays: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(50) && delays[0] <= Duration::from_millis(150));
        assert!(delays
            .iter()
            .all(|d| *d <= Duration::from_millis(1000) && !d.is_zero()));
        assert!(delays[9] >= Duration::from_millis(500), "{delays:?}");
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(150));
    }

    #[test]
    fn rng_range_is_inclusive_and_bounded() {
        let mut r = Rng::seeded(42);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            let v = r.range(3, 6);
            assert!((3..=6).contains(&v));
            seen[(v - 3) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn retry_delay_doubles() {
        let mut r = Rng::seeded(7);
        let i = Duration::from_millis(100);
        let m = Duration::from_secs(10);
        assert!(retry_delay(1, i, m, &mut r) <= Duration::from_millis(150));
        let d = retry_delay(4, i, m, &mut r);
        assert!(
            d >= Duration::from_millis(400) && d <= Duration::from_millis(1200),
            "{d:?}"
        );
        assert!(retry_delay(30, i, m, &mut r) <= m);
    }
}
