//! MessageSet v0 and v1, the record format before RecordBatch v2: magic 0 (Kafka 0.8–0.9)
//! and magic 1 (Kafka 0.10, which added a timestamp to each message). Produce v0 and v1
//! carry magic 0, Produce v2 magic 1. The writer encodes messages straight into the
//! request buffer, or, compressed, into a scratch buffer that becomes the value of one
//! *wrapper* message; a strict decoder (all three codecs, one level of wrapping, bounded)
//! checks what we write in tests and fuzzing.
//!
//! Layout of one entry of a set (the size counts from the CRC on; the CRC, CRC-32 IEEE,
//! covers magic to the end):
//! ```text
//!  0 offset i64        16 magic i8 (0 or 1)   18 timestamp i64 (magic 1 only)
//!  8 message_size i32  17 attributes i8       .. key bytes (i32 length, -1 null)
//! 12 crc u32                                  .. value bytes (i32 length, -1 null)
//! ```
//! Attributes: bits 0–2 the codec (0 none, 1 gzip, 2 snappy, 3 lz4), bit 3 (magic 1) the
//! timestamp type. A compressed set is one wrapper message whose value is the compressed
//! inner set; its inner offsets run 0..n-1 (magic 1: relative to the wrapper, whose offset
//! is the last inner one's, n-1 as written by a producer) and the broker assigns the real
//! ones. zstd needs RecordBatch v2 and is not part of this format.

use super::compression::{self, Codec, CompressError, Compression};
use super::primitives::{put_i32, put_i32_at, put_i64, put_i8, put_u32_at, DecodeError, Reader};
use super::record_batch::CompressionOutcome;

/// The message format version (the `magic` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Magic {
    /// Kafka 0.8–0.9: no timestamp; lz4 frames with Kafka's old header checksum.
    V0,
    /// Kafka 0.10: a timestamp per message; standard lz4 frames.
    V1,
}

impl Magic {
    pub fn byte(self) -> i8 {
        match self {
            Magic::V0 => 0,
            Magic::V1 => 1,
        }
    }

    /// The format a Produce request version carries (v0–v1: magic 0, v2: magic 1).
    pub fn for_produce_version(version: i16) -> Option<Magic> {
        match version {
            0 | 1 => Some(Magic::V0),
            2 => Some(Magic::V1),
            _ => None,
        }
    }

    /// Bytes an entry takes besides its key and value: offset, size, CRC, magic,
    /// attributes, (timestamp,) and the two length prefixes.
    pub fn entry_overhead(self) -> usize {
        match self {
            Magic::V0 => 26,
            Magic::V1 => 34,
        }
    }
}

/// Low three attribute bits: the codec.
const ATTR_COMPRESSION_MASK: i8 = 0x07;
/// Offset, size, CRC, magic, attributes: the fixed part of every entry.
const ENTRY_FIXED: usize = 18;

/// Writes one MessageSet into a buffer the caller owns.
///
/// ```text
/// let mut w = MessageSetWriter::begin(buf, Magic::V1, compression, scratch);
/// w.append(w.records_buf(buf, scratch), now_ms, None, Some(b"payload"));
/// match w.finish(buf, scratch, threshold_percent) { /* count the outcome */ }
/// ```
#[derive(Debug)]
#[must_use = "a compressed message set must be finished to write its wrapper"]
pub struct MessageSetWriter {
    magic: Magic,
    compression: Compression,
    count: i64,
    max_timestamp: i64,
}

impl MessageSetWriter {
    /// Starts a set. With a codec, messages go to `scratch` (cleared here) until `finish`;
    /// without, straight to `buf`. zstd is not allowed (the caller falls back first).
    pub fn begin(magic: Magic, compression: Compression, scratch: &mut Vec<u8>) -> Self {
        debug_assert!(
            compression.codec != Codec::Zstd,
            "zstd needs RecordBatch v2"
        );
        if compression.codec != Codec::None {
            scratch.clear();
        }
        MessageSetWriter {
            magic,
            compression,
            count: 0,
            max_timestamp: i64::MIN,
        }
    }

