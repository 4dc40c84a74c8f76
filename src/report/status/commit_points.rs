//! `/commit_points/plain` and `/commit_points/json`: per topic, the commit point, the
//! messages not yet resolved, the oldest unacknowledged age and the late arrivals, and the
//! same over all topics (see [`crate::report::commit_points`]). Shaped like Dory's pages:
//! the same id lines and 4-space JSON, times in milliseconds like the commit points.

use std::fmt::Write as _;

use serde::Serialize;

use super::dory::{ctime, push_id_lines, to_json};
use crate::report::commit_points::Points;
use crate::report::metrics::Metrics;

/// A commit point for text: the number, or `none`.
fn point_text(p: Option<i64>) -> String {
    p.map_or_else(|| "none".to_string(), |t| t.to_string())
}

pub(super) fn commit_points_plain(m: &Metrics, p: &Points, now_ms: u64) -> String {
    let mut out = String::new();
    push_id_lines(&mut out, m);
    let _ = writeln!(
        out,
        "now (milliseconds since epoch): {now_ms} {}",
        ctime(now_ms / 1000)
    );
    out.push('\n');
    for t in &p.topics {
        let _ = writeln!(
            out,
            "commit_point: {:>14}  unresolved: {:10}  oldest_unacked_ms: {:10}  late_arrivals: {:10}  topic: [{}]",
            point_text(t.commit_point),
            t.unresolved,
            t.oldest_unacked.as_millis(),
            t.late_arrivals,
            String::from_utf8_lossy(&t.name)
        );
    }
    if !p.topics.is_empty() {
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "commit_point: {:>14}  unresolved: {:10}  oldest_unacked_ms: {:10}  overall",
        point_text(p.overall),
        p.unresolved,
        p.oldest_unacked.as_millis()
    );
    out
}

#[derive(Serialize)]
struct CommitPointsJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    /// Milliseconds since the epoch, like the commit points.
    now: u64,
    overall: OverallPointJson,
    topics: Vec<TopicPointJson>,
}

#[derive(Serialize)]
struct OverallPointJson {
    commit_point: Option<i64>,
    unresolved: u64,
    oldest_unacked_ms: u128,
}

#[derive(Serialize)]
struct TopicPointJson {
    topic: String,
    commit_point: Option<i64>,
    unresolved: u64,
    oldest_unacked_ms: u128,
    late_arrivals: u64,
}

pub(super) fn commit_points_json(m: &Metrics, p: &Points, now_ms: u64) -> String {
    to_json(&CommitPointsJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_ms,
        overall: OverallPointJson {
            commit_point: p.overall,
            unresolved: p.unresolved,
            oldest_unacked_ms: p.oldest_unacked.as_millis(),
        },
        topics: p
            .topics
            .iter()
            .map(|t| TopicPointJson {
                topic: String::from_utf8_lossy(&t.name).into_owned(),
                commit_point: t.commit_point,
                unresolved: t.unresolved,
                oldest_unacked_ms: t.oldest_unacked.as_millis(),
                late_arrivals: t.late_arrivals,
            })
            .collect(),
    })
}
