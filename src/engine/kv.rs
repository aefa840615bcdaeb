//! The paged KV cache's block manager and prefix cache.
//!
//! One [`KvPool`] of fixed-size blocks (sized by `engine.kv_cache_bytes`) serves every
//! sequence through its block table. A block is in one of three states:
//! - **used**: referenced by at least one sequence (a shared prefix block by several);
//! - **cached**: unreferenced but keyed by its prefix hash, kept for later requests and
//!   evicted least-recently-used first when blocks run out;
//! - **free**: no content worth keeping.
//!
//! Prefix caching: a full block is keyed by the hash chain of the token ids of every block up
//! to and including it (`hash(parent_key, tokens)`), so a key names the whole prefix, not
//! only the block's own tokens. A new request reuses the blocks of the longest cached prefix
//! of its prompt; it never writes into them (only full blocks are shared, and at least the
//! prompt's last token is always computed, since its logits give the first token). The K and
//! V of a position depend only on the tokens up to it and the CPU backend computes them the
//! same whatever the batch or chunking (tests/batching.rs), so a hit gives the same logits as
//! a miss, bit for bit (tests/paged_kv.rs).
//!
//! Sliding-window models (Gemma 3, gpt-oss) get a windowed pool: the full-attention layers
//! keep the block table above, the sliding-window layers one fixed ring of blocks per running
//! sequence (`KvPool::ring_blocks`: a window plus a chunk), taken on allocation and given back
//! on release, so their KV stays about a window long whatever the context. Prefix caching is
//! off for such pools: a cached prefix would need its last window of local-layer KV, which
//! the ring has overwritten, and recomputing it means recomputing the whole prefix.

use crate::backend::Backend;
use crate::model::{KvCache, KvPool};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Positions per KV block. 16, as vLLM's default: small enough that a partly filled last
/// block wastes little, large enough that block tables stay short.
pub const KV_BLOCK_TOKENS: usize = 16;

/// The identity of a cached block: the key of the prefix before it and its own tokens
/// (kept to rule out hash collisions).
struct BlockKey {
    hash: u64,
    parent: u64,
    tokens: Vec<u32>,
}

/// Block counts by state (`civetta_kv_cache_blocks{state}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounts {
    pub used: usize,
    pub cached: usize,
    pub free: usize,
}

/// The blocks a new sequence got: its cache, and how many prompt tokens came from the
/// prefix cache.
pub struct Allocation<B: Backend> {
    pub cache: KvCache<B>,
    pub cached_tokens: usize,
}

pub struct BlockManager<B: Backend> {
    pool: KvPool<B>,
    refs: Vec<u32>,
    keys: Vec<Option<BlockKey>>,
    free: Vec<u32>,
    /// Prefix key -> block.
    by_hash: HashMap<u64, u32>,
    /// Unreferenced keyed blocks by last use (a tick), oldest first; `last_use[b]` finds a
    /// block's entry.
    lru: BTreeMap<u64, u32>,
    last_use: Vec<u64>,
    tick: u64,
    /// Local rings not held by a sequence (windowed pools; one per active sequence).
    free_rings: Vec<u32>,
}

/// The key of the prefix `parent` followed by `tokens`.
fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // DefaultHasher::new() has fixed keys: the same prefix gets the same key in every run.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The key the empty prefix has (the parent of a prompt's first block).
const ROOT: u64 = 0x6369_7665_7474_6121;

impl<B: Backend> BlockManager<B> {
    pub fn new(pool: KvPool<B>) -> BlockManager<B> {
        let n = pool.n_blocks;
        let rings = if pool.ring_blocks > 0 { pool.rings as u32 } else { 0 };
        BlockManager {
            free_rings: (0..rings).rev().collect(),
            pool,
            refs: vec![0; n],
            keys: (0..n).map(|_| None).collect(),
            // Popped from the back: lower block ids first.
            free: (0..n as u32).rev().collect(),
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            last_use: vec![0; n],
            tick: 0,
        }
    }

    pub fn pool_mut(&mut self) -> &mut KvPool<B> {
        &mut self.pool
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size
    }

    /// Bytes the sequences' blocks and local rings take now (cached blocks not counted).
    pub fn bytes_in_use(&self) -> usize {
        let rings_used = self.pool.rings - self.free_rings.len();
        self.counts().used * self.pool.block_bytes + if self.windowed() { rings_used * self.pool.ring_bytes } else { 0 }
    }

    /// Whether sliding-window layers keep only their window (local rings; no prefix cache).
    pub fn windowed(&self) -> bool {
        self.pool.ring_blocks > 0
    }

    pub fn total_blocks(&self) -> usize {
        self.pool.n_blocks
    }

