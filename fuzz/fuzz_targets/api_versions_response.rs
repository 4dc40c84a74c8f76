//! Fuzzes the ApiVersions response decoder, including its UNSUPPORTED_VERSION fallback to
//! the v0 layout: the first byte picks the version (0-3), the rest is the frame after the
//! size prefix. Decoding may fail but must never panic.
#![no_main]

use dory::kafka::api_versions::decode_response;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&selector, frame)) = data.split_first() {
        let version = i16::from(selector % 4);
        if let Ok(response) = decode_response(frame, version) {
            let _ = response.get(dory::kafka::API_KEY_PRODUCE);
        }
    }
});
