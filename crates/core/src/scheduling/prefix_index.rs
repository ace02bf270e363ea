//! Approximate prefix-cache index: which pod probably holds which prompt blocks.
//!
//! Each pod has an LRU of block hashes bounded by its capacity; a reverse map from hash to the
//! pods holding it answers "how many leading blocks of this prompt does each pod hold".

use crate::limits;
use std::hash::{BuildHasher, Hasher};

/// Keys are block hashes, already uniformly mixed: they need one keyed multiply, not a full
/// hash (the default hasher's 128-bit multiply is a library call in wasm32, twice per block
/// per pick). The key is random per map (std's seed, from the host's randomness in wasm), so
/// a client cannot search offline for prompts whose blocks crowd one bucket.
#[derive(Debug, Clone, Copy)]
struct BlockHashes {
    key: u64,
}

impl Default for BlockHashes {
    fn default() -> Self {
        BlockHashes {
            key: std::collections::hash_map::RandomState::new().hash_one(0u64) | 1,
        }
    }
}

impl BuildHasher for BlockHashes {
    type Hasher = BlockHashHasher;

    fn build_hasher(&self) -> BlockHashHasher {
        BlockHashHasher {
            key: self.key,
            state: 0,
        }
    }
}

#[derive(Debug)]
struct BlockHashHasher {
    key: u64,
    state: u64,
}

impl Hasher for BlockHashHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys reach here (through `write_u64`); anything else is folded in whole.
        self.state = crate::hash::hash_bytes(self.state ^ self.key, bytes);
    }

    fn write_u64(&mut self, value: u64) {
        let mixed = (value ^ self.key).wrapping_mul(0x9e37_79b1_85eb_ca87);
        self.state = mixed ^ (mixed >> 29);
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

impl BlockHashes {
    fn slot(&self, hash: u64, mask: usize) -> usize {
        let mut hasher = self.build_hasher();
        hasher.write_u64(hash);
        // Masked to the table's size, which is a usize.
        (hasher.finish() as usize) & mask
    }
}

/// No entry (the end of a list, an empty table slot).
const NONE: u32 = u32::MAX;

/// One block held by one pod: 24 bytes, plus about 8 of table per distinct block.
#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: u64,
    pod: u32,
    /// The pod's use order, a doubly linked list through the slab.
    older: u32,
    newer: u32,
    /// The next entry of the same block (another pod holding it); the free list's link for
    /// a free entry.
    same_next: u32,
}

#[derive(Debug, Clone, Copy)]
struct PodList {
    capacity: usize,
    len: usize,
    oldest: u32,
    newest: u32,
}

impl PodList {
    fn new(capacity: usize) -> Self {
        PodList {
            capacity,
            len: 0,
            oldest: NONE,
            newest: NONE,
        }
    }
}

/// Every pod's blocks in one slab of fixed-size entries, each pod's in use order (an exact
/// LRU per pod), found through one open-addressing table from block hash to the block's
/// first entry. The slab never holds more than [`limits::PREFIX_INDEX_ENTRIES`]: when the
/// pods' capacities add up to more, each pod holds its share of that budget, so the index's
/// memory is a number the configuration cannot exceed, and once full it stops growing
/// (freed entries are reused).
/// Entries come in chunks of this many (96 KiB).
const CHUNK_BITS: usize = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNK_MASK: usize = CHUNK - 1;

#[derive(Debug, Clone, Default)]
pub struct PrefixIndex {
    /// The slab, in chunks of [`CHUNK`] entries.
    entries: Vec<Vec<Entry>>,
    /// Entries taken from the slab so far (held or free).
    allocated: usize,
    /// Free entries, linked through `same_next`.
    free: u32,
    /// Entry index of each block's first entry; `NONE` for an empty slot. A power of two
    /// long, at most half full.
    table: Vec<u32>,
    blocks: usize,
    pods: Vec<PodList>,
    default_capacity: usize,
    /// The pods' capacities added up (saturating).
    capacity_sum: usize,
    budget: usize,
    hashes: BlockHashes,
    /// Entries held now, and the most ever held at once.
    held: usize,
    peak: usize,
    /// The budget cut the pods' capacities, and the log said so.
    clamp_logged: bool,
}

