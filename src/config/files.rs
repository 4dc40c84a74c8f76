//! Settings of what dory keeps on disk besides its config: the durable spool
//! (`[spool]`), the discard log (`[discard_log]`), message debug logging (`[msg_debug]`)
//! and the commit-point state file (`[commit_points]`): each section as written, as
//! validated, and the checks between the two.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::values::invalid;
use super::{parse_byte_size, positive, to_usize, ByteSize, ConfigError, RawCount};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpool {
    pub dir: Option<PathBuf>,
    pub fsync_interval_ms: Option<u64>,
    pub max_bytes: Option<ByteSize>,
    pub segment_bytes: Option<ByteSize>,
    /// "memory" or "spool", for topics not listed in `topics`.
    pub default: Option<String>,
    #[serde(default)]
    pub topics: HashMap<String, String>,
}

/// The durable spool (`[spool]`, see [`crate::spool`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    /// Group commit interval; zero: an input syncs each batch before handing it on.
    pub fsync_interval: Duration,
    /// Disk use bound: segment files (active, unresolved and spare) never exceed it.
    pub max_bytes: u64,
    /// Size of each preallocated segment file.
    pub segment_bytes: u64,
    /// Whether topics not listed in `topics` are spooled.
    pub default_spooled: bool,
    /// Topics whose choice differs from the default, or repeats it.
    pub topics: HashMap<String, bool>,
}

impl SpoolConfig {
    /// Whether messages of `topic` go through the spool.
    pub fn spooled(&self, topic: &[u8]) -> bool {
        std::str::from_utf8(topic)
            .ok()
            .and_then(|t| self.topics.get(t).copied())
            .unwrap_or(self.default_spooled)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscardLog {
    pub enable: Option<bool>,
    pub path: Option<PathBuf>,
    pub max_file_size: Option<ByteSize>,
    pub max_archive_size: Option<ByteSize>,
    /// Bytes of key and value logged: a size, or "unlimited".
    pub max_msg_prefix_size: Option<RawCount>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMsgDebug {
    pub enable: Option<bool>,
    pub path: Option<PathBuf>,
    pub time_limit_s: Option<u64>,
    pub byte_limit: Option<ByteSize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCommitPoints {
    pub enable: Option<bool>,
    pub path: Option<PathBuf>,
    pub write_interval_ms: Option<u64>,
}

/// Commit points (`[commit_points]`, see [`crate::report::commit_points`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPointsConfig {
    /// Track commit points and the oldest unacknowledged age (on by default).
    pub enable: bool,
    /// The state file holding the latest commit points, if wanted.
    pub file: Option<PathBuf>,
    /// How often the state file is rewritten (only when a commit point changed).
    pub write_interval: Duration,
}

/// The discard log file (one line per discarded message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscardLogConfig {
    pub path: PathBuf,
    pub max_file_size: u64,
    pub max_archive_size: u64,
    pub max_msg_prefix: Option<usize>,
}

/// Message debug logging (`[msg_debug]`, see [`crate::report::msg_debug`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgDebugConfig {
    /// Directory of the three files; created when logging starts.
    pub dir: PathBuf,
    /// Logging stops this long after it was enabled (Dory default 1 h).
    pub time_limit: Duration,
    /// Logging stops once this many bytes were written to the three files together
    /// (Dory default 2 MiB).
    pub byte_limit: u64,
}

/// Default and bounds of the `[spool]` sizes.
const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
const MIN_SEGMENT_BYTES: u64 = 64 << 10;
const MAX_SEGMENT_BYTES: u64 = 1 << 30;
const DEFAULT_SPOOL_MAX_BYTES: u64 = 4 << 30;
const MAX_FSYNC_INTERVAL_MS: u64 = 10_000;
/// Bounds what a spool segment needs besides a message's bytes: the segment header, a
/// record header and fixed fields, and the longest topic a client can send (config imports
/// no role, so this is a bound, not `spool::format`'s exact sizes; a test checks it).
pub const SPOOL_RECORD_OVERHEAD: u64 = 1024 + i16::MAX as u64;

fn spool_choice(key: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "memory" => Ok(false),
        "spool" => Ok(true),
        _ => Err(invalid(
            key,
            format!("`{v}`: expected \"memory\" or \"spool\""),
        )),
    }
}

