//! Proves the test harness without the daemon: the independent encoder matches the worked
//! examples of the reference byte for byte, the parsers and generators behave, and records
//! produced by a real client (rdkafka) to the librdkafka mock cluster and to Tansu come back
//! through `consume_all` as exactly the multiset that was sent — and `verify_delivery` does
//! notice when they do not.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::ClientContext;

// ----- encoder -------------------------------------------------------------------------------

#[test]
fn encoder_matches_reference_worked_examples() {
    // §1.4: topic "foo", key "k", value "bar", timestamp 1700000000000.
    let any = encode_any_partition("foo", 1_700_000_000_000, "k", "bar");
    let want_any = unhex(
        "00 00 00 23 01 00 00 00 00 00 00 03 66 6f 6f 00 00 01 8b cf e5 68 00 00 00 00 01 6b \
         00 00 00 03 62 61 72",
    );
    assert_eq!(hex(&any), hex(&want_any));
    assert_eq!(any.len(), 35);

    let pk = encode_partition_key(-2, "foo", 1_700_000_000_000, "k", "bar");
    let want_pk = unhex(
        "00 00 00 27 01 01 00 00 00 00 ff ff ff fe 00 03 66 6f 6f 00 00 01 8b cf e5 68 00 00 \
         00 00 01 6b 00 00 00 03 62 61 72",
    );
    assert_eq!(hex(&pk), hex(&want_pk));
    assert_eq!(pk.len(), 39);
}

#[test]
fn encoder_sizes_follow_the_fixed_overheads() {
    for (t, k, v) in [(1usize, 0usize, 0usize), (7, 3, 1000), (300, 64, 60 * 1024)] {
        let topic = vec![b't'; t];
        let key = vec![1u8; k];
        let value = vec![2u8; v];
        let any = encode_any_partition(&topic, -5, &key, &value);
        assert_eq!(any.len(), 28 + t + k + v);
        assert_eq!(
            i32::from_be_bytes(any[..4].try_into().unwrap()) as usize,
            any.len()
        );
        let pk = encode_partition_key(i32::MIN, &topic, -5, &key, &value);
        assert_eq!(pk.len(), 32 + t + k + v);
        assert_eq!(&pk[10..14], &i32::MIN.to_be_bytes());
        assert_eq!(&pk[4..6], &257i16.to_be_bytes());
    }
}

#[test]
fn malformed_datagrams_are_what_they_claim() {
    let m = malformed_datagrams("topic");
    let reasons = expected_reasons(&m);
    assert_eq!(reasons.get(REASON_MALFORMED), Some(&10));
    assert_eq!(reasons.get(REASON_UNSUPPORTED_API_KEY), Some(&3));
    assert_eq!(reasons.get(REASON_UNSUPPORTED_VERSION), Some(&2));
    for (d, reason) in &m {
        if d.len() < 8 {
            assert_eq!(*reason, REASON_MALFORMED);
            continue;
        }
        let size = i32::from_be_bytes(d[..4].try_into().unwrap());
        let api_key = i16::from_be_bytes(d[4..6].try_into().unwrap());
        let version = i16::from_be_bytes(d[6..8].try_into().unwrap());
        let size_ok = usize::try_from(size).is_ok_and(|s| s == d.len());
        match *reason {
            REASON_UNSUPPORTED_API_KEY => {
                assert!(size_ok && api_key != 256 && api_key != 257)
            }
            REASON_UNSUPPORTED_VERSION => {
                assert!(size_ok && (api_key == 256 || api_key == 257) && version != 0)
            }
            _ => assert!(!size_ok || (version == 0 && (api_key == 256 || api_key == 257))),
        }
    }
}

// ----- generator -----------------------------------------------------------------------------

#[test]
fn generator_is_deterministic_varied_and_within_limits() {
    let a = generate(7, "t", 3000, 1_700_000_000_000);
    let b = generate(7, "t", 3000, 1_700_000_000_000);
    assert_eq!(a.len(), 3000);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.encode(), y.encode());
        assert_eq!(x.input, y.input);
    }
    let c = generate(8, "t", 3000, 1_700_000_000_000);
    assert!(a.iter().zip(&c).any(|(x, y)| x.encode() != y.encode()));

    let count = |f: &dyn Fn(&TestMsg) -> bool| a.iter().filter(|m| f(m)).count();
    for input in [Input::Dgram, Input::Stream, Input::Tcp] {
        assert!(count(&|m| m.input == input) > 500, "{input:?} underused");
    }
    assert!(count(&|m| m.route == Route::AnyPartition) > 1000);
    assert!(count(&|m| matches!(m.route, Route::PartitionKey(k) if k < 0)) > 300);
    assert!(count(&|m| m.key.is_empty()) > 500);
    assert!(count(&|m| m.value.is_empty()) > 5);
    assert!(count(&|m| m.value.len() > 32 * 1024) > 20);
    assert!(count(&|m| m.value.len() == MAX_VALUE) <= 3);
    // Values stay within 60 KiB, except the one datagram of exactly the size limit.
    assert_eq!(count(&|m| m.value.len() > MAX_VALUE), 1);
    assert_eq!(
        count(&|m| m.input == Input::Dgram && m.encode().len() == MAX_DGRAM),
        1
    );
    assert!(a
        .iter()
        .filter(|m| m.input == Input::Dgram)
        .all(|m| m.encode().len() <= MAX_DGRAM));
    // Every PartitionKey message is unique and named by its value.
    for m in a
        .iter()
        .filter(|m| matches!(m.route, Route::PartitionKey(_)))
    {
        assert_eq!(value_id(&m.value), Some(m.id));
    }
    assert!(a
        .iter()
        .all(|m| m.ts <= 1_700_000_000_000 && m.ts > 1_699_999_900_000));
}

