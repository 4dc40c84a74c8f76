//! A small, fast hasher (FNV-1a with a final mix) for the hot-path maps keyed by short
//! topic names and ids, where std's DoS-resistant SipHash costs more than the rest of the
//! lookup. The maps it serves are bounded, so collision attacks cannot make them grow.
//!
//! The final mix matters: `HashMap` picks buckets by the low bits of a hash and filters
//! candidates by its top 7 bits, but plain FNV-1a barely changes the top bits when only
//! the last byte differs (`topic-1`, `topic-2`, ...), so every such key looked alike and
//! each lookup compared keys one by one.

use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a, 64-bit.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        mix(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Spreads every input bit over the whole word (the 64-bit finaliser of MurmurHash3).
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// `HashMap` with [`Fnv`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<Fnv>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_known_vectors() {
        let h = |s: &[u8]| {
            let mut f = Fnv::default();
            f.write(s);
            f.0
        };
        // Published FNV-1a 64-bit test values.
        assert_eq!(h(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(h(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(h(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn names_differing_in_the_last_byte_differ_in_the_top_bits() {
        let top7 = |s: &[u8]| {
            let mut f = Fnv::default();
            f.write(s);
            f.finish() >> 57
        };
        let tops: std::collections::HashSet<u64> = (0..10)
            .map(|i| top7(format!("dory-bench{i}").as_bytes()))
            .collect();
        // Ten keys over 128 values: without the mix all ten were equal.
        assert!(tops.len() >= 7, "{tops:?}");
    }

    #[test]
    fn map_works() {
        let mut m: FastMap<Vec<u8>, u32> = FastMap::default();
        m.insert(b"topic".to_vec(), 7);
        assert_eq!(m.get(&b"topic"[..]), Some(&7));
    }
}
