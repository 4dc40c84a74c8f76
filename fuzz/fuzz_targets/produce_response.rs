//! Fuzzes the Produce response decoder: the first byte picks the version (0-8), the rest is
//! the frame after the size prefix. Decoding may fail but must never panic.
#![no_main]

use dory::kafka::produce::decode_response;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&selector, frame)) = data.split_first() {
        let version = i16::from(selector % 9);
        let _ = decode_response(frame, version);
    }
});