    /// Where messages are appended: `buf` for an uncompressed set, `scratch` otherwise.
    pub fn records_buf<'a>(
        &self,
        buf: &'a mut Vec<u8>,
        scratch: &'a mut Vec<u8>,
    ) -> &'a mut Vec<u8> {
        if self.compression.codec == Codec::None {
            buf
        } else {
            scratch
        }
    }

    /// Messages appended so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends one message (CreateTime `timestamp`, ignored for magic 0) to `out`, which
    /// must be [`MessageSetWriter::records_buf`].
    pub fn append(
        &mut self,
        out: &mut Vec<u8>,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) {
        self.append_parts(
            out,
            timestamp,
            key.map(<[u8]>::len),
            |b| b.extend_from_slice(key.unwrap_or_default()),
            value.map(<[u8]>::len),
            |b| b.extend_from_slice(value.unwrap_or_default()),
        );
    }

    /// [`MessageSetWriter::append`] with the key and value written by the caller (straight
    /// from pool memory): `key_len`/`value_len` `None` is null, else `write_*` must append
    /// exactly that many bytes.
    pub fn append_parts(
        &mut self,
        out: &mut Vec<u8>,
        timestamp: i64,
        key_len: Option<usize>,
        write_key: impl FnOnce(&mut Vec<u8>),
        value_len: Option<usize>,
        write_value: impl FnOnce(&mut Vec<u8>),
    ) {
        let offset = self.count;
        self.count += 1;
        self.max_timestamp = self.max_timestamp.max(timestamp);
        put_entry(
            out,
            offset,
            self.magic,
            0,
            timestamp,
            (key_len, write_key),
            (value_len, write_value),
        );
    }

    /// Ends the set. Uncompressed: nothing left to do. Compressed: the inner set in
    /// `scratch` is compressed into the value of one wrapper message in `buf`, unless the
    /// compressed size exceeds `threshold_percent` of the inner set's or the codec fails,
    /// in which case the inner messages go into `buf` uncompressed (a valid set as well).
    pub fn finish(
        self,
        buf: &mut Vec<u8>,
        scratch: &[u8],
        threshold_percent: u32,
    ) -> CompressionOutcome {
        let codec = self.compression.codec;
        if codec == Codec::None {
            return CompressionOutcome::Uncompressed;
        }
        let uncompressed = scratch.len();
        let start = buf.len();
        // The wrapper's header first, then the compressed inner set straight after it.
        let value_at = start + ENTRY_FIXED + if self.magic == Magic::V1 { 8 } else { 0 } + 4 + 4;
        buf.resize(value_at, 0);
        let result = match (codec, self.magic) {
            (Codec::Lz4, magic) => {
                compression::compress_lz4_legacy(scratch, buf, magic == Magic::V0)
            }
            _ => compression::compress(codec, self.compression.level, scratch, buf),
        };
        let compressed = buf.len() - value_at;
        let outcome = match result {
            Err(e) => CompressionOutcome::Error(e),
            Ok(())
                if compressed as u64 * 100 > uncompressed as u64 * u64::from(threshold_percent) =>
            {
                CompressionOutcome::NotCompressible {
                    uncompressed,
                    compressed,
                }
            }
            Ok(()) => CompressionOutcome::Compressed {
                uncompressed,
                compressed,
            },
        };
        if !matches!(outcome, CompressionOutcome::Compressed { .. }) {
            buf.truncate(start);
            buf.extend_from_slice(scratch);
            return outcome;
        }
        // Patch the wrapper around the value now in place.
        let mut header = Vec::with_capacity(value_at - start);
        let attributes = codec_attribute(codec);
        let ts = self.max_timestamp.max(0);
        put_entry_header(
            &mut header,
            self.count - 1,
            self.magic,
            attributes,
            ts,
            None,
        );
        put_i32(&mut header, i32::try_from(compressed).unwrap_or(i32::MAX));
        debug_assert_eq!(header.len(), value_at - start);
        buf[start..value_at].copy_from_slice(&header);
        seal_entry(buf, start);
        outcome
    }
}

fn codec_attribute(codec: Codec) -> i8 {
    match codec {
        Codec::None => 0,
        Codec::Gzip => 1,
        Codec::Snappy => 2,
        Codec::Lz4 => 3,
        // Not writable in this format (see `MessageSetWriter::begin`).
        Codec::Zstd => 4,
    }
}

