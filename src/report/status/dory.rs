//! Dory's status pages with their exact shapes: `/server_info`, `/counters`, `/discards`,
//! `/queues` and `/metadata_fetch_time`, each as plain text and as JSON.

use std::fmt::Write as _;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::Serialize;

use std::sync::Arc;

use crate::report::metrics::{Counter, DiscardReport, Metrics, TopicRange};

/// Location printed for every counter. Dory printed the C++ source location; monitoring
/// only needs it to be stable.
const COUNTER_LOCATION: &str = "[dory, 0]";

// ----- time -----

/// C `ctime()` text of `secs` in local time, without the newline
/// (e.g. `Thu Aug 21 14:26:57 2014`).
pub(super) fn ctime(secs: u64) -> String {
    let Ok(t) = libc::time_t::try_from(secs) else {
        return String::from("?");
    };
    // SAFETY: `tm` is plain old data for which all-zero bytes are a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers refer to live, properly aligned locals; localtime_r is the
    // re-entrant variant and writes only into `tm`.
    let converted = unsafe { libc::localtime_r(&t, &mut tm) };
    if converted.is_null() {
        return String::from("?");
    }
    let mut buf = [0u8; 64];
    // SAFETY: `buf` is writable for `buf.len()` bytes, the format is NUL-terminated and `tm`
    // was filled in by localtime_r. strftime writes at most `buf.len()` bytes and returns
    // how many it wrote (0 on overflow).
    let n = unsafe {
        libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%a %b %e %H:%M:%S %Y".as_ptr(),
            &tm,
        )
    };
    String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned()
}

// ----- plain text -----

pub(super) fn header_plain(m: &Metrics, now_secs: u64) -> String {
    let mut out = String::new();
    push_id_lines(&mut out, m);
    let _ = writeln!(out, "now: {now_secs} {}", ctime(now_secs));
    out
}

/// The `pid`, `version` and `since` lines every plain response starts with.
pub(super) fn push_id_lines(out: &mut String, m: &Metrics) {
    let since = m.start_secs();
    let _ = writeln!(out, "pid: {}", m.pid());
    let _ = writeln!(out, "version: {}", m.version());
    let _ = writeln!(out, "since: {since} {}", ctime(since));
}

pub(super) fn counters_plain(m: &Metrics, now_secs: u64) -> String {
    let mut out = header_plain(m, now_secs);
    out.push('\n');
    for &c in Counter::ALL {
        let _ = writeln!(out, "{COUNTER_LOCATION}.{}={}", c.name(), m.get(c));
    }
    out
}

pub(super) fn discards_plain(m: &Metrics, now_secs: u64) -> String {
    let reports = m.discard_reports(now_secs);
    let mut out = header_plain(m, now_secs);
    let _ = writeln!(
        out,
        "report interval in seconds: {}",
        reports.interval.as_secs()
    );
    out.push('\n');
    report_plain(
        &mut out,
        "current (unfinished) reporting period",
        &reports.current,
    );
    if let Some(f) = &reports.finished {
        out.push('\n');
        report_plain(&mut out, "latest finished reporting period", f);
    }
    out
}

