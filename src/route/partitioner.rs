//! The Java Kafka client's default key partitioner: murmur2 of the key bytes, sign bit
//! cleared, modulo the partition count. Keys routed this way land on the same partitions as
//! a Java (or librdkafka `murmur2_random`) producer would put them.

/// `org.apache.kafka.common.utils.Utils.murmur2`: MurmurHash2 (32-bit) with Kafka's seed
/// `0x9747b28c`, reading the key as little-endian 4-byte words. Returns the Java `int`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java uses the int length; keys are far below 4 GiB, and wrapping matches Java anyway.
    let mut h = SEED ^ (data.len() as u32);
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        // Java's switch falls through from case 3 to case 1.
        for (i, &b) in tail.iter().enumerate().rev() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Java's `Utils.toPositive`: clears the sign bit (not `abs`, which differs for negative
/// hashes and overflows on `i32::MIN`).
pub fn to_positive(n: i32) -> u32 {
    (n & 0x7fff_ffff) as u32
}

/// The partition the Java client's default partitioner picks for a non-null key:
/// `toPositive(murmur2(key)) % partitions`. The result is a partition id: it indexes the
/// topic's partitions sorted by id, all of them, available or not (ids are 0..n-1 in Kafka).
/// `None` if the topic has no partitions.
pub fn java_partition(key: &[u8], partitions: usize) -> Option<usize> {
    let hash = usize::try_from(to_positive(murmur2(key))).ok()?;
    hash.checked_rem(partitions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn java_client_vectors() {
        // Apache Kafka clients, UtilsTest.testMurmur2 (expected Java int results).
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{:?}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn librdkafka_vectors() {
        // librdkafka src/rdmurmur2.c, unittest_murmur2 (`java_murmur2_results`): the same
        // function, cross-checked against the Java client. Covers every tail length.
        let cases: [(&str, u32); 11] = [
            ("kafka", 0xd067_cf64),
            ("giberish123456789", 0x8f55_2b0c),
            ("1234", 0x9fc9_7b14),
            ("234", 0xe7c0_09ca),
            ("34", 0x8739_30da),
            ("4", 0x5a4b_5ca1),
            ("PreAmbleWillBeRemoved,ThePrePartThatIs", 0x7842_4f1c),
            ("reAmbleWillBeRemoved,ThePrePartThatIs", 0x4a62_b377),
            ("eAmbleWillBeRemoved,ThePrePartThatIs", 0xe0e4_e09e),
            ("AmbleWillBeRemoved,ThePrePartThatIs", 0x62b8_b43f),
            ("", 0x106e_08d9),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key.as_bytes()) as u32, want, "{key:?}");
        }
    }

    #[test]
    fn partition_clears_the_sign_bit_rather_than_taking_abs() {
        // murmur2("21") = -973932308; & 0x7fffffff = 1173551340, abs = 973932308.
        assert_eq!(to_positive(-973_932_308), 1_173_551_340);
        assert_eq!(java_partition(b"21", 10), Some(0));
        assert_eq!(java_partition(b"21", 7), Some(1_173_551_340 % 7));
        // "kafka": 0xd067cf64 -> 0x5067cf64 = 1348980580 (librdkafka's older unit test
        // lists this positive value for "kafka").
        assert_eq!(to_positive(murmur2(b"kafka")), 1_348_980_580);
        assert_eq!(java_partition(b"kafka", 3), Some(1_348_980_580 % 3));
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(-1), 0x7fff_ffff);
        assert_eq!(java_partition(b"kafka", 0), None);
        assert_eq!(java_partition(b"anything", 1), Some(0));
    }

    proptest! {
        #[test]
        fn prop_partition_in_range(key in proptest::collection::vec(any::<u8>(), 0..64),
                                   n in 1usize..1000) {
            let p = java_partition(&key, n).unwrap();
            prop_assert!(p < n);
            prop_assert_eq!(p, to_positive(murmur2(&key)) as usize % n);
        }
    }
}