impl PrefixIndex {
    pub fn new(default_capacity: usize) -> Self {
        PrefixIndex::with_budget(default_capacity, limits::PREFIX_INDEX_ENTRIES)
    }

    /// An index that never holds more than `budget` entries.
    pub fn with_budget(default_capacity: usize, budget: usize) -> Self {
        PrefixIndex {
            free: NONE,
            default_capacity: default_capacity.max(1),
            budget: budget.clamp(1, NONE as usize - 1),
            ..PrefixIndex::default()
        }
    }

    /// Sets one pod's capacity (e.g. from its `num_gpu_blocks`); shrinking evicts at once.
    pub fn set_capacity(&mut self, pod: usize, capacity: usize) {
        self.ensure_pod(pod);
        if let Some(list) = self.pods.get_mut(pod) {
            self.capacity_sum = self
                .capacity_sum
                .saturating_sub(list.capacity)
                .saturating_add(capacity.max(1));
            list.capacity = capacity.max(1);
        }
        self.evict_over_capacity(pod);
        self.size_table();
    }

    /// The pod's capacity as configured (or learned); it holds at most its share of the
    /// budget when that is less (see [`PrefixIndex::held_at_most`]).
    pub fn capacity(&self, pod: usize) -> usize {
        self.pods
            .get(pod)
            .map_or(self.default_capacity, |list| list.capacity)
    }

    /// Blocks held by one pod.
    pub fn len(&self, pod: usize) -> usize {
        self.pods.get(pod).map_or(0, |list| list.len)
    }

    /// The most (block, pod) entries the index held at once.
    pub fn peak_entries(&self) -> usize {
        self.peak
    }

    /// The blocks `pod` may hold: its capacity, or its share of the budget when less.
    fn held_at_most(&self, pod: usize) -> usize {
        let share = self.budget / self.pods.len().max(1);
        self.capacity(pod).min(share.max(1))
    }

    /// The most entries the pods may hold together: their capacities, capped by the budget.
    fn most_entries(&self) -> usize {
        self.capacity_sum.min(self.budget)
    }

    /// Sizes the table for every block the pods may hold, once, when they change: it never
    /// doubles later, while requests are being routed.
    fn size_table(&mut self) {
        let size = (self.most_entries() * 2).next_power_of_two().max(64);
        if size > self.table.len() {
            self.resize_table(size);
        }
    }

    fn ensure_pod(&mut self, pod: usize) {
        if pod < self.pods.len() {
            return;
        }
        let capacity = self.default_capacity;
        let added = pod + 1 - self.pods.len();
        self.capacity_sum = self
            .capacity_sum
            .saturating_add(added.saturating_mul(capacity));
        self.pods.resize(pod + 1, PodList::new(capacity));
        self.size_table();
        let pods = self.pods.len();
        if !self.clamp_logged && capacity.saturating_mul(pods) > self.budget {
            self.clamp_logged = true;
            log::warn!(
                "inference-picker: the prefix index holds at most {} blocks per VM; with {pods} pods each holds at most {} rather than lruCapacityPerServer {capacity}",
                self.budget,
                (self.budget / pods).max(1)
            );
        }
    }

    /// Records that `pod` now holds every block in `hashes` (most recently used).
    pub fn insert(&mut self, pod: usize, hashes: &[u64]) {
        let Ok(pod_id) = u32::try_from(pod) else {
            return;
        };
        if pod_id == NONE {
            return;
        }
        self.ensure_pod(pod);
        for &hash in hashes {
            match self.find(hash, pod_id) {
                Some(entry) => {
                    self.unlink_use(entry);
                    self.link_newest(entry);
                }
                None => self.add(hash, pod_id),
            }
            self.evict_over_capacity(pod);
        }
        self.peak = self.peak.max(self.held);
    }

