//! A prompt prefix's home pod, the same on every Envoy replica without talking.
//!
//! Each replica learns prefixes only from its own picks, so behind a round-robin balancer a
//! group's requests reach many replicas, and each would place it on its own. What every
//! replica does share is the prompt, the pool's members and the pods' scraped load. A prefix's
//! home is the member that ranks it highest by rendezvous hashing of its leading blocks over
//! the members' addresses. It moves to the next member in that order only when that pays: when
//! the wait it saves (the expected wait behind it less that behind the next) is longer than
//! the cold prefill of the shared prefix at the next (see [`crate::pace`]); for a pod whose
//! pace is not known yet, when it is loaded well beyond the candidates' mean (bounded load).
//! Every replica reads the same pods (each on its own scrape schedule), so it computes the
//! same home and, when that one is busy, nearly always the same next one. A member joining or
//! leaving only moves the prefixes it ranks first.

use crate::endpoint::Pool;
use crate::hash::{hash_bytes, rendezvous_weight};
use crate::metrics::known;

/// Pods a prefix's order names: its home and the next ones it spills to, in order.
pub const HOMES: usize = 4;

/// Where a prefix lives for this pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixHome {
    /// The candidate that ranks the prefix first, whatever its load.
    pub first: Option<usize>,
    /// The prefix's order from where it settles, best first (a pod of unknown pace beyond the
    /// load bound is left out): `homes[0]` is where the prefix goes; what spills from it goes
    /// to the next, so that a hot prefix is cached on a few consistent pods, not scattered.
    pub homes: [Option<usize>; HOMES],
}

impl PrefixHome {
    /// Where the prefix goes.
    pub fn home(&self) -> Option<usize> {
        self.homes[0]
    }

    /// `candidate`'s place in the prefix's order, 0 for its home.
    pub fn rank_of(&self, candidate: usize) -> Option<usize> {
        self.homes.iter().position(|&h| h == Some(candidate))
    }

    /// The home sits behind the first choice because the first choice is loaded.
    pub fn spilled(&self) -> bool {
        self.first != self.home()
    }
}

/// Members' address hashes by pool index, extended as the pool grows (endpoints are only
/// ever appended), so ranking costs no allocation per request.
#[derive(Debug, Default)]
pub struct MemberHashes {
    hashes: Vec<u64>,
}

impl MemberHashes {
    pub fn refresh(&mut self, pool: &Pool) {
        for endpoint in pool.endpoints.iter().skip(self.hashes.len()) {
            self.hashes.push(hash_bytes(0, endpoint.address.as_bytes()));
        }
    }

    /// `candidate`'s place in `key`'s order as a fraction from 0 to 1, the same on every
    /// replica: it breaks ties between pods that score alike, so replicas that raced a prefix
    /// onto two pods all send what follows to the same one. Call [`Self::refresh`] first.
    pub fn order_fraction(&self, key: u64, candidate: usize) -> f64 {
        self.hashes.get(candidate).map_or(0.0, |&member| {
            rendezvous_weight(key, member) as f64 / u64::MAX as f64
        })
    }

    /// The home of `key` among `candidates`: see the module documentation. A pod of unknown
    /// pace is within the bound when its load (running plus waiting, with what was placed
    /// since the scrape) is at most `rule.load_factor` times the candidates' mean plus one
    /// request, so an idle pool never spills and a busy one keeps each pod within a share of
    /// the mean.
    pub fn home(
        &mut self,
        pool: &Pool,
        key: u64,
        candidates: &[usize],
        rule: SpillRule,
    ) -> PrefixHome {
        self.refresh(pool);
        let total: f64 = candidates.iter().map(|&c| load(pool, c)).sum();
        let mean = total / candidates.len().max(1) as f64;
        let bound = rule.load_factor * mean + 1.0;
        let within_bound = |c: usize| paced(pool, c) || load(pool, c) <= bound;
        let mut ranked = Ranked::default();
        let mut first: Option<(usize, u64)> = None;
        for &candidate in candidates {
            let Some(&member) = self.hashes.get(candidate) else {
                continue;
            };
            let weight = rendezvous_weight(key, member);
            if first.is_none_or(|(_, w)| weight > w) {
                first = Some((candidate, weight));
            }
            if within_bound(candidate) {
                ranked.offer(candidate, weight);
            }
        }
        let mut homes = ranked.top.map(|slot| slot.map(|(c, _)| c));
        let mut start = 0;
        while let (Some(Some(here)), Some(Some(next))) = (homes.get(start), homes.get(start + 1)) {
            if !spill_pays(pool, *here, *next, rule, bound) {
                break;
            }
            start += 1;
        }
        homes.rotate_left(start);
        for slot in homes.iter_mut().rev().take(start) {
            *slot = None;
        }
        PrefixHome {
            first: first.map(|(c, _)| c),
            homes,
        }
    }
}

