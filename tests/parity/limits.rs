//! Size and rate limits, and the discard log's lines.

use super::*;

const PREFIX: usize = 24;

#[test]
fn size_and_rate_limits_discard_exactly_and_log_each_discard() {
    let mock = Mock::start(1);
    for t in ["lim_long", "lim_rate", "lim_zero", "lim_window"] {
        mock.create_topic(t, 1);
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let log_path = tmp.path().join("log").join("discard.log");
    let toml = format!(
        "[batching]\nmessage_max_bytes = 10000\n\
         [delivery]\nunknown_topic_wait_ms = 3000\n\
         [rate_limit.configs.r37]\ninterval_ms = 600000\nmax_count = 37\n\
         [rate_limit.configs.nothing]\ninterval_ms = 1000\nmax_count = 0\n\
         [rate_limit.configs.r5]\ninterval_ms = 1500\nmax_count = 5\n\
         [rate_limit.topics]\nlim_rate = \"r37\"\nlim_zero = \"nothing\"\nlim_window = \"r5\"\n\
         [discard_log]\nenable = true\npath = {}\nmax_file_size = \"1m\"\n\
         max_archive_size = \"1m\"\nmax_msg_prefix_size = {PREFIX}\n",
        toml_path(&log_path)
    );
    let started_ms = now_ms();
    let mut dory = start_dory(&mock.broker_addrs(), &toml);

    let mut expected_lines: Vec<String> = Vec::new();
    let mut stream: Vec<TestMsg> = Vec::new();
    let mut delivered: BTreeMap<&str, Vec<TestMsg>> = BTreeMap::new();
    let mut id = 0u32;
    let mut next = || {
        id += 1;
        id - 1
    };

    // lim_long: key + value + 26 ≤ 10000 passes, anything larger is too_long.
    for (key, len, ok) in [
        (&b"k"[..], 9973usize, true), // 1 + 9973 + 26 = 10000
        (b"k", 9973, true),
        (b"k", 9973, true),
        (b"", 9974, true),   // 0 + 9974 + 26 = 10000
        (b"k", 9974, false), // 10001
        (b"k", 9974, false),
        (b"k", 9974, false),
        (b"k", 9974, false),
        (b"kk", 30000, false),
    ] {
        let mid = next();
        let m = test_msg(
            mid,
            "lim_long",
            Route::AnyPartition,
            key,
            text_value(mid, len),
        );
        if ok {
            delivered.entry("lim_long").or_default().push(m.clone());
        } else {
            expected_lines.push(disc_rest(&m, "LONG_MSG", PREFIX));
        }
        stream.push(m);
    }

    // lim_rate: 100 good messages with 10 too-long ones among them, which use no quota:
    // exactly the first 37 good ones pass.
    for i in 0..100u32 {
        if i % 10 == 5 {
            let mid = next();
            let m = test_msg(
                mid,
                "lim_rate",
                Route::AnyPartition,
                b"rl",
                text_value(mid, 10_000),
            );
            expected_lines.push(disc_rest(&m, "LONG_MSG", PREFIX));
            stream.push(m);
        }
        let mid = next();
        let key = format!("rate-key-{i:03}");
        let m = test_msg(
            mid,
            "lim_rate",
            Route::PartitionKey(i as i32),
            key.as_bytes(),
            text_value(mid, 40),
        );
        if i < 37 {
            delivered.entry("lim_rate").or_default().push(m.clone());
        } else {
            expected_lines.push(disc_rest(&m, "RATE_LIMIT", PREFIX));
        }
        stream.push(m);
    }

    // lim_zero: max_count 0 discards everything; lim_missing does not exist (auto-creation
    // is off with a config file).
    for (topic, info, n) in [
        ("lim_zero", "RATE_LIMIT", 5),
        ("lim_missing", "BAD_TOPIC", 3),
    ] {
        for _ in 0..n {
            let mid = next();
            let m = test_msg(mid, topic, Route::AnyPartition, b"", text_value(mid, 30));
            expected_lines.push(disc_rest(&m, info, PREFIX));
            stream.push(m);
        }
    }
    dory.send_stream(&stream);

    // lim_window: 5 per 1500 ms, the window starting at the first message. Two bursts of
    // 10, the second 2 s after the first (in the next window): 5 of each pass.
    for burst in 0..2 {
        if burst == 1 {
            dory.wait_received(&[("lim_window", 10)], WAIT);
            thread::sleep(Duration::from_millis(2000));
        }
        let msgs: Vec<TestMsg> = (0..10)
            .map(|i| {
                let mid = next();
                let key = format!("w{burst}-{i}");
                let m = test_msg(
                    mid,
                    "lim_window",
                    Route::AnyPartition,
                    key.as_bytes(),
                    text_value(mid, 30),
                );
                if i < 5 {
                    delivered.entry("lim_window").or_default().push(m.clone());
                } else {
                    expected_lines.push(disc_rest(&m, "RATE_LIMIT", PREFIX));
                }
                m
            })
            .collect();
        dory.send_stream(&msgs);
    }

    // One malformed datagram (flags != 0): logged with its raw bytes and the current time.
    let bad = encode_raw(
        256,
        0,
        1,
        None,
        b"lim_rate",
        now_ms(),
        b"k",
        b"malformed value",
    );
    DgramSender::new(dory.dgram_path()).send(&bad);

    dory.wait_metrics("every discard counted", WAIT, |m| {
        let want = [
            ("lim_long", 9),
            ("lim_rate", 110),
            ("lim_zero", 5),
            ("lim_missing", 3),
            ("lim_window", 20),
            ("", 1),
        ];
        let short: Vec<String> = want
            .iter()
            .filter(|(t, n)| m.received(t) < *n || m.in_flight(t) > 0)
            .map(|(t, n)| {
                format!(
                    "{t:?}: received {} of {n}, in flight {}",
                    m.received(t),
                    m.in_flight(t)
                )
            })
            .collect();
        if short.is_empty() {
            Ok(())
        } else {
            Err(short.join("; "))
        }
    });
    let m = dory.assert_invariant();
    assert_discards(&m, "lim_long", &[("too_long", 5)]);
    assert_discards(&m, "lim_rate", &[("too_long", 10), ("rate_limit", 63)]);
    assert_discards(&m, "lim_zero", &[("rate_limit", 5)]);
    assert_discards(&m, "lim_missing", &[("bad_topic", 3)]);
    assert_discards(&m, "lim_window", &[("rate_limit", 10)]);
    assert_discards(&m, "", &[("malformed", 1)]);
    assert_eq!(m.delivered("lim_long"), 4);
    assert_eq!(m.delivered("lim_rate"), 37);
    // Nothing in flight, so nothing in any queue state: a discard on the way into a batch
    // (too long, rate limit) took its message back off the batch count.
    let (code, queues) = dory.http_get("/queues/json");
    assert_eq!(code, 200, "{queues}");
    let queues: serde_json::Value =
        serde_json::from_str(&queues).unwrap_or_else(|e| panic!("{e}: {queues}"));
    assert_eq!(queues["new"], 0, "{queues}");
    assert_eq!(queues["sending"], serde_json::json!([]), "{queues}");
    assert!(
        !topic_exists(&mock.bootstrap(), "lim_missing"),
        "lim_missing was created although auto-creation is off"
    );
    for (topic, msgs) in &delivered {
        let got = consume_all(&mock.bootstrap(), topic, msgs.len(), CONSUME_TIMEOUT);
        if let Err(r) = verify_delivery(msgs, &got, 1) {
            panic!("{topic}: {r}");
        }
    }

    // The discard log: one line per discard, exactly as expected (order across threads is
    // not fixed, so compared as multisets).
    let total = expected_lines.len() + 1;
    let lines = poll_until("every discard in the discard log", WAIT, || {
        let l = read_lines(&log_path);
        if l.len() >= total {
            Ok(l)
        } else {
            Err(format!("{} of {total} lines", l.len()))
        }
    });
    let ended_ms = now_ms();
    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    for l in &expected_lines {
        *want.entry(l.clone()).or_default() += 1;
    }
    let malformed_rest = format!(
        "event: DISC info: MALFORMED topic: 0[] key: 0[] msg: {}",
        b64_field(&bad[..PREFIX])
    );
    let mut problems = Vec::new();
    let mut malformed_seen = 0;
    for line in &lines {
        let (now, rest) = match split_now(line) {
            Ok(x) => x,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        if !(started_ms..=ended_ms).contains(&now) {
            problems.push(format!("now {now} outside the test's run: {line}"));
        }
        if let Some(r) = rest.strip_suffix(malformed_rest.as_str()) {
            malformed_seen += 1;
            if r != format!("ts: {now} ") {
                problems.push(format!("MALFORMED line must carry ts = now: {line}"));
            }
            continue;
        }
        match want.get_mut(rest) {
            Some(n) if *n > 0 => *n -= 1,
            _ => problems.push(format!("unexpected line: {line}")),
        }
    }
    for (l, n) in &want {
        if *n > 0 {
            problems.push(format!("missing {n}×: now: <ms> {l}"));
        }
    }
    if malformed_seen != 1 {
        problems.push(format!(
            "{malformed_seen} MALFORMED lines, want 1 ({malformed_rest})"
        ));
    }
    assert!(
        problems.is_empty(),
        "discard log {} ({} lines):\n{}",
        log_path.display(),
        lines.len(),
        problems
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let files: Vec<String> = fs::read_dir(log_path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, ["discard.log"], "1m limit: no rotation expected");
}