    /// Blocks a sequence of `tokens` positions needs.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size())
    }

    pub fn counts(&self) -> BlockCounts {
        let (cached, free) = (self.lru.len(), self.free.len());
        BlockCounts { used: self.pool.n_blocks - cached - free, cached, free }
    }

    /// The blocks of the longest cached prefix of `prompt`, leaving at least its last token
    /// to compute.
    fn lookup(&self, prompt: &[u32]) -> Vec<u32> {
        let bs = self.block_size();
        let mut hits = Vec::new();
        if self.windowed() {
            return hits;
        }
        let mut parent = ROOT;
        for chunk in prompt[..prompt.len().saturating_sub(1)].chunks_exact(bs) {
            let hash = chain_hash(parent, chunk);
            let Some(&b) = self.by_hash.get(&hash) else { break };
            match &self.keys[b as usize] {
                Some(k) if k.parent == parent && k.tokens == chunk => hits.push(b),
                _ => break,
            }
            parent = hash;
        }
        hits
    }

    /// Blocks that a new allocation can take now: free ones and unreferenced cached ones.
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks for a sequence of `tokens` that needs `positions` positions now: the cached
    /// prefix's blocks plus fresh ones (evicting cached blocks, oldest first, when none are
    /// free). None when the pool cannot give them while keeping `headroom` blocks available
    /// for the running sequences to grow into (the request waits).
    pub fn allocate(&mut self, tokens: &[u32], positions: usize, headroom: usize) -> Option<Allocation<B>> {
        let hits = self.lookup(tokens);
        let need = self.blocks_for(positions).saturating_sub(hits.len());
        // Hit blocks that sit unreferenced in the LRU are not available to this request's
        // fresh blocks: it is about to reference them.
        let hits_in_lru = hits.iter().filter(|&&b| self.refs[b as usize] == 0).count();
        if self.available() - hits_in_lru < need + headroom || (self.windowed() && self.free_rings.is_empty()) {
            return None;
        }
        for &b in &hits {
            self.retain(b);
        }
        let mut blocks = hits.clone();
        for _ in 0..need {
            let b = self.take_block().expect("availability checked above");
            self.refs[b as usize] = 1;
            blocks.push(b);
        }
        let cached_tokens = hits.len() * self.block_size();
        let mut cache = KvCache::paged(blocks, self.block_size(), cached_tokens);
        if self.windowed() {
            cache = cache.with_ring(self.free_rings.pop().expect("checked above"));
        }
        Some(Allocation { cache, cached_tokens })
    }

    /// Appends one fresh block to a sequence's paged cache (a decoding sequence whose last
    /// block is full). False when no block is free or evictable: the scheduler then preempts.
    pub fn grow(&mut self, cache: &mut KvCache<B>) -> bool {
        let Some(b) = self.take_block() else { return false };
        self.refs[b as usize] = 1;
        cache.push_block(b);
        true
    }

    fn retain(&mut self, b: u32) {
        if self.refs[b as usize] == 0 {
            self.lru.remove(&self.last_use[b as usize]);
        }
        self.refs[b as usize] += 1;
    }

    /// A free block, else the least recently used cached one (its key dropped).
    fn take_block(&mut self) -> Option<u32> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        let (_, b) = self.lru.pop_first()?;
        if let Some(k) = self.keys[b as usize].take() {
            self.by_hash.remove(&k.hash);
        }
        Some(b)
    }

    /// Keys the full blocks of a sequence whose first `tokens.len()` positions are stored in
    /// `blocks`, so later requests can reuse them. Blocks already keyed are skipped; a block
    /// whose prefix another block already holds stays unkeyed (freed on release).
    pub fn register(&mut self, blocks: &[u32], tokens: &[u32]) {
        if self.windowed() {
            return; // never looked up (see the module doc): the blocks are simply freed
        }
        let bs = self.block_size();
        let mut parent = ROOT;
        for (chunk, &b) in tokens.chunks_exact(bs).zip(blocks) {
            let hash = chain_hash(parent, chunk);
            if self.keys[b as usize].is_none() && !self.by_hash.contains_key(&hash) {
                self.keys[b as usize] = Some(BlockKey { hash, parent, tokens: chunk.to_vec() });
                self.by_hash.insert(hash, b);
            }
            parent = hash;
        }
    }

    /// Gives back everything a paged cache holds: its blocks (as `release`) and its ring.
    pub fn release_cache(&mut self, cache: &mut KvCache<B>) {
        self.release(cache.take_blocks());
        if let Some(r) = cache.take_ring() {
            self.free_rings.push(r);
        }
    }

    /// Drops a sequence's references: keyed blocks nobody uses go to the LRU, the rest are
    /// freed.
    pub fn release(&mut self, blocks: Vec<u32>) {
        for b in blocks {
            let r = &mut self.refs[b as usize];
            debug_assert!(*r > 0, "KV block {b} released twice");
            *r -= 1;
            if *r > 0 {
                continue;
            }
            if self.keys[b as usize].is_some() {
                self.tick += 1;
                self.last_use[b as usize] = self.tick;
                self.lru.insert(self.tick, b);
            } else {
                self.free.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    fn manager(n_blocks: usize) -> BlockManager<CpuBackend> {
        BlockManager::new(KvPool::for_tests(n_blocks, 4))
    }

    #[test]
    fn a_shared_prefix_reuses_full_blocks_and_eviction_is_lru() {
        let mut m = manager(6);
        let prompt: Vec<u32> = (0..10).collect();
        let a = m.allocate(&prompt, 12, 0).unwrap();
        assert_eq!((a.cached_tokens, a.cache.blocks().len()), (0, 3));
        m.register(a.cache.blocks(), &prompt);
        // Same 8-token prefix, different tail: two blocks shared.
        let mut other = prompt[..8].to_vec();
        other.extend([99, 98, 97]);
        let b = m.allocate(&other, 11, 0).unwrap();
        assert_eq!(b.cached_tokens, 8);
        assert_eq!(&b.cache.blocks()[..2], &a.cache.blocks()[..2]);
        assert_eq!(m.counts(), BlockCounts { used: 4, cached: 0, free: 2 });
        let (mut a, mut b) = (a.cache, b.cache);
        m.release(a.take_blocks());
        m.release(b.take_blocks());
        // The two keyed prefix blocks stay cached; the unkeyed tails are free.
        assert_eq!(m.counts(), BlockCounts { used: 0, cached: 2, free: 4 });
        // A request needing all 6 blocks evicts the cache.
        let c = m.allocate(&[7; 20], 24, 0).unwrap();
        assert_eq!(c.cached_tokens, 0);
        assert_eq!(m.counts(), BlockCounts { used: 6, cached: 0, free: 0 });
        assert!(m.allocate(&prompt, 12, 0).is_none(), "no block left: the request waits");
        assert!(m.lookup(&prompt).is_empty(), "evicted blocks are no longer found");
    }

    #[test]
    fn a_fully_cached_prompt_still_computes_its_last_token() {
        let mut m = manager(4);
        let prompt: Vec<u32> = (0..8).collect();
        let mut a = m.allocate(&prompt, 8, 0).unwrap().cache;
        m.register(a.blocks(), &prompt);
        m.release(a.take_blocks());
        let b = m.allocate(&prompt, 9, 0).unwrap();
        assert_eq!(b.cached_tokens, 4, "the second block holds the last token: recomputed");
    }

    #[test]
    fn grow_takes_one_block_and_headroom_holds_blocks_back() {
        let mut m = manager(4);
        let prompt: Vec<u32> = (0..4).collect();
        let mut a = m.allocate(&prompt, 4, 0).unwrap().cache;
        assert_eq!((a.blocks().len(), a.capacity), (1, 4));
        // Three blocks available: a one-block request leaving two for growth fits, three does not.
        assert!(m.allocate(&[9; 4], 4, 3).is_none());
        let mut b = m.allocate(&[9; 4], 4, 2).unwrap().cache;
        a.len = 4;
        assert!(m.grow(&mut a));
        assert_eq!((a.blocks().len(), a.capacity, a.len), (2, 8, 4));
        assert!(m.grow(&mut a) && !m.grow(&mut b), "the pool is used up");
        assert_eq!(m.counts(), BlockCounts { used: 4, cached: 0, free: 0 });
        m.release(a.take_blocks());
        m.release(b.take_blocks());
        assert_eq!(m.counts().free, 4);
    }

    #[test]
    fn a_windowed_pool_gives_each_sequence_a_ring_and_caches_no_prefix() {
        let mut m = BlockManager::<CpuBackend>::new(KvPool::for_tests_windowed(8, 4, 2, 3));
        let prompt: Vec<u32> = (0..8).collect();
        let mut a = m.allocate(&prompt, 8, 0).unwrap().cache;
        m.register(a.blocks(), &prompt);
        let mut b = m.allocate(&prompt, 8, 0).unwrap();
        assert_eq!(b.cached_tokens, 0, "no prefix reuse on a windowed pool");
        assert!(m.allocate(&[5; 4], 4, 0).is_none(), "both rings are held: the request waits");
        m.release_cache(&mut a);
        assert_eq!(a.take_ring(), None);
        let mut c = m.allocate(&[5; 4], 4, 0).unwrap().cache;
        m.release_cache(&mut b.cache);
        m.release_cache(&mut c);
        assert_eq!(m.counts(), BlockCounts { used: 0, cached: 0, free: 8 });
        assert_eq!(m.free_rings.len(), 2);
    }
}
