//! Fuzzes the decoder of Dory's client message format (untrusted bytes from any local
//! process): it must never panic, and what it accepts must re-encode to the same bytes.
#![no_main]

use dory::input::wire::{self, Kind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = wire::parse(data) {
        let mut out = Vec::new();
        let r = match m.kind {
            Kind::AnyPartition => wire::encode_any_partition(&mut out, m.topic, m.timestamp, m.key, m.value),
            Kind::PartitionKey(k) => wire::encode_partition_key(&mut out, k, m.topic, m.timestamp, m.key, m.value),
        };
        assert!(r.is_ok());
        assert_eq!(out, data);
    }
});
