//! Kafka 0.8–0.10 (issue 27): MessageSet v0 and v1 as an independent producer writes them.
//!
//! librdkafka produces through a proxy (tests/common/proxy.rs) that keeps a copy of every
//! Produce request: with `broker.version.fallback = 0.9.0` and no ApiVersions it speaks
//! Produce v1 with magic-0 messages; told by ApiVersions (the proxy lowers the broker's
//! answer to Produce v2, as a 0.10 broker offers), Produce v2 with magic-1 messages. Neither the
//! librdkafka mock nor Tansu stores these formats (the mock answers UNSUPPORTED_VERSION to
//! any magic but 2; Tansu decodes only RecordBatch v2), so the broker behind the proxy,
//! Tansu, refuses them: the requests are what the test is after. dory's decoder
//! (`kafka::message_set`) must read every captured set field by field, and dory's writer
//! must encode each uncompressed message to the same bytes librdkafka wrote. Then dory
//! itself goes through the proxy as to a 0.10 broker (ApiVersions capped) and to 0.9 and
//! 0.8 brokers (ApiVersions refused, `kafka.broker_version` set).

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::proxy::FaultProxy;
use common::*;
use dory::kafka::compression::{self, Codec, Compression};
use dory::kafka::message_set::{decode_message_set, DecodedMessage, Magic, MessageSetWriter};
use dory::kafka::primitives::Reader;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const COUNT: usize = 20;
const TOPIC: &str = "old";

/// `batching.message_max_bytes` of the dory-side tests: small, so that batches fill to it
/// and a MessageSet v1 (34 bytes an entry, where the router counts 26) would pass it if the
/// dispatcher did not re-count.
const MESSAGE_MAX_BYTES: usize = 2_000;

/// One captured partition's records: (Produce version, message set bytes).
struct Captured {
    version: i16,
    set: Vec<u8>,
}

/// The message sets of a Produce v0–v2 request frame (size prefix included).
fn produce_sets(frame: &[u8]) -> Vec<Captured> {
    let mut r = Reader::new(&frame[4..]);
    let api_key = r.i16().unwrap();
    assert_eq!(api_key, 0, "a Produce request");
    let version = r.i16().unwrap();
    r.i32().unwrap(); // correlation id
    r.nullable_string().unwrap(); // client id
    assert!(
        version <= 2,
        "Produce v{version}: the fallback did not hold"
    );
    r.i16().unwrap(); // acks
    r.i32().unwrap(); // timeout
    let mut out = Vec::new();
    for _ in 0..r.array_len(2).unwrap() {
        r.string().unwrap();
        for _ in 0..r.array_len(8).unwrap() {
            r.i32().unwrap(); // partition
            let set = r.bytes_field().unwrap().to_vec();
            out.push(Captured { version, set });
        }
    }
    r.finish().expect("nothing after the topics");
    out
}