/// Writes an entry's header up to and including the key (offset, size and CRC as
/// placeholders): `key` is `None` for null.
fn put_entry_header(
    out: &mut Vec<u8>,
    offset: i64,
    magic: Magic,
    attributes: i8,
    timestamp: i64,
    key: Option<&[u8]>,
) {
    put_i64(out, offset);
    put_i32(out, 0); // message_size: patched by seal_entry
    put_i32(out, 0); // crc: patched by seal_entry
    put_i8(out, magic.byte());
    put_i8(out, attributes);
    if magic == Magic::V1 {
        put_i64(out, timestamp);
    }
    match key {
        None => put_i32(out, -1),
        Some(k) => {
            put_i32(out, i32::try_from(k.len()).expect("key length fits i32"));
            out.extend_from_slice(k);
        }
    }
}

/// One whole entry at the end of `out`.
fn put_entry(
    out: &mut Vec<u8>,
    offset: i64,
    magic: Magic,
    attributes: i8,
    timestamp: i64,
    key: (Option<usize>, impl FnOnce(&mut Vec<u8>)),
    value: (Option<usize>, impl FnOnce(&mut Vec<u8>)),
) {
    let start = out.len();
    put_i64(out, offset);
    put_i32(out, 0);
    put_i32(out, 0);
    put_i8(out, magic.byte());
    put_i8(out, attributes);
    if magic == Magic::V1 {
        put_i64(out, timestamp);
    }
    put_field(out, key.0, key.1);
    put_field(out, value.0, value.1);
    seal_entry(out, start);
}

fn put_field(out: &mut Vec<u8>, len: Option<usize>, write: impl FnOnce(&mut Vec<u8>)) {
    match len {
        None => put_i32(out, -1),
        Some(n) => {
            put_i32(out, i32::try_from(n).expect("field length fits i32"));
            let before = out.len();
            write(out);
            debug_assert_eq!(
                out.len() - before,
                n,
                "the writer wrote its declared length"
            );
        }
    }
}

/// Patches the size and CRC of the entry starting at `start` and running to the end.
fn seal_entry(out: &mut [u8], start: usize) {
    let size = out.len() - start - 12;
    put_i32_at(
        out,
        start + 8,
        i32::try_from(size).expect("message size fits i32"),
    );
    let crc = crc32fast::hash(&out[start + 16..]);
    put_u32_at(out, start + 12, crc);
}

/// One message read back from a set; for a message that came out of a wrapper, the
/// wrapper's codec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMessage {
    pub offset: i64,
    pub magic: i8,
    pub attributes: i8,
    /// Magic 1 only.
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub wrapper: Option<Codec>,
}

/// Smallest message body (CRC, magic, attributes, two null lengths), magic 0.
const MIN_BODY: usize = 14;

/// Decodes a whole MessageSet (magic 0 and 1, even mixed), verifying each CRC-32 and that
/// every length agrees with the bytes present. A wrapper is decompressed (gzip, snappy,
/// lz4; at most `max_decompressed` bytes each) and its inner set decoded, which must be of
/// the wrapper's magic and uncompressed. Lengths are checked against the bytes present
/// before anything is read, so nothing is allocated by a length from the input.
pub fn decode_message_set(
    bytes: &[u8],
    max_decompressed: usize,
) -> Result<Vec<DecodedMessage>, DecodeError> {
    let mut out = Vec::new();
    decode_into(bytes, max_decompressed, None, &mut out)?;
    Ok(out)
}

