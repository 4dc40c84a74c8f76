//! RecordBatch v2 (magic 2): the hot-path writer that encodes records straight into the
//! request buffer (header placeholders first, lengths and CRC-32C patched at the end), and
//! a strict decoder used by tests and fuzzing to check what we write.
//!
//! Layout (offsets from the batch start):
//! ```text
//!  0 base_offset i64          27 base_timestamp i64
//!  8 batch_length i32         35 max_timestamp i64
//! 12 partition_leader_epoch   43 producer_id i64
//! 16 magic i8 = 2             51 producer_epoch i16
//! 17 crc u32 (CRC-32C of 21..end)  53 base_sequence i32
//! 21 attributes i16           57 record_count i32
//! 23 last_offset_delta i32    61 records...
//! ```

use super::primitives::{
    put_i16, put_i32, put_i32_at, put_i64, put_i64_at, put_i8, put_u32, put_u32_at, put_varint,
    put_varlong, varint_len, varlong_len, DecodeError, Reader,
};

/// Size of the fixed batch header before the first record.
pub const BATCH_HEADER_LEN: usize = 61;
/// The batch_length field counts bytes after itself (from partition_leader_epoch on).
const LENGTH_FIELD_END: usize = 12;
const MAGIC: i8 = 2;

const BATCH_LENGTH_OFFSET: usize = 8;
#[cfg(test)]
const MAGIC_OFFSET: usize = 16;
const CRC_OFFSET: usize = 17;
/// The CRC covers attributes through the end of the batch.
const CRC_START: usize = 21;
const LAST_OFFSET_DELTA_OFFSET: usize = 23;
const MAX_TIMESTAMP_OFFSET: usize = 35;
const RECORD_COUNT_OFFSET: usize = 57;

/// Low three attribute bits select the compression codec (0 = none).
pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
/// Attribute bit 3: timestamp type (0 = CreateTime, 1 = LogAppendTime).
pub const ATTR_TIMESTAMP_TYPE: i16 = 0x08;

/// Writes one RecordBatch v2 into a buffer the caller owns.
///
/// ```text
/// let mut w = RecordBatchWriter::begin(buf, now_ms, 0);
/// w.append(buf, now_ms, None, Some(b"payload"));
/// w.finish(buf);
/// ```
///
/// COMPRESSION (later issue): records are appended uncompressed, straight after the header.
/// A compressed batch will append records into a scratch buffer instead and, in `finish`,
/// compress that into `buf` after the header; the codec goes in the low attribute bits.
#[derive(Debug)]
#[must_use = "a record batch must be finished to patch its lengths and CRC"]
pub struct RecordBatchWriter {
    start: usize,
    base_timestamp: i64,
    max_timestamp: Option<i64>,
    count: i32,
}

impl RecordBatchWriter {
    /// Writes the 61-byte batch header with placeholders: base_offset 0, leader epoch -1,
    /// no producer id/epoch/sequence (-1), timestamp type CreateTime. `attributes` carries
    /// the remaining attribute bits (compression, once implemented); the timestamp-type bit
    /// is always cleared.
    pub fn begin(buf: &mut Vec<u8>, base_timestamp: i64, attributes: i16) -> RecordBatchWriter {
        let start = buf.len();
        buf.reserve(BATCH_HEADER_LEN);
        put_i64(buf, 0); // base_offset: assigned by the broker
        put_i32(buf, 0); // batch_length: patched in finish
        put_i32(buf, -1); // partition_leader_epoch
        put_i8(buf, MAGIC);
        put_u32(buf, 0); // crc: patched in finish
        put_i16(buf, attributes & !ATTR_TIMESTAMP_TYPE);
        put_i32(buf, 0); // last_offset_delta: patched in finish
        put_i64(buf, base_timestamp);
        put_i64(buf, base_timestamp); // max_timestamp: patched in finish
        put_i64(buf, -1); // producer_id
        put_i16(buf, -1); // producer_epoch
        put_i32(buf, -1); // base_sequence
        put_i32(buf, 0); // record count: patched in finish
        debug_assert_eq!(buf.len() - start, BATCH_HEADER_LEN);
        RecordBatchWriter {
            start,
            base_timestamp,
            max_timestamp: None,
            count: 0,
        }
    }

    /// Number of records appended so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends one record whose key and value are contiguous slices.
    pub fn append(
        &mut self,
        buf: &mut Vec<u8>,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) {
        self.append_parts(
            buf,
            timestamp,
            key.map(<[u8]>::len),
            value.map(<[u8]>::len),
            |b| b.extend_from_slice(key.unwrap_or_default()),
            |b| b.extend_from_slice(value.unwrap_or_default()),
        );
    }

