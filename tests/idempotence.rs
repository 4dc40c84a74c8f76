//! The idempotent producer against real Kafka-protocol peers.
//!
//! * librdkafka's mock cluster: every stored record batch carries dory's producer id and
//!   gapless per-partition sequence numbers (read back with a raw Fetch); injected
//!   OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID and INVALID_PRODUCER_EPOCH recover
//!   (a new producer id: the mock cannot bump a non-transactional producer's epoch) with
//!   nothing lost or duplicated; a cluster that refuses
//!   InitProducerId, or does not offer it, makes dory fall back, counted; the setting turns
//!   it off. (The mock checks sequences only for transactional producers, so it cannot
//!   show deduplication itself.)
//! * Tansu, which deduplicates idempotent batches: a proxy between dory and Tansu cuts the
//!   connection after Tansu took a Produce request and before dory reads the answer, so
//!   dory resends what Tansu already wrote. With idempotence on, the consumer reads every
//!   message exactly once and nothing counts as a possible duplicate; with it off, the
//!   same faults duplicate messages (each counted as a possible duplicate).

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::Duration;

use common::proxy::FaultProxy;
use common::*;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

const WAIT: Duration = Duration::from_secs(60);
const PARTITIONS: i32 = 6;

/// `count` small AnyPartition and PartitionKey messages for `topic`, ids from `id_base`.
fn traffic(topic: &str, count: usize, id_base: u32) -> Vec<TestMsg> {
    let mut rng = XorShift::new(0x1DE0 ^ u64::from(id_base));
    let ts = now_ms();
    (0..count)
        .map(|i| {
            let id = id_base + i as u32;
            let mut value = format!("<{id:08}>").into_bytes();
            let extra = rng.range(0, 60) as usize;
            value.extend(rng.bytes(extra));
            TestMsg {
                id,
                input: Input::Stream,
                route: if i % 3 == 0 {
                    Route::PartitionKey(rng.next_u64() as u32 as i32)
                } else {
                    Route::AnyPartition
                },
                topic: topic.to_string(),
                ts: ts - rng.range(0, 10_000) as i64,
                key: Vec::new(),
                value,
            }
        })
        .collect()
}

/// Consumes `topic` and checks each id sent is there exactly `copies` times at most and at
/// least once; returns the number of records consumed beyond one per id.
fn consumed_duplicates(bootstrap: &str, topic: &str, sent: &[TestMsg]) -> u64 {
    let got = consume_all(bootstrap, topic, sent.len(), WAIT);
    let mut count: BTreeMap<u32, u64> = BTreeMap::new();
    for c in &got {
        let id = value_id(c.value.as_deref().unwrap_or_default())
            .unwrap_or_else(|| panic!("{topic}: record without an id at offset {}", c.offset));
        *count.entry(id).or_default() += 1;
    }
    let missing: Vec<u32> = sent
        .iter()
        .filter(|m| !count.contains_key(&m.id))
        .map(|m| m.id)
        .collect();
    assert!(
        missing.is_empty(),
        "{topic}: ids never consumed: {missing:?}"
    );
    assert_eq!(
        count.len(),
        sent.len(),
        "{topic}: ids consumed that were never sent"
    );
    count.values().map(|n| n - 1).sum()
}

/// Every batch of `topic` carries a producer identity, and per partition and (producer
/// id, epoch) the stored sequences never overlap and only grow; `gapless`: they also start
/// at 0 and leave no gap. (The mock writes whatever it is sent, so after injected errors a
/// batch a real broker would have refused as out of order can leave a gap there.) Returns
/// the batches stored per identity.
fn check_sequences(
    batches: &[StoredBatch],
    topic: &str,
    gapless: bool,
) -> BTreeMap<(i64, i16), usize> {
    let mut by: BTreeMap<(i32, i64, i16), Vec<&StoredBatch>> = BTreeMap::new();
    for b in batches {
        assert!(
            b.producer_id >= 0 && b.producer_epoch >= 0 && b.base_sequence >= 0,
            "{topic}/p{}@{}: batch without a producer identity: id {} epoch {} sequence {}",
            b.partition,
            b.base_offset,
            b.producer_id,
            b.producer_epoch,
            b.base_sequence
        );
        by.entry((b.partition, b.producer_id, b.producer_epoch))
            .or_default()
            .push(b);
    }
    let mut identities: BTreeMap<(i64, i16), usize> = BTreeMap::new();
    for ((p, pid, epoch), mut list) in by {
        list.sort_by_key(|b| b.base_offset);
        let mut next = 0i64;
        for b in &list {
            let base = i64::from(b.base_sequence);
            let ok = if gapless { base == next } else { base >= next };
            assert!(
                ok,
                "{topic}/p{p}: producer {pid} epoch {epoch}: batch at offset {} has sequence {base}, expected {}{next}",
                b.base_offset,
                if gapless { "" } else { "at least " }
            );
            next = base + b.records.len() as i64;
        }
        *identities.entry((pid, epoch)).or_default() += list.len();
    }
    identities
}

