//! The KV cache as vLLM's block manager keeps it, with automatic prefix caching.
//!
//! - The cache is `--kv-blocks` blocks of `--block-size` tokens. In the slot engine a running
//!   request holds the blocks for its prompt and its `max_tokens` from admission; the batching
//!   engine (`batching.rs`) takes the prompt's blocks at admission and one more block each
//!   time a decoding sequence fills its last, as vLLM does, and preempts when none is left.
//! - Each full block of a prompt has a hash chained from the first block: `hash(parent hash,
//!   the block's token ids, extra key)`, the extra key being the LoRA adapter, so one adapter's
//!   blocks never serve another. Only full blocks are hashed; a request's last partial block is
//!   never shared.
//! - A prompt reuses the longest run of leading blocks whose hashes are cached (never its very
//!   last token: at least one token is always computed, as in vLLM).
//! - Freed blocks keep their hash and go to the tail of a free queue, a request's tail blocks
//!   first; a new block is a never-used one while there are any, else the queue's head, i.e.
//!   the least recently freed block, which leaves the prefix cache then (eviction). Blocks
//!   still held by running requests are shared and never evicted.
//! - Usage (`vllm:kv_cache_usage_perc`) = blocks not in the free queue / all blocks.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Block hashes are already mixed: the map uses them as they are.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type BlockMap = HashMap<u64, u32, BuildHasherDefault<PassThrough>>;

/// The parent hash of a prompt's first block.
const ROOT_HASH: u64 = 0x9e37_79b9_7f4a_7c15;
const NONE: u32 = u32::MAX;

/// Chained hashes of the full blocks of `tokens` (`extra`: the LoRA adapter, if any).
pub fn block_hashes(tokens: &[u32], block_size: usize, extra: Option<&str>) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut parent = ROOT_HASH;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            parent = hash_block(parent, block, extra);
            parent
        })
        .collect()
}

/// A multiply-rotate hash (FxHash's step) over the parent hash, the token ids and the extra
/// key, then a final mix.
fn hash_block(parent: u64, tokens: &[u32], extra: Option<&str>) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(K);
    let mut hash = step(0, parent);
    for &token in tokens {
        hash = step(hash, u64::from(token));
    }
    if let Some(extra) = extra {
        hash = step(hash, u64::MAX);
        for &byte in extra.as_bytes() {
            hash = step(hash, u64::from(byte));
        }
    }
    // splitmix64 finaliser.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[derive(Debug, Clone, Copy)]
struct Block {
    /// Set while the block is in the prefix cache.
    hash: Option<u64>,
    /// Running requests holding it.
    refs: u32,
    prev: u32,
    next: u32,
    queued: bool,
}

/// What one admitted request holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    pub blocks: Vec<u32>,
    /// Prompt tokens served from the prefix cache.
    pub hit_tokens: usize,
}

#[derive(Debug)]
pub struct KvCache {
    block_size: usize,
    num_blocks: usize,
    /// The blocks used so far. Blocks never used sit, in vLLM's free queue, ahead of every
    /// freed one, so they are handed out first; they are only materialised then (a process
    /// with a thousand pods stays small).
    blocks: Vec<Block>,
    /// The free queue of used blocks: a doubly linked list through `blocks`, least recently
    /// freed at `head`.
    head: u32,
    tail: u32,
    /// Blocks in that queue.
    queued: usize,
    cached: BlockMap,
    pub evictions: u64,
}

impl KvCache {
    pub fn new(num_blocks: usize, block_size: usize) -> KvCache {
        KvCache {
            block_size: block_size.max(1),
            num_blocks: num_blocks.clamp(1, NONE as usize - 1),
            blocks: Vec::new(),
            head: NONE,
            tail: NONE,
            queued: 0,
            cached: BlockMap::default(),
            evictions: 0,
        }
    }

