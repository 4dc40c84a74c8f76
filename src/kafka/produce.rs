//! Produce (key 0), v0–v8, the hot path. The request is written incrementally so record
//! batches are encoded straight into the request buffer: begin, then per topic and
//! partition reserve the records length, let the caller write one RecordBatch (v3+) or
//! MessageSet (v0–v2: `kafka::message_set`), patch the
//! length; finally patch the frame size. Only non-flexible versions are supported, so every
//! length is a fixed-width placeholder. Note that with `acks = 0` the broker sends no
//! response at all.

use super::frame::{begin_request, read_response_header, FrameStart};
use super::primitives::{
    put_array_len, put_i16, put_i32, put_i32_at, put_nullable_string, put_string, reserve_i32,
    DecodeError, Reader,
};
use super::{API_KEY_PRODUCE, PRODUCE_CODEC_VERSIONS};

const API: &str = "produce";

/// Builds one Produce request in a caller-owned buffer.
///
/// ```text
/// let mut w = ProduceRequestWriter::begin(buf, 8, corr, Some("dory"), -1, 30_000, 1);
/// w.begin_topic(buf, b"events", 1);
/// w.begin_partition(buf, 0);
/// /* RecordBatchWriter::begin(buf, ..) / append / finish */
/// w.end_partition(buf);
/// w.finish(buf);
/// ```
#[derive(Debug)]
#[must_use = "a produce request must be finished to patch its size prefix"]
pub struct ProduceRequestWriter {
    frame: FrameStart,
    topics_declared: usize,
    topics_begun: usize,
    partitions_declared: usize,
    partitions_done: usize,
    /// Position of the reserved records length of the open partition.
    records_len_pos: Option<usize>,
}

impl ProduceRequestWriter {
    /// Writes the frame header and the request fields up to the topic array, which will hold
    /// `topic_count` topics. `transactional_id` is null (we are not transactional).
    pub fn begin(
        buf: &mut Vec<u8>,
        version: i16,
        correlation_id: i32,
        client_id: Option<&str>,
        acks: i16,
        timeout_ms: i32,
        topic_count: usize,
    ) -> ProduceRequestWriter {
        debug_assert!(PRODUCE_CODEC_VERSIONS.contains(version));
        let frame = begin_request(
            buf,
            API_KEY_PRODUCE,
            version,
            correlation_id,
            client_id,
            false,
        );
        if version >= 3 {
            put_nullable_string(buf, None); // transactional_id
        }
        put_i16(buf, acks);
        put_i32(buf, timeout_ms);
        put_array_len(buf, topic_count);
        ProduceRequestWriter {
            frame,
            topics_declared: topic_count,
            topics_begun: 0,
            partitions_declared: 0,
            partitions_done: 0,
            records_len_pos: None,
        }
    }

    /// Starts the next topic, which will hold `partition_count` partitions.
    pub fn begin_topic(&mut self, buf: &mut Vec<u8>, name: &[u8], partition_count: usize) {
        debug_assert!(self.topics_begun < self.topics_declared, "too many topics");
        debug_assert_eq!(
            self.partitions_done, self.partitions_declared,
            "previous topic is missing partitions"
        );
        debug_assert!(self.records_len_pos.is_none(), "partition left open");
        put_string(buf, name);
        put_array_len(buf, partition_count);
        self.topics_begun += 1;
        self.partitions_declared = partition_count;
        self.partitions_done = 0;
    }

    /// Starts a partition and reserves its records length; the caller then writes exactly
    /// one RecordBatch into `buf` and calls [`Self::end_partition`].
    pub fn begin_partition(&mut self, buf: &mut Vec<u8>, partition: i32) {
        debug_assert!(self.topics_begun > 0, "partition outside a topic");
        debug_assert!(
            self.partitions_done < self.partitions_declared,
            "too many partitions"
        );
        debug_assert!(self.records_len_pos.is_none(), "partition left open");
        put_i32(buf, partition);
        self.records_len_pos = Some(reserve_i32(buf));
    }

