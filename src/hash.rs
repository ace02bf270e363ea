//! A small, fast, deterministic 64-bit hash. Deterministic across VMs and restarts, so block
//! hashes computed on one worker mean the same thing on another.

const K0: u64 = 0xa076_1d64_78bd_642f;
const K1: u64 = 0xe703_7ed1_a0b4_28db;
const K2: u64 = 0x8ebc_6af0_9c88_c6e3;

fn mix(a: u64, b: u64) -> u64 {
    let product = u128::from(a).wrapping_mul(u128::from(b));
    (product as u64) ^ ((product >> 64) as u64)
}

/// Hashes `bytes` chained onto `seed`.
pub fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut state = seed ^ K0 ^ (bytes.len() as u64).wrapping_mul(K1);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut buffer = [0u8; 8];
        buffer.copy_from_slice(word);
        state = mix(state ^ u64::from_le_bytes(buffer), K1);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut buffer = [0u8; 8];
        for (slot, byte) in buffer.iter_mut().zip(tail) {
            *slot = *byte;
        }
        state = mix(state ^ u64::from_le_bytes(buffer), K2);
    }
    mix(state, K0 ^ K2)
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
}
