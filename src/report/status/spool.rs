//! `/spool/plain` and `/spool/json`: the durable spool's disk use, segments, appended,
//! synced and recovered messages, corrupt bytes, errors and sync latency, and per spooled
//! topic the synced point and the messages recovered at start (see [`crate::spool`]).
//! Shaped like Dory's pages: the same id lines and 4-space JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::dory::{push_id_lines, to_json};
use crate::report::metrics::Metrics;
use crate::spool::SpoolSnapshot;

#[derive(Serialize)]
struct SpoolJson {
    pid: u32,
    version: String,
    since: u64,
    bytes: u64,
    segments: u64,
    live_segments: u64,
    appended: u64,
    synced: u64,
    recovered: u64,
    corrupt_bytes: u64,
    unreadable_segments: u64,
    write_errors: u64,
    sync_errors: u64,
    syncs: u64,
    sync_seconds_sum: f64,
    topics: Vec<SpoolTopicJson>,
}

#[derive(Serialize)]
struct SpoolTopicJson {
    topic: String,
    /// Milliseconds since the epoch: every message received with a tracking key at or
    /// below it is on disk.
    synced_point: Option<i64>,
    recovered: u64,
}

fn topics(m: &Metrics) -> Vec<SpoolTopicJson> {
    m.spool_topics()
        .into_iter()
        .map(|(name, recovered, synced_point)| SpoolTopicJson {
            topic: String::from_utf8_lossy(&name).into_owned(),
            synced_point,
            recovered,
        })
        .collect()
}

pub(super) fn spool_plain(m: &Metrics, s: &SpoolSnapshot) -> String {
    let mut out = String::new();
    push_id_lines(&mut out, m);
    out.push('\n');
    let _ = writeln!(
        out,
        "bytes: {}  segments: {}  live_segments: {}\n\
         appended: {}  synced: {}  recovered: {}\n\
         corrupt_bytes: {}  unreadable_segments: {}  write_errors: {}  sync_errors: {}\n\
         syncs: {}  sync_seconds_sum: {:.6}",
        s.bytes,
        s.segments,
        s.live_segments,
        s.appended_records,
        s.synced_records,
        s.recovered,
        s.corrupt_bytes,
        s.unreadable_segments,
        s.write_errors,
        s.sync_errors,
        s.sync_latency.count(),
        s.sync_latency.sum.as_secs_f64()
    );
    let t = topics(m);
    if !t.is_empty() {
        out.push('\n');
    }
    for t in t {
        let point = t
            .synced_point
            .map_or_else(|| "none".to_string(), |p| p.to_string());
        let _ = writeln!(
            out,
            "synced_point: {point:>14}  recovered: {:10}  topic: [{}]",
            t.recovered, t.topic
        );
    }
    out
}

pub(super) fn spool_json(m: &Metrics, s: &SpoolSnapshot) -> String {
    to_json(&SpoolJson {
        pid: m.pid(),
        version: m.version().to_string(),
        since: m.start_secs(),
        bytes: s.bytes,
        segments: s.segments,
        live_segments: s.live_segments,
        appended: s.appended_records,
        synced: s.synced_records,
        recovered: s.recovered,
        corrupt_bytes: s.corrupt_bytes,
        unreadable_segments: s.unreadable_segments,
        write_errors: s.write_errors,
        sync_errors: s.sync_errors,
        syncs: s.sync_latency.count(),
        sync_seconds_sum: s.sync_latency.sum.as_secs_f64(),
        topics: topics(m),
    })
}
