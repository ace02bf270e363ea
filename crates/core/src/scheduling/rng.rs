//! A tiny PRNG (xorshift64*) for tie-breaking and random pickers: wasm has no OS entropy call
//! worth paying for on every request, and picks need not be cryptographic.

#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed | 1 }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0); returns 0 for n == 0.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn below_covers_the_range() {
        let mut rng = Rng::new(42);
        let mut seen = [0u32; 4];
        for _ in 0..4000 {
            seen[rng.below(4)] += 1;
        }
        assert!(seen.iter().all(|&count| count > 800), "{seen:?}");
        assert_eq!(rng.below(0), 0);
    }

    #[test]
    fn unit_is_in_range() {
        let mut rng = Rng::new(7);
        assert!((0..1000)
            .map(|_| rng.unit())
            .all(|x| (0.0..1.0).contains(&x)));
    }
}
