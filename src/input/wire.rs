//! Dory's client message format, bit-exact (behaviour spec §1.2–1.5): parsing and encoding
//! of AnyPartition v0 and PartitionKey v0 messages, plus the framing of back-to-back messages
//! on stream sockets (§1.7). Shared by all three inputs; pure bytes in, bytes out, apart from
//! [`StreamFramer::read_from`].

use std::io::Read;

/// ApiKey of an AnyPartition message (§1.3).
pub const API_KEY_ANY_PARTITION: i16 = 256;
/// ApiKey of a PartitionKey message (§1.4).
pub const API_KEY_PARTITION_KEY: i16 = 257;
/// The only ApiVersion defined for both keys.
pub const API_VERSION: i16 = 0;
/// Size + ApiKey + ApiVersion.
pub const HEADER_SIZE: usize = 8;
/// Bytes of an AnyPartition message besides topic, key and value.
pub const ANY_PARTITION_OVERHEAD: usize = 28;
/// Bytes of a PartitionKey message besides topic, key and value.
pub const PARTITION_KEY_OVERHEAD: usize = 32;
/// Longest topic the int16 TopicSize field can describe.
pub const MAX_TOPIC_LEN: usize = i16::MAX as usize;
/// Most bytes [`StreamFramer::read_from`] asks the socket for at once (§1.7).
pub const READ_CHUNK_SIZE: usize = 64 * 1024;

/// How the router picks the partition of a message (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    AnyPartition,
    /// The client's partition key; used to choose the partition, never sent to Kafka.
    PartitionKey(i32),
}

/// A parsed client message; all byte fields borrow from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientMsg<'a> {
    pub kind: Kind,
    /// Arbitrary bytes, not validated here (§1.5 step 6).
    pub topic: &'a [u8],
    /// Client time in ms since the Unix epoch; any value.
    pub timestamp: i64,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// Why a message was rejected; each variant is a different discard category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("malformed message: {0}")]
    Malformed(MalformedReason),
    #[error("unsupported api key {0}")]
    UnsupportedApiKey(i16),
    #[error("unsupported api version {version} for api key {api_key}")]
    UnsupportedVersion { api_key: i16, version: i16 },
}

/// Detail of a malformed message, for logs and discard samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MalformedReason {
    #[error("shorter than the 8-byte header")]
    TooShort,
    #[error("size field {declared} does not match the message length {actual}")]
    SizeMismatch { declared: i32, actual: usize },
    /// The named field does not fit in the remaining bytes.
    #[error("truncated at the {0}")]
    Truncated(&'static str),
    #[error("flags field is {0}, must be 0")]
    NonZeroFlags(i16),
    #[error("topic size {0} is not positive")]
    BadTopicSize(i16),
    #[error("negative key size {0}")]
    NegativeKeySize(i32),
    #[error("negative value size {0}")]
    NegativeValueSize(i32),
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
}

// Written by hand rather than `#[from]`, which would also make the reason the error's
// `source()` and print it twice in error chains.
impl From<MalformedReason> for WireError {
    fn from(reason: MalformedReason) -> Self {
        WireError::Malformed(reason)
    }
}

/// Why a message cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("topic is empty")]
    EmptyTopic,
    #[error("topic of {0} bytes is longer than 32767 bytes")]
    TopicTooLong(usize),
    #[error("message would be longer than 2147483647 bytes")]
    TooLarge,
}