    fn entry(&self, at: u32) -> Option<&Entry> {
        let at = at as usize;
        self.entries.get(at >> CHUNK_BITS)?.get(at & CHUNK_MASK)
    }

    fn entry_mut(&mut self, at: u32) -> Option<&mut Entry> {
        let at = at as usize;
        self.entries
            .get_mut(at >> CHUNK_BITS)?
            .get_mut(at & CHUNK_MASK)
    }

    /// The table slot of `hash`'s first entry, or the empty slot where it would go.
    fn slot_of(&self, hash: u64) -> (usize, bool) {
        let mask = self.table.len().wrapping_sub(1);
        let mut slot = self.hashes.slot(hash, mask);
        for _ in 0..self.table.len() {
            match self.table.get(slot).copied() {
                Some(NONE) | None => return (slot, false),
                Some(at) if self.entry(at).is_some_and(|e| e.hash == hash) => return (slot, true),
                Some(_) => slot = (slot + 1) & mask,
            }
        }
        (slot, false)
    }

    /// The first entry of `hash`'s block.
    fn first_of(&self, hash: u64) -> u32 {
        if self.table.is_empty() {
            return NONE;
        }
        match self.slot_of(hash) {
            (slot, true) => self.table.get(slot).copied().unwrap_or(NONE),
            _ => NONE,
        }
    }

    /// `pod`'s entry for `hash`.
    fn find(&self, hash: u64, pod: u32) -> Option<u32> {
        self.find_from(self.first_of(hash), pod)
    }

    /// `pod`'s entry in the block whose first entry is `first`.
    fn find_from(&self, first: u32, pod: u32) -> Option<u32> {
        let mut at = first;
        while let Some(entry) = self.entry(at) {
            if entry.pod == pod {
                return Some(at);
            }
            at = entry.same_next;
        }
        None
    }

    fn add(&mut self, hash: u64, pod: u32) {
        let Some(at) = self.allocate(pod) else {
            return;
        };
        if let Some(entry) = self.entry_mut(at) {
            *entry = Entry {
                hash,
                pod,
                older: NONE,
                newer: NONE,
                same_next: NONE,
            };
        }
        self.held += 1;
        self.grow_table_for_one_more();
        let (slot, found) = self.slot_of(hash);
        let first = if found {
            self.table.get(slot).copied().unwrap_or(NONE)
        } else {
            self.blocks += 1;
            NONE
        };
        if let Some(entry) = self.entry_mut(at) {
            entry.same_next = first;
        }
        if let Some(cell) = self.table.get_mut(slot) {
            *cell = at;
        }
        self.link_newest(at);
    }

    /// A free entry for `pod`: a freed one, a new one under the budget, or, at the budget,
    /// the oldest of `pod`'s own (else of the pod holding the most).
    fn allocate(&mut self, pod: u32) -> Option<u32> {
        if self.free != NONE {
            let at = self.free;
            self.free = self.entry(at).map_or(NONE, |e| e.same_next);
            return Some(at);
        }
        if self.allocated < self.budget {
            if self.allocated >> CHUNK_BITS == self.entries.len() {
                // A chunk at a time: growing never copies the slab or doubles it.
                self.entries.push(Vec::with_capacity(CHUNK));
            }
            let at = u32::try_from(self.allocated).ok()?;
            self.entries.last_mut()?.push(Entry {
                hash: 0,
                pod: NONE,
                older: NONE,
                newer: NONE,
                same_next: NONE,
            });
            self.allocated += 1;
            return Some(at);
        }
        let own = self.pods.get(pod as usize).map_or(0, |list| list.len);
        let victim = if own > 0 {
            pod as usize
        } else {
            (0..self.pods.len()).max_by_key(|&p| self.len(p))?
        };
        self.evict_oldest(victim);
        let at = self.free;
        self.free = self.entry(at).map_or(NONE, |e| e.same_next);
        (at != NONE).then_some(at)
    }

