//! Record-batch compression: the four Kafka codecs (gzip, snappy, lz4, zstd) as pure
//! `&[u8]` in, appended `Vec<u8>` out, with decompression bounded by the caller's limit.
//!
//! Formats, as Kafka's clients and brokers read them:
//! - gzip: a gzip stream (RFC 1952), what Java's `GZIPInputStream` and librdkafka read.
//! - snappy: a raw Snappy block, no framing, as Dory and librdkafka's producer write it.
//!   librdkafka's reader takes raw blocks and also snappy-java's xerial framing (it checks
//!   for the `\x82SNAPPY\0` magic); Java's snappy-java input stream falls back to a raw block
//!   when the magic is absent. We decode both.
//! - lz4: the LZ4 *frame* format with a correct header checksum (KIP-57, Kafka ≥ 0.10 with
//!   RecordBatch v2), independent 64 KiB blocks (Java's reader decodes each block on its
//!   own), the content size in the header, no content checksum (the batch CRC-32C already
//!   covers every byte).
//! - zstd: a standard zstd frame (Produce v7+, KIP-110).

use std::cell::RefCell;
use std::fmt;
use std::io::{self, Read, Write};
use std::ops::RangeInclusive;
use std::str::FromStr;

use thiserror::Error;

/// A record-batch compression codec; `attribute()` is its value in the low three bits of
/// the batch attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Codec {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    pub const ALL: [Codec; 5] = [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ];

    /// The codec's id in the batch attributes (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).
    pub const fn attribute(self) -> i16 {
        match self {
            Codec::None => 0,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        }
    }

    /// The codec for a codec id (the attributes' low three bits); `None` for ids 5..=7
    /// and anything else.
    pub const fn from_attribute(id: i16) -> Option<Codec> {
        match id {
            0 => Some(Codec::None),
            1 => Some(Codec::Gzip),
            2 => Some(Codec::Snappy),
            3 => Some(Codec::Lz4),
            4 => Some(Codec::Zstd),
            _ => None,
        }
    }

    /// The name used in configuration and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// The lowest Produce version that may carry batches of this codec: brokers reject
    /// zstd below v7 (KIP-110) with UNSUPPORTED_COMPRESSION_TYPE; gzip, snappy and lz4
    /// (Kafka 0.8.2 on) go with every version.
    pub const fn min_produce_version(self) -> i16 {
        match self {
            Codec::Zstd => 7,
            _ => 0,
        }
    }

    /// The levels `compress` accepts for this codec, or `None` if the codec has no levels
    /// (a level given for it is ignored). gzip: -1 (zlib's default, 6) or 0..=9; zstd:
    /// zstd's own range (negative levels are the fast ones; 0 means zstd's default, 3).
    pub fn level_range(self) -> Option<RangeInclusive<i32>> {
        match self {
            Codec::Gzip => Some(-1..=9),
            Codec::Zstd => Some(zstd::zstd_safe::min_c_level()..=zstd::zstd_safe::max_c_level()),
            Codec::None | Codec::Snappy | Codec::Lz4 => None,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Codec {
    type Err = CompressError;

    /// Parses a codec name, case-insensitively, as Dory's config does.
    fn from_str(s: &str) -> Result<Codec, CompressError> {
        Codec::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| CompressError::UnknownCodec(s.to_owned()))
    }
}

/// A codec and its optional level: what one topic's batches are compressed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Compression {
    pub codec: Codec,
    pub level: Option<i32>,
}

impl Compression {
    pub const NONE: Compression = Compression {
        codec: Codec::None,
        level: None,
    };

    /// A codec with a level, checked against `Codec::level_range`. A level for a codec
    /// without levels is an error here so the config can warn about it (as Dory does for
    /// snappy) and then use `Compression { codec, level: None }`.
    pub fn new(codec: Codec, level: Option<i32>) -> Result<Compression, CompressError> {
        if let Some(level) = level {
            match codec.level_range() {
                Some(range) if range.contains(&level) => {}
                _ => return Err(CompressError::InvalidLevel { codec, level }),
            }
        }
        Ok(Compression { codec, level })
    }
}

