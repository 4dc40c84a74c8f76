//! Fuzzes the InitProducerId response decoder (the `kafka-protocol` crate behind
//! `kafka::control`): the first byte picks the version (0-4), the rest is the frame after
//! the size prefix. Decoding may fail but must never panic.
#![no_main]

use dory::kafka::control::decode_init_producer_id;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&selector, frame)) = data.split_first() {
        let version = i16::from(selector % 5);
        let _ = decode_init_producer_id(frame, version, 7);
    }
});
