//! Fuzzes the MessageSet v0/v1 decoder (Kafka 0.8–0.10) with arbitrary bytes, and checks
//! that whatever it accepts re-encodes (through the writer, uncompressed, each message in
//! its own magic) to a set it decodes to the same messages. When the first byte is odd, the
//! rest has each top-level entry's CRC-32 recomputed first, so mutations reach the fields
//! and the wrappers' decompression behind the checksum.
#![no_main]

use dory::kafka::compression::{Codec, Compression};
use dory::kafka::message_set::{decode_message_set, Magic, MessageSetWriter};
use libfuzzer_sys::fuzz_target;

/// Rewrites the CRC of every whole top-level entry of `set`.
fn reseal(set: &mut [u8]) {
    let mut at = 0;
    while set.len() >= at + 16 {
        let size = i32::from_be_bytes([set[at + 8], set[at + 9], set[at + 10], set[at + 11]]);
        let Ok(size) = usize::try_from(size) else { return };
        let body = at + 12;
        if size < 4 || set.len() < body + size {
            return;
        }
        let crc = crc32fast::hash(&set[body + 4..body + size]);
        set[body..body + 4].copy_from_slice(&crc.to_be_bytes());
        at = body + size;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut owned = rest.to_vec();
    if mode & 1 == 1 {
        reseal(&mut owned);
    }
    let Ok(msgs) = decode_message_set(&owned, 1 << 20) else {
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
