//! Kafka wire primitives: big-endian integers, varints, strings, bytes, arrays, UUIDs and
//! tagged fields. Writers append to a caller-owned `Vec<u8>` and cannot fail; the `Reader`
//! walks a borrowed slice and turns every malformed or truncated input into a `DecodeError`,
//! checking lengths from the peer before anything is allocated.

use thiserror::Error;

/// Everything that can go wrong while decoding bytes from a broker (or from a fuzzer).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated input: needed {needed} bytes, {remaining} remaining")]
    Truncated { needed: usize, remaining: usize },
    #[error("invalid length {0}")]
    InvalidLength(i64),
    #[error("array of {count} elements cannot fit in {remaining} remaining bytes")]
    ArrayTooLong { count: usize, remaining: usize },
    #[error("varint is longer than allowed")]
    VarintTooLong,
    #[error("string is not valid utf-8")]
    InvalidUtf8,
    #[error("unexpected null {0}")]
    UnexpectedNull(&'static str),
    #[error("invalid boolean byte {0}")]
    InvalidBool(u8),
    #[error("{0} unexpected trailing bytes")]
    TrailingBytes(usize),
    #[error("unsupported version {version} of {api}")]
    UnsupportedVersion { api: &'static str, version: i16 },
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("unsupported record batch magic {0}")]
    UnsupportedMagic(i8),
    #[error("unsupported compression codec {0}")]
    UnsupportedCompression(i16),
    #[error("invalid record: {0}")]
    InvalidRecord(&'static str),
}

/// Kafka caps `STRING` at `i16::MAX` bytes.
const MAX_STRING_LEN: usize = i16::MAX as usize;
/// Kafka caps `BYTES` at `i32::MAX` bytes.
const MAX_BYTES_LEN: usize = i32::MAX as usize;

/// A cursor over a borrowed byte slice. Every read either returns a value and advances, or
/// returns an error and leaves the reader in an unspecified (but safe) position.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Succeeds only if every byte was consumed: a well-formed message at the version we
    /// asked for has no slack, so leftover bytes mean we and the peer disagree on the layout.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }

    /// Ends decoding of a broker's response, ignoring bytes after the last field we know
    /// (a peer may append fields a later schema removed or we do not read); returns how
    /// many were ignored.
    pub fn finish_lenient(self) -> usize {
        self.buf.len()
    }

    /// Takes `n` raw bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated {
                needed: n,
                remaining: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub fn skip(&mut self, n: usize) -> Result<(), DecodeError> {
        self.bytes(n).map(|_| ())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn i8(&mut self) -> Result<i8, DecodeError> {
        Ok(i8::from_be_bytes(self.array()?))
    }

    pub fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    pub fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// Kafka booleans are one byte, 0 or 1; anything else is rejected.
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidBool(other)),
        }
    }

    /// Unsigned LEB128, at most 5 bytes, value must fit in `u32`.
    pub fn unsigned_varint(&mut self) -> Result<u32, DecodeError> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let byte = self.u8()?;
            let bits = u32::from(byte & 0x7f);
            // The fifth byte may only carry the top 4 bits of a u32.
            if i == 4 && bits > 0x0f {
                return Err(DecodeError::VarintTooLong);
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::VarintTooLong)
    }

    /// Unsigned LEB128, at most 10 bytes, value must fit in `u64`.
    pub fn unsigned_varlong(&mut self) -> Result<u64, DecodeError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte may only carry the top bit of a u64.
            if i == 9 && bits > 0x01 {
                return Err(DecodeError::VarintTooLong);
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::VarintTooLong)
    }

    /// Zigzag-encoded signed 32-bit varint (record fields).
    pub fn varint(&mut self) -> Result<i32, DecodeError> {
        let raw = self.unsigned_varint()?;
        Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32))
    }

    /// Zigzag-encoded signed 64-bit varint (record timestamps).
    pub fn varlong(&mut self) -> Result<i64, DecodeError> {
        let raw = self.unsigned_varlong()?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    pub fn uuid(&mut self) -> Result<[u8; 16], DecodeError> {
        self.array()
    }

    /// Length of a classic (`i16`-prefixed) string, `None` for null (-1).
    fn string_len(&mut self) -> Result<Option<usize>, DecodeError> {
        let len = self.i16()?;
        match len {
            -1 => Ok(None),
            n if n < 0 => Err(DecodeError::InvalidLength(i64::from(n))),
            n => Ok(Some(n as usize)),
        }
    }

    /// Length of a compact (unsigned varint N+1) string or bytes, `None` for null (0).
    fn compact_len(&mut self) -> Result<Option<usize>, DecodeError> {
        match self.unsigned_varint()? {
            0 => Ok(None),
            n => usize::try_from(n - 1)
                .map(Some)
                .map_err(|_| DecodeError::InvalidLength(i64::from(n))),
        }
    }

    /// Length of a classic (`i32`-prefixed) bytes field, `None` for null (-1).
    fn bytes_len(&mut self) -> Result<Option<usize>, DecodeError> {
        let len = self.i32()?;
        match len {
            -1 => Ok(None),
            n if n < 0 => Err(DecodeError::InvalidLength(i64::from(n))),
            n => usize::try_from(n)
                .map(Some)
                .map_err(|_| DecodeError::InvalidLength(i64::from(n))),
        }
    }

    fn opt_bytes(&mut self, len: Option<usize>) -> Result<Option<&'a [u8]>, DecodeError> {
        len.map(|n| self.bytes(n)).transpose()
    }

    /// Non-null `STRING` as raw bytes (topic names are treated as opaque bytes).
    pub fn string_bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        self.nullable_string_bytes()?
            .ok_or(DecodeError::UnexpectedNull("string"))
    }

    /// `NULLABLE_STRING` as raw bytes.
    pub fn nullable_string_bytes(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        let len = self.string_len()?;
        self.opt_bytes(len)
    }

    /// Non-null `COMPACT_STRING` as raw bytes.
    pub fn compact_string_bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        self.compact_nullable_string_bytes()?
            .ok_or(DecodeError::UnexpectedNull("compact string"))
    }

    /// `COMPACT_NULLABLE_STRING` as raw bytes.
    pub fn compact_nullable_string_bytes(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        let len = self.compact_len()?;
        self.opt_bytes(len)
    }

    /// Non-null `STRING`, validated as UTF-8.
    pub fn string(&mut self) -> Result<&'a str, DecodeError> {
        utf8(self.string_bytes()?)
    }

    /// `NULLABLE_STRING`, validated as UTF-8.
    pub fn nullable_string(&mut self) -> Result<Option<&'a str>, DecodeError> {
        self.nullable_string_bytes()?.map(utf8).transpose()
    }

    /// Non-null `COMPACT_STRING`, validated as UTF-8.
    pub fn compact_string(&mut self) -> Result<&'a str, DecodeError> {
        utf8(self.compact_string_bytes()?)
    }

    /// `COMPACT_NULLABLE_STRING`, validated as UTF-8.
    pub fn compact_nullable_string(&mut self) -> Result<Option<&'a str>, DecodeError> {
        self.compact_nullable_string_bytes()?.map(utf8).transpose()
    }

    /// Non-null `STRING` or `COMPACT_STRING` as raw bytes, depending on `flexible`.
    pub fn string_bytes_flex(&mut self, flexible: bool) -> Result<&'a [u8], DecodeError> {
        if flexible {
            self.compact_string_bytes()
        } else {
            self.string_bytes()
        }
    }

    /// `NULLABLE_STRING` or `COMPACT_NULLABLE_STRING` as raw bytes, depending on `flexible`.
    pub fn nullable_string_bytes_flex(
        &mut self,
        flexible: bool,
    ) -> Result<Option<&'a [u8]>, DecodeError> {
        if flexible {
            self.compact_nullable_string_bytes()
        } else {
            self.nullable_string_bytes()
        }
    }

    /// Non-null `BYTES` (`i32` length).
    pub fn bytes_field(&mut self) -> Result<&'a [u8], DecodeError> {
        self.nullable_bytes()?
            .ok_or(DecodeError::UnexpectedNull("bytes"))
    }

    /// `NULLABLE_BYTES` (`i32` length).
    pub fn nullable_bytes(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        let len = self.bytes_len()?;
        self.opt_bytes(len)
    }

    /// Non-null `COMPACT_BYTES`.
    pub fn compact_bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        self.compact_nullable_bytes()?
            .ok_or(DecodeError::UnexpectedNull("compact bytes"))
    }

    /// `COMPACT_NULLABLE_BYTES`.
    pub fn compact_nullable_bytes(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        let len = self.compact_len()?;
        self.opt_bytes(len)
    }

    /// Rejects a count of elements that cannot possibly fit in what is left, so callers may
    /// `Vec::with_capacity(count)` without trusting the peer.
    fn check_count(&self, count: usize, min_elem_size: usize) -> Result<usize, DecodeError> {
        let needed = count.saturating_mul(min_elem_size.max(1));
        if needed > self.buf.len() {
            return Err(DecodeError::ArrayTooLong {
                count,
                remaining: self.buf.len(),
            });
        }
        Ok(count)
    }

    /// Non-null `ARRAY` length (`i32`). `min_elem_size` is the smallest encoding of one
    /// element; the count is checked against the remaining bytes.
    pub fn array_len(&mut self, min_elem_size: usize) -> Result<usize, DecodeError> {
        self.nullable_array_len(min_elem_size)?
            .ok_or(DecodeError::UnexpectedNull("array"))
    }

    /// Nullable `ARRAY` length (`i32`, -1 is null).
    pub fn nullable_array_len(
        &mut self,
        min_elem_size: usize,
    ) -> Result<Option<usize>, DecodeError> {
        match self.bytes_len()? {
            None => Ok(None),
            Some(n) => self.check_count(n, min_elem_size).map(Some),
        }
    }

    /// Non-null `COMPACT_ARRAY` length (unsigned varint N+1).
    pub fn compact_array_len(&mut self, min_elem_size: usize) -> Result<usize, DecodeError> {
        self.compact_nullable_array_len(min_elem_size)?
            .ok_or(DecodeError::UnexpectedNull("compact array"))
    }

    /// Nullable `COMPACT_ARRAY` length (0 is null).
    pub fn compact_nullable_array_len(
        &mut self,
        min_elem_size: usize,
    ) -> Result<Option<usize>, DecodeError> {
        match self.compact_len()? {
            None => Ok(None),
            Some(n) => self.check_count(n, min_elem_size).map(Some),
        }
    }

    /// Non-null array length in the classic or compact encoding, depending on `flexible`.
    pub fn array_len_flex(
        &mut self,
        flexible: bool,
        min_elem_size: usize,
    ) -> Result<usize, DecodeError> {
        if flexible {
            self.compact_array_len(min_elem_size)
        } else {
            self.array_len(min_elem_size)
        }
    }

    /// Skips a tagged-field section: a count, then (tag, size, data) for each field. We
    /// understand no tagged fields yet, so all are ignored, as the protocol allows.
    pub fn skip_tagged_fields(&mut self) -> Result<(), DecodeError> {
        let count = self.unsigned_varint()?;
        for _ in 0..count {
            let _tag = self.unsigned_varint()?;
            let size = self.unsigned_varint()?;
            let size =
                usize::try_from(size).map_err(|_| DecodeError::InvalidLength(size.into()))?;
            self.skip(size)?;
        }
        Ok(())
    }

    /// Skips an array of `i32` (e.g. replica lists), validating its length.
    pub fn skip_i32_array(&mut self, flexible: bool) -> Result<(), DecodeError> {
        let n = self.array_len_flex(flexible, 4)?;
        self.skip(n * 4)
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)
}

