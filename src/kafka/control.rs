//! Control-plane requests: InitProducerId now, SASL later. Each is many versions of many
//! fields, so they are encoded and decoded with the `kafka-protocol` crate (generated from
//! Kafka's own message schemas) rather than by hand; only the hot path (Produce,
//! RecordBatch) is hand-written. Pure: bytes in, bytes out.

use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProducerId, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};

use crate::kafka::VersionRange;

pub const API_KEY_INIT_PRODUCER_ID: i16 = 22;
/// InitProducerId versions we speak: v3 brought epoch bumps for idempotent producers
/// (KIP-360); v5 only changes transactional semantics (KIP-890), which we do not use.
pub const INIT_PRODUCER_ID_VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };
/// Largest control-plane response we read (InitProducerId answers are a few dozen bytes).
pub const MAX_CONTROL_RESPONSE: usize = 64 << 10;

/// A control-plane message that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot encode {api} v{version}: {message}")]
    Encode {
        api: &'static str,
        version: i16,
        message: String,
    },
    #[error("cannot decode {api} v{version} response: {message}")]
    Decode {
        api: &'static str,
        version: i16,
        message: String,
    },
    #[error("{api} response has correlation id {got}, expected {expected}")]
    Correlation {
        api: &'static str,
        expected: i32,
        got: i32,
    },
}

/// Appends a size-prefixed request (header and body) for `api_key` at `version` to `buf`.
pub fn encode_request<R: Encodable + HeaderVersion>(
    buf: &mut Vec<u8>,
    api: &'static str,
    api_key: i16,
    version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
    body: &R,
) -> Result<(), ControlError> {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let header = RequestHeader::default()
        .with_request_api_key(api_key)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(client_id.map(|c| StrBytes::from_string(c.to_owned())));
    let encode_err = |message: String| ControlError::Encode {
        api,
        version,
        message,
    };
    header
        .encode(buf, R::header_version(version))
        .map_err(|e| encode_err(e.to_string()))?;
    body.encode(buf, version)
        .map_err(|e| encode_err(e.to_string()))?;
    let size = i32::try_from(buf.len() - start - 4).map_err(|_| ControlError::Encode {
        api,
        version,
        message: "request too large".into(),
    })?;
    buf[start..start + 4].copy_from_slice(&size.to_be_bytes());
    Ok(())
}

/// Decodes a response frame (without its size prefix): header, correlation check, body.
/// The frame's size was bounded when it was read; the crate checks every length against
/// the bytes that remain before it reads or allocates.
pub fn decode_response<R: Decodable + HeaderVersion>(
    frame: &[u8],
    api: &'static str,
    version: i16,
    correlation_id: i32,
) -> Result<R, ControlError> {
    let decode_err = |message: String| ControlError::Decode {
        api,
        version,
        message,
    };
    let mut buf = frame;
    let header = ResponseHeader::decode(&mut buf, R::header_version(version))
        .map_err(|e| decode_err(e.to_string()))?;
    if header.correlation_id != correlation_id {
        return Err(ControlError::Correlation {
            api,
            expected: correlation_id,
            got: header.correlation_id,
        });
    }
    R::decode(&mut buf, version).map_err(|e| decode_err(e.to_string()))
}

/// The producer identity an InitProducerId answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdentity {
    pub error_code: i16,
    pub producer_id: i64,
    pub epoch: i16,
}

/// An InitProducerId request for an idempotent (not transactional) producer. With
/// `current` at v3+, the broker bumps that producer's epoch (KIP-360); otherwise it hands
/// out a new producer id.
pub fn encode_init_producer_id(
    buf: &mut Vec<u8>,
    version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
    current: Option<(i64, i16)>,
) -> Result<(), ControlError> {
    let mut body = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(-1);
    // Below v3 the fields do not exist: the broker always hands out a new id.
    if let Some((id, epoch)) = current.filter(|_| version >= 3) {
        body = body
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(epoch);
    }
    encode_request(
        buf,
        "InitProducerId",
        API_KEY_INIT_PRODUCER_ID,
        version,
        correlation_id,
        client_id,
        &body,
    )
}

pub fn decode_init_producer_id(
    frame: &[u8],
    version: i16,
    correlation_id: i32,
) -> Result<ProducerIdentity, ControlError> {
    let r: InitProducerIdResponse =
        decode_response(frame, "InitProducerId", version, correlation_id)?;
    Ok(ProducerIdentity {
        error_code: r.error_code,
        producer_id: r.producer_id.0,
        epoch: r.producer_epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Message;

    /// Our request, read back by the crate's own decoder, at every version.
    #[test]
    fn init_producer_id_request_round_trips_at_every_version() {
        for version in INIT_PRODUCER_ID_VERSIONS.min..=INIT_PRODUCER_ID_VERSIONS.max {
            let mut buf = Vec::new();
            encode_init_producer_id(&mut buf, version, 77, Some("dory"), Some((5, 2))).unwrap();
            let size = i32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
            assert_eq!(size, buf.len() - 4);
            let mut body = &buf[4..];
            let header =
                RequestHeader::decode(&mut body, InitProducerIdRequest::header_version(version))
                    .unwrap();
            assert_eq!(header.request_api_key, API_KEY_INIT_PRODUCER_ID);
            assert_eq!(header.request_api_version, version);
            assert_eq!(header.correlation_id, 77);
            assert_eq!(header.client_id.as_deref(), Some("dory"));
            let req = InitProducerIdRequest::decode(&mut body, version).unwrap();
            assert!(req.transactional_id.is_none());
            let want = if version >= 3 { (5, 2) } else { (-1, -1) };
            assert_eq!((req.producer_id.0, req.producer_epoch), want);
            assert!(body.is_empty(), "v{version}: trailing bytes");
        }
        const { assert!(InitProducerIdRequest::VERSIONS.max >= INIT_PRODUCER_ID_VERSIONS.max) };
    }

    fn response_frame(version: i16, correlation_id: i32, r: &InitProducerIdResponse) -> Vec<u8> {
        let mut buf = Vec::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut buf, InitProducerIdResponse::header_version(version))
            .unwrap();
        r.encode(&mut buf, version).unwrap();
        buf
    }

    #[test]
    fn init_producer_id_response_decodes_at_every_version() {
        for version in INIT_PRODUCER_ID_VERSIONS.min..=INIT_PRODUCER_ID_VERSIONS.max {
            let r = InitProducerIdResponse::default()
                .with_error_code(0)
                .with_producer_id(ProducerId(4242))
                .with_producer_epoch(7);
            let frame = response_frame(version, 9, &r);
            let got = decode_init_producer_id(&frame, version, 9).unwrap();
            assert_eq!(
                got,
                ProducerIdentity {
                    error_code: 0,
                    producer_id: 4242,
                    epoch: 7
                }
            );
            assert!(matches!(
                decode_init_producer_id(&frame, version, 10),
                Err(ControlError::Correlation {
                    expected: 10,
                    got: 9,
                    ..
                })
            ));
            for cut in 0..frame.len() {
                assert!(
                    decode_init_producer_id(&frame[..cut], version, 9).is_err(),
                    "v{version}: a frame cut at {cut} decoded"
                );
            }
        }
    }
}
