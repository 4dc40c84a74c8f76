//! `/health` (ready once inputs are open and metadata was fetched) and Prometheus
//! `/metrics` (per-topic accounting, discards by reason, pool use, delivery latency,
//! commit points).
//!
//! Per topic, `/metrics` carries by default only what loss alerts need (received,
//! delivered, discarded by reason, in flight); the other per-topic families are summed
//! over topics (the latency histograms merged, the oldest age the maximum, the spool's
//! synced point the minimum). `status.per_topic_metrics = "all"` breaks every family down
//! per topic, and `/metrics?topic=NAME` does so for one topic. At 10,000 topics that is
//! 1.7 MB a scrape instead of 17 MB (91 kB gzipped).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Reply;
use crate::config::PerTopicMetrics;
use crate::report::commit_points::{LatencySnapshot, Points, TopicPoint, LATENCY_BOUNDS};
use crate::report::metrics::{Counter, DiscardReason, Health, Idempotence, Metrics, TopicSnapshot};
use crate::spool::SpoolSnapshot;

pub(super) fn health(m: &Metrics) -> Reply {
    if let Some(why) = m.security_problem() {
        return Reply::text(503, format!("not ok: no broker is usable\n{why}\n"));
    }
    match m.health() {
        Health::Ready => Reply::text(200, "ok\n".into()),
        Health::InputsOpen => {
            let mut body = String::from("not ready: waiting for the first metadata fetch\n");
            if let Some((why, failures)) = m.metadata_failure() {
                let fetches = if failures == 1 { "fetch" } else { "fetches" };
                let _ = writeln!(
                    body,
                    "{failures} {fetches} failed in a row, the last: {why}"
                );
            }
            Reply::text(503, body)
        }
        Health::Starting => Reply::text(503, "not ready: inputs not open yet\n".into()),
    }
}