/// Parses one whole message (a datagram, or a stream frame including its size field),
/// applying the checks of §1.5 steps 1–5 in order; the first failure decides the error.
pub fn parse(msg: &[u8]) -> Result<ClientMsg<'_>, WireError> {
    use MalformedReason::*;

    // Step 1.
    let Some((header, body)) = msg.split_first_chunk::<HEADER_SIZE>() else {
        return Err(TooShort.into());
    };
    let [s0, s1, s2, s3, k0, k1, v0, v1] = *header;
    let declared = i32::from_be_bytes([s0, s1, s2, s3]);
    let api_key = i16::from_be_bytes([k0, k1]);
    let version = i16::from_be_bytes([v0, v1]);

    // Step 2 (a negative size never converts, so it never matches).
    if usize::try_from(declared).ok() != Some(msg.len()) {
        return Err(SizeMismatch {
            declared,
            actual: msg.len(),
        }
        .into());
    }
    // Step 3.
    let has_partition_key = match api_key {
        API_KEY_ANY_PARTITION => false,
        API_KEY_PARTITION_KEY => true,
        other => return Err(WireError::UnsupportedApiKey(other)),
    };
    // Step 4.
    if version != API_VERSION {
        return Err(WireError::UnsupportedVersion { api_key, version });
    }

    // Step 5.
    let mut r = Reader(body);
    let flags = i16::from_be_bytes(r.array("flags")?);
    if flags != 0 {
        return Err(NonZeroFlags(flags).into());
    }
    let kind = if has_partition_key {
        Kind::PartitionKey(i32::from_be_bytes(r.array("partition key")?))
    } else {
        Kind::AnyPartition
    };
    let topic_size = i16::from_be_bytes(r.array("topic size")?);
    let topic_len = usize::try_from(topic_size)
        .ok()
        .filter(|&n| n > 0)
        .ok_or(BadTopicSize(topic_size))?;
    let topic = r.bytes(topic_len, "topic")?;
    let timestamp = i64::from_be_bytes(r.array("timestamp")?);
    let key_size = i32::from_be_bytes(r.array("key size")?);
    let key_len = usize::try_from(key_size).map_err(|_| NegativeKeySize(key_size))?;
    let key = r.bytes(key_len, "key")?;
    let value_size = i32::from_be_bytes(r.array("value size")?);
    let value_len = usize::try_from(value_size).map_err(|_| NegativeValueSize(value_size))?;
    let value = r.bytes(value_len, "value")?;
    if !r.0.is_empty() {
        return Err(TrailingBytes(r.0.len()).into());
    }

    Ok(ClientMsg {
        kind,
        topic,
        timestamp,
        key,
        value,
    })
}

/// Reads fields off the front of a borrowed slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(MalformedReason::Truncated(field))?;
        self.0 = rest;
        Ok(*head)
    }

    fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        if n > self.0.len() {
            return Err(MalformedReason::Truncated(field).into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

/// Total size of an AnyPartition message; `None` if it cannot be encoded (empty topic,
/// topic over 32767 bytes, or total over `i32::MAX`).
pub fn any_partition_size(topic_len: usize, key_len: usize, value_len: usize) -> Option<usize> {
    Sizes::new(ANY_PARTITION_OVERHEAD, topic_len, key_len, value_len)
        .ok()
        .map(|s| s.total_len)
}

/// Total size of a PartitionKey message; `None` as for [`any_partition_size`].
pub fn partition_key_size(topic_len: usize, key_len: usize, value_len: usize) -> Option<usize> {
    Sizes::new(PARTITION_KEY_OVERHEAD, topic_len, key_len, value_len)
        .ok()
        .map(|s| s.total_len)
}

/// Appends an AnyPartition v0 message to `out`; on error `out` is left untouched.
pub fn encode_any_partition(
    out: &mut Vec<u8>,
    topic: &[u8],
    timestamp: i64,
    key: &[u8],
    value: &[u8],
) -> Result<(), EncodeError> {
    let sizes = Sizes::new(ANY_PARTITION_OVERHEAD, topic.len(), key.len(), value.len())?;
    out.reserve(sizes.total_len);
    put_header(out, &sizes, API_KEY_ANY_PARTITION);
    put_body(out, &sizes, topic, timestamp, key, value);
    Ok(())
}

/// Appends a PartitionKey v0 message to `out`; on error `out` is left untouched.
pub fn encode_partition_key(
    out: &mut Vec<u8>,
    partition_key: i32,
    topic: &[u8],
    timestamp: i64,
    key: &[u8],
    value: &[u8],
) -> Result<(), EncodeError> {
    let sizes = Sizes::new(PARTITION_KEY_OVERHEAD, topic.len(), key.len(), value.len())?;
    out.reserve(sizes.total_len);
    put_header(out, &sizes, API_KEY_PARTITION_KEY);
    out.extend_from_slice(&partition_key.to_be_bytes());
    put_body(out, &sizes, topic, timestamp, key, value);
    Ok(())
}

/// The size fields of a message, already converted to their wire types.
struct Sizes {
    total_len: usize,
    total: i32,
    topic: i16,
    key: i32,
    value: i32,
}

impl Sizes {
    fn new(overhead: usize, topic: usize, key: usize, value: usize) -> Result<Sizes, EncodeError> {
        if topic == 0 {
            return Err(EncodeError::EmptyTopic);
        }
        let topic_size = i16::try_from(topic).map_err(|_| EncodeError::TopicTooLong(topic))?;
        let total_len = overhead
            .checked_add(topic)
            .and_then(|n| n.checked_add(key))
            .and_then(|n| n.checked_add(value))
            .ok_or(EncodeError::TooLarge)?;
        let wire = |n: usize| i32::try_from(n).map_err(|_| EncodeError::TooLarge);
        Ok(Sizes {
            total_len,
            total: wire(total_len)?,
            topic: topic_size,
            // Both are at most `total`, so these cannot fail once `total` did not.
            key: wire(key)?,
            value: wire(value)?,
        })
    }
}

fn put_header(out: &mut Vec<u8>, sizes: &Sizes, api_key: i16) {
    out.extend_from_slice(&sizes.total.to_be_bytes());
    out.extend_from_slice(&api_key.to_be_bytes());
    out.extend_from_slice(&API_VERSION.to_be_bytes());
    // Flags.
    out.extend_from_slice(&0i16.to_be_bytes());
}

fn put_body(
    out: &mut Vec<u8>,
    sizes: &Sizes,
    topic: &[u8],
    timestamp: i64,
    key: &[u8],
    value: &[u8],
) {
    out.extend_from_slice(&sizes.topic.to_be_bytes());
    out.extend_from_slice(topic);
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&sizes.key.to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&sizes.value.to_be_bytes());
    out.extend_from_slice(value);
}

/// A stream framing error (§1.7); either one means the connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("invalid size field {0} (must be at least 4)")]
    InvalidSize(i32),
    #[error("size field {size} exceeds the limit of {max} bytes after the size field")]
    TooLarge { size: i32, max: usize },
}

