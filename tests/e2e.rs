//! End-to-end tests of the dory daemon against real Kafka-protocol brokers: the librdkafka
//! mock cluster (3 brokers, a 6-partition topic with leaders spread) and Tansu (a 3-partition
//! topic). Thousands of messages go in through all three inputs, malformed datagrams among
//! them; everything is consumed back with a CRC-checking consumer and compared exactly with
//! what was sent; `/metrics` must account for every message; SIGTERM must end the daemon
//! cleanly. One run goes with `input.inline_routing = false` (every batch through the
//! router thread).
//!
//! What the daemon must offer (see `common::Dory::start`): the flags `--broker`,
//! `--dgram-socket`, `--stream-socket`, `--tcp-port`, `--status-addr`, `--batch-time-ms`
//! (and `--config`); `GET /health` answering 200 once every input is open; `GET /metrics`
//! with `dory_messages_received_total{topic}`, `dory_messages_delivered_total{topic}`,
//! `dory_messages_discarded_total{topic,reason}` and `dory_messages_in_flight{topic}`, where
//! input that fails parsing counts as received and discarded under `topic=""`; topic
//! auto-creation on when run without `--config`; exit status 0 on SIGTERM, socket files
//! removed.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Messages per delivery scenario, over all inputs.
const TOTAL: usize = 3000;
/// Connections per stream input; messages are dealt round-robin over them.
const STREAM_CONNECTIONS: usize = 2;
const TCP_CONNECTIONS: usize = 2;