/// What decides whether a prefix leaves its home for the next pod in its order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpillRule {
    /// For pods of unknown pace: the bound on load, in multiples of the candidates' mean.
    pub load_factor: f64,
    /// Prompt tokens the home is expected to hold, which the next pod would prefill cold.
    pub shared_tokens: f64,
}

/// Running plus waiting at `c`, as the pool sees it now.
fn load(pool: &Pool, c: usize) -> f64 {
    pool.running(c).unwrap_or(0.0) + pool.waiting(c).unwrap_or(0.0)
}

/// The pod's pace is known: both its service time and its prefill speed.
fn paced(pool: &Pool, c: usize) -> bool {
    pool.get(c).is_some_and(|e| {
        known(e.pace.service_s).is_some() && known(e.pace.prefill_s_per_token).is_some()
    })
}

/// Seconds a request placed at `c` now would wait for a running slot.
fn wait_s(pool: &Pool, c: usize) -> Option<f64> {
    let endpoint = pool.get(c)?;
    let slots = endpoint
        .running_capacity
        .or_else(|| pool.running(c))
        .unwrap_or(1.0);
    endpoint.pace.wait_s(pool.waiting(c)?, slots)
}

/// Moving from `here` to `next` pays when the wait it saves is longer than the cold prefill
/// it causes there; without both paces (or with a wait too large to compare), when `here` is
/// beyond the load bound.
fn spill_pays(pool: &Pool, here: usize, next: usize, rule: SpillRule, bound: f64) -> bool {
    match spill_costs(pool, here, next, rule) {
        Some((saved, prefill)) => saved > prefill,
        None => load(pool, here) > bound,
    }
}

/// The wait a move from `here` to `next` saves and the cold prefill it costs, in seconds,
/// when both pods' paces are known and the figures are finite.
fn spill_costs(pool: &Pool, here: usize, next: usize, rule: SpillRule) -> Option<(f64, f64)> {
    if !(paced(pool, here) && paced(pool, next)) {
        return None;
    }
    let prefill = pool.get(next)?.pace.prefill_s(rule.shared_tokens)?;
    let saved = wait_s(pool, here)? - wait_s(pool, next)?;
    (saved.is_finite() && prefill.is_finite()).then_some((saved, prefill))
}

/// The [`HOMES`] highest weights offered, with their candidates, highest first.
#[derive(Default)]
struct Ranked {
    top: [Option<(usize, u64)>; HOMES],
}

