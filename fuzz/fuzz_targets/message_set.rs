//! Fuzzes the MessageSet v0/v1 decoder (Kafka 0.8–0.10) with arbitrary bytes, and checks
//! that whatever it accepts re-encodes (through the writer, uncompressed, each message in
//! its own magic) to a set it decodes to the same messages.
#![no_main]

use dory::kafka::compression::{Codec, Compression};
use dory::kafka::message_set::{decode_message_set, Magic, MessageSetWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(msgs) = decode_message_set(data, 1 << 20) else {
        return;
    };
    let none = Compression::new(Codec::None, None).expect("no codec");
    let (mut buf, mut scratch) = (Vec::new(), Vec::new());
    for m in &msgs {
        let magic = if m.magic == 0 { Magic::V0 } else { Magic::V1 };
        let mut w = MessageSetWriter::begin(magic, none, &mut scratch);
        w.append(&mut buf, m.timestamp.unwrap_or(0), m.key.as_deref(), m.value.as_deref());
        let _ = w.finish(&mut buf, &scratch, 100);
    }
    let again = decode_message_set(&buf, 1 << 20).expect("writer output decodes");
    let fields = |v: &[dory::kafka::message_set::DecodedMessage]| {
        v.iter()
            .map(|m| (m.magic, m.timestamp, m.key.clone(), m.value.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(fields(&msgs), fields(&again));
});
