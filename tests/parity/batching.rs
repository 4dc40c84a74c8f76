//! Batching.

use super::*;

const BATCHING_TOML: &str = r#"
[batching]
# Default topics: every limit off, so each message is a batch of its own.
time_ms = 0
messages = 0
bytes = 0
# One batch of 100 × 100 B fills a request: batches never share one here.
produce_request_data_limit = 10000

[batching.configs.count100]
messages = 100
[batching.configs.bytes10k]
bytes = 10000
[batching.configs.count20]
messages = 20
[batching.configs.time500]
time_ms = 500
[batching.configs.three]
messages = 3

[batching.topics.b_count]
action = "per_topic"
config = "count100"
[batching.topics.b_bytes]
action = "per_topic"
config = "bytes10k"
[batching.topics.b_contrast]
action = "per_topic"
config = "count20"
[batching.topics.b_disable]
action = "disable"
[batching.topics.b_time]
action = "per_topic"
config = "time500"

[batching.combined_topics]
enable = true
config = "three"
[batching.topics.c_a]
action = "combined_topics"
[batching.topics.c_b]
action = "combined_topics"
[batching.topics.c_c]
action = "combined_topics"
"#;

fn requests(dory: &Dory) -> u64 {
    counter(dory, "SendProduceRequestOk")
}

/// `count` AnyPartition messages with no key and `len`-byte values, ids from `base`.
fn plain_msgs(topic: &str, base: u32, count: u32, len: usize) -> Vec<TestMsg> {
    (base..base + count)
        .map(|id| test_msg(id, topic, Route::AnyPartition, b"", text_value(id, len)))
        .collect()
}

/// Sends `plain_msgs(topic, 0, count, len)` in one write, waits until they settle, and
/// returns them with the number of Produce requests that took.
fn send_counting_requests(
    dory: &mut Dory,
    topic: &str,
    count: u32,
    len: usize,
) -> (Vec<TestMsg>, u64) {
    let r0 = requests(dory);
    let msgs = plain_msgs(topic, 0, count, len);
    dory.send_stream(&msgs);
    settle(dory, &[(topic, u64::from(count))]);
    (msgs, requests(dory) - r0)
}

