//! Issue 30: a broker dies with Produce answers outstanding, twice, with a leader move in
//! between, while 30,000 datagrams of 100–2,000 bytes flow for 20 s (the schedule the
//! issue reported 419 duplicates under).
//!
//! On the mock every stored duplicate must be a *resend*: the same producer id, epoch, base
//! sequence and record count as its original, within the five batches a Kafka broker
//! remembers, so Kafka would drop it (the mock checks sequences only for transactional
//! producers, so it stores it again). What Kafka would keep, the real duplicates, must be 0
//! and equal dory's possible-duplicate counter. Tansu, which does deduplicate, runs the
//! part of the schedule one broker can (round-trip delay, then the broker gone with answers
//! outstanding, twice) behind a proxy: nothing consumed twice. With idempotence off, the
//! same faults duplicate, every duplicate counted.

use std::net::TcpListener;

use super::*;
use common::proxy::FaultProxy;

/// Messages of the schedule, and how long the sender spreads them over.
const COUNT: usize = 30_000;
const SEND_FOR: Duration = Duration::from_millis(20_000);

/// AnyPartition datagrams of 100–2,000 bytes (id prefix included), half to each topic:
/// about 2.5 MiB per partition, half the mock's retention.
fn datagrams(seed: u64, count: usize) -> Vec<TestMsg> {
    let mut rng = XorShift::new(seed);
    let ts_base = now_ms();
    (0..count)
        .map(|i| {
            let id = u32::try_from(i).expect("id fits u32");
            let mut value = format!("<{id:08}>").into_bytes();
            let extra = rng.range(90, 1991) as usize;
            value.extend(rng.bytes(extra));
            TestMsg {
                id,
                input: Input::Dgram,
                route: Route::AnyPartition,
                topic: TOPICS[usize::from(rng.percent(50))].to_string(),
                ts: ts_base - rng.range(0, 60_000) as i64,
                key: Vec::new(),
                value,
            }
        })
        .collect()
}

#[test]
fn issue_30_brokers_die_with_answers_outstanding() {
    mock_schedule("issue_30_answers_outstanding", true);
}

#[test]
fn issue_30_brokers_die_with_answers_outstanding_without_idempotence() {
    mock_schedule("issue_30_answers_outstanding_without_idempotence", false);
}

