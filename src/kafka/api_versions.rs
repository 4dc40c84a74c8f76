//! ApiVersions (key 18), v0–v3: the first request on every connection, telling us which
//! versions of each API the broker speaks. Handles KIP-511: a broker that does not support
//! our request version answers UNSUPPORTED_VERSION in the v0 body layout, listing the
//! ApiVersions versions it does support, so we can retry at one of them.

use super::errors::UNSUPPORTED_VERSION;
use super::frame::{begin_request, read_response_header};
use super::primitives::{put_compact_string, put_empty_tagged_fields, DecodeError, Reader};
use super::{API_KEY_API_VERSIONS, API_KEY_METADATA, API_KEY_PRODUCE, API_VERSIONS_VERSIONS};

const API: &str = "api_versions";

/// Name and version we announce in v3+ (must match `[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?`).
const CLIENT_SOFTWARE_NAME: &str = "dory";
const CLIENT_SOFTWARE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// One API the broker supports, with its inclusive version range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ApiVersionRange {
    pub api_key: i16,
    pub min_version: i16,
    pub max_version: i16,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiVersionsResponse {
    pub correlation_id: i32,
    pub error_code: i16,
    pub api_keys: Vec<ApiVersionRange>,
}

impl ApiVersionsResponse {
    /// The broker's range for `api_key`, if it lists that API.
    pub fn get(&self, api_key: i16) -> Option<&ApiVersionRange> {
        self.api_keys.iter().find(|r| r.api_key == api_key)
    }
}

/// What a broker that does not answer ApiVersions is taken to be (`kafka.broker_version`):
/// brokers before Kafka 0.10 close the connection on it. Named like librdkafka's
/// `broker.version.fallback`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BrokerVersion {
    /// Kafka 0.8 (0.8.2 for lz4): Produce v0, Metadata v0.
    V0_8,
    /// Kafka 0.9: Produce v1 (throttle time), Metadata v0.
    V0_9,
    /// Kafka 0.10 (which does answer ApiVersions): Produce v2, Metadata v1.
    V0_10,
}

impl BrokerVersion {
    /// "0.8", "0.9" or "0.10", optionally with further components ("0.9.0.1").
    pub fn parse(s: &str) -> Option<BrokerVersion> {
        let mut parts = s.split('.');
        let (major, minor) = (parts.next()?, parts.next()?);
        if major != "0" || !parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
            return None;
        }
        match minor {
            "8" => Some(BrokerVersion::V0_8),
            "9" => Some(BrokerVersion::V0_9),
            "10" => Some(BrokerVersion::V0_10),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BrokerVersion::V0_8 => "0.8",
            BrokerVersion::V0_9 => "0.9",
            BrokerVersion::V0_10 => "0.10",
        }
    }

    /// The API versions such a broker speaks, as ApiVersions would list them: Produce and
    /// Metadata only (no InitProducerId, no SASL).
    pub fn api_versions(self) -> ApiVersionsResponse {
        let (produce, metadata) = match self {
            BrokerVersion::V0_8 => (0, 0),
            BrokerVersion::V0_9 => (1, 0),
            BrokerVersion::V0_10 => (2, 1),
        };
        let range = |api_key, max_version| ApiVersionRange {
            api_key,
            min_version: 0,
            max_version,
        };
        ApiVersionsResponse {
            correlation_id: 0,
            error_code: 0,
            api_keys: vec![
                range(API_KEY_PRODUCE, produce),
                range(API_KEY_METADATA, metadata),
            ],
        }
    }
}

fn is_flexible(version: i16) -> bool {
    version >= 3
}

/// Writes a complete ApiVersions request (size prefix included) at `version`.
pub fn encode_request(
    buf: &mut Vec<u8>,
    version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
) {
    debug_assert!(API_VERSIONS_VERSIONS.contains(version));
    let flexible = is_flexible(version);
    let frame = begin_request(
        buf,
        API_KEY_API_VERSIONS,
        version,
        correlation_id,
        client_id,
        flexible,
    );
    if flexible {
        put_compact_string(buf, CLIENT_SOFTWARE_NAME.as_bytes());
        put_compact_string(buf, CLIENT_SOFTWARE_VERSION.as_bytes());
        put_empty_tagged_fields(buf);
    }
    frame.finish(buf);
}

/// Decodes an ApiVersions response frame (size prefix stripped). The response header is
/// always v0, even for flexible versions, so old brokers' answers parse too.
pub fn decode_response(frame: &[u8], version: i16) -> Result<ApiVersionsResponse, DecodeError> {
    if !API_VERSIONS_VERSIONS.contains(version) {
        return Err(DecodeError::UnsupportedVersion { api: API, version });
    }
    let mut r = Reader::new(frame);
    let correlation_id = read_response_header(&mut r, false)?;
    let body = r.rest();
    // The error code leads the body in every version, so it can be read before the layout
    // is known. UNSUPPORTED_VERSION comes in the v0 layout (KIP-511); fall back to the
    // requested layout in case a broker answers that way instead.
    let error_code = Reader::new(body).i16()?;
    // The v0 attempt is strict (it must consume the body exactly to be the right layout);
    // otherwise bytes after the last known field are ignored, as Kafka's clients do.
    let (error_code, api_keys) = if error_code == UNSUPPORTED_VERSION && version > 0 {
        decode_body(body, 0, true).or_else(|_| decode_body(body, version, false))?
    } else {
        decode_body(body, version, false)?
    };
    Ok(ApiVersionsResponse {
        correlation_id,
        error_code,
        api_keys,
    })
}