// ---------------------------------------------------------------------------------------
// Writers. They cannot fail; the few inputs that do not fit the wire type are documented.
// ---------------------------------------------------------------------------------------

pub fn put_i8(buf: &mut Vec<u8>, v: i8) {
    buf.extend_from_slice(&v.to_be_bytes());
}

pub fn put_i16(buf: &mut Vec<u8>, v: i16) {
    buf.extend_from_slice(&v.to_be_bytes());
}

pub fn put_i32(buf: &mut Vec<u8>, v: i32) {
    buf.extend_from_slice(&v.to_be_bytes());
}

pub fn put_i64(buf: &mut Vec<u8>, v: i64) {
    buf.extend_from_slice(&v.to_be_bytes());
}

pub fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_be_bytes());
}

pub fn put_bool(buf: &mut Vec<u8>, v: bool) {
    buf.push(u8::from(v));
}

pub fn put_uuid(buf: &mut Vec<u8>, v: &[u8; 16]) {
    buf.extend_from_slice(v);
}

/// Overwrites four bytes at `pos` (reserved earlier) with `v`.
///
/// # Panics
/// If `pos + 4 > buf.len()`, which means the caller lost track of its own reservation.
pub fn put_i32_at(buf: &mut [u8], pos: usize, v: i32) {
    buf[pos..pos + 4].copy_from_slice(&v.to_be_bytes());
}

