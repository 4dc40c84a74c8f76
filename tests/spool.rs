//! The durable spool end to end, with the real binary on the librdkafka mock cluster:
//!
//! * SIGKILL under load, several times in one test, with brokers slow so much is
//!   unacknowledged, each restart on the same spool directory: every message counted as
//!   received before the kill (so appended to the spool) is consumed back; duplicates only
//!   among messages counted as possible duplicates; with `fsync_interval_ms = 0` every
//!   received message was also synced. (A SIGKILL cannot lose what reached the page cache;
//!   what the fsync window bounds is a machine crash, which a test cannot cause. The test
//!   reports the synced count beside the received one, so the window is visible.)
//! * Corruption: a flipped byte in the middle of a segment, a truncated segment, a segment
//!   of a future format version: counted, logged, the rest replayed, the daemon running.
//! * A full disk (the daemon's file size limit) and a full spool (`max_bytes`): counted
//!   `spool_full` discards, and the spool takes messages again once segments are reused.

mod common;

use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
const VALUE_LEN: usize = 100;

fn value(id: u32) -> Vec<u8> {
    let mut v = format!("<{id:08}>").into_bytes();
    v.resize(VALUE_LEN, b'.');
    v
}

fn encode(topic: &str, id: u32) -> Vec<u8> {
    encode_any_partition(topic, now_ms(), b"", value(id))
}

fn config(spool_dir: &Path, extra_spool: &str) -> String {
    format!(
        "[input]\nmax_stream_msg_size = 4096\nmax_datagram_msg_size = 4096\n\
         [kafka]\nsocket_timeout_ms = 2000\n\
         [delivery]\ntopic_autocreate = false\nmax_failed_delivery_attempts = 100000\n\
         retry_backoff_ms = 50\nretry_backoff_max_ms = 300\nshutdown_max_delay_ms = 2000\n\
         [spool]\ndir = {:?}\ndefault = \"spool\"\n{extra_spool}",
        spool_dir.display().to_string()
    )
}

/// A mock cluster of two brokers where broker 2 leads every partition of `topic`: dory
/// bootstraps from broker 1 only, so slowing broker 2 ([`set_rtt`]) holds messages
/// unacknowledged while metadata keeps answering.
fn mock_with_slow_leader(topic: &str, partitions: i32) -> Mock {
    let mock = Mock::start(2);
    mock.create_topic(topic, partitions);
    for p in 0..partitions {
        mock.cluster()
            .partition_leader(topic, p, Some(2))
            .expect("set leader");
    }
    poll_until("leaders moved to broker 2", WAIT, || {
        let l = mock.leaders(topic);
        if l.iter().all(|&(_, b)| b == 2) {
            Ok(())
        } else {
            Err(format!("{l:?}"))
        }
    });
    mock
}

fn start(mock: &Mock, toml: &str, fsize: Option<u64>) -> Dory {
    let mut args = DoryArgs::new([mock.broker_addrs()[0].clone()]);
    args.config_toml = Some(toml.to_string());
    args.file_size_limit = fsize;
    let mut dory = Dory::start(args);
    dory.wait_ready();
    dory
}

fn metric(m: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    m.sample(name, labels).map_or(0, |v| v as u64)
}

fn spool_json(dory: &Dory) -> Value {
    let (code, body) = dory.http_get("/spool/json");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Slows the leader (broker 2).
fn set_rtt(mock: &Mock, rtt: Duration) {
    mock.cluster()
        .broker_round_trip_time(2, rtt)
        .expect("set round trip time");
}

fn sigkill(dory: &mut Dory) {
    let pid = libc::pid_t::try_from(dory.pid()).expect("pid fits pid_t");
    // SAFETY: kill(2) on the PID of our own child process.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill -KILL {pid}");
    assert!(
        dory.wait_exit(Duration::from_secs(10)).is_some(),
        "dory died"
    );
}

/// Sends messages `from..` over one UNIX stream connection, in order, at about `rate` per
/// second, until told to stop or the daemon goes away. Returns how many it wrote.
fn sender(
    path: std::path::PathBuf,
    topic: &'static str,
    from: u32,
    rate: u32,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU32>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let Ok(mut s) = UnixStream::connect(&path) else {
            return;
        };
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let t0 = Instant::now();
        let mut id = from;
        while !stop.load(Ordering::Relaxed) {
            // Bursts of 50, paced to the rate.
            let mut burst = Vec::new();
            for i in 0..50 {
                burst.extend(encode(topic, id + i));
            }
            if s.write_all(&burst).is_err() {
                return;
            }
            id += 50;
            written.store(id - from, Ordering::Relaxed);
            let due = t0 + Duration::from_secs_f64(f64::from(id - from) / f64::from(rate));
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                thread::sleep(d);
            }
        }
    })
}

