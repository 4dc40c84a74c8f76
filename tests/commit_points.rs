//! Commit points end to end, on the librdkafka mock cluster: one topic's leader stops
//! answering, and that topic's commit point stops below its undelivered messages while the
//! other topic's advances; once the leader answers again, the commit point reaches the
//! newest timestamp. The state file follows, and holds the final values after SIGTERM.
//!
//! "No reachable leader" is a leader that metadata still lists but that does not answer:
//! broker 2, which leads every partition of `cp_stuck`, gets a 60 s round-trip time while
//! dory's socket timeout is 1 s, so every request to it times out and its messages are
//! held and resent (never discarded). (Taking the broker down instead makes the mock drop
//! it from Metadata; dory then discards the topic's messages as `no_available_partitions`,
//! which resolves them and moves the commit point on, as it should.)

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const STUCK: &str = "cp_stuck";
const FLOWING: &str = "cp_flowing";
const WAIT: Duration = Duration::from_secs(30);
/// How long the stuck topic's commit point is watched to stay put: past a socket timeout
/// and a resend.
const WATCH: Duration = Duration::from_millis(2500);

fn msgs(topic: &str, ids: std::ops::Range<u32>, ts0: i64) -> Vec<TestMsg> {
    ids.map(|id| TestMsg {
        id,
        input: Input::Stream,
        route: Route::AnyPartition,
        topic: topic.to_string(),
        ts: ts0 + i64::from(id),
        key: Vec::new(),
        value: format!("<{id:08}> {topic}").into_bytes(),
    })
    .collect()
}

/// `/commit_points/json`, parsed.
fn points(dory: &Dory) -> Value {
    let (code, body) = dory.http_get("/commit_points/json");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// One topic's entry of `/commit_points/json` (Null if absent).
fn topic<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["topics"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["topic"] == name))
        .unwrap_or(&Value::Null)
}

fn commit_point(p: &Value, name: &str) -> Option<i64> {
    topic(p, name)["commit_point"].as_i64()
}

/// Polls until `topic`'s commit point is at least `ts` with nothing unresolved.
fn wait_commit_point(dory: &Dory, name: &str, ts: i64) -> Value {
    poll_until(
        &format!("commit point of {name} to reach {ts}"),
        WAIT,
        || {
            let p = points(dory);
            let t = topic(&p, name);
            match commit_point(&p, name) {
                Some(cp) if cp >= ts && t["unresolved"] == 0 => Ok(p),
                _ => Err(format!("{t}")),
            }
        },
    )
}

fn state_file(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))
}

/// The Prometheus gauge of `topic`'s commit point, in ms.
fn gauge_ms(m: &Metrics, name: &str) -> Option<i64> {
    m.samples
        .iter()
        .find(|s| {
            s.name == "dory_commit_point_timestamp_seconds"
                && s.labels.get("topic").map(String::as_str) == Some(name)
        })
        .map(|s| (s.value * 1000.0).round() as i64)
}

