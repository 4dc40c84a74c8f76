//! Settings: the TOML file and the command-line overrides, turned into one validated
//! [`Config`]. Each role receives only its own slice of it.
//!
//! Raw serde structs mirror the file (every key optional, `deny_unknown_fields`, so a typo
//! names the bad key); [`Config::from_parts`] applies flag overrides and validates.
//! Per-topic batching, compression, rate limits and partitioners are in [`policy`]; what
//! both need (the start-up error, byte sizes, batch limits) is in `values.rs`, which
//! imports neither, so the two do not import each other. The sections of what dory keeps
//! on disk (spool, discard log, message debug, commit points) are in `files.rs`.
//! [`convert`] turns Dory's XML config into this TOML (`dory convert-config`).
//!
//! Channels: none; [`Config`] is built once at start and each role is given its slice.
//!
//! Imports: no role of dory. Every role may import it.

pub mod convert;
mod files;
pub mod policy;
pub mod security;
mod values;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::kafka::api_versions::BrokerVersion;
use crate::kafka::Security;
use files::{commit_points_config, discard_log_config, msg_debug_config, spool_config};
pub use files::{
    CommitPointsConfig, DiscardLogConfig, MsgDebugConfig, RawCommitPoints, RawDiscardLog,
    RawMsgDebug, RawSpool, SpoolConfig, SPOOL_RECORD_OVERHEAD,
};
use policy::{
    Policies, RawCombined, RawCompression, RawLimits, RawPartitioning, RawPolicies, RawRateLimit,
    RawTopicBatching,
};
use security::SecuritySummary;
use values::invalid;
pub use values::{parse_byte_size, BatchLimits, ByteSize, ConfigError, RawCount};

