//! The spool's on-disk format, pure: bytes in, bytes out, no files. A segment is a fixed
//! header followed by records; every length read from disk is checked against the bytes
//! that remain (and a maximum) before anything is sliced, and every failure is a typed
//! error, never a panic.
//!
//! ```text
//! segment header (64 bytes, little-endian):
//!   magic "DORYSPL\0" | version u32 | header_len u32 | segment id u64 | segment size u64
//!   | reserved (zero) .. | crc32c u32 of bytes 0..60 at 60
//! record:
//!   body_len u32 | crc u32 | segment id (low 32 bits) u32 | body (body_len bytes)
//!   crc = crc32c_append(crc32c(body_len ++ body), segment id low 32 bits)
//! body:
//!   flags u8 (bit 0: partition key present) | partition key i32 | timestamp i64
//!   | topic_len u16 | topic | key_len u32 | key | value_len u32 | value
//! ```
//!
//! The segment id is the last thing the CRC covers, so an input encodes a record (and its
//! partial CRC) before it knows which segment it lands in, and the writer only patches the
//! id and finishes the CRC ([`seal_record`]). A recycled segment file is not zeroed: its
//! old records carry the old id, so a reader stops at them as at the end of the log.

/// First bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"DORYSPL\0";
/// The format this build writes and reads. A segment with a higher version is left alone.
pub const VERSION: u32 = 1;
/// Bytes of the segment header; records start here.
pub const HEADER_LEN: usize = 64;
/// Record header: body length, CRC, segment id.
pub const RECORD_HEADER_LEN: usize = 12;
/// Fixed part of a body: flags, partition key, timestamp, the three lengths.
pub const BODY_FIXED_LEN: usize = 1 + 4 + 8 + 2 + 4 + 4;
/// Largest record body accepted, so a corrupt length cannot make a reader look far.
pub const MAX_BODY_LEN: usize = 64 << 20;
/// The segment id a recycled, unused segment file carries in its header.
pub const FREE_SEGMENT: u64 = 0;

const HEADER_CRC_AT: usize = 60;
const FLAG_PARTITION_KEY: u8 = 1;

/// Why a segment header or a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("segment shorter than its header ({0} bytes)")]
    ShortHeader(usize),
    #[error("not a spool segment (bad magic)")]
    BadMagic,
    #[error("segment format version {0} is newer than this dory's ({VERSION})")]
    FutureVersion(u32),
    #[error("segment header checksum mismatch")]
    HeaderChecksum,
    #[error("segment header length {0} is not {HEADER_LEN}")]
    HeaderLen(u32),
    #[error("record header truncated: {0} bytes left")]
    Truncated(usize),
    #[error("record length {len} exceeds what is left ({left}) or the maximum")]
    BadLength { len: usize, left: usize },
    #[error("record checksum mismatch")]
    Checksum,
    #[error("record body malformed: {0}")]
    BadBody(&'static str),
}

