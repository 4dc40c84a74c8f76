//! The load generator: Dory AnyPartition datagrams (client format, doc/protocol.md) sent with
//! `sendmmsg`, `per_call` per system call, from an unbound UNIX datagram socket connected to
//! the receiver's path. The socket is blocking, so a full receive queue
//! (`net.unix.max_dgram_qlen`) blocks the sender: the receiver paces the load, unless a
//! rate is set (`--rate`), to see what a daemon costs when it keeps up.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::thread_usage::{thread_cpu_s, thread_switches};

/// What to send: `count` messages, message `i` to `topics[i % topics.len()]`, an empty key
/// (sent to Kafka as a null key) and a `value_size`-byte value.
#[derive(Clone, Debug)]
pub struct Load {
    pub count: u64,
    pub value_size: usize,
    pub topics: Vec<Vec<u8>>,
    pub per_call: usize,
    /// Messages per second, if paced; `None`: as fast as the receiver takes them.
    pub rate: Option<u64>,
    /// Value bytes: `false` the letter `v` repeated (compresses extremely well), `true`
    /// log-like text, words drawn from a small vocabulary (compresses about as well as
    /// real log lines).
    pub text_values: bool,
}

/// Distinct values per topic with `text_values`.
const TEXT_VARIANTS: usize = 256;

/// Overwrites `value` with space-separated words from a fixed vocabulary, chosen by a
/// small PRNG seeded with `seed`.
fn fill_text(value: &mut [u8], seed: u64) {
    const WORDS: [&[u8]; 16] = [
        b"GET",
        b"POST",
        b"/api/v1/orders",
        b"/health",
        b"200",
        b"404",
        b"user=",
        b"latency_ms=",
        b"region=eu-west-1",
        b"host=web-17",
        b"trace=",
        b"ok",
        b"retry",
        b"cache=miss",
        b"bytes=5120",
        b"level=info",
    ];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(value.len() + 32);
    while out.len() < value.len() {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(WORDS[(x % WORDS.len() as u64) as usize]);
        if x & 0x30 == 0 {
            out.extend_from_slice((x % 100_000).to_string().as_bytes());
        }
        out.push(b' ');
    }
    value.copy_from_slice(&out[..value.len()]);
}

