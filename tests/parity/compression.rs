//! Compression.

use super::*;

/// (topic, codec, codec bits, min_size).
const CODEC_TOPICS: [(&str, &str, i16, usize); 6] = [
    ("codec_none", "none", 0, 0),
    ("codec_gzip", "gzip", 1, 0),
    ("codec_snappy", "snappy", 2, 0),
    ("codec_lz4", "lz4", 3, 0),
    ("codec_zstd", "zstd", 4, 0),
    ("codec_lz4_min", "lz4", 3, LZ4_MIN_SIZE),
];
const LZ4_MIN_SIZE: usize = 2048;
const CODEC_PARTITIONS: i32 = 3;
/// Phase ids: compressible text, then a big batch of random bytes, then one tiny message.
const PHASE1_COUNT: u32 = 120;
const PHASE2_BASE: u32 = 1000;
const PHASE2_COUNT: u32 = 16;
const PHASE2_VALUE: usize = 40 << 10;
const PHASE3_ID: u32 = 2000;

fn codec_toml() -> String {
    let mut t = String::from(
        "[batching]\ntime_ms = 400\nbytes = \"900k\"\n\
         [compression]\nsize_threshold_percent = 90\n\
         [compression.configs.lz4_min]\ncodec = \"lz4\"\n",
    );
    let _ = writeln!(t, "min_size = {LZ4_MIN_SIZE}");
    t.push_str("[compression.topics]\n");
    for (topic, codec, _, min) in CODEC_TOPICS {
        let name = if min > 0 { "lz4_min" } else { codec };
        let _ = writeln!(t, "{topic} = \"{name}\"");
    }
    t
}

fn counters_of(dory: &Dory) -> BTreeMap<&'static str, u64> {
    [
        "MsgSetCompressionYes",
        "MsgSetCompressionNo",
        "MsgSetNotCompressible",
        "MsgSetCompressionError",
        "MsgSetZstdUnsupportedByBroker",
    ]
    .into_iter()
    .map(|n| (n, counter(dory, n)))
    .collect()
}

fn delta(a: &BTreeMap<&'static str, u64>, b: &BTreeMap<&'static str, u64>, k: &str) -> u64 {
    b[k] - a[k]
}

