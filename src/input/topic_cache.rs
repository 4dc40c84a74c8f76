//! An input thread's cache of topic names it has looked up: name → (topic id, spooled).
//!
//! Every received message needs its topic's id, so this lookup is per-message work on the
//! input thread, the thread that bounds dory's intake. Clients sending to several topics
//! in turn make every message a miss of a "same as the last one" check, so the miss path
//! matters as much as the hit:
//!
//! - names are kept once, in insertion order; the hash index and the last-hit slot hold
//!   positions into that list, so remembering the last hit is one store, not a copy;
//! - names of up to 22 bytes are kept inside their entry, so a lookup reads the entry's
//!   line and not also a separate allocation holding the name;
//! - names are compared inline: equal lengths, then the first and last eight bytes (which
//!   cover names of 8 to 16 bytes whole), with `memcmp` only for longer or shorter names;
//! - the index is hashed with [`FoldHash`] over the name's bytes alone.
//!
//! Only names the shared topic table gave an id are inserted, so the cache holds at most
//! `input.max_topics` + 1 names (see `InputCtx::topic_uncached`).

use std::hash::Hasher;

use hashbrown::HashTable;

use crate::fasthash::FoldHash;
use crate::pipeline::TopicId;

#[derive(Debug, Clone)]
struct Entry {
    name: Name,
    id: TopicId,
    spooled: bool,
}

/// Longest name kept inside its entry.
const INLINE_MAX: usize = 22;

/// A cached name: inside the entry when it is short (most topic names), so that checking
/// a candidate reads one cache line, the entry's, instead of following a pointer to the
/// name's bytes elsewhere on the heap (at 10,000 topics neither is still in cache when a
/// topic comes round again). An entry is then 32 bytes either way.
#[derive(Debug, Clone)]
enum Name {
    Inline { len: u8, bytes: [u8; INLINE_MAX] },
    Boxed(Box<[u8]>),
}

impl Name {
    fn new(name: &[u8]) -> Name {
        match u8::try_from(name.len()) {
            Ok(len) if name.len() <= INLINE_MAX => {
                let mut bytes = [0u8; INLINE_MAX];
                bytes[..name.len()].copy_from_slice(name);
                Name::Inline { len, bytes }
            }
            _ => Name::Boxed(name.into()),
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            // `len <= INLINE_MAX` by construction; `get` keeps a bad one from panicking.
            Name::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or(bytes),
            Name::Boxed(b) => b,
        }
    }
}

/// See the module documentation.
#[derive(Debug, Default, Clone)]
pub struct TopicCache {
    entries: Vec<Entry>,
    /// Positions in `entries`, found by the name's hash.
    index: HashTable<u32>,
    /// Position of the last name found or inserted.
    last: Option<u32>,
}

/// Whether two topic names are equal; inline for names of 8 to 16 bytes.
#[inline]
fn same_name(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if (8..=16).contains(&n) {
        let word = |s: &[u8], at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&s[at..at + 8]);
            u64::from_ne_bytes(w)
        };
        return word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8);
    }
    a == b
}

#[inline]
fn hash(name: &[u8]) -> u64 {
    let mut h = FoldHash::default();
    h.write(name);
    h.finish()
}

impl TopicCache {
    /// The cached id and spool flag of `name`.
    #[inline]
    pub fn get(&mut self, name: &[u8]) -> Option<(TopicId, bool)> {
        if let Some(e) = self.last.and_then(|i| self.entries.get(i as usize)) {
            if same_name(e.name.as_bytes(), name) {
                return Some((e.id, e.spooled));
            }
        }
        let entries = &self.entries;
        let &i = self.index.find(hash(name), |&i| {
            same_name(entries[i as usize].name.as_bytes(), name)
        })?;
        self.last = Some(i);
        let e = &self.entries[i as usize];
        Some((e.id, e.spooled))
    }