impl Ranked {
    fn offer(&mut self, candidate: usize, weight: u64) {
        let mut carried = Some((candidate, weight));
        for slot in &mut self.top {
            if slot.is_none_or(|(_, w)| carried.is_some_and(|(_, c)| c > w)) {
                std::mem::swap(slot, &mut carried);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::{EndpointState, Health};
    use crate::harness::test;
    use crate::metrics::EndpointMetrics;
    use std::collections::BTreeMap;

    fn pool(addresses: &[&str], loads: &[f64]) -> Pool {
        Pool::new(
            addresses
                .iter()
                .zip(loads)
                .map(|(address, &running)| {
                    let mut endpoint = EndpointState::new((*address).into(), BTreeMap::new());
                    endpoint.metrics = EndpointMetrics {
                        running_requests: Some(running),
                        waiting_queue: Some(0.0),
                        ..EndpointMetrics::idle()
                    };
                    endpoint.health = Health::Fresh;
                    endpoint
                })
                .collect(),
        )
    }

    const ADDRESSES: [&str; 8] = [
        "10.0.0.1:8000",
        "10.0.0.2:8000",
        "10.0.0.3:8000",
        "10.0.0.4:8000",
        "10.0.0.5:8000",
        "10.0.0.6:8000",
        "10.0.0.7:8000",
        "10.0.0.8:8000",
    ];

    /// A rule with `load_factor` and a shared prefix of 1,000 tokens.
    fn bound(load_factor: f64) -> SpillRule {
        SpillRule {
            load_factor,
            shared_tokens: 1_000.0,
        }
    }

    fn home_address(pool: &Pool, key: u64, factor: f64) -> Option<&str> {
        let candidates: Vec<usize> = (0..pool.len()).collect();
        let home = MemberHashes::default().home(pool, key, &candidates, bound(factor));
        home.home()
            .and_then(|h| pool.get(h))
            .map(|e| e.address.as_str())
    }

    #[test]
    fn every_member_order_gives_the_same_home() {
        let idle = [0.0; 8];
        let forward = pool(&ADDRESSES, &idle);
        let mut reversed_addresses = ADDRESSES;
        reversed_addresses.reverse();
        let reversed = pool(&reversed_addresses, &idle);
        for key in 0..500u64 {
            assert_eq!(
                home_address(&forward, key, 1.25),
                home_address(&reversed, key, 1.25)
            );
        }
    }

    #[test]
    fn a_member_leaving_moves_only_the_prefixes_it_was_home_to() {
        let all = pool(&ADDRESSES, &[0.0; 8]);
        let fewer = pool(&ADDRESSES[1..], &[0.0; 7]);
        let mut moved = 0;
        for key in 0..2_000u64 {
            let before = home_address(&all, key, 1.25);
            let after = home_address(&fewer, key, 1.25);
            if before != Some(ADDRESSES[0]) {
                assert_eq!(before, after, "key {key}");
            } else {
                moved += 1;
            }
        }
        assert!(
            (150..350).contains(&moved),
            "about an eighth moved: {moved}"
        );
    }

    #[test]
    fn a_loaded_home_hands_the_prefix_to_the_same_next_member() {
        let key = 42;
        let idle = pool(&ADDRESSES, &[0.0; 8]);
        let candidates: Vec<usize> = (0..8).collect();
        let mut hashes = MemberHashes::default();
        let calm = hashes.home(&idle, key, &candidates, bound(1.25));
        let (home, second) = (calm.homes[0].unwrap(), calm.homes[1].unwrap());
        assert!(!calm.spilled());
        let mut loads = [2.0; 8];
        loads[home] = 6.0; // beyond 1.25 x the mean (2.5) + 1
        let busy = pool(&ADDRESSES, &loads);
        let spilled = hashes.home(&busy, key, &candidates, bound(1.25));
        assert_eq!(spilled.first, Some(home));
        assert_eq!(spilled.home(), Some(second), "the prefix's own next member");
        assert_eq!(
            spilled.rank_of(home),
            None,
            "beyond the bound, out of the order"
        );
        assert!(spilled.spilled());
        loads[home] = 3.5; // within 1.25 x 2.19 + 1
        let within = hashes.home(&pool(&ADDRESSES, &loads), key, &candidates, bound(1.25));
        assert_eq!(within.home(), Some(home));
    }

    #[test]
    fn a_paced_home_spills_only_when_its_wait_outlasts_the_cold_prefill() {
        let key = 42;
        let candidates: Vec<usize> = (0..8).collect();
        let mut hashes = MemberHashes::default();
        let calm = hashes.home(&pool(&ADDRESSES, &[0.0; 8]), key, &candidates, bound(1.25));
        let (home, second) = (calm.homes[0].unwrap(), calm.homes[1].unwrap());
        // Every pod runs 2 at once, a request holds a slot 1 s, and prefills 1 ms a token.
        let mut busy = pool(&ADDRESSES, &[2.0; 8]);
        for endpoint in &mut busy.endpoints {
            endpoint.running_capacity = Some(2.0);
            endpoint.pace.service_s = Some(1.0);
            endpoint.pace.prefill_s_per_token = Some(0.001);
        }
        let queue_at_home = |pool: &mut Pool, waiting: f64| {
            pool.endpoints[home].metrics.waiting_queue = Some(waiting);
        };
        // Three waiting at the home: 1.5 s behind it, far beyond the load bound.
        queue_at_home(&mut busy, 3.0);
        let long_prefix = SpillRule {
            load_factor: 1.25,
            shared_tokens: 2_000.0,
        };
        let kept = hashes.home(&busy, key, &candidates, long_prefix);
        assert_eq!(kept.home(), Some(home), "a 2 s cold prefill costs more");
        let spilled = hashes.home(&busy, key, &candidates, bound(1.25));
        assert_eq!(
            spilled.home(),
            Some(second),
            "a 1 s cold prefill costs less"
        );
        assert_eq!(spilled.homes[HOMES - 1], None, "the order moved up by one");
        queue_at_home(&mut busy, 1.0);
        let short_queue = hashes.home(&busy, key, &candidates, bound(1.25));
        assert_eq!(
            short_queue.home(),
            Some(home),
            "0.5 s of wait is worth keeping"
        );
    }

    #[test]
    fn only_candidates_are_ranked() {
        let idle = pool(&ADDRESSES, &[0.0; 8]);
        let mut hashes = MemberHashes::default();
        let all: Vec<usize> = (0..8).collect();
        let order = hashes.home(&idle, 7, &all, bound(1.25));
        let home = order.home().unwrap();
        let others: Vec<usize> = (0..8).filter(|&c| c != home).collect();
        let elsewhere = hashes.home(&idle, 7, &others, bound(1.25));
        assert_eq!(
            elsewhere.homes[..3],
            order.homes[1..],
            "the same order, less one"
        );
        assert_eq!(
            hashes.home(&idle, 7, &[], bound(1.25)),
            PrefixHome::default()
        );
    }
}
