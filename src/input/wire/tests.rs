use super::*;
use proptest::prelude::*;

const TS: i64 = 1_700_000_000_000;

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

fn example_any() -> Vec<u8> {
    hex("00 00 00 23 01 00 00 00 00 00 00 03 66 6f 6f 00 00 01 8b cf e5 68 00 00 00 00 01 6b 00 00 00 03 62 61 72")
}

fn example_pk() -> Vec<u8> {
    hex("00 00 00 27 01 01 00 00 00 00 ff ff ff fe 00 03 66 6f 6f 00 00 01 8b cf e5 68 00 00 00 00 01 6b 00 00 00 03 62 61 72")
}

fn malformed(msg: &[u8]) -> MalformedReason {
    match parse(msg) {
        Err(WireError::Malformed(reason)) => reason,
        other => panic!("expected malformed, got {other:?}"),
    }
}

/// Sets the size field to the actual length, so body checks are reached.
fn fix_size(mut msg: Vec<u8>) -> Vec<u8> {
    let len = i32::try_from(msg.len()).unwrap();
    msg[..4].copy_from_slice(&len.to_be_bytes());
    msg
}

fn any_msg(topic: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_any_partition(&mut out, topic, TS, key, value).unwrap();
    out
}

#[test]
fn worked_example_any_partition() {
    let mut out = vec![0xee];
    encode_any_partition(&mut out, b"foo", TS, b"k", b"bar").unwrap();
    assert_eq!(out[0], 0xee, "encoding appends");
    assert_eq!(&out[1..], example_any());
    assert_eq!(any_partition_size(3, 1, 3), Some(35));
    let msg = example_any();
    assert_eq!(
        parse(&msg).unwrap(),
        ClientMsg {
            kind: Kind::AnyPartition,
            topic: b"foo",
            timestamp: TS,
            key: b"k",
            value: b"bar",
        }
    );
}

#[test]
fn worked_example_partition_key() {
    let mut out = Vec::new();
    encode_partition_key(&mut out, -2, b"foo", TS, b"k", b"bar").unwrap();
    assert_eq!(out, example_pk());
    assert_eq!(partition_key_size(3, 1, 3), Some(39));
    let msg = example_pk();
    assert_eq!(
        parse(&msg).unwrap(),
        ClientMsg {
            kind: Kind::PartitionKey(-2),
            topic: b"foo",
            timestamp: TS,
            key: b"k",
            value: b"bar",
        }
    );
}

#[test]
fn empty_key_and_value_are_valid() {
    let msg = any_msg(b"t", b"", b"");
    assert_eq!(msg.len(), ANY_PARTITION_OVERHEAD + 1);
    let parsed = parse(&msg).unwrap();
    assert_eq!((parsed.key, parsed.value), (&b""[..], &b""[..]));
}

#[test]
fn too_short() {
    for len in 0..HEADER_SIZE {
        assert_eq!(malformed(&example_any()[..len]), MalformedReason::TooShort);
    }
}

#[test]
fn size_field_mismatch() {
    let mut msg = example_any();
    msg[3] = 0x24;
    assert_eq!(
        malformed(&msg),
        MalformedReason::SizeMismatch {
            declared: 36,
            actual: 35
        }
    );
    msg[3] = 0x22;
    assert!(matches!(
        malformed(&msg),
        MalformedReason::SizeMismatch { .. }
    ));
}

#[test]
fn negative_size_field() {
    let mut msg = example_any();
    msg[..4].copy_from_slice(&(-35i32).to_be_bytes());
    assert_eq!(
        malformed(&msg),
        MalformedReason::SizeMismatch {
            declared: -35,
            actual: 35
        }
    );
}

#[test]
fn nonzero_flags() {
    let mut msg = example_any();
    msg[9] = 1;
    assert_eq!(malformed(&msg), MalformedReason::NonZeroFlags(1));
    let mut msg = example_pk();
    msg[8] = 0x80;
    assert_eq!(malformed(&msg), MalformedReason::NonZeroFlags(i16::MIN));
}

#[test]
fn zero_topic_size() {
    // Topic size 0 with the rest intact: the checks must stop at the topic size.
    let mut msg = example_any();
    msg[11] = 0;
    assert_eq!(malformed(&msg), MalformedReason::BadTopicSize(0));
}