// ----- metrics and HTTP ----------------------------------------------------------------------

#[test]
fn metrics_parser_reads_labels_escapes_and_the_invariant() {
    let text = r#"# HELP dory_messages_received_total Messages received.
# TYPE dory_messages_received_total counter
dory_messages_received_total{topic="a\"b\\c\nd"} 5
dory_messages_received_total{topic=""} 3
dory_messages_received_total{topic="x,y}z"} 1e3
dory_messages_delivered_total{topic="a\"b\\c\nd"} 4
dory_messages_delivered_total{topic="x,y}z"} 990
dory_messages_discarded_total{reason="malformed",topic=""} 2
dory_messages_discarded_total{topic="",reason="unsupported_version"} 1 1700000000000
dory_messages_discarded_total{topic="x,y}z",reason="too_long"} 10
dory_messages_in_flight{topic="a\"b\\c\nd"} 0
dory_messages_in_flight{topic="x,y}z"} 0
other_metric 17
"#;
    let m = Metrics::parse(text).expect("parses");
    assert_eq!(m.received("a\"b\\c\nd"), 5);
    assert_eq!(m.received(""), 3);
    assert_eq!(m.received("x,y}z"), 1000);
    assert_eq!(m.discarded("", REASON_MALFORMED), 2);
    assert_eq!(m.discarded("", REASON_UNSUPPORTED_VERSION), 1);
    assert_eq!(m.discarded_total(""), 3);
    assert_eq!(m.samples.len(), 11);
    let v = m.invariant_violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("received 5 != delivered 4"), "{v:?}");

    assert!(Metrics::parse(
        "dory_messages_received_total{topic=\"a\"} 1\ndory_messages_received_total{topic=\"a\"} 2"
    )
    .is_err());
    assert!(Metrics::parse("dory_messages_received_total{topic=\"a} 1").is_err());
    assert!(Metrics::parse("dory_messages_received_total{topic=\"a\"} 1.5").is_err());
    assert!(Metrics::parse("dory_messages_discarded_total{topic=\"a\"} 1").is_err());
}

/// Serves `responses` (one per connection) on a loopback port; returns its address.
fn serve(responses: Vec<Vec<u8>>) -> (std::net::SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = thread::spawn(move || {
        for resp in responses {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "client closed before ending its request");
                req.extend_from_slice(&buf[..n]);
            }
            assert!(req.starts_with(b"GET /metrics HTTP/1.0\r\n"));
            s.write_all(&resp).unwrap();
        }
    });
    (addr, handle)
}

#[test]
fn http_client_reads_sized_and_close_delimited_bodies() {
    let (addr, server) = serve(vec![
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\ncontent-length: 5\r\n\r\nhello".to_vec(),
        b"HTTP/1.0 503 Service Unavailable\r\n\r\nnot yet".to_vec(),
    ]);
    let t = Duration::from_secs(5);
    assert_eq!(
        http_get(addr, "/metrics", t).unwrap(),
        (200, "hello".to_string())
    );
    assert_eq!(
        http_get(addr, "/metrics", t).unwrap(),
        (503, "not yet".to_string())
    );
    server.join().unwrap();
}

// ----- real brokers --------------------------------------------------------------------------

/// Counts failed deliveries of the reference producer.
#[derive(Default)]
struct CountingContext {
    failed: AtomicUsize,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for CountingContext {}

impl ProducerContext for CountingContext {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::SeqCst);
            let mut first = self.first_error.lock().unwrap();
            first.get_or_insert_with(|| e.to_string());
        }
    }
}