/// What can go wrong while compressing or decompressing.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CompressError {
    #[error("unknown compression codec {0:?}")]
    UnknownCodec(String),
    #[error("compression level {level} is out of range for {codec}")]
    InvalidLevel { codec: Codec, level: i32 },
    #[error("{codec} compression failed: {reason}")]
    Compress { codec: Codec, reason: String },
    #[error("{codec} data is corrupt: {reason}")]
    Corrupt { codec: Codec, reason: String },
    #[error("{codec} data decompresses to more than {limit} bytes")]
    TooLarge { codec: Codec, limit: usize },
}

impl CompressError {
    fn compress(codec: Codec, reason: impl fmt::Display) -> CompressError {
        CompressError::Compress {
            codec,
            reason: reason.to_string(),
        }
    }

    fn corrupt(codec: Codec, reason: impl fmt::Display) -> CompressError {
        CompressError::Corrupt {
            codec,
            reason: reason.to_string(),
        }
    }
}

/// A snappy copy element of at most 3 bytes expands to at most 64 bytes, so no valid raw
/// block decompresses to more than ~22 times its size; a header claiming more is corrupt,
/// and we refuse to allocate for it.
const SNAPPY_MAX_EXPANSION: usize = 32;

/// snappy-java's stream header: magic, version, compatible version.
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\0";
const XERIAL_HEADER_LEN: usize = 16;

/// zstd decoding accepts windows of at least this log size whatever the output limit, so
/// frames from streaming compressors that declare no content size (Java's zstd-jni at the
/// default level uses a 2 MiB window) still decode.
const ZSTD_MIN_WINDOW_LOG: u32 = 23;
/// zstd's own default decoding limit (128 MiB).
const ZSTD_MAX_WINDOW_LOG: u32 = 27;

thread_local! {
    // Compression contexts are reused per thread (each dispatcher compresses on its own
    // thread): a zstd context is hundreds of KiB to MiBs, too much to allocate per batch.
    static ZSTD: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static SNAPPY: RefCell<Option<snap::raw::Encoder>> = const { RefCell::new(None) };
}

