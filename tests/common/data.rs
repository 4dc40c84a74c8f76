//! Deterministic test data: a seeded generator, messages for each input and route, and
//! malformed datagrams.

use super::*;

/// xorshift64* — small, deterministic, no `rand` crate.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        // Mix the seed so that small seeds differ well, and never start at 0.
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        XorShift(if s == 0 { 1 } else { s })
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..hi` (hi > lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(hi > lo, "empty range {lo}..{hi}");
        lo + self.next_u64() % (hi - lo)
    }
    pub fn percent(&mut self, p: u64) -> bool {
        self.range(0, 100) < p
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }
}

/// Which input a test message is sent through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Input {
    Dgram,
    Stream,
    Tcp,
}

/// AnyPartition or PartitionKey (with its client partition key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    AnyPartition,
    PartitionKey(i32),
}

/// One generated client message.
#[derive(Clone, Debug)]
pub struct TestMsg {
    pub id: u32,
    pub input: Input,
    pub route: Route,
    pub topic: String,
    pub ts: i64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl TestMsg {
    pub fn encode(&self) -> Vec<u8> {
        match self.route {
            Route::AnyPartition => {
                encode_any_partition(&self.topic, self.ts, &self.key, &self.value)
            }
            Route::PartitionKey(pk) => {
                encode_partition_key(pk, &self.topic, self.ts, &self.key, &self.value)
            }
        }
    }
    /// The partition a PartitionKey message must land on when all `partitions` partitions
    /// (sorted by id) are usable: `(key as u32) % partitions` (§4.2).
    pub fn expected_partition(&self, partitions: i32) -> Option<i32> {
        match self.route {
            Route::AnyPartition => None,
            Route::PartitionKey(pk) => {
                let n = u32::try_from(partitions).expect("partition count > 0");
                Some(i32::try_from((pk as u32) % n).expect("partition fits i32"))
            }
        }
    }
}

/// The daemon's default datagram size limit (whole datagram).
pub const MAX_DGRAM: usize = 64 * 1024;
/// The largest generated value (60 KiB).
pub const MAX_VALUE: usize = 60 * 1024;
/// Values start with `<id:08>` (10 bytes) so a lost, duplicated or damaged record can be
/// named; shorter values hold a truncated prefix.
pub const ID_PREFIX_LEN: usize = 10;

/// The message id embedded in a generated value, if the value is long enough.
pub fn value_id(value: &[u8]) -> Option<u32> {
    let v = value.get(..ID_PREFIX_LEN)?;
    if v[0] != b'<' || v[ID_PREFIX_LEN - 1] != b'>' {
        return None;
    }
    std::str::from_utf8(&v[1..ID_PREFIX_LEN - 1])
        .ok()?
        .parse()
        .ok()
}

fn make_value(id: u32, len: usize) -> Vec<u8> {
    let mut v = format!("<{id:08}>").into_bytes();
    debug_assert_eq!(v.len(), ID_PREFIX_LEN);
    if len > v.len() {
        let mut filler = XorShift::new(0xF111_0000 ^ u64::from(id));
        let extra = filler.bytes(len - v.len());
        v.extend_from_slice(&extra);
    }
    v.truncate(len);
    v
}

/// Interesting client partition keys: sign bit, extremes, small values.
const SPECIAL_PARTITION_KEYS: [i32; 8] = [0, 1, 2, 5, -1, -2, i32::MIN, i32::MAX];

/// `n` stream-input messages for `topic`, ids 0.. and values `<ID> topic`, any partition.
pub fn stream_msgs(topic: &str, n: u32) -> Vec<TestMsg> {
    msgs_through(Input::Stream, topic, 0, n)
}

/// [`stream_msgs`] with ids `first..first + n`, through `input`.
pub fn msgs_through(input: Input, topic: &str, first: u32, n: u32) -> Vec<TestMsg> {
    (first..first + n)
        .map(|id| TestMsg {
            id,
            input,
            route: Route::AnyPartition,
            topic: topic.to_string(),
            ts: now_ms(),
            key: Vec::new(),
            value: format!("<{id:08}> {topic}").into_bytes(),
        })
        .collect()
}

/// `count` messages for `topic`, deterministic in `seed`. Inputs: about half datagram, a
/// quarter each UNIX stream and TCP; half AnyPartition, half PartitionKey (random and special
/// keys); a third of the keys empty; value sizes 0..=60 KiB biased to small. Values above
/// 32 KiB go through the stream inputs. Message 1 (if `count > 1`) is a datagram of exactly
/// [`MAX_DGRAM`] bytes. Timestamps lie in the minute before `ts_base`. PartitionKey messages
/// always carry a full id, so every one of them is unique.
pub fn generate(seed: u64, topic: &str, count: usize, ts_base: i64) -> Vec<TestMsg> {
    let mut rng = XorShift::new(seed);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let id = u32::try_from(i).expect("id fits u32");
        let mut len = match rng.range(0, 100) {
            0..=44 => rng.range(0, 64),
            45..=74 => rng.range(64, 1024),
            75..=91 => rng.range(1024, 8192),
            92..=97 => rng.range(8192, 32 * 1024),
            _ => rng.range(32 * 1024, MAX_VALUE as u64 + 1),
        } as usize;
        let input = if len > 32 * 1024 {
            if rng.percent(50) {
                Input::Stream
            } else {
                Input::Tcp
            }
        } else {
            match rng.range(0, 4) {
                0 | 1 => Input::Dgram,
                2 => Input::Stream,
                _ => Input::Tcp,
            }
        };
        let route = if rng.percent(50) {
            let pk = if rng.percent(15) {
                SPECIAL_PARTITION_KEYS[rng.range(0, SPECIAL_PARTITION_KEYS.len() as u64) as usize]
            } else {
                rng.next_u64() as u32 as i32
            };
            len = len.max(ID_PREFIX_LEN);
            Route::PartitionKey(pk)
        } else {
            Route::AnyPartition
        };
        let key = if rng.percent(33) {
            Vec::new()
        } else {
            let klen = if rng.percent(5) {
                rng.range(65, 1000)
            } else {
                rng.range(1, 65)
            };
            rng.bytes(klen as usize)
        };
        let ts = ts_base - rng.range(0, 60_000) as i64;
        let mut msg = TestMsg {
            id,
            input,
            route,
            topic: topic.to_string(),
            ts,
            key,
            value: make_value(id, len),
        };
        if i == 1 {
            // A datagram of exactly the size limit.
            msg.input = Input::Dgram;
            msg.route = Route::AnyPartition;
            msg.key = b"max-size-datagram".to_vec();
            let overhead = encode_any_partition(topic, ts, &msg.key, b"").len();
            msg.value = make_value(id, MAX_DGRAM - overhead);
        }
        if msg.input == Input::Dgram {
            assert!(
                msg.encode().len() <= MAX_DGRAM,
                "generated datagram too big"
            );
        }
        out.push(msg);
    }
    out
}

/// Datagrams that must be discarded at input, each with its expected discard reason
/// (§1.5); all count under topic "". Built around a valid message for `topic`.
pub fn malformed_datagrams(topic: &str) -> Vec<(Vec<u8>, &'static str)> {
    let ts = now_ms();
    let good = encode_any_partition(topic, ts, b"k", b"value");
    let with_size = |size: i32| {
        let mut d = good.clone();
        d[..4].copy_from_slice(&size.to_be_bytes());
        d
    };
    let len = i32::try_from(good.len()).expect("small");
    let t = topic.as_bytes();
    let mut trailing = good.clone();
    trailing.push(0);
    let trailing_len = i32::try_from(trailing.len()).expect("small");
    trailing[..4].copy_from_slice(&trailing_len.to_be_bytes());
    let mut negative_key = encode_any_partition(topic, ts, b"", b"value");
    let key_size_at = 12 + t.len() + 8;
    negative_key[key_size_at..key_size_at + 4].copy_from_slice(&(-1i32).to_be_bytes());
    vec![
        // Size field disagreeing with the datagram length.
        (with_size(len + 1), REASON_MALFORMED),
        (with_size(len - 1), REASON_MALFORMED),
        (with_size(-1), REASON_MALFORMED),
        // Shorter than the 8-byte envelope.
        (vec![0, 0, 0, 3, 1], REASON_MALFORMED),
        (vec![0, 0, 0, 7, 1, 0, 0], REASON_MALFORMED),
        // Flags != 0.
        (
            encode_raw(256, 0, 1, None, t, ts, b"k", b"v"),
            REASON_MALFORMED,
        ),
        (
            encode_raw(257, 0, i16::MIN, Some(3), t, ts, b"k", b"v"),
            REASON_MALFORMED,
        ),
        // Trailing byte after the value; negative key size; empty topic.
        (trailing, REASON_MALFORMED),
        (negative_key, REASON_MALFORMED),
        (
            encode_raw(256, 0, 0, None, b"", ts, b"k", b"v"),
            REASON_MALFORMED,
        ),
        // Unsupported API keys.
        (
            encode_raw(255, 0, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_API_KEY,
        ),
        (
            encode_raw(258, 0, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_API_KEY,
        ),
        (
            encode_raw(0, 0, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_API_KEY,
        ),
        // Unsupported versions.
        (
            encode_raw(256, 1, 0, None, t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_VERSION,
        ),
        (
            encode_raw(257, 3, 0, Some(0), t, ts, b"k", b"v"),
            REASON_UNSUPPORTED_VERSION,
        ),
    ]
}

/// Expected discard counts per reason for [`malformed_datagrams`].
pub fn expected_reasons(malformed: &[(Vec<u8>, &'static str)]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (_, r) in malformed {
        *m.entry((*r).to_string()).or_insert(0) += 1;
    }
    m
}