/// librdkafka (`broker.version.fallback = fallback`, codec `codec`) produces [`COUNT`]
/// messages (key `k<i>`, value `v<i>...`, timestamp `ts0 + i`) through a capturing proxy in
/// front of Tansu; returns the first request's message set and its Produce version. A
/// `fallback` of 0.9.0 turns ApiVersions off (the proxy would close the connection on it,
/// as a 0.9 broker does); 0.10.0 asks for it and the proxy offers Produce v2 at most, as a
/// 0.10 broker does (librdkafka keeps no 0.10 fallback table).
fn capture(fallback: &str, codec: &str, ts0: i64) -> Captured {
    let proxy_port = free_port();
    let tansu = Tansu::start_advertising(proxy_port);
    tansu.create_topic(TOPIC, 1);
    let listener = TcpListener::bind(("127.0.0.1", proxy_port)).expect("bind the proxy");
    let proxy = FaultProxy::start(listener, tansu.port());
    if fallback == "0.10.0" {
        proxy.cap_api_version(0, 2);
    } else {
        proxy.refuse_api_versions();
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", format!("127.0.0.1:{proxy_port}"))
        .set("api.version.request", (fallback == "0.10.0").to_string())
        .set("broker.version.fallback", fallback)
        .set("compression.codec", codec)
        .set("linger.ms", "50")
        .set("message.timeout.ms", "5000")
        .set("log_level", "3")
        .create()
        .expect("librdkafka producer");
    for i in 0..COUNT {
        let (key, value) = (format!("k{i}"), format!("v{i}-{}", "x".repeat(40)));
        producer
            .send(
                BaseRecord::to(TOPIC)
                    .key(&key)
                    .payload(&value)
                    .timestamp(ts0 + i as i64),
            )
            .expect("enqueue");
    }
    let sets = poll_until(
        &format!("a Produce request from librdkafka ({fallback}, {codec})"),
        Duration::from_secs(20),
        || {
            producer.poll(Duration::from_millis(50));
            let sets: Vec<Captured> = proxy
                .produce_requests()
                .iter()
                .flat_map(|f| produce_sets(f))
                .collect();
            if sets.is_empty() {
                Err("none yet".into())
            } else {
                Ok(sets)
            }
        },
    );
    // Tansu refuses the old format; nothing more is wanted from librdkafka.
    let _ = producer.flush(Duration::from_millis(100));
    sets.into_iter().next().expect("one set at least")
}

/// Checks the decoded messages against what librdkafka was given.
fn check_messages(got: &[DecodedMessage], magic: Magic, codec: Codec, ts0: i64) {
    assert_eq!(got.len(), COUNT, "every message in one set");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.magic, magic.byte(), "message {i}");
        assert_eq!(m.key.as_deref(), Some(format!("k{i}").as_bytes()));
        let value = format!("v{i}-{}", "x".repeat(40));
        assert_eq!(m.value.as_deref(), Some(value.as_bytes()));
        let ts = (magic == Magic::V1).then_some(ts0 + i as i64);
        assert_eq!(m.timestamp, ts, "message {i}");
        let wrapper = (codec != Codec::None).then_some(codec);
        assert_eq!(m.wrapper, wrapper, "message {i}");
    }
}

/// dory's writer, given the same messages, writes each entry to the same bytes as
/// librdkafka did, the offset aside (the broker assigns it).
fn check_reencoded(set: &[u8], got: &[DecodedMessage], magic: Magic) {
    let none = Compression::new(Codec::None, None).unwrap();
    let (mut ours, mut scratch) = (Vec::new(), Vec::new());
    let mut w = MessageSetWriter::begin(magic, none, &mut scratch);
    for m in got {
        w.append(
            &mut ours,
            m.timestamp.unwrap_or(0),
            m.key.as_deref(),
            m.value.as_deref(),
        );
    }
    let _ = w.finish(&mut ours, &scratch, 100);
    assert_eq!(ours.len(), set.len(), "same set length");
    let (mut a, mut b) = (Reader::new(set), Reader::new(&ours));
    while !a.is_empty() {
        a.i64().unwrap();
        b.i64().unwrap();
        let (na, nb) = (a.i32().unwrap(), b.i32().unwrap());
        assert_eq!(na, nb);
        let n = usize::try_from(na).unwrap();
        assert_eq!(
            a.bytes(n).unwrap(),
            b.bytes(n).unwrap(),
            "entry bytes differ"
        );
    }
}