/// Overwrites eight bytes at `pos` with `v`. Panics like [`put_i32_at`].
pub fn put_i64_at(buf: &mut [u8], pos: usize, v: i64) {
    buf[pos..pos + 8].copy_from_slice(&v.to_be_bytes());
}

/// Overwrites four bytes at `pos` with `v`. Panics like [`put_i32_at`].
pub fn put_u32_at(buf: &mut [u8], pos: usize, v: u32) {
    buf[pos..pos + 4].copy_from_slice(&v.to_be_bytes());
}

/// Reserves an `i32` placeholder and returns its position, for [`put_i32_at`] later.
pub fn reserve_i32(buf: &mut Vec<u8>) -> usize {
    let pos = buf.len();
    buf.extend_from_slice(&[0; 4]);
    pos
}

pub fn put_unsigned_varint(buf: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

pub fn put_unsigned_varlong(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn zigzag32(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Zigzag-encoded signed 32-bit varint.
pub fn put_varint(buf: &mut Vec<u8>, v: i32) {
    put_unsigned_varint(buf, zigzag32(v));
}

/// Zigzag-encoded signed 64-bit varint.
pub fn put_varlong(buf: &mut Vec<u8>, v: i64) {
    put_unsigned_varlong(buf, zigzag64(v));
}

/// Bytes [`put_unsigned_varint`] writes for `v`.
pub fn unsigned_varint_len(v: u32) -> usize {
    let bits = 32 - v.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

/// Bytes [`put_unsigned_varlong`] writes for `v`.
pub fn unsigned_varlong_len(v: u64) -> usize {
    let bits = 64 - v.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

/// Bytes [`put_varint`] writes for `v`.
pub fn varint_len(v: i32) -> usize {
    unsigned_varint_len(zigzag32(v))
}

/// Bytes [`put_varlong`] writes for `v`.
pub fn varlong_len(v: i64) -> usize {
    unsigned_varlong_len(zigzag64(v))
}

/// Converts a count to the `i32` Kafka uses. Counts beyond `i32::MAX` cannot be encoded;
/// no real request comes near, so they saturate rather than wrap.
fn count_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn clamp(s: &[u8], max: usize) -> &[u8] {
    // A Kafka string cannot be longer than its length field allows. Callers validate topic
    // names and client ids long before this point; truncating keeps the frame well-formed
    // if one ever slips through.
    &s[..s.len().min(max)]
}

/// `STRING` (`i16` length) from raw bytes; longer than `i16::MAX` is truncated.
pub fn put_string(buf: &mut Vec<u8>, s: &[u8]) {
    let s = clamp(s, MAX_STRING_LEN);
    put_i16(buf, s.len() as i16);
    buf.extend_from_slice(s);
}

/// `NULLABLE_STRING`; `None` is written as length -1.
pub fn put_nullable_string(buf: &mut Vec<u8>, s: Option<&[u8]>) {
    match s {
        None => put_i16(buf, -1),
        Some(s) => put_string(buf, s),
    }
}

/// `COMPACT_STRING` (unsigned varint N+1); longer than `i16::MAX` is truncated.
pub fn put_compact_string(buf: &mut Vec<u8>, s: &[u8]) {
    let s = clamp(s, MAX_STRING_LEN);
    put_unsigned_varint(buf, s.len() as u32 + 1);
    buf.extend_from_slice(s);
}

/// `COMPACT_NULLABLE_STRING`; `None` is written as 0.
pub fn put_compact_nullable_string(buf: &mut Vec<u8>, s: Option<&[u8]>) {
    match s {
        None => put_unsigned_varint(buf, 0),
        Some(s) => put_compact_string(buf, s),
    }
}

/// `STRING` or `COMPACT_STRING`, depending on `flexible`.
pub fn put_string_flex(buf: &mut Vec<u8>, flexible: bool, s: &[u8]) {
    if flexible {
        put_compact_string(buf, s);
    } else {
        put_string(buf, s);
    }
}

/// `NULLABLE_BYTES` (`i32` length); longer than `i32::MAX` is truncated.
pub fn put_nullable_bytes(buf: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_i32(buf, -1),
        Some(b) => {
            let b = clamp(b, MAX_BYTES_LEN);
            put_i32(buf, count_i32(b.len()));
            buf.extend_from_slice(b);
        }
    }
}

/// `COMPACT_NULLABLE_BYTES`; longer than `u32::MAX - 1` is truncated.
pub fn put_compact_nullable_bytes(buf: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_unsigned_varint(buf, 0),
        Some(b) => {
            let b = clamp(b, MAX_BYTES_LEN);
            put_unsigned_varint(buf, b.len() as u32 + 1);
            buf.extend_from_slice(b);
        }
    }
}

/// `ARRAY` length (`i32`).
pub fn put_array_len(buf: &mut Vec<u8>, n: usize) {
    put_i32(buf, count_i32(n));
}

/// `COMPACT_ARRAY` length (unsigned varint N+1).
pub fn put_compact_array_len(buf: &mut Vec<u8>, n: usize) {
    put_unsigned_varint(buf, u32::try_from(n).unwrap_or(u32::MAX - 1) + 1);
}

/// Nullable array length; `None` is -1 (classic) or 0 (compact).
pub fn put_nullable_array_len_flex(buf: &mut Vec<u8>, flexible: bool, n: Option<usize>) {
    match (flexible, n) {
        (false, None) => put_i32(buf, -1),
        (false, Some(n)) => put_array_len(buf, n),
        (true, None) => put_unsigned_varint(buf, 0),
        (true, Some(n)) => put_compact_array_len(buf, n),
    }
}

/// An empty tagged-field section (flexible versions only).
pub fn put_empty_tagged_fields(buf: &mut Vec<u8>) {
    buf.push(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn uvarint_bytes(v: u32) -> Vec<u8> {
        let mut b = Vec::new();
        put_unsigned_varint(&mut b, v);
        b
    }

    #[test]
    fn varint_known_encodings() {
        // Examples from the protobuf/Kafka documentation of zigzag encoding.
        let cases: &[(i32, &[u8])] = &[
            (0, &[0x00]),
            (-1, &[0x01]),
            (1, &[0x02]),
            (-2, &[0x03]),
            (63, &[0x7e]),
            (-64, &[0x7f]),
            (64, &[0x80, 0x01]),
            (i32::MAX, &[0xfe, 0xff, 0xff, 0xff, 0x0f]),
            (i32::MIN, &[0xff, 0xff, 0xff, 0xff, 0x0f]),
        ];
        for (v, expected) in cases {
            let mut b = Vec::new();
            put_varint(&mut b, *v);
            assert_eq!(&b[..], *expected, "encoding {v}");
            assert_eq!(varint_len(*v), expected.len());
            assert_eq!(Reader::new(expected).varint().unwrap(), *v);
        }
        assert_eq!(uvarint_bytes(300), vec![0xac, 0x02]);
        assert_eq!(uvarint_bytes(u32::MAX), vec![0xff, 0xff, 0xff, 0xff, 0x0f]);
    }

    #[test]
    fn varint_boundaries() {
        for shift in 0..32 {
            for v in [1u32 << shift, (1u32 << shift) - 1, (1u32 << shift) + 1] {
                let b = uvarint_bytes(v);
                assert_eq!(b.len(), unsigned_varint_len(v), "len of {v}");
                assert_eq!(Reader::new(&b).unsigned_varint().unwrap(), v);
            }
        }
        for v in [i64::MIN, i64::MAX, 0, -1, 1, i64::from(i32::MIN) - 1] {
            let mut b = Vec::new();
            put_varlong(&mut b, v);
            assert_eq!(b.len(), varlong_len(v));
            let mut r = Reader::new(&b);
            assert_eq!(r.varlong().unwrap(), v);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn overlong_varints_are_rejected() {
        // Six continuation bytes: longer than any u32.
        let b = [0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert_eq!(
            Reader::new(&b).unsigned_varint(),
            Err(DecodeError::VarintTooLong)
        );
        // Fifth byte carrying more than 4 bits overflows u32.
        let b = [0xff, 0xff, 0xff, 0xff, 0x1f];
        assert_eq!(
            Reader::new(&b).unsigned_varint(),
            Err(DecodeError::VarintTooLong)
        );
        let b = [0xff; 11];
        assert_eq!(
            Reader::new(&b).unsigned_varlong(),
            Err(DecodeError::VarintTooLong)
        );
        let b = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(
            Reader::new(&b).unsigned_varlong(),
            Err(DecodeError::VarintTooLong)
        );
        // Truncated varint.
        assert!(matches!(
            Reader::new(&[0x80]).unsigned_varint(),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn strings_and_nulls() {
        let mut b = Vec::new();
        put_string(&mut b, b"topic");
        put_nullable_string(&mut b, None);
        put_compact_string(&mut b, b"abc");
        put_compact_nullable_string(&mut b, None);
        put_nullable_bytes(&mut b, Some(b"xy"));
        put_nullable_bytes(&mut b, None);
        put_compact_nullable_bytes(&mut b, Some(b""));
        let mut r = Reader::new(&b);
        assert_eq!(r.string().unwrap(), "topic");
        assert_eq!(r.nullable_string().unwrap(), None);
        assert_eq!(r.compact_string().unwrap(), "abc");
        assert_eq!(r.compact_nullable_string().unwrap(), None);
        assert_eq!(r.nullable_bytes().unwrap(), Some(&b"xy"[..]));
        assert_eq!(r.nullable_bytes().unwrap(), None);
        assert_eq!(r.compact_bytes().unwrap(), b"");
        r.finish().unwrap();
    }

    #[test]
    fn invalid_lengths_are_errors() {
        assert_eq!(
            Reader::new(&(-2i16).to_be_bytes()).nullable_string(),
            Err(DecodeError::InvalidLength(-2))
        );
        assert_eq!(
            Reader::new(&(-1i16).to_be_bytes()).string(),
            Err(DecodeError::UnexpectedNull("string"))
        );
        assert_eq!(
            Reader::new(&(-5i32).to_be_bytes()).nullable_array_len(4),
            Err(DecodeError::InvalidLength(-5))
        );
        assert_eq!(Reader::new(&[2u8]).bool(), Err(DecodeError::InvalidBool(2)));
        assert!(matches!(
            Reader::new(&[0, 1, 0xc3]).string(),
            Err(DecodeError::InvalidUtf8)
        ));
    }

    #[test]
    fn huge_array_lengths_fail_before_allocating() {
        let mut b = Vec::new();
        put_i32(&mut b, i32::MAX);
        b.extend_from_slice(&[0; 16]);
        assert!(matches!(
            Reader::new(&b).array_len(4),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        let mut b = Vec::new();
        put_unsigned_varint(&mut b, u32::MAX);
        assert!(matches!(
            Reader::new(&b).compact_array_len(1),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        // A zero-sized element still counts as one byte, so even that cannot lie.
        let mut b = Vec::new();
        put_i32(&mut b, 3);
        assert!(Reader::new(&b).array_len(0).is_err());
    }

    #[test]
    fn tagged_fields_are_skipped() {
        let mut b = Vec::new();
        put_unsigned_varint(&mut b, 2);
        put_unsigned_varint(&mut b, 0);
        put_unsigned_varint(&mut b, 3);
        b.extend_from_slice(b"abc");
        put_unsigned_varint(&mut b, 7);
        put_unsigned_varint(&mut b, 0);
        b.push(0x42);
        let mut r = Reader::new(&b);
        r.skip_tagged_fields().unwrap();
        assert_eq!(r.u8().unwrap(), 0x42);
        // A tagged field claiming more bytes than exist.
        let b = [1u8, 0, 100, 1, 2];
        assert!(Reader::new(&b).skip_tagged_fields().is_err());
    }

    #[test]
    fn patching_reserved_slots() {
        let mut b = vec![9u8];
        let pos = reserve_i32(&mut b);
        put_i16(&mut b, 7);
        put_i32_at(&mut b, pos, -2);
        let mut r = Reader::new(&b);
        assert_eq!(r.u8().unwrap(), 9);
        assert_eq!(r.i32().unwrap(), -2);
        assert_eq!(r.i16().unwrap(), 7);
    }

    proptest! {
        #[test]
        fn prop_varint_roundtrip(v in any::<i32>()) {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            prop_assert_eq!(b.len(), varint_len(v));
            let mut r = Reader::new(&b);
            prop_assert_eq!(r.varint().unwrap(), v);
            prop_assert!(r.is_empty());
        }

        #[test]
        fn prop_varlong_roundtrip(v in any::<i64>()) {
            let mut b = Vec::new();
            put_varlong(&mut b, v);
            prop_assert_eq!(b.len(), varlong_len(v));
            let mut r = Reader::new(&b);
            prop_assert_eq!(r.varlong().unwrap(), v);
            prop_assert!(r.is_empty());
        }

        #[test]
        fn prop_unsigned_varint_roundtrip(v in any::<u32>()) {
            let b = uvarint_bytes(v);
            prop_assert_eq!(b.len(), unsigned_varint_len(v));
            prop_assert_eq!(Reader::new(&b).unsigned_varint().unwrap(), v);
        }

        #[test]
        fn prop_fixed_width_roundtrip(a in any::<i8>(), b in any::<i16>(), c in any::<i32>(),
                                      d in any::<i64>(), e in any::<u32>(), f in any::<bool>(),
                                      u in any::<[u8; 16]>()) {
            let mut buf = Vec::new();
            put_i8(&mut buf, a);
            put_i16(&mut buf, b);
            put_i32(&mut buf, c);
            put_i64(&mut buf, d);
            put_u32(&mut buf, e);
            put_bool(&mut buf, f);
            put_uuid(&mut buf, &u);
            let mut r = Reader::new(&buf);
            prop_assert_eq!(r.i8().unwrap(), a);
            prop_assert_eq!(r.i16().unwrap(), b);
            prop_assert_eq!(r.i32().unwrap(), c);
            prop_assert_eq!(r.i64().unwrap(), d);
            prop_assert_eq!(r.u32().unwrap(), e);
            prop_assert_eq!(r.bool().unwrap(), f);
            prop_assert_eq!(r.uuid().unwrap(), u);
            prop_assert!(r.finish().is_ok());
        }

        #[test]
        fn prop_string_roundtrip(s in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
                                 flexible in any::<bool>()) {
            let mut buf = Vec::new();
            if flexible {
                put_compact_nullable_string(&mut buf, s.as_deref());
            } else {
                put_nullable_string(&mut buf, s.as_deref());
            }
            let mut r = Reader::new(&buf);
            prop_assert_eq!(r.nullable_string_bytes_flex(flexible).unwrap(), s.as_deref());
            prop_assert!(r.is_empty());
        }

        #[test]
        fn prop_reader_never_panics(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&data);
            let _ = r.varlong();
            let _ = r.compact_nullable_string();
            let _ = r.nullable_bytes();
            let _ = r.skip_tagged_fields();
            let _ = r.array_len(4);
        }
    }
}
