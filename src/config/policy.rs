//! Per-topic policies: batching action and limits, compression, rate limit and
//! partitioner, each with a default and per-topic overrides through named configs, as in
//! Dory's XML config (`<batching>`, `<compression>`, `<topicRateLimiting>`), in TOML.
//!
//! Raw serde structs mirror the file; [`Policies::from_raw`] validates names and values,
//! and lookups by topic name are resolved once per topic by the router.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use super::values::{invalid, BatchLimits, ByteSize, ConfigError, RawCount};

// ----- raw (as written) -----

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub time_ms: Option<u64>,
    pub messages: Option<u64>,
    pub bytes: Option<ByteSize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCombined {
    pub enable: Option<bool>,
    pub config: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTopicBatching {
    pub action: Option<String>,
    pub config: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompressionConfig {
    pub codec: String,
    pub min_size: Option<ByteSize>,
    pub level: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompression {
    pub default: Option<String>,
    pub size_threshold_percent: Option<u8>,
    #[serde(default)]
    pub configs: HashMap<String, RawCompressionConfig>,
    #[serde(default)]
    pub topics: HashMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimitConfig {
    pub interval_ms: Option<u64>,
    pub max_count: RawCount,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    pub default: Option<String>,
    #[serde(default)]
    pub configs: HashMap<String, RawRateLimitConfig>,
    #[serde(default)]
    pub topics: HashMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPartitioning {
    pub default: Option<String>,
    #[serde(default)]
    pub topics: HashMap<String, String>,
}

// ----- validated -----

/// Dory's batching actions (reference §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAction {
    /// Batched per topic (AnyPartition) or per partition (PartitionKey) with the topic's
    /// limits.
    PerTopic,
    /// Batched with other topics per broker, under the combined-topics limits.
    CombinedTopics,
    /// Each message sent on its own (still packed into Produce requests).
    Disable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicBatching {
    pub action: BatchAction,
    pub limits: BatchLimits,
}

/// Compression codecs Kafka defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodecName {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl CodecName {
    fn parse(s: &str) -> Option<CodecName> {
        Some(match s.to_ascii_lowercase().as_str() {
            "none" => CodecName::None,
            "gzip" => CodecName::Gzip,
            "snappy" => CodecName::Snappy,
            "lz4" => CodecName::Lz4,
            "zstd" => CodecName::Zstd,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicCompression {
    pub codec: CodecName,
    /// Compress a partition's record set only if its size (Σ key + value + 26) is at least
    /// this.
    pub min_size: usize,
    pub level: Option<i32>,
}

impl TopicCompression {
    pub const NONE: TopicCompression = TopicCompression {
        codec: CodecName::None,
        min_size: 0,
        level: None,
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub interval: Duration,
    /// Messages allowed per interval; 0 discards every message.
    pub max_count: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioner {
    /// Round robin for AnyPartition, `(u32)key % n` for PartitionKey (Dory's rules).
    Dory,
    /// AnyPartition messages with a non-empty key go to the partition the Java client
    /// would choose: `toPositive(murmur2(key)) % n`. Others as `Dory`.
    Murmur2,
}

/// What applies to one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicPolicy {
    pub batching: TopicBatching,
    pub compression: TopicCompression,
    pub rate_limit: Option<RateLimit>,
    pub partitioner: Partitioner,
}

/// Every topic policy: defaults and overrides by topic name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policies {
    pub default: TopicPolicy,
    pub overrides: HashMap<Vec<u8>, TopicPolicy>,
    /// Limits of the per-broker combined-topics batch; `None` when combined batching is
    /// off (topics whose action is `combined_topics` then get no batching).
    pub combined: Option<BatchLimits>,
    /// Send compressed only if compressed/uncompressed ≤ this percentage.
    pub size_threshold_percent: u8,
}

impl Policies {
    /// The policy of `topic`.
    pub fn for_topic(&self, topic: &[u8]) -> TopicPolicy {
        self.overrides.get(topic).copied().unwrap_or(self.default)
    }

    /// Whether any topic uses the codec (so its availability can be checked at start).
    pub fn uses(&self, codec: CodecName) -> bool {
        self.default.compression.codec == codec
            || self
                .overrides
                .values()
                .any(|p| p.compression.codec == codec)
    }
}

/// Turns raw limits into [`BatchLimits`] (0 disables a limit).
pub fn limits(raw: &RawLimits, default_time_ms: Option<u64>) -> BatchLimits {
    let on = |v: Option<u64>| v.filter(|&n| n > 0);
    BatchLimits {
        time: on(raw.time_ms.or(default_time_ms)).map(Duration::from_millis),
        messages: on(raw.messages),
        bytes: on(raw.bytes.map(|b| b.0)),
    }
}

fn parse_action(key: &'static str, s: &str) -> Result<BatchAction, ConfigError> {
    match s {
        "per_topic" => Ok(BatchAction::PerTopic),
        "combined_topics" => Ok(BatchAction::CombinedTopics),
        "disable" => Ok(BatchAction::Disable),
        _ => Err(invalid(
            key,
            format!("`{s}`: expected \"per_topic\", \"combined_topics\" or \"disable\""),
        )),
    }
}

/// The raw pieces [`Policies::from_raw`] validates.
pub struct RawPolicies<'a> {
    pub default_limits: BatchLimits,
    pub default_action: Option<&'a str>,
    pub combined: &'a RawCombined,
    pub batching_configs: &'a HashMap<String, RawLimits>,
    pub batching_topics: &'a HashMap<String, RawTopicBatching>,
    pub compression: &'a RawCompression,
    pub rate_limit: &'a RawRateLimit,
    pub partitioning: &'a RawPartitioning,
}

impl Policies {
    pub fn from_raw(raw: RawPolicies<'_>) -> Result<Policies, ConfigError> {
        // Batching: named configs, the default, per-topic overrides.
        let mut named: HashMap<&str, BatchLimits> = HashMap::new();
        for (name, l) in raw.batching_configs {
            let v = limits(l, None);
            if v.time.is_none() && v.messages.is_none() && v.bytes.is_none() {
                return Err(invalid(
                    "batching.configs",
                    format!("config `{name}` enables no limit (set time_ms, messages or bytes)"),
                ));
            }
            named.insert(name.as_str(), v);
        }
        let lookup = |key: &'static str, name: &str| {
            named
                .get(name)
                .copied()
                .ok_or_else(|| invalid(key, format!("no batching config named `{name}`")))
        };
        let default_batching = TopicBatching {
            action: match raw.default_action {
                None => BatchAction::PerTopic,
                Some(s) => parse_action("batching.default_action", s)?,
            },
            limits: raw.default_limits,
        };
        let combined = if raw.combined.enable.unwrap_or(false) {
            let name = raw.combined.config.as_deref().ok_or_else(|| {
                invalid(
                    "batching.combined_topics.config",
                    "name the batching config of combined-topics batches",
                )
            })?;
            Some(lookup("batching.combined_topics.config", name)?)
        } else {
            None
        };
        let mut topic_batching: HashMap<&str, TopicBatching> = HashMap::new();
        for (topic, t) in raw.batching_topics {
            let action = match t.action.as_deref() {
                None => BatchAction::PerTopic,
                Some(s) => parse_action("batching.topics.action", s)?,
            };
            let limits = match (&t.config, action) {
                (Some(c), BatchAction::PerTopic) => lookup("batching.topics.config", c)?,
                (None, BatchAction::PerTopic) => raw.default_limits,
                (Some(_), BatchAction::CombinedTopics) => {
                    return Err(invalid(
                        "batching.topics.config",
                        format!("topic `{topic}`: combined_topics takes the combined config; remove `config`"),
                    ))
                }
                _ => BatchLimits {
                    time: None,
                    messages: None,
                    bytes: None,
                },
            };
            topic_batching.insert(topic.as_str(), TopicBatching { action, limits });
        }

        // Compression.
        let mut codecs: HashMap<&str, TopicCompression> = HashMap::new();
        for (name, c) in &raw.compression.configs {
            let codec = CodecName::parse(&c.codec).ok_or_else(|| {
                invalid(
                    "compression.configs.codec",
                    format!(
                        "config `{name}`: `{}` is not one of none, gzip, snappy, lz4, zstd",
                        c.codec
                    ),
                )
            })?;
            let min_size = match (codec, c.min_size) {
                (CodecName::None, _) => 0,
                (_, Some(b)) => usize::try_from(b.0)
                    .map_err(|_| invalid("compression.configs.min_size", "too large"))?,
                (_, None) => {
                    return Err(invalid(
                        "compression.configs.min_size",
                        format!("config `{name}`: set min_size (bytes below which a record set is sent uncompressed)"),
                    ))
                }
            };
            if let Some(level) = c.level {
                let ok = match codec {
                    CodecName::Gzip => (-1..=9).contains(&level),
                    CodecName::Zstd => (-7..=22).contains(&level),
                    CodecName::Lz4 => (0..=12).contains(&level),
                    CodecName::Snappy | CodecName::None => false,
                };
                if !ok {
                    return Err(invalid(
                        "compression.configs.level",
                        format!(
                            "config `{name}`: level {level} is not valid for {}",
                            c.codec
                        ),
                    ));
                }
            }
            codecs.insert(
                name.as_str(),
                TopicCompression {
                    codec,
                    min_size,
                    level: c.level,
                },
            );
        }
        let codec_ref = |key: &'static str, s: &str| -> Result<TopicCompression, ConfigError> {
            if let Some(c) = codecs.get(s) {
                return Ok(*c);
            }
            // A bare codec name works too, compressing any non-empty record set.
            match CodecName::parse(s) {
                Some(codec) => Ok(TopicCompression {
                    codec,
                    min_size: 0,
                    level: None,
                }),
                None => Err(invalid(
                    key,
                    format!("`{s}` is neither a compression config name nor a codec"),
                )),
            }
        };
        let default_compression = match raw.compression.default.as_deref() {
            None => TopicCompression::NONE,
            Some(s) => codec_ref("compression.default", s)?,
        };
        let size_threshold_percent = raw.compression.size_threshold_percent.unwrap_or(100);
        if size_threshold_percent > 100 {
            return Err(invalid(
                "compression.size_threshold_percent",
                "must be between 0 and 100",
            ));
        }

        // Rate limits.
        let mut rates: HashMap<&str, Option<RateLimit>> = HashMap::new();
        for (name, r) in &raw.rate_limit.configs {
            let v = match &r.max_count {
                RawCount::Word(w) if w == "unlimited" => None,
                RawCount::Word(w) => {
                    return Err(invalid(
                        "rate_limit.configs.max_count",
                        format!("config `{name}`: `{w}`: expected a number or \"unlimited\""),
                    ))
                }
                RawCount::Number(n) => {
                    let interval = r.interval_ms.filter(|&i| i > 0).ok_or_else(|| {
                        invalid(
                            "rate_limit.configs.interval_ms",
                            format!("config `{name}`: a numeric max_count needs interval_ms > 0"),
                        )
                    })?;
                    Some(RateLimit {
                        interval: Duration::from_millis(interval),
                        max_count: *n,
                    })
                }
            };
            rates.insert(name.as_str(), v);
        }
        let rate_ref = |key: &'static str, s: &str| -> Result<Option<RateLimit>, ConfigError> {
            if s == "unlimited" {
                return Ok(None);
            }
            rates
                .get(s)
                .copied()
                .ok_or_else(|| invalid(key, format!("no rate_limit config named `{s}`")))
        };
        let default_rate = match raw.rate_limit.default.as_deref() {
            None => None,
            Some(s) => rate_ref("rate_limit.default", s)?,
        };

        // Partitioners.
        let partitioner = |key: &'static str, s: &str| match s {
            "dory" => Ok(Partitioner::Dory),
            "murmur2" => Ok(Partitioner::Murmur2),
            _ => Err(invalid(
                key,
                format!("`{s}`: expected \"dory\" or \"murmur2\""),
            )),
        };
        let default_partitioner = match raw.partitioning.default.as_deref() {
            None => Partitioner::Dory,
            Some(s) => partitioner("partitioning.default", s)?,
        };

        let default = TopicPolicy {
            batching: default_batching,
            compression: default_compression,
            rate_limit: default_rate,
            partitioner: default_partitioner,
        };
        let mut overrides: HashMap<Vec<u8>, TopicPolicy> = HashMap::new();
        fn entry<'m>(
            m: &'m mut HashMap<Vec<u8>, TopicPolicy>,
            t: &str,
            default: TopicPolicy,
        ) -> &'m mut TopicPolicy {
            m.entry(t.as_bytes().to_vec()).or_insert(default)
        }
        for (t, b) in topic_batching {
            entry(&mut overrides, t, default).batching = b;
        }
        for (t, c) in &raw.compression.topics {
            entry(&mut overrides, t, default).compression = codec_ref("compression.topics", c)?;
        }
        for (t, r) in &raw.rate_limit.topics {
            entry(&mut overrides, t, default).rate_limit = rate_ref("rate_limit.topics", r)?;
        }
        for (t, p) in &raw.partitioning.topics {
            entry(&mut overrides, t, default).partitioner = partitioner("partitioning.topics", p)?;
        }
        Ok(Policies {
            default,
            overrides,
            combined,
            size_threshold_percent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_toml, Config, Overrides};
    use std::path::Path;

    fn load(text: &str) -> Result<Config, ConfigError> {
        let raw = parse_toml(Path::new("t.toml"), text)?;
        let ov = Overrides {
            brokers: vec!["127.0.0.1:9092".into()],
            tcp_port: Some(9000),
            ..Overrides::default()
        };
        Config::from_parts(raw, true, &ov)
    }

    const FULL: &str = r#"
[batching]
time_ms = 10000
bytes = "256k"
default_action = "combined_topics"
[batching.combined_topics]
enable = true
config = "default_latency"
[batching.configs.low_latency]
time_ms = 500
bytes = "256k"
[batching.configs.default_latency]
time_ms = 10000
[batching.topics."fast topic"]
action = "per_topic"
config = "low_latency"
[batching.topics.raw]
action = "disable"

[compression]
default = "snappy_config"
size_threshold_percent = 75
[compression.configs.snappy_config]
codec = "snappy"
min_size = 128
[compression.configs.gzip_config]
codec = "gzip"
min_size = 128
level = 3
[compression.topics]
"fast topic" = "gzip_config"
plain = "none"

[rate_limit]
default = "unlimited"
[rate_limit.configs.config1]
interval_ms = 10000
max_count = 1000
[rate_limit.configs.zero]
interval_ms = 1
max_count = 0
[rate_limit.topics]
spam = "zero"

[partitioning.topics]
orders = "murmur2"
"#;

    #[test]
    fn every_section_resolves_per_topic() {
        let c = load(FULL).expect("valid");
        let p = &c.policies;
        assert_eq!(p.default.batching.action, BatchAction::CombinedTopics);
        assert_eq!(
            p.combined.and_then(|l| l.time),
            Some(Duration::from_millis(10_000))
        );
        let fast = p.for_topic(b"fast topic");
        assert_eq!(fast.batching.action, BatchAction::PerTopic);
        assert_eq!(fast.batching.limits.time, Some(Duration::from_millis(500)));
        assert_eq!(fast.compression.codec, CodecName::Gzip);
        assert_eq!(fast.compression.level, Some(3));
        assert_eq!(p.for_topic(b"raw").batching.action, BatchAction::Disable);
        assert_eq!(p.for_topic(b"other").compression.codec, CodecName::Snappy);
        assert_eq!(p.for_topic(b"other").compression.min_size, 128);
        assert_eq!(p.for_topic(b"plain").compression.codec, CodecName::None);
        assert_eq!(p.size_threshold_percent, 75);
        assert_eq!(
            p.for_topic(b"spam").rate_limit.map(|r| r.max_count),
            Some(0)
        );
        assert_eq!(p.for_topic(b"other").rate_limit, None);
        assert_eq!(p.for_topic(b"orders").partitioner, Partitioner::Murmur2);
        assert_eq!(p.for_topic(b"other").partitioner, Partitioner::Dory);
        assert!(p.uses(CodecName::Snappy) && p.uses(CodecName::Gzip) && !p.uses(CodecName::Zstd));
    }

    #[test]
    fn defaults_without_sections() {
        let c = load("").expect("valid");
        let d = c.policies.default;
        assert_eq!(d.batching.action, BatchAction::PerTopic);
        assert_eq!(d.compression, TopicCompression::NONE);
        assert_eq!(d.rate_limit, None);
        assert_eq!(d.partitioner, Partitioner::Dory);
        assert!(c.policies.combined.is_none());
    }

    #[test]
    fn bad_references_name_the_key() {
        for (text, key) in [
            ("[compression]\ndefault = \"nope\"\n", "compression.default"),
            (
                "[batching.topics.t]\nconfig = \"nope\"\n",
                "batching.topics.config",
            ),
            (
                "[batching]\ndefault_action = \"sometimes\"\n",
                "batching.default_action",
            ),
            (
                "[batching.combined_topics]\nenable = true\n",
                "batching.combined_topics.config",
            ),
            ("[rate_limit.topics]\nt = \"nope\"\n", "rate_limit.topics"),
            (
                "[rate_limit.configs.x]\nmax_count = 5\n",
                "rate_limit.configs.interval_ms",
            ),
            (
                "[compression.configs.x]\ncodec = \"brotli\"\n",
                "compression.configs.codec",
            ),
            (
                "[compression.configs.x]\ncodec = \"gzip\"\n",
                "compression.configs.min_size",
            ),
            (
                "[compression.configs.x]\ncodec = \"gzip\"\nmin_size = 1\nlevel = 42\n",
                "compression.configs.level",
            ),
            (
                "[partitioning]\ndefault = \"random\"\n",
                "partitioning.default",
            ),
            ("[batching.configs.x]\ntime_ms = 0\n", "batching.configs"),
        ] {
            let e = load(text).expect_err(text);
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
    }
}