fn decode_body(
    body: &[u8],
    version: i16,
    strict: bool,
) -> Result<(i16, Vec<ApiVersionRange>), DecodeError> {
    let flexible = is_flexible(version);
    let mut r = Reader::new(body);
    let error_code = r.i16()?;
    let min_entry = if flexible { 7 } else { 6 };
    let count = r.array_len_flex(flexible, min_entry)?;
    let mut api_keys = Vec::with_capacity(count);
    for _ in 0..count {
        let api_key = r.i16()?;
        let min_version = r.i16()?;
        let max_version = r.i16()?;
        if flexible {
            r.skip_tagged_fields()?;
        }
        api_keys.push(ApiVersionRange {
            api_key,
            min_version,
            max_version,
        });
    }
    if version >= 1 {
        let _throttle_time_ms = r.i32()?;
    }
    if flexible {
        // SupportedFeatures, FinalizedFeaturesEpoch, FinalizedFeatures, ZkMigrationReady.
        r.skip_tagged_fields()?;
    }
    if strict {
        r.finish()?;
    } else {
        r.finish_lenient();
    }
    Ok((error_code, api_keys))
}

#[cfg(test)]
mod broker_version_tests {
    use super::*;
    use crate::kafka::{negotiate, negotiate_produce, METADATA_VERSIONS};

