//! A small, fast, deterministic 64-bit hash. Deterministic across VMs and restarts, so block
//! hashes computed on one worker mean the same thing on another.

// 64-bit odd constants with well-spread bits (xxHash's primes).
const P1: u64 = 0x9e37_79b1_85eb_ca87;
const P2: u64 = 0xc2b2_ae3d_27d4_eb4f;
const P3: u64 = 0x1656_67b1_9e37_79f9;

/// Folds one word into the state with 64-bit multiplies only: the filter runs as wasm32,
/// where a 128-bit product is a library call, and prompts are hashed 8 bytes at a time.
fn absorb(state: u64, word: u64) -> u64 {
    (state ^ word.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

/// Spreads every input bit over the whole output.
fn avalanche(mut state: u64) -> u64 {
    state ^= state >> 33;
    state = state.wrapping_mul(P2);
    state ^= state >> 29;
    state = state.wrapping_mul(P3);
    state ^ (state >> 32)
}

/// Hashes `bytes` chained onto `seed`.
pub fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut state = seed ^ P3 ^ (bytes.len() as u64).wrapping_mul(P1);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut buffer = [0u8; 8];
        buffer.copy_from_slice(word);
        state = absorb(state, u64::from_le_bytes(buffer));
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        // Zero-padded; the length in the initial state tells `ab` from `ab\0`.
        let mut buffer = [0u8; 8];
        for (slot, byte) in buffer.iter_mut().zip(tail) {
            *slot = *byte;
        }
        state = absorb(state ^ P3, u64::from_le_bytes(buffer));
    }
    avalanche(state)
}

/// Highest-random-weight (rendezvous) hashing: `member`'s weight for `key`. Every caller that
/// knows the same keys and members ranks the members the same way, with no coordination, and
/// removing a member only moves the keys it ranked first.
pub fn rendezvous_weight(key: u64, member: u64) -> u64 {
    avalanche(key.wrapping_mul(P2) ^ member.rotate_left(29).wrapping_mul(P1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn stable_and_sensitive() {
        assert_eq!(hash_bytes(0, b"hello"), hash_bytes(0, b"hello"));
        assert_ne!(hash_bytes(0, b"hello"), hash_bytes(1, b"hello"));
        assert_ne!(hash_bytes(0, b"hello"), hash_bytes(0, b"hellp"));
        assert_ne!(hash_bytes(0, b"abcdefgh"), hash_bytes(0, b"abcdefgh\0"));
        assert_ne!(hash_bytes(0, b""), hash_bytes(0, b"\0"));
    }

    #[test]
    fn one_flipped_bit_changes_about_half_the_output() {
        let block: Vec<u8> = (0..64u8).map(|i| b'a' + i % 26).collect();
        let base = hash_bytes(7, &block);
        let mut changed_bits = 0;
        for bit in 0..block.len() * 8 {
            let mut flipped = block.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let changed = (hash_bytes(7, &flipped) ^ base).count_ones();
            assert!(
                changed >= 12,
                "bit {bit}: only {changed} output bits changed"
            );
            changed_bits += changed;
        }
        let mean = f64::from(changed_bits) / (block.len() * 8) as f64;
        assert!((28.0..36.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn chained_blocks_of_similar_prompts_do_not_collide() {
        let mut seen = std::collections::HashSet::new();
        for n in 0..20_000u32 {
            let block = format!("user {n:08} asks: what is the capital of France?  ...");
            assert!(seen.insert(hash_bytes(hash_bytes(0, b"model"), block.as_bytes())));
        }
    }

    #[test]
    fn rendezvous_spreads_keys_evenly_over_members() {
        let members: Vec<u64> = (0..8u8).map(|m| hash_bytes(0, &[m])).collect();
        let mut firsts = [0usize; 8];
        for key in 0..80_000u64 {
            let key = hash_bytes(1, &key.to_le_bytes());
            let first = (0..8)
                .max_by_key(|&m| rendezvous_weight(key, members[m]))
                .unwrap();
            firsts[first] += 1;
        }
        for count in firsts {
            assert!((9_400..10_600).contains(&count), "{firsts:?}");
        }
    }
}