#[test]
fn negative_topic_size() {
    let mut msg = example_pk();
    msg[14] = 0xff;
    msg[15] = 0xfd;
    assert_eq!(malformed(&msg), MalformedReason::BadTopicSize(-3));
}

#[test]
fn negative_key_size() {
    let mut msg = example_any();
    msg[23..27].copy_from_slice(&(-1i32).to_be_bytes());
    assert_eq!(malformed(&msg), MalformedReason::NegativeKeySize(-1));
}

#[test]
fn negative_value_size() {
    let mut msg = example_any();
    msg[28..32].copy_from_slice(&i32::MIN.to_be_bytes());
    assert_eq!(
        malformed(&msg),
        MalformedReason::NegativeValueSize(i32::MIN)
    );
}

#[test]
fn trailing_garbage() {
    let mut msg = example_any();
    msg.extend_from_slice(b"xy");
    assert_eq!(malformed(&fix_size(msg)), MalformedReason::TrailingBytes(2));
}

#[test]
fn value_size_larger_than_remaining() {
    let mut msg = example_pk();
    msg[35] = 4;
    assert_eq!(malformed(&msg), MalformedReason::Truncated("value"));
}

#[test]
fn key_size_larger_than_remaining() {
    let mut msg = example_any();
    msg[23..27].copy_from_slice(&100i32.to_be_bytes());
    assert_eq!(malformed(&msg), MalformedReason::Truncated("key"));
}

#[test]
fn topic_size_larger_than_remaining() {
    let mut msg = example_any();
    msg[10..12].copy_from_slice(&i16::MAX.to_be_bytes());
    assert_eq!(malformed(&msg), MalformedReason::Truncated("topic"));
}

#[test]
fn truncation_at_every_offset_is_malformed() {
    for full in [example_any(), example_pk()] {
        for len in 0..full.len() {
            let cut = &full[..len];
            // As received: the size field no longer matches (or the header is short).
            malformed(cut);
            // With a consistent size field, the body checks must catch it.
            if len >= HEADER_SIZE {
                let reason = malformed(&fix_size(cut.to_vec()));
                assert!(
                    matches!(reason, MalformedReason::Truncated(_)),
                    "len {len}: {reason:?}"
                );
            }
        }
    }
}

#[test]
fn truncation_reports_the_field() {
    let full = example_pk();
    let at = |len: usize| malformed(&fix_size(full[..len].to_vec()));
    assert_eq!(at(8), MalformedReason::Truncated("flags"));
    assert_eq!(at(10), MalformedReason::Truncated("partition key"));
    assert_eq!(at(14), MalformedReason::Truncated("topic size"));
    assert_eq!(at(16), MalformedReason::Truncated("topic"));
    assert_eq!(at(19), MalformedReason::Truncated("timestamp"));
    assert_eq!(at(27), MalformedReason::Truncated("key size"));
    assert_eq!(at(31), MalformedReason::Truncated("key"));
    assert_eq!(at(32), MalformedReason::Truncated("value size"));
    assert_eq!(at(36), MalformedReason::Truncated("value"));
}

#[test]
fn unsupported_api_key_and_version() {
    let mut msg = example_any();
    msg[4..6].copy_from_slice(&258i16.to_be_bytes());
    assert_eq!(parse(&msg), Err(WireError::UnsupportedApiKey(258)));
    let mut msg = example_pk();
    msg[6..8].copy_from_slice(&1i16.to_be_bytes());
    assert_eq!(
        parse(&msg),
        Err(WireError::UnsupportedVersion {
            api_key: 257,
            version: 1
        })
    );
}

