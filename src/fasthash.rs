//! A small, fast hasher for the hot-path maps keyed by short topic names and ids, where
//! std's DoS-resistant SipHash costs more than the rest of the lookup. The maps it serves
//! are bounded, so collision attacks cannot make them grow.
//!
//! It folds its input eight bytes at a time (`h = (h ^ word) * K`, the tail zero-padded and
//! tagged with its length), and integers in one step each, so a topic name costs a couple
//! of multiplications instead of one per byte (plus eight for the length prefix `Hash`
//! writes before a slice). The final mix matters: `HashMap` picks buckets by the low bits
//! of a hash and filters candidates by its top 7 bits, but a plain fold barely changes the
//! top bits when only the last byte differs (`topic-1`, `topic-2`, ...), so every such key
//! would look alike and each lookup would compare keys one by one.

use std::hash::{BuildHasherDefault, Hasher};

/// Odd multiplier of the fold (2^64 divided by the golden ratio, made odd: any odd
/// constant with bits across the word works; the final mix does the rest).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// The word-folding hasher of [`FastMap`].
#[derive(Debug, Clone, Copy)]
pub struct FoldHash(u64);

impl Default for FoldHash {
    fn default() -> FoldHash {
        FoldHash(0xcbf2_9ce4_8422_2325)
    }
}

impl FoldHash {
    #[inline]
    fn fold(&mut self, word: u64) {
        self.0 = (self.0 ^ word).wrapping_mul(K).rotate_left(29);
    }
}

impl Hasher for FoldHash {
    #[inline]
    fn finish(&self) -> u64 {
        mix(self.0)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.fold(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder().len();
        if rest > 0 {
            // The tail's length in the top byte: "ab" and "ab\0" differ.
            self.fold(tail_word(bytes, rest) ^ ((rest as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.fold(u64::from(n));
    }
    #[inline]
    fn write_u16(&mut self, n: u16) {
        self.fold(u64::from(n));
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.fold(u64::from(n));
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.fold(n);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.fold(n as u64);
    }
    #[inline]
    fn write_i32(&mut self, n: i32) {
        self.fold(u64::from(n as u32));
    }
}

/// The last `rest` (1 to 7) bytes of `bytes` as a little-endian word, zero-padded: what
/// copying them into a zeroed `[u8; 8]` gives, without the copy's call to `memcpy` (its
/// length is not a constant). A name of 8 bytes or more gives its tail by one load of its
/// last 8 bytes, shifted; a shorter one by up to three loads.
#[inline]
fn tail_word(bytes: &[u8], rest: usize) -> u64 {
    let n = bytes.len();
    if let Some(last8) = n.checked_sub(8).and_then(|i| bytes.get(i..)) {
        let mut w = [0u8; 8];
        w.copy_from_slice(last8);
        return u64::from_le_bytes(w) >> (8 * (8 - rest));
    }
    let (mut w, mut at) = (0u64, 0usize);
    if n & 4 != 0 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&bytes[..4]);
        w = u64::from(u32::from_le_bytes(b));
        at = 4;
    }
    if n & 2 != 0 {
        let mut b = [0u8; 2];
        b.copy_from_slice(&bytes[at..at + 2]);
        w |= u64::from(u16::from_le_bytes(b)) << (8 * at);
        at += 2;
    }
    if n & 1 != 0 {
        w |= u64::from(bytes[at]) << (8 * at);
    }
    w
}

/// Spreads every input bit over the whole word (the 64-bit finaliser of MurmurHash3).
#[inline]
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// `HashMap` with [`FoldHash`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FoldHash>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(bytes: &[u8]) -> u64 {
        let mut f = FoldHash::default();
        f.write(bytes);
        f.finish()
    }

    #[test]
    fn lengths_and_tails_are_told_apart() {
        let keys: [&[u8]; 8] = [
            b"",
            b"\0",
            b"\0\0",
            b"ab",
            b"ab\0",
            b"abcdefgh",
            b"abcdefgh\0",
            b"abcdefghi",
        ];
        let hashes: std::collections::HashSet<u64> = keys.iter().map(|k| hash(k)).collect();
        assert_eq!(hashes.len(), keys.len());
    }

    #[test]
    fn many_similar_names_spread_over_buckets_and_tags() {
        // 10,000 names like the bench's: low 12 bits (buckets) and top 7 bits (tags).
        let names: Vec<Vec<u8>> = (0..10_000)
            .map(|i| format!("dory-bench{i}").into_bytes())
            .collect();
        let low: std::collections::HashSet<u64> = names.iter().map(|n| hash(n) & 0xfff).collect();
        let top: std::collections::HashSet<u64> = names.iter().map(|n| hash(n) >> 57).collect();
        // A uniform hash fills about 4096 * (1 - e^-2.44) = 3740 of 4096 buckets.
        assert!(low.len() > 3500, "{} buckets used", low.len());
        assert_eq!(top.len(), 128);
    }

    #[test]
    fn names_differing_in_the_last_byte_differ_in_the_top_bits() {
        let top7 = |s: &[u8]| hash(s) >> 57;
        let tops: std::collections::HashSet<u64> = (0..10)
            .map(|i| top7(format!("dory-bench{i}").as_bytes()))
            .collect();
        // Ten keys over 128 values: without the mix all ten were equal.
        assert!(tops.len() >= 7, "{tops:?}");
    }

    proptest::proptest! {
        #[test]
        fn tails_read_as_a_zero_padded_copy(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..40)) {
            let rest = bytes.len() % 8;
            if rest > 0 {
                let mut w = [0u8; 8];
                w[..rest].copy_from_slice(&bytes[bytes.len() - rest..]);
                proptest::prop_assert_eq!(tail_word(&bytes, rest), u64::from_le_bytes(w));
            }
        }
    }

    #[test]
    fn map_works() {
        let mut m: FastMap<Vec<u8>, u32> = FastMap::default();
        m.insert(b"topic".to_vec(), 7);
        assert_eq!(m.get(&b"topic"[..]), Some(&7));
    }
}