pub(super) fn spool_config(
    raw: RawSpool,
    max_msg: u64,
) -> Result<Option<SpoolConfig>, ConfigError> {
    let default_spooled = raw
        .default
        .as_deref()
        .map_or(Ok(false), |v| spool_choice("spool.default", v))?;
    let topics = raw
        .topics
        .iter()
        .map(|(t, v)| Ok((t.clone(), spool_choice("spool.topics", v)?)))
        .collect::<Result<HashMap<String, bool>, ConfigError>>()?;
    if !default_spooled && !topics.values().any(|&s| s) {
        return Ok(None);
    }
    let dir = absolute("spool.dir", raw.dir)?;
    let fsync_ms = raw.fsync_interval_ms.unwrap_or(5);
    if fsync_ms > MAX_FSYNC_INTERVAL_MS {
        return Err(invalid(
            "spool.fsync_interval_ms",
            format!("must be between 0 (sync every batch) and {MAX_FSYNC_INTERVAL_MS}"),
        ));
    }
    let segment_bytes = raw.segment_bytes.map_or(DEFAULT_SEGMENT_BYTES, |b| b.0);
    if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&segment_bytes) {
        return Err(invalid(
            "spool.segment_bytes",
            format!("must be between {MIN_SEGMENT_BYTES} and {MAX_SEGMENT_BYTES} bytes"),
        ));
    }
    // A record is the message plus its topic and a few fixed fields; the largest message
    // an input accepts must fit in one segment.
    let largest_record = max_msg + SPOOL_RECORD_OVERHEAD;
    if largest_record > segment_bytes {
        return Err(invalid(
            "spool.segment_bytes",
            format!(
                "{segment_bytes} bytes cannot hold the largest message the inputs accept \
                 ({max_msg} bytes, input.max_stream_msg_size / input.max_datagram_msg_size)"
            ),
        ));
    }
    let max_bytes = raw.max_bytes.map_or(DEFAULT_SPOOL_MAX_BYTES, |b| b.0);
    if max_bytes < 2 * segment_bytes {
        return Err(invalid(
            "spool.max_bytes",
            "must hold at least two segments (spool.segment_bytes)",
        ));
    }
    Ok(Some(SpoolConfig {
        dir,
        fsync_interval: Duration::from_millis(fsync_ms),
        max_bytes,
        segment_bytes,
        default_spooled,
        topics,
    }))
}

fn absolute(key: &'static str, p: Option<PathBuf>) -> Result<PathBuf, ConfigError> {
    match p {
        Some(p) if p.is_absolute() => Ok(p),
        Some(p) => Err(invalid(
            key,
            format!("`{}` must be an absolute path", p.display()),
        )),
        None => Err(invalid(key, "required when enabled")),
    }
}

pub(super) fn discard_log_config(
    raw: RawDiscardLog,
) -> Result<Option<DiscardLogConfig>, ConfigError> {
    if !raw.enable.unwrap_or(false) {
        return Ok(None);
    }
    let max_msg_prefix = match raw.max_msg_prefix_size {
        None => None,
        Some(RawCount::Word(w)) if w == "unlimited" => None,
        Some(RawCount::Word(w)) => Some(to_usize(
            "discard_log.max_msg_prefix_size",
            parse_byte_size(&w).map_err(|m| invalid("discard_log.max_msg_prefix_size", m))?,
        )?),
        Some(RawCount::Number(n)) => Some(to_usize("discard_log.max_msg_prefix_size", n)?),
    };
    Ok(Some(DiscardLogConfig {
        path: absolute("discard_log.path", raw.path)?,
        max_file_size: positive(
            "discard_log.max_file_size",
            raw.max_file_size.map_or(1 << 20, |b| b.0),
        )?,
        max_archive_size: raw.max_archive_size.map_or(32 << 20, |b| b.0),
        max_msg_prefix,
    }))
}

pub(super) fn msg_debug_config(raw: RawMsgDebug) -> Result<Option<MsgDebugConfig>, ConfigError> {
    if !raw.enable.unwrap_or(false) {
        return Ok(None);
    }
    Ok(Some(MsgDebugConfig {
        dir: absolute("msg_debug.path", raw.path)?,
        time_limit: Duration::from_secs(positive(
            "msg_debug.time_limit_s",
            raw.time_limit_s.unwrap_or(3600),
        )?),
        byte_limit: positive(
            "msg_debug.byte_limit",
            raw.byte_limit.map_or(2 << 20, |b| b.0),
        )?,
    }))
}

/// `commit_points.write_interval_ms` bounds: each write is an fsync of file and directory.
const MIN_COMMIT_POINTS_INTERVAL_MS: u64 = 100;
const MAX_COMMIT_POINTS_INTERVAL_MS: u64 = 3_600_000;