/// Produces `msgs` with rdkafka the way dory should: PartitionKey messages to
/// `(key as u32) % partitions`, AnyPartition spread by id, empty keys as null keys, the
/// client timestamp as CreateTime.
fn produce_reference(bootstrap: &str, msgs: &[TestMsg], partitions: i32) {
    let producer: BaseProducer<CountingContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("message.max.bytes", "1000000")
        .set("compression.type", "none")
        .create_with_context(CountingContext::default())
        .expect("create producer");
    let deadline = Instant::now() + Duration::from_secs(60);
    for m in msgs {
        let partition = m
            .expected_partition(partitions)
            .unwrap_or(i32::try_from(m.id).unwrap() % partitions);
        let mut record = BaseRecord::<[u8], [u8]>::to(&m.topic)
            .payload(&m.value[..])
            .partition(partition)
            .timestamp(m.ts);
        if !m.key.is_empty() {
            record = record.key(&m.key[..]);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    assert!(Instant::now() < deadline, "producer queue stayed full");
                    record = r;
                    producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => panic!("produce {}: {e}", m.id),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    let ctx = producer.context();
    assert_eq!(
        ctx.failed.load(Ordering::SeqCst),
        0,
        "reference producer failed deliveries; first: {:?}",
        ctx.first_error.lock().unwrap()
    );
}

fn assert_detects(what: &str, sent: &[TestMsg], got: &[Consumed], partitions: i32, needle: &str) {
    match verify_delivery(sent, got, partitions) {
        Ok(()) => panic!("verify_delivery missed: {what}"),
        Err(report) => assert!(
            report.contains(needle),
            "{what}: report lacks {needle:?}:\n{report}"
        ),
    }
}

/// `verify_delivery` must fail for each kind of damage it exists to catch.
fn check_verifier_catches_damage(sent: &[TestMsg], got: &[Consumed], partitions: i32) {
    let pk_index = got
        .iter()
        .position(|c| {
            let id = value_id(c.value.as_deref().unwrap_or_default());
            id.is_some_and(|id| matches!(sent[id as usize].route, Route::PartitionKey(_)))
        })
        .expect("some PartitionKey record");
    let keyless = got
        .iter()
        .position(|c| c.key.is_none())
        .expect("a null key");

    let mut lost = got.to_vec();
    lost.remove(pk_index);
    assert_detects("a lost record", sent, &lost, partitions, "1 lost");

    let mut dup = got.to_vec();
    dup.push(got[keyless].clone());
    assert_detects("a duplicate", sent, &dup, partitions, "1 extra");

    let mut flipped = got.to_vec();
    let v = flipped[pk_index].value.as_mut().unwrap();
    let last = v.len() - 1;
    v[last] ^= 0x01;
    assert_detects(
        "a damaged value",
        sent,
        &flipped,
        partitions,
        "consumed 0 time(s)",
    );

    let mut moved = got.to_vec();
    moved[pk_index].partition = (moved[pk_index].partition + 1) % partitions;
    assert_detects(
        "a misplaced PartitionKey record",
        sent,
        &moved,
        partitions,
        "must land on",
    );

    let mut late = got.to_vec();
    late[pk_index].timestamp += 1;
    assert_detects(
        "a wrong timestamp",
        sent,
        &late,
        partitions,
        "timestamps sent",
    );

    let mut empty_key = got.to_vec();
    empty_key[keyless].key = Some(Vec::new());
    assert_detects(
        "an empty non-null key",
        sent,
        &empty_key,
        partitions,
        "non-null empty key",
    );
}

fn roundtrip(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    seed: u64,
    count: usize,
) -> Vec<Consumed> {
    let msgs = generate(seed, topic, count, now_ms());
    let started = Instant::now();
    produce_reference(bootstrap, &msgs, partitions);
    let got = consume_all(bootstrap, topic, msgs.len(), Duration::from_secs(60));
    let bytes: usize = msgs.iter().map(|m| m.key.len() + m.value.len()).sum();
    eprintln!(
        "roundtrip {topic}: {} records ({} KiB) produced and consumed back in {:?}",
        got.len(),
        bytes / 1024,
        started.elapsed()
    );
    if let Err(report) = verify_delivery(&msgs, &got, partitions) {
        panic!("{report}");
    }
    assert_eq!(topic_partition_count(bootstrap, topic), partitions);
    check_verifier_catches_damage(&msgs, &got, partitions);
    got
}

#[test]
fn mock_cluster_roundtrip_is_exact() {
    let mock = Mock::start(3);
    mock.create_topic("selftest", 6);
    let leaders = mock.leaders("selftest");
    assert_eq!(
        leaders,
        vec![(0, 1), (1, 2), (2, 3), (3, 1), (4, 2), (5, 3)]
    );
    let got = roundtrip(&mock.bootstrap(), "selftest", 6, 11, 1500);
    let used: std::collections::BTreeSet<i32> = got.iter().map(|c| c.partition).collect();
    assert_eq!(used.len(), 6, "all partitions used");
}

#[test]
fn tansu_roundtrip_is_exact() {
    let tansu = Tansu::start();
    tansu.create_topic("selftest", 3);
    roundtrip(&tansu.bootstrap(), "selftest", 3, 12, 1500);
}

// ----- daemon start -------------------------------------------------------------------------

/// `Dory::start` waits for dory's own listeners: a port counts only while this process
/// listens on it, not another process (pid 1) and not a connected socket.
#[test]
fn listens_on_sees_only_the_processs_own_listener() {
    let me = std::process::id();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    assert!(listens_on(me, port));
    assert!(!listens_on(1, port));
    let client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let client_port = client.local_addr().expect("addr").port();
    assert!(
        !listens_on(me, client_port),
        "a connected socket is no listener"
    );
    drop(listener);
    assert!(!listens_on(me, port));
}