fn round(fallback: &str, magic: Magic, produce_version: i16) {
    let ts0 = now_ms() - 5000;
    for (name, codec) in [
        ("none", Codec::None),
        ("gzip", Codec::Gzip),
        ("snappy", Codec::Snappy),
        ("lz4", Codec::Lz4),
    ] {
        let c = capture(fallback, name, ts0);
        assert_eq!(c.version, produce_version, "{fallback} {name}");
        let got = decode_message_set(&c.set, 1 << 20)
            .unwrap_or_else(|e| panic!("{fallback} {name}: dory cannot decode: {e:?}"));
        check_messages(&got, magic, codec, ts0);
        match codec {
            Codec::None => check_reencoded(&c.set, &got, magic),
            Codec::Lz4 => {
                // The frame's header checksum is the one each version's brokers expect,
                // the one dory writes (compression::compress_lz4_legacy).
                let extra = if magic == Magic::V1 { 8 } else { 0 };
                let frame = &c.set[12 + 4 + 2 + extra + 4 + 4..];
                let mut want = frame.to_vec();
                assert!(compression::set_lz4_header_checksum(
                    &mut want,
                    magic == Magic::V0
                ));
                assert_eq!(
                    frame,
                    &want[..],
                    "{fallback}: librdkafka's lz4 header checksum differs from dory's"
                );
            }
            _ => {}
        }
        println!(
            "OLD BROKERS {fallback}: librdkafka {name}: Produce v{} magic {} {} bytes, {} messages decoded",
            c.version,
            magic.byte(),
            c.set.len(),
            got.len()
        );
    }
}

#[test]
fn librdkafka_message_set_v0_decodes_field_by_field() {
    round("0.9.0", Magic::V0, 1);
}

#[test]
fn librdkafka_message_set_v1_decodes_field_by_field() {
    round("0.10.0", Magic::V1, 2);
}