    /// Blocks not held by any running request.
    fn free(&self) -> usize {
        self.num_blocks - self.blocks.len() + self.queued
    }

    /// The next block to hand out: a never-used one, else the least recently freed.
    fn take_free_block(&mut self) -> u32 {
        if self.blocks.len() < self.num_blocks {
            self.blocks.push(Block {
                hash: None,
                refs: 0,
                prev: NONE,
                next: NONE,
                queued: false,
            });
            return (self.blocks.len() - 1) as u32;
        }
        let id = self.head;
        self.unlink(id);
        id
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks held by running requests.
    pub fn used_blocks(&self) -> usize {
        self.num_blocks - self.free()
    }

    /// Blocks whose contents the prefix cache can serve (held or free).
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    pub fn usage(&self) -> f64 {
        self.used_blocks() as f64 / self.num_blocks as f64
    }

    /// Blocks for `tokens` tokens; a request larger than the whole cache (vLLM would refuse
    /// it) takes every block.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size).clamp(1, self.num_blocks)
    }

    /// Leading blocks of a prompt served from the cache, without touching anything.
    pub fn cached_prefix(&self, hashes: &[u64], prompt_tokens: usize) -> usize {
        let max_blocks = prompt_tokens.saturating_sub(1) / self.block_size;
        hashes
            .iter()
            .take(max_blocks)
            .take_while(|hash| self.cached.contains_key(hash))
            .count()
    }

    /// Whether a request with these prompt hashes and `total_tokens` (prompt + output) can be
    /// admitted now ([`KvCache::allocate`] checks the same).
    #[cfg(test)]
    pub fn can_allocate(&self, hashes: &[u64], prompt_tokens: usize, total_tokens: usize) -> bool {
        let hit = self.cached_prefix(hashes, prompt_tokens);
        self.fits(&hashes[..hit], total_tokens)
    }

    /// Room for the new blocks beside the cached ones (`hit`); cached blocks that sit in the
    /// free queue are taken out of it, so they do not count as room.
    fn fits(&self, hit: &[u64], total_tokens: usize) -> bool {
        let reused_from_free = hit
            .iter()
            .filter(|hash| self.blocks[self.cached[*hash] as usize].refs == 0)
            .count();
        let new = self.blocks_for(total_tokens).saturating_sub(hit.len());
        new <= self.free() - reused_from_free
    }

    /// Admits a request: reuses its cached prefix, takes new blocks from the head of the free
    /// queue (evicting what they cached), and caches its full prompt blocks. `None` when there
    /// is not room (see [`KvCache::can_allocate`]).
    pub fn allocate(
        &mut self,
        hashes: &[u64],
        prompt_tokens: usize,
        total_tokens: usize,
    ) -> Option<Allocation> {
        let hit = self.cached_prefix(hashes, prompt_tokens);
        if !self.fits(&hashes[..hit], total_tokens) {
            return None;
        }
        let total = self.blocks_for(total_tokens).max(hit);
        let mut blocks = Vec::with_capacity(total);
        for hash in &hashes[..hit] {
            let id = self.cached[hash];
            if self.blocks[id as usize].refs == 0 {
                self.unlink(id);
            }
            self.blocks[id as usize].refs += 1;
            blocks.push(id);
        }
        for index in hit..total {
            let id = self.take_block_to_hold();
            // A full prompt block joins the prefix cache, unless another block (computed at
            // the same time by another request) already holds that content.
            if let Some(&hash) = hashes.get(index) {
                if let std::collections::hash_map::Entry::Vacant(entry) = self.cached.entry(hash) {
                    entry.insert(id);
                    self.blocks[id as usize].hash = Some(hash);
                }
            }
            blocks.push(id);
        }
        Some(Allocation {
            blocks,
            hit_tokens: hit * self.block_size,
        })
    }