#[test]
fn checks_apply_in_spec_order() {
    // Short header beats everything.
    assert_eq!(malformed(&[0xff; 7]), MalformedReason::TooShort);
    // Size mismatch beats an unknown api key.
    let mut msg = example_any();
    msg[4..6].copy_from_slice(&1i16.to_be_bytes());
    msg.push(0);
    assert!(matches!(
        malformed(&msg),
        MalformedReason::SizeMismatch { .. }
    ));
    // Unknown api key beats a bad version and a garbage body.
    let mut msg = hex("00 00 00 0c 00 01 00 07 ff ff ff ff");
    assert_eq!(parse(&msg), Err(WireError::UnsupportedApiKey(1)));
    // A bad version beats a garbage body.
    msg[4..6].copy_from_slice(&256i16.to_be_bytes());
    assert_eq!(
        parse(&msg),
        Err(WireError::UnsupportedVersion {
            api_key: 256,
            version: 7
        })
    );
    // A header-only message of a known kind is a truncated body.
    let msg = hex("00 00 00 08 01 00 00 00");
    assert_eq!(malformed(&msg), MalformedReason::Truncated("flags"));
    // Flags are checked before the partition key is read.
    let msg = hex("00 00 00 0a 01 01 00 00 00 01");
    assert_eq!(malformed(&msg), MalformedReason::NonZeroFlags(1));
}

#[test]
fn error_messages_are_lowercase() {
    let errors = [
        WireError::Malformed(MalformedReason::Truncated("key")).to_string(),
        WireError::UnsupportedApiKey(3).to_string(),
        EncodeError::EmptyTopic.to_string(),
        FrameError::InvalidSize(2).to_string(),
    ];
    for e in errors {
        assert_eq!(e, e.to_lowercase());
    }
}

#[test]
fn encode_limits() {
    let mut out = Vec::new();
    assert_eq!(
        encode_any_partition(&mut out, b"", TS, b"", b""),
        Err(EncodeError::EmptyTopic)
    );
    let long = vec![b'a'; MAX_TOPIC_LEN + 1];
    assert_eq!(
        encode_partition_key(&mut out, 0, &long, TS, b"", b""),
        Err(EncodeError::TopicTooLong(MAX_TOPIC_LEN + 1))
    );
    assert!(out.is_empty());
    let max_topic = vec![b'a'; MAX_TOPIC_LEN];
    encode_any_partition(&mut out, &max_topic, TS, b"", b"").unwrap();
    assert_eq!(parse(&out).unwrap().topic.len(), MAX_TOPIC_LEN);

    assert_eq!(any_partition_size(0, 0, 0), None);
    assert_eq!(any_partition_size(MAX_TOPIC_LEN + 1, 0, 0), None);
    let max = i32::MAX as usize;
    assert_eq!(any_partition_size(1, 0, max - 29), Some(max));
    assert_eq!(any_partition_size(1, max - 28, 0), None);
    assert_eq!(partition_key_size(1, 0, max - 33), Some(max));
    assert_eq!(partition_key_size(1, 0, max - 32), None);
    assert_eq!(partition_key_size(1, usize::MAX, usize::MAX), None);
}