    /// Doubles the table before it gets more than three quarters full (only where the pods'
    /// capacities grew past the half-full table [`PrefixIndex::size_table`] sized).
    fn grow_table_for_one_more(&mut self) {
        if (self.blocks + 1) * 4 > self.table.len() * 3 {
            self.resize_table((self.table.len() * 2).max(64));
        }
    }

    /// Re-slots every block into a table of `size` slots.
    fn resize_table(&mut self, size: usize) {
        let old = std::mem::replace(&mut self.table, vec![NONE; size]);
        for first in old.into_iter().filter(|&at| at != NONE) {
            let Some(hash) = self.entry(first).map(|e| e.hash) else {
                continue;
            };
            let (slot, _) = self.slot_of(hash);
            if let Some(cell) = self.table.get_mut(slot) {
                *cell = first;
            }
        }
    }

    fn evict_over_capacity(&mut self, pod: usize) {
        let most = self.held_at_most(pod);
        while self.len(pod) > most {
            if !self.evict_oldest(pod) {
                break;
            }
        }
    }

    /// Drops `pod`'s least recently used entry; false when it holds none.
    fn evict_oldest(&mut self, pod: usize) -> bool {
        let Some(oldest) = self.pods.get(pod).map(|list| list.oldest) else {
            return false;
        };
        let Some(hash) = self.entry(oldest).map(|e| e.hash) else {
            return false;
        };
        self.unlink_use(oldest);
        self.unlink_block(oldest, hash);
        self.held -= 1;
        if let Some(entry) = self.entry_mut(oldest) {
            entry.pod = NONE;
        }
        let free = self.free;
        if let Some(entry) = self.entry_mut(oldest) {
            entry.same_next = free;
        }
        self.free = oldest;
        true
    }

    /// Takes `at` out of its block's list, and the block out of the table when it was the
    /// last.
    fn unlink_block(&mut self, at: u32, hash: u64) {
        let (slot, found) = self.slot_of(hash);
        if !found {
            return;
        }
        let next = self.entry(at).map_or(NONE, |e| e.same_next);
        let first = self.table.get(slot).copied().unwrap_or(NONE);
        if first == at {
            if next == NONE {
                self.remove_slot(slot);
                self.blocks -= 1;
            } else if let Some(cell) = self.table.get_mut(slot) {
                *cell = next;
            }
            return;
        }
        let mut before = first;
        while let Some(entry) = self.entry(before) {
            if entry.same_next == at {
                if let Some(entry) = self.entry_mut(before) {
                    entry.same_next = next;
                }
                return;
            }
            before = entry.same_next;
        }
    }

    /// Empties `slot`, moving back the entries after it that probed past it (linear
    /// probing's deletion, no tombstones).
    fn remove_slot(&mut self, slot: usize) {
        let mask = self.table.len().wrapping_sub(1);
        let mut hole = slot;
        let mut next = slot;
        loop {
            next = (next + 1) & mask;
            let Some(at) = self.table.get(next).copied().filter(|&at| at != NONE) else {
                break;
            };
            let Some(hash) = self.entry(at).map(|e| e.hash) else {
                break;
            };
            let home = self.hashes.slot(hash, mask);
            // The entry may fill the hole unless its home lies cyclically in (hole, next].
            let stays = if hole <= next {
                hole < home && home <= next
            } else {
                hole < home || home <= next
            };
            if !stays {
                if let Some(cell) = self.table.get_mut(hole) {
                    *cell = at;
                }
                hole = next;
            }
        }
        if let Some(cell) = self.table.get_mut(hole) {
            *cell = NONE;
        }
    }