    /// One more block for a running sequence's next tokens (the batching engine grows a
    /// sequence block by block as it decodes, as vLLM does); false when none is free.
    pub fn grow(&mut self, blocks: &mut Vec<u32>) -> bool {
        if self.free() == 0 {
            return false;
        }
        blocks.push(self.take_block_to_hold());
        true
    }

    /// The next free block, held once: whatever it cached leaves the prefix cache (eviction).
    fn take_block_to_hold(&mut self) -> u32 {
        let id = self.take_free_block();
        let block = &mut self.blocks[id as usize];
        if let Some(old) = block.hash.take() {
            self.cached.remove(&old);
            self.evictions += 1;
        }
        block.refs = 1;
        id
    }

    /// A request finished: its blocks are released, tail first, and the ones nobody holds go
    /// to the free queue, keeping their cached contents until evicted.
    pub fn release(&mut self, blocks: &[u32]) {
        for &id in blocks.iter().rev() {
            let block = &mut self.blocks[id as usize];
            block.refs = block.refs.saturating_sub(1);
            if block.refs == 0 && !block.queued {
                self.push_free(id);
            }
        }
    }

    fn push_free(&mut self, id: u32) {
        let tail = self.tail;
        let block = &mut self.blocks[id as usize];
        block.prev = tail;
        block.next = NONE;
        block.queued = true;
        if tail == NONE {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.queued += 1;
    }

    fn unlink(&mut self, id: u32) {
        let Block {
            prev, next, queued, ..
        } = self.blocks[id as usize];
        if !queued {
            return;
        }
        if prev == NONE {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let block = &mut self.blocks[id as usize];
        block.queued = false;
        block.prev = NONE;
        block.next = NONE;
        self.queued -= 1;
    }

    /// The free queue from head (next evicted) to tail, for tests.
    #[cfg(test)]
    fn free_queue(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut id = self.head;
        while id != NONE {
            out.push(id);
            id = self.blocks[id as usize].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32, salt: u32) -> Vec<u32> {
        (0..n).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn hashes_chain_from_the_first_block_over_full_blocks_only() {
        let a = tokens(40, 0);
        let hashes = block_hashes(&a, 16, None);
        assert_eq!(hashes.len(), 2, "the partial third block is not hashed");
        // The same second block after a different first block hashes differently.
        let mut b = a.clone();
        b[0] += 1;
        let other = block_hashes(&b, 16, None);
        assert_ne!(hashes[0], other[0]);
        assert_ne!(hashes[1], other[1]);
        // A shared prefix gives shared leading hashes; the extra key (LoRA) separates them.
        let mut c = a.clone();
        c[20] += 1;
        let third = block_hashes(&c, 16, None);
        assert_eq!(hashes[0], third[0]);
        assert_ne!(hashes[1], third[1]);
        assert_ne!(block_hashes(&a, 16, Some("sql-lora"))[0], hashes[0]);
        assert_eq!(block_hashes(&a, 16, None), hashes);
        assert_eq!(hash_block(ROOT_HASH, &a[..16], None), hashes[0]);
        assert_eq!(hash_block(hashes[0], &a[16..32], None), hashes[1]);
    }

    #[test]
    fn prefix_hits_count_whole_blocks_and_leave_the_last_token() {
        let mut cache = KvCache::new(64, 16);
        let prompt = tokens(40, 0);
        let hashes = block_hashes(&prompt, 16, None);
        let first = cache.allocate(&hashes, 40, 44).unwrap();
        assert_eq!((first.hit_tokens, first.blocks.len()), (0, 3));
        assert_eq!(cache.cached_blocks(), 2);
        // While the first runs, an identical prompt shares its two full blocks.
        let second = cache.allocate(&hashes, 40, 44).unwrap();
        assert_eq!(second.hit_tokens, 32);
        assert_eq!(second.blocks[..2], first.blocks[..2]);
        assert_eq!(cache.used_blocks(), 4);
        // A prompt of exactly two blocks reuses only one: its last token is computed.
        let exact = &prompt[..32];
        let hit = cache.cached_prefix(&block_hashes(exact, 16, None), 32);
        assert_eq!(hit, 1);
        cache.release(&first.blocks);
        cache.release(&second.blocks);
        assert_eq!(cache.used_blocks(), 0);
        assert_eq!(cache.usage(), 0.0);
        // Freed blocks stay cached.
        let again = cache.allocate(&hashes, 40, 41).unwrap();
        assert_eq!(again.hit_tokens, 32);
    }

    #[test]
    fn the_least_recently_freed_block_is_evicted_first() {
        // Six blocks of 4 tokens; prompts of 9 tokens and 3 out: 2 full blocks + 1 partial each.
        let mut cache = KvCache::new(6, 4);
        let (a, b) = (tokens(9, 1), tokens(9, 2));
        let (ha, hb) = (block_hashes(&a, 4, None), block_hashes(&b, 4, None));
        let alloc_a = cache.allocate(&ha, 9, 12).unwrap();
        let alloc_b = cache.allocate(&hb, 9, 12).unwrap();
        assert!(!cache.can_allocate(&[], 1, 1), "every block is held");
        assert_eq!(cache.cached_blocks(), 4);
        cache.release(&alloc_a.blocks);
        cache.release(&alloc_b.blocks);
        // Each request's blocks are queued tail first; A was freed first.
        let (a_blocks, b_blocks) = (&alloc_a.blocks, &alloc_b.blocks);
        assert_eq!(
            cache.free_queue(),
            [
                a_blocks[2],
                a_blocks[1],
                a_blocks[0],
                b_blocks[2],
                b_blocks[1],
                b_blocks[0]
            ]
        );
        // A new block takes A's partial block (nothing cached there), the next one evicts A's
        // second block; A's first block still hits.
        assert_eq!(cache.allocate(&[], 1, 4).unwrap().blocks, [a_blocks[2]]);
        assert_eq!(cache.evictions, 0);
        assert_eq!(cache.allocate(&[], 1, 4).unwrap().blocks, [a_blocks[1]]);
        assert_eq!(cache.evictions, 1);
        assert_eq!(cache.cached_prefix(&ha, 9), 1);
        assert_eq!(cache.cached_prefix(&hb, 9), 2);
        // Reusing B takes its cached blocks out of the free queue; its one new block evicts
        // A's first block (the least recently freed), not B's partial block behind it.
        let b_again = cache.allocate(&hb, 9, 12).unwrap();
        assert_eq!(b_again.hit_tokens, 8);
        assert_eq!(b_again.blocks, [b_blocks[0], b_blocks[1], a_blocks[0]]);
        assert_eq!(cache.evictions, 2);
        assert_eq!(cache.cached_prefix(&ha, 9), 0);
        assert_eq!(cache.free_queue(), [b_blocks[2]]);
        assert!((cache.usage() - 5.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn admission_counts_cached_free_blocks_it_reuses_as_taken() {
        let mut cache = KvCache::new(4, 4);
        let a = tokens(9, 3);
        let ha = block_hashes(&a, 4, None);
        let first = cache.allocate(&ha, 9, 9).unwrap();
        cache.release(&first.blocks);
        let other = cache.allocate(&[], 1, 4).unwrap();
        // Three free blocks, two of them A's cached ones: reusing them leaves one for new
        // blocks, so A again with 3 tokens out fits (2 hits + 1 new), with 7 out it does not.
        assert!(cache.can_allocate(&ha, 9, 12));
        assert!(!cache.can_allocate(&ha, 9, 16));
        cache.release(&other.blocks);
        // Larger than the whole cache: takes every block once they are free.
        assert_eq!(cache.blocks_for(1_000), 4);
        let huge = cache.allocate(&[], 1, 1_000).unwrap();
        assert_eq!((huge.blocks.len(), cache.usage()), (4, 1.0));
    }
}
