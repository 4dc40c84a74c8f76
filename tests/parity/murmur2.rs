//! murmur2: the Java client's partition for a key.

use super::*;

/// Keys with the Java client's `Utils.murmur2(key)` (as a Java int, i.e. i32). The Java
/// default partitioner picks `toPositive(murmur2(key)) % partitions`, with
/// `toPositive(x) = x & 0x7fffffff`.
const JAVA_MURMUR2: &[(&str, i32)] = &[
    // librdkafka tests/0048-partitioner.c, do_test_partitioners(), row "murmur2": values
    // printed by tests/java/Murmur2Cli.java (Utils.toPositive(Utils.murmur2(key)) on the
    // Java client), used there as `value % partition_cnt` with partition_cnt 7 or 17.
    ("23456", 0x058d_780f),
    (
        "this is another string with more length to it perhaps",
        0x4f77_03da,
    ),
    ("hejsan", 0x5ec1_9395),
    // Apache Kafka clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java,
    // testMurmur2.
    ("21", -973_932_308),
    ("foobar", -790_332_482),
    ("a-little-bit-long-string", -985_981_536),
    ("a-little-bit-longer-string", -1_486_304_829),
    (
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
        -58_897_971,
    ),
    ("abc", 479_470_107),
    // librdkafka src/rdmurmur2.c, unittest_murmur2(): java_murmur2_results (checked there
    // against the Java client).
    ("kafka", 0xd067_cf64_u32 as i32),
    ("giberish123456789", 0x8f55_2b0c_u32 as i32),
    ("1234", 0x9fc9_7b14_u32 as i32),
    ("234", 0xe7c0_09ca_u32 as i32),
    ("34", 0x8739_30da_u32 as i32),
    ("4", 0x5a4b_5ca1),
    ("PreAmbleWillBeRemoved,ThePrePartThatIs", 0x7842_4f1c),
    ("reAmbleWillBeRemoved,ThePrePartThatIs", 0x4a62_b377),
    (
        "eAmbleWillBeRemoved,ThePrePartThatIs",
        0xe0e4_e09e_u32 as i32,
    ),
    ("AmbleWillBeRemoved,ThePrePartThatIs", 0x62b8_b43f),
];

fn java_partition(hash: i32, partitions: i32) -> i32 {
    (hash & 0x7fff_ffff) % partitions
}