/// Splits a byte stream of back-to-back messages into whole messages (§1.7): the framing is
/// each message's own int32 Size field, which counts itself.
///
/// Usage: call [`read_from`](Self::read_from), then [`next_frame`](Self::next_frame) until
/// it returns `Ok(None)`, and repeat. Draining after every read is what bounds the buffer to
/// about one maximal message plus one read chunk.
///
/// Memory: the buffer grows only as bytes actually arrive, never to a size the peer merely
/// declares, so a client claiming a 2 GiB message costs nothing until it sends the bytes
/// (and it is refused as soon as its size field is seen if over the limit). The buffer is
/// reused; consumed bytes are reclaimed by moving the partial tail to the front, which moves
/// each byte at most once.
#[derive(Debug)]
pub struct StreamFramer {
    /// Always fully initialised, so reads need no unsafe code and no per-read zeroing; only
    /// `buf[start..end]` holds data.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_msg_size: usize,
}

impl StreamFramer {
    /// Above this, an emptied buffer is given back to the allocator so that one big message
    /// does not pin its memory for the life of the connection.
    const SHRINK_ABOVE: usize = 4 * READ_CHUNK_SIZE;

    /// `max_msg_size` is `maxStreamMsgSize`: the most bytes a message may have after its
    /// 4-byte size field.
    pub fn new(max_msg_size: usize) -> StreamFramer {
        StreamFramer {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max_msg_size,
        }
    }

    /// One `read` of at most [`READ_CHUNK_SIZE`] bytes from `r` into the buffer. Returns
    /// what `read` returned: `Ok(0)` is end of stream; errors (including `Interrupted`) are
    /// the caller's to classify.
    pub fn read_from(&mut self, r: &mut impl Read) -> std::io::Result<usize> {
        self.make_room();
        let n = r.read(&mut self.buf[self.end..self.end + READ_CHUNK_SIZE])?;
        // A `Read` impl claiming more than it was given is a bug in it; don't trust it.
        let n = n.min(READ_CHUNK_SIZE);
        self.end += n;
        Ok(n)
    }