    /// Appends one record whose key and value are written by callbacks, so payloads can be
    /// copied from non-contiguous memory (e.g. a ring buffer) without staging them. The
    /// lengths are declared up front so the record's length varint is written first, with no
    /// patching. A callback is called only when its length is `Some`, and must append exactly
    /// that many bytes. The record has no headers.
    ///
    /// # Panics
    /// If a callback appends a different number of bytes than declared (the batch would be
    /// corrupt), or if the record is larger than `i32::MAX` bytes (callers cap messages far
    /// below that).
    pub fn append_parts(
        &mut self,
        buf: &mut Vec<u8>,
        timestamp: i64,
        key_len: Option<usize>,
        value_len: Option<usize>,
        write_key: impl FnOnce(&mut Vec<u8>),
        write_value: impl FnOnce(&mut Vec<u8>),
    ) {
        let timestamp_delta = timestamp.wrapping_sub(self.base_timestamp);
        let offset_delta = self.count;
        let key_len_field = length_field(key_len);
        let value_len_field = length_field(value_len);
        let body_len = 1 // attributes
            + varlong_len(timestamp_delta)
            + varint_len(offset_delta)
            + varint_len(key_len_field)
            + key_len.unwrap_or(0)
            + varint_len(value_len_field)
            + value_len.unwrap_or(0)
            + 1; // header count (0)
        let body_len = i32::try_from(body_len).expect("record size fits in i32");

        buf.reserve(varint_len(body_len) + body_len as usize);
        put_varint(buf, body_len);
        put_i8(buf, 0); // record attributes: unused
        put_varlong(buf, timestamp_delta);
        put_varint(buf, offset_delta);
        put_varint(buf, key_len_field);
        if let Some(len) = key_len {
            let before = buf.len();
            write_key(buf);
            assert_eq!(
                buf.len() - before,
                len,
                "key callback wrote its declared length"
            );
        }
        put_varint(buf, value_len_field);
        if let Some(len) = value_len {
            let before = buf.len();
            write_value(buf);
            assert_eq!(
                buf.len() - before,
                len,
                "value callback wrote its declared length"
            );
        }
        put_varint(buf, 0); // headers

        self.max_timestamp = Some(self.max_timestamp.map_or(timestamp, |m| m.max(timestamp)));
        self.count += 1;
    }

    /// Patches batch_length, last_offset_delta, max_timestamp, the record count and the
    /// CRC-32C. A batch needs at least one record; Kafka rejects empty ones.
    pub fn finish(self, buf: &mut [u8]) {
        debug_assert!(self.count > 0, "record batch has no records");
        let start = self.start;
        // COMPRESSION (later issue): compress the records here, before lengths and CRC.
        let batch_length = buf.len() - start - LENGTH_FIELD_END;
        debug_assert!(
            i32::try_from(batch_length).is_ok(),
            "batch exceeds i32::MAX"
        );
        put_i32_at(
            buf,
            start + BATCH_LENGTH_OFFSET,
            i32::try_from(batch_length).unwrap_or(i32::MAX),
        );
        put_i32_at(buf, start + LAST_OFFSET_DELTA_OFFSET, self.count - 1);
        put_i64_at(
            buf,
            start + MAX_TIMESTAMP_OFFSET,
            self.max_timestamp.unwrap_or(self.base_timestamp),
        );
        put_i32_at(buf, start + RECORD_COUNT_OFFSET, self.count);
        let crc = crc32c::crc32c(&buf[start + CRC_START..]);
        put_u32_at(buf, start + CRC_OFFSET, crc);
    }
}

/// A key or value length as its varint field: -1 for null.
fn length_field(len: Option<usize>) -> i32 {
    len.map_or(-1, |n| {
        i32::try_from(n).expect("record key/value length fits in i32")
    })
}

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

/// Decodes a sequence of uncompressed v2 batches, verifying each CRC-32C and that every
/// length agrees with the bytes present.
pub fn decode_batches(bytes: &[u8]) -> Result<Vec<DecodedBatch>, DecodeError> {
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
        batches.push(decode_batch_body(base_offset, body)?);
    }
    Ok(batches)
}