/// A segment's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub version: u32,
    /// [`FREE_SEGMENT`] for a recycled file waiting for reuse.
    pub id: u64,
    pub size: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        let crc = crc32c::crc32c(&b[..HEADER_CRC_AT]);
        b[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a header. A future version is reported before the checksum is checked: a
    /// newer format may lay its header out differently.
    pub fn decode(b: &[u8]) -> Result<SegmentHeader, FormatError> {
        if b.len() < HEADER_LEN {
            return Err(FormatError::ShortHeader(b.len()));
        }
        if b[0..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        let version = u32_at(b, 8);
        if version > VERSION {
            return Err(FormatError::FutureVersion(version));
        }
        if u32_at(b, HEADER_CRC_AT) != crc32c::crc32c(&b[..HEADER_CRC_AT]) {
            return Err(FormatError::HeaderChecksum);
        }
        let header_len = u32_at(b, 12);
        if header_len as usize != HEADER_LEN {
            return Err(FormatError::HeaderLen(header_len));
        }
        Ok(SegmentHeader {
            version,
            id: u64_at(b, 16),
            size: u64_at(b, 24),
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// One message as the spool stores it (borrowed from the caller's bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub partition_key: Option<i32>,
    pub timestamp: i64,
    pub topic: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

impl RecordRef<'_> {
    /// Bytes the record takes on disk, header included; `None` if a field is too long for
    /// the format (topic over 65535 bytes, body over [`MAX_BODY_LEN`]).
    pub fn encoded_len(&self) -> Option<usize> {
        if self.topic.len() > usize::from(u16::MAX) {
            return None;
        }
        let body = BODY_FIXED_LEN + self.topic.len() + self.key.len() + self.value.len();
        (body <= MAX_BODY_LEN).then_some(RECORD_HEADER_LEN + body)
    }
}

/// Appends `rec` to `out` with its CRC not yet finished and segment id 0 (see
/// [`seal_record`]). Returns false (and appends nothing) if the record is too long for the
/// format. Does not allocate beyond `out`'s growth.
pub fn encode_record(rec: &RecordRef<'_>, out: &mut Vec<u8>) -> bool {
    let Some(total) = rec.encoded_len() else {
        return false;
    };
    let body_len = (total - RECORD_HEADER_LEN) as u32;
    let start = out.len();
    out.reserve(total);
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&[0; 8]); // crc, segment id: patched
    let flags = if rec.partition_key.is_some() {
        FLAG_PARTITION_KEY
    } else {
        0
    };
    out.push(flags);
    out.extend_from_slice(&rec.partition_key.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&rec.timestamp.to_le_bytes());
    out.extend_from_slice(&(rec.topic.len() as u16).to_le_bytes());
    out.extend_from_slice(rec.topic);
    out.extend_from_slice(&(rec.key.len() as u32).to_le_bytes());
    out.extend_from_slice(rec.key);
    out.extend_from_slice(&(rec.value.len() as u32).to_le_bytes());
    out.extend_from_slice(rec.value);
    let partial = crc32c::crc32c_append(
        crc32c::crc32c(&out[start..start + 4]),
        &out[start + RECORD_HEADER_LEN..],
    );
    out[start + 4..start + 8].copy_from_slice(&partial.to_le_bytes());
    true
}

/// Finishes a record encoded by [`encode_record`] for segment `segment_id`: patches the
/// id and completes the CRC. `rec` is exactly one record's bytes.
pub fn seal_record(rec: &mut [u8], segment_id: u64) {
    let id = (segment_id as u32).to_le_bytes();
    let partial = u32_at(rec, 4);
    let crc = crc32c::crc32c_append(partial, &id);
    rec[4..8].copy_from_slice(&crc.to_le_bytes());
    rec[8..12].copy_from_slice(&id);
}

/// The length of the record starting at `buf[0]` as encoded by [`encode_record`] (its own
/// length header; the buffer is trusted, it was written by us).
pub fn encoded_record_len(buf: &[u8]) -> usize {
    RECORD_HEADER_LEN + u32_at(buf, 0) as usize
}

/// What [`read_record`] found at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read<'a> {
    /// A valid record of this segment, and its length on disk.
    Record(RecordRef<'a>, usize),
    /// The end of this segment's records: zeros (never written).
    End,
    /// A valid record of an earlier use of the file: also the end of this segment's.
    Stale,
}

/// Reads the record at the start of `buf` for segment `segment_id`.
pub fn read_record(buf: &[u8], segment_id: u64) -> Result<Read<'_>, FormatError> {
    if buf.len() < RECORD_HEADER_LEN {
        return if buf.iter().all(|&b| b == 0) {
            Ok(Read::End)
        } else {
            Err(FormatError::Truncated(buf.len()))
        };
    }
    let body_len = u32_at(buf, 0) as usize;
    if body_len == 0 && buf[..RECORD_HEADER_LEN].iter().all(|&b| b == 0) {
        return Ok(Read::End);
    }
    let left = buf.len() - RECORD_HEADER_LEN;
    if body_len > left || !(BODY_FIXED_LEN..=MAX_BODY_LEN).contains(&body_len) {
        return Err(FormatError::BadLength {
            len: body_len,
            left,
        });
    }
    let total = RECORD_HEADER_LEN + body_len;
    let body = &buf[RECORD_HEADER_LEN..total];
    // The structure first: cheap, and it rejects almost every wrong offset before the CRC
    // is computed over a body (this is what keeps resynchronisation fast).
    let rec = decode_body(body)?;
    let stored_id = &buf[8..12];
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(crc32c::crc32c(&buf[0..4]), body),
        stored_id,
    );
    if crc != u32_at(buf, 4) {
        return Err(FormatError::Checksum);
    }
    if u32_at(buf, 8) != segment_id as u32 {
        return Ok(Read::Stale);
    }
    Ok(Read::Record(rec, total))
}

/// Splits a checksummed body into its fields, each length checked against what is left.
fn decode_body(b: &[u8]) -> Result<RecordRef<'_>, FormatError> {
    let mut r = Reader { b, at: 0 };
    let flags = r.take(1)?[0];
    if flags & !FLAG_PARTITION_KEY != 0 {
        return Err(FormatError::BadBody("unknown flags"));
    }
    let pk = i32::from_le_bytes(r.array()?);
    let timestamp = i64::from_le_bytes(r.array()?);
    let topic_len = u16::from_le_bytes(r.array()?) as usize;
    let topic = r.take(topic_len)?;
    let key_len = u32::from_le_bytes(r.array()?) as usize;
    let key = r.take(key_len)?;
    let value_len = u32::from_le_bytes(r.array()?) as usize;
    let value = r.take(value_len)?;
    if r.at != b.len() {
        return Err(FormatError::BadBody("trailing bytes"));
    }
    Ok(RecordRef {
        partition_key: (flags & FLAG_PARTITION_KEY != 0).then_some(pk),
        timestamp,
        topic,
        key,
        value,
    })
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.b.len() - self.at < n {
            return Err(FormatError::BadBody("field longer than the record"));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
}

/// One step of scanning a segment's record area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan<'a> {
    /// A record at `offset` (relative to the record area).
    Record { offset: usize, rec: RecordRef<'a> },
    /// Bytes at `offset..offset + len` could not be read and were skipped (`error` is
    /// the first failure there).
    Skipped {
        offset: usize,
        len: usize,
        error: FormatError,
    },
}

/// Reads every record of a segment's record area (`area` = the bytes after the header)
/// in order. After a bad record it looks for the next valid record of this segment, byte
/// by byte; what lies between is reported as skipped. The scan ends at the end of the
/// records (zeros, or records of an earlier use of the file); non-zero bytes after a bad
/// record that lead to no valid record (a torn tail) are reported skipped up to the last
/// non-zero byte.
pub fn scan(area: &[u8], segment_id: u64, mut each: impl FnMut(Scan<'_>)) {
    let mut at = 0;
    while at < area.len() {
        match read_record(&area[at..], segment_id) {
            Ok(Read::Record(rec, len)) => {
                each(Scan::Record { offset: at, rec });
                at += len;
            }
            Ok(Read::End | Read::Stale) => return,
            Err(error) => {
                // Resynchronise: the next offset holding a valid record of this segment,
                // up to the last non-zero byte; a valid record of an earlier use of the
                // file ends the search (the rest is old).
                let last = area.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
                let mut next = at + 1;
                let found = loop {
                    if next >= last {
                        break None;
                    }
                    match read_record(&area[next..], segment_id) {
                        Ok(Read::Record(..)) => break Some(next),
                        Ok(Read::Stale) => break None,
                        _ => next += 1,
                    }
                };
                let end = found.unwrap_or(next.min(last)).max(at + 1);
                each(Scan::Skipped {
                    offset: at,
                    len: end - at,
                    error,
                });
                if found.is_none() {
                    return;
                }
                at = end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec<'a>(topic: &'a [u8], key: &'a [u8], value: &'a [u8], pk: Option<i32>) -> RecordRef<'a> {
        RecordRef {
            partition_key: pk,
            timestamp: 1_700_000_000_123,
            topic,
            key,
            value,
        }
    }

    fn sealed(recs: &[RecordRef<'_>], id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for r in recs {
            let start = out.len();
            assert!(encode_record(r, &mut out));
            let len = encoded_record_len(&out[start..]);
            assert_eq!(len, out.len() - start);
            seal_record(&mut out[start..], id);
        }
        out
    }

    fn collect(area: &[u8], id: u64) -> (Vec<Vec<u8>>, Vec<(usize, usize)>) {
        let (mut recs, mut skipped) = (Vec::new(), Vec::new());
        scan(area, id, |s| match s {
            Scan::Record { rec, .. } => recs.push(rec.value.to_vec()),
            Scan::Skipped { offset, len, .. } => skipped.push((offset, len)),
        });
        (recs, skipped)
    }

    #[test]
    fn the_configs_record_overhead_bounds_the_format() {
        // `spool.max_bytes` and `segment_bytes` are checked against this bound: it holds
        // the segment header, a record header, the fixed fields and the longest topic a
        // client can send.
        let exact = HEADER_LEN + RECORD_HEADER_LEN + BODY_FIXED_LEN + i16::MAX as usize;
        assert!(exact as u64 <= crate::config::SPOOL_RECORD_OVERHEAD);
    }

    #[test]
    fn header_round_trip_and_errors() {
        let h = SegmentHeader {
            version: VERSION,
            id: 42,
            size: 1 << 20,
        };
        let b = h.encode();
        assert_eq!(SegmentHeader::decode(&b), Ok(h));
        assert_eq!(
            SegmentHeader::decode(&b[..10]),
            Err(FormatError::ShortHeader(10))
        );
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(SegmentHeader::decode(&bad), Err(FormatError::BadMagic));
        let mut bad = b;
        bad[20] ^= 1;
        assert_eq!(
            SegmentHeader::decode(&bad),
            Err(FormatError::HeaderChecksum)
        );
        let future = SegmentHeader {
            version: VERSION + 1,
            ..h
        }
        .encode();
        assert_eq!(
            SegmentHeader::decode(&future),
            Err(FormatError::FutureVersion(VERSION + 1))
        );
    }

    #[test]
    fn records_round_trip_and_stop_at_zeros_and_old_records() {
        let recs = [
            rec(b"t", b"k", b"v1", None),
            rec(b"payments", b"", b"v2", Some(-7)),
        ];
        let mut area = sealed(&recs, 9);
        area.extend_from_slice(&[0; 100]);
        let mut got = Vec::new();
        scan(&area, 9, |s| match s {
            Scan::Record { rec, .. } => got.push((rec.topic.to_vec(), rec.partition_key)),
            Scan::Skipped { .. } => panic!("nothing is corrupt"),
        });
        assert_eq!(
            got,
            vec![(b"t".to_vec(), None), (b"payments".to_vec(), Some(-7))]
        );
        // A recycled file: records of segment 8 after those of 9 are its end.
        let mut area = sealed(&recs[..1], 9);
        area.extend(sealed(&recs, 8));
        assert_eq!(collect(&area, 9), (vec![b"v1".to_vec()], vec![]));
    }

    #[test]
    fn corrupt_middle_record_is_skipped_and_the_rest_read() {
        let recs: Vec<RecordRef<'_>> = (0..3).map(|_| rec(b"t", b"k", b"value", None)).collect();
        let mut area = sealed(&recs, 3);
        let one = area.len() / 3;
        area[one + 20] ^= 0x40;
        let (got, skipped) = collect(&area, 3);
        assert_eq!(got.len(), 2);
        assert_eq!(skipped, vec![(one, one)]);
    }

    #[test]
    fn torn_tail_is_skipped_to_the_last_non_zero_byte() {
        let recs: Vec<RecordRef<'_>> = (0..2).map(|_| rec(b"t", b"", b"vv", None)).collect();
        let mut area = sealed(&recs, 1);
        let one = area.len() / 2;
        area.truncate(one + 15);
        area.extend_from_slice(&[0; 64]);
        let (got, skipped) = collect(&area, 1);
        assert_eq!(got.len(), 1);
        // The 15 bytes kept end in zeros (segment id 1, flags, partition key): the count
        // stops at the last non-zero one, the low byte of the segment id.
        assert_eq!(skipped, vec![(one, 9)]);
    }

    #[test]
    fn too_long_fields_are_refused() {
        let topic = vec![b't'; 70_000];
        let mut out = Vec::new();
        assert!(!encode_record(&rec(&topic, b"", b"", None), &mut out));
        assert!(out.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Every truncation of a segment's records reads back a prefix of them, and every
        /// lost byte is reported as skipped or falls in the zero padding.
        #[test]
        fn every_truncation_reads_a_prefix(
            values in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let recs: Vec<RecordRef<'_>> = values.iter().map(|v| rec(b"topic", b"key", v, Some(1))).collect();
            let full = sealed(&recs, 77);
            let cut = cut.index(full.len() + 1);
            let mut area = full[..cut].to_vec();
            area.extend_from_slice(&[0; 32]);
            let (got, skipped) = collect(&area, 77);
            prop_assert!(got.len() <= values.len());
            prop_assert_eq!(&got[..], &values[..got.len()]);
            let read: usize = (0..got.len()).map(|i| recs[i].encoded_len().unwrap_or(0)).sum();
            let skip: usize = skipped.iter().map(|s| s.1).sum();
            // A record whose cut-off tail was zeros reads back whole from the zero padding
            // (the bytes are the same), so the bound is the cut plus the padding.
            prop_assert!(read + skip <= cut + 32);
            if cut == full.len() {
                prop_assert_eq!((got.len(), skip), (values.len(), 0));
            }
        }

        /// Flipping any byte never panics, and every record read back is one that was written.
        #[test]
        fn flipped_bytes_never_invent_records(
            values in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let recs: Vec<RecordRef<'_>> = values.iter().map(|v| rec(b"topic", b"", v, None)).collect();
            let mut area = sealed(&recs, 5);
            let i = at.index(area.len());
            area[i] ^= 1 << bit;
            let (got, _) = collect(&area, 5);
            prop_assert!(got.len() <= values.len());
            for g in &got {
                prop_assert!(values.contains(g));
            }
        }

        /// Arbitrary bytes: never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), id in any::<u64>()) {
            let _ = SegmentHeader::decode(&bytes);
            scan(&bytes, id, |_| {});
        }
    }
}