pub(super) fn commit_points_config(
    raw: RawCommitPoints,
) -> Result<CommitPointsConfig, ConfigError> {
    let enable = raw.enable.unwrap_or(true);
    let file = match raw.path {
        Some(p) if p.as_os_str().is_empty() => None,
        Some(_) if !enable => {
            return Err(invalid(
                "commit_points.path",
                "a state file needs commit_points.enable = true",
            ))
        }
        p @ Some(_) => Some(absolute("commit_points.path", p)?),
        None => None,
    };
    let interval_ms = raw.write_interval_ms.unwrap_or(1000);
    if !(MIN_COMMIT_POINTS_INTERVAL_MS..=MAX_COMMIT_POINTS_INTERVAL_MS).contains(&interval_ms) {
        return Err(invalid(
            "commit_points.write_interval_ms",
            format!(
                "must be between {MIN_COMMIT_POINTS_INTERVAL_MS} and \
                 {MAX_COMMIT_POINTS_INTERVAL_MS} milliseconds"
            ),
        ));
    }
    Ok(CommitPointsConfig {
        enable,
        file,
        write_interval: Duration::from_millis(interval_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::with_section;
    use super::super::Config;
    use super::*;

    fn with_commit_points(toml: &str) -> Result<Config, ConfigError> {
        with_section("commit_points", toml)
    }

    #[test]
    fn commit_points_defaults_and_bounds() {
        let c = with_commit_points("").expect("valid").commit_points;
        assert_eq!(
            c,
            CommitPointsConfig {
                enable: true,
                file: None,
                write_interval: Duration::from_secs(1),
            }
        );
        let c = with_commit_points("path = \"/var/lib/dory/cp.json\"\nwrite_interval_ms = 250")
            .expect("valid")
            .commit_points;
        assert_eq!(c.file, Some(PathBuf::from("/var/lib/dory/cp.json")));
        assert_eq!(c.write_interval, Duration::from_millis(250));
        assert!(
            !with_commit_points("enable = false")
                .expect("valid")
                .commit_points
                .enable
        );
        for (bad, key) in [
            ("path = \"cp.json\"", "commit_points.path"),
            (
                "enable = false\npath = \"/x/cp.json\"",
                "commit_points.path",
            ),
            ("write_interval_ms = 99", "commit_points.write_interval_ms"),
            (
                "write_interval_ms = 3600001",
                "commit_points.write_interval_ms",
            ),
            ("file = \"/x\"", "file"),
        ] {
            let e = with_commit_points(bad).unwrap_err();
            assert!(e.to_string().contains(key), "{bad}: {e}");
        }
    }

    fn with_spool(toml: &str) -> Result<Config, ConfigError> {
        with_section("spool", toml)
    }

    #[test]
    fn spool_choice_per_topic_defaults_and_bounds() {
        assert_eq!(with_spool("").expect("valid").spool, None);
        assert_eq!(
            with_spool("dir = \"/s\"\ndefault = \"memory\"")
                .expect("valid")
                .spool,
            None,
            "no topic spooled: no spool"
        );
        let c = with_spool("dir = \"/s\"\n[spool.topics]\npayments = \"spool\"\nlogs = \"memory\"")
            .expect("valid")
            .spool
            .expect("a topic is spooled");
        assert_eq!(c.fsync_interval, Duration::from_millis(5));
        assert_eq!((c.max_bytes, c.segment_bytes), (4 << 30, 64 << 20));
        assert!(c.spooled(b"payments") && !c.spooled(b"logs") && !c.spooled(b"other"));
        let c = with_spool("dir = \"/s\"\ndefault = \"spool\"\nfsync_interval_ms = 0\n[spool.topics]\nlogs = \"memory\"")
            .expect("valid")
            .spool
            .expect("spooled by default");
        assert!(c.fsync_interval.is_zero());
        assert!(c.spooled(b"other") && !c.spooled(b"logs"));
        for (bad, key) in [
            ("default = \"spool\"", "spool.dir"),
            ("dir = \"s\"\ndefault = \"spool\"", "spool.dir"),
            ("dir = \"/s\"\ndefault = \"disk\"", "spool.default"),
            ("dir = \"/s\"\n[spool.topics]\nt = \"yes\"", "spool.topics"),
            (
                "dir = \"/s\"\ndefault = \"spool\"\nfsync_interval_ms = 10001",
                "spool.fsync_interval_ms",
            ),
            (
                "dir = \"/s\"\ndefault = \"spool\"\nsegment_bytes = 1000",
                "spool.segment_bytes",
            ),
            (
                "dir = \"/s\"\ndefault = \"spool\"\nsegment_bytes = \"1m\"",
                "spool.segment_bytes",
            ),
            (
                "dir = \"/s\"\ndefault = \"spool\"\nmax_bytes = \"100m\"",
                "spool.max_bytes",
            ),
        ] {
            let e = with_spool(bad).unwrap_err();
            assert!(e.to_string().contains(key), "{bad}: {e}");
        }
    }
}
