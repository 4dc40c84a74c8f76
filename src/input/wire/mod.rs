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
/// Most bytes of a partial message a stream connection keeps in a buffer of its own
/// between reads through a shared buffer ([`StreamFramer::settle`]); a longer partial keeps
/// the read buffer it arrived in until it is whole.
pub const KEEP_PARTIAL_MAX: usize = 8 * 1024;

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

    /// One read like [`read_from`](Self::read_from), into `shared`: a read buffer that a
    /// stream input lends to each of its connections in turn, so that a thousand
    /// connections need one read buffer, not a thousand. What this framer kept of a partial
    /// message is moved to the front of `shared` first, and the framer's own buffer is set
    /// aside in its place. Call [`settle`](Self::settle) once the frames are taken.
    ///
    /// A framer whose own buffer already has room for a whole chunk, or which holds more
    /// than [`KEEP_PARTIAL_MAX`] bytes of a message, reads into its own buffer as before.
    pub fn read_shared(
        &mut self,
        r: &mut impl Read,
        shared: &mut Vec<u8>,
    ) -> std::io::Result<usize> {
        let n = self.end - self.start;
        if self.buf.len() - self.end < READ_CHUNK_SIZE && n <= KEEP_PARTIAL_MAX {
            if shared.len() < n + READ_CHUNK_SIZE {
                shared.resize(n + READ_CHUNK_SIZE, 0);
            }
            shared[..n].copy_from_slice(&self.buf[self.start..self.end]);
            std::mem::swap(&mut self.buf, shared);
            self.start = 0;
            self.end = n;
        }
        self.read_from(r)
    }

    /// Ends a read: a partial message of at most [`KEEP_PARTIAL_MAX`] bytes moves into a
    /// buffer of the framer's own (the one [`read_shared`](Self::read_shared) set aside, if
    /// it did) and the read buffer goes back to `shared`. A longer partial keeps the read
    /// buffer until its message is whole; `shared` then grows a new one when next lent.
    pub fn settle(&mut self, shared: &mut Vec<u8>) {
        let n = self.end - self.start;
        if n > KEEP_PARTIAL_MAX || self.buf.len() <= KEEP_PARTIAL_MAX {
            return;
        }
        // Whether this read buffer goes back to `shared`; if `shared` is as big, it is surplus.
        let replaces_shared = shared.len() < self.buf.len();
        let mut own = if replaces_shared {
            std::mem::take(shared)
        } else {
            Vec::new()
        };
        if own.capacity() > KEEP_PARTIAL_MAX {
            // A read buffer itself, to be replaced by the bigger one below.
            own = Vec::new();
        }
        own.clear();
        own.extend_from_slice(&self.buf[self.start..self.end]);
        let mut read_buf = std::mem::replace(&mut self.buf, own);
        self.start = 0;
        self.end = n;
        if replaces_shared {
            if read_buf.len() > Self::SHRINK_ABOVE {
                // One big message does not pin its memory in the shared buffer either.
                read_buf.truncate(KEEP_PARTIAL_MAX + READ_CHUNK_SIZE);
                read_buf.shrink_to_fit();
            }
            *shared = read_buf;
        }
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
mod tests;
