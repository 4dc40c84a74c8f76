//! Parity suite: Dory's per-topic policies, checked end to end on the real dory binary
//! against real Kafka-protocol brokers (the librdkafka mock cluster and Tansu).
//!
//! * Compression: for every codec (none, gzip, snappy, lz4, zstd, and lz4 with a `min_size`)
//!   what dory sends is consumed back intact by librdkafka (CRC checks on) and by a second,
//!   independent consumer (raw Fetch requests decoded with the `kafka-protocol` crate, which
//!   also checks CRCs). On the mock, whose log keeps record batches as produced, each stored
//!   batch's codec bits are checked against the policy, including a ~640 KiB batch of random
//!   bytes that does not compress below `size_threshold_percent` and must go out
//!   uncompressed; `MsgSetCompressionYes|No` and `MsgSetNotCompressible` must equal the
//!   counts of stored batches of each kind. A broker limited to Produce v6 gets a zstd
//!   topic's batches uncompressed, counted as `MsgSetZstdUnsupportedByBroker`.
//! * Batching: message, byte and time limits, `disable` and combined-topics batching, seen
//!   in `SendProduceRequestOk` (one per Produce request) with `produce_request_data_limit`
//!   set so every batch needs a request of its own, and in what is held back.
//! * Limits: `message_max_bytes` (key + value + 26) and fixed-window rate limits give exact
//!   `too_long` / `rate_limit` counts; exactly the first `max_count` messages pass.
//! * Discard log: every line's exact text; size-based rotation into `<path>.<epoch ms>` and
//!   oldest-first pruning of archives, with exact file and line counts.
//! * Auto-creation on and off with a config file, on both brokers.
//! * murmur2: keyed AnyPartition messages land where the Java client puts them (known
//!   vectors) and where librdkafka's `murmur2_random` partitioner puts the same keys.
//! * Message debug logging: only the selected topic, one exact line per message per file.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Bound for every "until counted / delivered / drained" wait.
const WAIT: Duration = Duration::from_secs(30);
const CONSUME_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// Starts dory with `toml` as its config file (brokers, sockets and status address come as
/// flags; no `--batch-time-ms`, so the file's batching applies) and waits until ready.
fn start_dory(brokers: &[String], toml: &str) -> Dory {
    let mut args = DoryArgs::new(brokers);
    args.batch_time_ms = None;
    args.config_toml = Some(toml.to_string());
    let mut dory = Dory::start(args);
    dory.wait_ready();
    dory
}

/// A path as a TOML basic string.
fn toml_path(p: &Path) -> String {
    let s = p.to_str().expect("temp paths are UTF-8");
    assert!(!s.contains(['"', '\\']), "path needs escaping: {s}");
    format!("\"{s}\"")
}

/// A value `<id:08>` followed by English-like text: compresses well with every codec.
fn text_value(id: u32, len: usize) -> Vec<u8> {
    const PROSE: &[u8] = b" the quick brown fox jumps over the lazy dog;";
    let mut v = format!("<{id:08}>").into_bytes();
    let mut i = 0;
    while v.len() < len {
        v.push(PROSE[i % PROSE.len()]);
        i += 1;
    }
    v.truncate(len.max(ID_PREFIX_LEN));
    v
}

/// A value `<id:08>` followed by random bytes: does not compress.
fn random_value(id: u32, len: usize, rng: &mut XorShift) -> Vec<u8> {
    let mut v = format!("<{id:08}>").into_bytes();
    v.extend(rng.bytes(len.saturating_sub(ID_PREFIX_LEN)));
    v
}

fn test_msg(id: u32, topic: &str, route: Route, key: &[u8], value: Vec<u8>) -> TestMsg {
    TestMsg {
        id,
        input: Input::Stream,
        route,
        topic: topic.to_string(),
        ts: now_ms() - 5_000 - i64::from(id % 1000),
        key: key.to_vec(),
        value,
    }
}

/// Waits until every `(topic, n)` was received (exactly) and nothing is in flight.
fn settle(dory: &mut Dory, want: &[(&str, u64)]) -> Metrics {
    dory.wait_received(want, WAIT);
    dory.wait_drained(WAIT)
}