/// The issue's schedule on the 3-broker mock (topics of 6 partitions, partition p led by
/// broker p % 3 + 1, so `fault_a`/1 starts on broker 2).
fn mock_schedule(name: &'static str, idempotence: bool) {
    let settings = Settings {
        idempotence,
        ..Settings::default()
    };
    let mut sc = Scenario::start(name, settings);
    let msgs = datagrams(0x30_30, COUNT);
    sc.drive(&msgs, SEND_FOR, |mock, f| {
        let c = mock.cluster();
        let codes = [
            E::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            E::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            E::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        ];
        for (i, ms) in (500..6000).step_by(1000).enumerate() {
            f.at(ms, "request_errors", || {
                c.request_errors(RDKafkaApiKey::Produce, &[codes[i % 3]; 2])
            });
        }
        let rtt = Duration::from_millis(600);
        let none = Duration::ZERO;
        f.at(7000, "rtt(2,600ms)", || c.broker_round_trip_time(2, rtt))
            .expect("rtt");
        f.at(8000, "broker_down(2)", || c.broker_down(2))
            .expect("broker_down");
        f.at(12_900, "rtt(2,0)", || c.broker_round_trip_time(2, none))
            .expect("rtt");
        f.at(13_000, "broker_up(2)", || c.broker_up(2))
            .expect("broker_up");
        f.at(15_000, "leader(a/1,3)", || {
            c.partition_leader(TOPICS[0], 1, Some(3))
        })
        .expect("partition_leader");
        f.at(17_000, "rtt(1,600ms)", || c.broker_round_trip_time(1, rtt))
            .expect("rtt");
        f.at(17_800, "broker_down(1)", || c.broker_down(1))
            .expect("broker_down");
        f.at(19_600, "rtt(1,0)", || c.broker_round_trip_time(1, none))
            .expect("rtt");
        f.at(21_000, "broker_up(1)", || c.broker_up(1))
            .expect("broker_up");
    });
    let fin = sc.drain(&msgs);
    let expect = Expect {
        possible_duplicates_required: !idempotence,
        vanishing_brokers: vec![1, 2],
        ..Expect::default()
    };
    let bootstrap = sc.mock.bootstrap();
    let mut stored_duplicates = 0;
    sc.verify_with(
        &msgs,
        &fin,
        &expect,
        Vec::new(),
        "issue 30 schedule",
        |topic, _got, problems| {
            let batches = fetch_topic(&bootstrap, topic);
            let r = resend_report(topic, &batches);
            let counted = fin.possible_duplicates(topic);
            let in_doubt = fin
                .sample("dory_resent_in_doubt_total", &[("topic", topic)])
                .unwrap_or(0.0) as u64;
            println!(
                "RESENDS {name} {topic}: stored={} stored_duplicates={} resend_batches={} \
                 resend_copies={} max_resend_distance={} real_duplicates={} \
                 possible_duplicates={counted} resent_in_doubt={in_doubt}",
                r.records,
                r.duplicates,
                r.resend_batches,
                r.resend_copies,
                r.max_resend_distance,
                r.real_duplicates
            );
            if idempotence {
                for e in &r.resend_examples {
                    println!("RESENDS {name} {topic}: resend {e}");
                }
                for e in &r.real_examples {
                    println!("RESENDS {name} {topic}: real duplicate {e}");
                }
            }
            stored_duplicates += r.duplicates;
            if idempotence && r.real_duplicates != 0 {
                problems.push(format!(
                    "{topic}: {} record(s) stored twice under different identities (a Kafka \
                     broker keeps both): {:?}",
                    r.real_duplicates, r.real_examples
                ));
            }
            if idempotence && counted != r.real_duplicates {
                problems.push(format!(
                    "{topic}: {counted} counted as possible duplicates, {} real duplicates",
                    r.real_duplicates
                ));
            }
            // Every stored copy is counted by dory: as a resend in doubt (same identity) or
            // as a possible duplicate (another identity, or none).
            if r.resend_copies > in_doubt {
                problems.push(format!(
                    "{topic}: {} records stored again by resends, only {in_doubt} counted as \
                     resent in doubt",
                    r.resend_copies
                ));
            }
            if !idempotence && in_doubt != 0 {
                problems.push(format!(
                    "{topic}: {in_doubt} counted as resent in doubt without idempotence"
                ));
            }
            if !idempotence && counted < r.duplicates {
                problems.push(format!(
                    "{topic}: {} duplicates stored, only {counted} counted",
                    r.duplicates
                ));
            }
        },
    );
    // The schedule must really lose answers: resends (on) or duplicates (off) stored.
    assert!(
        stored_duplicates > 0,
        "{name}: no record stored twice: the brokers died with no answer outstanding"
    );
}

#[test]
fn issue_30_tansu_deduplicates_answers_lost_to_a_dying_broker() {
    let t = tansu_schedule(true);
    assert_eq!(t.duplicates, 0, "duplicates consumed from Tansu: {t:?}");
    assert_eq!(t.possible_duplicates, 0, "{t:?}");
    assert!(
        t.recognised >= 1,
        "Tansu never answered a resend as a duplicate: the faults resent nothing it had: {t:?}"
    );
}

#[test]
fn issue_30_tansu_without_idempotence_duplicates_counted() {
    let t = tansu_schedule(false);
    assert!(t.duplicates > 0, "no duplicate without idempotence: {t:?}");
    assert!(
        t.possible_duplicates >= t.duplicates,
        "duplicates not all counted: {t:?}"
    );
}

#[derive(Debug)]
struct TansuTally {
    sent: u64,
    consumed_unique: u64,
    duplicates: u64,
    possible_duplicates: u64,
    /// Answers the proxy lost with their connection after the broker took the request,
    /// and connections that lost delayed answers when the broker went down.
    cut_answers: usize,
    down_answers: usize,
    /// Resends Tansu recognised (DUPLICATE_SEQUENCE_NUMBER).
    recognised: u64,
}

