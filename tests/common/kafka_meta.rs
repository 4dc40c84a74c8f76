//! Kafka metadata helpers: rdkafka clients against any broker, waiting for brokers and
//! topics.

use super::*;

pub(crate) fn base_client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "200")
        .set("socket.connection.setup.timeout.ms", "2000")
        .set("topic.metadata.refresh.interval.ms", "1000");
    c
}

pub(crate) fn metadata_client(bootstrap: &str) -> BaseConsumer {
    base_client_config(bootstrap)
        .set("group.id", "dory-harness-metadata")
        .create()
        .expect("create metadata client")
}

/// Polls until `127.0.0.1:port` accepts TCP connections. `proc` (if given) is checked for
/// an early exit on every round.
pub fn wait_for_port(
    port: u16,
    timeout: Duration,
    mut proc: Option<&mut Proc>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = proc.as_deref_mut() {
            if let Some(s) = p.try_exit() {
                return Err(format!("process exited early with {s}"));
            }
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("nothing listens on {addr} after {timeout:?}: {e}"))
            }
            Err(_) => thread::sleep(POLL_INTERVAL),
        }
    }
}

/// Polls until `bootstrap` answers a Metadata request listing at least one broker. `proc`
/// (if given) is checked for an early exit on every round.
pub(crate) fn wait_for_brokers(
    bootstrap: &str,
    timeout: Duration,
    mut proc: Option<&mut Proc>,
) -> Result<(), String> {
    let client = metadata_client(bootstrap);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(p) = proc.as_deref_mut() {
            if let Some(s) = p.try_exit() {
                return Err(format!("process exited early with {s}"));
            }
        }
        let last = match client.fetch_metadata(None, Duration::from_millis(500)) {
            Ok(md) if !md.brokers().is_empty() => return Ok(()),
            Ok(_) => "metadata lists no brokers".to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{bootstrap} did not answer Metadata within {timeout:?}: {last}"
            ));
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Per partition id (ascending): its leader, for `topic`; Err describes why not usable yet.
pub(crate) fn topic_leaders(client: &BaseConsumer, topic: &str) -> Result<Vec<(i32, i32)>, String> {
    let md = client
        .fetch_metadata(Some(topic), Duration::from_secs(2))
        .map_err(|e| format!("metadata: {e}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| format!("topic {topic:?} not in metadata"))?;
    if let Some(e) = t.error() {
        return Err(format!("topic {topic:?} error {e:?}"));
    }
    let mut parts: Vec<(i32, i32)> = t
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader()))
        .collect();
    parts.sort_unstable();
    Ok(parts)
}

/// Polls until `topic` exists with `partitions` partitions, each with a leader.
pub fn wait_for_topic(bootstrap: &str, topic: &str, partitions: i32, timeout: Duration) {
    let client = metadata_client(bootstrap);
    poll_until(
        &format!("topic {topic:?} with {partitions} led partitions on {bootstrap}"),
        timeout,
        || {
            let parts = topic_leaders(&client, topic)?;
            let count = i32::try_from(parts.len()).expect("partition count fits i32");
            if count == partitions && parts.iter().all(|&(_, leader)| leader >= 0) {
                Ok(())
            } else {
                Err(format!("partitions (id, leader): {parts:?}"))
            }
        },
    )
}

/// Whether `topic` exists on the cluster. Asks with auto-creation off, so asking does not
/// create it.
pub fn topic_exists(bootstrap: &str, topic: &str) -> bool {
    use rdkafka::error::RDKafkaErrorCode;
    use rdkafka::types::RDKafkaRespErr;
    let client = metadata_client(bootstrap);
    poll_until(
        &format!("a metadata answer about {topic:?}"),
        Duration::from_secs(20),
        || match client.fetch_metadata(Some(topic), Duration::from_secs(2)) {
            Ok(md) => match md.topics().iter().find(|t| t.name() == topic) {
                None => Ok(false),
                Some(t) => match t.error() {
                    None => Ok(!t.partitions().is_empty()),
                    Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => Ok(false),
                    Some(e) => Err(format!("topic error {e:?}")),
                },
            },
            Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition)) => Ok(false),
            Err(e) => Err(e.to_string()),
        },
    )
}

/// The number of partitions of `topic` (which must exist).
pub fn topic_partition_count(bootstrap: &str, topic: &str) -> i32 {
    let client = metadata_client(bootstrap);
    let parts = poll_until(
        &format!("metadata of topic {topic:?}"),
        Duration::from_secs(20),
        || topic_leaders(&client, topic),
    );
    i32::try_from(parts.len()).expect("partition count fits i32")
}
