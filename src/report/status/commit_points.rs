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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::report::commit_points::TopicPoint;
    use crate::report::metrics::MetricsConfig;

    fn points() -> Points {
        let topic = |name: &str, cp, unresolved, age_ms, late| TopicPoint {
            name: Arc::from(name.as_bytes()),
            commit_point: cp,
            unresolved,
            oldest_unacked: Duration::from_millis(age_ms),
            late_arrivals: late,
        };
        Points::new(
            vec![
                topic("zeta", Some(1_700_000_000_500), 0, 0, 0),
                topic("alpha", Some(1_700_000_000_099), 4, 250, 1),
            ],
            [
                (None, Some(1_700_000_000_500)),
                (Some(1_700_000_000_100), Some(1_700_000_000_300)),
            ],
        )
    }

    #[test]
    fn plain_shape() {
        let m = Metrics::new(MetricsConfig::default());
        let now = 1_700_000_001_234;
        let s = m.start_secs();
        let expected = format!(
            "pid: {}\nversion: {}\nsince: {s} {}\n\
             now (milliseconds since epoch): {now} {}\n\n\
             commit_point: {:>14}  unresolved: {:10}  oldest_unacked_ms: {:10}  late_arrivals: {:10}  topic: [alpha]\n\
             commit_point: {:>14}  unresolved: {:10}  oldest_unacked_ms: {:10}  late_arrivals: {:10}  topic: [zeta]\n\n\
             commit_point: {:>14}  unresolved: {:10}  oldest_unacked_ms: {:10}  overall\n",
            std::process::id(),
            m.version(),
            ctime(s),
            ctime(now / 1000),
            1_700_000_000_099i64,
            4,
            250,
            1,
            1_700_000_000_500i64,
            0,
            0,
            0,
            1_700_000_000_099i64,
            4,
            250,
        );
        assert_eq!(commit_points_plain(&m, &points(), now), expected);
        let empty = commit_points_plain(&m, &Points::default(), now);
        assert!(
            empty.ends_with(&format!(
                "\n\ncommit_point: {:>14}  unresolved: {:10}  oldest_unacked_ms: {:10}  overall\n",
                "none", 0, 0
            )),
            "{empty}"
        );
    }

    #[test]
    fn json_shape() {
        let m = Metrics::new(MetricsConfig::default());
        let text = commit_points_json(&m, &points(), 1_700_000_001_234);
        let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(json["now"], 1_700_000_001_234u64);
        assert_eq!(
            json["overall"],
            serde_json::json!({
                "commit_point": 1_700_000_000_099i64,
                "unresolved": 4,
                "oldest_unacked_ms": 250,
            })
        );
        assert_eq!(json["topics"][0]["topic"], "alpha");
        assert_eq!(json["topics"][0]["late_arrivals"], 1);
        assert_eq!(json["topics"][1]["commit_point"], 1_700_000_000_500i64);
        let keys = [
            "\"pid\"",
            "\"version\"",
            "\"since\"",
            "\"now\"",
            "\"overall\"",
            "\"topics\"",
        ];
        let mut at = 0;
        for k in keys {
            let found = text[at..]
                .find(k)
                .unwrap_or_else(|| panic!("{k} in order: {text}"));
            at += found + k.len();
        }
        assert!(
            text.contains("\n    \"pid\""),
            "4-space indentation: {text}"
        );
        let empty = commit_points_json(&m, &Points::default(), 5);
        let json: serde_json::Value = serde_json::from_str(&empty).expect("JSON");
        assert_eq!(json["overall"]["commit_point"], serde_json::Value::Null);
    }
}