/// dory → proxy → Tansu (one broker, which advertises the proxy), both topics of 6
/// partitions, 12,000 of the schedule's datagrams over 12 s: answers lost with their
/// connection (t = 0.5–2 s), a 600 ms round-trip time and then the broker down with those
/// answers outstanding (t = 3–4 s, up at 6 s), again (t = 8–8.8 s, up at 10.6 s).
fn tansu_schedule(idempotence: bool) -> TansuTally {
    let proxy_port = free_port();
    let tansu = Tansu::start_advertising(proxy_port);
    for t in TOPICS {
        tansu.create_topic(t, PARTITIONS);
    }
    let listener = TcpListener::bind(("127.0.0.1", proxy_port))
        .unwrap_or_else(|e| panic!("bind the proxy on free port {proxy_port}: {e}"));
    let proxy = FaultProxy::start(listener, tansu.port());
    let mut args = DoryArgs::new([format!("127.0.0.1:{proxy_port}")]);
    args.config_toml = Some(
        Settings {
            idempotence,
            ..Settings::default()
        }
        .toml(),
    );
    let mut dory = Dory::start_isolated(args);
    dory.wait_ready();
    let ep = Endpoints {
        dgram: dory.dgram_path().to_path_buf(),
        stream: dory.stream_path().to_path_buf(),
        tcp: dory.tcp_port(),
        status: dory.status_addr(),
    };
    let mut monitor = Monitor::start(ep.status);
    let msgs = datagrams(0x30_7A, 12_000);
    let log = thread::scope(|s| {
        let start = Instant::now();
        let (ep, msgs) = (&ep, &msgs);
        let sender = s.spawn(move || send_paced(ep, msgs, start, Duration::from_secs(12)));
        let mut f = FaultLog::new(start);
        let p = &proxy;
        let rtt = Duration::from_millis(600);
        f.at(500, "lose_answers(every 5th, 4)", || p.lose_answers(5, 4));
        f.at(2000, "lose_answers(off)", || p.lose_answers(0, 0));
        f.at(3000, "rtt(600ms)", || p.delay(rtt));
        f.at(4000, "down", || p.down());
        f.at(5900, "rtt(0)", || p.delay(Duration::ZERO));
        f.at(6000, "up", || p.up());
        f.at(8000, "rtt(600ms)", || p.delay(rtt));
        f.at(8800, "down", || p.down());
        f.at(10_600, "rtt(0)", || p.delay(Duration::ZERO));
        f.at(10_600, "up", || p.up());
        sender.join().expect("sender panicked");
        f
    });
    let want: BTreeMap<String, u64> = per_topic(&msgs);
    let m = wait_received(&mut dory, &want);
    assert!(m.invariant_violations().is_empty(), "{}", m.text);
    let fin = dory.wait_drained(DRAIN_TIMEOUT);
    let (scrapes, mut problems) = monitor.finish();
    problems.extend(log.problems());
    problems.extend(fin.invariant_violations());
    let recognised = dory
        .counters()
        .ok()
        .and_then(|c| c.get("AckDuplicateSequence").copied())
        .unwrap_or(0);
    let mut t = TansuTally {
        sent: msgs.len() as u64,
        consumed_unique: 0,
        duplicates: 0,
        possible_duplicates: 0,
        cut_answers: proxy.cut_answers(),
        down_answers: proxy.down_answers(),
        recognised,
    };
    let by_id: HashMap<u32, &TestMsg> = msgs.iter().map(|m| (m.id, m)).collect();
    for topic in TOPICS {
        let delivered = fin.delivered(topic);
        let discarded = fin.discarded_total(topic);
        if discarded != 0 {
            problems.push(format!("{topic}: {:?} discarded", fin.discards_of(topic)));
        }
        let got = consume_all(
            &tansu.bootstrap(),
            topic,
            delivered as usize,
            CONSUME_TIMEOUT,
        );
        let (counts, record_problems) = check_records(topic, &got, &by_id, &[]);
        problems.extend(record_problems);
        let sent = msgs.iter().filter(|m| m.topic == topic).count() as u64;
        if (counts.len() as u64) + discarded < sent {
            problems.push(format!(
                "{topic}: LOST: sent {sent}, consumed {} distinct, discarded {discarded}",
                counts.len()
            ));
        }
        t.consumed_unique += counts.len() as u64;
        t.duplicates += got.len() as u64 - counts.len() as u64;
        t.possible_duplicates += fin.possible_duplicates(topic);
        if idempotence {
            // What Tansu stored, batch by batch: one producer identity, each record once,
            // sequences gapless in the order stored.
            let batches = fetch_topic(&tansu.bootstrap(), topic);
            if let Some(b) = batches.iter().find(|b| b.producer_id < 0) {
                problems.push(format!("{topic}: a batch without a producer id: {b:?}"));
            }
            let r = resend_report(topic, &batches);
            if r.duplicates != 0 || !r.problems.is_empty() {
                problems.push(format!("{topic}: stored batches: {r:?}"));
            }
        }
    }
    let status = dory.terminate(EXIT_TIMEOUT);
    println!(
        "TANSU issue_30 idempotence={idempotence}: {t:?} scrapes={scrapes} faults=[{}]",
        log.describe()
    );
    assert!(status.success(), "dory exited with {status}");
    assert!(problems.is_empty(), "{problems:#?}");
    // The faults must have hit answers in flight.
    assert!(
        t.cut_answers >= 1 && t.down_answers >= 1,
        "the proxy lost too few answers: {t:?}"
    );
    assert_eq!(t.consumed_unique, t.sent, "{t:?}");
    t
}
