//! A small, fast hasher (FNV-1a) for the hot-path maps keyed by short topic names and
//! ids, where std's DoS-resistant SipHash costs more than the rest of the lookup. The
//! maps it serves are bounded, so collision attacks cannot make them grow.

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
        self.0
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
            f.finish()
        };
        // Published FNV-1a 64-bit test values.
        assert_eq!(h(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(h(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(h(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn map_works() {
        let mut m: FastMap<Vec<u8>, u32> = FastMap::default();
        m.insert(b"topic".to_vec(), 7);
        assert_eq!(m.get(&b"topic"[..]), Some(&7));
    }
}