/// The file as written. Every field is optional; defaults live in [`Config::from_parts`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub input: RawInput,
    #[serde(default)]
    pub kafka: RawKafka,
    #[serde(default)]
    pub batching: RawBatching,
    #[serde(default)]
    pub delivery: RawDelivery,
    #[serde(default)]
    pub status: RawStatus,
    #[serde(default)]
    pub compression: RawCompression,
    #[serde(default)]
    pub rate_limit: RawRateLimit,
    #[serde(default)]
    pub partitioning: RawPartitioning,
    #[serde(default)]
    pub discard_log: RawDiscardLog,
    #[serde(default)]
    pub msg_debug: RawMsgDebug,
    #[serde(default)]
    pub commit_points: RawCommitPoints,
    #[serde(default)]
    pub spool: RawSpool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInput {
    pub dgram_socket: Option<PathBuf>,
    pub dgram_socket_mode: Option<String>,
    pub stream_socket: Option<PathBuf>,
    pub stream_socket_mode: Option<String>,
    pub tcp_port: Option<u16>,
    pub max_datagram_msg_size: Option<ByteSize>,
    pub max_stream_msg_size: Option<ByteSize>,
    pub msg_buffer_max: Option<ByteSize>,
    pub busy_poll_us: Option<u64>,
    pub avoid_sender_cpu: Option<bool>,
    pub inline_routing: Option<bool>,
    pub max_topics: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    pub brokers: Option<Vec<String>>,
    pub client_id: Option<String>,
    pub acks: Option<i16>,
    pub replication_timeout_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub socket_timeout_ms: Option<u64>,
    pub max_in_flight_requests: Option<usize>,
    pub idempotence: Option<bool>,
    /// What to take a broker for that closes the connection on ApiVersions ("0.8", "0.9").
    pub broker_version: Option<String>,
    /// `[kafka.tls]`: present (and not `enable = false`) means TLS to every broker.
    pub tls: Option<security::RawTls>,
    /// `[kafka.sasl]`: present means SASL authentication on every connection.
    pub sasl: Option<security::RawSasl>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatching {
    pub time_ms: Option<u64>,
    pub messages: Option<u64>,
    pub bytes: Option<ByteSize>,
    pub produce_request_data_limit: Option<ByteSize>,
    pub message_max_bytes: Option<ByteSize>,
    /// Action for topics not listed in `topics`: per_topic, combined_topics or disable.
    pub default_action: Option<String>,
    #[serde(default)]
    pub combined_topics: RawCombined,
    #[serde(default)]
    pub configs: HashMap<String, RawLimits>,
    #[serde(default)]
    pub topics: HashMap<String, RawTopicBatching>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDelivery {
    pub topic_autocreate: Option<bool>,
    pub max_failed_delivery_attempts: Option<u32>,
    pub shutdown_max_delay_ms: Option<u64>,
    pub metadata_refresh_interval_s: Option<u64>,
    pub retry_backoff_ms: Option<u64>,
    pub retry_backoff_max_ms: Option<u64>,
    pub unknown_topic_wait_ms: Option<u64>,
    pub batch_scheduling: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStatus {
    pub addr: Option<String>,
    pub discard_report_interval_s: Option<u64>,
    pub bad_msg_prefix_size: Option<usize>,
    /// "accounting" or "all": which per-topic series `/metrics` carries.
    pub per_topic_metrics: Option<String>,
}

/// Command-line overrides; `None` leaves the file's value (or the default) in place.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub brokers: Vec<String>,
    pub dgram_socket: Option<PathBuf>,
    pub stream_socket: Option<PathBuf>,
    pub tcp_port: Option<u16>,
    pub status_addr: Option<String>,
    pub msg_buffer_max: Option<u64>,
    pub batch_time_ms: Option<u64>,
    pub per_topic_metrics: Option<String>,
}

/// A broker address as configured: host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses `host:port` or `[v6]:port`. The port is required: Dory's implicit 9002 was a bug.
pub fn parse_broker(s: &str) -> Result<BrokerAddr, String> {
    let s = s.trim();
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| format!("`{s}`: expected [ipv6]:port"))?;
        (h, p)
    } else {
        s.rsplit_once(':')
            .ok_or_else(|| format!("`{s}`: expected host:port"))?
    };
    if host.is_empty() {
        return Err(format!("`{s}`: empty host"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("`{s}`: port must be 1..65535"))?;
    if port == 0 {
        return Err(format!("`{s}`: port must be 1..65535"));
    }
    Ok(BrokerAddr {
        host: host.to_string(),
        port,
    })
}

/// One UNIX socket input: its path and the permission bits to give the socket file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixSocketConfig {
    pub path: PathBuf,
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputConfig {
    pub dgram: Option<UnixSocketConfig>,
    pub stream: Option<UnixSocketConfig>,
    pub tcp_port: Option<u16>,
    pub max_datagram_msg_size: usize,
    pub max_stream_msg_size: usize,
    /// Longest spin of the datagram input on an empty queue while senders are ahead of it.
    pub busy_poll: Duration,
    /// The datagram input moves to another CPU when a sender it woke preempted it (see
    /// `input::unstack`).
    pub avoid_sender_cpu: bool,
    /// Inputs route their batches on their own thread while the router is idle (see
    /// `route::SharedRouter`); false: every batch through the router's queue.
    pub inline_routing: bool,
    /// Distinct topic names tracked (counters, batching); more are discarded as bad_topic.
    pub max_topics: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    pub brokers: Vec<BrokerAddr>,
    pub client_id: Option<String>,
    pub acks: i16,
    pub replication_timeout: Duration,
    pub connect_timeout: Duration,
    pub socket_timeout: Duration,
    pub max_in_flight_requests: usize,
    /// Idempotent delivery (producer id and sequence numbers): on unless turned off or
    /// `acks` is not -1.
    pub idempotence: bool,
    /// A broker that closes the connection on ApiVersions (Kafka 0.8–0.9) is taken to be
    /// this version (`kafka.broker_version`); `None`: such a broker is unusable.
    pub broker_version: Option<BrokerVersion>,
    /// TLS and SASL for broker connections (`[kafka.tls]`, `[kafka.sasl]`).
    pub security: Security,
    /// What may be shown of `security` (never a secret).
    pub security_summary: SecuritySummary,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchingConfig {
    /// Limits of topics without their own batching config.
    pub limits: BatchLimits,
    pub produce_request_data_limit: usize,
    pub message_max_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryConfig {
    pub topic_autocreate: bool,
    pub max_failed_delivery_attempts: u32,
    pub shutdown_max_delay: Duration,
    pub metadata_refresh_interval: Duration,
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    /// How long messages for a topic missing from metadata are held while we look it up
    /// (and ask for auto-creation) before they are discarded as `bad_topic`.
    pub unknown_topic_wait: Duration,
    /// The router, the dispatchers and their acknowledgement threads run `SCHED_BATCH`
    /// (see `pipeline::batch_scheduling`); false: the default policy, like the inputs.
    pub batch_scheduling: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusConfig {
    pub addr: SocketAddr,
    pub discard_report_interval: Duration,
    pub bad_msg_prefix_size: usize,
    pub per_topic_metrics: PerTopicMetrics,
}

/// Which families of `/metrics` are broken down per topic (`status.per_topic_metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PerTopicMetrics {
    /// Only what loss alerts need: received, delivered, discarded by reason, in flight.
    /// The other families are served summed over topics (`/metrics?topic=NAME` has them
    /// for one topic), so a scrape stays small with thousands of topics.
    #[default]
    Accounting,
    /// Every per-topic family per topic (latency histograms, commit points, duplicates,
    /// spool points): about ten times the size.
    All,
}

fn per_topic_metrics(v: Option<&str>) -> Result<PerTopicMetrics, ConfigError> {
    match v {
        None | Some("accounting") => Ok(PerTopicMetrics::Accounting),
        Some("all") => Ok(PerTopicMetrics::All),
        Some(other) => Err(invalid(
            "status.per_topic_metrics",
            format!("`{other}`: expected \"accounting\" or \"all\""),
        )),
    }
}

/// The validated configuration of the whole daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub msg_buffer_max: usize,
    pub input: InputConfig,
    pub kafka: KafkaConfig,
    pub batching: BatchingConfig,
    pub delivery: DeliveryConfig,
    pub status: StatusConfig,
    /// Per-topic batching, compression, rate limits and partitioners.
    pub policies: Policies,
    pub discard_log: Option<DiscardLogConfig>,
    pub msg_debug: Option<MsgDebugConfig>,
    pub commit_points: CommitPointsConfig,
    /// `None` when no topic is spooled.
    pub spool: Option<SpoolConfig>,
}

/// Largest datagram we accept to configure; Dory's self-test cap.
const MAX_DATAGRAM_LIMIT: u64 = 16 << 20;
/// `input.busy_poll_us` default: see `input::datagram::BusyPoll`.
const DEFAULT_BUSY_POLL_US: u64 = 50;
/// Spinning longer than this between datagrams would only burn CPU.
const MAX_BUSY_POLL_US: u64 = 10_000;
/// `input.max_topics` default and bound.
const DEFAULT_MAX_TOPICS: u64 = 10_000;
const MAX_MAX_TOPICS: u64 = 1_000_000;

fn parse_mode(key: &'static str, s: &str) -> Result<u32, ConfigError> {
    let t = s.trim();
    let m = if let Some(b) = t.strip_prefix("0b").or_else(|| t.strip_prefix("0B")) {
        u32::from_str_radix(b, 2)
    } else if let Some(o) = t.strip_prefix("0o") {
        u32::from_str_radix(o, 8)
    } else {
        u32::from_str_radix(t, 8)
    }
    .map_err(|_| {
        invalid(
            key,
            format!("`{s}` is not an octal file mode such as \"0222\""),
        )
    })?;
    if m > 0o777 {
        return Err(invalid(key, format!("`{s}` is above 0777")));
    }
    Ok(m)
}

fn socket_path(key: &'static str, p: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    let Some(p) = p else { return Ok(None) };
    if p.as_os_str().is_empty() {
        return Ok(None);
    }
    if !p.is_absolute() {
        return Err(invalid(
            key,
            format!("`{}` must be an absolute path", p.display()),
        ));
    }
    // sun_path holds 108 bytes including the terminating NUL.
    if p.as_os_str().len() > 107 {
        return Err(invalid(
            key,
            format!(
                "`{}` is longer than a UNIX socket path may be (107 bytes)",
                p.display()
            ),
        ));
    }
    Ok(Some(p))
}

fn positive(key: &'static str, v: u64) -> Result<u64, ConfigError> {
    if v == 0 {
        Err(invalid(key, "must be greater than 0"))
    } else {
        Ok(v)
    }
}

fn to_usize(key: &'static str, v: u64) -> Result<usize, ConfigError> {
    usize::try_from(v).map_err(|_| invalid(key, "too large"))
}

impl Config {
    /// Reads and validates a config file, then applies the overrides.
    pub fn load(path: Option<&Path>, ov: &Overrides) -> Result<Config, ConfigError> {
        let (raw, from_file) = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                (parse_toml(p, &text)?, true)
            }
            None => (RawConfig::default(), false),
        };
        Config::from_parts(raw, from_file, ov)
    }

    /// Builds the validated config. `from_file` is false when running with flags only: then
    /// topic auto-creation defaults to on, so a newcomer can try the daemon with no setup.
    pub fn from_parts(
        raw: RawConfig,
        from_file: bool,
        ov: &Overrides,
    ) -> Result<Config, ConfigError> {
        let RawConfig {
            input,
            kafka,
            batching,
            delivery,
            status,
            compression,
            rate_limit,
            partitioning,
            discard_log,
            msg_debug,
            commit_points,
            spool,
        } = raw;
        let discard_log = discard_log_config(discard_log)?;
        let msg_debug = msg_debug_config(msg_debug)?;
        let commit_points = commit_points_config(commit_points)?;

        // Inputs.
        let dgram_path = socket_path(
            "input.dgram_socket",
            ov.dgram_socket.clone().or(input.dgram_socket),
        )?;
        let stream_path = socket_path(
            "input.stream_socket",
            ov.stream_socket.clone().or(input.stream_socket),
        )?;
        let dgram_mode = input
            .dgram_socket_mode
            .as_deref()
            .map(|m| parse_mode("input.dgram_socket_mode", m))
            .transpose()?;
        let stream_mode = input
            .stream_socket_mode
            .as_deref()
            .map(|m| parse_mode("input.stream_socket_mode", m))
            .transpose()?;
        let tcp_port = ov.tcp_port.or(input.tcp_port).filter(|&p| p != 0);
        if dgram_path.is_none() && stream_path.is_none() && tcp_port.is_none() {
            return Err(invalid(
                "input",
                "enable at least one of input.dgram_socket, input.stream_socket, input.tcp_port \
                 (or --dgram-socket, --stream-socket, --tcp-port)",
            ));
        }
        if dgram_path.is_some() && dgram_path == stream_path {
            return Err(invalid(
                "input.stream_socket",
                "must differ from input.dgram_socket",
            ));
        }
        let max_datagram = input.max_datagram_msg_size.map_or(64 << 10, |b| b.0);
        if !(8..=MAX_DATAGRAM_LIMIT).contains(&max_datagram) {
            return Err(invalid(
                "input.max_datagram_msg_size",
                format!("must be between 8 and {MAX_DATAGRAM_LIMIT} bytes"),
            ));
        }
        let busy_poll_us = input.busy_poll_us.unwrap_or(DEFAULT_BUSY_POLL_US);
        if busy_poll_us > MAX_BUSY_POLL_US {
            return Err(invalid(
                "input.busy_poll_us",
                format!("must be between 0 (never spin) and {MAX_BUSY_POLL_US} microseconds"),
            ));
        }
        let max_topics = input.max_topics.unwrap_or(DEFAULT_MAX_TOPICS);
        if !(1..=MAX_MAX_TOPICS).contains(&max_topics) {
            return Err(invalid(
                "input.max_topics",
                format!("must be between 1 and {MAX_MAX_TOPICS}"),
            ));
        }
        let max_stream = input.max_stream_msg_size.map_or(2 << 20, |b| b.0);
        if !(8..=(i32::MAX as u64)).contains(&max_stream) {
            return Err(invalid(
                "input.max_stream_msg_size",
                "must be between 8 bytes and 2 GiB",
            ));
        }
        let msg_buffer_max = ov
            .msg_buffer_max
            .or(input.msg_buffer_max.map(|b| b.0))
            .unwrap_or(64 << 20);
        if msg_buffer_max < 128 {
            return Err(invalid(
                "input.msg_buffer_max",
                "must be at least 128 bytes (one pool block)",
            ));
        }

        // Kafka.
        let broker_strs = if ov.brokers.is_empty() {
            kafka.brokers.unwrap_or_default()
        } else {
            ov.brokers.clone()
        };
        if broker_strs.is_empty() {
            return Err(invalid(
                "kafka.brokers",
                "list at least one broker as \"host:port\" (or pass --broker HOST:PORT)",
            ));
        }
        let brokers = broker_strs
            .iter()
            .map(|b| parse_broker(b).map_err(|m| invalid("kafka.brokers", m)))
            .collect::<Result<Vec<_>, _>>()?;
        let client_id = match kafka.client_id {
            None => Some("dory".to_string()),
            Some(s) if s.is_empty() => None,
            Some(s) => Some(s),
        };
        let acks = kafka.acks.unwrap_or(-1);
        if !matches!(acks, -1..=1) {
            return Err(invalid("kafka.acks", "must be -1 (all), 0 or 1"));
        }
        if acks == 0 {
            return Err(invalid(
                "kafka.acks",
                "0 is not supported: without acknowledgements delivery cannot be counted; use 1 or -1",
            ));
        }
        // Brokers accept an idempotent producer only with acks = all.
        let idempotence = match kafka.idempotence {
            Some(true) if acks != -1 => {
                return Err(invalid(
                    "kafka.idempotence",
                    "needs kafka.acks = -1 (all): brokers refuse idempotent batches otherwise",
                ))
            }
            Some(on) => on,
            None => acks == -1,
        };
        let replication_timeout_ms = kafka.replication_timeout_ms.unwrap_or(10_000);
        if replication_timeout_ms > i32::MAX as u64 {
            return Err(invalid(
                "kafka.replication_timeout_ms",
                "must fit in a signed 32-bit integer",
            ));
        }
        let broker_version = match kafka.broker_version.as_deref() {
            None => None,
            Some(s) => Some(BrokerVersion::parse(s).ok_or_else(|| {
                invalid(
                    "kafka.broker_version",
                    format!("{s:?} is not a Kafka version dory can fall back to: \"0.8\", \"0.9\" or \"0.10\" (brokers of 0.11 and later answer ApiVersions)"),
                )
            })?),
        };
        if kafka.sasl.is_some()
            && matches!(
                broker_version,
                Some(BrokerVersion::V0_8 | BrokerVersion::V0_9)
            )
        {
            return Err(invalid(
                "kafka.broker_version",
                "Kafka 0.8 and 0.9 brokers cannot do SASL PLAIN or SCRAM: remove [kafka.sasl] or the setting",
            ));
        }
        let (security, security_summary) = security::security(kafka.tls, kafka.sasl)?;
        let max_in_flight = kafka.max_in_flight_requests.unwrap_or(5);
        if !(1..=64).contains(&max_in_flight) {
            return Err(invalid(
                "kafka.max_in_flight_requests",
                "must be between 1 and 64",
            ));
        }

        // Batching.
        let limit = |v: Option<u64>| v.filter(|&n| n > 0);
        let limits = BatchLimits {
            time: limit(ov.batch_time_ms.or(batching.time_ms).or(Some(100)))
                .map(Duration::from_millis),
            messages: limit(batching.messages),
            bytes: limit(Some(batching.bytes.map_or(256 << 10, |b| b.0))),
        };
        let policies = Policies::from_raw(RawPolicies {
            default_limits: limits,
            default_action: batching.default_action.as_deref(),
            combined: &batching.combined_topics,
            batching_configs: &batching.configs,
            batching_topics: &batching.topics,
            compression: &compression,
            rate_limit: &rate_limit,
            partitioning: &partitioning,
        })?;
        let produce_request_data_limit = to_usize(
            "batching.produce_request_data_limit",
            batching.produce_request_data_limit.map_or(1 << 20, |b| b.0),
        )?;
        let message_max_bytes = to_usize(
            "batching.message_max_bytes",
            positive(
                "batching.message_max_bytes",
                batching.message_max_bytes.map_or(1_000_000, |b| b.0),
            )?,
        )?;

        // Delivery.
        let max_attempts = delivery.max_failed_delivery_attempts.unwrap_or(5);
        let retry_backoff = Duration::from_millis(delivery.retry_backoff_ms.unwrap_or(100));
        let retry_backoff_max =
            Duration::from_millis(delivery.retry_backoff_max_ms.unwrap_or(10_000));
        if retry_backoff > retry_backoff_max {
            return Err(invalid(
                "delivery.retry_backoff_ms",
                "must not exceed delivery.retry_backoff_max_ms",
            ));
        }

        // Status.
        let addr_str = ov
            .status_addr
            .clone()
            .or(status.addr)
            .unwrap_or_else(|| "127.0.0.1:9090".to_string());
        let addr: SocketAddr = addr_str.parse().map_err(|_| {
            invalid(
                "status.addr",
                format!("`{addr_str}` is not an address such as 127.0.0.1:9090"),
            )
        })?;

        Ok(Config {
            msg_buffer_max: to_usize("input.msg_buffer_max", msg_buffer_max)?,
            input: InputConfig {
                dgram: dgram_path.map(|path| UnixSocketConfig {
                    path,
                    mode: dgram_mode,
                }),
                stream: stream_path.map(|path| UnixSocketConfig {
                    path,
                    mode: stream_mode,
                }),
                tcp_port,
                max_datagram_msg_size: to_usize("input.max_datagram_msg_size", max_datagram)?,
                max_stream_msg_size: to_usize("input.max_stream_msg_size", max_stream)?,
                busy_poll: Duration::from_micros(busy_poll_us),
                avoid_sender_cpu: input.avoid_sender_cpu.unwrap_or(true),
                inline_routing: input.inline_routing.unwrap_or(true),
                max_topics: to_usize("input.max_topics", max_topics)?,
            },
            kafka: KafkaConfig {
                brokers,
                client_id,
                acks,
                idempotence,
                broker_version,
                replication_timeout: Duration::from_millis(replication_timeout_ms),
                connect_timeout: Duration::from_millis(positive(
                    "kafka.connect_timeout_ms",
                    kafka.connect_timeout_ms.unwrap_or(10_000),
                )?),
                socket_timeout: Duration::from_millis(positive(
                    "kafka.socket_timeout_ms",
                    kafka.socket_timeout_ms.unwrap_or(60_000),
                )?),
                max_in_flight_requests: max_in_flight,
                security,
                security_summary,
            },
            batching: BatchingConfig {
                limits,
                produce_request_data_limit,
                message_max_bytes,
            },
            delivery: DeliveryConfig {
                topic_autocreate: delivery.topic_autocreate.unwrap_or(!from_file),
                max_failed_delivery_attempts: max_attempts,
                shutdown_max_delay: Duration::from_millis(
                    delivery.shutdown_max_delay_ms.unwrap_or(30_000),
                ),
                metadata_refresh_interval: Duration::from_secs(positive(
                    "delivery.metadata_refresh_interval_s",
                    delivery.metadata_refresh_interval_s.unwrap_or(900),
                )?),
                retry_backoff,
                retry_backoff_max,
                unknown_topic_wait: Duration::from_millis(
                    delivery.unknown_topic_wait_ms.unwrap_or(10_000),
                ),
                batch_scheduling: delivery.batch_scheduling.unwrap_or(true),
            },
            status: StatusConfig {
                addr,
                discard_report_interval: Duration::from_secs(positive(
                    "status.discard_report_interval_s",
                    status.discard_report_interval_s.unwrap_or(600),
                )?),
                bad_msg_prefix_size: status.bad_msg_prefix_size.unwrap_or(256),
                per_topic_metrics: per_topic_metrics(
                    ov.per_topic_metrics
                        .as_deref()
                        .or(status.per_topic_metrics.as_deref()),
                )?,
            },
            policies,
            discard_log,
            msg_debug,
            commit_points,
            spool: spool_config(spool, max_datagram.max(max_stream))?,
        })
    }
}

/// Parses TOML text, reporting the file and toml's own message (which names the key).
pub fn parse_toml(path: &Path, text: &str) -> Result<RawConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Overrides {
        Overrides {
            brokers: vec!["127.0.0.1:9092".into()],
            dgram_socket: Some("/tmp/d.sock".into()),
            ..Overrides::default()
        }
    }

    #[test]
    fn flags_alone_are_enough_and_autocreate_is_on() {
        let c = Config::from_parts(RawConfig::default(), false, &flags()).expect("valid");
        assert!(c.delivery.topic_autocreate);
        assert_eq!(c.kafka.acks, -1);
        assert_eq!(c.msg_buffer_max, 64 << 20);
        assert_eq!(c.status.addr.to_string(), "127.0.0.1:9090");
        assert_eq!(c.kafka.brokers[0].port, 9092);
    }

    #[test]
    fn broker_version_is_parsed_and_bad_values_named() {
        let load = |toml: &str| {
            let raw = parse_toml(Path::new("x.toml"), toml).expect("parses");
            Config::from_parts(raw, true, &flags())
        };
        assert_eq!(load("").expect("valid").kafka.broker_version, None);
        let c = load("[kafka]\nbroker_version = \"0.9.0.1\"\n").expect("valid");
        assert_eq!(c.kafka.broker_version, Some(BrokerVersion::V0_9));
        for bad in ["\"0.11\"", "\"nine\""] {
            let e = load(&format!("[kafka]\nbroker_version = {bad}\n")).unwrap_err();
            assert!(e.to_string().contains("kafka.broker_version"), "{e}");
        }
    }

    #[test]
    fn per_topic_metrics_and_batch_scheduling() {
        let c = Config::from_parts(RawConfig::default(), false, &flags()).expect("valid");
        assert_eq!(c.status.per_topic_metrics, PerTopicMetrics::Accounting);
        assert!(c.delivery.batch_scheduling);
        let c = with_section("status", "per_topic_metrics = \"all\"").expect("valid");
        assert_eq!(c.status.per_topic_metrics, PerTopicMetrics::All);
        let e = with_section("status", "per_topic_metrics = \"some\"").unwrap_err();
        assert!(e.to_string().contains("status.per_topic_metrics"), "{e}");
        // The flag wins over the file.
        let raw = parse_toml(
            Path::new("x.toml"),
            "[status]\nper_topic_metrics = \"all\"\n",
        )
        .expect("parses");
        let ov = Overrides {
            per_topic_metrics: Some("accounting".into()),
            ..flags()
        };
        let c = Config::from_parts(raw, false, &ov).expect("valid");
        assert_eq!(c.status.per_topic_metrics, PerTopicMetrics::Accounting);
        let c = with_section("delivery", "batch_scheduling = false").expect("valid");
        assert!(!c.delivery.batch_scheduling);
    }

    #[test]
    fn avoid_sender_cpu_defaults_on() {
        let c = Config::from_parts(RawConfig::default(), false, &flags()).expect("valid");
        assert!(c.input.avoid_sender_cpu);
        let c = with_section("input", "avoid_sender_cpu = false").expect("valid");
        assert!(!c.input.avoid_sender_cpu);
        let e = with_section("input", "avoid_sender_cpu = 1").unwrap_err();
        assert!(e.to_string().contains("avoid_sender_cpu"), "{e}");
    }

    #[test]
    fn idempotence_follows_acks_unless_set() {
        let load = |toml: &str| {
            let raw = parse_toml(Path::new("x.toml"), toml).expect("parses");
            Config::from_parts(raw, true, &flags())
        };
        assert!(load("").expect("valid").kafka.idempotence);
        assert!(
            !load("[kafka]\nacks = 1\n")
                .expect("valid")
                .kafka
                .idempotence
        );
        assert!(
            !load("[kafka]\nidempotence = false\n")
                .expect("valid")
                .kafka
                .idempotence
        );
        let e = load("[kafka]\nacks = 1\nidempotence = true\n").unwrap_err();
        assert!(e.to_string().contains("kafka.idempotence"), "{e}");
        assert!(e.to_string().contains("acks"), "{e}");
    }

    #[test]
    fn file_turns_autocreate_off_by_default() {
        let c = Config::from_parts(RawConfig::default(), true, &flags()).expect("valid");
        assert!(!c.delivery.topic_autocreate);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = parse_toml(Path::new("x.toml"), "[kafka]\nbrokerz = []\n").unwrap_err();
        assert!(e.to_string().contains("brokerz"), "{e}");
    }

    #[test]
    fn missing_brokers_and_inputs_are_named() {
        let e = Config::from_parts(RawConfig::default(), true, &Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("input"), "{e}");
        let ov = Overrides {
            tcp_port: Some(9000),
            ..Overrides::default()
        };
        let e = Config::from_parts(RawConfig::default(), true, &ov).unwrap_err();
        assert!(e.to_string().contains("kafka.brokers"), "{e}");
    }

    #[test]
    fn byte_sizes_and_modes() {
        assert_eq!(parse_byte_size("64k"), Ok(65536));
        assert_eq!(parse_byte_size("16M"), Ok(16 << 20));
        assert_eq!(parse_byte_size("123"), Ok(123));
        assert!(parse_byte_size("12x").is_err());
        assert_eq!(parse_mode("m", "0222").ok(), Some(0o222));
        assert_eq!(parse_mode("m", "0b110100100").ok(), Some(0o644));
        assert!(parse_mode("m", "0999").is_err());
        assert!(parse_mode("m", "01777").is_err());
    }

    #[test]
    fn broker_parsing() {
        assert_eq!(
            parse_broker("[::1]:9092"),
            Ok(BrokerAddr {
                host: "::1".into(),
                port: 9092
            })
        );
        assert!(parse_broker("localhost").is_err());
        assert!(parse_broker("h:0").is_err());
    }

    #[test]
    fn relative_socket_path_is_rejected() {
        let ov = Overrides {
            dgram_socket: Some("rel.sock".into()),
            ..flags()
        };
        let e = Config::from_parts(RawConfig::default(), true, &ov).unwrap_err();
        assert!(e.to_string().contains("input.dgram_socket"), "{e}");
    }

    /// Loads one section's settings given as TOML (flags as in `flags()`).
    pub(super) fn with_section(section: &str, toml: &str) -> Result<Config, ConfigError> {
        let raw = parse_toml(Path::new("x.toml"), &format!("[{section}]\n{toml}\n"))?;
        Config::from_parts(raw, false, &flags())
    }

    fn with_input(toml: &str) -> Result<Config, ConfigError> {
        with_section("input", toml)
    }

    #[test]
    fn inline_routing_is_on_unless_turned_off() {
        assert!(with_input("").expect("valid").input.inline_routing);
        let c = with_input("inline_routing = false").expect("valid");
        assert!(!c.input.inline_routing);
        let e = with_input("inline_routing = 1").unwrap_err();
        assert!(e.to_string().contains("inline_routing"), "{e}");
    }

    #[test]
    fn busy_poll_defaults_and_bounds() {
        let c = with_input("").expect("valid");
        assert_eq!(c.input.busy_poll, Duration::from_micros(50));
        let c = with_input("busy_poll_us = 0").expect("0 turns spinning off");
        assert_eq!(c.input.busy_poll, Duration::ZERO);
        let e = with_input("busy_poll_us = 10001").unwrap_err();
        assert!(e.to_string().contains("input.busy_poll_us"), "{e}");
    }

    #[test]
    fn max_topics_defaults_and_bounds() {
        assert_eq!(with_input("").expect("valid").input.max_topics, 10_000);
        let c = with_input("max_topics = 50000").expect("valid");
        assert_eq!(c.input.max_topics, 50_000);
        for bad in ["0", "1000001"] {
            let e = with_input(&format!("max_topics = {bad}")).unwrap_err();
            assert!(e.to_string().contains("input.max_topics"), "{e}");
        }
    }

    #[test]
    fn sasl_password_never_shows_and_settings_are_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret-from-file\n").expect("write");
        let c = with_section(
            "kafka.sasl",
            &format!(
                "mechanism = \"SCRAM-SHA-256\"\nusername = \"u\"\npassword_file = \"{}\"",
                pw.display()
            ),
        )
        .expect("valid");
        let creds = c.kafka.security.sasl.as_ref().expect("sasl on");
        assert_eq!(creds.password.expose(), "s3cret-from-file");
        let c = with_section(
            "kafka.sasl",
            "mechanism = \"PLAIN\"\nusername = \"u\"\npassword = \"s3cret\"",
        )
        .expect("valid");
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        let raw = parse_toml(
            Path::new("x.toml"),
            "[kafka.sasl]\nmechanism = \"PLAIN\"\npassword = \"s3cret\"\n",
        )
        .expect("parses");
        assert!(!format!("{raw:?}").contains("s3cret"));
        for (section, toml, key) in [
            (
                "kafka.sasl",
                "username = \"u\"\npassword = \"p\"",
                "kafka.sasl.mechanism",
            ),
            (
                "kafka.sasl",
                "mechanism = \"PLAIN\"\npassword = \"p\"",
                "kafka.sasl.username",
            ),
            (
                "kafka.sasl",
                "mechanism = \"PLAIN\"\nusername = \"u\"\npassword = \"p\"\npassword_file = \"/x\"",
                "kafka.sasl.password",
            ),
            (
                "kafka.tls",
                "ca_file = \"/nonexistent.pem\"",
                "kafka.tls.ca_file",
            ),
            (
                "kafka.tls",
                "server_name = \"not a name!\"",
                "kafka.tls.server_name",
            ),
            ("kafka.tls", "key_file = \"/x.key\"", "kafka.tls.cert_file"),
        ] {
            let e = with_section(section, toml).unwrap_err();
            assert!(e.to_string().contains(key), "{toml}: {e}");
        }
        let c = with_section(
            "kafka.tls",
            "enable = false\nca_file = \"/nonexistent.pem\"",
        )
        .expect("a disabled section is not loaded");
        assert!(c.kafka.security.tls.is_none());
    }

    #[test]
    fn sample_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/dory.toml");
        let c = Config::load(Some(&path), &Overrides::default()).expect("sample config is valid");
        assert!(c.input.dgram.is_some());
        assert!(!c.kafka.brokers.is_empty());
    }
}