fn report_plain(out: &mut String, title: &str, r: &DiscardReport) {
    let _ = writeln!(out, "{title}:");
    let _ = writeln!(out, "    report ID: {}", r.id);
    let _ = writeln!(
        out,
        "    start time: {} {}",
        r.start_secs,
        ctime(r.start_secs)
    );
    let _ = writeln!(out, "    malformed msg count: {}", r.malformed_count);
    let _ = writeln!(
        out,
        "    UNIX stream unclean disconnect count: {}",
        r.unix_stream_unclean_count
    );
    let _ = writeln!(
        out,
        "    TCP unclean disconnect count: {}",
        r.tcp_unclean_count
    );
    let _ = writeln!(
        out,
        "    unsupported API key msg count: {}",
        r.unsupported_api_key_count
    );
    let _ = writeln!(
        out,
        "    unsupported version msg count: {}",
        r.unsupported_version_count
    );
    let _ = writeln!(out, "    bad topic msg count: {}", r.bad_topic_count);

    // Each optional group: only when non-empty, preceded by one empty line.
    fn group<T>(out: &mut String, items: &[T], mut line: impl FnMut(&mut String, &T)) {
        if !items.is_empty() {
            out.push('\n');
            for item in items {
                line(out, item);
            }
        }
    }
    group(out, &r.recent_malformed, |o, p| {
        let _ = writeln!(o, "    recent malformed msg: {}", b64_len_bracketed(p));
    });
    group(out, &r.recent_unix_stream_unclean, |o, p| {
        let _ = writeln!(
            o,
            "    recent UNIX stream unclean disconnect msg: {}",
            b64_len_bracketed(p)
        );
    });
    group(out, &r.recent_tcp_unclean, |o, p| {
        let _ = writeln!(
            o,
            "    recent TCP unclean disconnect msg: {}",
            b64_len_bracketed(p)
        );
    });
    group(out, &r.unsupported_versions, |o, (v, n)| {
        let _ = writeln!(o, "    unsupported msg version: {v} count: {n}");
    });
    group(out, &r.recent_bad_topics, |o, t| {
        let _ = writeln!(o, "    recent bad topic: {}", len_bracketed(t));
    });
    group(out, &r.recent_too_long, |o, p| {
        let _ = writeln!(o, "    recent too long msg: {}", b64_len_bracketed(p));
    });
    group(out, &r.rate_limit, |o, (t, n)| {
        let _ = writeln!(
            o,
            "    rate limit discard topic: {} count {n}",
            len_bracketed(t)
        );
    });
    group(out, &r.discard_topics, |o, (t, range)| {
        let _ = writeln!(o, "    discard topic: {}", range_plain(t, range));
    });
    group(out, &r.possible_duplicate_topics, |o, (t, range)| {
        let _ = writeln!(o, "    possible duplicate topic: {}", range_plain(t, range));
    });
}

fn range_plain(topic: &[u8], r: &TopicRange) -> String {
    format!(
        "{} begin [{}] end [{}] count {}",
        len_bracketed(topic),
        r.min_timestamp,
        r.max_timestamp,
        r.count
    )
}

/// `<raw byte length>[<topic>]`, the topic shown as (lossy) UTF-8.
fn len_bracketed(topic: &[u8]) -> String {
    format!("{}[{}]", topic.len(), String::from_utf8_lossy(topic))
}

/// `<base64 length>[<base64>]`.
fn b64_len_bracketed(raw: &[u8]) -> String {
    let b = BASE64.encode(raw);
    format!("{}[{b}]", b.len())
}

/// Topics with messages in the batch, send-wait or ack-wait state, sorted by name, and the
/// totals of all four states over every topic.
struct Queues {
    sending: Vec<(String, i64, i64, i64)>,
    totals: [i64; 4],
}

fn queues(m: &Metrics) -> Queues {
    let mut sending = Vec::new();
    let mut totals = [0i64; 4];
    let mut topics = m.snapshot_topics();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    for t in topics {
        let q = t.queued;
        for (total, v) in totals
            .iter_mut()
            .zip([q.new, q.batch, q.send_wait, q.ack_wait])
        {
            *total += v;
        }
        if q.batch != 0 || q.send_wait != 0 || q.ack_wait != 0 {
            let name = String::from_utf8_lossy(&t.name).into_owned();
            sending.push((name, q.batch, q.send_wait, q.ack_wait));
        }
    }
    Queues { sending, totals }
}

pub(super) fn queues_plain(m: &Metrics, now_secs: u64) -> String {
    let q = queues(m);
    let mut out = header_plain(m, now_secs);
    out.push('\n');
    for (topic, batch, send_wait, ack_wait) in &q.sending {
        let _ = writeln!(
            out,
            "batch: {batch:10}  send_wait: {send_wait:10}  ack_wait: {ack_wait:10}  topic: [{topic}]"
        );
    }
    if !q.sending.is_empty() {
        out.push('\n');
    }
    let [new, batch, send_wait, ack_wait] = q.totals;
    let _ = writeln!(out, "{new:10} total new");
    let _ = writeln!(out, "{batch:10} total batch");
    let _ = writeln!(out, "{send_wait:10} total send_wait");
    let _ = writeln!(out, "{ack_wait:10} total ack_wait");
    let all = new + batch + send_wait + ack_wait;
    let _ = writeln!(
        out,
        "{all:10} total (all states: new + batch + send_wait + ack_wait)"
    );
    out
}