/// One run's numbers for the table.
#[derive(Debug, Default)]
struct Run {
    sent: u32,
    received: u64,
    synced: u64,
    recovered_at_start: u64,
    duplicates_counted: u64,
    first_id: u32,
}

fn kill_restart(fsync_ms: u64, topic: &'static str) {
    let mock = mock_with_slow_leader(topic, 4);
    let spool_dir = tempfile::tempdir().expect("temp dir");
    let toml = config(
        spool_dir.path(),
        &format!(
            "fsync_interval_ms = {fsync_ms}\nsegment_bytes = 1048576\nmax_bytes = 268435456\n"
        ),
    );
    let rtts = [
        Duration::from_millis(300),
        Duration::from_secs(5),
        Duration::from_millis(1500),
        Duration::from_millis(100),
    ];
    let mut runs: Vec<Run> = Vec::new();
    let mut next_id = 0u32;
    for (round, rtt) in rtts.iter().enumerate() {
        set_rtt(&mock, *rtt);
        let mut dory = start(&mock, &toml, None);
        let m = dory.metrics();
        let recovered = metric(&m, "dory_spool_recovered_total", &[("topic", topic)]);
        if let Some(prev) = runs.last_mut() {
            prev.recovered_at_start = recovered;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU32::new(0));
        let h = sender(
            dory.stream_path().to_path_buf(),
            topic,
            next_id,
            4000,
            stop.clone(),
            written.clone(),
        );
        thread::sleep(Duration::from_millis(1500 + 300 * round as u64));
        // What the daemon says just before the kill: received counts only appended
        // messages, so every one of them must come back.
        let m = dory.metrics();
        sigkill(&mut dory);
        stop.store(true, Ordering::Relaxed);
        let _ = h.join();
        let received = m.received(topic) - recovered;
        let run = Run {
            sent: written.load(Ordering::Relaxed),
            received,
            synced: metric(&m, "dory_spool_synced_total", &[]),
            recovered_at_start: 0,
            duplicates_counted: m.possible_duplicates(topic),
            first_id: next_id,
        };
        assert!(
            run.received > 0,
            "round {round}: nothing received\n{}",
            m.text
        );
        if fsync_ms == 0 {
            assert!(
                run.synced >= run.received,
                "fsync_interval_ms = 0: every received message is synced: {run:?}"
            );
        }
        next_id += run.sent + 1000;
        runs.push(run);
    }

    // Healthy brokers: the last restart replays what is left and delivers it.
    set_rtt(&mock, Duration::ZERO);
    let mut dory = start(&mock, &toml, None);
    let m = dory.wait_drained(WAIT);
    let recovered = metric(&m, "dory_spool_recovered_total", &[("topic", topic)]);
    if let Some(prev) = runs.last_mut() {
        prev.recovered_at_start = recovered;
    }
    assert_eq!(m.received(topic), recovered, "no new input in the last run");
    assert_eq!(m.discarded_total(topic), 0, "{}", m.text);
    let final_dups = m.possible_duplicates(topic);
    // Every recovered segment is reused once everything is delivered: only the active one
    // (opened at start, empty: nothing new came in) is live.
    poll_until("resolved segments reused", WAIT, || {
        let s = spool_json(&dory);
        if s["live_segments"] == 1 {
            Ok(())
        } else {
            Err(s.to_string())
        }
    });
    let status = dory.terminate(WAIT);
    assert!(status.success(), "{status}");

    let expected: u64 = runs.iter().map(|r| r.received).sum();
    let got = consume_all(&mock.bootstrap(), topic, expected as usize, WAIT);
    let mut seen = std::collections::BTreeMap::<u32, u32>::new();
    for c in &got {
        let id = c
            .value
            .as_deref()
            .and_then(value_id)
            .unwrap_or_else(|| panic!("a record not sent by the test: {c:?}"));
        *seen.entry(id).or_default() += 1;
    }
    let duplicates: u64 = seen.values().map(|&n| u64::from(n - 1)).sum();
    // Each run's possible duplicates include the messages it recovered at start.
    let counted: u64 = runs.iter().map(|r| r.duplicates_counted).sum::<u64>() + final_dups;
    let mut lost_total = 0;
    println!(
        "spool kill/restart, fsync_interval_ms = {fsync_ms}:\n\
         run |   sent | received | synced | delivered | recovered next start | duplicates | lost"
    );
    for (i, r) in runs.iter().enumerate() {
        let ids = r.first_id..r.first_id + r.received as u32;
        let delivered = ids.clone().filter(|id| seen.contains_key(id)).count() as u64;
        let dups: u64 = ids
            .filter_map(|id| seen.get(&id))
            .map(|&n| u64::from(n - 1))
            .sum();
        let lost = r.received - delivered;
        lost_total += lost;
        println!(
            "{i:3} | {:6} | {:8} | {:6} | {:9} | {:20} | {dups:10} | {lost}",
            r.sent, r.received, r.synced, delivered, r.recovered_at_start
        );
    }
    println!(
        "total: consumed {} records, {} unique, duplicates {duplicates} (counted as possible \
         duplicates: {counted}), lost {lost_total}",
        got.len(),
        seen.len()
    );
    assert_eq!(lost_total, 0, "messages received before a kill were lost");
    assert!(
        duplicates <= counted,
        "{duplicates} duplicates but only {counted} counted as possible duplicates"
    );
    let sent: u64 = runs.iter().map(|r| u64::from(r.sent)).sum();
    assert!(got.len() as u64 <= sent + duplicates);
}

