//! Request and response framing: the `i32` size prefix (reserved first, patched once the
//! body is written), request header v1/v2 and response header v0/v1. Every API module
//! frames its messages through here so the header rules live in one place.

use super::primitives::{
    put_empty_tagged_fields, put_i16, put_i32, put_i32_at, put_nullable_string, reserve_i32,
    DecodeError, Reader,
};

/// Offset of the correlation id in an encoded request (size, api key, api version).
pub const REQUEST_CORRELATION_OFFSET: usize = 8;

/// A reserved size prefix; [`FrameStart::finish`] fills it in once the body is complete.
#[must_use = "a request frame must be finished to patch its size prefix"]
#[derive(Debug)]
pub struct FrameStart {
    size_pos: usize,
}

impl FrameStart {
    /// Patches the size prefix with the number of bytes written after it.
    pub fn finish(self, buf: &mut [u8]) {
        let size = buf.len() - self.size_pos - 4;
        // A frame over 2 GiB cannot be expressed; callers cap requests far below that. The
        // broker rejects a saturated size, which is the best a non-failing encoder can do.
        debug_assert!(
            i32::try_from(size).is_ok(),
            "request frame exceeds i32::MAX"
        );
        put_i32_at(buf, self.size_pos, i32::try_from(size).unwrap_or(i32::MAX));
    }
}

/// Reserves the size prefix and writes a request header: v1 (`flexible == false`) or v2
/// (`flexible == true`, adds an empty tagged-field section). The client id keeps its classic
/// `i16` length even in v2 so any broker can parse an ApiVersions header.
pub fn begin_request(
    buf: &mut Vec<u8>,
    api_key: i16,
    api_version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
    flexible: bool,
) -> FrameStart {
    let size_pos = reserve_i32(buf);
    put_i16(buf, api_key);
    put_i16(buf, api_version);
    put_i32(buf, correlation_id);
    put_nullable_string(buf, client_id.map(str::as_bytes));
    if flexible {
        put_empty_tagged_fields(buf);
    }
    FrameStart { size_pos }
}

/// Reads a response header from a frame (size prefix already stripped): v0 is just the
/// correlation id, v1 (`flexible == true`) adds a tagged-field section.
pub fn read_response_header(r: &mut Reader<'_>, flexible: bool) -> Result<i32, DecodeError> {
    let correlation_id = r.i32()?;
    if flexible {
        r.skip_tagged_fields()?;
    }
    Ok(correlation_id)
}

/// The correlation id at the start of a response frame, whatever the API.
pub fn peek_correlation_id(frame: &[u8]) -> Result<i32, DecodeError> {
    Reader::new(frame).i32()
}

/// The correlation id of an encoded request (with its size prefix), if it is long enough.
pub fn request_correlation_id(request: &[u8]) -> Option<i32> {
    let bytes = request.get(REQUEST_CORRELATION_OFFSET..REQUEST_CORRELATION_OFFSET + 4)?;
    Reader::new(bytes).i32().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::Decodable;

    /// Checks the size prefix and decodes the header with kafka-protocol; returns the body.
    fn decode_header(buf: &[u8], header_version: i16) -> (RequestHeader, &[u8]) {
        let mut r = Reader::new(buf);
        let size = r.i32().unwrap();
        assert_eq!(size as usize, r.remaining());
        let mut rest = r.rest();
        let header = RequestHeader::decode(&mut rest, header_version).unwrap();
        (header, rest)
    }

    #[test]
    fn header_v1_and_v2_decode_with_kafka_protocol() {
        for flexible in [false, true] {
            for client_id in [None, Some("dory-1")] {
                let mut buf = Vec::new();
                let frame = begin_request(&mut buf, 3, 12, 77, client_id, flexible);
                buf.extend_from_slice(b"body");
                frame.finish(&mut buf);
                let (header, rest) = decode_header(&buf, if flexible { 2 } else { 1 });
                assert_eq!(header.request_api_key, 3);
                assert_eq!(header.request_api_version, 12);
                assert_eq!(header.correlation_id, 77);
                assert_eq!(header.client_id.as_ref().map(|s| s.as_str()), client_id);
                assert_eq!(rest, b"body");
                assert_eq!(request_correlation_id(&buf), Some(77));
            }
        }
    }

    #[test]
    fn size_prefix_is_relative_to_its_own_position() {
        let mut buf = b"previous".to_vec();
        let frame = begin_request(&mut buf, 18, 0, 1, None, false);
        frame.finish(&mut buf);
        let size = i32::from_be_bytes(buf[8..12].try_into().unwrap());
        assert_eq!(size as usize, buf.len() - 12);
    }

    #[test]
    fn response_headers() {
        let v0 = 5i32.to_be_bytes();
        assert_eq!(read_response_header(&mut Reader::new(&v0), false), Ok(5));
        let v1 = [0, 0, 0, 5, 0];
        let mut r = Reader::new(&v1);
        assert_eq!(read_response_header(&mut r, true), Ok(5));
        assert!(r.is_empty());
        assert!(read_response_header(&mut Reader::new(&v0), true).is_err());
        assert_eq!(peek_correlation_id(&v1), Ok(5));
        assert!(peek_correlation_id(&v1[..3]).is_err());
        assert_eq!(request_correlation_id(&[0; 11]), None);
    }
}