pub(super) fn metadata_fetch_time_plain(m: &Metrics, now_ms: u64) -> String {
    let (updated, modified) = m.metadata_times_ms();
    let mut out = String::new();
    push_id_lines(&mut out, m);
    for (label, ms) in [
        ("now (milliseconds since epoch)", now_ms),
        (
            "metadata last updated at (milliseconds since epoch)",
            updated,
        ),
        (
            "metadata last modified at (milliseconds since epoch)",
            modified,
        ),
    ] {
        let _ = writeln!(out, "{label}: {ms} {}", ctime(ms / 1000));
    }
    out
}

// ----- JSON -----

/// Pretty JSON with the original's 4-space indentation. Key order is the field order of
/// the structs below.
pub(super) fn to_json<T: Serialize>(value: &T) -> String {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    if let Err(e) = value.serialize(&mut ser) {
        // Cannot happen for these types (string keys, no maps); keep serving anyway.
        log::error!("status: serializing JSON: {e}");
        return String::from("{}\n");
    }
    buf.push(b'\n');
    String::from_utf8_lossy(&buf).into_owned()
}

#[derive(Serialize)]
struct ServerInfoJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
}

pub(super) fn server_info_json(m: &Metrics, now_secs: u64) -> String {
    to_json(&ServerInfoJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
    })
}

#[derive(Serialize)]
struct CountersJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    counters: Vec<CounterJson>,
}

#[derive(Serialize)]
struct CounterJson {
    location: &'static str,
    name: &'static str,
    value: u64,
}

pub(super) fn counters_json(m: &Metrics, now_secs: u64) -> String {
    to_json(&CountersJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
        counters: Counter::ALL
            .iter()
            .map(|&c| CounterJson {
                location: COUNTER_LOCATION,
                name: c.name(),
                value: m.get(c),
            })
            .collect(),
    })
}

#[derive(Serialize)]
struct MetadataFetchTimeJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    last_updated: u64,
    last_modified: u64,
}

pub(super) fn metadata_fetch_time_json(m: &Metrics, now_ms: u64) -> String {
    let (last_updated, last_modified) = m.metadata_times_ms();
    to_json(&MetadataFetchTimeJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_ms,
        last_updated,
        last_modified,
    })
}

#[derive(Serialize)]
struct QueuesJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    sending: Vec<QueueTopicJson>,
    new: i64,
}

#[derive(Serialize)]
struct QueueTopicJson {
    topic: String,
    batch: i64,
    send_wait: i64,
    ack_wait: i64,
}

pub(super) fn queues_json(m: &Metrics, now_secs: u64) -> String {
    let q = queues(m);
    to_json(&QueuesJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
        sending: q
            .sending
            .into_iter()
            .map(|(topic, batch, send_wait, ack_wait)| QueueTopicJson {
                topic,
                batch,
                send_wait,
                ack_wait,
            })
            .collect(),
        new: q.totals[0],
    })
}

#[derive(Serialize)]
struct DiscardsJson<'a> {
    pid: u32,
    version: &'a str,
    since: u64,
    now: u64,
    interval: u64,
    unfinished_report: ReportJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_report: Option<ReportJson>,
}

#[derive(Serialize)]
struct ReportJson {
    id: u64,
    start_time: u64,
    malformed_msg_count: u64,
    unix_stream_unclean_disconnect_count: u64,
    tcp_unclean_disconnect_count: u64,
    unsupported_api_key_msg_count: u64,
    unsupported_version_msg_count: u64,
    bad_topic_msg_count: u64,
    recent_malformed: Vec<String>,
    unix_stream_unclean_disconnect: Vec<String>,
    tcp_unclean_disconnect: Vec<String>,
    unsupported_msg_version: Vec<VersionCountJson>,
    recent_bad_topic: Vec<String>,
    recent_too_long_msg: Vec<String>,
    rate_limit_discard: Vec<TopicCountJson>,
    discard_topic: Vec<TopicRangeJson>,
    possible_duplicate_topic: Vec<TopicRangeJson>,
}

#[derive(Serialize)]
struct VersionCountJson {
    version: i16,
    count: u64,
}

#[derive(Serialize)]
struct TopicCountJson {
    topic: String,
    count: u64,
}

#[derive(Serialize)]
struct TopicRangeJson {
    topic: String,
    min_timestamp: i64,
    max_timestamp: i64,
    count: u64,
}