#[test]
fn sigkill_under_load_loses_nothing_received_fsync_every_batch() {
    kill_restart(0, "spool_kill_sync0");
}

#[test]
fn sigkill_under_load_loses_nothing_received_fsync_interval() {
    kill_restart(5, "spool_kill_sync5");
}

/// Waits until the daemon has synced `n` messages.
fn wait_synced(dory: &mut Dory, n: u64) {
    dory.wait_metrics("messages synced to the spool", WAIT, |m| {
        let s = metric(m, "dory_spool_synced_total", &[]);
        if s >= n {
            Ok(())
        } else {
            Err(format!("synced {s} of {n}"))
        }
    });
}

fn send_ids(dory: &Dory, topic: &str, ids: std::ops::Range<u32>) {
    let bytes: Vec<u8> = ids.flat_map(|id| encode(topic, id)).collect();
    let mut s = StreamSender::connect(dory.stream_path());
    s.send(&bytes);
    s.finish();
}

/// The segment files of a spool directory holding records, by name.
fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("read spool dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "spool"))
        .collect();
    v.sort();
    v
}

#[test]
fn corrupt_truncated_and_future_segments_are_counted_and_the_rest_replayed() {
    const TOPIC: &str = "spool_corrupt";
    let mock = mock_with_slow_leader(TOPIC, 2);
    let spool_dir = tempfile::tempdir().expect("temp dir");
    let toml = config(
        spool_dir.path(),
        "fsync_interval_ms = 0\nsegment_bytes = 1048576\n",
    );
    // Nothing is acknowledged: every message stays in the spool.
    set_rtt(&mock, Duration::from_secs(60));
    let mut dory = start(&mock, &toml, None);
    send_ids(&dory, TOPIC, 0..200);
    dory.wait_received(&[(TOPIC, 200)], WAIT);
    wait_synced(&mut dory, 200);
    sigkill(&mut dory);

    // One segment holds the 200 records, back to back after the 64-byte header.
    let files = segment_files(spool_dir.path());
    let seg = files
        .iter()
        .find(|p| {
            let b = std::fs::read(p).expect("read segment");
            dory::spool::format::SegmentHeader::decode(&b).is_ok_and(|h| h.id != 0)
        })
        .expect("a segment with records")
        .clone();
    let rec_len = 12 + dory::spool::format::BODY_FIXED_LEN + TOPIC.len() + VALUE_LEN;
    let header = dory::spool::format::HEADER_LEN;
    let mut bytes = std::fs::read(&seg).expect("read segment");
    // A flipped byte in record 10's value; the file cut 70 bytes into record 150.
    bytes[header + rec_len * 10 + 50] ^= 0x20;
    bytes.truncate(header + rec_len * 150 + 70);
    std::fs::write(&seg, &bytes).expect("rewrite segment");
    // A segment from a future format version.
    let future = dory::spool::format::SegmentHeader {
        version: dory::spool::format::VERSION + 1,
        id: 999,
        size: 1 << 20,
    };
    let future_path = spool_dir.path().join("segment-99999999.spool");
    std::fs::write(&future_path, future.encode()).expect("write future segment");

    set_rtt(&mock, Duration::ZERO);
    let mut dory = start(&mock, &toml, None);
    let m = dory.wait_drained(WAIT);
    let s = spool_json(&dory);
    println!("spool after corruption: {s}");
    assert_eq!(
        metric(&m, "dory_spool_recovered_total", &[("topic", TOPIC)]),
        149,
        "150 records before the cut, one of them corrupt\n{}",
        m.text
    );
    assert_eq!(
        metric(&m, "dory_spool_corrupt_bytes_total", &[]),
        (rec_len + 70) as u64,
        "record 10 and the torn tail"
    );
    assert_eq!(metric(&m, "dory_spool_unreadable_segments_total", &[]), 1);
    assert!(!future_path.exists(), "the future segment is moved aside");
    assert!(spool_dir
        .path()
        .join("segment-99999999.spool.unreadable")
        .exists());
    let logs = dory.logs();
    assert!(logs.contains("skipped 148 byte(s)"), "{logs}");
    assert!(logs.contains("newer than this dory's"), "{logs}");
    assert_eq!(m.delivered(TOPIC), 149);

    // Still running and spooling.
    send_ids(&dory, TOPIC, 1000..1010);
    dory.wait_received(&[(TOPIC, 159)], WAIT);
    let m = dory.wait_drained(WAIT);
    assert_eq!(m.delivered(TOPIC), 159);
    let got = consume_all(&mock.bootstrap(), TOPIC, 159, WAIT);
    let ids: std::collections::BTreeSet<u32> = got
        .iter()
        .filter_map(|c| c.value.as_deref().and_then(value_id))
        .collect();
    let want: std::collections::BTreeSet<u32> =
        (0..150).filter(|&i| i != 10).chain(1000..1010).collect();
    assert_eq!(ids, want);
    // Nothing was ever acknowledged before the kill: no duplicates.
    assert_eq!(got.len(), 159);
}

