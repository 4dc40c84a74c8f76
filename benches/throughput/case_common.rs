//! What the cases that deliver to the counting sink (dory and librdkafka) share: the
//! watch that ends a run which stops making progress ([`ProgressWatch`]), and the sink's
//! figures and problems for the run's result ([`sink_report`]).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::sink;

/// Ends a wait for a run that stops making progress for `stall`, or lasts past 600 s.
pub struct ProgressWatch {
    pub last: u64,
    since: Instant,
    stall: Duration,
    deadline: Instant,
}

impl ProgressWatch {
    pub fn new(stall: Duration) -> ProgressWatch {
        let now = Instant::now();
        ProgressWatch {
            last: 0,
            since: now,
            stall,
            deadline: now + Duration::from_secs(600),
        }
    }

    /// Records `progress` (of `n`); the problem that ends the wait, if any.
    pub fn check(&mut self, progress: u64, n: u64) -> Option<String> {
        if progress != self.last {
            self.last = progress;
            self.since = Instant::now();
        } else if self.since.elapsed() > self.stall {
            let stall = self.stall;
            return Some(format!(
                "stalled: no progress for {stall:?} at {progress}/{n}"
            ));
        }
        if Instant::now() > self.deadline {
            return Some("hard deadline (600 s) reached".into());
        }
        None
    }
}

/// The counting sink's figures for `--json` (`rec`: the records the run counts) and its
/// problems: rejected batches, connection errors.
pub fn sink_report(
    s: &sink::Sink,
    rec: u64,
    extra: &mut serde_json::Map<String, serde_json::Value>,
    problems: &mut Vec<String>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let c = &s.counters;
    extra.insert("sink_records".into(), json!(rec));
    extra.insert("sink_batches".into(), json!(c.batches.load(Relaxed)));
    extra.insert(
        "sink_compressed_batches".into(),
        json!(c.compressed_batches.load(Relaxed)),
    );
    extra.insert("sink_record_bytes".into(), json!(c.bytes.load(Relaxed)));
    extra.insert("sink_requests".into(), json!(c.requests.load(Relaxed)));
    let rejected = c.rejected.load(Relaxed);
    extra.insert("sink_rejected".into(), json!(rejected));
    if rejected > 0 {
        problems.push(format!(
            "sink rejected {rejected} partition batches (bad magic/length/CRC)"
        ));
    }
    for e in s.errors() {
        problems.push(format!("sink: {e}"));
    }
}
