//! Latency percentiles from histograms with dory's bucket bounds: dory's
//! `dory_delivery_latency_seconds` (receipt → acknowledgement, per topic, on `/metrics`)
//! summed over topics, and the librdkafka target's own histogram (`produce()` →
//! delivery report) kept with the same bounds, so both go through the same estimate.

use std::time::Duration;

use dory::report::commit_points::LATENCY_BOUNDS;

use crate::common::Metrics;

/// Per-bucket counts (not cumulative): one per bound in [`LATENCY_BOUNDS`], then `+Inf`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub counts: Vec<u64>,
}

/// The bucket of one latency: the first whose bound is ≥ it (as dory counts).
pub fn bucket(latency: Duration) -> usize {
    LATENCY_BOUNDS.partition_point(|b| *b < latency)
}

impl Histogram {
    pub fn buckets() -> usize {
        LATENCY_BOUNDS.len() + 1
    }

    /// dory's delivery latency histogram, all topics added up. `None` when dory
    /// published none (nothing acknowledged) or its bounds are not dory's current ones.
    pub fn from_metrics(m: &Metrics) -> Option<Histogram> {
        let bounds: Vec<String> = LATENCY_BOUNDS
            .iter()
            .map(|b| b.as_secs_f64().to_string())
            .chain(["+Inf".to_string()])
            .collect();
        let mut cumulative = vec![0u64; bounds.len()];
        let mut seen = false;
        for s in &m.samples {
            if s.name != "dory_delivery_latency_seconds_bucket" {
                continue;
            }
            let le = s.labels.get("le")?;
            let i = bounds.iter().position(|b| b == le)?;
            cumulative[i] += s.value as u64;
            seen = true;
        }
        if !seen {
            return None;
        }
        let mut counts = Vec::with_capacity(cumulative.len());
        let mut prev = 0;
        for c in cumulative {
            counts.push(c.checked_sub(prev)?);
            prev = c;
        }
        Some(Histogram { counts })
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q` quantile (0 < q < 1) in seconds: the bucket holding rank `q × total`, and
    /// linear interpolation between its lower and upper bound (0 below the first). Falling
    /// in `+Inf` gives the last finite bound (a lower bound, then).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let mut below = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 && (below + c) as f64 >= rank {
                let lo = if i == 0 {
                    0.0
                } else {
                    LATENCY_BOUNDS[i - 1].as_secs_f64()
                };
                let Some(hi) = LATENCY_BOUNDS.get(i) else {
                    return Some(lo);
                };
                let frac = ((rank - below as f64) / c as f64).clamp(0.0, 1.0);
                return Some(lo + (hi.as_secs_f64() - lo) * frac);
            }
            below += c;
        }
        None
    }

    /// (p50, p99) in milliseconds.
    pub fn p50_p99_ms(&self) -> Option<(f64, f64)> {
        Some((self.quantile(0.5)? * 1e3, self.quantile(0.99)? * 1e3))
    }
}
