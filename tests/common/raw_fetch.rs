//! A second consumer, independent of librdkafka: raw Fetch v4 requests, each stored record
//! batch decoded with the `kafka-protocol` crate (which checks the CRC and decompresses),
//! with the batch header fields a consumer hides: codec bits, producer id, epoch and base
//! sequence.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, RequestHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{RecordBatchDecoder, TimestampType};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{poll_until, value_id, Consumed, TsType};

/// One record batch as the broker stores it.
#[derive(Debug)]
pub struct StoredBatch {
    pub partition: i32,
    pub base_offset: i64,
    /// Attributes bits 0-2: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
    pub codec: i16,
    /// The batch's bytes on the wire (header included).
    pub wire_len: usize,
    /// The idempotent producer's identity (-1 without idempotence) and the sequence
    /// number of the first record.
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records: Vec<Consumed>,
}

impl StoredBatch {
    /// Σ(key + value + 26) over its records: the size dory compares with `min_size`.
    pub fn dory_size(&self) -> usize {
        self.records
            .iter()
            .map(|r| r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len) + 26)
            .sum()
    }
    pub fn ids(&self) -> Vec<u32> {
        self.records
            .iter()
            .filter_map(|r| value_id(r.value.as_deref().unwrap_or_default()))
            .collect()
    }
}

/// Each partition of `topic` with its leader's `host:port` (rdkafka metadata).
pub fn partition_leaders(bootstrap: &str, topic: &str) -> Vec<(i32, String)> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("metadata client");
    poll_until(
        &format!("leaders of {topic:?}"),
        Duration::from_secs(20),
        || {
            let md = client
                .fetch_metadata(Some(topic), Duration::from_secs(2))
                .map_err(|e| e.to_string())?;
            let brokers: HashMap<i32, String> = md
                .brokers()
                .iter()
                .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
                .collect();
            let t = md
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .ok_or("topic not in metadata")?;
            let mut out = Vec::new();
            for p in t.partitions() {
                let addr = brokers
                    .get(&p.leader())
                    .ok_or_else(|| format!("partition {} has no known leader", p.id()))?;
                out.push((p.id(), addr.clone()));
            }
            out.sort();
            if out.is_empty() {
                Err("no partitions".into())
            } else {
                Ok(out)
            }
        },
    )
}

/// One Fetch v4 round trip: (high watermark, records bytes).
pub fn fetch_once(
    sock: &mut TcpStream,
    correlation_id: i32,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<(i64, Vec<u8>), String> {
    const VERSION: i16 = 4;
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Fetch as i16)
        .with_request_api_version(VERSION)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("dory-parity")));
    let req = FetchRequest::default()
        .with_max_wait_ms(50)
        .with_min_bytes(0)
        .with_max_bytes(64 << 20)
        .with_isolation_level(0)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(32 << 20)])]);
    let mut body = Vec::new();
    header
        .encode(&mut body, FetchRequest::header_version(VERSION))
        .map_err(|e| format!("encode header: {e}"))?;
    req.encode(&mut body, VERSION)
        .map_err(|e| format!("encode Fetch: {e}"))?;
    let mut frame = i32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    sock.write_all(&frame).map_err(|e| format!("write: {e}"))?;
    let mut len = [0u8; 4];
    sock.read_exact(&mut len)
        .map_err(|e| format!("read: {e}"))?;
    let len = usize::try_from(i32::from_be_bytes(len)).map_err(|_| "negative size")?;
    let mut resp = vec![0u8; len];
    sock.read_exact(&mut resp)
        .map_err(|e| format!("read: {e}"))?;
    if resp.len() < 4 || i32::from_be_bytes(resp[..4].try_into().unwrap()) != correlation_id {
        return Err("Fetch response with the wrong correlation id".into());
    }
    let mut rest: &[u8] = &resp[4..];
    let r = FetchResponse::decode(&mut rest, VERSION).map_err(|e| format!("decode: {e}"))?;
    let t = r
        .responses
        .iter()
        .find(|t| t.topic.0.to_string() == topic)
        .ok_or("topic missing from Fetch response")?;
    let p = t
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)
        .ok_or("partition missing from Fetch response")?;
    if p.error_code != 0 {
        return Err(format!("Fetch error code {}", p.error_code));
    }
    Ok((
        p.high_watermark,
        p.records.as_ref().map(|b| b.to_vec()).unwrap_or_default(),
    ))
}

