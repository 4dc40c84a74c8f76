//! Which protocol dory speaks to each broker: set by the broker's dispatcher each time it
//! connects (a control-plane event, never per message), read by the status pages and
//! `/metrics`.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// What one broker was found to speak on its last connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerProtocol {
    /// `host:port`, as the metadata gave it.
    pub address: String,
    /// The Produce version negotiated (or assumed).
    pub produce_version: i16,
    /// The record format version its Produce requests carry: 0 or 1 (a MessageSet, Kafka
    /// 0.8–0.10), 2 (a RecordBatch, Kafka 0.11 and later).
    pub magic: i8,
    /// `Some(version)` when the broker closed the connection on ApiVersions and was taken
    /// for that Kafka version (`kafka.broker_version`); `None` when it answered ApiVersions.
    pub assumed: Option<&'static str>,
}

impl BrokerProtocol {
    /// `"RecordBatch v2"`, `"MessageSet v1"` or `"MessageSet v0"`.
    pub fn format_name(&self) -> &'static str {
        match self.magic {
            0 => "MessageSet v0",
            1 => "MessageSet v1",
            _ => "RecordBatch v2",
        }
    }

    /// How the version was found: `"ApiVersions"` or `"kafka.broker_version = 0.9"`.
    pub fn found_by(&self) -> String {
        match self.assumed {
            Some(v) => format!("kafka.broker_version = {v}"),
            None => "ApiVersions".to_string(),
        }
    }
}

/// Broker id → its protocol, in id order.
#[derive(Default)]
pub struct BrokerTable(Mutex<BTreeMap<i32, BrokerProtocol>>);

impl BrokerTable {
    /// Records what broker `id` speaks; returns whether it changed (a first connection, or
    /// a broker upgraded or downgraded under the same id).
    pub fn set(&self, id: i32, p: BrokerProtocol) -> bool {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        t.insert(id, p.clone()).as_ref() != Some(&p)
    }

    /// Every broker seen so far, in id order.
    pub fn snapshot(&self) -> Vec<(i32, BrokerProtocol)> {
        let t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().map(|(id, p)| (*id, p.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(version: i16, magic: i8, assumed: Option<&'static str>) -> BrokerProtocol {
        BrokerProtocol {
            address: "h:9092".into(),
            produce_version: version,
            magic,
            assumed,
        }
    }

    #[test]
    fn set_reports_changes_and_snapshot_is_in_id_order() {
        let t = BrokerTable::default();
        assert!(t.set(3, p(8, 2, None)));
        assert!(t.set(1, p(2, 1, None)));
        assert!(!t.set(3, p(8, 2, None)), "same protocol again: no change");
        assert!(
            t.set(3, p(1, 0, Some("0.9"))),
            "downgraded under the same id"
        );
        let s = t.snapshot();
        assert_eq!(s.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(s[0].1.format_name(), "MessageSet v1");
        assert_eq!(s[1].1.format_name(), "MessageSet v0");
        assert_eq!(s[1].1.found_by(), "kafka.broker_version = 0.9");
        assert_eq!(p(8, 2, None).format_name(), "RecordBatch v2");
        assert_eq!(p(8, 2, None).found_by(), "ApiVersions");
    }
}