fn metric(dory: &Dory, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    dory.metrics().sample(name, labels)
}

fn counter(dory: &Dory, name: &str) -> u64 {
    dory.counters()
        .expect("/counters")
        .get(name)
        .copied()
        .unwrap_or(0)
}

fn start_on_mock(mock: &Mock, toml: Option<&str>) -> Dory {
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.config_toml = toml.map(str::to_string);
    let mut dory = Dory::start_isolated(args);
    dory.wait_ready();
    dory
}

/// Sends `msgs` and waits until the topic's `total` messages so far are delivered.
fn send_and_drain(dory: &mut Dory, topic: &str, msgs: &[TestMsg], total: usize) -> Metrics {
    dory.send_stream(msgs);
    dory.wait_received(&[(topic, total as u64)], WAIT);
    let m = dory.wait_drained(WAIT);
    assert_eq!(m.delivered(topic), total as u64, "{}", m.text);
    assert!(m.invariant_violations().is_empty(), "{}", m.text);
    m
}

#[test]
fn mock_batches_carry_one_producer_id_and_gapless_sequences() {
    let mock = Mock::start(3);
    let topic = "idem";
    mock.create_topic(topic, PARTITIONS);
    let mut dory = start_on_mock(&mock, None);
    let mut msgs = Vec::new();
    // Several bursts, so partitions see many batches each.
    for burst in 0..5 {
        let part = traffic(topic, 600, burst * 600);
        send_and_drain(&mut dory, topic, &part, msgs.len() + part.len());
        msgs.extend(part);
    }
    assert_eq!(
        metric(&dory, "dory_idempotence_enabled", &[("state", "on")]),
        Some(1.0)
    );
    let pid = metric(&dory, "dory_producer_id", &[]).expect("dory_producer_id") as i64;
    assert_eq!(counter(&dory, "ProducerIdReceived"), 1);
    assert_eq!(consumed_duplicates(&mock.bootstrap(), topic, &msgs), 0);
    let batches = fetch_topic(&mock.bootstrap(), topic);
    let identities = check_sequences(&batches, topic, true);
    assert_eq!(
        identities.keys().copied().collect::<Vec<_>>(),
        [(pid, 0)],
        "one producer id, epoch 0, for the whole run"
    );
    assert!(
        batches.len() >= 5 * PARTITIONS as usize / 2,
        "{} batches",
        batches.len()
    );
    assert_eq!(dory.metrics().possible_duplicates(topic), 0);
    let status = dory.terminate(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
}

/// Injects `codes` into Produce requests between bursts of traffic.
fn sequence_error_scenario(codes: &[RDKafkaRespErr]) -> (Dory, Mock, Vec<TestMsg>) {
    let mock = Mock::start(3);
    let topic = "idem";
    mock.create_topic(topic, PARTITIONS);
    let mut dory = start_on_mock(&mock, Some("[delivery]\nretry_backoff_ms = 20\n"));
    let mut msgs = Vec::new();
    for (i, code) in codes.iter().enumerate() {
        let first = traffic(topic, 300, (2 * i as u32) * 300);
        dory.send_stream(&first);
        mock.cluster()
            .request_errors(RDKafkaApiKey::Produce, &[*code, *code]);
        let second = traffic(topic, 300, (2 * i as u32 + 1) * 300);
        dory.send_stream(&second);
        msgs.extend(first);
        msgs.extend(second);
        dory.wait_received(&[(topic, msgs.len() as u64)], WAIT);
        let m = dory.wait_drained(WAIT);
        assert_eq!(m.delivered(topic), msgs.len() as u64, "{}", m.text);
    }
    (dory, mock, msgs)
}

#[test]
fn injected_sequence_errors_recover_with_nothing_lost_or_duplicated() {
    use RDKafkaRespErr::*;
    let codes = [
        RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
        RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID,
        RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH,
    ];
    let (mut dory, mock, msgs) = sequence_error_scenario(&codes);
    let topic = "idem";
    let m = dory.metrics();
    assert!(m.invariant_violations().is_empty(), "{}", m.text);
    assert_eq!(m.discarded_total(topic), 0, "{}", m.text);
    assert_eq!(m.possible_duplicates(topic), 0, "{}", m.text);
    // OUT_OF_ORDER on a partition's first unacknowledged batch and UNKNOWN_PRODUCER_ID
    // bump the epoch; INVALID_PRODUCER_EPOCH asks for a new producer id.
    assert!(counter(&dory, "ProducerEpochBumpRequested") >= 2);
    assert!(counter(&dory, "ProducerIdResetRequested") >= 1);
    assert!(counter(&dory, "AckOutOfOrderSequence") >= 1);
    assert_eq!(consumed_duplicates(&mock.bootstrap(), topic, &msgs), 0);
    let identities = check_sequences(&fetch_topic(&mock.bootstrap(), topic), topic, false);
    // A new identity after each reset: the mock cannot bump a non-transactional producer's
    // epoch (it answers INVALID_PRODUCER_ID_MAPPING), so dory takes a new producer id.
    assert!(
        identities.len() >= 3,
        "a new identity after each of OUT_OF_ORDER (first batch), UNKNOWN_PRODUCER_ID and \
         INVALID_PRODUCER_EPOCH: {identities:?}"
    );
    assert!(
        counter(&dory, "ProducerIdReceived") >= identities.len() as u64,
        "{identities:?}"
    );
    assert_eq!(dory.terminate(Duration::from_secs(10)).code(), Some(0));
}

/// A cluster that will not do idempotence: delivery goes on without producer ids, with a
/// log line and a metric.
fn fallback_scenario(mock: Mock, want_state: &str, want_log: &str) {
    let topic = "plain";
    mock.create_topic(topic, PARTITIONS);
    let mut dory = start_on_mock(&mock, None);
    let msgs = traffic(topic, 1500, 0);
    send_and_drain(&mut dory, topic, &msgs, msgs.len());
    assert_eq!(
        metric(&dory, "dory_idempotence_enabled", &[("state", want_state)]),
        Some(0.0)
    );
    assert_eq!(counter(&dory, "IdempotenceFallback"), 1);
    assert_eq!(consumed_duplicates(&mock.bootstrap(), topic, &msgs), 0);
    for b in fetch_topic(&mock.bootstrap(), topic) {
        assert_eq!(
            (b.producer_id, b.producer_epoch, b.base_sequence),
            (-1, -1, -1)
        );
    }
    assert_eq!(dory.terminate(Duration::from_secs(10)).code(), Some(0));
    let logs = dory.logs();
    assert!(logs.contains(want_log), "log lacks {want_log:?}:\n{logs}");
}

#[test]
fn init_producer_id_refused_falls_back_counted() {
    let mock = Mock::start(3);
    mock.cluster().request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED],
    );
    fallback_scenario(mock, "unsupported", "CLUSTER_AUTHORIZATION_FAILED");
}

