//! `/health` (ready once inputs are open and metadata was fetched) and Prometheus
//! `/metrics` (per-topic accounting, discards by reason, pool use).

use std::fmt::Write as _;

use super::Reply;
use crate::report::metrics::{DiscardReason, Health, Idempotence, Metrics};

pub(super) fn health(m: &Metrics) -> Reply {
    match m.health() {
        Health::Ready => Reply::text(200, "ok\n".into()),
        Health::InputsOpen => Reply::text(
            503,
            "not ready: waiting for the first metadata fetch\n".into(),
        ),
        Health::Starting => Reply::text(503, "not ready: inputs not open yet\n".into()),
    }
}

/// A label value escaped per the text exposition format; non-UTF-8 bytes become U+FFFD.
fn label(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn prometheus(m: &Metrics) -> String {
    let topics = m.snapshot_topics();
    let labels: Vec<String> = topics.iter().map(|t| label(&t.name)).collect();
    let mut out = String::new();
    fn family(out: &mut String, name: &str, kind: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
    }

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
    for (t, l) in topics.iter().zip(&labels) {
        let _ = writeln!(out, "{name}{{topic=\"{l}\"}} {}", t.possible_duplicates);
    }

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

    let (capacity, used) = m.pool();
    family(&mut out, "dory_pool_bytes", "gauge", "Message pool bytes.");
    let _ = writeln!(out, "dory_pool_bytes{{state=\"used\"}} {used}");
    let _ = writeln!(out, "dory_pool_bytes{{state=\"capacity\"}} {capacity}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::status::tests::populated;

    #[test]
    fn prometheus_shape() {
        let m = populated();
        let text = prometheus(&m);
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
            "dory_possible_duplicates_total{topic=\"zeta\"} 1\n",
            "dory_pool_bytes{state=\"used\"} 256\n",
            "dory_pool_bytes{state=\"capacity\"} 1024\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("reason=\"shutdown\""));
        for line in text.lines() {
            assert!(
                line.starts_with("# ") || line.starts_with("dory_"),
                "{line}"
            );
        }
        assert_eq!(label(b"a\xffb"), "a\u{fffd}b");
    }
}