proptest! {
    #[test]
    fn any_partition_roundtrip(
        topic in prop::collection::vec(any::<u8>(), 1..200),
        timestamp in any::<i64>(),
        key in prop::collection::vec(any::<u8>(), 0..300),
        value in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut out = Vec::new();
        encode_any_partition(&mut out, &topic, timestamp, &key, &value).unwrap();
        prop_assert_eq!(Some(out.len()), any_partition_size(topic.len(), key.len(), value.len()));
        let msg = parse(&out).unwrap();
        prop_assert_eq!(msg, ClientMsg { kind: Kind::AnyPartition, topic: &topic, timestamp, key: &key, value: &value });
    }

    #[test]
    fn partition_key_roundtrip(
        partition_key in any::<i32>(),
        topic in prop::collection::vec(any::<u8>(), 1..200),
        timestamp in any::<i64>(),
        key in prop::collection::vec(any::<u8>(), 0..300),
        value in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut out = Vec::new();
        encode_partition_key(&mut out, partition_key, &topic, timestamp, &key, &value).unwrap();
        prop_assert_eq!(Some(out.len()), partition_key_size(topic.len(), key.len(), value.len()));
        let msg = parse(&out).unwrap();
        prop_assert_eq!(msg, ClientMsg { kind: Kind::PartitionKey(partition_key), topic: &topic, timestamp, key: &key, value: &value });
    }

    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = parse(&bytes);
        let _ = parse(&fix_size_any(bytes));
    }

    #[test]
    fn framer_yields_exactly_the_messages(
        msgs in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 1..20), prop::collection::vec(any::<u8>(), 0..400)),
            0..20,
        ),
        splits in prop::collection::vec(1usize..700, 1..50),
    ) {
        let encoded: Vec<Vec<u8>> = msgs.iter().map(|(t, v)| any_msg(t, b"k", v)).collect();
        let stream = encoded.concat();
        let mut reader = SplitReader { data: &stream, splits: &splits, turn: 0 };
        let mut framer = StreamFramer::new(1024);
        let mut got = Vec::new();
        while framer.read_from(&mut reader).unwrap() > 0 {
            while let Some(frame) = framer.next_frame().unwrap() {
                got.push(frame.to_vec());
            }
        }
        prop_assert!(framer.buffered().is_empty());
        prop_assert_eq!(&got, &encoded);
        for (frame, (topic, value)) in got.iter().zip(&msgs) {
            let msg = parse(frame).unwrap();
            prop_assert_eq!((msg.topic, msg.value), (&topic[..], &value[..]));
        }
    }

    #[test]
    fn framers_sharing_a_read_buffer_each_get_exactly_their_messages(
        streams in prop::collection::vec(
            prop::collection::vec(0usize..20_000, 0..12),
            1..5,
        ),
        splits in prop::collection::vec(1usize..30_000, 1..40),
    ) {
        // Values up to 20,000 bytes: some partials fit KEEP_PARTIAL_MAX, some do not.
        let encoded: Vec<Vec<Vec<u8>>> = streams
            .iter()
            .enumerate()
            .map(|(s, lens)| {
                lens.iter()
                    .enumerate()
                    .map(|(i, &len)| any_msg(b"t", b"", &vec![(s * 31 + i) as u8; len]))
                    .collect()
            })
            .collect();
        let bytes: Vec<Vec<u8>> = encoded.iter().map(|e| e.concat()).collect();
        let mut readers: Vec<SplitReader> = bytes
            .iter()
            .enumerate()
            .map(|(i, b)| SplitReader { data: b, splits: &splits, turn: i })
            .collect();
        let mut framers: Vec<StreamFramer> =
            (0..bytes.len()).map(|_| StreamFramer::new(32 * 1024)).collect();
        let mut got = vec![Vec::new(); bytes.len()];
        let mut shared = Vec::new();
        let mut open = bytes.len();
        // Round robin over the connections, as the stream input serves them.
        while open > 0 {
            open = 0;
            for ((framer, reader), got) in framers.iter_mut().zip(&mut readers).zip(&mut got) {
                if reader.data.is_empty() {
                    continue;
                }
                open += 1;
                framer.read_shared(reader, &mut shared).unwrap();
                while let Some(frame) = framer.next_frame().unwrap() {
                    got.push(frame.to_vec());
                }
                let partial = framer.buffered().to_vec();
                framer.settle(&mut shared);
                prop_assert_eq!(framer.buffered(), &partial[..]);
                if partial.len() <= KEEP_PARTIAL_MAX {
                    // A small partial is all the connection keeps.
                    prop_assert!(framer.capacity() <= 2 * KEEP_PARTIAL_MAX);
                }
                prop_assert!(framer.capacity() <= 32 * 1024 + 4 + 2 * READ_CHUNK_SIZE);
                prop_assert!(shared.len() <= 4 * READ_CHUNK_SIZE);
            }
        }
        for ((framer, got), encoded) in framers.iter().zip(&got).zip(&encoded) {
            prop_assert!(framer.buffered().is_empty());
            prop_assert_eq!(got, encoded);
        }
    }
}

/// Like `fix_size`, but tolerates inputs shorter than the size field.
fn fix_size_any(msg: Vec<u8>) -> Vec<u8> {
    if msg.len() < 4 {
        msg
    } else {
        fix_size(msg)
    }
}

/// Hands out the data in reads of the given sizes, cycling through them.
struct SplitReader<'a> {
    data: &'a [u8],
    splits: &'a [usize],
    turn: usize,
}

