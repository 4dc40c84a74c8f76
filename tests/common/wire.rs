//! Dory's client wire format (§1.2–§1.4), encoded independently of the daemon.

pub const API_KEY_ANY_PARTITION: i16 = 256;
pub const API_KEY_PARTITION_KEY: i16 = 257;

/// Encodes any envelope, valid or not: `Size` is computed, everything else is as given
/// (`partition_key` present = PartitionKey body layout). For building malformed input.
#[allow(clippy::too_many_arguments)] // mirrors the wire fields one for one
pub fn encode_raw(
    api_key: i16,
    api_version: i16,
    flags: i16,
    partition_key: Option<i32>,
    topic: &[u8],
    ts: i64,
    key: &[u8],
    value: &[u8],
) -> Vec<u8> {
    let topic_len = i16::try_from(topic.len()).expect("topic longer than 32767 bytes");
    let key_len = i32::try_from(key.len()).expect("key too long");
    let value_len = i32::try_from(value.len()).expect("value too long");
    let mut out = Vec::with_capacity(32 + topic.len() + key.len() + value.len());
    out.extend_from_slice(&[0; 4]); // Size, patched below
    out.extend_from_slice(&api_key.to_be_bytes());
    out.extend_from_slice(&api_version.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if let Some(pk) = partition_key {
        out.extend_from_slice(&pk.to_be_bytes());
    }
    out.extend_from_slice(&topic_len.to_be_bytes());
    out.extend_from_slice(topic);
    out.extend_from_slice(&ts.to_be_bytes());
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&value_len.to_be_bytes());
    out.extend_from_slice(value);
    let size = i32::try_from(out.len()).expect("message longer than i32::MAX");
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}

/// AnyPartition v0 (§1.3): `Size = 28 + T + K + V`.
pub fn encode_any_partition(
    topic: impl AsRef<[u8]>,
    ts: i64,
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
) -> Vec<u8> {
    encode_raw(
        API_KEY_ANY_PARTITION,
        0,
        0,
        None,
        topic.as_ref(),
        ts,
        key.as_ref(),
        value.as_ref(),
    )
}

/// PartitionKey v0 (§1.4): `Size = 32 + T + K + V`.
pub fn encode_partition_key(
    partition_key: i32,
    topic: impl AsRef<[u8]>,
    ts: i64,
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
) -> Vec<u8> {
    encode_raw(
        API_KEY_PARTITION_KEY,
        0,
        0,
        Some(partition_key),
        topic.as_ref(),
        ts,
        key.as_ref(),
        value.as_ref(),
    )
}

/// Hex text of `bytes` ("00 01 ..."), for readable assertion messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parses "00 01 ..." hex text (whitespace ignored).
pub fn unhex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() % 2, 0, "odd number of hex digits");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex digit"))
        .collect()
}
