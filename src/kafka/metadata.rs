//! Metadata (key 3), v0–v12: which brokers exist and which broker leads each partition.
//! The router uses it to route batches; we keep only brokers, the controller and
//! per-partition leaders, but every other field is still parsed so a malformed response is
//! rejected rather than misread.

use super::frame::{begin_request, read_response_header};
use super::primitives::{
    put_array_len, put_bool, put_empty_tagged_fields, put_nullable_array_len_flex, put_string_flex,
    put_uuid, DecodeError, Reader,
};
use super::{API_KEY_METADATA, METADATA_VERSIONS};

const API: &str = "metadata";

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataResponse {
    pub correlation_id: i32,
    pub brokers: Vec<MetadataBroker>,
    /// -1 when unknown (and always in v0, which has no controller field).
    pub controller_id: i32,
    pub topics: Vec<MetadataTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataBroker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataTopic {
    pub error_code: i16,
    /// Topic names are opaque bytes to us; a null name (v12+, topic-id lookups) is empty.
    pub name: Vec<u8>,
    pub partitions: Vec<MetadataPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataPartition {
    pub error_code: i16,
    pub partition: i32,
    /// Broker id of the leader, -1 if there is none.
    pub leader: i32,
}

fn is_flexible(version: i16) -> bool {
    version >= 9
}

/// Writes a complete Metadata request (size prefix included) at `version`.
///
/// `topics == None` asks for all topics. In v0 "all" is an empty array, so `Some(&[])`
/// also means all topics there; from v1 on it means none. `allow_auto_topic_creation` is
/// sent from v4 on (older brokers decide by their own config).
pub fn encode_request(
    buf: &mut Vec<u8>,
    version: i16,
    correlation_id: i32,
    client_id: Option<&str>,
    topics: Option<&[&[u8]]>,
    allow_auto_topic_creation: bool,
) {
    debug_assert!(METADATA_VERSIONS.contains(version));
    let flexible = is_flexible(version);
    let frame = begin_request(
        buf,
        API_KEY_METADATA,
        version,
        correlation_id,
        client_id,
        flexible,
    );
    match topics {
        None if version == 0 => put_array_len(buf, 0),
        None => put_nullable_array_len_flex(buf, flexible, None),
        Some(topics) => {
            put_nullable_array_len_flex(buf, flexible, Some(topics.len()));
            for name in topics {
                if version >= 10 {
                    // We look topics up by name; the zero UUID means "no topic id".
                    put_uuid(buf, &[0; 16]);
                }
                put_string_flex(buf, flexible, name);
                if flexible {
                    put_empty_tagged_fields(buf);
                }
            }
        }
    }
    if version >= 4 {
        put_bool(buf, allow_auto_topic_creation);
    }
    if (8..=10).contains(&version) {
        put_bool(buf, false); // include_cluster_authorized_operations
    }
    if version >= 8 {
        put_bool(buf, false); // include_topic_authorized_operations
    }
    if flexible {
        put_empty_tagged_fields(buf);
    }
    frame.finish(buf);
}

/// Decodes a Metadata response frame (size prefix stripped) of `version`.
pub fn decode_response(frame: &[u8], version: i16) -> Result<MetadataResponse, DecodeError> {
    if !METADATA_VERSIONS.contains(version) {
        return Err(DecodeError::UnsupportedVersion { api: API, version });
    }
    let flexible = is_flexible(version);
    let mut r = Reader::new(frame);
    let correlation_id = read_response_header(&mut r, flexible)?;
    if version >= 3 {
        let _throttle_time_ms = r.i32()?;
    }

    // Smallest broker entry: node id, host (2 or 1 bytes empty), port, rack from v1 (2 or 1
    // bytes null), tagged fields when flexible.
    let min_broker = if flexible {
        11
    } else {
        10 + if version >= 1 { 2 } else { 0 }
    };
    let broker_count = r.array_len_flex(flexible, min_broker)?;
    let mut brokers = Vec::with_capacity(broker_count);
    for _ in 0..broker_count {
        let node_id = r.i32()?;
        let host = if flexible {
            r.compact_string()?
        } else {
            r.string()?
        };
        let port = r.i32()?;
        if version >= 1 {
            let _rack = r.nullable_string_bytes_flex(flexible)?;
        }
        if flexible {
            r.skip_tagged_fields()?;
        }
        brokers.push(MetadataBroker {
            node_id,
            host: host.to_owned(),
            port,
        });
    }

    if version >= 2 {
        let _cluster_id = r.nullable_string_bytes_flex(flexible)?;
    }
    let controller_id = if version >= 1 { r.i32()? } else { -1 };

    // Smallest topic entry: error code, name, partitions count, plus later fields.
    let min_topic = 2
        + if flexible { 1 + 1 + 1 } else { 2 + 4 }
        + if version >= 10 { 16 } else { 0 }
        + usize::from(version >= 1)
        + if version >= 8 { 4 } else { 0 };
    let topic_count = r.array_len_flex(flexible, min_topic)?;
    let mut topics = Vec::with_capacity(topic_count);
    for _ in 0..topic_count {
        let error_code = r.i16()?;
        let name = if version >= 12 {
            r.compact_nullable_string_bytes()?.unwrap_or_default()
        } else {
            r.string_bytes_flex(flexible)?
        };
        if version >= 10 {
            let _topic_id = r.uuid()?;
        }
        if version >= 1 {
            let _is_internal = r.bool()?;
        }
        let partitions = decode_partitions(&mut r, version, flexible)?;
        if version >= 8 {
            let _topic_authorized_operations = r.i32()?;
        }
        if flexible {
            r.skip_tagged_fields()?;
        }
        topics.push(MetadataTopic {
            error_code,
            name: name.to_vec(),
            partitions,
        });
    }

    if (8..=10).contains(&version) {
        let _cluster_authorized_operations = r.i32()?;
    }
    if flexible {
        r.skip_tagged_fields()?;
    }
    // Bytes after the last field are ignored, as Kafka's own clients do: librdkafka's
    // mock broker, for one, ends flexible responses with an extra byte.
    r.finish_lenient();
    Ok(MetadataResponse {
        correlation_id,
        brokers,
        controller_id,
        topics,
    })
}

fn decode_partitions(
    r: &mut Reader<'_>,
    version: i16,
    flexible: bool,
) -> Result<Vec<MetadataPartition>, DecodeError> {
    // error code, index, leader, epoch (v7+), replicas, isr, offline (v5+), tagged fields.
    let array = if flexible { 1 } else { 4 };
    let min_partition = 2
        + 4
        + 4
        + if version >= 7 { 4 } else { 0 }
        + 2 * array
        + if version >= 5 { array } else { 0 }
        + usize::from(flexible);
    let count = r.array_len_flex(flexible, min_partition)?;
    let mut partitions = Vec::with_capacity(count);
    for _ in 0..count {
        let error_code = r.i16()?;
        let partition = r.i32()?;
        let leader = r.i32()?;
        if version >= 7 {
            let _leader_epoch = r.i32()?;
        }
        r.skip_i32_array(flexible)?; // replica_nodes
        r.skip_i32_array(flexible)?; // isr_nodes
        if version >= 5 {
            r.skip_i32_array(flexible)?; // offline_replicas
        }
        if flexible {
            r.skip_tagged_fields()?;
        }
        partitions.push(MetadataPartition {
            error_code,
            partition,
            leader,
        });
    }
    Ok(partitions)
}

#[cfg(test)]
mod tests {
    //! kafka-protocol (client feature) can encode requests and decode responses: requests
    //! are compared byte for byte with its encoding; responses come from a test encoder,
    //! are decoded by both kafka-protocol and us, and the results compared.

    use super::*;
    use crate::kafka::primitives::{
        put_compact_nullable_string, put_i16, put_i32, put_nullable_string, put_unsigned_varint,
    };
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{
        MetadataRequest, MetadataResponse as KpResponse, RequestHeader, ResponseHeader, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    fn kafka_protocol_request(
        version: i16,
        client_id: Option<&str>,
        topics: Option<&[&str]>,
        auto_create: bool,
    ) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut header = RequestHeader::default();
        header.request_api_key = API_KEY_METADATA;
        header.request_api_version = version;
        header.correlation_id = 7;
        header.client_id = client_id.map(|c| StrBytes::from_string(c.to_owned()));
        header
            .encode(&mut buf, if version >= 9 { 2 } else { 1 })
            .unwrap();
        let mut req = MetadataRequest::default();
        req.topics = match topics {
            None if version == 0 => Some(Vec::new()),
            None => None,
            Some(names) => Some(
                names
                    .iter()
                    .map(|n| {
                        let mut t = MetadataRequestTopic::default();
                        t.name = Some(TopicName(StrBytes::from_string((*n).to_owned())));
                        t
                    })
                    .collect(),
            ),
        };
        // kafka-protocol refuses non-default values for fields the version lacks.
        req.allow_auto_topic_creation = auto_create || version < 4;
        req.encode(&mut buf, version).unwrap();
        buf
    }

    #[test]
    fn requests_match_kafka_protocol_byte_for_byte() {
        let names: [&[u8]; 2] = [b"alpha", b"beta.gamma"];
        let strs = ["alpha", "beta.gamma"];
        for version in 0..=12 {
            for auto_create in [false, true] {
                for (client_id, topics, kp_topics) in [
                    (Some("dory"), Some(&names[..]), Some(&strs[..])),
                    (None, None, None),
                    (Some(""), Some(&names[..0]), Some(&strs[..0])),
                ] {
                    let mut ours = Vec::new();
                    encode_request(&mut ours, version, 7, client_id, topics, auto_create);
                    let size = i32::from_be_bytes(ours[..4].try_into().unwrap());
                    assert_eq!(size as usize, ours.len() - 4);
                    let theirs = kafka_protocol_request(version, client_id, kp_topics, auto_create);
                    assert_eq!(
                        &ours[4..],
                        &theirs[..],
                        "v{version} auto={auto_create} topics={topics:?}"
                    );
                }
            }
        }
    }

    struct Part {
        error: i16,
        index: i32,
        leader: i32,
    }

    struct Topic {
        error: i16,
        name: Option<&'static [u8]>,
        parts: Vec<Part>,
    }

    fn sample_topics() -> Vec<Topic> {
        vec![
            Topic {
                error: 0,
                name: Some(b"events"),
                parts: vec![
                    Part {
                        error: 0,
                        index: 0,
                        leader: 1,
                    },
                    Part {
                        error: 0,
                        index: 1,
                        leader: 2,
                    },
                    Part {
                        error: 5,
                        index: 2,
                        leader: -1,
                    },
                ],
            },
            Topic {
                error: 3,
                name: Some(b"missing"),
                parts: vec![],
            },
        ]
    }

    const BROKERS: &[(i32, &str, i32)] = &[(1, "b1.example", 9092), (2, "b2.example", 9093)];

    /// Test encoder for a whole response frame (header + body) at `version`, filling every
    /// field we skip with non-default values so skipping is exercised.
    fn encode_response_frame(correlation_id: i32, topics: &[Topic], version: i16) -> Vec<u8> {
        let flexible = version >= 9;
        let mut b = Vec::new();
        let arr = |b: &mut Vec<u8>, n: usize| {
            if flexible {
                put_unsigned_varint(b, n as u32 + 1);
            } else {
                put_i32(b, n as i32);
            }
        };
        let nstr = |b: &mut Vec<u8>, s: Option<&[u8]>| {
            if flexible {
                put_compact_nullable_string(b, s);
            } else {
                put_nullable_string(b, s);
            }
        };
        let tags = |b: &mut Vec<u8>| {
            if flexible {
                // One unknown tagged field, to be skipped.
                b.extend_from_slice(&[1, 90, 2, 0xab, 0xcd]);
            }
        };
        put_i32(&mut b, correlation_id);
        if flexible {
            b.push(0);
        }
        if version >= 3 {
            put_i32(&mut b, 3);
        }
        arr(&mut b, BROKERS.len());
        for &(id, host, port) in BROKERS {
            put_i32(&mut b, id);
            nstr(&mut b, Some(host.as_bytes()));
            put_i32(&mut b, port);
            if version >= 1 {
                nstr(&mut b, Some(b"rack-a"));
            }
            tags(&mut b);
        }
        if version >= 2 {
            nstr(&mut b, Some(b"cluster"));
        }
        if version >= 1 {
            put_i32(&mut b, 2);
        }
        arr(&mut b, topics.len());
        for t in topics {
            put_i16(&mut b, t.error);
            nstr(&mut b, t.name);
            if version >= 10 {
                b.extend_from_slice(&[0x11; 16]);
            }
            if version >= 1 {
                b.push(0);
            }
            arr(&mut b, t.parts.len());
            for p in &t.parts {
                put_i16(&mut b, p.error);
                put_i32(&mut b, p.index);
                put_i32(&mut b, p.leader);
                if version >= 7 {
                    put_i32(&mut b, 4);
                }
                let replica_lists = if version >= 5 { 3 } else { 2 };
                for n in 0..replica_lists {
                    arr(&mut b, 2 - n);
                    for r in 0..(2 - n) {
                        put_i32(&mut b, r as i32 + 1);
                    }
                }
                tags(&mut b);
            }
            if version >= 8 {
                put_i32(&mut b, 0x0f);
            }
            tags(&mut b);
        }
        if (8..=10).contains(&version) {
            put_i32(&mut b, 0x3f);
        }
        tags(&mut b);
        b
    }

    /// Decodes with kafka-protocol and maps to our types.
    fn kafka_protocol_decode(frame: &[u8], version: i16) -> MetadataResponse {
        let mut slice = frame;
        let header = ResponseHeader::decode(&mut slice, if version >= 9 { 1 } else { 0 }).unwrap();
        let kp = KpResponse::decode(&mut slice, version).unwrap();
        assert!(slice.is_empty(), "kafka-protocol left bytes at v{version}");
        MetadataResponse {
            correlation_id: header.correlation_id,
            brokers: kp
                .brokers
                .iter()
                .map(|b| MetadataBroker {
                    node_id: b.node_id.0,
                    host: b.host.as_str().to_owned(),
                    port: b.port,
                })
                .collect(),
            controller_id: kp.controller_id.0,
            topics: kp
                .topics
                .iter()
                .map(|t| MetadataTopic {
                    error_code: t.error_code,
                    name: t
                        .name
                        .as_ref()
                        .map(|n| n.0.as_bytes().to_vec())
                        .unwrap_or_default(),
                    partitions: t
                        .partitions
                        .iter()
                        .map(|p| MetadataPartition {
                            error_code: p.error_code,
                            partition: p.partition_index,
                            leader: p.leader_id.0,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn responses_decode_like_kafka_protocol() {
        for version in 0..=12 {
            let frame = encode_response_frame(11, &sample_topics(), version);
            let theirs = kafka_protocol_decode(&frame, version);
            let ours =
                decode_response(&frame, version).unwrap_or_else(|e| panic!("v{version}: {e}"));
            assert_eq!(ours, theirs, "v{version}");
            // And the values are the ones we wrote.
            assert_eq!(ours.correlation_id, 11);
            assert_eq!(ours.controller_id, if version >= 1 { 2 } else { -1 });
            assert_eq!(ours.brokers[1].host, "b2.example");
            assert_eq!(ours.brokers[1].port, 9093);
            assert_eq!(ours.topics[0].name, b"events");
            assert_eq!(ours.topics[0].partitions[2].leader, -1);
            assert_eq!(ours.topics[0].partitions[2].error_code, 5);
            assert_eq!(ours.topics[1].error_code, 3);
        }
    }

    #[test]
    fn null_topic_name_in_v12_is_empty() {
        let mut topics = sample_topics();
        topics[1].name = None;
        let frame = encode_response_frame(1, &topics, 12);
        let resp = decode_response(&frame, 12).unwrap();
        assert_eq!(resp.topics[1].name, b"");
        // Before v12 the name is not nullable.
        for version in [0, 9, 11] {
            let frame = encode_response_frame(1, &topics, version);
            assert!(matches!(
                decode_response(&frame, version),
                Err(DecodeError::UnexpectedNull(_))
            ));
        }
    }

    #[test]
    fn every_truncation_fails_cleanly() {
        for version in 0..=12 {
            let frame = encode_response_frame(1, &sample_topics(), version);
            for len in 0..frame.len() {
                assert!(
                    decode_response(&frame[..len], version).is_err(),
                    "v{version} len {len}"
                );
            }
        }
    }

    #[test]
    fn huge_declared_lengths_fail_without_allocating() {
        // v0: correlation id, then a broker array claiming i32::MAX entries.
        let mut frame = Vec::new();
        put_i32(&mut frame, 1);
        put_i32(&mut frame, i32::MAX);
        assert!(matches!(
            decode_response(&frame, 0),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        // v12: empty brokers, then a compact topic array claiming u32::MAX - 1 entries.
        let mut frame = Vec::new();
        put_i32(&mut frame, 1);
        frame.push(0); // header tagged fields
        put_i32(&mut frame, 0); // throttle
        put_unsigned_varint(&mut frame, 1); // no brokers
        put_unsigned_varint(&mut frame, 0); // null cluster id
        put_i32(&mut frame, -1); // controller
        put_unsigned_varint(&mut frame, u32::MAX);
        assert!(matches!(
            decode_response(&frame, 12),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        // A replica list claiming more entries than bytes remain.
        let mut frame = encode_response_frame(1, &sample_topics(), 4);
        let mut bad = frame.clone();
        // The first partition: error 0, index 0, leader 1, replica count 2 -> inflate the count.
        let needle = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2];
        let pos = bad.windows(needle.len()).position(|w| w == needle).unwrap() + 10;
        bad[pos..pos + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            decode_response(&bad, 4),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        // Negative array length where null is not allowed.
        frame.truncate(4);
        put_i32(&mut frame, 0); // throttle (v3+)
        put_i32(&mut frame, -1);
        assert!(decode_response(&frame, 4).is_err());
        assert!(matches!(
            decode_response(&frame, 13),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
    }
}