/// Generous bounds; on a healthy daemon each phase takes seconds.
const INPUT_TIMEOUT: Duration = Duration::from_secs(60);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
const CONSUME_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends every message through its input, concurrently: one thread for datagrams (with the
/// `malformed` datagrams spread among the valid ones) and one per stream connection, each
/// stream written in pseudo-random chunk sizes and then closed cleanly.
fn send_all(dory: &Dory, msgs: &[TestMsg], malformed: &[(Vec<u8>, &'static str)], seed: u64) {
    let of = |input: Input| -> Vec<&TestMsg> { msgs.iter().filter(|m| m.input == input).collect() };
    let dgrams = of(Input::Dgram);
    let streams = of(Input::Stream);
    let tcps = of(Input::Tcp);
    let concat = |list: &[&TestMsg], conn: usize, conns: usize| -> Vec<u8> {
        list.iter()
            .skip(conn)
            .step_by(conns)
            .flat_map(|m| m.encode())
            .collect()
    };
    thread::scope(|s| {
        let dgram_path = dory.dgram_path();
        s.spawn(move || {
            let sender = DgramSender::new(dgram_path);
            let every = (dgrams.len() / (malformed.len() + 1)).max(1);
            let mut bad = malformed.iter();
            for (i, m) in dgrams.iter().enumerate() {
                if i % every == every - 1 {
                    if let Some((d, _)) = bad.next() {
                        sender.send(d);
                    }
                }
                sender.send(&m.encode());
            }
            for (d, _) in bad {
                sender.send(d);
            }
        });
        for conn in 0..STREAM_CONNECTIONS {
            let bytes = concat(&streams, conn, STREAM_CONNECTIONS);
            let path = dory.stream_path();
            s.spawn(move || {
                let mut sender = StreamSender::connect(path);
                sender.send_chunked(&bytes, &mut XorShift::new(seed ^ (0x5100 + conn as u64)));
                sender.finish();
            });
        }
        for conn in 0..TCP_CONNECTIONS {
            let bytes = concat(&tcps, conn, TCP_CONNECTIONS);
            let port = dory.tcp_port();
            s.spawn(move || {
                let mut sender = TcpSender::connect(port);
                sender.send_chunked(&bytes, &mut XorShift::new(seed ^ (0x7C00 + conn as u64)));
                sender.finish();
            });
        }
    });
}

/// Waits until the daemon has counted every message sent to `topic` and every malformed
/// datagram, then until nothing is in flight.
fn wait_accounted(
    dory: &mut Dory,
    topic: &str,
    sent: usize,
    malformed: &std::collections::BTreeMap<String, u64>,
) -> Metrics {
    let sent = sent as u64;
    dory.wait_metrics("every message counted as received", INPUT_TIMEOUT, |m| {
        let mut missing = Vec::new();
        if m.received(topic) < sent {
            missing.push(format!(
                "received[{topic:?}] = {} of {sent}",
                m.received(topic)
            ));
        }
        for (reason, &n) in malformed {
            if m.discarded("", reason) < n {
                missing.push(format!(
                    "discarded[(\"\", {reason})] = {} of {n}",
                    m.discarded("", reason)
                ));
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        }
    });
    dory.wait_drained(DRAIN_TIMEOUT)
}

/// Checks the final counters: everything sent to `topic` received and delivered, nothing
/// of it discarded; exactly the expected discards under topic ""; the invariant everywhere.
fn check_final_metrics(
    dory: &Dory,
    topic: &str,
    sent: usize,
    malformed: &std::collections::BTreeMap<String, u64>,
) {
    let m = dory.assert_invariant();
    let sent = sent as u64;
    let ctx = || format!("\n/metrics:\n{}", m.text);
    assert_eq!(m.received(topic), sent, "received[{topic:?}]{}", ctx());
    assert_eq!(m.delivered(topic), sent, "delivered[{topic:?}]{}", ctx());
    assert_eq!(m.in_flight(topic), 0, "in_flight[{topic:?}]{}", ctx());
    assert!(
        m.discards_of(topic).is_empty(),
        "discards of {topic:?}: {:?}{}",
        m.discards_of(topic),
        ctx()
    );
    assert_eq!(
        &m.discards_of(""),
        malformed,
        "discards under topic \"\"{}",
        ctx()
    );
}

/// SIGTERM; the daemon must exit with status 0 in time and remove its socket files.
fn check_clean_shutdown(dory: &mut Dory) {
    let started = Instant::now();
    let status = dory.terminate(EXIT_TIMEOUT);
    assert_eq!(
        status.code(),
        Some(0),
        "dory exit status after SIGTERM: {status}"
    );
    eprintln!("dory exited 0 {:?} after SIGTERM", started.elapsed());
    for path in [dory.dgram_path(), dory.stream_path()] {
        assert!(
            !path.exists(),
            "socket file {} still exists after shutdown",
            path.display()
        );
    }
}

/// The full delivery scenario against one cluster.
fn delivery_scenario(brokers: &[String], bootstrap: &str, topic: &str, partitions: i32, seed: u64) {
    drop(delivery_scenario_with(
        DoryArgs::new(brokers),
        bootstrap,
        topic,
        partitions,
        seed,
    ));
}

/// [`delivery_scenario`] with dory started from `args`; returns it, stopped.
fn delivery_scenario_with(
    args: DoryArgs,
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    seed: u64,
) -> Dory {
    let started = Instant::now();
    let mut dory = Dory::start(args);
    dory.wait_ready();

    let msgs = generate(seed, topic, TOTAL, now_ms());
    let malformed = malformed_datagrams(topic);
    let reasons = expected_reasons(&malformed);
    send_all(&dory, &msgs, &malformed, seed);
    let sent_at = started.elapsed();

    wait_accounted(&mut dory, topic, msgs.len(), &reasons);
    let drained_at = started.elapsed();

    let got = consume_all(bootstrap, topic, msgs.len(), CONSUME_TIMEOUT);
    if let Err(report) = verify_delivery(&msgs, &got, partitions) {
        panic!("{report}");
    }
    let used: std::collections::BTreeSet<i32> = got.iter().map(|c| c.partition).collect();
    assert_eq!(
        used.len(),
        usize::try_from(partitions).unwrap(),
        "every partition should receive messages; used {used:?}"
    );
    check_final_metrics(&dory, topic, msgs.len(), &reasons);
    check_clean_shutdown(&mut dory);
    eprintln!(
        "{topic}: {} messages + {} malformed: sent {sent_at:?}, drained {drained_at:?}, \
         verified and shut down {:?}",
        msgs.len(),
        malformed.len(),
        started.elapsed()
    );
    dory
}

#[test]
fn mock_cluster_gets_every_message_exactly_once() {
    let mock = Mock::start(3);
    mock.create_topic("e2e_mock", 6);
    delivery_scenario(
        &mock.broker_addrs(),
        &mock.bootstrap(),
        "e2e_mock",
        6,
        0xD0_0001,
    );
}

/// The same with every input batch handed to the router thread (`input.inline_routing =
/// false`), the path a busy router makes inputs take anyway.
#[test]
fn mock_cluster_gets_every_message_exactly_once_through_the_router_queue() {
    let mock = Mock::start(3);
    mock.create_topic("e2e_queued", 6);
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.config_toml = Some("[input]\ninline_routing = false\n".into());
    let dory = delivery_scenario_with(args, &mock.bootstrap(), "e2e_queued", 6, 0xD0_0003);
    assert!(
        dory.logs().contains("input.inline_routing = false"),
        "the setting should have been taken:\n{}",
        dory.logs()
    );
}

#[test]
fn tansu_gets_every_message_exactly_once() {
    let tansu = Tansu::start();
    tansu.create_topic("e2e_tansu", 3);
    delivery_scenario(
        &[tansu.bootstrap()],
        &tansu.bootstrap(),
        "e2e_tansu",
        3,
        0xD0_0002,
    );
}

/// A topic that does not exist yet is created through Metadata auto-creation (dory without
/// `--config` has it on) and its messages are delivered.
fn autocreate_scenario(brokers: &[String], bootstrap: &str, seed: u64) {
    const COUNT: usize = 200;
    let topic = "e2e_autocreated";
    assert!(
        !topic_exists(bootstrap, topic),
        "{topic} exists before the test"
    );
    let mut dory = Dory::start(DoryArgs::new(brokers));
    dory.wait_ready();

    let msgs = generate(seed, topic, COUNT, now_ms());
    send_all(&dory, &msgs, &[], seed);
    let none = std::collections::BTreeMap::new();
    wait_accounted(&mut dory, topic, msgs.len(), &none);

    assert!(topic_exists(bootstrap, topic), "{topic} was not created");
    let partitions = topic_partition_count(bootstrap, topic);
    let got = consume_all(bootstrap, topic, msgs.len(), CONSUME_TIMEOUT);
    if let Err(report) = verify_delivery(&msgs, &got, partitions) {
        panic!("{report}");
    }
    check_final_metrics(&dory, topic, msgs.len(), &none);
    check_clean_shutdown(&mut dory);
}

#[test]
fn mock_cluster_autocreates_a_missing_topic() {
    let mock = Mock::start(3);
    autocreate_scenario(&mock.broker_addrs(), &mock.bootstrap(), 0xA0_0001);
}

#[test]
fn tansu_autocreates_a_missing_topic() {
    let tansu = Tansu::start();
    autocreate_scenario(&[tansu.bootstrap()], &tansu.bootstrap(), 0xA0_0002);
}

/// The scheduling policy of each thread of `pid` whose name starts with `prefix`.
fn thread_policies(pid: u32, prefix: &str) -> Vec<(String, u32)> {
    threads::threads(pid, prefix)
        .into_iter()
        .map(|t| (t.name, t.policy))
        .collect()
}

/// `delivery.batch_scheduling`: on by default (router and dispatchers SCHED_BATCH, the
/// inputs not), off by the setting (every thread at the default policy).
#[test]
fn batch_scheduling_is_on_by_default_and_has_an_off_switch() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    const WAIT: Duration = Duration::from_secs(30);
    let mock = Mock::start(1);
    mock.create_topic("sched", 1);
    for (toml, want) in [
        (None, SCHED_BATCH),
        (Some("[delivery]\nbatch_scheduling = false\n"), SCHED_OTHER),
    ] {
        let mut args = DoryArgs::new(mock.broker_addrs());
        // (A config file turns auto-creation off; the topic exists anyway.)
        args.config_toml = toml.map(str::to_string);
        let mut dory = Dory::start(args);
        dory.wait_ready();
        dory.send_stream(&stream_msgs("sched", 5));
        dory.wait_received(&[("sched", 5)], WAIT);
        dory.wait_drained(WAIT);
        let pid = dory.pid();
        let router = thread_policies(pid, "router");
        let dispatchers = thread_policies(pid, "dispatcher-");
        let inputs = thread_policies(pid, "input");
        assert_eq!(router.len(), 1, "{router:?}");
        assert!(!dispatchers.is_empty(), "a dispatcher runs");
        assert!(!inputs.is_empty(), "an input runs");
        for (name, p) in router.iter().chain(&dispatchers) {
            assert_eq!(*p, want, "{name} with {toml:?}");
        }
        for (name, p) in &inputs {
            assert_eq!(*p, SCHED_OTHER, "{name}");
        }
        dory.terminate(WAIT);
    }
}