/// A label value escaped per the text exposition format; non-UTF-8 bytes become U+FFFD.
/// Borrowed when nothing needs escaping (nearly every topic name): a scrape at 10,000
/// topics then makes no copy of the names.
fn label(raw: &[u8]) -> Cow<'_, str> {
    let s = String::from_utf8_lossy(raw);
    if !s.contains(['\\', '"', '\n']) {
        return s;
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// What one scrape breaks down per topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope<'a> {
    /// The setting's choice, over every topic.
    Configured,
    /// Every family, for this topic only (`/metrics?topic=NAME`).
    Topic(&'a [u8]),
}

/// The `/metrics` text, or `None` when `scope` names a topic dory has not seen.
pub(super) fn prometheus(m: &Metrics, scope: Scope<'_>) -> Option<String> {
    let mut topics = m.snapshot_topics();
    let (detail, only) = match scope {
        Scope::Configured => (m.per_topic_metrics() == PerTopicMetrics::All, None),
        Scope::Topic(name) => {
            topics.retain(|t| &*t.name == name);
            if topics.is_empty() {
                return None;
            }
            (true, Some(name))
        }
    };
    let labels: Vec<Cow<'_, str>> = topics.iter().map(|t| label(&t.name)).collect();
    let mut out = String::new();

    family(&mut out, "dory_up", "gauge", "Whether the daemon is up.");
    out.push_str("dory_up 1\n");

    let per_topic = [
        (
            "dory_messages_received_total",
            "counter",
            "Messages received from clients, per topic (\"\" = no parsable topic).",
        ),
        (
            "dory_messages_delivered_total",
            "counter",
            "Messages acknowledged by Kafka, per topic.",
        ),
    ];
    for (i, (name, kind, help)) in per_topic.into_iter().enumerate() {
        family(&mut out, name, kind, help);
        for (t, l) in topics.iter().zip(&labels) {
            let v = if i == 0 { t.received } else { t.delivered };
            let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {v}");
        }
    }

    let name = "dory_messages_discarded_total";
    family(
        &mut out,
        name,
        "counter",
        "Messages discarded, per topic and reason.",
    );
    for (t, l) in topics.iter().zip(&labels) {
        for reason in DiscardReason::ALL {
            let v = t.discarded(reason);
            if v != 0 {
                let r = reason.as_str();
                let _ = writeln!(out, "{name}{{topic=\"{l}\",reason=\"{r}\"}} {v}");
            }
        }
    }

    let name = "dory_messages_in_flight";
    family(
        &mut out,
        name,
        "gauge",
        "Messages received but neither delivered nor discarded yet, per topic.",
    );
    for (t, l) in topics.iter().zip(&labels) {
        let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", t.in_flight);
    }

    let name = "dory_possible_duplicates_total";
    family(
        &mut out,
        name,
        "counter",
        "Messages sent again after an unacknowledged send, per topic.",
    );
    per_topic_or_sum(&mut out, name, &topics, &labels, detail, |t| {
        t.possible_duplicates
    });

    let name = "dory_resent_in_doubt_total";
    family(
        &mut out,
        name,
        "counter",
        "Messages of idempotent batches in doubt (connection lost before the answer, or answered after the append), sent again under the same sequence (a KIP-98 broker stores them once), per topic.",
    );
    per_topic_or_sum(&mut out, name, &topics, &labels, detail, |t| {
        t.resent_in_doubt
    });

    let (state, producer_id, epoch) = m.idempotence();
    family(
        &mut out,
        "dory_idempotence_enabled",
        "gauge",
        "1 while record batches carry a producer id and sequence numbers (no duplicates on resend).",
    );
    let on = u8::from(matches!(state, Idempotence::On | Idempotence::Resetting));
    let _ = writeln!(
        out,
        "dory_idempotence_enabled{{state=\"{}\"}} {on}",
        state.as_str()
    );
    family(
        &mut out,
        "dory_producer_id",
        "gauge",
        "The idempotent producer's id (-1: none).",
    );
    let _ = writeln!(out, "dory_producer_id {producer_id}");
    family(
        &mut out,
        "dory_producer_epoch",
        "gauge",
        "The idempotent producer's epoch (-1: none).",
    );
    let _ = writeln!(out, "dory_producer_epoch {epoch}");

    let name = "dory_broker_connection_errors_total";
    family(
        &mut out,
        name,
        "counter",
        "Broker connections refused for security reasons: TLS (handshake or session) or auth (SASL).",
    );
    for (kind, c) in [
        ("tls", Counter::ConnectorTlsFail),
        ("auth", Counter::ConnectorAuthFail),
    ] {
        let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {}", m.get(c));
    }

    let brokers = m.broker_protocols().snapshot();
    family(
        &mut out,
        "dory_broker_produce_version",
        "gauge",
        "The Produce version dory speaks to each broker it connected to.",
    );
    for (id, p) in &brokers {
        let _ = writeln!(
            out,
            "dory_broker_produce_version{{broker=\"{id}\"}} {}",
            p.produce_version
        );
    }
    family(
        &mut out,
        "dory_broker_message_format",
        "gauge",
        "The record format version (magic) dory sends to each broker: 0, 1 (MessageSet, Kafka 0.8-0.10) or 2 (RecordBatch).",
    );
    for (id, p) in &brokers {
        let _ = writeln!(
            out,
            "dory_broker_message_format{{broker=\"{id}\"}} {}",
            p.magic
        );
    }

    let (capacity, used) = m.pool();
    family(&mut out, "dory_pool_bytes", "gauge", "Message pool bytes.");
    let _ = writeln!(out, "dory_pool_bytes{{state=\"used\"}} {used}");
    let _ = writeln!(out, "dory_pool_bytes{{state=\"capacity\"}} {capacity}");
    prometheus_latency(&mut out, m, &topics, &labels, detail);
    if let Some(mut p) = m.commit_points(Instant::now()) {
        if let Some(name) = only {
            p.topics.retain(|t| &*t.name == name);
        }
        prometheus_commit_points(&mut out, &p, detail);
    }
    let name = "dory_commit_points_file_errors_total";
    family(
        &mut out,
        name,
        "counter",
        "Failed writes of the commit points state file.",
    );
    let errors = m.commit_points_file_errors().load(Ordering::Relaxed);
    let _ = writeln!(out, "{name} {errors}");
    if let Some(s) = m.spool_snapshot() {
        prometheus_spool(&mut out, m, &s, detail, only);
    }
    Some(out)
}

/// One value per topic, or (`detail` false) their sum without a topic label.
fn per_topic_or_sum(
    out: &mut String,
    name: &str,
    topics: &[TopicSnapshot],
    labels: &[Cow<'_, str>],
    detail: bool,
    value: impl Fn(&TopicSnapshot) -> u64,
) {
    if detail {
        for (t, l) in topics.iter().zip(labels) {
            let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", value(t));
        }
    } else {
        let sum: u64 = topics.iter().map(&value).sum();
        let _ = writeln!(out, "{name} {sum}");
    }
}

/// The durable spool's families (only when a spool is configured).
fn prometheus_spool(
    out: &mut String,
    m: &Metrics,
    s: &SpoolSnapshot,
    detail: bool,
    only: Option<&[u8]>,
) {
    let plain: [(&str, &str, &str, u64); 9] = [
        (
            "dory_spool_bytes",
            "gauge",
            "Bytes of spool segment files on disk.",
            s.bytes,
        ),
        (
            "dory_spool_segments",
            "gauge",
            "Spool segment files on disk (active, unresolved, spare).",
            s.segments,
        ),
        (
            "dory_spool_live_segments",
            "gauge",
            "Spool segments holding unresolved messages.",
            s.live_segments,
        ),
        (
            "dory_spool_appended_total",
            "counter",
            "Messages appended to the spool.",
            s.appended_records,
        ),
        (
            "dory_spool_synced_total",
            "counter",
            "Appended messages made durable by a sync.",
            s.synced_records,
        ),
        (
            "dory_spool_corrupt_bytes_total",
            "counter",
            "Bytes recovery skipped (torn or corrupt records, unreadable headers).",
            s.corrupt_bytes,
        ),
        (
            "dory_spool_unreadable_segments_total",
            "counter",
            "Segment files recovery moved aside (future format, bad header).",
            s.unreadable_segments,
        ),
        (
            "dory_spool_write_errors_total",
            "counter",
            "Failed segment creations and writes.",
            s.write_errors,
        ),
        (
            "dory_spool_sync_errors_total",
            "counter",
            "Failed fdatasync calls.",
            s.sync_errors,
        ),
    ];
    for (name, kind, help, v) in plain {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    }
    let name = "dory_spool_sync_seconds";
    family(
        out,
        name,
        "histogram",
        "Duration of each spool group commit (fdatasync).",
    );
    histogram_series(out, name, "", &s.sync_latency);
    let mut topics = m.spool_topics();
    if let Some(name) = only {
        topics.retain(|(t, _, _)| &**t == name);
    }
    let name = "dory_spool_recovered_total";
    family(
        out,
        name,
        "counter",
        "Messages replayed from the spool at start, per topic (or in all).",
    );
    if detail {
        for (t, recovered, _) in &topics {
            let _ = writeln!(out, "{name}{{topic=\"{}\"}} {recovered}", label(t));
        }
    } else {
        let _ = writeln!(out, "{name} {}", s.recovered);
    }
    let name = "dory_spool_synced_point_timestamp_seconds";
    family(
        out,
        name,
        "gauge",
        "Per spooled topic (or the lowest of them): every message received with a timestamp at or below it is on disk.",
    );
    if detail {
        for (t, _, point) in &topics {
            if let Some(p) = point {
                let _ = writeln!(
                    out,
                    "{name}{{topic=\"{}\"}} {}",
                    label(t),
                    ms_as_seconds(i128::from(*p))
                );
            }
        }
    } else if let Some(p) = topics.iter().filter_map(|(_, _, p)| *p).min() {
        let _ = writeln!(out, "{name} {}", ms_as_seconds(i128::from(p)));
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Milliseconds as Prometheus seconds, exactly (`1234` → `1.234`).
fn ms_as_seconds(ms: i128) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let abs = ms.unsigned_abs();
    format!("{sign}{}.{:03}", abs / 1000, abs % 1000)
}

/// The delivery latency histogram of every topic that had a message acknowledged, or
/// (`detail` false) all of them merged into one.
fn prometheus_latency(
    out: &mut String,
    m: &Metrics,
    topics: &[TopicSnapshot],
    labels: &[Cow<'_, str>],
    detail: bool,
) {
    let name = "dory_delivery_latency_seconds";
    family(
        out,
        name,
        "histogram",
        "Time from receipt by dory to acknowledgement by Kafka, per topic (or over all).",
    );
    let mut all: Option<LatencySnapshot> = None;
    for (t, l) in topics.iter().zip(labels) {
        let h = m.latency(t.id);
        if h.count() == 0 {
            continue;
        }
        if detail {
            histogram_series(out, name, &format!("topic=\"{l}\""), &h);
        } else if let Some(a) = &mut all {
            a.merge(&h);
        } else {
            all = Some(h);
        }
    }
    if let Some(a) = all {
        histogram_series(out, name, "", &a);
    }
}

/// The `le` label of each latency bucket, formatted once rather than per series (a scrape
/// writes one histogram per topic).
static LE_LABELS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    LATENCY_BOUNDS
        .iter()
        .map(|b| b.as_secs_f64().to_string())
        .chain(["+Inf".to_string()])
        .collect()
});

/// One histogram series over [`LATENCY_BOUNDS`]: its buckets, sum and count, each with
/// `labels` (`key="value",...`, or empty) before `le`.
fn histogram_series(out: &mut String, name: &str, labels: &str, h: &LatencySnapshot) {
    let (open, sep, close) = if labels.is_empty() {
        ("", "", "")
    } else {
        ("{", ",", "}")
    };
    // Pieces pushed one by one: the format machinery cost most of a 1,000-topic scrape.
    for (le, n) in LE_LABELS.iter().zip(h.cumulative) {
        for piece in [name, "_bucket{", labels, sep, "le=\"", le, "\"} "] {
            out.push_str(piece);
        }
        let _ = writeln!(out, "{n}");
    }
    let _ = writeln!(
        out,
        "{name}_sum{open}{labels}{close} {}",
        h.sum.as_secs_f64()
    );
    let _ = writeln!(out, "{name}_count{open}{labels}{close} {}", h.count());
}

/// Commit point gauges (seconds, millisecond precision) and the oldest unacknowledged age;
/// with `detail` false, no per-topic commit points, the oldest age over all topics and the
/// late arrivals summed.
fn prometheus_commit_points(out: &mut String, p: &Points, detail: bool) {
    let with_labels: Vec<(&TopicPoint, Cow<'_, str>)> =
        p.topics.iter().map(|t| (t, label(&t.name))).collect();
    let name = "dory_commit_point_timestamp_seconds";
    family(
        out,
        name,
        "gauge",
        "Commit point per topic: every message with a client timestamp up to this one was \
         acknowledged or counted as discarded.",
    );
    for (t, l) in with_labels.iter().filter(|_| detail) {
        if let Some(cp) = t.commit_point {
            let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", ms_as_seconds(cp.into()));
        }
    }
    let name = "dory_commit_point_overall_timestamp_seconds";
    family(out, name, "gauge", "Commit point over all topics together.");
    if let Some(cp) = p.overall {
        let _ = writeln!(out, "{name} {}", ms_as_seconds(cp.into()));
    }
    let name = "dory_oldest_unacknowledged_age_seconds";
    family(
        out,
        name,
        "gauge",
        "Age of the oldest message neither acknowledged nor discarded, per topic or over all (0: none).",
    );
    let age = |d: std::time::Duration| ms_as_seconds(d.as_millis().try_into().unwrap_or(i128::MAX));
    if detail {
        for (t, l) in &with_labels {
            let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", age(t.oldest_unacked));
        }
    } else {
        let oldest = p
            .topics
            .iter()
            .map(|t| t.oldest_unacked)
            .max()
            .unwrap_or_default();
        let _ = writeln!(out, "{name} {}", age(oldest));
    }
    let name = "dory_commit_point_late_arrivals_total";
    family(
        out,
        name,
        "counter",
        "Messages that arrived with a timestamp at or below their topic's commit point.",
    );
    if detail {
        for (t, l) in &with_labels {
            let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", t.late_arrivals);
        }
    } else {
        let sum: u64 = p.topics.iter().map(|t| t.late_arrivals).sum();
        let _ = writeln!(out, "{name} {sum}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::status::tests::populated;

    fn scrape(m: &Metrics) -> String {
        prometheus(m, Scope::Configured).expect("every topic")
    }

    fn all_per_topic() -> crate::report::metrics::MetricsConfig {
        crate::report::metrics::MetricsConfig {
            per_topic_metrics: PerTopicMetrics::All,
            ..Default::default()
        }
    }

    #[test]
    fn prometheus_shape() {
        let m = populated();
        let text = scrape(&m);
        for line in [
            "# TYPE dory_up gauge\ndory_up 1\n",
            "# TYPE dory_messages_received_total counter\n",
            "dory_messages_received_total{topic=\"\"} 3\n",
            "dory_messages_received_total{topic=\"zeta\"} 10\n",
            "dory_messages_received_total{topic=\"al\\\"pha\\n\\\\\"} 1\n",
            "dory_messages_delivered_total{topic=\"zeta\"} 3\n",
            "dory_messages_discarded_total{topic=\"zeta\",reason=\"rate_limit\"} 2\n",
            "dory_messages_discarded_total{topic=\"al\\\"pha\\n\\\\\",reason=\"bad_topic\"} 1\n",
            "dory_messages_discarded_total{topic=\"\",reason=\"malformed\"} 1\n",
            "dory_messages_discarded_total{topic=\"\",reason=\"unclean_disconnect\"} 2\n",
            "dory_messages_in_flight{topic=\"zeta\"} 5\n",
            "dory_messages_in_flight{topic=\"\"} 0\n",
            "dory_possible_duplicates_total 1\n",
            "dory_resent_in_doubt_total 0\n",
            "dory_pool_bytes{state=\"used\"} 256\n",
            "dory_pool_bytes{state=\"capacity\"} 1024\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("reason=\"shutdown\""));
        // By default only the accounting families are per topic.
        assert!(!text.contains("dory_possible_duplicates_total{"), "{text}");
        // One topic's page has every family for it, and no other topic.
        let zeta = prometheus(&m, Scope::Topic(b"zeta")).expect("known topic");
        for line in [
            "dory_messages_received_total{topic=\"zeta\"} 10\n",
            "dory_messages_discarded_total{topic=\"zeta\",reason=\"rate_limit\"} 2\n",
            "dory_possible_duplicates_total{topic=\"zeta\"} 1\n",
            "dory_pool_bytes{state=\"used\"} 256\n",
        ] {
            assert!(zeta.contains(line), "missing {line:?} in\n{zeta}");
        }
        assert!(!zeta.contains("topic=\"\""), "{zeta}");
        assert!(!zeta.contains("pha"), "{zeta}");
        assert_eq!(prometheus(&m, Scope::Topic(b"nope")), None);
        for line in text.lines() {
            assert!(
                line.starts_with("# ") || line.starts_with("dory_"),
                "{line}"
            );
        }
        assert_eq!(label(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(label(b"a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert!(matches!(label(b"plain.topic-1"), Cow::Borrowed(_)));
    }

    #[test]
    fn latency_and_commit_point_families() {
        let pool = crate::pool::Pool::new_static(1 << 16).expect("pool");
        let m = Metrics::new(all_per_topic());
        let (a, b) = (m.topic_id(b"a").expect("id"), m.topic_id(b"b").expect("id"));
        let t0 = Instant::now();
        let msgs = |t, ts: &[i64]| -> Vec<crate::pipeline::Msg> {
            ts.iter()
                .map(|&ts| crate::pipeline::Msg::for_test(pool, t, ts, 1, t0))
                .collect()
        };
        let (acked, held) = (
            msgs(a, &[1_700_000_000_001, 1_700_000_000_002]),
            msgs(b, &[1_234]),
        );
        m.track_received(a, acked.iter());
        m.track_received(b, held.iter());
        m.track_delivered(a, &acked, t0 + std::time::Duration::from_millis(30));
        let text = scrape(&m);
        for line in [
            "# TYPE dory_delivery_latency_seconds histogram\n",
            "dory_delivery_latency_seconds_bucket{topic=\"a\",le=\"0.025\"} 0\n",
            "dory_delivery_latency_seconds_bucket{topic=\"a\",le=\"0.05\"} 2\n",
            "dory_delivery_latency_seconds_bucket{topic=\"a\",le=\"60\"} 2\n",
            "dory_delivery_latency_seconds_bucket{topic=\"a\",le=\"+Inf\"} 2\n",
            "dory_delivery_latency_seconds_sum{topic=\"a\"} 0.06\n",
            "dory_delivery_latency_seconds_count{topic=\"a\"} 2\n",
            "# TYPE dory_commit_point_timestamp_seconds gauge\n",
            "dory_commit_point_timestamp_seconds{topic=\"a\"} 1700000000.002\n",
            "dory_commit_point_timestamp_seconds{topic=\"b\"} 1.233\n",
            "dory_commit_point_overall_timestamp_seconds 1.233\n",
            "dory_oldest_unacknowledged_age_seconds{topic=\"a\"} 0.000\n",
            "dory_commit_point_late_arrivals_total{topic=\"b\"} 0\n",
            "dory_commit_points_file_errors_total 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains("latency_seconds_count{topic=\"b\"}"),
            "{text}"
        );
        assert_eq!(ms_as_seconds(-1_500), "-1.500");
        assert_eq!(ms_as_seconds(7), "0.007");

        // The default: the same families summed over topics, without the topic label.
        let m2 = Metrics::new(crate::report::metrics::MetricsConfig::default());
        let (a2, b2) = (
            m2.topic_id(b"a").expect("id"),
            m2.topic_id(b"b").expect("id"),
        );
        m2.track_received(a2, acked.iter());
        m2.track_received(b2, held.iter());
        m2.track_delivered(a2, &acked, t0 + std::time::Duration::from_millis(30));
        m2.track_delivered(b2, &held, t0 + std::time::Duration::from_millis(3));
        // A third topic holds a message: the oldest age over all topics is its age, once
        // that has grown past 20 ms (polled, 5 s at most).
        let c2 = m2.topic_id(b"c").expect("id");
        let waiting = [crate::pipeline::Msg::for_test(
            pool,
            c2,
            99,
            1,
            Instant::now(),
        )];
        m2.track_received(c2, waiting.iter());
        let oldest = |text: &str, prefix: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .expect("an oldest age")
                .parse()
                .expect("seconds")
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let c = prometheus(&m2, Scope::Topic(b"c")).expect("known");
            if oldest(&c, "dory_oldest_unacknowledged_age_seconds{topic=\"c\"} ") >= 0.02 {
                break;
            }
            assert!(Instant::now() < deadline, "the age never grew");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let text = scrape(&m2);
        let all = oldest(&text, "dory_oldest_unacknowledged_age_seconds ");
        assert!(all >= 0.02, "{all}");
        for line in [
            "dory_delivery_latency_seconds_bucket{le=\"0.001\"} 0\n",
            "dory_delivery_latency_seconds_bucket{le=\"0.005\"} 1\n",
            "dory_delivery_latency_seconds_bucket{le=\"0.05\"} 3\n",
            "dory_delivery_latency_seconds_count 3\n",
            "dory_commit_point_overall_timestamp_seconds 0.098\n",
            "dory_commit_point_late_arrivals_total 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        for family in [
            "dory_delivery_latency_seconds_count{",
            "dory_commit_point_timestamp_seconds{",
            "dory_oldest_unacknowledged_age_seconds{",
        ] {
            assert!(!text.contains(family), "{family} in\n{text}");
        }
    }

    /// Issue 29: at 10,000 topics the default scrape stays under 2 MB with every topic's
    /// accounting in it; the full breakdown is several times larger.
    #[test]
    fn a_scrape_at_10000_topics_stays_under_2_mb() {
        let pool = crate::pool::Pool::new_static(1 << 20).expect("pool");
        let n = 10_000;
        let cfg = |per_topic_metrics| crate::report::metrics::MetricsConfig {
            max_topics: n,
            per_topic_metrics,
            ..Default::default()
        };
        let fill = |m: &Metrics| {
            let t0 = Instant::now();
            for i in 0..n {
                let t = m.topic_id(format!("topic-{i:05}").as_bytes()).expect("id");
                m.received(t, 1_000_000);
                let msgs: Vec<crate::pipeline::Msg> = (0..2)
                    .map(|k| crate::pipeline::Msg::for_test(pool, t, 1_700_000_000_000 + k, 1, t0))
                    .collect();
                m.track_received(t, msgs.iter());
                m.delivered(t, 999_000);
                m.track_delivered(t, &msgs, t0 + std::time::Duration::from_millis(7));
                if i % 10 == 0 {
                    m.discarded(t, DiscardReason::RateLimit, 10, 1, 2);
                }
            }
        };
        let m = Metrics::new(cfg(PerTopicMetrics::Accounting));
        fill(&m);
        let text = scrape(&m);
        let series = |family: &str| text.lines().filter(|l| l.starts_with(family)).count();
        assert_eq!(series("dory_messages_received_total{topic=\"topic-"), n);
        assert_eq!(series("dory_messages_delivered_total{topic=\"topic-"), n);
        assert_eq!(series("dory_messages_in_flight{topic=\"topic-"), n);
        assert_eq!(
            series("dory_messages_discarded_total{topic=\"topic-"),
            n / 10
        );
        assert!(text.len() <= 2_000_000, "{} bytes", text.len());
        let full = Metrics::new(cfg(PerTopicMetrics::All));
        fill(&full);
        let full_text = scrape(&full);
        assert_eq!(series("dory_delivery_latency_seconds_count"), 1);
        assert!(
            full_text.len() > 5 * text.len(),
            "{} vs {}",
            full_text.len(),
            text.len()
        );
        println!(
            "METRICS_SIZE topics={n} accounting={} all={} accounting_gzip={}",
            text.len(),
            full_text.len(),
            super::super::gzipped(text.as_bytes()).len()
        );
    }
}