    /// The next whole message (including its size field, ready for [`parse`]), or `None`
    /// if more bytes are needed. An error leaves the buffer as it is, for the discard sample.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let data = &self.buf[self.start..self.end];
        let Some(size_field) = data.first_chunk::<4>() else {
            return Ok(None);
        };
        let size = i32::from_be_bytes(*size_field);
        let frame_len = usize::try_from(size)
            .ok()
            .filter(|&n| n >= 4)
            .ok_or(FrameError::InvalidSize(size))?;
        if frame_len - 4 > self.max_msg_size {
            return Err(FrameError::TooLarge {
                size,
                max: self.max_msg_size,
            });
        }
        if data.len() < frame_len {
            return Ok(None);
        }
        let frame_start = self.start;
        self.start += frame_len;
        Ok(Some(&self.buf[frame_start..self.start]))
    }

    /// Bytes received but not yet returned as a frame: after end of stream, empty means a
    /// clean disconnect, anything else is the partial message of an unclean one.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Gives back the memory of an idle connection: all of it if nothing is buffered,
    /// else all but the partial message (moved to the front). A client that connects and
    /// sends nothing, or stalls half way through a message, then holds only what it sent.
    pub fn release_idle(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        self.buf.truncate(self.end);
        self.buf.shrink_to_fit();
    }

    /// Bytes of buffer this framer holds (for tests and accounting).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Ensures `READ_CHUNK_SIZE` initialised bytes are free after `end`.
    fn make_room(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > Self::SHRINK_ABOVE {
                self.buf.truncate(READ_CHUNK_SIZE);
                self.buf.shrink_to_fit();
            }
        }
        if self.buf.len() - self.end >= READ_CHUNK_SIZE {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_CHUNK_SIZE {
            self.buf.resize(self.end + READ_CHUNK_SIZE, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TS: i64 = 1_700_000_000_000;

    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    fn example_any() -> Vec<u8> {
        hex("00 00 00 23 01 00 00 00 00 00 00 03 66 6f 6f 00 00 01 8b cf e5 68 00 00 00 00 01 6b 00 00 00 03 62 61 72")
    }

    fn example_pk() -> Vec<u8> {
        hex("00 00 00 27 01 01 00 00 00 00 ff ff ff fe 00 03 66 6f 6f 00 00 01 8b cf e5 68 00 00 00 00 01 6b 00 00 00 03 62 61 72")
    }

    fn malformed(msg: &[u8]) -> MalformedReason {
        match parse(msg) {
            Err(WireError::Malformed(reason)) => reason,
            other => panic!("expected malformed, got {other:?}"),
        }
    }

    /// Sets the size field to the actual length, so body checks are reached.
    fn fix_size(mut msg: Vec<u8>) -> Vec<u8> {
        let len = i32::try_from(msg.len()).unwrap();
        msg[..4].copy_from_slice(&len.to_be_bytes());
        msg
    }

    fn any_msg(topic: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_any_partition(&mut out, topic, TS, key, value).unwrap();
        out
    }

    #[test]
    fn worked_example_any_partition() {
        let mut out = vec![0xee];
        encode_any_partition(&mut out, b"foo", TS, b"k", b"bar").unwrap();
        assert_eq!(out[0], 0xee, "encoding appends");
        assert_eq!(&out[1..], example_any());
        assert_eq!(any_partition_size(3, 1, 3), Some(35));
        let msg = example_any();
        assert_eq!(
            parse(&msg).unwrap(),
            ClientMsg {
                kind: Kind::AnyPartition,
                topic: b"foo",
                timestamp: TS,
                key: b"k",
                value: b"bar",
            }
        );
    }

    #[test]
    fn worked_example_partition_key() {
        let mut out = Vec::new();
        encode_partition_key(&mut out, -2, b"foo", TS, b"k", b"bar").unwrap();
        assert_eq!(out, example_pk());
        assert_eq!(partition_key_size(3, 1, 3), Some(39));
        let msg = example_pk();
        assert_eq!(
            parse(&msg).unwrap(),
            ClientMsg {
                kind: Kind::PartitionKey(-2),
                topic: b"foo",
                timestamp: TS,
                key: b"k",
                value: b"bar",
            }
        );
    }

    #[test]
    fn empty_key_and_value_are_valid() {
        let msg = any_msg(b"t", b"", b"");
        assert_eq!(msg.len(), ANY_PARTITION_OVERHEAD + 1);
        let parsed = parse(&msg).unwrap();
        assert_eq!((parsed.key, parsed.value), (&b""[..], &b""[..]));
    }

    #[test]
    fn too_short() {
        for len in 0..HEADER_SIZE {
            assert_eq!(malformed(&example_any()[..len]), MalformedReason::TooShort);
        }
    }

    #[test]
    fn size_field_mismatch() {
        let mut msg = example_any();
        msg[3] = 0x24;
        assert_eq!(
            malformed(&msg),
            MalformedReason::SizeMismatch {
                declared: 36,
                actual: 35
            }
        );
        msg[3] = 0x22;
        assert!(matches!(
            malformed(&msg),
            MalformedReason::SizeMismatch { .. }
        ));
    }

    #[test]
    fn negative_size_field() {
        let mut msg = example_any();
        msg[..4].copy_from_slice(&(-35i32).to_be_bytes());
        assert_eq!(
            malformed(&msg),
            MalformedReason::SizeMismatch {
                declared: -35,
                actual: 35
            }
        );
    }

    #[test]
    fn nonzero_flags() {
        let mut msg = example_any();
        msg[9] = 1;
        assert_eq!(malformed(&msg), MalformedReason::NonZeroFlags(1));
        let mut msg = example_pk();
        msg[8] = 0x80;
        assert_eq!(malformed(&msg), MalformedReason::NonZeroFlags(i16::MIN));
    }

    #[test]
    fn zero_topic_size() {
        // Topic size 0 with the rest intact: the checks must stop at the topic size.
        let mut msg = example_any();
        msg[11] = 0;
        assert_eq!(malformed(&msg), MalformedReason::BadTopicSize(0));
    }

    #[test]
    fn negative_topic_size() {
        let mut msg = example_pk();
        msg[14] = 0xff;
        msg[15] = 0xfd;
        assert_eq!(malformed(&msg), MalformedReason::BadTopicSize(-3));
    }

    #[test]
    fn negative_key_size() {
        let mut msg = example_any();
        msg[23..27].copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(malformed(&msg), MalformedReason::NegativeKeySize(-1));
    }

    #[test]
    fn negative_value_size() {
        let mut msg = example_any();
        msg[28..32].copy_from_slice(&i32::MIN.to_be_bytes());
        assert_eq!(
            malformed(&msg),
            MalformedReason::NegativeValueSize(i32::MIN)
        );
    }

    #[test]
    fn trailing_garbage() {
        let mut msg = example_any();
        msg.extend_from_slice(b"xy");
        assert_eq!(malformed(&fix_size(msg)), MalformedReason::TrailingBytes(2));
    }

    #[test]
    fn value_size_larger_than_remaining() {
        let mut msg = example_pk();
        msg[35] = 4;
        assert_eq!(malformed(&msg), MalformedReason::Truncated("value"));
    }

    #[test]
    fn key_size_larger_than_remaining() {
        let mut msg = example_any();
        msg[23..27].copy_from_slice(&100i32.to_be_bytes());
        assert_eq!(malformed(&msg), MalformedReason::Truncated("key"));
    }

    #[test]
    fn topic_size_larger_than_remaining() {
        let mut msg = example_any();
        msg[10..12].copy_from_slice(&i16::MAX.to_be_bytes());
        assert_eq!(malformed(&msg), MalformedReason::Truncated("topic"));
    }

    #[test]
    fn truncation_at_every_offset_is_malformed() {
        for full in [example_any(), example_pk()] {
            for len in 0..full.len() {
                let cut = &full[..len];
                // As received: the size field no longer matches (or the header is short).
                malformed(cut);
                // With a consistent size field, the body checks must catch it.
                if len >= HEADER_SIZE {
                    let reason = malformed(&fix_size(cut.to_vec()));
                    assert!(
                        matches!(reason, MalformedReason::Truncated(_)),
                        "len {len}: {reason:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn truncation_reports_the_field() {
        let full = example_pk();
        let at = |len: usize| malformed(&fix_size(full[..len].to_vec()));
        assert_eq!(at(8), MalformedReason::Truncated("flags"));
        assert_eq!(at(10), MalformedReason::Truncated("partition key"));
        assert_eq!(at(14), MalformedReason::Truncated("topic size"));
        assert_eq!(at(16), MalformedReason::Truncated("topic"));
        assert_eq!(at(19), MalformedReason::Truncated("timestamp"));
        assert_eq!(at(27), MalformedReason::Truncated("key size"));
        assert_eq!(at(31), MalformedReason::Truncated("key"));
        assert_eq!(at(32), MalformedReason::Truncated("value size"));
        assert_eq!(at(36), MalformedReason::Truncated("value"));
    }

    #[test]
    fn unsupported_api_key_and_version() {
        let mut msg = example_any();
        msg[4..6].copy_from_slice(&258i16.to_be_bytes());
        assert_eq!(parse(&msg), Err(WireError::UnsupportedApiKey(258)));
        let mut msg = example_pk();
        msg[6..8].copy_from_slice(&1i16.to_be_bytes());
        assert_eq!(
            parse(&msg),
            Err(WireError::UnsupportedVersion {
                api_key: 257,
                version: 1
            })
        );
    }

    #[test]
    fn checks_apply_in_spec_order() {
        // Short header beats everything.
        assert_eq!(malformed(&[0xff; 7]), MalformedReason::TooShort);
        // Size mismatch beats an unknown api key.
        let mut msg = example_any();
        msg[4..6].copy_from_slice(&1i16.to_be_bytes());
        msg.push(0);
        assert!(matches!(
            malformed(&msg),
            MalformedReason::SizeMismatch { .. }
        ));
        // Unknown api key beats a bad version and a garbage body.
        let mut msg = hex("00 00 00 0c 00 01 00 07 ff ff ff ff");
        assert_eq!(parse(&msg), Err(WireError::UnsupportedApiKey(1)));
        // A bad version beats a garbage body.
        msg[4..6].copy_from_slice(&256i16.to_be_bytes());
        assert_eq!(
            parse(&msg),
            Err(WireError::UnsupportedVersion {
                api_key: 256,
                version: 7
            })
        );
        // A header-only message of a known kind is a truncated body.
        let msg = hex("00 00 00 08 01 00 00 00");
        assert_eq!(malformed(&msg), MalformedReason::Truncated("flags"));
        // Flags are checked before the partition key is read.
        let msg = hex("00 00 00 0a 01 01 00 00 00 01");
        assert_eq!(malformed(&msg), MalformedReason::NonZeroFlags(1));
    }

    #[test]
    fn error_messages_are_lowercase() {
        let errors = [
            WireError::Malformed(MalformedReason::Truncated("key")).to_string(),
            WireError::UnsupportedApiKey(3).to_string(),
            EncodeError::EmptyTopic.to_string(),
            FrameError::InvalidSize(2).to_string(),
        ];
        for e in errors {
            assert_eq!(e, e.to_lowercase());
        }
    }

    #[test]
    fn encode_limits() {
        let mut out = Vec::new();
        assert_eq!(
            encode_any_partition(&mut out, b"", TS, b"", b""),
            Err(EncodeError::EmptyTopic)
        );
        let long = vec![b'a'; MAX_TOPIC_LEN + 1];
        assert_eq!(
            encode_partition_key(&mut out, 0, &long, TS, b"", b""),
            Err(EncodeError::TopicTooLong(MAX_TOPIC_LEN + 1))
        );
        assert!(out.is_empty());
        let max_topic = vec![b'a'; MAX_TOPIC_LEN];
        encode_any_partition(&mut out, &max_topic, TS, b"", b"").unwrap();
        assert_eq!(parse(&out).unwrap().topic.len(), MAX_TOPIC_LEN);

        assert_eq!(any_partition_size(0, 0, 0), None);
        assert_eq!(any_partition_size(MAX_TOPIC_LEN + 1, 0, 0), None);
        let max = i32::MAX as usize;
        assert_eq!(any_partition_size(1, 0, max - 29), Some(max));
        assert_eq!(any_partition_size(1, max - 28, 0), None);
        assert_eq!(partition_key_size(1, 0, max - 33), Some(max));
        assert_eq!(partition_key_size(1, 0, max - 32), None);
        assert_eq!(partition_key_size(1, usize::MAX, usize::MAX), None);
    }

    proptest! {
        #[test]
        fn any_partition_roundtrip(
            topic in prop::collection::vec(any::<u8>(), 1..200),
            timestamp in any::<i64>(),
            key in prop::collection::vec(any::<u8>(), 0..300),
            value in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut out = Vec::new();
            encode_any_partition(&mut out, &topic, timestamp, &key, &value).unwrap();
            prop_assert_eq!(Some(out.len()), any_partition_size(topic.len(), key.len(), value.len()));
            let msg = parse(&out).unwrap();
            prop_assert_eq!(msg, ClientMsg { kind: Kind::AnyPartition, topic: &topic, timestamp, key: &key, value: &value });
        }

        #[test]
        fn partition_key_roundtrip(
            partition_key in any::<i32>(),
            topic in prop::collection::vec(any::<u8>(), 1..200),
            timestamp in any::<i64>(),
            key in prop::collection::vec(any::<u8>(), 0..300),
            value in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut out = Vec::new();
            encode_partition_key(&mut out, partition_key, &topic, timestamp, &key, &value).unwrap();
            prop_assert_eq!(Some(out.len()), partition_key_size(topic.len(), key.len(), value.len()));
            let msg = parse(&out).unwrap();
            prop_assert_eq!(msg, ClientMsg { kind: Kind::PartitionKey(partition_key), topic: &topic, timestamp, key: &key, value: &value });
        }

        #[test]
        fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse(&bytes);
            let _ = parse(&fix_size_any(bytes));
        }

        #[test]
        fn framer_yields_exactly_the_messages(
            msgs in prop::collection::vec(
                (prop::collection::vec(any::<u8>(), 1..20), prop::collection::vec(any::<u8>(), 0..400)),
                0..20,
            ),
            splits in prop::collection::vec(1usize..700, 1..50),
        ) {
            let encoded: Vec<Vec<u8>> = msgs.iter().map(|(t, v)| any_msg(t, b"k", v)).collect();
            let stream = encoded.concat();
            let mut reader = SplitReader { data: &stream, splits: &splits, turn: 0 };
            let mut framer = StreamFramer::new(1024);
            let mut got = Vec::new();
            while framer.read_from(&mut reader).unwrap() > 0 {
                while let Some(frame) = framer.next_frame().unwrap() {
                    got.push(frame.to_vec());
                }
            }
            prop_assert!(framer.buffered().is_empty());
            prop_assert_eq!(&got, &encoded);
            for (frame, (topic, value)) in got.iter().zip(&msgs) {
                let msg = parse(frame).unwrap();
                prop_assert_eq!((msg.topic, msg.value), (&topic[..], &value[..]));
            }
        }
    }

    /// Like `fix_size`, but tolerates inputs shorter than the size field.
    fn fix_size_any(msg: Vec<u8>) -> Vec<u8> {
        if msg.len() < 4 {
            msg
        } else {
            fix_size(msg)
        }
    }

    /// Hands out the data in reads of the given sizes, cycling through them.
    struct SplitReader<'a> {
        data: &'a [u8],
        splits: &'a [usize],
        turn: usize,
    }

    impl Read for SplitReader<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let want = self.splits[self.turn % self.splits.len()];
            self.turn += 1;
            let n = want.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn framer_with(bytes: &[u8], max: usize) -> StreamFramer {
        let mut framer = StreamFramer::new(max);
        let mut r = bytes;
        while framer.read_from(&mut r).unwrap() > 0 {}
        framer
    }

    #[test]
    fn invalid_size_fields_close_the_connection() {
        for size in [i32::MIN, -1, 0, 3] {
            let mut bytes = size.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[1, 2, 3]);
            let mut framer = framer_with(&bytes, 1024);
            assert_eq!(framer.next_frame(), Err(FrameError::InvalidSize(size)));
            // The data stays available for the discard sample.
            assert_eq!(framer.buffered(), &bytes[..]);
        }
    }

    #[test]
    fn size_four_is_an_empty_frame() {
        let mut framer = framer_with(&4i32.to_be_bytes(), 0);
        assert_eq!(framer.next_frame(), Ok(Some(&4i32.to_be_bytes()[..])));
        assert_eq!(framer.next_frame(), Ok(None));
    }

    #[test]
    fn too_large_is_refused_as_soon_as_the_size_is_seen() {
        let mut framer = framer_with(&105i32.to_be_bytes(), 100);
        assert_eq!(
            framer.next_frame(),
            Err(FrameError::TooLarge {
                size: 105,
                max: 100
            })
        );
        // Exactly at the limit is fine: 100 body bytes.
        let mut bytes = 104i32.to_be_bytes().to_vec();
        bytes.resize(104, 7);
        let mut framer = framer_with(&bytes, 100);
        assert_eq!(framer.next_frame(), Ok(Some(&bytes[..])));
    }

    #[test]
    fn partial_size_field_waits() {
        let msg = example_any();
        let mut framer = framer_with(&msg[..3], 1024);
        assert_eq!(framer.next_frame(), Ok(None));
        assert_eq!(framer.buffered(), &msg[..3]);
    }

    #[test]
    fn lying_size_field_does_not_allocate_the_claimed_size() {
        let mut bytes = i32::MAX.to_be_bytes().to_vec();
        bytes.extend_from_slice(b"only a few bytes");
        let mut framer = framer_with(&bytes, i32::MAX as usize);
        assert_eq!(framer.next_frame(), Ok(None));
        assert_eq!(framer.buffered(), &bytes[..]);
        assert!(framer.buf.capacity() <= 2 * READ_CHUNK_SIZE);
    }

    #[test]
    fn maximal_message_in_many_reads() {
        const MAX: usize = 2 * 1024 * 1024;
        let value = vec![0x5a; MAX - ANY_PARTITION_OVERHEAD + 4 - 3];
        let msg = any_msg(b"big", b"", &value);
        assert_eq!(msg.len(), MAX + 4);
        let mut stream = msg.clone();
        stream.extend_from_slice(&example_any());
        stream.extend_from_slice(&msg);

        let mut framer = StreamFramer::new(MAX);
        let mut r = &stream[..];
        let mut got = Vec::new();
        let mut reads = 0;
        while framer.read_from(&mut r).unwrap() > 0 {
            reads += 1;
            while let Some(frame) = framer.next_frame().unwrap() {
                got.push(frame.to_vec());
            }
            // Bounded by one maximal message plus a read chunk (plus Vec growth slack).
            assert!(framer.buf.len() <= MAX + 4 + READ_CHUNK_SIZE);
        }
        assert!(reads >= stream.len() / READ_CHUNK_SIZE);
        assert_eq!(got, [msg.clone(), example_any(), msg]);
        assert_eq!(parse(&got[0]).unwrap().value, &value[..]);
        // Emptied after big messages: the memory was handed back.
        framer.make_room();
        assert!(framer.buf.len() <= READ_CHUNK_SIZE);
    }

    #[test]
    fn an_idle_framer_keeps_only_its_partial_message() {
        let mut framer = StreamFramer::new(1024);
        assert_eq!(framer.capacity(), 0);
        let mut stream = example_any();
        let partial = &example_pk()[..10];
        stream.extend_from_slice(partial);
        let mut r = &stream[..];
        framer.read_from(&mut r).unwrap();
        assert!(framer.capacity() >= READ_CHUNK_SIZE);
        assert_eq!(framer.next_frame(), Ok(Some(&example_any()[..])));
        assert_eq!(framer.next_frame(), Ok(None));
        framer.release_idle();
        assert_eq!(framer.capacity(), partial.len());
        assert_eq!(framer.buffered(), partial);
        // No room left: the next read takes a fresh chunk.
        assert!(framer.buf.len() - framer.end < READ_CHUNK_SIZE);
        // The rest of the message arrives later: the frame is whole again.
        let mut rest = &example_pk()[10..];
        framer.read_from(&mut rest).unwrap();
        assert_eq!(framer.next_frame(), Ok(Some(&example_pk()[..])));
        // Nothing buffered: all of it goes back.
        framer.release_idle();
        assert_eq!(framer.capacity(), 0);
        assert!(framer.buffered().is_empty());
    }

    #[test]
    fn disconnect_mid_message_leaves_the_partial_data() {
        let mut stream = example_any();
        stream.extend_from_slice(&example_pk()[..10]);
        let mut framer = framer_with(&stream, 1024);
        assert_eq!(framer.next_frame(), Ok(Some(&example_any()[..])));
        assert_eq!(framer.next_frame(), Ok(None));
        assert_eq!(framer.buffered(), &example_pk()[..10]);
    }
}