#[test]
fn unreachable_leader_stops_its_topics_commit_point_while_others_advance() {
    let mock = Mock::start(2);
    for (t, leader) in [(STUCK, 2), (FLOWING, 1)] {
        mock.create_topic(t, 2);
        for p in 0..2 {
            mock.cluster()
                .partition_leader(t, p, Some(leader))
                .expect("set leader");
        }
        poll_until("leaders moved", WAIT, || {
            let l = mock.leaders(t);
            if l.iter().all(|&(_, b)| b == leader) {
                Ok(())
            } else {
                Err(format!("{t}: {l:?}"))
            }
        });
    }
    let state_dir = tempfile::tempdir().expect("temp dir");
    let state = state_dir.path().join("commit_points.json");
    // Bootstrap from broker 1 only, so metadata never waits on broker 2.
    let mut args = DoryArgs::new([mock.broker_addrs()[0].clone()]);
    args.config_toml = Some(format!(
        "[kafka]\nsocket_timeout_ms = 1000\n\
         [delivery]\ntopic_autocreate = false\nretry_backoff_ms = 50\nretry_backoff_max_ms = 300\n\
         [commit_points]\npath = {:?}\nwrite_interval_ms = 100\n",
        state.display().to_string()
    ));
    let mut dory = Dory::start(args);
    dory.wait_ready();

    // Healthy: both topics' commit points reach their newest timestamps.
    let ts0 = now_ms() - 60_000;
    dory.send_stream(&msgs(STUCK, 0..50, ts0));
    dory.send_stream(&msgs(FLOWING, 0..50, ts0));
    wait_commit_point(&dory, STUCK, ts0 + 49);
    wait_commit_point(&dory, FLOWING, ts0 + 49);

    // Broker 2 stops answering: cp_stuck's new messages cannot be acknowledged.
    mock.cluster()
        .broker_round_trip_time(2, Duration::from_secs(60))
        .expect("rtt");
    let ts1 = now_ms() - 30_000;
    let stuck = msgs(STUCK, 100..150, ts1);
    let flowing = msgs(FLOWING, 100..150, ts1 + 1_000);
    dory.send_stream(&stuck);
    dory.send_stream(&flowing);
    dory.wait_received(&[(STUCK, 100), (FLOWING, 100)], WAIT);
    let newest_flowing = ts1 + 1_000 + 149;
    let p = wait_commit_point(&dory, FLOWING, newest_flowing);
    let oldest_stuck = ts1 + 100;
    let until = Instant::now() + WATCH;
    let mut p = p;
    loop {
        let cp = commit_point(&p, STUCK).expect("cp_stuck has a commit point");
        assert!(
            cp < oldest_stuck,
            "cp_stuck's commit point {cp} passed its undelivered {oldest_stuck}: {p}"
        );
        assert_eq!(topic(&p, STUCK)["unresolved"], 50, "{p}");
        let overall = p["overall"]["commit_point"].as_i64().expect("overall");
        assert!(overall < oldest_stuck, "overall {overall}: {p}");
        assert!(
            commit_point(&p, FLOWING) >= Some(newest_flowing),
            "cp_flowing stays advanced: {p}"
        );
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(POLL_INTERVAL);
        p = points(&dory);
    }
    assert!(
        topic(&p, STUCK)["oldest_unacked_ms"].as_u64() >= Some(WATCH.as_millis() as u64),
        "the held messages age: {p}"
    );
    let m = dory.assert_invariant();
    assert_eq!(m.in_flight(STUCK), 50);
    assert!(gauge_ms(&m, STUCK) < Some(oldest_stuck), "{}", m.text);
    assert!(gauge_ms(&m, FLOWING) >= Some(newest_flowing), "{}", m.text);
    assert!(
        m.samples
            .iter()
            .any(|s| s.name == "dory_oldest_unacknowledged_age_seconds"
                && s.labels.get("topic").map(String::as_str) == Some(STUCK)
                && s.value >= 1.0),
        "{}",
        m.text
    );
    // The state file shows the stuck point too.
    poll_until("state file with the stuck commit point", WAIT, || {
        let v = state_file(&state)?;
        match v["overall"].as_i64() {
            Some(o) if o < oldest_stuck && o >= ts0 + 49 => Ok(()),
            _ => Err(format!("{v}")),
        }
    });

    // Broker 2 answers again: every held message is delivered and the commit point
    // reaches the newest timestamp of cp_stuck.
    mock.cluster()
        .broker_round_trip_time(2, Duration::ZERO)
        .expect("rtt");
    let p = wait_commit_point(&dory, STUCK, ts1 + 149);
    assert_eq!(commit_point(&p, STUCK), Some(ts1 + 149), "{p}");
    assert_eq!(p["overall"]["commit_point"], newest_flowing, "{p}");
    let m = dory.wait_drained(WAIT);
    assert_eq!(m.discarded_total(STUCK), 0, "held, never discarded");
    assert_eq!(m.delivered(STUCK), 100);
    let hist = |name: &str| {
        m.samples
            .iter()
            .find(|s| {
                s.name == "dory_delivery_latency_seconds_count"
                    && s.labels.get("topic").map(String::as_str) == Some(name)
            })
            .map(|s| s.value)
    };
    assert_eq!(hist(FLOWING), Some(100.0), "{}", m.text);
    let slow = m.samples.iter().find(|s| {
        s.name == "dory_delivery_latency_seconds_bucket"
            && s.labels.get("topic").map(String::as_str) == Some(STUCK)
            && s.labels.get("le").map(String::as_str) == Some("1")
    });
    let fast_enough = slow.map_or(0.0, |s| s.value);
    assert!(
        fast_enough <= 50.0,
        "the held messages took over a second: {fast_enough} of 100 within 1 s\n{}",
        m.text
    );

    // SIGTERM: the file holds the final commit points.
    let status = dory.terminate(WAIT);
    assert!(status.success(), "dory exits 0 on SIGTERM: {status}");
    let v = state_file(&state).expect("state file after exit");
    assert_eq!(v["overall"], newest_flowing, "{v}");
    let cp = |name: &str| {
        v["topics"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["topic"] == name))
            .map(|t| t["commit_point"].clone())
    };
    assert_eq!(cp(STUCK), Some(Value::from(ts1 + 149)), "{v}");
    assert_eq!(cp(FLOWING), Some(Value::from(newest_flowing)), "{v}");
}
