//! What one measured run of one target yields ([`RunResult`]): what every case fills in
//! and the per-run lines and summary table are printed from.

use std::collections::BTreeMap;

/// One measured run of one target.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    pub msgs_per_s: f64,
    pub secs: f64,
    /// CPU seconds per million messages: the receiver thread's for the ceilings, the
    /// daemon's for sink and Tansu, 0 for librdkafka (no daemon).
    pub cpu_s_per_m: f64,
    /// CPU seconds per million messages of the producing application: the sender thread
    /// (dory, ceilings) or the librdkafka process.
    pub app_cpu_s_per_m: Option<f64>,
    /// Receipt → acknowledgement (dory's histogram) or send → delivery report
    /// (librdkafka's), p50 and p99 in milliseconds.
    pub latency_ms: Option<(f64, f64)>,
    pub peak_rss_mib: Option<f64>,
    pub discards: BTreeMap<String, u64>,
    /// Problems that make the run invalid or suspect (invariant, counts, exit status).
    pub problems: Vec<String>,
    /// Average cores used by processes other than the bench, dory and Tansu during the
    /// measurement, and cores stolen by the hypervisor: noise indicators.
    pub other_cores: f64,
    pub steal_cores: f64,
    /// dory only: messages over the sender's own duration, the clock the ceiling is timed
    /// by, when dory kept up (see `sustained` in
    /// `case_dory.rs`); `None` otherwise.
    pub sustained_msgs_per_s: Option<f64>,
    /// dory only: the sender's last message → the last record counted (the final partial
    /// batches wait out the batch time).
    pub tail_s: Option<f64>,
    pub extra: serde_json::Map<String, serde_json::Value>,
}