/// Compresses `input` with `codec` and appends the result to `out`. `level` must be within
/// `codec.level_range()` (`None` = the codec's default); it is ignored for codecs without
/// levels. On error `out` is left as it was.
pub fn compress(
    codec: Codec,
    level: Option<i32>,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CompressError> {
    let start = out.len();
    let result = match codec {
        Codec::None => {
            out.extend_from_slice(input);
            Ok(())
        }
        Codec::Gzip => compress_gzip(level, input, out),
        Codec::Snappy => compress_snappy(input, out),
        Codec::Lz4 => compress_lz4(input, out),
        Codec::Zstd => compress_zstd(level, input, out),
    };
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn compress_gzip(level: Option<i32>, input: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
    let level = match level {
        None | Some(-1) => flate2::Compression::default(),
        Some(l @ 0..=9) => flate2::Compression::new(l.unsigned_abs()),
        Some(level) => {
            return Err(CompressError::InvalidLevel {
                codec: Codec::Gzip,
                level,
            })
        }
    };
    let mut enc = flate2::write::GzEncoder::new(out, level);
    enc.write_all(input)
        .and_then(|()| enc.try_finish())
        .map_err(|e| CompressError::compress(Codec::Gzip, e))
}

fn compress_snappy(input: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
    let bound = snap::raw::max_compress_len(input.len());
    if bound == 0 && !input.is_empty() {
        return Err(CompressError::compress(Codec::Snappy, "input too large"));
    }
    let start = out.len();
    out.resize(start + bound, 0);
    let n = SNAPPY.with(|cell| {
        let mut cell = cell.borrow_mut();
        let enc = cell.get_or_insert_with(snap::raw::Encoder::new);
        enc.compress(input, &mut out[start..])
    });
    let n = n.map_err(|e| CompressError::compress(Codec::Snappy, e))?;
    out.truncate(start + n);
    Ok(())
}

fn compress_lz4(input: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
    // The reference C library (through the `lz4` crate) writes the frame: on log-like text
    // it compresses about 1.5 times as fast as `lz4_flex`, which still does the decoding
    // (bounded, and of untrusted bytes). The same frame either way (doc/performance.md,
    // "Round nine").
    let fail = |e| CompressError::compress(Codec::Lz4, e);
    let mut enc = lz4::EncoderBuilder::new()
        // The LZ4 frame default, and what Java and librdkafka write.
        .block_size(lz4::BlockSize::Max64KB)
        .block_mode(lz4::BlockMode::Independent)
        .block_checksum(lz4::liblz4::BlockChecksum::NoBlockChecksum)
        .checksum(lz4::ContentChecksum::NoChecksum)
        .content_size(u64::try_from(input.len()).unwrap_or(0))
        .build(out)
        .map_err(fail)?;
    enc.write_all(input).map_err(fail)?;
    enc.finish().1.map_err(fail)
}

/// An LZ4 frame for MessageSet v0/v1 (Kafka 0.8–0.10): 64 KiB independent blocks, no
/// checksums and, unlike [`compress`]'s, no content size, which Kafka's LZ4 stream of
/// those versions does not accept. `kafka_0_8_checksum`: the header checksum is computed
/// the way Kafka 0.8–0.9 did (over the magic number too, KAFKA-3160), as brokers of those
/// versions require for magic-0 messages.
pub fn compress_lz4_legacy(
    input: &[u8],
    out: &mut Vec<u8>,
    kafka_0_8_checksum: bool,
) -> Result<(), CompressError> {
    let start = out.len();
    let fail = |e| CompressError::compress(Codec::Lz4, e);
    let result = (|| {
        let mut enc = lz4::EncoderBuilder::new()
            .block_size(lz4::BlockSize::Max64KB)
            .block_mode(lz4::BlockMode::Independent)
            .block_checksum(lz4::liblz4::BlockChecksum::NoBlockChecksum)
            .checksum(lz4::ContentChecksum::NoChecksum)
            .content_size(0)
            .build(&mut *out)
            .map_err(fail)?;
        enc.write_all(input).map_err(fail)?;
        enc.finish().1.map_err(fail)
    })();
    if let Err(e) = result {
        out.truncate(start);
        return Err(e);
    }
    if kafka_0_8_checksum && !set_lz4_header_checksum(&mut out[start..], true) {
        out.truncate(start);
        return Err(CompressError::compress(
            Codec::Lz4,
            "no frame header written",
        ));
    }
    Ok(())
}

/// Rewrites the header checksum of the LZ4 frame `frame` begins with: the standard one, or
/// with `kafka_0_8` the one Kafka 0.8–0.9 computed (over the magic number and the
/// descriptor instead of the descriptor alone). Reading a magic-0 message set, the
/// standard checksum is set first so either framing decodes. False if `frame` does not
/// start with a whole LZ4 frame header.
pub fn set_lz4_header_checksum(frame: &mut [u8], kafka_0_8: bool) -> bool {
    const MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];
    if frame.len() < 7 || frame[..4] != MAGIC {
        return false;
    }
    let flg = frame[4];
    // FLG, BD, then the content size (8 bytes) and dictionary id (4) when flagged.
    let hc_at = 6 + if flg & 0x08 != 0 { 8 } else { 0 } + if flg & 0x01 != 0 { 4 } else { 0 };
    if frame.len() <= hc_at {
        return false;
    }
    let from = if kafka_0_8 { 0 } else { 4 };
    let hash = twox_hash::XxHash32::oneshot(0, &frame[from..hc_at]);
    frame[hc_at] = (hash >> 8) as u8;
    true
}

fn compress_zstd(level: Option<i32>, input: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
    let level = level.unwrap_or(zstd::DEFAULT_COMPRESSION_LEVEL);
    let start = out.len();
    out.resize(start + zstd::compress_bound(input.len()), 0);
    let n = ZSTD.with(|cell| -> io::Result<usize> {
        let mut cell = cell.borrow_mut();
        let ctx = match cell.as_mut() {
            Some(ctx) => {
                ctx.set_compression_level(level)?;
                ctx
            }
            None => cell.insert(zstd::bulk::Compressor::new(level)?),
        };
        ctx.compress_to_buffer(input, &mut out[start..])
    });
    let n = n.map_err(|e| CompressError::compress(Codec::Zstd, e))?;
    out.truncate(start + n);
    Ok(())
}

/// Decompresses `input` (data of `codec`) and appends the result to `out`, failing with
/// `TooLarge` rather than appending more than `max_out` bytes. Memory use is bounded by
/// `max_out` plus per-codec working buffers of fixed maximum size (lz4: one block, at most
/// 8 MiB; zstd: a window of at most `max(max_out, 8 MiB)`, never above 128 MiB). On
/// error `out` is left as it was.
pub fn decompress(
    codec: Codec,
    input: &[u8],
    out: &mut Vec<u8>,
    max_out: usize,
) -> Result<(), CompressError> {
    let start = out.len();
    let result = match codec {
        Codec::None => {
            if input.len() > max_out {
                Err(CompressError::TooLarge {
                    codec,
                    limit: max_out,
                })
            } else {
                out.extend_from_slice(input);
                Ok(())
            }
        }
        Codec::Gzip => read_bounded(
            codec,
            flate2::read::MultiGzDecoder::new(input),
            out,
            max_out,
        ),
        Codec::Snappy => decompress_snappy(input, out, max_out),
        Codec::Lz4 => read_bounded(
            codec,
            lz4_flex::frame::FrameDecoder::new(input),
            out,
            max_out,
        ),
        Codec::Zstd => decompress_zstd(input, out, max_out),
    };
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Reads a decoder to its end into `out`, at most `max_out` bytes: one byte more is asked
/// for, so an overlong stream is detected without reading (or allocating) any further.
fn read_bounded(
    codec: Codec,
    decoder: impl Read,
    out: &mut Vec<u8>,
    max_out: usize,
) -> Result<(), CompressError> {
    let start = out.len();
    let limit = u64::try_from(max_out).unwrap_or(u64::MAX).saturating_add(1);
    decoder
        .take(limit)
        .read_to_end(out)
        .map_err(|e| CompressError::corrupt(codec, e))?;
    if out.len() - start > max_out {
        return Err(CompressError::TooLarge {
            codec,
            limit: max_out,
        });
    }
    Ok(())
}

fn decompress_snappy(input: &[u8], out: &mut Vec<u8>, max_out: usize) -> Result<(), CompressError> {
    let Some(chunks) = input
        .strip_prefix(XERIAL_MAGIC)
        .and_then(|_| input.get(XERIAL_HEADER_LEN..))
    else {
        return snappy_block(input, out, max_out);
    };
    // snappy-java framing: after the header, chunks of a big-endian u32 length and a raw
    // block.
    let start = out.len();
    let mut rest = chunks;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(|| {
            CompressError::corrupt(Codec::Snappy, "truncated xerial chunk length")
        })?;
        let len = usize::try_from(u32::from_be_bytes(*len)).unwrap_or(usize::MAX);
        if len > tail.len() {
            return Err(CompressError::corrupt(
                Codec::Snappy,
                "truncated xerial chunk",
            ));
        }
        let (block, tail) = tail.split_at(len);
        snappy_block(block, out, max_out.saturating_sub(out.len() - start))?;
        rest = tail;
    }
    Ok(())
}

/// Decodes one raw snappy block, checking its declared length before allocating for it.
fn snappy_block(block: &[u8], out: &mut Vec<u8>, max_out: usize) -> Result<(), CompressError> {
    let len =
        snap::raw::decompress_len(block).map_err(|e| CompressError::corrupt(Codec::Snappy, e))?;
    if len > max_out {
        return Err(CompressError::TooLarge {
            codec: Codec::Snappy,
            limit: max_out,
        });
    }
    if len > block.len().saturating_mul(SNAPPY_MAX_EXPANSION) {
        return Err(CompressError::corrupt(
            Codec::Snappy,
            "declared length exceeds what the block can hold",
        ));
    }
    let start = out.len();
    out.resize(start + len, 0);
    let n = snap::raw::Decoder::new()
        .decompress(block, &mut out[start..])
        .map_err(|e| CompressError::corrupt(Codec::Snappy, e))?;
    out.truncate(start + n);
    Ok(())
}

fn decompress_zstd(input: &[u8], out: &mut Vec<u8>, max_out: usize) -> Result<(), CompressError> {
    let codec = Codec::Zstd;
    // A declared content size above the limit fails before any work; frames without one
    // are still bounded by `read_bounded`.
    if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(input) {
        if usize::try_from(size).map_or(true, |s| s > max_out) {
            return Err(CompressError::TooLarge {
                codec,
                limit: max_out,
            });
        }
    }
    // ceil(log2(max_out)), so the window (allocated from the frame header) stays near the
    // limit.
    let needed_log = usize::BITS - max_out.saturating_sub(1).leading_zeros();
    let window_log = needed_log.clamp(ZSTD_MIN_WINDOW_LOG, ZSTD_MAX_WINDOW_LOG);
    let mut decoder = zstd::stream::read::Decoder::with_buffer(input)
        .map_err(|e| CompressError::corrupt(codec, e))?;
    decoder
        .window_log_max(window_log)
        .map_err(|e| CompressError::corrupt(codec, e))?;
    read_bounded(codec, decoder, out, max_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Text-like data that every codec shrinks.
    fn compressible(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| b"the quick brown fox jumps over the lazy dog "[i % 44])
            .collect()
    }

    /// A deterministic pseudo-random byte stream (xorshift), incompressible.
    fn noise(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    fn roundtrip(codec: Codec, level: Option<i32>, data: &[u8]) -> Vec<u8> {
        let mut packed = b"prefix".to_vec();
        compress(codec, level, data, &mut packed).unwrap();
        assert_eq!(&packed[..6], b"prefix", "compress appends");
        let mut out = b"head".to_vec();
        decompress(codec, &packed[6..], &mut out, data.len()).unwrap();
        assert_eq!(&out[..4], b"head", "decompress appends");
        out.split_off(4)
    }

    #[test]
    fn attribute_ids_are_kafkas() {
        let ids: Vec<i16> = Codec::ALL.iter().map(|c| c.attribute()).collect();
        assert_eq!(ids, [0, 1, 2, 3, 4]);
        for c in Codec::ALL {
            assert_eq!(Codec::from_attribute(c.attribute()), Some(c));
            assert_eq!(c.name().parse::<Codec>(), Ok(c));
            assert_eq!(c.to_string(), c.name());
        }
        assert_eq!(Codec::from_attribute(5), None);
        assert_eq!("GZip".parse::<Codec>(), Ok(Codec::Gzip));
        assert!(matches!(
            "brotli".parse::<Codec>(),
            Err(CompressError::UnknownCodec(_))
        ));
        assert_eq!(Codec::Zstd.min_produce_version(), 7);
        assert_eq!(Codec::Lz4.min_produce_version(), 0);
    }

    #[test]
    fn levels_are_checked() {
        assert!(Compression::new(Codec::Gzip, Some(-1)).is_ok());
        assert!(Compression::new(Codec::Gzip, Some(9)).is_ok());
        assert!(Compression::new(Codec::Gzip, Some(10)).is_err());
        assert!(Compression::new(Codec::Zstd, Some(22)).is_ok());
        assert!(Compression::new(Codec::Zstd, Some(-5)).is_ok());
        assert!(Compression::new(Codec::Zstd, Some(23)).is_err());
        assert_eq!(
            Compression::new(Codec::Snappy, Some(1)),
            Err(CompressError::InvalidLevel {
                codec: Codec::Snappy,
                level: 1
            })
        );
        assert_eq!(
            Compression::new(Codec::Lz4, None),
            Ok(Compression {
                codec: Codec::Lz4,
                level: None
            })
        );
        let mut out = Vec::new();
        assert!(compress(Codec::Gzip, Some(12), b"x", &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn every_codec_roundtrips_and_shrinks_text() {
        let data = compressible(200_000);
        for codec in Codec::ALL {
            assert_eq!(roundtrip(codec, None, &data), data, "{codec}");
            assert_eq!(roundtrip(codec, None, b""), b"", "{codec} empty");
            assert_eq!(roundtrip(codec, None, b"x"), b"x", "{codec} one byte");
            let mut packed = Vec::new();
            compress(codec, None, &data, &mut packed).unwrap();
            if codec != Codec::None {
                assert!(packed.len() < data.len() / 10, "{codec}: {}", packed.len());
            }
        }
        for level in [-1, 0, 1, 9] {
            assert_eq!(roundtrip(Codec::Gzip, Some(level), &data), data);
        }
        for level in [-5, 1, 3, 19] {
            assert_eq!(roundtrip(Codec::Zstd, Some(level), &data), data);
        }
    }

    #[test]
    fn formats_are_the_standard_ones() {
        let data = compressible(1000);
        let mut out = Vec::new();
        compress(Codec::Gzip, None, &data, &mut out).unwrap();
        assert_eq!(&out[..3], [0x1f, 0x8b, 8], "gzip magic, deflate");

        out.clear();
        compress(Codec::Snappy, None, &data, &mut out).unwrap();
        // A raw block starts with the uncompressed length as a varint (1000 = e8 07).
        assert_eq!(&out[..2], [0xe8, 0x07]);
        assert_eq!(
            snap::raw::Decoder::new().decompress_vec(&out).unwrap(),
            data
        );

        out.clear();
        compress(Codec::Lz4, None, &data, &mut out).unwrap();
        assert_eq!(&out[..4], [0x04, 0x22, 0x4d, 0x18], "lz4 frame magic");
        // FLG: version 01, independent blocks, content size; no checksums, no dict id.
        assert_eq!(out[4], 0b0110_1000);
        // BD: 64 KiB maximum block size.
        assert_eq!(out[5], 0x40);
        assert_eq!(&out[6..14], 1000u64.to_le_bytes());
        // Header checksum: second byte of xxh32 over the descriptor (FLG..content size),
        // the KIP-57 fix (the pre-0.10 Kafka bug hashed the magic too).
        let hc = (twox_xxh32(&out[4..14]) >> 8) as u8;
        assert_eq!(out[14], hc);

        out.clear();
        compress(Codec::Zstd, None, &data, &mut out).unwrap();
        assert_eq!(&out[..4], [0x28, 0xb5, 0x2f, 0xfd], "zstd frame magic");
        assert_eq!(zstd::decode_all(&out[..]).unwrap(), data);
    }

    /// xxHash32 with seed 0, written out here so the header-checksum test does not use
    /// the encoder's own hasher.
    fn twox_xxh32(data: &[u8]) -> u32 {
        const P1: u32 = 2_654_435_761;
        const P2: u32 = 2_246_822_519;
        const P3: u32 = 3_266_489_917;
        const P4: u32 = 668_265_263;
        const P5: u32 = 374_761_393;
        assert!(data.len() < 16, "short-input path only");
        let mut h = P5.wrapping_add(data.len() as u32);
        let mut rest = data;
        while rest.len() >= 4 {
            let k = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            h = h
                .wrapping_add(k.wrapping_mul(P3))
                .rotate_left(17)
                .wrapping_mul(P4);
            rest = &rest[4..];
        }
        for &b in rest {
            h = h
                .wrapping_add(u32::from(b).wrapping_mul(P5))
                .rotate_left(11)
                .wrapping_mul(P1);
        }
        h ^= h >> 15;
        h = h.wrapping_mul(P2);
        h ^= h >> 13;
        h = h.wrapping_mul(P3);
        h ^ (h >> 16)
    }

    #[test]
    fn xxh32_known_vectors() {
        // Published xxHash32 (seed 0) values: "" and "abc".
        assert_eq!(twox_xxh32(b""), 0x02CC_5D05);
        assert_eq!(twox_xxh32(b"abc"), 0x32D1_53FF);
    }

    #[test]
    fn lz4_blocks_are_independent_and_64k() {
        let data = compressible(300_000);
        let mut out = Vec::new();
        compress(Codec::Lz4, None, &data, &mut out).unwrap();
        // Walk the blocks: each is at most 64 KiB uncompressed, decodable on its own.
        let mut pos = 15;
        let mut total = 0;
        loop {
            let size = u32::from_le_bytes(out[pos..pos + 4].try_into().unwrap());
            pos += 4;
            if size == 0 {
                break;
            }
            let len = (size & 0x7fff_ffff) as usize;
            let block = &out[pos..pos + len];
            let plain = if size & 0x8000_0000 != 0 {
                block.to_vec()
            } else {
                lz4_flex::block::decompress(block, 64 * 1024).unwrap()
            };
            assert!(plain.len() <= 64 * 1024);
            assert_eq!(plain, data[total..total + plain.len()]);
            total += plain.len();
            pos += len;
        }
        assert_eq!(total, data.len());
        assert_eq!(pos, out.len(), "no content checksum after the end mark");
    }

    #[test]
    fn decompression_is_bounded() {
        let data = compressible(100_000);
        for codec in Codec::ALL {
            let mut packed = Vec::new();
            compress(codec, None, &data, &mut packed).unwrap();
            let mut out = b"keep".to_vec();
            assert_eq!(
                decompress(codec, &packed, &mut out, data.len() - 1),
                Err(CompressError::TooLarge {
                    codec,
                    limit: data.len() - 1
                }),
                "{codec}"
            );
            assert_eq!(out, b"keep", "{codec}: output restored");
            decompress(codec, &packed, &mut out, data.len()).unwrap();
            assert_eq!(out.len(), 4 + data.len());
        }
    }

    #[test]
    fn zstd_without_content_size_is_bounded_too() {
        let data = compressible(100_000);
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_contentsize(false).unwrap();
        enc.write_all(&data).unwrap();
        let packed = enc.finish().unwrap();
        assert!(matches!(
            zstd::zstd_safe::get_frame_content_size(&packed),
            Ok(None)
        ));
        let mut out = Vec::new();
        assert!(matches!(
            decompress(Codec::Zstd, &packed, &mut out, 50_000),
            Err(CompressError::TooLarge { .. })
        ));
        assert!(out.is_empty());
        decompress(Codec::Zstd, &packed, &mut out, 100_000).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn snappy_lying_length_header_is_refused_without_allocating() {
        // Declares 2^31 bytes in a 6-byte block.
        let block = [0x80, 0x80, 0x80, 0x80, 0x08, 0x00];
        let mut out = Vec::new();
        assert!(matches!(
            decompress(Codec::Snappy, &block, &mut out, usize::MAX),
            Err(CompressError::Corrupt { .. })
        ));
        assert!(matches!(
            decompress(Codec::Snappy, &block, &mut out, 1000),
            Err(CompressError::TooLarge { .. })
        ));
        assert_eq!(out.capacity(), 0);
    }

    #[test]
    fn snappy_xerial_framing_is_read() {
        let data = compressible(10_000);
        let mut framed = XERIAL_MAGIC.to_vec();
        framed.extend_from_slice(&1u32.to_be_bytes()); // version
        framed.extend_from_slice(&1u32.to_be_bytes()); // compatible version
        for chunk in data.chunks(4000) {
            let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            framed.extend_from_slice(&u32::try_from(block.len()).unwrap().to_be_bytes());
            framed.extend_from_slice(&block);
        }
        let mut out = Vec::new();
        decompress(Codec::Snappy, &framed, &mut out, data.len()).unwrap();
        assert_eq!(out, data);
        // The limit applies across chunks.
        out.clear();
        assert!(matches!(
            decompress(Codec::Snappy, &framed, &mut out, data.len() - 1),
            Err(CompressError::TooLarge { .. })
        ));
        // A truncated chunk is an error.
        assert!(matches!(
            decompress(
                Codec::Snappy,
                &framed[..framed.len() - 1],
                &mut out,
                data.len()
            ),
            Err(CompressError::Corrupt { .. })
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn incompressible_data_still_roundtrips() {
        let data = noise(50_000, 7);
        for codec in Codec::ALL {
            assert_eq!(roundtrip(codec, None, &data), data, "{codec}");
        }
    }

    proptest! {
        #[test]
        fn prop_roundtrip(data in proptest::collection::vec(any::<u8>(), 0..3000),
                          codec in proptest::sample::select(Codec::ALL.to_vec())) {
            prop_assert_eq!(roundtrip(codec, None, &data), data);
        }

        #[test]
        fn prop_decompress_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300),
                                        codec in proptest::sample::select(Codec::ALL.to_vec())) {
            let mut out = Vec::new();
            if decompress(codec, &data, &mut out, 4096).is_err() {
                prop_assert!(out.is_empty());
            }
            prop_assert!(out.len() <= 4096);
        }
    }
}