/// dory itself against an old broker emulated by the proxy in front of Tansu, with
/// compression `codec`: `broker_version` `None` is a 0.10 broker, whose ApiVersions answer
/// offers Produce v2 at most and no InitProducerId; `Some("0.9")` a 0.9 broker, which
/// closes the connection on ApiVersions, so dory goes by `kafka.broker_version`. dory must
/// fall back from idempotence (counted), speak `produce_version` with magic `magic`, and
/// every message sent must be in the captured requests, key, value and (magic 1) timestamp
/// intact. Tansu cannot store the format, so the test ends at the bytes and at dory's
/// accounting of Tansu's refusal: nothing in flight, every message delivered or discarded.
fn dory_against_old_broker(
    codec: &str,
    broker_version: Option<&str>,
    produce_version: i16,
    magic: Magic,
    log_line: &str,
    grants_producer_ids: bool,
) {
    let proxy_port = free_port();
    let tansu = Tansu::start_advertising(proxy_port);
    let topic = "old_dory";
    tansu.create_topic(topic, 3);
    let listener = TcpListener::bind(("127.0.0.1", proxy_port)).expect("bind the proxy");
    let proxy = FaultProxy::start(listener, tansu.port());
    if broker_version.is_some() {
        proxy.refuse_api_versions();
    } else {
        proxy.cap_api_version(0, 2); // Produce
        if !grants_producer_ids {
            proxy.cap_api_version(22, -1); // InitProducerId: not offered
        }
    }
    let mut args = DoryArgs::new([format!("127.0.0.1:{proxy_port}")]);
    let setting = broker_version.map_or(String::new(), |v| format!("broker_version = \"{v}\"\n"));
    args.config_toml = Some(format!(
        "[kafka]\n{setting}[batching]\nmessage_max_bytes = {MESSAGE_MAX_BYTES}\n[compression]\ndefault = \"{codec}\"\n[delivery]\nmax_failed_delivery_attempts = 1\nretry_backoff_ms = 20\nretry_backoff_max_ms = 100\n"
    ));
    let mut dory = Dory::start(args);
    dory.wait_ready();
    let ts = now_ms() - 1000;
    let msgs: Vec<TestMsg> = (0..300u32)
        .map(|id| TestMsg {
            id,
            input: Input::Stream,
            route: if id % 3 == 0 {
                Route::PartitionKey(id as i32)
            } else {
                Route::AnyPartition
            },
            topic: topic.to_string(),
            ts: ts + i64::from(id),
            key: if id % 2 == 0 {
                format!("key{id}").into_bytes()
            } else {
                Vec::new()
            },
            value: format!("<{id:08}> {}", "z".repeat(60)).into_bytes(),
        })
        .collect();
    dory.send_stream(&msgs);
    dory.wait_received(&[(topic, msgs.len() as u64)], Duration::from_secs(30));
    let m = dory.wait_drained(Duration::from_secs(60));
    assert!(m.invariant_violations().is_empty(), "{}", m.text);
    assert_eq!(
        m.delivered(topic) + m.discarded_total(topic),
        msgs.len() as u64,
        "{}",
        m.text
    );
    let counters = dory.counters().expect("counters");
    assert_eq!(
        counters.get("IdempotenceFallback"),
        Some(&1),
        "{counters:?}"
    );
    assert!(
        m.text
            .contains("dory_idempotence_enabled{state=\"unsupported\"} 0"),
        "{}",
        m.text
    );
    let want_wrapper = match codec {
        "gzip" => Some(Codec::Gzip),
        "snappy" => Some(Codec::Snappy),
        "lz4" => Some(Codec::Lz4),
        _ => None,
    };
    let mut seen = std::collections::BTreeMap::new();
    let mut largest_set = 0;
    for frame in proxy.produce_requests() {
        for c in produce_sets(&frame) {
            assert_eq!(c.version, produce_version, "Produce v{}", c.version);
            // The limit holds for the encoded set, whatever its format's entry overhead.
            assert!(
                c.set.len() <= MESSAGE_MAX_BYTES,
                "{codec}: a set of {} bytes > message_max_bytes = {MESSAGE_MAX_BYTES}",
                c.set.len()
            );
            largest_set = largest_set.max(c.set.len());
            let got = decode_message_set(&c.set, 1 << 20)
                .unwrap_or_else(|e| panic!("dory's own set does not decode: {e:?}"));
            for g in got {
                assert_eq!(g.magic, magic.byte());
                assert!(
                    g.wrapper == want_wrapper || g.wrapper.is_none(),
                    "{codec}: {:?}",
                    g.wrapper
                );
                let id = value_id(g.value.as_deref().unwrap_or_default()).expect("an id");
                seen.insert(id, g);
            }
        }
    }
    for t in &msgs {
        let g = seen
            .get(&t.id)
            .unwrap_or_else(|| panic!("{codec}: id {} in no request", t.id));
        assert_eq!(g.value.as_deref(), Some(&t.value[..]));
        let key = (!t.key.is_empty()).then_some(&t.key[..]);
        assert_eq!(g.key.as_deref(), key, "id {}", t.id);
        let want_ts = (magic == Magic::V1).then_some(t.ts);
        assert_eq!(g.timestamp, want_ts, "id {}", t.id);
    }
    if want_wrapper.is_some() {
        assert!(
            seen.values().any(|g| g.wrapper == want_wrapper),
            "no set went compressed"
        );
    }
    // The status pages name the protocol spoken to the broker.
    let (code, body) = dory.http_get("/status.json");
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).expect("status.json");
    let brokers = status["brokers"].as_array().expect("brokers");
    let format = format!("MessageSet v{}", magic.byte());
    let found_by = broker_version.map_or("ApiVersions".to_string(), |v| {
        format!("kafka.broker_version = {v}")
    });
    assert!(!brokers.is_empty(), "{body}");
    for b in brokers {
        assert_eq!(b["produce_version"], i64::from(produce_version), "{body}");
        assert_eq!(b["message_format"], format.as_str(), "{body}");
        assert_eq!(b["found_by"], found_by.as_str(), "{body}");
    }
    let metrics = dory.metrics().text;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("dory_broker_message_format{")
                && l.ends_with(&format!(" {}", magic.byte()))),
        "{metrics}"
    );
    assert_eq!(dory.terminate(Duration::from_secs(10)).code(), Some(0));
    let logs = dory.logs();
    assert!(logs.contains(log_line), "log lacks {log_line:?}:\n{logs}");
    println!(
        "OLD BROKERS dory → {} ({codec}): {} of {} messages in Produce v{produce_version} / magic {} requests, largest set {largest_set} of {MESSAGE_MAX_BYTES} bytes; Tansu's answer: delivered {}, discarded {:?}",
        broker_version.unwrap_or("0.10"),
        seen.len(),
        msgs.len(),
        magic.byte(),
        m.delivered(topic),
        m.discards_of(topic)
    );
}