    /// Makes `at` its pod's most recently used entry.
    fn link_newest(&mut self, at: u32) {
        let Some(pod) = self.entry(at).map(|e| e.pod as usize) else {
            return;
        };
        let Some(newest) = self.pods.get(pod).map(|list| list.newest) else {
            return;
        };
        if let Some(entry) = self.entry_mut(at) {
            entry.older = newest;
            entry.newer = NONE;
        }
        if let Some(entry) = self.entry_mut(newest) {
            entry.newer = at;
        }
        if let Some(list) = self.pods.get_mut(pod) {
            if list.oldest == NONE {
                list.oldest = at;
            }
            list.newest = at;
            list.len += 1;
        }
    }

    /// Takes `at` out of its pod's use order.
    fn unlink_use(&mut self, at: u32) {
        let Some(&Entry {
            pod, older, newer, ..
        }) = self.entry(at)
        else {
            return;
        };
        if let Some(entry) = self.entry_mut(older) {
            entry.newer = newer;
        }
        if let Some(entry) = self.entry_mut(newer) {
            entry.older = older;
        }
        if let Some(list) = self.pods.get_mut(pod as usize) {
            if list.oldest == at {
                list.oldest = newer;
            }
            if list.newest == at {
                list.newest = older;
            }
            list.len = list.len.saturating_sub(1);
        }
    }