impl ReportJson {
    fn new(r: &DiscardReport) -> Self {
        let b64 = |v: &[Box<[u8]>]| v.iter().map(|p| BASE64.encode(p)).collect();
        let lossy = |t: &[u8]| String::from_utf8_lossy(t).into_owned();
        let ranges = |v: &[(Arc<[u8]>, TopicRange)]| {
            v.iter()
                .map(|(t, r)| TopicRangeJson {
                    topic: lossy(t),
                    min_timestamp: r.min_timestamp,
                    max_timestamp: r.max_timestamp,
                    count: r.count,
                })
                .collect()
        };
        ReportJson {
            id: r.id,
            start_time: r.start_secs,
            malformed_msg_count: r.malformed_count,
            unix_stream_unclean_disconnect_count: r.unix_stream_unclean_count,
            tcp_unclean_disconnect_count: r.tcp_unclean_count,
            unsupported_api_key_msg_count: r.unsupported_api_key_count,
            unsupported_version_msg_count: r.unsupported_version_count,
            bad_topic_msg_count: r.bad_topic_count,
            recent_malformed: b64(&r.recent_malformed),
            unix_stream_unclean_disconnect: b64(&r.recent_unix_stream_unclean),
            // Dory filled this from the UNIX stream list (quirk 12); this is the TCP list.
            tcp_unclean_disconnect: b64(&r.recent_tcp_unclean),
            unsupported_msg_version: r
                .unsupported_versions
                .iter()
                .map(|&(version, count)| VersionCountJson { version, count })
                .collect(),
            recent_bad_topic: r.recent_bad_topics.iter().map(|t| lossy(t)).collect(),
            recent_too_long_msg: b64(&r.recent_too_long),
            rate_limit_discard: r
                .rate_limit
                .iter()
                .map(|(t, count)| TopicCountJson {
                    topic: lossy(t),
                    count: *count,
                })
                .collect(),
            discard_topic: ranges(&r.discard_topics),
            possible_duplicate_topic: ranges(&r.possible_duplicate_topics),
        }
    }
}

