//! Topics that go away or never come, on the librdkafka mock cluster:
//! * a topic deleted while dory still has it in its metadata. The mock cannot delete
//!   topics, so deletion is what a client sees of it: Metadata answers
//!   UNKNOWN_TOPIC_OR_PARTITION for the topic and Produce requests fail with the same
//!   error. (Tansu is no help here: it keeps accepting Produce requests for a topic it has
//!   deleted.)
//! * a topic the broker will not create although dory asks (auto-creation on): its
//!   messages are held for `unknown_topic_wait_ms`, then discarded as `autocreate_failed`.
//! * more topic names than `input.max_topics`: the extra names' messages are counted under
//!   topic "" as `bad_topic`, and the full table is logged once.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

const WAIT: Duration = Duration::from_secs(60);

fn msgs(topic: &str, ids: std::ops::Range<u32>) -> Vec<TestMsg> {
    ids.map(|id| TestMsg {
        id,
        input: Input::Stream,
        route: Route::AnyPartition,
        topic: topic.to_string(),
        ts: now_ms(),
        key: Vec::new(),
        value: format!("<{id:08}> value of {topic}").into_bytes(),
    })
    .collect()
}

/// Waits until every `(topic, n)` has `n` messages received and all of them settled.
fn settle(dory: &mut Dory, want: &[(&str, u64)]) -> Metrics {
    dory.wait_received(want, WAIT);
    dory.wait_drained(WAIT)
}

#[test]
fn topic_deleted_under_dory_is_discarded_as_bad_topic_and_others_flow_on() {
    let mock = Mock::start(1);
    mock.create_topic("doomed", 2);
    mock.create_topic("kept", 2);
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.batch_time_ms = None;
    // A config file: topic auto-creation is off, so a vanished topic is not recreated.
    args.config_toml = Some("[batching]\ntime_ms = 50\n".into());
    let mut dory = Dory::start(args);
    dory.wait_ready();

    let first = [msgs("doomed", 0..100), msgs("kept", 0..100)];
    dory.send_stream(&first[0]);
    dory.send_stream(&first[1]);
    let m = settle(&mut dory, &[("doomed", 100), ("kept", 100)]);
    assert_eq!((m.delivered("doomed"), m.delivered("kept")), (100, 100));

    // "Delete" doomed, then send to it: the batch's Produce fails, the metadata refresh
    // shows the topic gone, and the rerouted messages are discarded as bad_topic.
    let unknown = RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
    mock.cluster()
        .topic_error("doomed", unknown)
        .expect("set the topic's metadata error");
    mock.cluster()
        .request_errors(RDKafkaApiKey::Produce, &[unknown; 50]);
    dory.send_stream(&msgs("doomed", 100..150));
    let m = settle(&mut dory, &[("doomed", 150), ("kept", 100)]);
    assert_eq!(
        m.delivered("doomed"),
        100,
        "nothing more delivered to doomed"
    );
    assert_eq!(
        m.discards_of("doomed"),
        [("bad_topic".to_string(), 50)].into_iter().collect(),
        "every message sent after the deletion is discarded as bad_topic"
    );

    // Other topics flow on.
    mock.cluster().clear_request_errors(RDKafkaApiKey::Produce);
    let second = msgs("kept", 100..150);
    dory.send_stream(&second);
    let m = settle(&mut dory, &[("doomed", 150), ("kept", 150)]);
    assert_eq!(m.delivered("kept"), 150);
    dory.assert_invariant();

    // What the broker holds of kept is exactly what was sent, read back with CRC checks.
    let mut got: Vec<Vec<u8>> = consume_all(&mock.bootstrap(), "kept", 150, WAIT)
        .into_iter()
        .map(|r| r.value.expect("a value"))
        .collect();
    got.sort();
    let mut want: Vec<Vec<u8>> = first[1]
        .iter()
        .chain(&second)
        .map(|m| m.value.clone())
        .collect();
    want.sort();
    assert_eq!(got, want);
    let status = dory.terminate(WAIT);
    assert!(status.success(), "dory exits 0 on SIGTERM: {status}");
}

#[test]
fn topic_the_broker_will_not_create_is_discarded_as_autocreate_failed() {
    let mock = Mock::start(1);
    mock.create_topic("kept", 2);
    // Metadata answers the topic with an error, however often dory asks to create it.
    mock.cluster()
        .topic_error(
            "refused",
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .expect("set the topic's metadata error");
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.batch_time_ms = None;
    args.config_toml = Some(
        "[batching]\ntime_ms = 50\n\
         [delivery]\ntopic_autocreate = true\nunknown_topic_wait_ms = 1500\n"
            .into(),
    );
    let mut dory = Dory::start(args);
    dory.wait_ready();

    let kept = msgs("kept", 0..40);
    dory.send_stream(&msgs("refused", 0..40));
    dory.send_stream(&kept);
    let m = settle(&mut dory, &[("refused", 40), ("kept", 40)]);
    assert_eq!(
        m.discards_of("refused"),
        [("autocreate_failed".to_string(), 40)]
            .into_iter()
            .collect(),
        "every message for the topic that never appeared"
    );
    assert_eq!(m.delivered("refused"), 0);
    assert_eq!(m.delivered("kept"), 40, "other topics are not held up");
    let logs = dory.logs();
    assert!(
        logs.contains("unknown topic [refused] (autocreate_failed)"),
        "the discard is logged:\n{logs}"
    );
    let status = dory.terminate(WAIT);
    assert!(status.success(), "dory exits 0 on SIGTERM: {status}");
}

#[test]
fn topics_beyond_max_topics_are_counted_as_bad_topic_under_no_topic() {
    let mock = Mock::start(1);
    for t in ["t1", "t2", "t3"] {
        mock.create_topic(t, 1);
    }
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.batch_time_ms = None;
    args.config_toml = Some("[input]\nmax_topics = 3\n[batching]\ntime_ms = 50\n".into());
    let mut dory = Dory::start(args);
    dory.wait_ready();

    // Three topics fit; the fourth and fifth names find the table full. One connection,
    // so the names reach the table in this order.
    let all: Vec<TestMsg> = ["t1", "t2", "t3", "t4", "t5"]
        .iter()
        .flat_map(|t| msgs(t, 0..10))
        .collect();
    dory.send_stream(&all);
    let m = settle(&mut dory, &[("t1", 10), ("t2", 10), ("t3", 10), ("", 20)]);
    for t in ["t1", "t2", "t3"] {
        assert_eq!(m.delivered(t), 10, "{t} delivered");
    }
    assert_eq!(
        m.discards_of(""),
        [("bad_topic".to_string(), 20)].into_iter().collect(),
        "messages for topics beyond the table are counted under \"\""
    );
    assert_eq!(m.received("t4") + m.received("t5"), 0, "no series for them");
    let logs = dory.logs();
    assert_eq!(
        logs.matches("topic table full: 3 distinct topic names")
            .count(),
        1,
        "logged once:\n{logs}"
    );
    let status = dory.terminate(WAIT);
    assert!(status.success(), "dory exits 0 on SIGTERM: {status}");
}
