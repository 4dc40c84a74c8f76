//! The strict RecordBatch v2 decoder, used by tests and fuzzing to check what the writer
//! writes: every CRC-32C verified, every length checked against the bytes present, all
//! four codecs decompressed up to a limit, and no allocation sized by a field before the
//! bytes it counts have arrived.

use crate::kafka::compression::{self, Codec, CompressError};
use crate::kafka::primitives::{DecodeError, Reader};

use super::{ATTR_COMPRESSION_MASK, BATCH_HEADER_LEN, LENGTH_FIELD_END, MAGIC};

/// A decoded batch, header fields included so tests can check every byte we write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedBatch {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records: Vec<DecodedRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRecord {
    pub offset_delta: i32,
    /// Absolute timestamp (base timestamp plus the record's delta).
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Smallest possible record: length, attributes, timestamp delta, offset delta, key length,
/// value length, header count, one byte each.
const MIN_RECORD_LEN: usize = 7;

/// `decode_batches` decompresses at most this many record bytes per batch.
pub const DEFAULT_MAX_DECOMPRESSED_LEN: usize = 16 << 20;

/// Decodes a sequence of v2 batches, verifying each CRC-32C and that every length agrees
/// with the bytes present. Compressed batches (any of the four codecs) are decompressed,
/// up to `DEFAULT_MAX_DECOMPRESSED_LEN` bytes each.
pub fn decode_batches(bytes: &[u8]) -> Result<Vec<DecodedBatch>, DecodeError> {
    decode_batches_limited(bytes, DEFAULT_MAX_DECOMPRESSED_LEN)
}

/// `decode_batches` with the limit on each batch's decompressed records chosen by the
/// caller.
pub fn decode_batches_limited(
    bytes: &[u8],
    max_decompressed: usize,
) -> Result<Vec<DecodedBatch>, DecodeError> {
    let mut r = Reader::new(bytes);
    let mut batches = Vec::new();
    while !r.is_empty() {
        let base_offset = r.i64()?;
        let batch_length = r.i32()?;
        let batch_length = usize::try_from(batch_length)
            .ok()
            .filter(|&n| n >= BATCH_HEADER_LEN - LENGTH_FIELD_END)
            .ok_or(DecodeError::InvalidLength(i64::from(batch_length)))?;
        let body = r.bytes(batch_length)?;
        batches.push(decode_batch_body(base_offset, body, max_decompressed)?);
    }
    Ok(batches)
}

/// Decodes one batch from partition_leader_epoch to its end.
fn decode_batch_body(
    base_offset: i64,
    body: &[u8],
    max_decompressed: usize,
) -> Result<DecodedBatch, DecodeError> {
    let mut r = Reader::new(body);
    let partition_leader_epoch = r.i32()?;
    let magic = r.i8()?;
    if magic != MAGIC {
        return Err(DecodeError::UnsupportedMagic(magic));
    }
    let stored = r.u32()?;
    let computed = crc32c::crc32c(r.rest());
    if stored != computed {
        return Err(DecodeError::CrcMismatch { stored, computed });
    }
    let attributes = r.i16()?;
    let last_offset_delta = r.i32()?;
    let base_timestamp = r.i64()?;
    let max_timestamp = r.i64()?;
    let producer_id = r.i64()?;
    let producer_epoch = r.i16()?;
    let base_sequence = r.i32()?;
    let count = r.i32()?;
    let count = usize::try_from(count).map_err(|_| DecodeError::InvalidLength(count.into()))?;
    let codec_id = attributes & ATTR_COMPRESSION_MASK;
    let codec =
        Codec::from_attribute(codec_id).ok_or(DecodeError::UnsupportedCompression(codec_id))?;
    let decompressed;
    let mut r = if codec == Codec::None {
        r
    } else {
        let mut out = Vec::new();
        compression::decompress(codec, r.rest(), &mut out, max_decompressed).map_err(|e| {
            DecodeError::InvalidRecord(match e {
                CompressError::TooLarge { .. } => "records decompress beyond the limit",
                _ => "compressed records are corrupt",
            })
        })?;
        decompressed = out;
        Reader::new(&decompressed)
    };
    if count.saturating_mul(MIN_RECORD_LEN) > r.remaining() {
        return Err(DecodeError::ArrayTooLong {
            count,
            remaining: r.remaining(),
        });
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let len = r.varint()?;
        let len = usize::try_from(len).map_err(|_| DecodeError::InvalidLength(len.into()))?;
        records.push(decode_record(r.bytes(len)?, base_timestamp)?);
    }
    r.finish()?;
    Ok(DecodedBatch {
        base_offset,
        partition_leader_epoch,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records,
    })
}

/// A varint length that may be -1 (null) but no other negative value.
fn nullable_len(r: &mut Reader<'_>) -> Result<Option<usize>, DecodeError> {
    match r.varint()? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .map(Some)
            .map_err(|_| DecodeError::InvalidLength(n.into())),
    }
}

