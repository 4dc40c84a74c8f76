//! Consuming back with a CRC-checking rdkafka consumer.

use super::*;

/// How a consumed record's timestamp was set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TsType {
    NotAvailable,
    CreateTime,
    LogAppendTime,
}

/// One record read back from Kafka.
#[derive(Clone, Debug)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: i64,
    pub timestamp_type: TsType,
}

/// Reads every partition of `topic` from the beginning with a CRC-checking consumer until
/// `expected` records have arrived (or `timeout`), then keeps reading until the partitions'
/// high watermarks are reached (bounded) plus a short grace poll, so extra or duplicate
/// records show up too. Any consumer error fails the test.
pub fn consume_all(
    bootstrap: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    let partitions = topic_partition_count(bootstrap, topic);
    let consumer: BaseConsumer = base_client_config(bootstrap)
        .set("group.id", format!("dory-harness-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("check.crcs", "true")
        .set("isolation.level", "read_uncommitted")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("create consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("add partition");
    }
    consumer.assign(&tpl).expect("assign partitions");

    let mut out = Vec::with_capacity(expected);
    let poll_for = |out: &mut Vec<Consumed>, until: Instant, stop_at: usize| {
        while out.len() < stop_at && Instant::now() < until {
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Ok(m)) => {
                    let (timestamp, timestamp_type) = match m.timestamp() {
                        Timestamp::NotAvailable => (-1, TsType::NotAvailable),
                        Timestamp::CreateTime(t) => (t, TsType::CreateTime),
                        Timestamp::LogAppendTime(t) => (t, TsType::LogAppendTime),
                    };
                    out.push(Consumed {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        timestamp,
                        timestamp_type,
                    });
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => panic!(
                    "consumer error on {topic:?} after {} records (a CRC error here means \
                     corrupt record batches): {e}",
                    out.len()
                ),
            }
        }
    };
    let deadline = Instant::now() + timeout;
    poll_for(&mut out, deadline, expected);

    // Everything the brokers hold, so extras are read rather than guessed at.
    let mut held = 0usize;
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
        held += usize::try_from(high - low).expect("high >= low");
    }
    if held > out.len() {
        let extra_deadline = Instant::now() + Duration::from_secs(10);
        poll_for(&mut out, extra_deadline, held);
    }
    let grace = Instant::now() + Duration::from_millis(300);
    poll_for(&mut out, grace, usize::MAX);
    out
}