/// Decodes one batch from partition_leader_epoch to its end.
fn decode_batch_body(base_offset: i64, body: &[u8]) -> Result<DecodedBatch, DecodeError> {
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
    let codec = attributes & ATTR_COMPRESSION_MASK;
    if codec != 0 {
        // COMPRESSION (later issue): decompress `r.rest()` and parse records from that.
        return Err(DecodeError::UnsupportedCompression(codec));
    }
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
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;
    use proptest::prelude::*;

    type Rec = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

    fn encode(base_timestamp: i64, records: &[Rec]) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut w = RecordBatchWriter::begin(&mut buf, base_timestamp, 0);
        for (ts, k, v) in records {
            w.append(&mut buf, *ts, k.as_deref(), v.as_deref());
        }
        w.finish(&mut buf);
        buf
    }

    fn sample() -> Vec<Rec> {
        vec![
            (1_700_000_000_000, None, Some(b"hello".to_vec())),
            (1_700_000_000_005, Some(b"k".to_vec()), Some(Vec::new())),
            (1_699_999_999_990, Some(Vec::new()), None),
        ]
    }

    #[test]
    fn crc32c_known_vector() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn header_fields_and_roundtrip() {
        let recs = sample();
        let buf = encode(1_700_000_000_000, &recs);
        let batches = decode_batches(&buf).unwrap();
        assert_eq!(batches.len(), 1);
        let b = &batches[0];
        assert_eq!(b.base_offset, 0);
        assert_eq!(b.partition_leader_epoch, -1);
        assert_eq!(b.attributes, 0);
        assert_eq!(b.last_offset_delta, 2);
        assert_eq!(b.base_timestamp, 1_700_000_000_000);
        assert_eq!(b.max_timestamp, 1_700_000_000_005);
        assert_eq!(
            (b.producer_id, b.producer_epoch, b.base_sequence),
            (-1, -1, -1)
        );
        assert_eq!(buf[MAGIC_OFFSET], 2);
        for (i, (rec, (ts, k, v))) in b.records.iter().zip(&recs).enumerate() {
            assert_eq!(rec.offset_delta, i as i32);
            assert_eq!(rec.timestamp, *ts);
            assert_eq!(&rec.key, k);
            assert_eq!(&rec.value, v);
            assert!(rec.headers.is_empty());
        }
    }

    #[test]
    fn append_parts_matches_append() {
        let mut a = Vec::new();
        let mut w = RecordBatchWriter::begin(&mut a, 10, 0);
        w.append(&mut a, 11, Some(b"key"), Some(b"first-second"));
        w.finish(&mut a);

        let mut b = b"prefix".to_vec();
        let mut w = RecordBatchWriter::begin(&mut b, 10, 0);
        w.append_parts(
            &mut b,
            11,
            Some(3),
            Some(12),
            |buf| buf.extend_from_slice(b"key"),
            |buf| {
                buf.extend_from_slice(b"first-");
                buf.extend_from_slice(b"second");
            },
        );
        assert_eq!(w.len(), 1);
        w.finish(&mut b);
        assert_eq!(&b[6..], &a[..]);
    }

    #[test]
    #[should_panic(expected = "declared length")]
    fn append_parts_rejects_short_callback() {
        let mut b = Vec::new();
        let mut w = RecordBatchWriter::begin(&mut b, 0, 0);
        w.append_parts(&mut b, 0, None, Some(4), |_| {}, |buf| buf.push(1));
    }

    #[test]
    fn timestamp_type_bit_is_cleared() {
        let mut buf = Vec::new();
        let mut w = RecordBatchWriter::begin(&mut buf, 0, ATTR_TIMESTAMP_TYPE);
        w.append(&mut buf, 0, None, None);
        w.finish(&mut buf);
        assert_eq!(decode_batches(&buf).unwrap()[0].attributes, 0);
    }

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
    fn compressed_batches_are_reported_not_misread() {
        let mut buf = Vec::new();
        let mut w = RecordBatchWriter::begin(&mut buf, 0, 1);
        w.append(&mut buf, 0, None, Some(b"x"));
        w.finish(&mut buf);
        assert_eq!(
            decode_batches(&buf),
            Err(DecodeError::UnsupportedCompression(1))
        );
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

    #[test]
    fn kafka_protocol_decodes_our_batches() {
        let recs = sample();
        let mut buf = encode(1_700_000_000_000, &recs);
        // Two batches back to back, as in a multi-batch records field.
        buf.extend_from_slice(&encode(42, &[(43, Some(b"a".to_vec()), None)]));
        let mut slice = &buf[..];
        let sets = RecordBatchDecoder::decode_all(&mut slice).unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].version, 2);
        let got: Vec<Rec> = sets[0]
            .records
            .iter()
            .map(|r| {
                (
                    r.timestamp,
                    r.key.as_ref().map(|k| k.to_vec()),
                    r.value.as_ref().map(|v| v.to_vec()),
                )
            })
            .collect();
        assert_eq!(got, recs);
        for (i, r) in sets[0].records.iter().enumerate() {
            assert_eq!(r.offset, i as i64);
            assert_eq!(r.producer_id, -1);
            assert_eq!(r.producer_epoch, -1);
            assert!(!r.transactional && !r.control);
        }
        assert_eq!(sets[1].records[0].timestamp, 43);
    }

    fn record_strategy() -> impl Strategy<Value = Rec> {
        (
            any::<i64>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
        )
    }

    proptest! {
        #[test]
        fn prop_roundtrip(base in any::<i64>(),
                          recs in proptest::collection::vec(record_strategy(), 1..20)) {
            let buf = encode(base, &recs);
            let batches = decode_batches(&buf).unwrap();
            prop_assert_eq!(batches.len(), 1);
            let b = &batches[0];
            prop_assert_eq!(b.last_offset_delta as usize, recs.len() - 1);
            prop_assert_eq!(b.max_timestamp, recs.iter().map(|r| r.0).max().unwrap());
            let got: Vec<Rec> = b.records.iter()
                .map(|r| (r.timestamp, r.key.clone(), r.value.clone()))
                .collect();
            prop_assert_eq!(got, recs);
        }

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
