//! The Kafka protocol, as dory speaks it: a pure codec (bytes in, bytes out, no threads, no
//! sockets) for ApiVersions, Metadata, Produce and RecordBatch v2, the error-code table, and
//! one blocking `connection` module that is the only place doing I/O.
//!
//! Reading order: `primitives` (wire types) → `frame` (size prefix and headers) →
//! `api_versions`, `metadata`, `produce`, `record_batch` (one file per message) → `errors`
//! (codes and retry policy) → `control` and `sasl` (control-plane messages through the
//! `kafka-protocol` crate; SCRAM) → `connection` (TCP, TLS, SASL and the version handshake).
//!
//! Channels: none; callers (the router's metadata fetcher, the dispatchers) call it.
//!
//! Imports: no role of dory (nothing from `crate::` outside `kafka`), so it can be read,
//! tested and fuzzed on its own.

pub mod api_versions;
pub mod compression;
pub mod connection;
pub mod control;
pub mod errors;
pub mod frame;
pub mod message_set;
pub mod metadata;
pub mod primitives;
pub mod produce;
pub mod record_batch;
pub mod sasl;
mod tls_stream;

pub use api_versions::{ApiVersionRange, ApiVersionsResponse};
pub use connection::{ConnError, Connection, Negotiated, Security, SecurityFailure, TlsClient};
pub use errors::{classify, error_name, is_retriable, ErrorAction};
pub use metadata::{MetadataBroker, MetadataPartition, MetadataResponse, MetadataTopic};
pub use primitives::{DecodeError, Reader};
pub use produce::{ProducePartitionResponse, ProduceRequestWriter, ProduceResponse};
pub use record_batch::{DecodedBatch, DecodedRecord, RecordBatchWriter};

pub const API_KEY_PRODUCE: i16 = 0;
pub const API_KEY_METADATA: i16 = 3;
pub const API_KEY_API_VERSIONS: i16 = 18;

/// An inclusive range of versions of one API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionRange {
    pub min: i16,
    pub max: i16,
}

impl VersionRange {
    pub const fn contains(&self, version: i16) -> bool {
        self.min <= version && version <= self.max
    }
}

/// Produce versions we speak. v3 is the first with RecordBatch v2 (and the oldest Kafka 4.x
/// accepts); v9+ is flexible and deliberately not supported, so the hot path never needs
/// compact lengths. v7+ is needed for zstd.
pub const PRODUCE_VERSIONS: VersionRange = VersionRange { min: 3, max: 8 };
/// Produce versions of Kafka 0.8–0.10, which carry MessageSet v0 (v0, v1) or v1 (v2)
/// instead of RecordBatch v2 (`kafka::message_set`).
pub const PRODUCE_LEGACY_VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };
/// Every Produce version the codec (`kafka::produce`) writes and reads.
pub const PRODUCE_CODEC_VERSIONS: VersionRange = VersionRange { min: 0, max: 8 };
/// Metadata versions we speak; v4+ lets us ask for topic auto-creation explicitly.
pub const METADATA_VERSIONS: VersionRange = VersionRange { min: 0, max: 12 };
/// ApiVersions versions we speak; v3 is flexible and carries our software name and version.
pub const API_VERSIONS_VERSIONS: VersionRange = VersionRange { min: 0, max: 3 };

/// The Produce version to speak to a broker offering `theirs`: the highest of v3–v8
/// (RecordBatch v2), else, for a broker of Kafka 0.10 (which offers v2 at most), the
/// highest of v0–v2 (MessageSet v0/v1, `kafka::message_set`).
pub fn negotiate_produce(theirs: Option<&ApiVersionRange>) -> Option<i16> {
    negotiate(PRODUCE_VERSIONS, theirs).or_else(|| negotiate(PRODUCE_LEGACY_VERSIONS, theirs))
}

/// The highest version both we and the broker support, or `None` if the ranges do not meet
/// (or the broker does not list the API at all).
pub fn negotiate(ours: VersionRange, theirs: Option<&ApiVersionRange>) -> Option<i16> {
    let theirs = theirs?;
    let high = ours.max.min(theirs.max_version);
    let low = ours.min.max(theirs.min_version);
    (low <= high).then_some(high)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(min: i16, max: i16) -> ApiVersionRange {
        ApiVersionRange {
            api_key: API_KEY_PRODUCE,
            min_version: min,
            max_version: max,
        }
    }

    #[test]
    fn negotiation_picks_highest_common_version() {
        assert_eq!(negotiate(PRODUCE_VERSIONS, Some(&range(0, 12))), Some(8));
        assert_eq!(negotiate(PRODUCE_VERSIONS, Some(&range(3, 5))), Some(5));
        assert_eq!(negotiate(PRODUCE_VERSIONS, Some(&range(0, 2))), None);
        assert_eq!(negotiate(PRODUCE_VERSIONS, Some(&range(9, 12))), None);
        assert_eq!(negotiate(PRODUCE_VERSIONS, Some(&range(8, 8))), Some(8));
        assert_eq!(negotiate(PRODUCE_VERSIONS, Some(&range(5, 3))), None);
        assert_eq!(negotiate(PRODUCE_VERSIONS, None), None);
        assert_eq!(negotiate(METADATA_VERSIONS, Some(&range(4, 13))), Some(12));
        // Produce: RecordBatch versions first, the old formats only where nothing else is.
        assert_eq!(negotiate_produce(Some(&range(0, 12))), Some(8));
        assert_eq!(negotiate_produce(Some(&range(0, 2))), Some(2));
        assert_eq!(negotiate_produce(Some(&range(0, 1))), Some(1));
        assert_eq!(negotiate_produce(Some(&range(9, 12))), None);
        assert_eq!(negotiate_produce(None), None);
    }

    #[test]
    fn ranges() {
        assert!(PRODUCE_VERSIONS.contains(3) && PRODUCE_VERSIONS.contains(8));
        assert!(!PRODUCE_VERSIONS.contains(2) && !PRODUCE_VERSIONS.contains(9));
    }
}
