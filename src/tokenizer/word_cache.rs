//! The BPE word cache: ids of recently seen pre-tokenized words, bounded by the bytes it
//! holds (an entry limit alone let a few long words hold hundreds of megabytes).

use std::collections::HashMap;

/// Words longer than this are not cached: real text repeats short words, and merging a
/// long word costs little next to reading it.
pub const MAX_CACHED_WORD_BYTES: usize = 128;
/// The cache is cleared when its entries would hold more than this.
pub const CACHE_BUDGET_BYTES: usize = 8 << 20;
/// Heap and table bytes of an entry besides its text and ids (two boxes, the table slot,
/// allocator headers), so that many tiny entries count too.
const ENTRY_OVERHEAD_BYTES: usize = 64;

#[derive(Default)]
pub struct WordCache {
    entries: HashMap<Box<str>, Box<[u32]>>,
    /// Accounted bytes of `entries`.
    bytes: usize,
}

impl WordCache {
    pub fn get(&self, word: &str) -> Option<&[u32]> {
        self.entries.get(word).map(|ids| &ids[..])
    }

    /// Remembers a word's ids, unless the word is too long to be worth it.
    pub fn insert(&mut self, word: &str, ids: &[u32]) {
        if word.len() > MAX_CACHED_WORD_BYTES || self.entries.contains_key(word) {
            return;
        }
        let cost = entry_bytes(word, ids);
        if self.bytes + cost > CACHE_BUDGET_BYTES {
            // Dropping everything is crude but O(1) per insert on average, and the cache
            // refills with the words that matter within a few requests.
            self.entries = HashMap::new();
            self.bytes = 0;
        }
        self.entries.insert(word.into(), ids.into());
        self.bytes += cost;
    }

    /// Bytes the entries hold (as accounted against the budget).
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

fn entry_bytes(word: &str, ids: &[u32]) -> usize {
    word.len() + std::mem::size_of_val(ids) + ENTRY_OVERHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_words_are_not_cached() {
        let mut c = WordCache::default();
        c.insert(&"x".repeat(MAX_CACHED_WORD_BYTES + 1), &[1, 2, 3]);
        c.insert(&"y".repeat(2_000_000), &vec![7; 500_000]);
        assert_eq!((c.len(), c.bytes()), (0, 0));
        c.insert("word", &[5]);
        assert_eq!(c.get("word"), Some(&[5u32][..]));
    }

    #[test]
    fn bytes_stay_within_the_budget() {
        let mut c = WordCache::default();
        let ids = vec![1u32; 32];
        for i in 0..200_000 {
            let word = format!("{i:0>100}");
            c.insert(&word, &ids);
            assert!(c.bytes() <= CACHE_BUDGET_BYTES, "{} bytes after {i} words", c.bytes());
        }
        assert!(c.len() > 1000, "the cache still caches");
    }
}