#[test]
fn dory_speaks_produce_v2_with_message_set_v1_to_a_0_10_broker() {
    for codec in ["none", "lz4"] {
        dory_against_old_broker(
            codec,
            None,
            2,
            Magic::V1,
            "offers Produce v2 at most",
            false,
        );
    }
}

/// A cluster in a rolling upgrade: InitProducerId is answered (here by the same broker), but
/// the partition leader speaks Produce v2, which carries no producer id. Idempotence must
/// fall back for the cluster, counted once, rather than promise what the broker cannot keep.
#[test]
fn idempotence_falls_back_when_a_leader_speaks_no_producer_ids() {
    dory_against_old_broker(
        "none",
        None,
        2,
        Magic::V1,
        "which carries no producer id",
        true,
    );
}

#[test]
fn dory_speaks_produce_v1_with_message_set_v0_to_a_0_9_broker_by_its_setting() {
    for codec in ["none", "lz4"] {
        dory_against_old_broker(
            codec,
            Some("0.9"),
            1,
            Magic::V0,
            "taken for Kafka 0.9 (kafka.broker_version)",
            false,
        );
    }
}

#[test]
fn dory_speaks_produce_v0_to_a_0_8_broker_by_its_setting() {
    dory_against_old_broker(
        "gzip",
        Some("0.8"),
        0,
        Magic::V0,
        "taken for Kafka 0.8 (kafka.broker_version)",
        false,
    );
}

/// A 0.9 broker (it closes the connection on ApiVersions) with `kafka.broker_version`
/// unset: dory cannot use it, and says so where an operator looks: `/health` stays 503,
/// the log names the setting to add, every message received stays counted in flight (none
/// lost or delivered), and it stops cleanly at its shutdown deadline.
#[test]
fn a_0_9_broker_without_the_setting_is_refused_with_a_hint() {
    let proxy_port = free_port();
    let tansu = Tansu::start_advertising(proxy_port);
    let topic = "old_unset";
    tansu.create_topic(topic, 1);
    let listener = TcpListener::bind(("127.0.0.1", proxy_port)).expect("bind the proxy");
    let proxy = FaultProxy::start(listener, tansu.port());
    proxy.refuse_api_versions();
    let mut args = DoryArgs::new([format!("127.0.0.1:{proxy_port}")]);
    args.config_toml = Some("[delivery]\nshutdown_max_delay_ms = 1000\n".into());
    let mut dory = Dory::start(args);
    let hint = "kafka.broker_version";
    let logs = poll_until(
        "the log to name kafka.broker_version",
        Duration::from_secs(30),
        || {
            let logs = dory.logs();
            if logs.contains(hint) {
                Ok(logs)
            } else {
                Err(logs)
            }
        },
    );
    assert!(
        logs.contains("closed the connection on ApiVersions"),
        "{logs}"
    );
    let (code, body) = dory.http_get("/health");
    assert_eq!(code, 503, "{body}");
    let msgs: Vec<TestMsg> = (0..20u32)
        .map(|id| TestMsg {
            id,
            input: Input::Stream,
            route: Route::AnyPartition,
            topic: topic.to_string(),
            ts: now_ms(),
            key: Vec::new(),
            value: format!("<{id:08}>").into_bytes(),
        })
        .collect();
    dory.send_stream(&msgs);
    dory.wait_received(&[(topic, msgs.len() as u64)], Duration::from_secs(30));
    let m = dory.metrics();
    assert!(m.invariant_violations().is_empty(), "{}", m.text);
    assert_eq!(m.delivered(topic), 0, "{}", m.text);
    assert_eq!(m.in_flight(topic), msgs.len() as u64, "{}", m.text);
    assert!(proxy.produce_requests().is_empty(), "no Produce went out");
    assert_eq!(dory.terminate(Duration::from_secs(30)).code(), Some(0));
    println!(
        "OLD BROKERS 0.9 without kafka.broker_version: /health {code} {:?}; {} messages held, none delivered",
        body.trim(),
        msgs.len()
    );
}
