//! What both the file settings ([`super`]) and the per-topic policies ([`super::policy`])
//! are made of: the start-up error, byte counts, counts that may be "unlimited", and batch
//! limits. It imports neither of them, so `policy` depends on this file alone and the
//! config module on `policy`: no import circle.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Errors that stop the daemon at start-up. Each names the setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

pub(super) fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

/// A byte count written either as an integer or as a string with a `k`/`m`/`g` suffix
/// (powers of 1024, as in Dory's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => parse_byte_size(&s)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parses `"64m"`, `"256k"`, `"1g"`, `"4096"` into bytes.
pub fn parse_byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1u64 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1u64 << 30),
        _ => (t, 1),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (use e.g. 65536, \"64k\", \"16m\")"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// `max_count` is a number or the string "unlimited".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawCount {
    Number(u64),
    Word(String),
}

/// Batch completion limits; `None` disables a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub time: Option<Duration>,
    pub messages: Option<u64>,
    pub bytes: Option<u64>,
}