impl Read for SplitReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = self.splits[self.turn % self.splits.len()];
        self.turn += 1;
        let n = want.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn framer_with(bytes: &[u8], max: usize) -> StreamFramer {
    let mut framer = StreamFramer::new(max);
    let mut r = bytes;
    while framer.read_from(&mut r).unwrap() > 0 {}
    framer
}

#[test]
fn invalid_size_fields_close_the_connection() {
    for size in [i32::MIN, -1, 0, 3] {
        let mut bytes = size.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[1, 2, 3]);
        let mut framer = framer_with(&bytes, 1024);
        assert_eq!(framer.next_frame(), Err(FrameError::InvalidSize(size)));
        // The data stays available for the discard sample.
        assert_eq!(framer.buffered(), &bytes[..]);
    }
}

#[test]
fn size_four_is_an_empty_frame() {
    let mut framer = framer_with(&4i32.to_be_bytes(), 0);
    assert_eq!(framer.next_frame(), Ok(Some(&4i32.to_be_bytes()[..])));
    assert_eq!(framer.next_frame(), Ok(None));
}

#[test]
fn too_large_is_refused_as_soon_as_the_size_is_seen() {
    let mut framer = framer_with(&105i32.to_be_bytes(), 100);
    assert_eq!(
        framer.next_frame(),
        Err(FrameError::TooLarge {
            size: 105,
            max: 100
        })
    );
    // Exactly at the limit is fine: 100 body bytes.
    let mut bytes = 104i32.to_be_bytes().to_vec();
    bytes.resize(104, 7);
    let mut framer = framer_with(&bytes, 100);
    assert_eq!(framer.next_frame(), Ok(Some(&bytes[..])));
}

#[test]
fn partial_size_field_waits() {
    let msg = example_any();
    let mut framer = framer_with(&msg[..3], 1024);
    assert_eq!(framer.next_frame(), Ok(None));
    assert_eq!(framer.buffered(), &msg[..3]);
}

#[test]
fn lying_size_field_does_not_allocate_the_claimed_size() {
    let mut bytes = i32::MAX.to_be_bytes().to_vec();
    bytes.extend_from_slice(b"only a few bytes");
    let mut framer = framer_with(&bytes, i32::MAX as usize);
    assert_eq!(framer.next_frame(), Ok(None));
    assert_eq!(framer.buffered(), &bytes[..]);
    assert!(framer.buf.capacity() <= 2 * READ_CHUNK_SIZE);
}

#[test]
fn maximal_message_in_many_reads() {
    const MAX: usize = 2 * 1024 * 1024;
    let value = vec![0x5a; MAX - ANY_PARTITION_OVERHEAD + 4 - 3];
    let msg = any_msg(b"big", b"", &value);
    assert_eq!(msg.len(), MAX + 4);
    let mut stream = msg.clone();
    stream.extend_from_slice(&example_any());
    stream.extend_from_slice(&msg);

    let mut framer = StreamFramer::new(MAX);
    let mut r = &stream[..];
    let mut got = Vec::new();
    let mut reads = 0;
    while framer.read_from(&mut r).unwrap() > 0 {
        reads += 1;
        while let Some(frame) = framer.next_frame().unwrap() {
            got.push(frame.to_vec());
        }
        // Bounded by one maximal message plus a read chunk (plus Vec growth slack).
        assert!(framer.buf.len() <= MAX + 4 + READ_CHUNK_SIZE);
    }
    assert!(reads >= stream.len() / READ_CHUNK_SIZE);
    assert_eq!(got, [msg.clone(), example_any(), msg]);
    assert_eq!(parse(&got[0]).unwrap().value, &value[..]);
    // Emptied after big messages: the memory was handed back.
    framer.make_room();
    assert!(framer.buf.len() <= READ_CHUNK_SIZE);
}