    #[test]
    fn versions_parse_and_map_to_what_those_brokers_speak() {
        for (s, want, produce, metadata) in [
            ("0.8", BrokerVersion::V0_8, 0, 0),
            ("0.8.2.2", BrokerVersion::V0_8, 0, 0),
            ("0.9", BrokerVersion::V0_9, 1, 0),
            ("0.9.0.1", BrokerVersion::V0_9, 1, 0),
            ("0.10", BrokerVersion::V0_10, 2, 1),
            ("0.10.2", BrokerVersion::V0_10, 2, 1),
        ] {
            let v = BrokerVersion::parse(s).unwrap_or_else(|| panic!("{s}"));
            assert_eq!(v, want);
            let a = v.api_versions();
            assert_eq!(
                negotiate_produce(a.get(API_KEY_PRODUCE)),
                Some(produce),
                "{s}"
            );
            assert_eq!(
                negotiate(METADATA_VERSIONS, a.get(API_KEY_METADATA)),
                Some(metadata)
            );
            assert_eq!(a.get(22), None, "no InitProducerId");
        }
        for bad in ["", "0", "1.0", "0.11", "0.7", "0.9.", "0.9.x", "2.8"] {
            assert_eq!(BrokerVersion::parse(bad), None, "{bad:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    //! kafka-protocol is built with its `client` feature only, which can encode requests
    //! and decode responses. So requests are checked byte for byte against its encoding, and
    //! responses are written by a small test encoder, decoded by both kafka-protocol and us,
    //! and the two results compared.

    use super::*;
    use crate::kafka::primitives::{
        put_array_len, put_compact_array_len, put_compact_string, put_i16, put_i32, put_i64,
        put_unsigned_varint,
    };
    use kafka_protocol::messages::{
        ApiVersionsRequest, ApiVersionsResponse as KpResponse, RequestHeader, ResponseHeader,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    #[test]
    fn requests_match_kafka_protocol_byte_for_byte() {
        for version in 0..=3 {
            for client_id in [None, Some("dory-test")] {
                let mut ours = Vec::new();
                encode_request(&mut ours, version, 42, client_id);
                let size = i32::from_be_bytes(ours[..4].try_into().unwrap());
                assert_eq!(size as usize, ours.len() - 4);

                let mut theirs = Vec::new();
                let mut header = RequestHeader::default();
                header.request_api_key = API_KEY_API_VERSIONS;
                header.request_api_version = version;
                header.correlation_id = 42;
                header.client_id = client_id.map(|c| StrBytes::from_string(c.to_owned()));
                header
                    .encode(&mut theirs, if version >= 3 { 2 } else { 1 })
                    .unwrap();
                let mut req = ApiVersionsRequest::default();
                req.client_software_name = StrBytes::from_static_str("dory");
                req.client_software_version = StrBytes::from_static_str(env!("CARGO_PKG_VERSION"));
                req.encode(&mut theirs, version).unwrap();
                assert_eq!(&ours[4..], &theirs[..], "v{version}");
            }
        }
    }

    const KEYS: &[(i16, i16, i16)] = &[(0, 3, 11), (3, 0, 12), (18, 0, 4)];

    /// Test encoder for a full response frame (header v0 + body) at `version`. Flexible
    /// versions carry tagged fields (supported features, finalized epoch) to be skipped.
    fn encode_response_frame(
        correlation_id: i32,
        error_code: i16,
        keys: &[(i16, i16, i16)],
        version: i16,
    ) -> Vec<u8> {
        let flexible = version >= 3;
        let mut b = Vec::new();
        put_i32(&mut b, correlation_id);
        put_i16(&mut b, error_code);
        if flexible {
            put_compact_array_len(&mut b, keys.len());
        } else {
            put_array_len(&mut b, keys.len());
        }
        for &(k, min, max) in keys {
            put_i16(&mut b, k);
            put_i16(&mut b, min);
            put_i16(&mut b, max);
            if flexible {
                b.push(0);
            }
        }
        if version >= 1 {
            put_i32(&mut b, 17); // throttle_time_ms
        }
        if flexible {
            put_unsigned_varint(&mut b, 2);
            // Tag 0: SupportedFeatures [{name, min, max}].
            let mut features = Vec::new();
            put_compact_array_len(&mut features, 1);
            put_compact_string(&mut features, b"metadata.version");
            put_i16(&mut features, 1);
            put_i16(&mut features, 25);
            features.push(0);
            put_unsigned_varint(&mut b, 0);
            put_unsigned_varint(&mut b, features.len() as u32);
            b.extend_from_slice(&features);
            // Tag 1: FinalizedFeaturesEpoch.
            put_unsigned_varint(&mut b, 1);
            put_unsigned_varint(&mut b, 8);
            put_i64(&mut b, 7);
        }
        b
    }

    fn kafka_protocol_decode(frame: &[u8], version: i16) -> (i32, KpResponse) {
        let mut slice = frame;
        let header = ResponseHeader::decode(&mut slice, 0).unwrap();
        let resp = KpResponse::decode(&mut slice, version).unwrap();
        assert!(slice.is_empty(), "kafka-protocol left bytes at v{version}");
        (header.correlation_id, resp)
    }

    #[test]
    fn responses_decode_like_kafka_protocol() {
        for version in 0..=3 {
            let frame = encode_response_frame(9, 0, KEYS, version);
            let (corr, kp) = kafka_protocol_decode(&frame, version);
            if version >= 3 {
                assert_eq!(kp.supported_features.len(), 1);
                assert_eq!(kp.finalized_features_epoch, 7);
            }
            let ours = decode_response(&frame, version).unwrap();
            assert_eq!(ours.correlation_id, corr);
            assert_eq!(ours.error_code, kp.error_code);
            let theirs: Vec<ApiVersionRange> = kp
                .api_keys
                .iter()
                .map(|k| ApiVersionRange {
                    api_key: k.api_key,
                    min_version: k.min_version,
                    max_version: k.max_version,
                })
                .collect();
            assert_eq!(ours.api_keys, theirs);
            assert_eq!(
                ours.get(3),
                Some(&ApiVersionRange {
                    api_key: 3,
                    min_version: 0,
                    max_version: 12
                })
            );
            assert_eq!(ours.get(1), None);
        }
    }

    #[test]
    fn unsupported_version_reply_is_read_in_v0_layout() {
        // What a KIP-511 broker sends when our ApiVersions version is too new for it.
        let frame = encode_response_frame(5, UNSUPPORTED_VERSION, &[(18, 0, 2)], 0);
        for version in 0..=3 {
            let resp = decode_response(&frame, version).unwrap();
            assert_eq!(resp.error_code, UNSUPPORTED_VERSION);
            assert_eq!(
                resp.get(API_KEY_API_VERSIONS).map(|r| r.max_version),
                Some(2)
            );
        }
        // A broker answering UNSUPPORTED_VERSION in the requested layout still parses.
        let frame = encode_response_frame(5, UNSUPPORTED_VERSION, KEYS, 3);
        let resp = decode_response(&frame, 3).unwrap();
        assert_eq!(resp.api_keys.len(), 3);
    }

    #[test]
    fn every_truncation_fails_cleanly() {
        for version in 0..=3 {
            let frame = encode_response_frame(1, 0, KEYS, version);
            for len in 0..frame.len() {
                assert!(
                    decode_response(&frame[..len], version).is_err(),
                    "v{version} {len}"
                );
            }
            // Bytes after the last known field are ignored (peers append fields).
            let mut long = frame.clone();
            long.push(0);
            assert_eq!(
                decode_response(&long, version),
                decode_response(&frame, version)
            );
            assert!(decode_response(&long, version).is_ok());
        }
    }

    #[test]
    fn huge_array_length_fails_without_allocating() {
        let mut frame = Vec::new();
        put_i32(&mut frame, 1);
        put_i16(&mut frame, 0);
        put_i32(&mut frame, i32::MAX);
        assert!(matches!(
            decode_response(&frame, 0),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        assert!(matches!(
            decode_response(&frame, 4),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
    }
}