/// Splits `buf` into complete record batches (a trailing partial one is left) and decodes
/// each with `kafka-protocol` (which checks the CRC and decompresses).
pub fn parse_batches(buf: &[u8], partition: i32) -> Result<Vec<(StoredBatch, i64)>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while buf.len() - pos >= 61 {
        let b = &buf[pos..];
        let base_offset = i64::from_be_bytes(b[..8].try_into().unwrap());
        let batch_len = usize::try_from(i32::from_be_bytes(b[8..12].try_into().unwrap()))
            .map_err(|_| "negative batch length")?;
        let total = 12 + batch_len;
        if total > b.len() {
            break;
        }
        let b = &b[..total];
        if b[16] != 2 {
            return Err(format!("batch at offset {base_offset}: magic {}", b[16]));
        }
        let attributes = i16::from_be_bytes(b[21..23].try_into().unwrap());
        let last_offset_delta = i32::from_be_bytes(b[23..27].try_into().unwrap());
        let producer_id = i64::from_be_bytes(b[43..51].try_into().unwrap());
        let producer_epoch = i16::from_be_bytes(b[51..53].try_into().unwrap());
        let base_sequence = i32::from_be_bytes(b[53..57].try_into().unwrap());
        let mut slice: &[u8] = b;
        let set = RecordBatchDecoder::decode(&mut slice)
            .map_err(|e| format!("batch at offset {base_offset}: {e:#}"))?;
        let records = set
            .records
            .into_iter()
            .map(|r| Consumed {
                partition,
                offset: r.offset,
                key: r.key.map(|k| k.to_vec()),
                value: r.value.map(|v| v.to_vec()),
                timestamp: r.timestamp,
                timestamp_type: match r.timestamp_type {
                    TimestampType::Creation => TsType::CreateTime,
                    TimestampType::LogAppend => TsType::LogAppendTime,
                },
            })
            .collect();
        out.push((
            StoredBatch {
                partition,
                base_offset,
                codec: attributes & 7,
                wire_len: total,
                producer_id,
                producer_epoch,
                base_sequence,
                records,
            },
            base_offset + i64::from(last_offset_delta),
        ));
        pos += total;
    }
    Ok(out)
}

/// Every record batch of every partition of `topic`, read from each partition's leader.
pub fn fetch_topic(bootstrap: &str, topic: &str) -> Vec<StoredBatch> {
    let mut all = Vec::new();
    for (partition, addr) in partition_leaders(bootstrap, topic) {
        let sa = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("cannot resolve {addr}"));
        let mut sock = TcpStream::connect_timeout(&sa, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        sock.set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut next = 0i64;
        let mut correlation_id = 0;
        loop {
            correlation_id += 1;
            let (hw, bytes) = fetch_once(&mut sock, correlation_id, topic, partition, next)
                .unwrap_or_else(|e| panic!("raw Fetch of {topic}/{partition} at {next}: {e}"));
            if next >= hw {
                break;
            }
            let batches = parse_batches(&bytes, partition)
                .unwrap_or_else(|e| panic!("{topic}/{partition}: {e}"));
            for (b, last) in batches {
                if last >= next {
                    next = last + 1;
                    all.push(b);
                }
            }
            assert!(
                Instant::now() < deadline,
                "raw Fetch of {topic}/{partition} made no progress past offset {next} (hw {hw})"
            );
        }
    }
    all
}

pub fn stored_records(batches: &[StoredBatch]) -> Vec<Consumed> {
    batches.iter().flat_map(|b| b.records.clone()).collect()
}

/// What a topic's stored batches show about resends, judged by the rules a Kafka broker
/// applies to an idempotent producer (KIP-98): a batch stored again under the same producer
/// id, epoch, base sequence and record count as an earlier one of its partition is a
/// *resend*, which Kafka recognises as long as the original is among the last five batches
/// of that producer it stored; any other second copy of a record is a *real* duplicate.
#[derive(Debug, Default)]
pub struct ResendReport {
    /// Records stored, and how many of them are copies of an id stored before.
    pub records: u64,
    pub duplicates: u64,
    /// Of `duplicates`: records in resend batches (a Kafka broker drops these).
    pub resend_copies: u64,
    /// Resend batches, and the most distinct batches of the same producer stored between a
    /// resend's original and the resend (Kafka recognises a resend only below 5).
    pub resend_batches: u64,
    pub max_resend_distance: usize,
    /// Copies beyond the first under another identity: duplicates a Kafka broker keeps.
    pub real_duplicates: u64,
    /// Up to 10 real duplicates and up to 3 resend copies, each with both copies'
    /// partition, offset, producer id, epoch and sequence.
    pub real_examples: Vec<String>,
    pub resend_examples: Vec<String>,
    /// Sequence numbering broken: two distinct batches of one producer identity and
    /// partition overlap, a resend holds other records than its original, or the
    /// sequences of an identity are not gapless from 0.
    pub problems: Vec<String>,
}