#[test]
fn an_idle_framer_keeps_only_its_partial_message() {
    let mut framer = StreamFramer::new(1024);
    assert_eq!(framer.capacity(), 0);
    let mut stream = example_any();
    let partial = &example_pk()[..10];
    stream.extend_from_slice(partial);
    let mut r = &stream[..];
    framer.read_from(&mut r).unwrap();
    assert!(framer.capacity() >= READ_CHUNK_SIZE);
    assert_eq!(framer.next_frame(), Ok(Some(&example_any()[..])));
    assert_eq!(framer.next_frame(), Ok(None));
    framer.release_idle();
    assert_eq!(framer.capacity(), partial.len());
    assert_eq!(framer.buffered(), partial);
    // No room left: the next read takes a fresh chunk.
    assert!(framer.buf.len() - framer.end < READ_CHUNK_SIZE);
    // The rest of the message arrives later: the frame is whole again.
    let mut rest = &example_pk()[10..];
    framer.read_from(&mut rest).unwrap();
    assert_eq!(framer.next_frame(), Ok(Some(&example_pk()[..])));
    // Nothing buffered: all of it goes back.
    framer.release_idle();
    assert_eq!(framer.capacity(), 0);
    assert!(framer.buffered().is_empty());
}

#[test]
fn a_thousand_connections_hold_one_read_buffer_between_them() {
    let mut shared = Vec::new();
    let mut stream = example_any();
    stream.extend_from_slice(&example_pk()[..10]);
    let mut framers: Vec<StreamFramer> = (0..1000).map(|_| StreamFramer::new(1024)).collect();
    for framer in &mut framers {
        let mut r = &stream[..];
        framer.read_shared(&mut r, &mut shared).unwrap();
        assert_eq!(framer.next_frame(), Ok(Some(&example_any()[..])));
        assert_eq!(framer.next_frame(), Ok(None));
        framer.settle(&mut shared);
        assert_eq!(framer.buffered(), &example_pk()[..10]);
    }
    // The partial messages are all that the connections hold; the read buffer is one.
    let held: usize = framers.iter().map(StreamFramer::capacity).sum();
    assert!(held <= 1000 * 64, "{held}");
    assert!(shared.len() >= READ_CHUNK_SIZE);
    // The rest of each message arrives: every frame is whole.
    for framer in &mut framers {
        let mut rest = &example_pk()[10..];
        framer.read_shared(&mut rest, &mut shared).unwrap();
        assert_eq!(framer.next_frame(), Ok(Some(&example_pk()[..])));
        framer.settle(&mut shared);
        assert!(framer.buffered().is_empty());
    }
}

#[test]
fn a_long_partial_keeps_its_read_buffer_until_the_message_is_whole() {
    let value = vec![0x33; 3 * KEEP_PARTIAL_MAX];
    let msg = any_msg(b"big", b"", &value);
    let cut = 2 * KEEP_PARTIAL_MAX;
    let mut shared = Vec::new();
    let mut framer = StreamFramer::new(READ_CHUNK_SIZE);
    let mut r = &msg[..cut];
    framer.read_shared(&mut r, &mut shared).unwrap();
    assert_eq!(framer.next_frame(), Ok(None));
    framer.settle(&mut shared);
    // Too long to copy into a small buffer: the connection keeps the one it read into,
    // and the input's buffer is grown again when next lent.
    assert_eq!(framer.buffered(), &msg[..cut]);
    assert!(framer.capacity() >= READ_CHUNK_SIZE);
    assert!(shared.len() < READ_CHUNK_SIZE);
    let mut other = StreamFramer::new(1024);
    let small = example_any();
    other.read_shared(&mut &small[..], &mut shared).unwrap();
    assert_eq!(other.next_frame(), Ok(Some(&small[..])));
    other.settle(&mut shared);
    assert!(shared.len() >= READ_CHUNK_SIZE);
    // The rest arrives: the message is whole and its buffer goes back.
    let mut rest = &msg[cut..];
    framer.read_shared(&mut rest, &mut shared).unwrap();
    assert_eq!(framer.next_frame(), Ok(Some(&msg[..])));
    framer.settle(&mut shared);
    assert_eq!(framer.capacity(), 0);
    assert!(shared.len() >= READ_CHUNK_SIZE);
}

#[test]
fn disconnect_mid_message_leaves_the_partial_data() {
    let mut stream = example_any();
    stream.extend_from_slice(&example_pk()[..10]);
    let mut framer = framer_with(&stream, 1024);
    assert_eq!(framer.next_frame(), Ok(Some(&example_any()[..])));
    assert_eq!(framer.next_frame(), Ok(None));
    assert_eq!(framer.buffered(), &example_pk()[..10]);
}
