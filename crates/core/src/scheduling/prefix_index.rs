//! Approximate prefix-cache index: which pod probably holds which prompt blocks.
//!
//! Each pod has an LRU of block hashes bounded by its capacity; a reverse map from hash to the
//! pods holding it answers "how many leading blocks of this prompt does each pod hold".

use hashbrown::HashMap;
use std::collections::VecDeque;
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

type BlockMap<V> = HashMap<u64, V, BlockHashes>;

#[derive(Debug, Default, Clone)]
struct PodLru {
    capacity: usize,
    /// hash -> stamp of its latest use.
    stamps: BlockMap<u64>,
    /// Use order, oldest first; entries whose stamp no longer matches are stale and skipped.
    order: VecDeque<(u64, u64)>,
}

/// The pods holding one block. Almost always one: kept inline, so the index costs no heap
/// allocation per block (which, churned by evictions, fragmented the VM's memory).
#[derive(Debug, Clone)]
enum Holders {
    One(u32),
    Many(Vec<u32>),
}

impl Holders {
    fn contains(&self, pod: u32) -> bool {
        match self {
            Holders::One(only) => *only == pod,
            Holders::Many(pods) => pods.contains(&pod),
        }
    }

    fn add(&mut self, pod: u32) {
        match self {
            Holders::One(only) => *self = Holders::Many(vec![*only, pod]),
            Holders::Many(pods) => pods.push(pod),
        }
    }

    /// Removes `pod`; true when no pod is left.
    fn remove(&mut self, pod: u32) -> bool {
        match self {
            Holders::One(only) => *only == pod,
            Holders::Many(pods) => {
                pods.retain(|&p| p != pod);
                let single = match pods.as_slice() {
                    [] => return true,
                    [last] => Some(*last),
                    _ => None,
                };
                if let Some(last) = single {
                    *self = Holders::One(last);
                }
                false
            }
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct PrefixIndex {
    pods: Vec<PodLru>,
    holders: BlockMap<Holders>,
    clock: u64,
    default_capacity: usize,
}

impl PrefixIndex {
    pub fn new(default_capacity: usize) -> Self {
        PrefixIndex {
            default_capacity: default_capacity.max(1),
            ..PrefixIndex::default()
        }
    }

    /// Sets one pod's capacity (e.g. from its `num_gpu_blocks`); shrinking evicts at once.
    pub fn set_capacity(&mut self, pod: usize, capacity: usize) {
        self.ensure_pod(pod);
        if let Some(lru) = self.pods.get_mut(pod) {
            lru.capacity = capacity.max(1);
        }
        self.evict_over_capacity(pod);
    }

    pub fn capacity(&self, pod: usize) -> usize {
        self.pods
            .get(pod)
            .map_or(self.default_capacity, |lru| lru.capacity)
    }

    /// Blocks held by one pod.
    pub fn len(&self, pod: usize) -> usize {
        self.pods.get(pod).map_or(0, |lru| lru.stamps.len())
    }

    fn ensure_pod(&mut self, pod: usize) {
        while self.pods.len() <= pod {
            self.pods.push(PodLru {
                capacity: self.default_capacity,
                ..PodLru::default()
            });
        }
    }

    /// Records that `pod` now holds every block in `hashes` (most recently used).
    pub fn insert(&mut self, pod: usize, hashes: &[u64]) {
        self.ensure_pod(pod);
        let Ok(pod_id) = u32::try_from(pod) else {
            return;
        };
        for &hash in hashes {
            self.clock += 1;
            let Some(lru) = self.pods.get_mut(pod) else {
                return;
            };
            if lru.stamps.insert(hash, self.clock).is_none() {
                self.holders
                    .entry(hash)
                    .and_modify(|holders| holders.add(pod_id))
                    .or_insert(Holders::One(pod_id));
            }
            lru.order.push_back((hash, self.clock));
        }
        self.evict_over_capacity(pod);
        self.compact(pod);
    }

    fn evict_over_capacity(&mut self, pod: usize) {
        let Some(lru) = self.pods.get_mut(pod) else {
            return;
        };
        while lru.stamps.len() > lru.capacity {
            let Some((hash, stamp)) = lru.order.pop_front() else {
                break;
            };
            if lru.stamps.get(&hash) == Some(&stamp) {
                lru.stamps.remove(&hash);
                remove_holder(&mut self.holders, hash, pod);
            }
        }
    }

    /// Drops stale order entries once they outnumber live ones, bounding memory.
    fn compact(&mut self, pod: usize) {
        let Some(lru) = self.pods.get_mut(pod) else {
            return;
        };
        if lru.order.len() > 2 * lru.stamps.len() + 64 {
            let stamps = &lru.stamps;
            lru.order
                .retain(|(hash, stamp)| stamps.get(hash) == Some(stamp));
        }
    }

    /// For each candidate, the number of leading `hashes` it holds. Matching stops at the first
    /// block no candidate holds.
    pub fn match_lengths(&self, hashes: &[u64], candidates: &[usize], matched: &mut [usize]) {
        matched.iter_mut().for_each(|m| *m = 0);
        for (depth, hash) in hashes.iter().enumerate() {
            let Some(holders) = self.holders.get(hash) else {
                return;
            };
            let mut extended = false;
            for (slot, &candidate) in matched.iter_mut().zip(candidates) {
                let held = u32::try_from(candidate).is_ok_and(|pod| holders.contains(pod));
                if *slot == depth && held {
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

fn remove_holder(holders: &mut BlockMap<Holders>, hash: u64, pod: usize) {
    let Ok(pod) = u32::try_from(pod) else {
        return;
    };
    if holders.get_mut(&hash).is_some_and(|pods| pods.remove(pod)) {
        holders.remove(&hash);
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
        assert!(!index.holders.contains_key(&2));
    }

    #[test]
    fn memory_stays_bounded_under_repeated_touches() {
        let mut index = PrefixIndex::new(8);
        for round in 0..10_000u64 {
            index.insert(0, &[round % 8]);
        }
        assert_eq!(index.len(0), 8);
        assert!(index.pods[0].order.len() <= 2 * 8 + 64 + 1);
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
        assert!(matches!(index.holders.get(&7), Some(Holders::One(2))));
        index.insert(2, &[9]);
        assert!(!index.holders.contains_key(&7));
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
}