/// Analyses `batches` (as [`fetch_topic`] returns them: per partition, in offset order).
pub fn resend_report(topic: &str, batches: &[StoredBatch]) -> ResendReport {
    type Identity = (i64, i16, i32, usize);
    /// A distinct batch's (base sequence, records, base offset).
    type Range = (i64, i64, i64);
    let mut r = ResendReport::default();
    // Per partition: distinct batches by identity, with their position among the distinct
    // batches of their producer id, and their ids.
    let mut originals: HashMap<(i32, Identity), (usize, Vec<u32>)> = HashMap::new();
    let mut distinct_per_producer: HashMap<(i32, i64), usize> = HashMap::new();
    // Per (partition, producer id, epoch): the distinct batches' (base, count, offset).
    let mut ranges: HashMap<(i32, i64, i16), Vec<Range>> = HashMap::new();
    // Every record's first copy: (partition, offset, producer id, epoch, sequence).
    let mut first: HashMap<u32, (i32, i64, i64, i16, i64)> = HashMap::new();
    for b in batches {
        let ids = b.ids();
        let key = (
            b.partition,
            (
                b.producer_id,
                b.producer_epoch,
                b.base_sequence,
                b.records.len(),
            ),
        );
        let resend = b.producer_id >= 0 && originals.contains_key(&key);
        if resend {
            let (pos, original_ids) = &originals[&key];
            let now = distinct_per_producer[&(b.partition, b.producer_id)];
            r.resend_batches += 1;
            r.max_resend_distance = r.max_resend_distance.max(now - pos - 1);
            if *original_ids != ids {
                r.problems.push(format!(
                    "{topic}/p{}@{}: stored under the identity (producer {}, epoch {}, sequence \
                     {}) of an earlier batch with other records",
                    b.partition, b.base_offset, b.producer_id, b.producer_epoch, b.base_sequence
                ));
            }
        } else if b.producer_id >= 0 {
            let n = distinct_per_producer
                .entry((b.partition, b.producer_id))
                .or_default();
            originals.insert(key, (*n, ids.clone()));
            *n += 1;
            ranges
                .entry((b.partition, b.producer_id, b.producer_epoch))
                .or_default()
                .push((
                    i64::from(b.base_sequence),
                    b.records.len() as i64,
                    b.base_offset,
                ));
        }
        for (rec, id) in b.records.iter().zip(&ids) {
            r.records += 1;
            let seq = i64::from(b.base_sequence) + (rec.offset - b.base_offset);
            let here = (
                rec.partition,
                rec.offset,
                b.producer_id,
                b.producer_epoch,
                seq,
            );
            let Some(f) = first.get(id) else {
                first.insert(*id, here);
                continue;
            };
            r.duplicates += 1;
            let (count, examples, max) = if resend {
                (&mut r.resend_copies, &mut r.resend_examples, 3)
            } else {
                (&mut r.real_duplicates, &mut r.real_examples, 10)
            };
            *count += 1;
            if examples.len() < max {
                examples.push(format!(
                    "id {id}: first p{}@{} (producer {}, epoch {}, sequence {}), again \
                     p{}@{} (producer {}, epoch {}, sequence {})",
                    f.0, f.1, f.2, f.3, f.4, here.0, here.1, here.2, here.3, here.4
                ));
            }
        }
    }
    for ((p, pid, epoch), mut list) in ranges {
        list.sort_unstable();
        let mut next = 0i64;
        for (base, n, offset) in list {
            if base != next {
                r.problems.push(format!(
                    "{topic}/p{p}@{offset}: producer {pid} epoch {epoch}: batch at sequence \
                     {base}, expected {next} ({})",
                    if base < next { "overlap" } else { "gap" }
                ));
            }
            next = next.max(base + n);
        }
    }
    r
}
