//! Connections lost, brokers down, leaders moved, latency.

use super::*;

/// The mock drops the connection on 3 Produce requests (twice, mid-stream). Unanswered
/// messages go back for rerouting, counted as possible duplicates; connection failures do
/// not count attempts (the limit is set to 1 so any miscounted attempt would discard).
#[test]
fn connection_reset_mid_stream() {
    connection_reset_scenario("connection_reset", true);
}

#[test]
fn connection_reset_mid_stream_without_idempotence() {
    connection_reset_scenario("connection_reset_without_idempotence", false);
}

/// Connections cut mid-stream with requests outstanding. With idempotence the resends
/// carry their sequence numbers, so nothing counts as a possible duplicate; without, the
/// unacknowledged messages are resent as possible duplicates.
fn connection_reset_scenario(name: &'static str, idempotence: bool) {
    let settings = Settings {
        max_failed_attempts: Some(1),
        idempotence,
        ..Settings::default()
    };
    let mut sc = Scenario::start(name, settings);
    let msgs = traffic(0xFA_C0AA, 3000, 0);
    sc.drive(&msgs, Duration::from_millis(3000), |mock, f| {
        for ms in [800, 1800] {
            f.at(ms, "disconnect x3", || {
                mock.cluster().request_errors(
                    RDKafkaApiKey::Produce,
                    &[E::RD_KAFKA_RESP_ERR__TRANSPORT; 3],
                )
            });
        }
    });
    let fin = sc.drain(&msgs);
    let expect = Expect {
        possible_duplicates_required: !idempotence,
        no_possible_duplicates: idempotence,
        ..Expect::default()
    };
    sc.verify(&msgs, &fin, &expect, Vec::new(), "resets=6 limit=1");
}

/// Broker 2 (leader of partitions 1 and 4 of both topics) down for 3 s mid-stream, then up.
/// Nothing may be discarded (limit 1: connection failures must not count attempts);
/// everything held for broker 2 is delivered once it is back.
#[test]
fn broker_down_for_seconds_then_up() {
    let settings = Settings {
        max_failed_attempts: Some(1),
        ..Settings::default()
    };
    let mut sc = Scenario::start("broker_down_3s_then_up", settings);
    let msgs = traffic(0xFA_D0A2, 6000, 0);
    sc.drive(&msgs, Duration::from_millis(6000), |mock, f| {
        f.at(1500, "broker_down(2)", || mock.cluster().broker_down(2))
            .expect("broker_down(2)");
        f.at(4500, "broker_up(2)", || mock.cluster().broker_up(2))
            .expect("broker_up(2)");
    });
    let fin = sc.drain(&msgs);
    let mut problems = Vec::new();
    match sc.counter("ConnectorConnectFail") {
        Ok(0) => problems.push(
            "ConnectorConnectFail = 0: dory never tried to reconnect to the downed broker".into(),
        ),
        Ok(_) => {}
        Err(e) => problems.push(e),
    }
    let expect = Expect {
        vanishing_brokers: vec![2],
        ..Expect::default()
    };
    sc.verify(&msgs, &fin, &expect, problems, "down=1.5s..4.5s limit=1");
}

/// After a short outage of broker 2 (1 s → 2.5 s), its partitions must be used again:
/// among messages sent from 3 s after its return, AnyPartition messages reach partitions 1
/// and 4 again and PartitionKey messages of those partitions land on them (not on the
/// partitions they were remapped to while broker 2 was missing from Metadata).
#[test]
fn broker_back_up_gets_its_partitions_again() {
    let mut sc = Scenario::start("broker_back_up_partitions_used_again", Settings::default());
    let msgs = traffic(0xFA_BAC2, 5000, 0);
    let mut up_at = None;
    let sent_at = sc.drive(&msgs, Duration::from_millis(7000), |mock, f| {
        f.at(1000, "broker_down(2)", || mock.cluster().broker_down(2))
            .expect("broker_down(2)");
        f.at(2500, "broker_up(2)", || {
            up_at = Some(Instant::now());
            mock.cluster().broker_up(2)
        })
        .expect("broker_up(2)");
    });
    let from = up_at.expect("fault ran") + Duration::from_secs(3);
    let fin = sc.drain(&msgs);
    let late: std::collections::HashSet<u32> = sent_at
        .iter()
        .filter(|(_, t)| *t >= from)
        .map(|(id, _)| *id)
        .collect();
    let by_id: HashMap<u32, &TestMsg> = msgs.iter().map(|m| (m.id, m)).collect();
    let broker2 = |p: i32| p % BROKERS + 1 == 2;
    let (mut any, mut any_on2, mut keyed, mut keyed_home) = (0u64, 0u64, 0u64, 0u64);
    let post = |_: &str, got: &[Consumed], _: &mut Vec<String>| {
        for c in got {
            let Some(m) = c
                .value
                .as_deref()
                .and_then(value_id)
                .and_then(|id| late.contains(&id).then(|| by_id[&id]))
            else {
                continue;
            };
            match m.expected_partition(PARTITIONS) {
                None => {
                    any += 1;
                    any_on2 += u64::from(broker2(c.partition));
                }
                Some(p) if broker2(p) => {
                    keyed += 1;
                    keyed_home += u64::from(c.partition == p);
                }
                Some(_) => {}
            }
        }
    };
    let expect = Expect {
        vanishing_brokers: vec![2],
        ..Expect::default()
    };
    // `post` borrows the counters; the verdict on them comes after verify_with's checks.
    let mut problems = Vec::new();
    let name = sc.name;
    let notes = format!("late_msgs={}", late.len());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sc.verify_with(&msgs, &fin, &expect, Vec::new(), &notes, post)
    }));
    if any_on2 == 0 {
        problems.push(format!(
            "none of the {any} AnyPartition messages sent 3 s or more after broker 2 came back \
             went to its partitions 1 or 4"
        ));
    }
    if keyed_home < keyed {
        problems.push(format!(
            "{} of {keyed} PartitionKey messages for partitions 1/4 sent 3 s or more after \
             broker 2 came back did not land on their own partition",
            keyed - keyed_home
        ));
    }
    println!(
        "FAULTS {name} (after return): anypartition_on_broker2={any_on2}/{any} \
         keyed_on_own_partition={keyed_home}/{keyed} => {}",
        if problems.is_empty() { "ok" } else { "FAILED" }
    );
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert!(problems.is_empty(), "{name}: {}", problems.join("; "));
}