fn nullable_field(r: &mut Reader<'_>) -> Result<Option<Vec<u8>>, DecodeError> {
    let len = nullable_len(r)?;
    Ok(len.map(|n| r.bytes(n)).transpose()?.map(<[u8]>::to_vec))
}

fn decode_record(body: &[u8], base_timestamp: i64) -> Result<DecodedRecord, DecodeError> {
    let mut r = Reader::new(body);
    let _attributes = r.i8()?;
    let timestamp_delta = r.varlong()?;
    let offset_delta = r.varint()?;
    let key = nullable_field(&mut r)?;
    let value = nullable_field(&mut r)?;
    let header_count = r.varint()?;
    let header_count = usize::try_from(header_count)
        .map_err(|_| DecodeError::InvalidLength(header_count.into()))?;
    // Smallest header: key length 0 and value length -1, one byte each.
    if header_count.saturating_mul(2) > r.remaining() {
        return Err(DecodeError::ArrayTooLong {
            count: header_count,
            remaining: r.remaining(),
        });
    }
    let mut headers = Vec::with_capacity(header_count);
    for _ in 0..header_count {
        let key = nullable_field(&mut r)?.ok_or(DecodeError::InvalidRecord("null header key"))?;
        let value = nullable_field(&mut r)?;
        headers.push((key, value));
    }
    r.finish()?;
    Ok(DecodedRecord {
        offset_delta,
        timestamp: base_timestamp.wrapping_add(timestamp_delta),
        key,
        value,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::{
        CompressionOutcome, RecordBatchWriter, CRC_OFFSET, CRC_START, RECORD_COUNT_OFFSET,
    };
    use super::*;
    use crate::kafka::primitives::{put_i32_at, put_u32_at};
    use proptest::prelude::*;

    #[test]
    fn every_flipped_bit_after_the_crc_is_detected() {
        let buf = encode(5, &sample());
        for i in CRC_START..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    matches!(decode_batches(&bad), Err(DecodeError::CrcMismatch { .. })),
                    "byte {i} bit {bit}"
                );
            }
        }
        // Flipping the stored CRC itself is caught too.
        let mut bad = buf.clone();
        bad[CRC_OFFSET] ^= 0x40;
        assert!(matches!(
            decode_batches(&bad),
            Err(DecodeError::CrcMismatch { .. })
        ));
    }

    #[test]
    fn every_truncation_fails_cleanly() {
        let buf = encode(5, &sample());
        for len in 1..buf.len() {
            assert!(decode_batches(&buf[..len]).is_err(), "len {len}");
        }
        assert_eq!(decode_batches(&[]).unwrap(), Vec::new());
    }

    #[test]
    fn mislabelled_or_unknown_codecs_are_errors_not_misread() {
        // Uncompressed records under a gzip label: not a gzip stream.
        let mut buf = Vec::new();
        let mut w = RecordBatchWriter::begin(&mut buf, 0, 1);
        w.append(&mut buf, 0, None, Some(b"x"));
        w.finish(&mut buf);
        assert_eq!(
            decode_batches(&buf),
            Err(DecodeError::InvalidRecord("compressed records are corrupt"))
        );
        let mut buf = Vec::new();
        let mut w = RecordBatchWriter::begin(&mut buf, 0, 5);
        w.append(&mut buf, 0, None, Some(b"x"));
        w.finish(&mut buf);
        assert_eq!(
            decode_batches(&buf),
            Err(DecodeError::UnsupportedCompression(5))
        );
    }

    #[test]
    fn decompression_is_bounded_by_the_limit() {
        let recs = compressible_records(50);
        let mut buf = Vec::new();
        let CompressionOutcome::Compressed { uncompressed, .. } =
            encode_with(&mut buf, codec_only(Codec::Zstd), 100, &recs)
        else {
            panic!("text compresses");
        };
        assert_eq!(
            decode_batches_limited(&buf, uncompressed - 1),
            Err(DecodeError::InvalidRecord(
                "records decompress beyond the limit"
            ))
        );
        assert_eq!(decode_batches_limited(&buf, uncompressed).unwrap().len(), 1);
    }

    #[test]
    fn huge_record_count_fails_without_allocating() {
        let mut buf = encode(0, &sample());
        put_i32_at(&mut buf, RECORD_COUNT_OFFSET, i32::MAX);
        let crc = crc32c::crc32c(&buf[CRC_START..]);
        put_u32_at(&mut buf, CRC_OFFSET, crc);
        assert!(matches!(
            decode_batches(&buf),
            Err(DecodeError::ArrayTooLong { .. })
        ));
    }

    proptest! {
        #[test]
        fn prop_decoder_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_batches(&data);
        }

        #[test]
        fn prop_single_byte_corruption_is_detected(
            recs in proptest::collection::vec(record_strategy(), 1..5),
            pos in any::<proptest::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let buf = encode(0, &recs);
            let i = CRC_START + pos.index(buf.len() - CRC_START);
            let mut bad = buf.clone();
            bad[i] ^= flip;
            prop_assert!(decode_batches(&bad).is_err());
        }
    }
}