#[test]
fn broker_without_init_producer_id_falls_back_counted() {
    let mock = Mock::start(3);
    mock.cluster()
        .apiversion(RDKafkaApiKey::InitProducerId, Some(-1), Some(-1))
        .expect("disable InitProducerId");
    fallback_scenario(mock, "unsupported", "does not offer InitProducerId");
}

#[test]
fn idempotence_off_in_the_config_sends_no_producer_id() {
    let mock = Mock::start(3);
    let topic = "plain";
    mock.create_topic(topic, PARTITIONS);
    let mut dory = start_on_mock(&mock, Some("[kafka]\nidempotence = false\n"));
    let msgs = traffic(topic, 600, 0);
    send_and_drain(&mut dory, topic, &msgs, msgs.len());
    assert_eq!(
        metric(&dory, "dory_idempotence_enabled", &[("state", "disabled")]),
        Some(0.0)
    );
    assert_eq!(counter(&dory, "ProducerIdReceived"), 0);
    assert!(fetch_topic(&mock.bootstrap(), topic)
        .iter()
        .all(|b| b.producer_id == -1));
}

// ---------------------------------------------------------------------------------------------
// Tansu behind a proxy that loses answers (tests/common/proxy.rs)
// ---------------------------------------------------------------------------------------------

/// dory → proxy → Tansu; Tansu advertises the proxy, so all of dory's traffic passes it.
/// Returns (consumed duplicates, possible duplicates counted, answers lost, resends the
/// broker recognised as duplicates).
fn tansu_lossy_scenario(idempotence: bool) -> (u64, u64, usize, u64) {
    // Nothing listens on the advertised (proxy) port until Tansu is up and the topic made:
    // a client checking on Tansu that follows the advertised address must be refused at
    // once (and go back to the bootstrap address), not hang on a listener that never
    // answers.
    let proxy_port = free_port();
    let tansu = Tansu::start_advertising(proxy_port);
    let topic = "lossy";
    tansu.create_topic(topic, 3);
    let listener = TcpListener::bind(("127.0.0.1", proxy_port))
        .unwrap_or_else(|e| panic!("bind the proxy on free port {proxy_port}: {e}"));
    let proxy = FaultProxy::start(listener, tansu.port());
    proxy.lose_answers(3, 4);
    let mut args = DoryArgs::new([format!("127.0.0.1:{proxy_port}")]);
    args.config_toml = Some(format!(
        "[kafka]\nidempotence = {idempotence}\n[delivery]\nretry_backoff_ms = 20\nretry_backoff_max_ms = 200\n"
    ));
    let mut dory = Dory::start(args);
    dory.wait_ready();
    let mut msgs = Vec::new();
    for burst in 0..16 {
        let part = traffic(topic, 150, burst * 150);
        dory.send_stream(&part);
        msgs.extend(part);
        dory.wait_received(&[(topic, msgs.len() as u64)], WAIT);
        dory.wait_drained(WAIT);
    }
    let m = dory.wait_drained(WAIT);
    assert!(m.invariant_violations().is_empty(), "{}", m.text);
    assert_eq!(m.delivered(topic), msgs.len() as u64, "{}", m.text);
    let state = if idempotence { "on" } else { "disabled" };
    assert_eq!(
        m.sample("dory_idempotence_enabled", &[("state", state)]),
        Some(f64::from(u8::from(idempotence))),
        "{}",
        m.text
    );
    let cuts = proxy.cut_answers();
    let dups = consumed_duplicates(&tansu.bootstrap(), topic, &msgs);
    let recognised = counter(&dory, "AckDuplicateSequence");
    assert_eq!(dory.terminate(Duration::from_secs(10)).code(), Some(0));
    (dups, m.possible_duplicates(topic), cuts, recognised)
}

#[test]
fn tansu_deduplicates_resends_after_lost_answers() {
    let (dups, possible, cuts, recognised) = tansu_lossy_scenario(true);
    println!(
        "IDEMPOTENCE on, Tansu, {cuts} answers lost: duplicates={dups} possible_duplicates={possible} resends_recognised={recognised}"
    );
    assert!(cuts >= 3, "the proxy cut only {cuts} answers");
    assert!(
        recognised >= 1,
        "Tansu never answered DUPLICATE_SEQUENCE_NUMBER to a resend"
    );
    assert_eq!(dups, 0, "duplicates consumed with idempotence on");
    assert_eq!(
        possible, 0,
        "possible duplicates counted with idempotence on"
    );
}

#[test]
fn without_idempotence_the_same_losses_duplicate_and_are_counted() {
    let (dups, possible, cuts, _) = tansu_lossy_scenario(false);
    println!("IDEMPOTENCE off, Tansu, {cuts} answers lost: duplicates={dups} possible_duplicates={possible}");
    assert!(cuts >= 3, "the proxy cut only {cuts} answers");
    assert!(
        dups > 0,
        "lost answers should have caused duplicates without idempotence"
    );
    assert!(possible >= dups, "{dups} duplicates but {possible} counted");
}