pub(super) fn discards_json(m: &Metrics, now_secs: u64) -> String {
    let reports = m.discard_reports(now_secs);
    to_json(&DiscardsJson {
        pid: m.pid(),
        version: m.version(),
        since: m.start_secs(),
        now: now_secs,
        interval: reports.interval.as_secs(),
        unfinished_report: ReportJson::new(&reports.current),
        finished_report: reports.finished.as_ref().map(ReportJson::new),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::NO_TOPIC;
    use crate::report::metrics::MetricsConfig;
    use crate::report::status::tests::populated;

    fn expected_header(m: &Metrics, now: u64) -> String {
        let s = m.start_secs();
        format!(
            "pid: {}\nversion: 1.2.3-test\nsince: {s} {}\nnow: {now} {}\n",
            std::process::id(),
            ctime(s),
            ctime(now)
        )
    }

    #[test]
    fn ctime_has_c_shape() {
        let s = ctime(1_408_656_417);
        assert_eq!(s.len(), 24, "{s:?}");
        let parts: Vec<&str> = s.split(' ').filter(|p| !p.is_empty()).collect();
        assert_eq!(parts.len(), 5, "{s:?}");
        assert!(["Wed", "Thu", "Fri"].contains(&parts[0]));
        assert_eq!(parts[1], "Aug");
        assert_eq!(parts[4], "2014");
        assert_eq!(&s[13..14], ":");
        // %e pads single-digit days with a space, as ctime does.
        let feb5 = ctime(86_400 * 35 + 43_200);
        assert_eq!(&feb5[4..10], "Feb  5", "{feb5:?}");
    }

    #[test]
    fn server_info_shapes() {
        let m = populated();
        let now = m.start_secs() + 1;
        assert_eq!(header_plain(&m, now), expected_header(&m, now));
        let json: serde_json::Value = serde_json::from_str(&server_info_json(&m, now)).unwrap();
        let text = server_info_json(&m, now);
        assert!(text.starts_with("{\n    \"pid\": "), "{text}");
        assert_order(&text, &["\"pid\"", "\"version\"", "\"since\"", "\"now\""]);
        assert_eq!(json["version"], "1.2.3-test");
        assert_eq!(json["now"], now);
    }

    fn assert_order(text: &str, keys: &[&str]) {
        let mut at = 0;
        for k in keys {
            let found = text[at..].find(k);
            assert!(found.is_some(), "{k} missing or out of order in {text}");
            at += found.unwrap_or(0) + k.len();
        }
    }

    #[test]
    fn counters_shapes() {
        let m = populated();
        let now = m.start_secs() + 1;
        let plain = counters_plain(&m, now);
        let expected_start = format!("{}\n[dory, 0].MsgCreate=1\n", expected_header(&m, now));
        assert!(plain.starts_with(&expected_start), "{plain}");
        assert!(plain.contains("\n[dory, 0].AckErrorUndocumented=0\n"));
        assert_eq!(plain.lines().count(), 5 + Counter::COUNT);
        let text = counters_json(&m, now);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"counters\"",
            ],
        );
        assert_order(&text, &["\"location\"", "\"name\"", "\"value\""]);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let counters = json["counters"].as_array().unwrap();
        assert_eq!(counters.len(), Counter::COUNT);
        assert_eq!(counters[0]["name"], "MsgCreate");
        assert_eq!(counters[0]["value"], 1);
        assert_eq!(counters[0]["location"], "[dory, 0]");
    }

    #[test]
    fn discards_plain_shape() {
        let m = populated();
        let now = m.start_secs() + 1;
        let s = m.start_secs();
        let expected = format!(
            "{}report interval in seconds: 600\n\
             \n\
             current (unfinished) reporting period:\n\
             \x20   report ID: 0\n\
             \x20   start time: {s} {}\n\
             \x20   malformed msg count: 1\n\
             \x20   UNIX stream unclean disconnect count: 1\n\
             \x20   TCP unclean disconnect count: 1\n\
             \x20   unsupported API key msg count: 0\n\
             \x20   unsupported version msg count: 0\n\
             \x20   bad topic msg count: 1\n\
             \n\
             \x20   recent malformed msg: 8[AQIDBA==]\n\
             \n\
             \x20   recent UNIX stream unclean disconnect msg: 4[YWI=]\n\
             \n\
             \x20   recent TCP unclean disconnect msg: 8[dGNwIQ==]\n\
             \n\
             \x20   recent bad topic: 8[al\"pha\n\\]\n\
             \n\
             \x20   rate limit discard topic: 4[zeta] count 2\n\
             \n\
             \x20   discard topic: 4[zeta] begin [100] end [200] count 2\n\
             \n\
             \x20   possible duplicate topic: 4[zeta] begin [150] end [150] count 1\n",
            expected_header(&m, now),
            ctime(s)
        );
        assert_eq!(discards_plain(&m, now), expected);
    }

    #[test]
    fn discards_plain_with_finished_period() {
        let m = populated();
        let now = m.start_secs() + 600;
        let text = discards_plain(&m, now);
        assert!(text.contains(
            "    bad topic msg count: 0\n\nlatest finished reporting period:\n    report ID: 0\n"
        ));
        assert!(text.contains("current (unfinished) reporting period:\n    report ID: 1\n"));
    }

    #[test]
    fn discards_json_shape() {
        let m = populated();
        let now = m.start_secs() + 1;
        let text = discards_json(&m, now);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"interval\"",
                "\"unfinished_report\"",
            ],
        );
        assert_order(
            &text,
            &[
                "\"id\"",
                "\"start_time\"",
                "\"malformed_msg_count\"",
                "\"unix_stream_unclean_disconnect_count\"",
                "\"tcp_unclean_disconnect_count\"",
                "\"unsupported_api_key_msg_count\"",
                "\"unsupported_version_msg_count\"",
                "\"bad_topic_msg_count\"",
                "\"recent_malformed\"",
                "\"unix_stream_unclean_disconnect\"",
                "\"tcp_unclean_disconnect\"",
                "\"unsupported_msg_version\"",
                "\"recent_bad_topic\"",
                "\"recent_too_long_msg\"",
                "\"rate_limit_discard\"",
                "\"discard_topic\"",
                "\"possible_duplicate_topic\"",
            ],
        );
        assert_order(
            &text,
            &[
                "\"topic\"",
                "\"min_timestamp\"",
                "\"max_timestamp\"",
                "\"count\"",
            ],
        );
        assert!(!text.contains("\"finished_report\""));
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let r = &json["unfinished_report"];
        assert_eq!(json["interval"], 600);
        assert_eq!(r["id"], 0);
        assert_eq!(r["start_time"], m.start_secs());
        assert_eq!(r["recent_malformed"][0], "AQIDBA==");
        assert_eq!(r["unix_stream_unclean_disconnect"][0], "YWI=");
        assert_eq!(r["tcp_unclean_disconnect"][0], "dGNwIQ==");
        assert_eq!(r["recent_bad_topic"][0], "al\"pha\n\\");
        assert_eq!(r["rate_limit_discard"][0]["topic"], "zeta");
        assert_eq!(r["rate_limit_discard"][0]["count"], 2);
        assert_eq!(r["discard_topic"][0]["min_timestamp"], 100);
        assert_eq!(r["discard_topic"][0]["max_timestamp"], 200);
        assert_eq!(r["possible_duplicate_topic"][0]["count"], 1);
        assert_eq!(r["unsupported_msg_version"], serde_json::json!([]));

        let text = discards_json(&m, m.start_secs() + 600);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["finished_report"]["id"], 0);
        assert_eq!(json["finished_report"]["malformed_msg_count"], 1);
        assert_eq!(json["unfinished_report"]["id"], 1);
    }

    #[test]
    fn unsupported_versions_listed() {
        let m = populated();
        m.received(NO_TOPIC, 2);
        m.unsupported_version(7, b"");
        m.unsupported_version(2, b"");
        let now = m.start_secs() + 1;
        let plain = discards_plain(&m, now);
        assert!(plain.contains(
            "\n\n    unsupported msg version: 2 count: 1\n    unsupported msg version: 7 count: 1\n"
        ));
        let json: serde_json::Value = serde_json::from_str(&discards_json(&m, now)).unwrap();
        assert_eq!(
            json["unfinished_report"]["unsupported_msg_version"],
            serde_json::json!([{"version": 2, "count": 1}, {"version": 7, "count": 1}])
        );
    }

    #[test]
    fn queues_shapes() {
        let m = populated();
        let now = m.start_secs() + 1;
        let expected = format!(
            "{}\nbatch: {:>10}  send_wait: {:>10}  ack_wait: {:>10}  topic: [zeta]\n\n\
             {:>10} total new\n{:>10} total batch\n{:>10} total send_wait\n\
             {:>10} total ack_wait\n\
             {:>10} total (all states: new + batch + send_wait + ack_wait)\n",
            expected_header(&m, now),
            3,
            0,
            1,
            2,
            3,
            0,
            1,
            6
        );
        assert_eq!(queues_plain(&m, now), expected);
        let text = queues_json(&m, now);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"sending\"",
                "\"new\"",
            ],
        );
        assert_order(
            &text,
            &["\"topic\"", "\"batch\"", "\"send_wait\"", "\"ack_wait\""],
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json["sending"],
            serde_json::json!([{"topic": "zeta", "batch": 3, "send_wait": 0, "ack_wait": 1}])
        );
        assert_eq!(json["new"], 2);

        let empty = Metrics::new(MetricsConfig::default());
        let text = queues_plain(&empty, 5);
        assert!(!text.contains("topic:"));
        assert!(text.contains(&format!("\n\n{:>10} total new\n", 0)));
    }

    #[test]
    fn metadata_fetch_time_shapes() {
        let m = populated();
        let now_ms = m.start_secs() * 1000 + 1234;
        let plain = metadata_fetch_time_plain(&m, now_ms);
        let s = m.start_secs();
        let expected = format!(
            "pid: {}\nversion: 1.2.3-test\nsince: {s} {}\n\
             now (milliseconds since epoch): {now_ms} {}\n\
             metadata last updated at (milliseconds since epoch): 0 {}\n\
             metadata last modified at (milliseconds since epoch): 0 {}\n",
            std::process::id(),
            ctime(s),
            ctime(now_ms / 1000),
            ctime(0),
            ctime(0)
        );
        assert_eq!(plain, expected);
        m.metadata_updated(true);
        let text = metadata_fetch_time_json(&m, now_ms);
        assert_order(
            &text,
            &[
                "\"pid\"",
                "\"version\"",
                "\"since\"",
                "\"now\"",
                "\"last_updated\"",
                "\"last_modified\"",
            ],
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["now"], now_ms);
        assert!(json["last_updated"].as_u64().unwrap() > 0);
        assert_eq!(json["last_updated"], json["last_modified"]);
    }
}