    /// Patches the records length of the open partition with what was written since.
    pub fn end_partition(&mut self, buf: &mut [u8]) {
        debug_assert!(self.records_len_pos.is_some(), "no partition open");
        if let Some(pos) = self.records_len_pos.take() {
            let len = buf.len() - pos - 4;
            debug_assert!(i32::try_from(len).is_ok(), "records exceed i32::MAX");
            put_i32_at(buf, pos, i32::try_from(len).unwrap_or(i32::MAX));
            self.partitions_done += 1;
        }
    }

    /// Patches the frame size. Declared topic and partition counts must have been met.
    pub fn finish(self, buf: &mut [u8]) {
        debug_assert_eq!(self.topics_begun, self.topics_declared, "missing topics");
        debug_assert_eq!(
            self.partitions_done, self.partitions_declared,
            "last topic is missing partitions"
        );
        debug_assert!(self.records_len_pos.is_none(), "partition left open");
        self.frame.finish(buf);
    }
}

/// A decoded Produce response. Topic names borrow from the frame, and every partition is
/// one entry of one vector: a response to a request of many topics costs one allocation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProduceResponse<'a> {
    pub correlation_id: i32,
    /// Every partition answered, in the response's order.
    pub partitions: Vec<ProducePartitionResponse<'a>>,
    pub throttle_time_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProducePartitionResponse<'a> {
    /// The topic's name, as the response spells it.
    pub topic: &'a [u8],
    pub partition: i32,
    pub error_code: i16,
    /// Offset of the first record of the batch; -1 on error.
    pub base_offset: i64,
}

/// Decodes a Produce response frame (size prefix stripped) of `version`.
pub fn decode_response(frame: &[u8], version: i16) -> Result<ProduceResponse<'_>, DecodeError> {
    if !PRODUCE_CODEC_VERSIONS.contains(version) {
        return Err(DecodeError::UnsupportedVersion { api: API, version });
    }
    let mut r = Reader::new(frame);
    let correlation_id = read_response_header(&mut r, false)?;
    // Smallest topic: empty name and partition count.
    let topic_count = r.array_len(2 + 4)?;
    let mut partitions = Vec::new();
    // Smallest partition: index, error, base offset, log append time (v2+), log start
    // offset (v5+), record errors and error message (v8+).
    let min_partition = 4
        + 2
        + 8
        + if version >= 2 { 8 } else { 0 }
        + if version >= 5 { 8 } else { 0 }
        + if version >= 8 { 4 + 2 } else { 0 };
    for _ in 0..topic_count {
        let name = r.string_bytes()?;
        // Checked against the bytes left, so the reservation is bounded by the frame.
        let partition_count = r.array_len(min_partition)?;
        partitions.reserve(partition_count);
        for _ in 0..partition_count {
            let partition = r.i32()?;
            let error_code = r.i16()?;
            let base_offset = r.i64()?;
            if version >= 2 {
                let _log_append_time_ms = r.i64()?;
            }
            if version >= 5 {
                let _log_start_offset = r.i64()?;
            }
            if version >= 8 {
                // record_errors: batch index and nullable message each.
                let errors = r.array_len(4 + 2)?;
                for _ in 0..errors {
                    let _batch_index = r.i32()?;
                    let _message = r.nullable_string_bytes()?;
                }
                let _error_message = r.nullable_string_bytes()?;
            }
            partitions.push(ProducePartitionResponse {
                topic: name,
                partition,
                error_code,
                base_offset,
            });
        }
    }
    let throttle_time_ms = if version >= 1 { r.i32()? } else { 0 };
    // Bytes after the last field are ignored, as Kafka's own clients do: librdkafka's
    // mock broker, for one, ends flexible responses with an extra byte.
    r.finish_lenient();
    Ok(ProduceResponse {
        correlation_id,
        partitions,
        throttle_time_ms,
    })
}

#[cfg(test)]
mod tests {
    //! kafka-protocol (client feature) can encode requests and decode responses: requests
    //! are compared byte for byte with its encoding; responses come from a test encoder,
    //! are decoded by both kafka-protocol and us, and the results compared.