impl Load {
    /// Size of one datagram: 28 bytes of AnyPartition overhead + topic + key (0) + value.
    /// All topic names have the same length, so every datagram has this size.
    pub fn datagram_size(&self) -> usize {
        28 + self.topics[0].len() + self.value_size
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Sent {
    /// Just before the first `sendmmsg`.
    pub start: Instant,
    /// Just after the last one returned.
    pub end: Instant,
    pub calls: u64,
    /// CPU time (user + system) of the sending thread between `start` and `end`: what
    /// the producing application spends handing the messages over.
    pub cpu_s: f64,
    /// Context switches of the sending thread between `start` and `end`: (voluntary,
    /// involuntary). A voluntary one is a send that blocked on a full socket queue.
    pub switches: (u64, u64),
}

/// Encodes one AnyPartition v0 message (ApiKey 256, version 0) into `out`:
/// `Size, ApiKey, ApiVersion, Flags=0, TopicSize, Topic, Timestamp, KeySize=0, ValueSize,
/// Value`, all integers big-endian. The value is filled with `b'v'`; `stamp` overwrites
/// the timestamp and the value's first 8 bytes (a sequence number) per message.
pub fn encode_template(topic: &[u8], value_size: usize) -> Vec<u8> {
    let size = 28 + topic.len() + value_size;
    let mut b = Vec::with_capacity(size);
    b.extend_from_slice(&(size as i32).to_be_bytes());
    b.extend_from_slice(&256i16.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    b.extend_from_slice(topic);
    b.extend_from_slice(&0i64.to_be_bytes()); // timestamp, set by `stamp`
    b.extend_from_slice(&0i32.to_be_bytes()); // key size: empty key
    b.extend_from_slice(&(value_size as i32).to_be_bytes());
    b.resize(size, b'v');
    debug_assert_eq!(b.len(), size);
    b
}

/// Writes the client timestamp (ms since the epoch) and the sequence number into a copy of
/// a template.
pub fn stamp(msg: &mut [u8], topic_len: usize, value_size: usize, now_ms: i64, seq: u64) {
    let ts = 12 + topic_len;
    msg[ts..ts + 8].copy_from_slice(&now_ms.to_be_bytes());
    let value = ts + 8 + 4 + 4;
    let n = value_size.min(8);
    msg[value..value + n].copy_from_slice(&seq.to_be_bytes()[..n]);
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One datagram per (topic, value variant): message `i` uses template `i mod len`, i.e.
/// topic `i mod topics`, so every topic gets every variant in turn. The value is the last
/// `value_size` bytes of each (the librdkafka target sends exactly those values).
pub fn templates(load: &Load) -> Vec<Vec<u8>> {
    let variants = if load.text_values { TEXT_VARIANTS } else { 1 };
    (0..variants * load.topics.len())
        .map(|j| {
            let topic = &load.topics[j % load.topics.len()];
            let mut t = encode_template(topic, load.value_size);
            if load.text_values {
                let value_at = t.len() - load.value_size;
                fill_text(&mut t[value_at..], j as u64);
            }
            t
        })
        .collect()
}

/// Writes sequence number `seq` into the first (up to) 8 bytes of a value, as the sender
/// does in every datagram.
pub fn stamp_value(value: &mut [u8], seq: u64) {
    let n = value.len().min(8);
    value[..n].copy_from_slice(&seq.to_be_bytes()[..n]);
}

/// Sends the whole load to `path`. Blocks while the receiver's queue is full; gives up with
/// an error if a single `sendmmsg` stays blocked for `stall` (receiver gone or stuck).
pub fn send(path: &Path, load: &Load, stall: Duration) -> io::Result<Sent> {
    assert!(!load.topics.is_empty() && load.per_call > 0);
    let sock = UnixDatagram::unbound()?;
    sock.connect(path)?;
    sock.set_write_timeout(Some(stall))?;
    let fd = sock.as_raw_fd();

    let templates = templates(load);
    let size = load.datagram_size();
    let topic_len = load.topics[0].len();
    let k = load.per_call;
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; size]; k];
    // SAFETY (for the zeroed C structs): iovec and mmsghdr are plain C structs for which
    // all-zero bytes are a valid value (null pointers, zero lengths).
    let mut iovs: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; k];
    let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; k];

    let mut seq = 0u64;
    let mut calls = 0u64;
    let cpu0 = thread_cpu_s();
    let switches0 = thread_switches();
    let start = Instant::now();
    while seq < load.count {
        let batch = k.min((load.count - seq) as usize);
        if let Some(rate) = load.rate {
            // Paced: message `seq` is due at start + seq / rate.
            let due = start + Duration::from_secs_f64(seq as f64 / rate.max(1) as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let ts = now_ms();
        for (j, buf) in bufs.iter_mut().enumerate().take(batch) {
            let i = seq + j as u64;
            buf.copy_from_slice(&templates[(i % templates.len() as u64) as usize]);
            stamp(buf, topic_len, load.value_size, ts, i);
        }
        // Pointers are taken after the writes above, so no reference invalidates them.
        for j in 0..batch {
            iovs[j].iov_base = bufs[j].as_mut_ptr().cast();
            iovs[j].iov_len = size;
            hdrs[j].msg_hdr.msg_iov = &mut iovs[j];
            hdrs[j].msg_hdr.msg_iovlen = 1;
            hdrs[j].msg_len = 0;
        }
        let mut off = 0usize;
        while off < batch {
            // SAFETY: hdrs[off..batch] are initialised mmsghdrs whose single iovec points at
            // a live buffer of `size` bytes; the socket is connected, so no address is set.
            let r =
                unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr().add(off), (batch - off) as u32, 0) };
            calls += 1;
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "sendmmsg blocked for {stall:?} after {} messages: receiver stalled",
                            seq + off as u64
                        ),
                    ));
                }
                return Err(e);
            }
            off += r as usize;
        }
        seq += batch as u64;
    }
    let end = Instant::now();
    Ok(Sent {
        start,
        end,
        calls,
        cpu_s: thread_cpu_s() - cpu0,
        switches: {
            let s1 = thread_switches();
            (s1.0 - switches0.0, s1.1 - switches0.1)
        },
    })
}