/// Every partition's leader moves to the next broker mid-stream, then again. Produce to the
/// old leader answers NOT_LEADER_OR_FOLLOWER: refresh, reroute, nothing lost or doubled.
#[test]
fn leader_moved_to_another_broker() {
    let mut sc = Scenario::start("leader_moved", Settings::default());
    let msgs = traffic(0xFA_1EAD, 4000, 0);
    sc.drive(&msgs, Duration::from_millis(4000), |mock, f| {
        for (ms, shift) in [(1200, 1), (2600, 2)] {
            f.at(ms, &format!("move_leaders(+{shift})"), || {
                for t in TOPICS {
                    for p in 0..PARTITIONS {
                        let leader = (p + shift) % BROKERS + 1;
                        mock.cluster()
                            .partition_leader(t, p, Some(leader))
                            .expect("partition_leader");
                    }
                }
            });
        }
    });
    let fin = sc.drain(&msgs);
    let mut problems = Vec::new();
    match sc.counter("AckErrorNotLeaderForPartition") {
        Ok(0) => problems.push(
            "AckErrorNotLeaderForPartition = 0: no Produce reached an old leader after the \
             move (fault not exercised)"
                .into(),
        ),
        Ok(_) => {}
        Err(e) => problems.push(e),
    }
    let expect = Expect {
        no_duplicates: true,
        ..Expect::default()
    };
    sc.verify(&msgs, &fin, &expect, problems, "moves=2");
}

/// All brokers down for 3.5 s while 8000 messages arrive at ~1300/s into a 256 KiB pool
/// (2048 blocks): the pool fills, later messages are discarded `no_memory`, nothing held is
/// evicted (every message sent before the outage is consumed), and when the brokers return
/// everything held is delivered without a restart.
#[test]
fn all_brokers_down_past_the_pool_size() {
    let pool = 256 * 1024u64;
    let settings = Settings {
        msg_buffer_max: Some(pool),
        ..Settings::default()
    };
    let mut sc = Scenario::start("all_brokers_down_pool_full", settings);
    let msgs = traffic(0xFA_9001, 8000, 0);
    let mut down_at = None;
    let sent_at = sc.drive(&msgs, Duration::from_millis(6000), |mock, f| {
        f.at(1000, "broker_down(all)", || {
            down_at = Some(Instant::now());
            mock.cluster().broker_down(-1)
        })
        .expect("broker_down(-1)");
        f.at(4500, "broker_up(all)", || mock.cluster().broker_up(-1))
            .expect("broker_up(-1)");
    });
    let down_at = down_at.expect("fault ran");
    let fin = sc.drain(&msgs);
    let mut problems = Vec::new();
    let no_memory: u64 = TOPICS.iter().map(|t| fin.discarded(t, NO_MEMORY)).sum();
    let during = sent_at.iter().filter(|(_, t)| *t >= down_at).count() as u64;
    let blocks = pool / 128;
    if during <= blocks {
        problems.push(format!(
            "test bug: only {during} messages sent during the outage, pool holds {blocks}"
        ));
    }
    if no_memory > during {
        problems.push(format!(
            "{no_memory} no_memory discards, but only {during} messages arrived during the outage"
        ));
    }
    // Reconnects back off: 3 dispatchers over a 3.5 s outage with 50 ms doubling to 1 s
    // make about 8 attempts each; a busy loop would make thousands.
    let connect_fails = sc.counter("ConnectorConnectFail").unwrap_or_else(|e| {
        problems.push(e);
        0
    });
    if !(1..=90).contains(&connect_fails) {
        problems.push(format!(
            "ConnectorConnectFail = {connect_fails} over a 3.5 s outage of 3 brokers with \
             retry_backoff 50..1000 ms: expected 1..=90 (exponential backoff)"
        ));
    }
    // Nothing held is evicted: every message sent before the outage is in Kafka.
    let topic_of: HashMap<u32, &str> = msgs.iter().map(|m| (m.id, m.topic.as_str())).collect();
    let before: Vec<(u32, &str)> = sent_at
        .iter()
        .filter(|(_, t)| *t < down_at)
        .map(|(id, _)| (*id, topic_of[id]))
        .collect();
    let post = |topic: &str, got: &[Consumed], problems: &mut Vec<String>| {
        let ids: std::collections::HashSet<u32> = got
            .iter()
            .filter_map(|c| c.value.as_deref().and_then(value_id))
            .collect();
        let evicted: Vec<u32> = before
            .iter()
            .filter(|(id, t)| *t == topic && !ids.contains(id))
            .map(|(id, _)| *id)
            .collect();
        if !evicted.is_empty() {
            problems.push(format!(
                "{topic}: {} message(s) sent before the outage never reached Kafka (held \
                 messages evicted or lost): ids {:?}",
                evicted.len(),
                &evicted[..evicted.len().min(15)]
            ));
        }
    };
    let expect = Expect {
        allowed: vec![NO_MEMORY],
        required: vec![NO_MEMORY],
        ..Expect::default()
    };
    let notes =
        format!("pool_blocks={blocks} sent_during_outage={during} connect_fails={connect_fails}");
    sc.verify_with(&msgs, &fin, &expect, problems, &notes, post);
}