    /// For each candidate, the number of leading `hashes` it holds. Matching stops at the first
    /// block no candidate holds.
    pub fn match_lengths(&self, hashes: &[u64], candidates: &[usize], matched: &mut [usize]) {
        matched.iter_mut().for_each(|m| *m = 0);
        for (depth, &hash) in hashes.iter().enumerate() {
            let first = self.first_of(hash);
            if first == NONE {
                return;
            }
            let mut extended = false;
            for (slot, &candidate) in matched.iter_mut().zip(candidates) {
                // Only a candidate that held every block so far can extend its match.
                let held = *slot == depth
                    && u32::try_from(candidate)
                        .is_ok_and(|pod| self.find_from(first, pod).is_some());
                if held {
                    *slot += 1;
                    extended = true;
                }
            }
            if !extended {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn longest_prefix_per_candidate() {
        let mut index = PrefixIndex::new(100);
        index.insert(0, &[1, 2, 3]);
        index.insert(1, &[1, 2]);
        index.insert(2, &[2, 3]);
        let mut matched = [0; 3];
        index.match_lengths(&[1, 2, 3, 4], &[0, 1, 2], &mut matched);
        assert_eq!(matched, [3, 2, 0]);
        index.match_lengths(&[9, 1], &[0, 1, 2], &mut matched);
        assert_eq!(matched, [0, 0, 0]);
    }

    #[test]
    fn lru_evicts_oldest_and_forgets_holders() {
        let mut index = PrefixIndex::new(2);
        index.insert(0, &[1, 2]);
        index.insert(0, &[1]);
        index.insert(0, &[3]);
        assert_eq!(index.len(0), 2);
        let mut matched = [0];
        index.match_lengths(&[2], &[0], &mut matched);
        assert_eq!(matched, [0], "block 2 was least recently used");
        index.match_lengths(&[1], &[0], &mut matched);
        assert_eq!(matched, [1]);
        assert_eq!(index.first_of(2), NONE);
        assert_eq!(index.blocks, 2);
    }

    #[test]
    fn memory_stays_bounded_under_repeated_touches() {
        let mut index = PrefixIndex::new(8);
        for round in 0..10_000u64 {
            index.insert(0, &[round % 8]);
            index.insert(0, &[1_000 + round]);
        }
        assert_eq!(index.len(0), 8);
        assert!(index.allocated <= 8 + 1, "{}", index.allocated);
        assert!(index.table.len() <= 64);
    }

    #[test]
    fn a_block_held_by_several_pods_loses_them_one_by_one() {
        let mut index = PrefixIndex::new(1);
        for pod in 0..3 {
            index.insert(pod, &[7]);
        }
        let mut matched = [0; 3];
        index.match_lengths(&[7], &[0, 1, 2], &mut matched);
        assert_eq!(matched, [1, 1, 1]);
        index.insert(1, &[8]);
        index.insert(0, &[8]);
        index.match_lengths(&[7], &[0, 1, 2], &mut matched);
        assert_eq!(matched, [0, 0, 1]);
        assert_eq!(index.find(7, 2), Some(index.first_of(7)));
        index.insert(2, &[9]);
        assert_eq!(index.first_of(7), NONE);
    }

    #[test]
    fn shrinking_capacity_evicts() {
        let mut index = PrefixIndex::new(10);
        index.insert(3, &[1, 2, 3, 4]);
        index.set_capacity(3, 2);
        assert_eq!(index.len(3), 2);
        assert_eq!(index.capacity(3), 2);
        assert_eq!(index.capacity(9), 10);
    }

    /// The same answers as a plain model (a list of blocks per pod in use order), over a
    /// long random run of inserts that evicts and reuses entries and moves table slots.
    #[test]
    fn matches_a_plain_lru_model_through_churn() {
        let mut rng = crate::scheduling::rng::Rng::new(7);
        let (pods, capacity) = (5, 40);
        let mut index = PrefixIndex::new(capacity);
        let mut model: Vec<Vec<u64>> = vec![Vec::new(); pods];
        for _ in 0..20_000 {
            let pod = rng.below(pods);
            let start = rng.below(120) as u64;
            let blocks: Vec<u64> = (start..start + 1 + rng.below(6) as u64).collect();
            index.insert(pod, &blocks);
            let held = &mut model[pod];
            for block in &blocks {
                held.retain(|b| b != block);
                held.push(*block);
            }
            while held.len() > capacity {
                held.remove(0);
            }
        }
        let candidates: Vec<usize> = (0..pods).collect();
        for start in 0..125u64 {
            let prompt: Vec<u64> = (start..start + 8).collect();
            let mut matched = vec![0; pods];
            index.match_lengths(&prompt, &candidates, &mut matched);
            let mut expected = vec![0; pods];
            for (depth, block) in prompt.iter().enumerate() {
                let holders: Vec<usize> = (0..pods)
                    .filter(|&p| expected[p] == depth && model[p].contains(block))
                    .collect();
                if holders.is_empty() {
                    break;
                }
                for p in holders {
                    expected[p] += 1;
                }
            }
            assert_eq!(matched, expected, "prompt from {start}");
        }
        for (pod, held) in model.iter().enumerate() {
            assert_eq!(index.len(pod), held.len());
        }
    }

    #[test]
    fn the_budget_caps_the_pods_whatever_their_capacity_and_memory_stops_growing() {
        let mut index = PrefixIndex::with_budget(1_000, 256);
        // 40 new blocks a pod each round: far more than the budget leaves any of them.
        let fill = |index: &mut PrefixIndex, rounds: std::ops::Range<u64>| {
            for round in rounds {
                for pod in 0..8 {
                    let blocks: Vec<u64> = (0..40)
                        .map(|b| round * 10_000 + pod as u64 * 100 + b)
                        .collect();
                    index.insert(pod, &blocks);
                }
            }
        };
        fill(&mut index, 0..50);
        let held: usize = (0..8).map(|pod| index.len(pod)).sum();
        assert!(held <= 256, "{held}");
        assert!(
            (0..8).all(|pod| index.len(pod) == 32),
            "each pod keeps its share"
        );
        assert_eq!(
            index.capacity(0),
            1_000,
            "the configured capacity is still reported"
        );
        assert_eq!(index.allocated, 256);
        let table = index.table.len();
        fill(&mut index, 50..100);
        assert_eq!(index.allocated, 256);
        assert_eq!(index.table.len(), table, "a full index stops growing");
        assert_eq!(index.peak_entries(), 256);
    }
}