/// `inner`: decoding a wrapper's contents of this magic, under this codec.
fn decode_into(
    bytes: &[u8],
    max_decompressed: usize,
    inner: Option<(i8, Codec)>,
    out: &mut Vec<DecodedMessage>,
) -> Result<(), DecodeError> {
    let mut r = Reader::new(bytes);
    while !r.is_empty() {
        let offset = r.i64()?;
        let size = r.i32()?;
        let size = usize::try_from(size)
            .ok()
            .filter(|&n| n >= MIN_BODY)
            .ok_or(DecodeError::InvalidLength(i64::from(size)))?;
        let body = r.bytes(size)?;
        let mut b = Reader::new(body);
        let stored = b.u32()?;
        let computed = crc32fast::hash(b.rest());
        if stored != computed {
            return Err(DecodeError::CrcMismatch { stored, computed });
        }
        let magic = b.i8()?;
        if !(0..=1).contains(&magic) {
            return Err(DecodeError::UnsupportedMagic(magic));
        }
        let attributes = b.i8()?;
        let timestamp = if magic == 1 { Some(b.i64()?) } else { None };
        let key = b.nullable_bytes()?;
        let value = b.nullable_bytes()?;
        b.finish()?;
        let codec_id = attributes & ATTR_COMPRESSION_MASK;
        let codec = match codec_id {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            _ => return Err(DecodeError::UnsupportedCompression(i16::from(codec_id))),
        };
        if let Some((wrapper_magic, _)) = inner {
            if codec != Codec::None {
                return Err(DecodeError::InvalidRecord("a wrapper inside a wrapper"));
            }
            if magic != wrapper_magic {
                return Err(DecodeError::InvalidRecord(
                    "inner magic differs from its wrapper's",
                ));
            }
        }
        if inner.is_some() || codec == Codec::None {
            out.push(DecodedMessage {
                offset,
                magic,
                attributes,
                timestamp,
                key: key.map(<[u8]>::to_vec),
                value: value.map(<[u8]>::to_vec),
                wrapper: inner.map(|(_, c)| c),
            });
            continue;
        }
        let compressed = value.ok_or(DecodeError::UnexpectedNull("wrapper message value"))?;
        let mut fixed;
        let compressed = if codec == Codec::Lz4 && magic == 0 {
            // Either framing of Kafka 0.8–0.9: set the standard header checksum first.
            fixed = compressed.to_vec();
            compression::set_lz4_header_checksum(&mut fixed, false);
            &fixed[..]
        } else {
            compressed
        };
        let mut set = Vec::new();
        compression::decompress(codec, compressed, &mut set, max_decompressed).map_err(|e| {
            DecodeError::InvalidRecord(match e {
                CompressError::TooLarge { .. } => "messages decompress beyond the limit",
                _ => "compressed messages are corrupt",
            })
        })?;
        let before = out.len();
        decode_into(&set, max_decompressed, Some((magic, codec)), out)?;
        if out.len() == before {
            return Err(DecodeError::InvalidRecord("an empty wrapper"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (timestamp, key, value)
    type TestMsg = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

    /// Writes `msgs` as one set and returns its bytes and the compression outcome.
    fn write(magic: Magic, codec: Codec, msgs: &[TestMsg]) -> (Vec<u8>, CompressionOutcome) {
        let (mut buf, mut scratch) = (b"prefix".to_vec(), Vec::new());
        let compression = Compression::new(codec, None).expect("codec");
        let mut w = MessageSetWriter::begin(magic, compression, &mut scratch);
        for (ts, k, v) in msgs {
            let out = w.records_buf(&mut buf, &mut scratch);
            w.append(out, *ts, k.as_deref(), v.as_deref());
        }
        assert_eq!(w.len(), msgs.len());
        let outcome = w.finish(&mut buf, &scratch, 100);
        assert_eq!(&buf[..6], b"prefix", "nothing before the set is touched");
        (buf.split_off(6), outcome)
    }

    fn check_round_trip(magic: Magic, codec: Codec, msgs: &[TestMsg]) {
        let (bytes, outcome) = write(magic, codec, msgs);
        let got = decode_message_set(&bytes, 16 << 20).expect("decodes");
        assert_eq!(got.len(), msgs.len());
        let wrapped = matches!(outcome, CompressionOutcome::Compressed { .. });
        for (i, (m, (ts, k, v))) in got.iter().zip(msgs).enumerate() {
            assert_eq!(m.offset, i as i64, "inner offsets run 0..n-1");
            assert_eq!(m.magic, magic.byte());
            assert_eq!(m.attributes, 0);
            assert_eq!(m.timestamp, (magic == Magic::V1).then_some(*ts));
            assert_eq!(&m.key, k);
            assert_eq!(&m.value, v);
            assert_eq!(m.wrapper, wrapped.then_some(codec));
        }
        if !wrapped {
            let want: usize = msgs
                .iter()
                .map(|(_, k, v)| {
                    magic.entry_overhead()
                        + k.as_ref().map_or(0, Vec::len)
                        + v.as_ref().map_or(0, Vec::len)
                })
                .sum();
            assert_eq!(bytes.len(), want, "entry_overhead matches what is written");
        }
    }

    #[test]
    fn a_v0_message_byte_by_byte() {
        let (bytes, outcome) = write(
            Magic::V0,
            Codec::None,
            &[(5, Some(b"k".to_vec()), Some(b"vv".to_vec()))],
        );
        assert_eq!(outcome, CompressionOutcome::Uncompressed);
        let body = [0u8, 0, 0, 0, 0, 1, b'k', 0, 0, 0, 2, b'v', b'v'];
        let crc = crc32fast::hash(&body);
        let mut want = vec![0u8; 8]; // offset 0
        want.extend_from_slice(&17i32.to_be_bytes()); // crc + body
        want.extend_from_slice(&crc.to_be_bytes());
        want.extend_from_slice(&body);
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_v1_message_byte_by_byte() {
        let (bytes, _) = write(
            Magic::V1,
            Codec::None,
            &[(0x0102, None, Some(b"v".to_vec()))],
        );
        let mut body = vec![1u8, 0];
        body.extend_from_slice(&0x0102i64.to_be_bytes());
        body.extend_from_slice(&(-1i32).to_be_bytes());
        body.extend_from_slice(&1i32.to_be_bytes());
        body.push(b'v');
        let mut want = vec![0u8; 8];
        want.extend_from_slice(&(4 + body.len() as i32).to_be_bytes());
        want.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        want.extend_from_slice(&body);
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_compressed_set_is_one_wrapper_with_the_last_offset_and_newest_timestamp() {
        let msgs: Vec<_> = (0..50)
            .map(|i| (1000 + (i * 7) % 13, None, Some(vec![b'x'; 100])))
            .collect();
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4] {
            for magic in [Magic::V0, Magic::V1] {
                let (bytes, outcome) = write(magic, codec, &msgs);
                assert!(
                    matches!(outcome, CompressionOutcome::Compressed { .. }),
                    "{codec:?} {magic:?}: {outcome:?}"
                );
                let mut r = Reader::new(&bytes);
                assert_eq!(r.i64().unwrap(), 49, "wrapper offset: the last inner one");
                let size = r.i32().unwrap() as usize;
                assert_eq!(size, bytes.len() - 12, "one wrapper message");
                r.u32().unwrap();
                assert_eq!(r.i8().unwrap(), magic.byte());
                assert_eq!(r.i8().unwrap(), codec_attribute(codec));
                if magic == Magic::V1 {
                    assert_eq!(r.i64().unwrap(), 1012, "the newest timestamp");
                }
                assert_eq!(r.nullable_bytes().unwrap(), None, "a wrapper has no key");
                check_round_trip(magic, codec, &msgs);
            }
        }
    }

    #[test]
    fn lz4_frames_carry_each_versions_header_checksum_and_no_content_size() {
        let msgs: Vec<_> = (0..20).map(|_| (1, None, Some(vec![b'y'; 64]))).collect();
        for (magic, broken) in [(Magic::V0, true), (Magic::V1, false)] {
            let (bytes, _) = write(magic, Codec::Lz4, &msgs);
            let at = 12 + 4 + 2 + if magic == Magic::V1 { 8 } else { 0 } + 4 + 4;
            let frame = &bytes[at..];
            assert_eq!(&frame[..4], &[0x04, 0x22, 0x4d, 0x18]);
            assert_eq!(frame[4] & 0x08, 0, "no content size");
            let hc = |from: usize| (twox_hash::XxHash32::oneshot(0, &frame[from..6]) >> 8) as u8;
            assert_eq!(frame[6], if broken { hc(0) } else { hc(4) }, "{magic:?}");
            assert_ne!(hc(0), hc(4), "the two checksums differ here");
        }
        // A magic-1 frame with Kafka 0.8's checksum is refused: only magic 0 tolerates it.
        let (mut bytes, _) = write(Magic::V1, Codec::Lz4, &msgs);
        let at = 12 + 4 + 2 + 8 + 4 + 4;
        assert!(compression::set_lz4_header_checksum(&mut bytes[at..], true));
        let body = 12;
        let crc = crc32fast::hash(&bytes[body + 4..]);
        put_u32_at(&mut bytes, body, crc);
        assert!(decode_message_set(&bytes, 1 << 20).is_err());
    }

    #[test]
    fn incompressible_or_failed_sets_are_written_plain() {
        let mut rng = 0x9e37_79b9_u64;
        let noise: Vec<u8> = (0..300)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        let msgs = vec![(3, Some(b"key".to_vec()), Some(noise))];
        let (bytes, outcome) = write(Magic::V1, Codec::Gzip, &msgs);
        assert!(
            matches!(outcome, CompressionOutcome::NotCompressible { .. }),
            "{outcome:?}"
        );
        let got = decode_message_set(&bytes, 1 << 20).unwrap();
        assert_eq!(got[0].wrapper, None);
        assert_eq!(got[0].key.as_deref(), Some(&b"key"[..]));
    }

    #[test]
    fn bad_input_is_refused() {
        let (good, _) = write(Magic::V0, Codec::None, &[(0, None, Some(b"abc".to_vec()))]);
        assert!(decode_message_set(&good, 1 << 20).is_ok());
        // Every truncation, and every single flipped bit after the offset (which no CRC
        // covers: the broker assigns it), fails cleanly.
        for n in 1..good.len() {
            assert!(
                decode_message_set(&good[..n], 1 << 20).is_err(),
                "truncated at {n}"
            );
        }
        for i in 64..good.len() * 8 {
            let mut bad = good.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(
                decode_message_set(&bad, 1 << 20).is_err(),
                "bit {i} flipped"
            );
        }
        // A size beyond the bytes present is refused before anything is allocated.
        let mut huge = good.clone();
        put_i32_at(&mut huge, 8, i32::MAX);
        assert!(matches!(
            decode_message_set(&huge, 1 << 20),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn wrappers_nest_once_and_decompress_within_the_limit() {
        let msgs: Vec<_> = (0..100).map(|_| (1, None, Some(vec![0u8; 1000]))).collect();
        let (bytes, _) = write(Magic::V1, Codec::Gzip, &msgs);
        assert!(matches!(
            decode_message_set(&bytes, 10_000),
            Err(DecodeError::InvalidRecord(
                "messages decompress beyond the limit"
            ))
        ));
        // A wrapper around a wrapper.
        let (mut buf, mut scratch) = (Vec::new(), Vec::new());
        let gz = Compression::new(Codec::Gzip, None).unwrap();
        let mut w = MessageSetWriter::begin(Magic::V1, gz, &mut scratch);
        w.append(&mut scratch, 1, None, Some(&bytes));
        // Make the inner message a wrapper itself: patch its attributes and CRC.
        scratch[17] = 1;
        let crc = crc32fast::hash(&scratch[16..]);
        put_u32_at(&mut scratch, 12, crc);
        let _ = w.finish(&mut buf, &scratch, 100);
        assert!(decode_message_set(&buf, 1 << 24).is_err());
    }

    fn field() -> impl Strategy<Value = Option<Vec<u8>>> {
        prop_oneof![
            1 => Just(None),
            4 => proptest::collection::vec(any::<u8>(), 0..300).prop_map(Some),
            2 => (0..200usize, any::<u8>()).prop_map(|(n, b)| Some(vec![b; n])),
        ]
    }

    proptest! {
        #[test]
        fn every_codec_and_version_round_trips(
            msgs in proptest::collection::vec((0..i64::MAX, field(), field()), 1..40),
            codec in prop_oneof![Just(Codec::None), Just(Codec::Gzip), Just(Codec::Snappy), Just(Codec::Lz4)],
            v1 in any::<bool>(),
        ) {
            check_round_trip(if v1 { Magic::V1 } else { Magic::V0 }, codec, &msgs);
        }

        #[test]
        fn the_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode_message_set(&bytes, 1 << 16);
        }
    }
}