#[test]
fn batching_limits_show_in_produce_request_counts() {
    let mock = Mock::start(1);
    for t in [
        "b_count",
        "b_bytes",
        "b_contrast",
        "b_disable",
        "b_time",
        "c_a",
        "c_b",
        "c_c",
    ] {
        mock.create_topic(t, 1);
    }
    let mut dory = start_dory(&mock.broker_addrs(), BATCHING_TOML);
    let mut report = Vec::new();

    // messages = 100: 950 messages give 9 batches and 50 held back (no time limit) until
    // 50 more complete the 10th; one request per batch.
    let r0 = requests(&dory);
    let first = plain_msgs("b_count", 0, 950, 100);
    dory.send_stream(&first);
    dory.wait_metrics("9 batches of b_count delivered", WAIT, |m| {
        if m.received("b_count") == 950 && m.delivered("b_count") == 900 {
            Ok(())
        } else {
            Err(format!(
                "received {} delivered {}",
                m.received("b_count"),
                m.delivered("b_count")
            ))
        }
    });
    thread::sleep(Duration::from_millis(400));
    let m = dory.metrics();
    assert_eq!(
        (m.delivered("b_count"), m.in_flight("b_count")),
        (900, 50),
        "b_count (messages = 100, no time limit): the last 50 must wait for 50 more\n{}",
        m.text
    );
    let rest = plain_msgs("b_count", 950, 50, 100);
    dory.send_stream(&rest);
    let m = settle(&mut dory, &[("b_count", 1000)]);
    assert_eq!(m.delivered("b_count"), 1000);
    let n = requests(&dory) - r0;
    report.push(format!("messages=100: 1000 msgs -> {n} requests"));
    assert_eq!(n, 10, "b_count: 1000 messages in batches of 100");
    let mut all_count = first;
    all_count.extend(rest);

    // bytes = 10000 with 200-byte values: batches of 50 → 20 requests.
    let (bytes_msgs, n) = send_counting_requests(&mut dory, "b_bytes", 1000, 200);
    report.push(format!(
        "bytes=10000, 200 B values: 1000 msgs -> {n} requests"
    ));
    assert_eq!(n, 20, "b_bytes: 1000 × 200 B in batches of 10000 B");

    // 20 messages of 10000 B: batched (messages = 20) they make one request, since a
    // single batch is sent whole; with batching disabled, 20 requests.
    let (contrast, n) = send_counting_requests(&mut dory, "b_contrast", 20, 10_000);
    report.push(format!(
        "messages=20, 10000 B values: 20 msgs -> {n} requests"
    ));
    assert_eq!(n, 1, "b_contrast: one batch of 20 is one request");

    let (disabled, n) = send_counting_requests(&mut dory, "b_disable", 20, 10_000);
    report.push(format!("disable, 10000 B values: 20 msgs -> {n} requests"));
    assert_eq!(n, 20, "b_disable: each message is sent on its own");

    // time_ms = 500: three bursts of 40 (one write each) make three batches, each sent
    // no sooner than 500 ms after its first message arrived.
    let r0 = requests(&dory);
    let mut timed = Vec::new();
    for burst in 0..3u32 {
        let msgs = plain_msgs("b_time", burst * 40, 40, 100);
        let started = Instant::now();
        dory.send_stream(&msgs);
        let want = u64::from(burst + 1) * 40;
        dory.wait_metrics("a b_time burst delivered", WAIT, |m| {
            if m.delivered("b_time") >= want {
                Ok(())
            } else {
                Err(format!("delivered {} of {want}", m.delivered("b_time")))
            }
        });
        let took = started.elapsed();
        report.push(format!(
            "time_ms=500: burst {burst} delivered after {took:?}"
        ));
        assert!(
            took >= Duration::from_millis(500),
            "b_time burst {burst} delivered {took:?} after it was sent: before the 500 ms \
             batch time"
        );
        assert!(
            took < Duration::from_secs(5),
            "b_time burst {burst} took {took:?}"
        );
        timed.extend(msgs);
    }
    let n = requests(&dory) - r0;
    report.push(format!("time_ms=500: 3 bursts -> {n} requests"));
    assert_eq!(n, 3, "b_time: one batch (and request) per burst");

    // Combined topics (messages = 3 per broker, across topics): one message each to c_a
    // and c_b stays held; the third, to c_c, completes the batch for all three.
    let r0 = requests(&dory);
    let ca = plain_msgs("c_a", 0, 1, 100);
    let cb = plain_msgs("c_b", 0, 1, 100);
    let cc = plain_msgs("c_c", 0, 1, 100);
    dory.send_stream(&ca);
    dory.send_stream(&cb);
    dory.wait_received(&[("c_a", 1), ("c_b", 1)], WAIT);
    thread::sleep(Duration::from_millis(400));
    let m = dory.metrics();
    assert_eq!(
        (m.delivered("c_a"), m.delivered("c_b")),
        (0, 0),
        "combined batch (messages = 3) sent with only 2 messages\n{}",
        m.text
    );
    dory.send_stream(&cc);
    let m = settle(&mut dory, &[("c_c", 1)]);
    for t in ["c_a", "c_b", "c_c"] {
        assert_eq!(m.delivered(t), 1, "{t}\n{}", m.text);
    }
    let n = requests(&dory) - r0;
    report.push(format!("combined (3 msgs over 3 topics) -> {n} request(s)"));
    assert!(
        (1..=3).contains(&n),
        "combined batch of 3 topics: {n} requests"
    );

    // Everything arrived intact and nothing was discarded.
    let m = dory.assert_invariant();
    for (topic, msgs) in [
        ("b_count", &all_count),
        ("b_bytes", &bytes_msgs),
        ("b_contrast", &contrast),
        ("b_disable", &disabled),
        ("b_time", &timed),
    ] {
        assert_discards(&m, topic, &[]);
        let got = consume_all(&mock.bootstrap(), topic, msgs.len(), CONSUME_TIMEOUT);
        if let Err(r) = verify_delivery(msgs, &got, 1) {
            panic!("{topic}: {r}");
        }
    }
    eprintln!("batching:\n  {}", report.join("\n  "));
}

/// Messages that reach the batcher after their time limit (here: held until the first
/// metadata, longer than the 1 ms limit) still travel together: one batch, one request.
/// Completing a batch per late message (Dory's rule) sent each of them alone, which is how
/// a daemon that fell behind fell further behind (doc/performance.md, round seventeen).
#[test]
fn late_messages_still_batch_together() {
    const COUNT: u32 = 300;
    let mock = Mock::start(1);
    mock.create_topic("late", 1);
    // Down before dory's first metadata fetch: every message waits for it.
    mock.cluster().broker_down(1).expect("broker_down(1)");
    let mut args = DoryArgs::new(mock.broker_addrs());
    args.batch_time_ms = None;
    args.config_toml = Some("[batching]\ntime_ms = 1\n".into());
    let mut dory = Dory::start(args);
    poll_until("dory's stream socket", WAIT, || {
        if dory.stream_path().exists() {
            Ok(())
        } else {
            Err("not bound yet".to_string())
        }
    });
    let msgs = plain_msgs("late", 0, COUNT, 100);
    dory.send_stream(&msgs);
    dory.wait_received(&[("late", u64::from(COUNT))], WAIT);
    assert_eq!(requests(&dory), 0, "no metadata yet, so nothing sent");
    mock.cluster().broker_up(1).expect("broker_up(1)");
    let m = settle(&mut dory, &[("late", u64::from(COUNT))]);
    assert_eq!(m.delivered("late"), u64::from(COUNT), "{}", m.text);
    let sent = requests(&dory);
    assert!(
        sent <= 2,
        "{COUNT} late messages took {sent} Produce requests: late messages went alone"
    );
    let got = consume_all(&mock.bootstrap(), "late", msgs.len(), CONSUME_TIMEOUT);
    verify_delivery(&msgs, &got, 1).unwrap_or_else(|r| panic!("{r}"));
}
