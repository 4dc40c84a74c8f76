//! The live status page at `GET /` and its JSON feed `GET /status.json`.
//!
//! The page is server-rendered: every section is a `<table>` filled with the values of the
//! request time, so it reads without JavaScript. An inline script (`page.js`, no external
//! assets) polls `/status.json` every 2 s, keeps the last 5 minutes in memory, updates the
//! tables and draws per-topic rate sparklines (received, delivered, discarded) as inline SVG.
//!
//! Cells the script updates carry `data-k` (the value's key) inside rows marked `data-topic`
//! (or `data-reason`, `data-kind`), the same markup on both sides, so tests can read either.

use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

use super::dory::{ctime, to_json};
use crate::report::commit_points::Points;
use crate::report::metrics::{DiscardReason, DiscardReport, Metrics, TopicSnapshot};

const SCRIPT: &str = include_str!("page.js");

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}\
h1{margin:0 0 .2em}h2{font-size:1.1em;margin:1.2em 0 .3em}\
table{border-collapse:collapse}th,td{padding:2px 8px;border-bottom:1px solid #ddd}\
th{text-align:left;background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\
#live{color:#666}.legend span{margin-right:1em}\
.rcv{color:#1f77b4}.dlv{color:#2ca02c}.dsc{color:#d62728}svg{vertical-align:middle}";

/// The endpoint links of the former index page.
const LINKS: [(&str, &str); 7] = [
    ("server_info", "server info"),
    ("counters", "counters"),
    ("discards", "discard reports"),
    ("queues", "queued messages"),
    ("metadata_fetch_time", "metadata fetch time"),
    ("commit_points", "commit points"),
    ("spool", "durable spool"),
];

/// Text for HTML element content and double-quoted attribute values.
fn esc(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn name(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

// ----- the snapshot, shared by the page and the JSON -----

#[derive(Serialize)]
struct Snapshot {
    pid: u32,
    version: String,
    since: u64,
    /// Milliseconds since the epoch.
    now_ms: u64,
    totals: Totals,
    pool: Pool,
    topics: Vec<TopicJson>,
    /// Non-zero discards over all topics, by reason, in reason order.
    discards_by_reason: Vec<ReasonCount>,
    discard_report: ReportJson,
    /// `null` with `commit_points.enable = false`.
    commit_points: Option<CommitPointsJson>,
    /// Every broker connected so far and the protocol dory speaks to it, in id order.
    brokers: Vec<BrokerJson>,
}

#[derive(Serialize)]
struct BrokerJson {
    id: i32,
    address: String,
    produce_version: i16,
    /// `"RecordBatch v2"`, `"MessageSet v1"` (Kafka 0.10) or `"MessageSet v0"` (0.8–0.9).
    message_format: &'static str,
    /// `"ApiVersions"`, or `"kafka.broker_version = 0.9"` when the broker did not answer it.
    found_by: String,
}

#[derive(Serialize, Default)]
struct Totals {
    received: u64,
    delivered: u64,
    discarded: u64,
    in_flight: i64,
    possible_duplicates: u64,
}

#[derive(Serialize)]
struct Pool {
    used: u64,
    capacity: u64,
}

#[derive(Serialize)]
struct TopicJson {
    /// `""`: messages whose topic could not be parsed.
    topic: String,
    received: u64,
    delivered: u64,
    discarded: u64,
    in_flight: i64,
    possible_duplicates: u64,
    new: i64,
    batch: i64,
    send_wait: i64,
    ack_wait: i64,
}

#[derive(Serialize)]
struct ReasonCount {
    reason: &'static str,
    count: u64,
}

#[derive(Serialize)]
struct ReportJson {
    /// Start of the current (unfinished) period, seconds since the epoch.
    start: u64,
    interval_s: u64,
    /// (kind, count) in a fixed order.
    kinds: Vec<(&'static str, u64)>,
}

#[derive(Serialize)]
struct CommitPointsJson {
    overall: Option<i64>,
    unresolved: u64,
    oldest_unacked_ms: u128,
    topics: Vec<CommitPointJson>,
}

#[derive(Serialize)]
struct CommitPointJson {
    topic: String,
    commit_point: Option<i64>,
    unresolved: u64,
    oldest_unacked_ms: u128,
    late_arrivals: u64,
}

fn report_kinds(r: &DiscardReport) -> Vec<(&'static str, u64)> {
    vec![
        ("malformed", r.malformed_count),
        ("unix_stream_unclean", r.unix_stream_unclean_count),
        ("tcp_unclean", r.tcp_unclean_count),
        ("unsupported_api_key", r.unsupported_api_key_count),
        ("unsupported_version", r.unsupported_version_count),
        ("bad_topic", r.bad_topic_count),
        ("rate_limit", r.rate_limit.iter().map(|(_, n)| n).sum()),
        (
            "topic_discards",
            r.discard_topics.iter().map(|(_, t)| t.count).sum(),
        ),
        (
            "possible_duplicates",
            r.possible_duplicate_topics
                .iter()
                .map(|(_, t)| t.count)
                .sum(),
        ),
    ]
}

fn topic_json(t: &TopicSnapshot) -> TopicJson {
    TopicJson {
        topic: name(&t.name),
        received: t.received,
        delivered: t.delivered,
        discarded: t.discarded_total(),
        in_flight: t.in_flight,
        possible_duplicates: t.possible_duplicates,
        new: t.queued.new,
        batch: t.queued.batch,
        send_wait: t.queued.send_wait,
        ack_wait: t.queued.ack_wait,
    }
}

fn commit_points_json(p: &Points) -> CommitPointsJson {
    CommitPointsJson {
        overall: p.overall,
        unresolved: p.unresolved,
        oldest_unacked_ms: p.oldest_unacked.as_millis(),
        topics: p
            .topics
            .iter()
            .map(|t| CommitPointJson {
                topic: name(&t.name),
                commit_point: t.commit_point,
                unresolved: t.unresolved,
                oldest_unacked_ms: t.oldest_unacked.as_millis(),
                late_arrivals: t.late_arrivals,
            })
            .collect(),
    }
}

fn snapshot(m: &Metrics, now_ms: u64) -> Snapshot {
    let topics = m.snapshot_topics();
    let mut totals = Totals::default();
    let mut by_reason = [0u64; DiscardReason::COUNT];
    for t in &topics {
        totals.received += t.received;
        totals.delivered += t.delivered;
        totals.discarded += t.discarded_total();
        totals.in_flight += t.in_flight;
        totals.possible_duplicates += t.possible_duplicates;
        for (sum, n) in by_reason.iter_mut().zip(t.discarded) {
            *sum += n;
        }
    }
    let (capacity, used) = m.pool();
    let reports = m.discard_reports(now_ms / 1000);
    Snapshot {
        pid: m.pid(),
        version: m.version().to_string(),
        since: m.start_secs(),
        now_ms,
        totals,
        pool: Pool { used, capacity },
        // Topic "" is listed only once something has no parsable topic.
        topics: topics
            .iter()
            .filter(|t| !t.name.is_empty() || t.received != 0)
            .map(topic_json)
            .collect(),
        discards_by_reason: DiscardReason::ALL
            .iter()
            .map(|&r| ReasonCount {
                reason: r.as_str(),
                count: by_reason[r.index()],
            })
            .filter(|r| r.count != 0)
            .collect(),
        discard_report: ReportJson {
            start: reports.current.start_secs,
            interval_s: reports.interval.as_secs(),
            kinds: report_kinds(&reports.current),
        },
        commit_points: m
            .commit_points(Instant::now())
            .as_ref()
            .map(commit_points_json),
        brokers: m
            .broker_protocols()
            .snapshot()
            .into_iter()
            .map(|(id, p)| BrokerJson {
                id,
                message_format: p.format_name(),
                found_by: p.found_by(),
                produce_version: p.produce_version,
                address: p.address,
            })
            .collect(),
    }
}

/// `GET /status.json`: the page's data, compact.
pub(super) fn status_json(m: &Metrics, now_ms: u64) -> String {
    to_json(&snapshot(m, now_ms))
}

// ----- the page -----

fn cell(out: &mut String, key: &str, v: impl std::fmt::Display) {
    let _ = write!(out, "<td class=\"n\" data-k=\"{key}\">{v}</td>");
}

fn topic_label(t: &str) -> String {
    if t.is_empty() {
        "<i>(no topic)</i>".into()
    } else {
        esc(t)
    }
}

/// `GET /`: the status page.
pub(super) fn page_html(m: &Metrics, now_ms: u64) -> String {
    let s = snapshot(m, now_ms);
    let mut o = String::with_capacity(8192);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>dory status</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>dory</h1>\n<p>version {} · pid {} · up since {} · \
         <span id=\"now\" data-ms=\"{}\">page rendered {}</span> · \
         <span id=\"live\">static snapshot (reload for new values)</span></p>\n",
        esc(&s.version),
        s.pid,
        esc(&ctime(s.since)),
        s.now_ms,
        esc(&ctime(s.now_ms / 1000)),
    );

    // Totals and pool.
    o.push_str(
        "<h2>Totals</h2>\n<table id=\"totals\">\n<tr><th>received</th><th>delivered</th>\
        <th>discarded</th><th>in flight</th><th>possible duplicates</th><th>pool used</th>\
        <th>pool capacity</th></tr>\n<tr data-row=\"totals\">",
    );
    let t = &s.totals;
    cell(&mut o, "received", t.received);
    cell(&mut o, "delivered", t.delivered);
    cell(&mut o, "discarded", t.discarded);
    cell(&mut o, "in_flight", t.in_flight);
    cell(&mut o, "possible_duplicates", t.possible_duplicates);
    cell(&mut o, "pool_used", s.pool.used);
    cell(&mut o, "pool_capacity", s.pool.capacity);
    o.push_str("</tr>\n</table>\n");

    // Topics.
    o.push_str(
        "<h2>Topics</h2>\n<p class=\"legend\">rates in messages/s over the last 5 minutes: \
         <span class=\"rcv\">received</span><span class=\"dlv\">delivered</span>\
         <span class=\"dsc\">discarded</span></p>\n<table id=\"topics\">\n<thead><tr>\
         <th>topic</th><th>received</th><th>delivered</th><th>discarded</th>\
         <th>in flight</th><th>possible duplicates</th><th>rates (msg/s)</th>\
         <th>last 5 min</th></tr></thead>\n<tbody>\n",
    );
    for t in &s.topics {
        let _ = write!(
            o,
            "<tr data-topic=\"{}\"><td>{}</td>",
            esc(&t.topic),
            topic_label(&t.topic)
        );
        cell(&mut o, "received", t.received);
        cell(&mut o, "delivered", t.delivered);
        cell(&mut o, "discarded", t.discarded);
        cell(&mut o, "in_flight", t.in_flight);
        cell(&mut o, "possible_duplicates", t.possible_duplicates);
        o.push_str("<td data-k=\"rates\">–</td><td data-k=\"spark\"></td></tr>\n");
    }
    o.push_str("</tbody>\n</table>\n");

    // Queues.
    o.push_str(
        "<h2>Queues</h2>\n<table id=\"queues\">\n<thead><tr><th>topic</th><th>new</th>\
         <th>batch</th><th>send_wait</th><th>ack_wait</th></tr></thead>\n<tbody>\n",
    );
    for t in &s.topics {
        let _ = write!(
            o,
            "<tr data-topic=\"{}\"><td>{}</td>",
            esc(&t.topic),
            topic_label(&t.topic)
        );
        cell(&mut o, "new", t.new);
        cell(&mut o, "batch", t.batch);
        cell(&mut o, "send_wait", t.send_wait);
        cell(&mut o, "ack_wait", t.ack_wait);
        o.push_str("</tr>\n");
    }
    o.push_str("</tbody>\n</table>\n");

    // Discards by reason (since start).
    o.push_str(
        "<h2>Discards by reason (since start)</h2>\n<table id=\"reasons\">\n<thead><tr>\
         <th>reason</th><th>messages</th></tr></thead>\n<tbody>\n",
    );
    for r in &s.discards_by_reason {
        let _ = write!(o, "<tr data-reason=\"{0}\"><td>{0}</td>", esc(r.reason));
        cell(&mut o, "count", r.count);
        o.push_str("</tr>\n");
    }
    o.push_str("</tbody>\n</table>\n");

    // Discard report, current period.
    let _ = write!(
        o,
        "<h2>Discard report (current period)</h2>\n<p>period of {} s started \
         <span id=\"report-start\">{}</span>; details: <a href=\"/discards/plain\">plain</a> \
         <a href=\"/discards/json\">json</a></p>\n<table id=\"report\">\n<thead><tr>\
         <th>kind</th><th>count</th></tr></thead>\n<tbody>\n",
        s.discard_report.interval_s,
        esc(&ctime(s.discard_report.start)),
    );
    for (kind, n) in &s.discard_report.kinds {
        let _ = write!(o, "<tr data-kind=\"{kind}\"><td>{kind}</td>");
        cell(&mut o, "count", n);
        o.push_str("</tr>\n");
    }
    o.push_str("</tbody>\n</table>\n");

    // Commit points.
    if let Some(p) = &s.commit_points {
        o.push_str(
            "<h2>Commit points</h2>\n<table id=\"commit_points\">\n<thead><tr><th>topic</th>\
             <th>commit point (ms)</th><th>unresolved</th><th>oldest unacked (ms)</th>\
             <th>late arrivals</th></tr></thead>\n<tbody>\n",
        );
        let point = |c: Option<i64>| c.map_or_else(|| "none".to_string(), |v| v.to_string());
        for t in &p.topics {
            let _ = write!(
                o,
                "<tr data-topic=\"{}\"><td>{}</td>",
                esc(&t.topic),
                topic_label(&t.topic)
            );
            cell(&mut o, "commit_point", point(t.commit_point));
            cell(&mut o, "unresolved", t.unresolved);
            cell(&mut o, "oldest_unacked_ms", t.oldest_unacked_ms);
            cell(&mut o, "late_arrivals", t.late_arrivals);
            o.push_str("</tr>\n");
        }
        o.push_str("<tr data-overall=\"1\"><td><b>overall</b></td>");
        cell(&mut o, "commit_point", point(p.overall));
        cell(&mut o, "unresolved", p.unresolved);
        cell(&mut o, "oldest_unacked_ms", p.oldest_unacked_ms);
        o.push_str("<td></td></tr>\n</tbody>\n</table>\n");
    }

    // Brokers and the protocol spoken to each.
    if !s.brokers.is_empty() {
        o.push_str(
            "<h2>Brokers</h2>\n<table id=\"brokers\">\n<thead><tr><th>id</th><th>address</th>\
             <th>Produce version</th><th>message format</th><th>found by</th></tr></thead>\n\
             <tbody>\n",
        );
        for b in &s.brokers {
            let _ = writeln!(
                o,
                "<tr data-broker=\"{}\"><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
                b.id,
                b.id,
                esc(&b.address),
                b.produce_version,
                b.message_format,
                esc(&b.found_by)
            );
        }
        o.push_str("</tbody>\n</table>\n");
    }

    // The former index: Dory's endpoints.
    o.push_str("<h2>Endpoints</h2>\n<ul>\n");
    for (path, what) in LINKS {
        let _ = writeln!(
            o,
            "<li>{what}: <a href=\"/{path}/plain\">plain</a> <a href=\"/{path}/json\">json</a></li>"
        );
    }
    o.push_str(
        "<li><a href=\"/status.json\">status.json</a> (this page's data)</li>\n\
         <li><a href=\"/health\">health</a></li>\n\
         <li><a href=\"/metrics\">metrics (Prometheus)</a></li>\n</ul>\n\
         <form action=\"/metadata_update\" method=\"post\">\n\
         <input type=\"submit\" value=\"Update metadata\">\n</form>\n",
    );
    let _ = write!(o, "<script>\n{SCRIPT}</script>\n</body>\n</html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::status::tests::populated;

    #[test]
    fn page_tables_hold_the_snapshot() {
        let m = populated();
        let html = page_html(&m, m.start_secs() * 1000);
        for needle in [
            "<tr data-topic=\"zeta\"><td>zeta</td><td class=\"n\" data-k=\"received\">10</td>\
             <td class=\"n\" data-k=\"delivered\">3</td><td class=\"n\" data-k=\"discarded\">2</td>\
             <td class=\"n\" data-k=\"in_flight\">5</td>\
             <td class=\"n\" data-k=\"possible_duplicates\">1</td>",
            "<tr data-topic=\"al&quot;pha\n\\\"><td>al&quot;pha\n\\</td>",
            "<tr data-topic=\"\"><td><i>(no topic)</i></td><td class=\"n\" data-k=\"received\">3</td>",
            "<td class=\"n\" data-k=\"pool_used\">256</td><td class=\"n\" data-k=\"pool_capacity\">1024</td>",
            "<tr data-reason=\"rate_limit\"><td>rate_limit</td><td class=\"n\" data-k=\"count\">2</td>",
            "<tr data-kind=\"malformed\"><td>malformed</td><td class=\"n\" data-k=\"count\">1</td>",
            "<td class=\"n\" data-k=\"new\">2</td><td class=\"n\" data-k=\"batch\">3</td>",
            "<table id=\"commit_points\">",
            "href=\"/discards/json\"",
            "action=\"/metadata_update\" method=\"post\"",
            "<script>\n",
        ] {
            assert!(html.contains(needle), "missing {needle:?} in\n{html}");
        }
        assert!(!html.contains("src=\"http"), "no external assets");
        assert_eq!(
            esc("<a href='x'>&\""),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;"
        );
    }

    #[test]
    fn json_matches_the_metrics() {
        let m = populated();
        let json: serde_json::Value =
            serde_json::from_str(&status_json(&m, 1_700_000_000_000)).expect("JSON");
        assert_eq!(json["now_ms"], 1_700_000_000_000u64);
        assert_eq!(json["totals"]["received"], 14);
        assert_eq!(json["totals"]["discarded"], 6);
        assert_eq!(
            json["pool"],
            serde_json::json!({"used": 256, "capacity": 1024})
        );
        let zeta = json["topics"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["topic"] == "zeta"))
            .expect("zeta");
        assert_eq!(zeta["received"], 10);
        assert_eq!(zeta["in_flight"], 5);
        assert_eq!(zeta["ack_wait"], 1);
        assert_eq!(json["discards_by_reason"][0]["reason"], "malformed");
        assert!(json["commit_points"].is_object());
    }
}