fn full_case(name: &str, extra_spool: &str, fsize: Option<u64>, topic: &'static str) {
    let mock = mock_with_slow_leader(topic, 2);
    let spool_dir = tempfile::tempdir().expect("temp dir");
    let toml = config(
        spool_dir.path(),
        &format!("fsync_interval_ms = 5\nsegment_bytes = 131072\n{extra_spool}"),
    );
    set_rtt(&mock, Duration::from_secs(60));
    let mut dory = start(&mock, &toml, fsize);
    // ~296 KB of records: more than two 128 KiB segments hold.
    send_ids(&dory, topic, 0..2000);
    let m = dory.wait_received(&[(topic, 2000)], WAIT);
    let full = m.discarded(topic, "spool_full");
    let errors = metric(&m, "dory_spool_write_errors_total", &[]);
    println!(
        "{name}: 2000 sent, {full} discarded as spool_full, write errors {errors}, segment \
         files {}",
        metric(&m, "dory_spool_segments", &[])
    );
    assert!(full > 0, "{}", m.text);
    if fsize.is_some() {
        assert_eq!(full, 2000, "no segment can be created: {}", m.text);
        assert!(errors > 0, "{}", m.text);
        assert!(dory.logs().contains("spool_full"), "logged");
        raise_file_size_limit(dory.pid());
    } else {
        assert!(full < 2000, "{}", m.text);
        assert_eq!(errors, 0, "a full budget is not a write error");
    }
    assert!(dory.try_exit().is_none(), "still running");
    dory.assert_invariant();
    // Brokers answer (and the disk has room): the spooled ones are delivered, the segments
    // reused, and new messages are spooled again.
    set_rtt(&mock, Duration::ZERO);
    let m = dory.wait_drained(WAIT);
    assert_eq!(m.delivered(topic) + full, 2000);
    send_ids(&dory, topic, 5000..5500);
    dory.wait_received(&[(topic, 2500)], WAIT);
    let m = dory.wait_drained(WAIT);
    assert_eq!(
        m.discarded(topic, "spool_full"),
        full,
        "room again: {}",
        m.text
    );
    assert_eq!(m.delivered(topic) + full, 2500);
    let status = dory.terminate(WAIT);
    assert!(status.success());
}

#[test]
fn spool_max_bytes_reached_discards_as_spool_full_and_recovers() {
    full_case("max_bytes", "max_bytes = 262144\n", None, "spool_max_bytes");
}

#[test]
fn full_disk_discards_as_spool_full_counts_write_errors_and_recovers() {
    // No file over 100 000 bytes: no 128 KiB segment can be preallocated (EFBIG, as ENOSPC
    // would be) until the test lifts the limit.
    full_case("full disk", "", Some(100_000), "spool_full_disk");
}