/// Broker 1 answers 700 ms late for 2.5 s (far below the 60 s socket timeout): slower, but
/// nothing lost, doubled, discarded, and no connection given up.
#[test]
fn broker_with_high_latency() {
    let mut sc = Scenario::start("broker_high_latency_700ms", Settings::default());
    let msgs = traffic(0xFA_1A7E, 4000, 0);
    sc.drive(&msgs, Duration::from_millis(4500), |mock, f| {
        f.at(1000, "rtt(1,700ms)", || {
            mock.cluster()
                .broker_round_trip_time(1, Duration::from_millis(700))
        })
        .expect("rtt");
        f.at(3500, "rtt(1,0)", || {
            mock.cluster().broker_round_trip_time(1, Duration::ZERO)
        })
        .expect("rtt");
    });
    let fin = sc.drain(&msgs);
    let expect = Expect {
        no_duplicates: true,
        no_possible_duplicates: true,
        ..Expect::default()
    };
    sc.verify(&msgs, &fin, &expect, Vec::new(), "rtt=700ms for 2.5s");
}

/// Broker 1 answers 1.5 s late for 2 s with `socket_timeout_ms = 1000`: dory gives up on
/// the connection with requests outstanding (the mock has already appended them), and
/// resends them; nothing discarded (limit 1: timeouts are not attempts). With idempotence
/// the resends carry the same producer id, epoch and sequence numbers, which a Kafka broker
/// recognises (the mock, which checks sequences only for transactional producers, stores
/// them again: every such copy must be a same-sequence resend) and nothing counts as a
/// possible duplicate; without, the resends are counted possible duplicates.
#[test]
fn broker_latency_beyond_socket_timeout() {
    latency_scenario("broker_latency_beyond_socket_timeout", true);
}

#[test]
fn broker_latency_beyond_socket_timeout_without_idempotence() {
    latency_scenario(
        "broker_latency_beyond_socket_timeout_without_idempotence",
        false,
    );
}

fn latency_scenario(name: &'static str, idempotence: bool) {
    let settings = Settings {
        max_failed_attempts: Some(1),
        socket_timeout_ms: Some(1000),
        idempotence,
        ..Settings::default()
    };
    let mut sc = Scenario::start(name, settings);
    let msgs = traffic(0xFA_71E0, 4000, 0);
    sc.drive(&msgs, Duration::from_millis(4500), |mock, f| {
        f.at(1000, "rtt(1,1500ms)", || {
            mock.cluster()
                .broker_round_trip_time(1, Duration::from_millis(1500))
        })
        .expect("rtt");
        f.at(3000, "rtt(1,0)", || {
            mock.cluster().broker_round_trip_time(1, Duration::ZERO)
        })
        .expect("rtt");
    });
    let fin = sc.drain(&msgs);
    let expect = Expect {
        possible_duplicates_required: !idempotence,
        no_possible_duplicates: idempotence,
        ..Expect::default()
    };
    sc.verify(
        &msgs,
        &fin,
        &expect,
        Vec::new(),
        "rtt=1500ms for 2s socket_timeout=1000ms limit=1",
    );
}
