//! Fuzzes the SCRAM client on what a server sends: the first byte picks the hash and which
//! message the rest is (server-first, server-final, or a SaslAuthenticate response frame).
//! Parsing and the exchange may fail but must never panic. Iteration counts are capped by
//! the parser, so a fuzzed count costs at most MAX_SCRAM_ITERATIONS rounds; the fuzzer
//! mostly finds small ones.
#![no_main]

use dory::kafka::sasl::{
    decode_authenticate, parse_server_final, Mechanism, ScramClient, Secret,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, msg)) = data.split_first() else {
        return;
    };
    let mechanism = if selector & 1 == 0 {
        Mechanism::ScramSha256
    } else {
        Mechanism::ScramSha512
    };
    match (selector >> 1) % 3 {
        0 => {
            // A fixed nonce the fuzzer can learn to extend.
            let c = ScramClient::new(mechanism, "user", &Secret::new("pw".into()), b"fuzz");
            if let Ok((_, verifier)) = c.client_final(msg) {
                let _ = verifier.verify(msg);
            }
        }
        1 => {
            let _ = parse_server_final(msg);
        }
        _ => {
            let _ = decode_authenticate(msg, i16::from(selector >> 3) % 3, 0);
        }
    }
});