/// Sends the three phases to every codec topic, then checks delivery with both consumers,
/// the counters per phase and (when `stored_codecs`) each stored batch's codec.
fn codec_scenario(brokers: &[String], bootstrap: &str, stored_codecs: bool) {
    let mut dory = start_dory(brokers, &codec_toml());
    let mut sent: BTreeMap<&str, Vec<TestMsg>> = BTreeMap::new();
    let c0 = counters_of(&dory);

    // Phase 1: compressible values of 500..3000 bytes, AnyPartition and PartitionKey.
    let mut rng = XorShift::new(0xC0DEC);
    let phase1: Vec<(&str, Vec<TestMsg>)> = CODEC_TOPICS
        .iter()
        .map(|&(topic, ..)| {
            let msgs = (0..PHASE1_COUNT)
                .map(|id| {
                    let route = if id % 2 == 0 {
                        Route::AnyPartition
                    } else {
                        Route::PartitionKey(rng.next_u64() as u32 as i32)
                    };
                    let key = if id % 3 == 0 {
                        Vec::new()
                    } else {
                        let n = rng.range(1, 17) as usize;
                        rng.bytes(n)
                    };
                    let len = rng.range(500, 3000) as usize;
                    test_msg(id, topic, route, &key, text_value(id, len))
                })
                .collect();
            (topic, msgs)
        })
        .collect();
    thread::scope(|s| {
        for (_, msgs) in &phase1 {
            let d = &dory;
            s.spawn(move || d.send_stream(msgs));
        }
    });
    let want: Vec<(&str, u64)> = CODEC_TOPICS
        .iter()
        .map(|t| (t.0, u64::from(PHASE1_COUNT)))
        .collect();
    settle(&mut dory, &want);
    let c1 = counters_of(&dory);
    for (topic, msgs) in phase1 {
        sent.entry(topic).or_default().extend(msgs);
    }

    // Phase 2: 16 × 40 KiB of random bytes per topic, in one write: one large batch that
    // does not compress below 90 %.
    let phase2: Vec<(&str, Vec<TestMsg>)> = CODEC_TOPICS
        .iter()
        .map(|&(topic, ..)| {
            let msgs = (PHASE2_BASE..PHASE2_BASE + PHASE2_COUNT)
                .map(|id| {
                    let key = format!("big-{id}");
                    test_msg(
                        id,
                        topic,
                        Route::AnyPartition,
                        key.as_bytes(),
                        random_value(id, PHASE2_VALUE, &mut rng),
                    )
                })
                .collect();
            (topic, msgs)
        })
        .collect();
    thread::scope(|s| {
        for (_, msgs) in &phase2 {
            let d = &dory;
            s.spawn(move || d.send_stream(msgs));
        }
    });
    let want: Vec<(&str, u64)> = CODEC_TOPICS
        .iter()
        .map(|t| (t.0, u64::from(PHASE1_COUNT + PHASE2_COUNT)))
        .collect();
    settle(&mut dory, &want);
    let c2 = counters_of(&dory);
    for (topic, msgs) in phase2 {
        sent.entry(topic).or_default().extend(msgs);
    }

    // Phase 3: one 100-byte message to the lz4 topic with min_size 2048.
    let tiny = test_msg(
        PHASE3_ID,
        "codec_lz4_min",
        Route::AnyPartition,
        b"tiny",
        text_value(PHASE3_ID, 100),
    );
    dory.send_stream(std::slice::from_ref(&tiny));
    settle(
        &mut dory,
        &[("codec_lz4_min", u64::from(PHASE1_COUNT + PHASE2_COUNT + 1))],
    );
    let c3 = counters_of(&dory);
    sent.entry("codec_lz4_min").or_default().push(tiny);

    // Accounting: everything delivered, nothing discarded.
    let m = dory.assert_invariant();
    for (topic, msgs) in &sent {
        let n = msgs.len() as u64;
        assert_eq!(m.delivered(topic), n, "delivered[{topic}]\n{}", m.text);
        assert_discards(&m, topic, &[]);
    }

    // Counters per phase (aggregated over topics; they are all ours).
    let mut problems = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    let d1 = |k| delta(&c0, &c1, k);
    let d2 = |k| delta(&c1, &c2, k);
    let d3 = |k| delta(&c2, &c3, k);
    check(
        d1("MsgSetCompressionYes") >= 5,
        format!(
            "phase 1 (compressible): MsgSetCompressionYes +{} (want ≥ 5, one per codec topic)",
            d1("MsgSetCompressionYes")
        ),
    );
    check(
        d1("MsgSetNotCompressible") == 0,
        format!(
            "phase 1: MsgSetNotCompressible +{}, want 0",
            d1("MsgSetNotCompressible")
        ),
    );
    check(
        d2("MsgSetCompressionYes") == 0,
        format!(
            "phase 2 (random bytes): MsgSetCompressionYes +{}, want 0",
            d2("MsgSetCompressionYes")
        ),
    );
    check(
        d2("MsgSetNotCompressible") >= 5,
        format!(
            "phase 2: MsgSetNotCompressible +{}, want ≥ 5 (one per codec topic)",
            d2("MsgSetNotCompressible")
        ),
    );
    check(
        d3("MsgSetCompressionNo") == 1
            && d3("MsgSetCompressionYes") == 0
            && d3("MsgSetNotCompressible") == 0,
        format!(
            "phase 3 (126 bytes < min_size {LZ4_MIN_SIZE}): MsgSetCompressionNo +{}, Yes +{}, \
             NotCompressible +{}; want +1, +0, +0",
            d3("MsgSetCompressionNo"),
            d3("MsgSetCompressionYes"),
            d3("MsgSetNotCompressible")
        ),
    );
    check(
        c3["MsgSetCompressionError"] == 0 && c3["MsgSetZstdUnsupportedByBroker"] == 0,
        format!(
            "MsgSetCompressionError {} and MsgSetZstdUnsupportedByBroker {}, want 0 (zstd must \
             compress: dory uses Produce v7+ here)",
            c3["MsgSetCompressionError"], c3["MsgSetZstdUnsupportedByBroker"]
        ),
    );

    // Consumer 1: librdkafka (CRC checks on).
    let features = librdkafka_features();
    for (topic, codec, ..) in CODEC_TOPICS {
        let msgs = &sent[topic];
        if codec != "none" && !features.contains(codec) {
            // Reported by `librdkafka_consumer_reads_every_codec`; the second consumer
            // below still checks this topic.
            eprintln!(
                "NOTE: librdkafka here is built without {codec} (builtin.features = \
                 {features:?}); {topic} is checked with the kafka-protocol consumer only"
            );
            continue;
        }
        let got = consume_all(bootstrap, topic, msgs.len(), CONSUME_TIMEOUT);
        if let Err(r) = verify_delivery(msgs, &got, CODEC_PARTITIONS) {
            check(false, format!("librdkafka consumer, {topic}: {r}"));
        }
    }

    // Consumer 2: raw Fetch + kafka-protocol decoding; then each stored batch's codec.
    let mut summary = Vec::new();
    let mut stored_counts: BTreeMap<&str, u64> = BTreeMap::new();
    for (topic, _, bits, min_size) in CODEC_TOPICS {
        let batches = fetch_topic(bootstrap, topic);
        let msgs = &sent[topic];
        if let Err(r) = verify_delivery(msgs, &stored_records(&batches), CODEC_PARTITIONS) {
            check(false, format!("kafka-protocol consumer, {topic}: {r}"));
        }
        let mut kinds: BTreeMap<i16, usize> = BTreeMap::new();
        let mut biggest_random = 0usize;
        for b in &batches {
            *kinds.entry(b.codec).or_default() += 1;
            let ids = b.ids();
            let random = ids
                .iter()
                .filter(|&&i| (PHASE2_BASE..PHASE3_ID).contains(&i))
                .count();
            if random > 0 {
                biggest_random = biggest_random.max(b.dory_size());
            }
            if random != 0 && random != ids.len() {
                check(
                    false,
                    format!("{topic}: batch at {} mixes phases: {ids:?}", b.base_offset),
                );
                continue;
            }
            let want = if bits == 0 || b.dory_size() < min_size || random > 0 {
                0
            } else {
                bits
            };
            if stored_codecs && b.codec != want {
                check(
                    false,
                    format!(
                        "{topic}: batch {}/{} ({} records, {} B by dory's measure, {} B on the \
                         wire, {}) has codec {}, want {want}",
                        b.partition,
                        b.base_offset,
                        b.records.len(),
                        b.dory_size(),
                        b.wire_len,
                        if random > 0 { "random bytes" } else { "text" },
                        b.codec
                    ),
                );
            }
            if bits != 0 {
                let kind = if b.codec != 0 {
                    "MsgSetCompressionYes"
                } else if b.dory_size() < min_size {
                    "MsgSetCompressionNo"
                } else {
                    "MsgSetNotCompressible"
                };
                *stored_counts.entry(kind).or_default() += 1;
            }
        }
        check(
            biggest_random >= 256 << 10,
            format!(
                "{topic}: the largest batch of random bytes holds {biggest_random} B; want one \
                 ≥ 256 KiB (16 × 40 KiB sent in one write, time_ms 400, bytes 900k)"
            ),
        );
        summary.push(format!(
            "{topic}: {} batches by codec {kinds:?}, largest random batch {biggest_random} B",
            batches.len()
        ));
    }
    if stored_codecs {
        // Every partition record set dory compressed, tried, or skipped is one stored batch.
        for k in [
            "MsgSetCompressionYes",
            "MsgSetCompressionNo",
            "MsgSetNotCompressible",
        ] {
            let stored = stored_counts.get(k).copied().unwrap_or(0);
            check(
                delta(&c0, &c3, k) == stored,
                format!(
                    "{k} = {} but the broker holds {stored} such batches",
                    delta(&c0, &c3, k)
                ),
            );
        }
    }
    eprintln!(
        "codecs via {bootstrap}: counters {:?}\n  {}",
        c3,
        summary.join("\n  ")
    );
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_codec_round_trips_through_the_mock_cluster() {
    let mock = Mock::start(3);
    for (topic, ..) in CODEC_TOPICS {
        mock.create_topic(topic, CODEC_PARTITIONS);
    }
    codec_scenario(&mock.broker_addrs(), &mock.bootstrap(), true);
}

#[test]
fn every_codec_round_trips_through_tansu() {
    let tansu = Tansu::start();
    for (topic, ..) in CODEC_TOPICS {
        tansu.create_topic(topic, CODEC_PARTITIONS);
    }
    codec_scenario(&[tansu.bootstrap()], &tansu.bootstrap(), true);
}

/// A broker that speaks Produce only up to v6 cannot read zstd (v7+): dory sends such a
/// topic's batches uncompressed, counts `MsgSetZstdUnsupportedByBroker`, and loses nothing.
#[test]
fn zstd_falls_back_to_uncompressed_below_produce_v7() {
    const TOPIC: &str = "zstd_old_broker";
    const COUNT: u32 = 60;
    let mock = Mock::start(1);
    mock.create_topic(TOPIC, 2);
    mock.cluster()
        .apiversion(rdkafka::types::RDKafkaApiKey::Produce, Some(3), Some(6))
        .expect("limit the mock's Produce versions");
    let mut dory = start_dory(
        &mock.broker_addrs(),
        &format!("[batching]\ntime_ms = 100\n[compression.topics]\n{TOPIC} = \"zstd\"\n"),
    );
    let msgs: Vec<TestMsg> = (0..COUNT)
        .map(|id| test_msg(id, TOPIC, Route::AnyPartition, b"", text_value(id, 600)))
        .collect();
    dory.send_stream(&msgs);
    let m = settle(&mut dory, &[(TOPIC, u64::from(COUNT))]);
    assert_eq!(
        m.delivered(TOPIC),
        u64::from(COUNT),
        "every message delivered"
    );
    let c = counters_of(&dory);
    assert!(
        c["MsgSetZstdUnsupportedByBroker"] >= 1,
        "the fallback is counted: {c:?}"
    );
    assert_eq!(
        c["MsgSetCompressionYes"], 0,
        "nothing went out compressed: {c:?}"
    );
    let logs = dory.logs();
    assert!(
        logs.contains("speaks Produce v6"),
        "dory logged the fallback with the version it used:\n{logs}"
    );
    let stored = fetch_topic(&mock.bootstrap(), TOPIC);
    assert!(!stored.is_empty(), "the broker stored batches");
    for b in &stored {
        assert_eq!(
            b.codec, 0,
            "batch at {}/{} is uncompressed",
            b.partition, b.base_offset
        );
    }
    let mut values: Vec<Vec<u8>> =
        consume_all(&mock.bootstrap(), TOPIC, COUNT as usize, CONSUME_TIMEOUT)
            .into_iter()
            .map(|r| r.value.expect("a value"))
            .collect();
    values.sort();
    let mut want: Vec<Vec<u8>> = msgs.into_iter().map(|t| t.value).collect();
    want.sort();
    assert_eq!(values, want, "the consumer read back exactly what was sent");
    dory.assert_invariant();
}

/// The consumer the suite trusts must read every codec dory writes. If this fails for
/// zstd: add the `zstd` feature to the `rdkafka` dev-dependency in Cargo.toml
/// (`features = ["libz", "zstd"]`, which builds librdkafka WITH_ZSTD via `zstd-sys`).
#[test]
fn librdkafka_consumer_reads_every_codec() {
    let features = librdkafka_features();
    let missing: Vec<&str> = ["gzip", "snappy", "lz4", "zstd"]
        .into_iter()
        .filter(|c| !features.contains(*c))
        .collect();
    assert!(
        missing.is_empty(),
        "the bundled librdkafka cannot decompress {missing:?} (builtin.features = \
         {features:?}); enable the rdkafka crate feature(s) {:?} in [dev-dependencies] \
         (e.g. rdkafka = {{ version = \"0.39\", default-features = false, features = \
         [\"libz\", \"zstd\"] }})",
        missing
            .iter()
            .map(|c| if *c == "gzip" { "libz" } else { c })
            .collect::<Vec<_>>()
    );
}