/// Produces `(key, value)` records with librdkafka's Java-compatible `murmur2_random`
/// partitioner and waits for every delivery.
fn rdkafka_produce(bootstrap: &str, topic: &str, records: &[(Vec<u8>, Vec<u8>)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "20000")
        .create()
        .expect("rdkafka producer");
    let deadline = Instant::now() + Duration::from_secs(20);
    for (k, v) in records {
        loop {
            match producer.send(
                BaseRecord::<[u8], [u8]>::to(topic)
                    .key(&k[..])
                    .payload(&v[..]),
            ) {
                Ok(()) => break,
                Err((e, _)) => {
                    assert!(Instant::now() < deadline, "rdkafka produce: {e}");
                    producer.poll(Duration::from_millis(50));
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(20))
        .expect("rdkafka producer flush");
}

#[test]
fn murmur2_places_keys_where_the_java_client_does() {
    let mock = Mock::start(3);
    let topics = [("mm7", 7), ("mm17", 17)];
    for (t, n) in topics {
        mock.create_topic(t, n);
    }
    let toml =
        "[batching]\ntime_ms = 20\n[partitioning.topics]\nmm7 = \"murmur2\"\nmm17 = \"murmur2\"\n";
    let mut dory = start_dory(&mock.broker_addrs(), toml);

    let mut rng = XorShift::new(0x0003_A3A2);
    let mut keys: Vec<Vec<u8>> = JAVA_MURMUR2
        .iter()
        .map(|(k, _)| k.as_bytes().to_vec())
        .collect();
    for _ in 0..150 {
        let n = rng.range(1, 40) as usize;
        keys.push(rng.bytes(n));
    }
    let mut sent: BTreeMap<&str, Vec<TestMsg>> = BTreeMap::new();
    for (topic, _) in topics {
        let mut msgs = Vec::new();
        let mut id = 0u32;
        // Every key twice, AnyPartition.
        for _ in 0..2 {
            for k in &keys {
                msgs.push(test_msg(
                    id,
                    topic,
                    Route::AnyPartition,
                    k,
                    text_value(id, 30),
                ));
                id += 1;
            }
        }
        // Unkeyed AnyPartition and PartitionKey messages keep Dory's rules.
        for i in 0..20u32 {
            msgs.push(test_msg(
                id,
                topic,
                Route::AnyPartition,
                b"",
                text_value(id, 30),
            ));
            id += 1;
            let k = format!("pk-{i}");
            msgs.push(test_msg(
                id,
                topic,
                Route::PartitionKey((i * 7919) as i32 - 50_000),
                k.as_bytes(),
                text_value(id, 30),
            ));
            id += 1;
        }
        dory.send_stream(&msgs);
        sent.insert(topic, msgs);
    }
    let want: Vec<(&str, u64)> = sent.iter().map(|(t, m)| (*t, m.len() as u64)).collect();
    let m = settle(&mut dory, &want);
    for (t, msgs) in &sent {
        assert_eq!(m.delivered(t), msgs.len() as u64, "{}", m.text);
    }

    // The same keys through librdkafka's Java-compatible partitioner.
    for (topic, _) in topics {
        let records: Vec<(Vec<u8>, Vec<u8>)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), format!("rdkafka-{i}").into_bytes()))
            .collect();
        rdkafka_produce(&mock.bootstrap(), topic, &records);
    }

    let mut problems = Vec::new();
    for (topic, n) in topics {
        let msgs = &sent[topic];
        let got = consume_all(
            &mock.bootstrap(),
            topic,
            msgs.len() + keys.len(),
            CONSUME_TIMEOUT,
        );
        let (ours, theirs): (Vec<Consumed>, Vec<Consumed>) = got.into_iter().partition(|c| {
            !c.value
                .as_deref()
                .unwrap_or_default()
                .starts_with(b"rdkafka-")
        });
        if let Err(r) = verify_delivery(msgs, &ours, n) {
            problems.push(format!("{topic}: {r}"));
        }
        assert_eq!(theirs.len(), keys.len(), "{topic}: rdkafka records");
        let rdkafka_part: HashMap<Vec<u8>, i32> = theirs
            .iter()
            .map(|c| (c.key.clone().unwrap_or_default(), c.partition))
            .collect();
        let java: HashMap<&[u8], i32> = JAVA_MURMUR2
            .iter()
            .map(|(k, h)| (k.as_bytes(), java_partition(*h, n)))
            .collect();
        let mut checked = 0;
        for c in &ours {
            let Some(key) = c.key.as_deref().filter(|k| !k.is_empty()) else {
                continue;
            };
            if key.starts_with(b"pk-") {
                continue;
            }
            checked += 1;
            if let Some(&p) = java.get(key) {
                if c.partition != p {
                    problems.push(format!(
                        "{topic} ({n} partitions): key {:?} on partition {}, the Java client \
                         puts it on {p}",
                        String::from_utf8_lossy(key),
                        c.partition
                    ));
                }
            }
            match rdkafka_part.get(key) {
                Some(&p) if p == c.partition => {}
                other => problems.push(format!(
                    "{topic} ({n} partitions): key [{}] on partition {}, librdkafka \
                     murmur2_random put it on {other:?}",
                    hex(key),
                    c.partition
                )),
            }
        }
        assert_eq!(checked, keys.len() * 2, "{topic}: keyed records checked");
        // librdkafka agrees with the Java vectors too (a check of the oracle).
        for (k, h) in JAVA_MURMUR2 {
            let want = java_partition(*h, n);
            if rdkafka_part.get(k.as_bytes()) != Some(&want) {
                problems.push(format!(
                    "{topic}: librdkafka put {k:?} on {:?}, Java vector says {want}",
                    rdkafka_part.get(k.as_bytes())
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