/// One counter of `/counters/json` (a missing name fails: it would be a typo here).
fn counter(dory: &Dory, name: &str) -> u64 {
    let all = dory.counters().unwrap_or_else(|e| panic!("{e}"));
    *all.get(name)
        .unwrap_or_else(|| panic!("/counters/json has no counter {name}"))
}

/// Asserts the exact non-zero discard counts of `topic`.
fn assert_discards(m: &Metrics, topic: &str, want: &[(&str, u64)]) {
    let want: BTreeMap<String, u64> = want
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| ((*r).to_string(), *n))
        .collect();
    assert_eq!(
        m.discards_of(topic),
        want,
        "discards of {topic:?}\n/metrics:\n{}",
        m.text
    );
}

/// Standard base64 with padding, written here so the daemon's encoding is checked against
/// an independent one.
fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = u32::from(c[0]) << 16
            | u32::from(c.get(1).copied().unwrap_or(0)) << 8
            | u32::from(c.get(2).copied().unwrap_or(0));
        s.push(A[(n >> 18 & 63) as usize] as char);
        s.push(A[(n >> 12 & 63) as usize] as char);
        s.push(if c.len() > 1 {
            A[(n >> 6 & 63) as usize] as char
        } else {
            '='
        });
        s.push(if c.len() > 2 {
            A[(n & 63) as usize] as char
        } else {
            '='
        });
    }
    s
}

/// `<base64 length>[<base64>]`, as in the discard and debug logs.
fn b64_field(data: &[u8]) -> String {
    let e = b64(data);
    format!("{}[{e}]", e.len())
}

#[test]
fn base64_helper_matches_rfc4648_vectors() {
    // RFC 4648 §10.
    for (raw, enc) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(b64(raw.as_bytes()), enc, "{raw:?}");
    }
}

/// librdkafka's `builtin.features` (codecs and more this build of it supports).
fn librdkafka_features() -> BTreeSet<String> {
    let native = ClientConfig::new()
        .create_native_config()
        .expect("librdkafka config");
    native
        .get("builtin.features")
        .expect("builtin.features")
        .split(',')
        .map(|s| s.trim().to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The discard log's lines (size and rate limits, rotation, message debug)
// ---------------------------------------------------------------------------------------------

/// Discard log lines: `now: <ms> <rest>`; returns (now, rest).
fn split_now(line: &str) -> Result<(i64, &str), String> {
    let rest = line
        .strip_prefix("now: ")
        .ok_or_else(|| format!("line does not start with `now: `: {line:?}"))?;
    let (now, rest) = rest
        .split_once(' ')
        .ok_or_else(|| format!("no field after now: {line:?}"))?;
    let now: i64 = now
        .parse()
        .map_err(|_| format!("bad now {now:?} in {line:?}"))?;
    Ok((now, rest))
}

/// The expected discard-log line for `m` after `now: <ms> `, key and value cut to
/// `prefix` bytes.
fn disc_rest(m: &TestMsg, info: &str, prefix: usize) -> String {
    let cut = |b: &[u8]| b[..b.len().min(prefix)].to_vec();
    format!(
        "ts: {} event: DISC info: {info} topic: {}[{}] key: {} msg: {}",
        m.ts,
        m.topic.len(),
        m.topic,
        b64_field(&cut(&m.key)),
        b64_field(&cut(&m.value))
    )
}

/// The lines of the file at `path` (none if it does not exist), each checked to end in a
/// newline.
fn read_lines(path: &Path) -> Vec<String> {
    match fs::read(path) {
        Ok(b) => {
            let text = String::from_utf8(b).expect("log is UTF-8 here");
            assert!(
                text.is_empty() || text.ends_with('\n'),
                "{} does not end with a newline",
                path.display()
            );
            text.lines().map(str::to_string).collect()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

// The cases, by feature, in `tests/parity/` (a crate root's modules are looked for
// beside it, so each names its path).
#[path = "parity/auto_create.rs"]
mod auto_create;
#[path = "parity/batching.rs"]
mod batching;
#[path = "parity/compression.rs"]
mod compression;
#[path = "parity/discard_log.rs"]
mod discard_log;
#[path = "parity/limits.rs"]
mod limits;
#[path = "parity/msg_debug.rs"]
mod msg_debug;
#[path = "parity/murmur2.rs"]
mod murmur2;