    use super::*;
    use crate::kafka::primitives::{put_i32, put_i64};
    use crate::kafka::record_batch::RecordBatchWriter;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        ProduceRequest, ProduceResponse as KpResponse, RequestHeader, ResponseHeader, TopicName,
    };
    use kafka_protocol::protocol::buf::ByteBuf;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use kafka_protocol::records::RecordBatchDecoder;

    type Layout = Vec<(&'static [u8], Vec<i32>)>;

    fn layout() -> Layout {
        vec![(b"events", vec![0, 4]), (b"logs", vec![7])]
    }

    fn write_batch(buf: &mut Vec<u8>, topic: &[u8], partition: i32) {
        let mut w = RecordBatchWriter::begin(buf, 1000, 0);
        w.append(buf, 1000 + i64::from(partition), None, Some(topic));
        w.append(buf, 1001, Some(b"k"), Some(b"v"));
        w.finish(buf);
    }

    fn batch(topic: &[u8], partition: i32) -> Vec<u8> {
        let mut buf = Vec::new();
        write_batch(&mut buf, topic, partition);
        buf
    }

    /// Our request, with batches written in place by `RecordBatchWriter`.
    fn our_request(version: i16, layout: &Layout) -> Vec<u8> {
        let mut buf = b"unrelated bytes before the frame".to_vec();
        let skip = buf.len();
        let mut w = ProduceRequestWriter::begin(
            &mut buf,
            version,
            99,
            Some("dory"),
            -1,
            1500,
            layout.len(),
        );
        for (topic, parts) in layout {
            w.begin_topic(&mut buf, topic, parts.len());
            for &p in parts {
                w.begin_partition(&mut buf, p);
                write_batch(&mut buf, topic, p);
                w.end_partition(&mut buf);
            }
        }
        w.finish(&mut buf);
        buf.split_off(skip)
    }

    fn kafka_protocol_request(version: i16, layout: &Layout) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut header = RequestHeader::default();
        header.request_api_key = API_KEY_PRODUCE;
        header.request_api_version = version;
        header.correlation_id = 99;
        header.client_id = Some(StrBytes::from_static_str("dory"));
        header.encode(&mut buf, 1).unwrap();
        let mut req = ProduceRequest::default();
        req.transactional_id = None;
        req.acks = -1;
        req.timeout_ms = 1500;
        for (topic, parts) in layout {
            let mut t = TopicProduceData::default();
            t.name = TopicName(StrBytes::from_string(
                String::from_utf8(topic.to_vec()).unwrap(),
            ));
            for &p in parts {
                let mut pd = PartitionProduceData::default();
                pd.index = p;
                let bytes = batch(topic, p);
                let mut slice = &bytes[..];
                pd.records = Some(slice.get_bytes(bytes.len()));
                t.partition_data.push(pd);
            }
            req.topic_data.push(t);
        }
        req.encode(&mut buf, version).unwrap();
        buf
    }

    #[test]
    fn requests_match_kafka_protocol_byte_for_byte() {
        for version in 0..=8 {
            let ours = our_request(version, &layout());
            let size = i32::from_be_bytes(ours[..4].try_into().unwrap());
            assert_eq!(size as usize, ours.len() - 4);
            let theirs = kafka_protocol_request(version, &layout());
            assert_eq!(&ours[4..], &theirs[..], "v{version}");
        }
    }

    #[test]
    fn embedded_batches_decode_with_kafka_protocol() {
        let b = batch(b"events", 4);
        let mut slice = &b[..];
        let sets = RecordBatchDecoder::decode_all(&mut slice).unwrap();
        assert_eq!(sets[0].records[0].value.as_deref(), Some(&b"events"[..]));
        assert_eq!(sets[0].records[1].key.as_deref(), Some(&b"k"[..]));
    }

    #[test]
    fn empty_request_is_well_formed() {
        let empty: Layout = Vec::new();
        assert_eq!(
            &our_request(8, &empty)[4..],
            &kafka_protocol_request(8, &empty)[..]
        );
    }

    /// `(partition, error, base_offset)` per topic.
    type TopicResults = (&'static [u8], Vec<(i32, i16, i64)>);

    fn sample_response() -> Vec<TopicResults> {
        vec![
            (b"events", vec![(0, 0, 100), (4, 6, -1)]),
            (b"logs", vec![(7, 0, 5)]),
        ]
    }

    /// Test encoder for a whole response frame at `version`; skipped fields get
    /// non-default values, and failed partitions carry record errors (v8).
    fn encode_response_frame(
        correlation_id: i32,
        topics: &[TopicResults],
        version: i16,
    ) -> Vec<u8> {
        let mut b = Vec::new();
        put_i32(&mut b, correlation_id);
        put_array_len(&mut b, topics.len());
        for (name, parts) in topics {
            put_string(&mut b, name);
            put_array_len(&mut b, parts.len());
            for &(index, error, base_offset) in parts {
                put_i32(&mut b, index);
                put_i16(&mut b, error);
                put_i64(&mut b, base_offset);
                if version >= 2 {
                    put_i64(&mut b, 1_700_000_000_000); // log_append_time_ms
                }
                if version >= 5 {
                    put_i64(&mut b, 3); // log_start_offset
                }
                if version >= 8 {
                    if error != 0 {
                        put_array_len(&mut b, 2);
                        put_i32(&mut b, 0);
                        put_nullable_string(&mut b, Some(b"bad record"));
                        put_i32(&mut b, 1);
                        put_nullable_string(&mut b, None);
                        put_nullable_string(&mut b, Some(b"not leader"));
                    } else {
                        put_array_len(&mut b, 0);
                        put_nullable_string(&mut b, None);
                    }
                }
            }
        }
        if version >= 1 {
            put_i32(&mut b, 250); // throttle_time_ms
        }
        b
    }

    /// One answered partition, owned: `(topic, partition, error, base_offset)`.
    type Answer = (Vec<u8>, i32, i16, i64);

    /// Decodes with kafka-protocol: correlation id, throttle time and the answers in order.
    fn kafka_protocol_decode(frame: &[u8], version: i16) -> (i32, i32, Vec<Answer>) {
        let mut slice = frame;
        let header = ResponseHeader::decode(&mut slice, 0).unwrap();
        let kp = KpResponse::decode(&mut slice, version).unwrap();
        assert!(slice.is_empty(), "kafka-protocol left bytes at v{version}");
        if version >= 8 {
            assert_eq!(
                kp.responses[0].partition_responses[1].record_errors.len(),
                2
            );
        }
        let answers = kp
            .responses
            .iter()
            .flat_map(|t| {
                t.partition_responses.iter().map(|p| {
                    (
                        t.name.0.as_bytes().to_vec(),
                        p.index,
                        p.error_code,
                        p.base_offset,
                    )
                })
            })
            .collect();
        (header.correlation_id, kp.throttle_time_ms, answers)
    }

    #[test]
    fn responses_decode_like_kafka_protocol() {
        for version in 0..=8 {
            let frame = encode_response_frame(12, &sample_response(), version);
            let theirs = kafka_protocol_decode(&frame, version);
            let ours = decode_response(&frame, version).unwrap();
            let answers: Vec<Answer> = ours
                .partitions
                .iter()
                .map(|p| (p.topic.to_vec(), p.partition, p.error_code, p.base_offset))
                .collect();
            assert_eq!(
                (ours.correlation_id, ours.throttle_time_ms, answers),
                theirs,
                "v{version}"
            );
            assert_eq!(ours.correlation_id, 12);
            // v0 has no throttle time.
            assert_eq!(ours.throttle_time_ms, if version >= 1 { 250 } else { 0 });
            assert_eq!(
                ours.partitions[1],
                ProducePartitionResponse {
                    topic: b"events",
                    partition: 4,
                    error_code: 6,
                    base_offset: -1
                }
            );
            assert_eq!(ours.partitions[2].topic, b"logs");
        }
    }

    #[test]
    fn every_truncation_fails_cleanly() {
        for version in 0..=8 {
            let frame = encode_response_frame(1, &sample_response(), version);
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
        let mut frame = Vec::new();
        put_i32(&mut frame, 1);
        put_i32(&mut frame, i32::MAX);
        assert!(matches!(
            decode_response(&frame, 8),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        let mut frame = Vec::new();
        put_i32(&mut frame, 1);
        put_i32(&mut frame, 1);
        put_string(&mut frame, b"t");
        put_i32(&mut frame, 1_000_000);
        assert!(matches!(
            decode_response(&frame, 3),
            Err(DecodeError::ArrayTooLong { .. })
        ));
        for version in [-1, 9] {
            assert!(matches!(
                decode_response(&frame, version),
                Err(DecodeError::UnsupportedVersion { .. })
            ));
        }
    }
}
