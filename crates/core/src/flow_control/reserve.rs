//! Room kept for higher bands, sized from what they ask for (`priority-reserve-policy`).
//!
//! Work-conserving dispatch fills every slot the moment it frees, so under overload a
//! high-priority arrival always waits for the next request to finish somewhere in the pool.
//! A fixed ceiling (`priority-holdback-policy`) fixes that by idling a set share of the pool,
//! even when no high-priority request comes. Here each band below the top leaves free the
//! fewest slots that let the bands above it find one free, most of the time, at the rate they
//! arrive: with `rho` higher-band arrivals per dispatch (dispatches match completions while
//! the pool is full), those arrivals take the kept slots and completions free them, so the
//! kept slots are all taken with probability `rho^r / (1 + rho + ... + rho^r)` for `r` slots.
//! `r` is the smallest that brings this to `waitShare` or below, at most `maxShare` of the
//! pool, and none while no higher-band request came within the window.

pub use crate::scheduling::flow_policy::ReserveConfig;

/// Decayed counts of this VM's arrivals per band and of its dispatches (a VM sees its share
/// of the Envoy's traffic: the ratios hold Envoy-wide).
#[derive(Debug, Clone, Default)]
pub struct Demand {
    last_ms: u64,
    dispatched: f64,
    /// `(band, decayed arrivals)`.
    arrivals: Vec<(i32, f64)>,
}

/// Below this many decayed arrivals the bands above are idle: nothing is kept for them.
const ACTIVE_ARRIVALS: f64 = 1.0;

impl Demand {
    fn decay(&mut self, window_ms: u64, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        if elapsed == 0 {
            return;
        }
        self.last_ms = now_ms;
        let factor = (-(elapsed as f64) / window_ms.max(1) as f64).exp();
        self.dispatched *= factor;
        for (_, count) in &mut self.arrivals {
            *count *= factor;
        }
    }

    pub fn arrived(&mut self, band: i32, window_ms: u64, now_ms: u64) {
        self.decay(window_ms, now_ms);
        match self.arrivals.iter_mut().find(|(b, _)| *b == band) {
            Some((_, count)) => *count += 1.0,
            None => self.arrivals.push((band, 1.0)),
        }
    }

    pub fn dispatched(&mut self, window_ms: u64, now_ms: u64) {
        self.decay(window_ms, now_ms);
        self.dispatched += 1.0;
    }

    /// Slots that `band` leaves free for the bands above it, of a pool of `slots`.
    pub fn kept_for_higher(
        &mut self,
        config: &ReserveConfig,
        band: i32,
        slots: f64,
        now_ms: u64,
    ) -> u32 {
        self.decay(config.window_ms, now_ms);
        let higher: f64 = self
            .arrivals
            .iter()
            .filter(|(b, _)| *b > band)
            .map(|(_, count)| count)
            .sum();
        if higher < ACTIVE_ARRIVALS {
            return 0;
        }
        let most = (config.max_share * slots).floor().clamp(0.0, 1e6) as u32;
        let per_dispatch = higher / self.dispatched.max(1.0);
        slots_for(per_dispatch, config.wait_share, most)
    }
}

/// The fewest kept slots (1..=`most`) whose all-taken probability is `wait_share` or less;
/// `most` when none is, 0 when `most` is 0.
fn slots_for(rho: f64, wait_share: f64, most: u32) -> u32 {
    let mut term = 1.0;
    let mut sum = 1.0;
    for r in 1..=most {
        term *= rho;
        sum += term;
        if term / sum <= wait_share {
            return r;
        }
    }
    most
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    const CONFIG: ReserveConfig = ReserveConfig {
        wait_share: 0.1,
        max_share: 0.25,
        window_ms: 2_000,
    };

    #[test]
    fn the_kept_slots_grow_with_the_higher_bands_share() {
        assert_eq!(
            slots_for(0.05, 0.1, 4),
            1,
            "1 in 21 arrivals finds it taken"
        );
        assert_eq!(slots_for(0.3, 0.1, 4), 2, "one slot: 23 %; two: 6.5 %");
        assert_eq!(slots_for(1.0, 0.1, 4), 4, "capped");
        assert_eq!(slots_for(1.0, 0.1, 0), 0);
    }

    /// Steady traffic: `high` of every `per` arrivals in band 10, each arrival dispatched.
    fn steady(demand: &mut Demand, high: usize, per: usize, from_ms: u64, count: usize) -> u64 {
        let mut now = from_ms;
        for n in 0..count {
            now += 10;
            let band = if n % per < high { 10 } else { 0 };
            demand.arrived(band, CONFIG.window_ms, now);
            demand.dispatched(CONFIG.window_ms, now);
        }
        now
    }

    #[test]
    fn a_band_keeps_room_only_while_higher_bands_arrive() {
        let mut demand = Demand::default();
        let now = steady(&mut demand, 3, 10, 0, 1_000);
        assert_eq!(demand.kept_for_higher(&CONFIG, 0, 16.0, now), 2);
        assert_eq!(
            demand.kept_for_higher(&CONFIG, 10, 16.0, now),
            0,
            "the top band keeps nothing"
        );
        assert_eq!(
            demand.kept_for_higher(&CONFIG, 0, 3.0, now),
            0,
            "a quarter of 3 slots is none"
        );
        // The higher band stops: within a few windows nothing is kept.
        let mut later = now;
        for _ in 0..500 {
            later += 20;
            demand.arrived(0, CONFIG.window_ms, later);
            demand.dispatched(CONFIG.window_ms, later);
        }
        assert_eq!(demand.kept_for_higher(&CONFIG, 0, 16.0, later), 0);
    }

    #[test]
    fn a_higher_band_alone_is_kept_room_for_the_lower_ones_are_not() {
        let mut demand = Demand::default();
        let now = steady(&mut demand, 1, 1, 0, 200);
        assert_eq!(
            demand.kept_for_higher(&CONFIG, 0, 16.0, now),
            4,
            "every arrival is high: the cap"
        );
        let quiet = Demand::default();
        assert_eq!(quiet.clone().kept_for_higher(&CONFIG, 0, 16.0, now), 0);
    }
}