    /// Caches `name` (not already cached: callers `get` first).
    pub fn insert(&mut self, name: &[u8], id: TopicId, spooled: bool) {
        let Ok(i) = u32::try_from(self.entries.len()) else {
            // More than 4 billion names: cannot happen under `input.max_topics`.
            self.clear();
            return self.insert(name, id, spooled);
        };
        self.entries.push(Entry {
            name: Name::new(name),
            id,
            spooled,
        });
        let entries = &self.entries;
        self.index.insert_unique(hash(name), i, |&j| {
            hash(entries[j as usize].name.as_bytes())
        });
        self.last = Some(i);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.index.clear();
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn same_name_compares_every_byte_at_every_length() {
        for n in 0..40usize {
            let a: Vec<u8> = (0..n as u8).map(|b| b.wrapping_mul(7) ^ 0x5a).collect();
            assert!(same_name(&a, &a.clone()), "len {n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 1;
                assert!(!same_name(&a, &b), "len {n}, byte {at}");
            }
            let mut longer = a.clone();
            longer.push(0);
            assert!(!same_name(&a, &longer), "len {n} against {}", n + 1);
        }
    }

    #[test]
    fn names_short_and_long_are_kept_whole() {
        assert!(std::mem::size_of::<Entry>() <= 32);
        for n in [0, 1, 8, 21, 22, 23, 40, 300] {
            let name: Vec<u8> = (0..n).map(|b| (b as u8).wrapping_mul(31) ^ 0xa5).collect();
            let kept = Name::new(&name);
            assert_eq!(kept.as_bytes(), &name[..], "len {n}");
            assert_eq!(
                matches!(kept, Name::Inline { .. }),
                n <= INLINE_MAX,
                "len {n}"
            );
        }
        let mut c = TopicCache::default();
        c.insert(&[7u8; 22], 1, false);
        c.insert(&[7u8; 23], 2, true);
        c.insert(&[7u8; 21], 3, false);
        assert_eq!(c.get(&[7u8; 22]), Some((1, false)));
        assert_eq!(c.get(&[7u8; 23]), Some((2, true)));
        assert_eq!(c.get(&[7u8; 21]), Some((3, false)));
        assert_eq!(c.get(&[7u8; 20]), None);
    }

    #[test]
    fn finds_the_last_name_and_any_other_alike() {
        let mut c = TopicCache::default();
        c.insert(b"topic-alpha", 1, false);
        c.insert(b"topic-beta", 2, true);
        assert_eq!(c.get(b"topic-alpha"), Some((1, false)));
        assert_eq!(c.get(b"topic-alpha"), Some((1, false)));
        assert_eq!(c.get(b"topic-beta"), Some((2, true)));
        assert_eq!(c.get(b"topic-alph"), None);
        assert_eq!(c.get(b"topic-alphaa"), None);
        // A miss leaves the last hit as it was.
        assert_eq!(c.get(b"topic-beta"), Some((2, true)));
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.get(b"topic-beta"), None);
    }

    proptest! {
        /// Against a `HashMap`: any sequence of inserts (of names not cached yet) and
        /// lookups. Names are a short tail over a small alphabet, half of them after a
        /// common 6-byte prefix, so that many share their first or last eight bytes and
        /// their length.
        #[test]
        fn agrees_with_a_hash_map(
            ops in proptest::collection::vec(
                (any::<bool>(), any::<bool>(), proptest::collection::vec(0u8..3, 0..30)),
                1..300,
            ),
        ) {
            let mut c = TopicCache::default();
            let mut m: HashMap<Vec<u8>, (TopicId, bool)> = HashMap::new();
            for (n, (insert, prefixed, tail)) in ops.into_iter().enumerate() {
                let name = if prefixed { [b"topic-".as_slice(), &tail].concat() } else { tail };
                let want = m.get(&name).copied();
                prop_assert_eq!(c.get(&name), want, "{:?}", name);
                if insert && want.is_none() {
                    let v = (n as TopicId, n % 2 == 0);
                    c.insert(&name, v.0, v.1);
                    m.insert(name.clone(), v);
                    prop_assert_eq!(c.get(&name), Some(v));
                }
                prop_assert_eq!(c.len(), m.len());
            }
        }
    }
}
