//! Replicas that act as one. Each Envoy replica in front of the same pods publishes what it
//! learned (the requests it has in flight per pod, the prefix placements it made, the scrapes
//! of its share of the pods) and, every sync interval, asks each peer for its own through
//! Envoy's callouts. Nothing runs on a request's path and nothing is central: a peer that dies
//! or is cut off just stops counting, and each side routes alone as a single Envoy would.
//!
//! Within one Envoy, the VM that holds the scrape lease speaks for the replica; it hands what
//! peers taught it to the other VMs through the same shared data as their own exchanges
//! (`Coordinator::relay_*`). Any VM answers a peer, from the state the lease holder stored.
//!
//! What a peer sends is hostile input ([`wire::read`]): a bad answer is refused whole and
//! counted; a good one is believed only within bounds: its in-flight counts sit beside this
//! replica's own, its scrapes only count for the pods the rendezvous gives it, and an older
//! reading never replaces a newer one.

pub mod serve;
pub mod wire;

use crate::config::peers::{PeersConfig, PEER_SECRET_HEADER};
use crate::datalayer::describe_status;
use crate::datalayer::discovery_calls::DiscoveryCalls;
use crate::duration::duration_ms;
use crate::endpoint::EndpointState;
use crate::hash::hash_bytes;
use crate::host::{CalloutAnswer, HttpCallouts, SharedData};
use crate::learned::{InFlight, Learned};
use crate::placement_batches::encode_batch;
use crate::router::PoolSlot;
use crate::scheduling::LearnedPrefix;
use crate::shared_state::Coordinator;
use wire::{PeerAnswer, ReplicaState, SharedScrape};

/// Placement batches (about one a tick while requests arrive) this replica keeps for its peers,
/// each under a key of its own, so a peer that joins learns the recent ones from its first
/// answer and a peer that is up to date is served only the new ones.
pub const KEPT_BATCHES: u64 = 256;
/// A peer counts as live for this many sync intervals after its last good answer.
const LIVE_INTERVALS: u64 = 3;

/// Peer-sync counts, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerCounts {
    /// Answers read and merged.
    pub synced: u64,
    /// Calls that failed (no answer, a status other than 200, the host refused to send).
    pub failed: u64,
    /// Answers refused as malformed, oversized or implausible.
    pub refused: u64,
    /// Bytes of answers read.
    pub bytes: u64,
}

#[derive(Debug, Clone)]
struct Peer {
    address: String,
    /// The origin that last answered at this address.
    origin: Option<u64>,
    /// This replica's own address (its answer carried our origin): never called again.
    is_self: bool,
    last_seq: u64,
    /// The newest placement batch read from the origin.
    since: u64,
    live_until_ms: u64,
    /// Its in-flight counts, by this pool's index.
    in_flight: Vec<InFlight>,
    calling: bool,
}

impl Peer {
    fn new(address: String) -> Self {
        Peer {
            address,
            origin: None,
            is_self: false,
            last_seq: 0,
            since: 0,
            live_until_ms: 0,
            in_flight: Vec::new(),
            calling: false,
        }
    }

    fn live(&self, now_ms: u64) -> bool {
        !self.is_self && self.origin.is_some() && now_ms < self.live_until_ms
    }
}

pub struct Peers {
    config: PeersConfig,
    interval_ms: u64,
    /// This replica's id, agreed by its VMs through shared data; 0 until then.
    origin: u64,
    peers: Vec<Peer>,
    /// Calls in flight: token -> peer.
    calls: Vec<(u32, usize)>,
    next_sync_ms: u64,
    seq: u64,
    /// The newest placement batch stored (see [`KEPT_BATCHES`]).
    batch_seq: u64,
    /// Placements peers taught since the last tick, for the other VMs.
    learned: Vec<LearnedPrefix>,
    counts: PeerCounts,
    /// The pods this replica scrapes (by index), as of the last tick.
    share: Vec<bool>,
    /// The live replicas at the last tick, this one included.
    fleet: u32,
    /// `pool.peers.discovery`'s calls: the gateway's own pods.
    discovery: DiscoveryCalls,
}

impl Peers {
    pub fn new(config: PeersConfig) -> Self {
        let interval_ms = duration_ms(config.sync_interval).max(1);
        let peers = config.addresses.iter().cloned().map(Peer::new).collect();
        Peers {
            config,
            interval_ms,
            origin: 0,
            peers,
            calls: Vec::new(),
            next_sync_ms: 0,
            seq: 0,
            batch_seq: 0,
            learned: Vec::new(),
            counts: PeerCounts::default(),
            share: Vec::new(),
            fleet: 0,
            discovery: DiscoveryCalls::default(),
        }
    }

    pub fn config(&self) -> &PeersConfig {
        &self.config
    }

    pub fn counts(&self) -> PeerCounts {
        self.counts
    }

    /// Peers that answered lately.
    pub fn live(&self, now_ms: u64) -> usize {
        self.peers.iter().filter(|p| p.live(now_ms)).count()
    }

    /// This VM took or lost the scrape lease: the replica's id is read again when it next
    /// speaks for the replica (another VM may have stored it).
    pub fn lease_changed(&mut self) {
        self.origin = 0;
    }

    pub fn owns(&self, token: u32) -> bool {
        self.discovery.owns(token) || self.calls.iter().any(|&(t, _)| t == token)
    }

    /// How much of the answer to call `token` is read: a peer's state up to
    /// `maxStateBytes`, all of a discovery answer (as the pool's own discovery reads it).
    pub fn body_cap(&self, token: u32) -> Option<usize> {
        if self.discovery.owns(token) {
            Some(usize::MAX)
        } else {
            self.owns(token).then_some(self.config.max_state_bytes)
        }
    }

    /// The lease holder's tick: agree on the replica's id, store its state for peers to read,
    /// hand the peers' in-flight counts and placements to the other VMs, share the scrapes
    /// out, and call the peers when due. `placements` are this Envoy's since the last tick
    /// (this VM's and the other VMs').
    pub fn on_tick(
        &mut self,
        host: &(impl SharedData + HttpCallouts),
        coordinator: &mut Coordinator,
        slot: &mut PoolSlot,
        placements: &[LearnedPrefix],
        now_ms: u64,
    ) {
        if self.origin == 0 {
            self.origin = coordinator.replica_origin(host, now_ms).unwrap_or(0);
            if self.origin == 0 {
                return;
            }
            // A lease that moved: continue the replica's sequences rather than restart them.
            (self.seq, self.batch_seq) = stored_seqs(host, &coordinator.keys().replica_state());
        }
        self.share_scrapes(slot, now_ms);
        let sync_due = now_ms >= self.next_sync_ms;
        // Alone, the state only waits for a peer to come: once per sync interval will do.
        let alone = self.fleet <= 1;
        let stored = self
            .keep_batch(host, coordinator, placements)
            .and_then(|()| {
                if sync_due || !alone {
                    self.publish(host, coordinator, slot, now_ms)
                } else {
                    Ok(())
                }
            });
        if let Err(error) = stored {
            log::warn!("inference-picker: storing this replica's state for its peers: {error}");
        }
        if let Some(discovery) = &self.config.discovery {
            self.discovery.send_when_due(host, discovery, now_ms);
        }
        if sync_due {
            self.next_sync_ms = now_ms.saturating_add(self.interval_ms);
            self.call_peers(host);
        }
    }

    /// The gateway's pods as discovery lists them: new ones become peers, ones no longer
    /// listed are dropped (the configured addresses stay).
    fn on_discovered(&mut self, answer: &CalloutAnswer) {
        let Some(discovery) = &self.config.discovery else {
            return;
        };
        let Some(found) = self.discovery.on_answer(answer, discovery) else {
            return;
        };
        let listed: Vec<String> = found.into_iter().map(|(address, _)| address).collect();
        let configured = &self.config.addresses;
        let before = self.peers.len();
        self.peers
            .retain(|p| configured.contains(&p.address) || listed.contains(&p.address));
        let removed = before - self.peers.len();
        let mut added = 0;
        for address in listed {
            if self.peers.len() < crate::limits::PEERS.max as usize
                && !self.peers.iter().any(|p| p.address == address)
            {
                self.peers.push(Peer::new(address));
                added += 1;
            }
        }
        // Calls in flight name peers by index: forget them rather than credit the wrong one.
        if removed > 0 {
            self.calls.clear();
            for peer in &mut self.peers {
                peer.calling = false;
            }
        }
        if added + removed > 0 {
            log::info!(
                "inference-picker: peer discovery: {added} added, {removed} removed, {} peers",
                self.peers.len()
            );
        }
    }

    /// Stores this tick's placements as the next batch, over the oldest kept one.
    fn keep_batch(
        &mut self,
        store: &impl SharedData,
        coordinator: &Coordinator,
        placements: &[LearnedPrefix],
    ) -> Result<(), crate::host::HostError> {
        if placements.is_empty() {
            return Ok(());
        }
        self.batch_seq += 1;
        let key = coordinator
            .keys()
            .replica_batch(self.batch_seq % KEPT_BATCHES);
        store
            .set(&key, &encode_batch(self.batch_seq, placements), None)
            .map(|_| ())
    }

    /// Which pods this replica scrapes: each pod goes to the replica the rendezvous over the
    /// live replicas (this one included) picks, so the fleet scrapes each pod once per
    /// interval, and a dead peer's pods come back within [`LIVE_INTERVALS`] sync intervals.
    fn share_scrapes(&mut self, slot: &mut PoolSlot, now_ms: u64) {
        let mut origins: Vec<u64> = self
            .peers
            .iter()
            .filter(|p| p.live(now_ms))
            .filter_map(|p| p.origin)
            .collect();
        origins.push(self.origin);
        origins.sort_unstable();
        origins.dedup();
        let pool = slot.data.pool();
        self.share = pool
            .endpoints
            .iter()
            .map(|e| owner(&origins, &e.address) == self.origin)
            .collect();
        let fleet = u32::try_from(origins.len()).unwrap_or(u32::MAX);
        if fleet != self.fleet {
            let owned = self.share.iter().filter(|&&ours| ours).count();
            log::info!(
                "inference-picker: {fleet} replicas route these pods together ({} live peers); this one scrapes {owned} of {} pods",
                fleet - 1,
                self.share.len()
            );
            self.fleet = fleet;
        }
        slot.data.set_scrape_share(&self.share, fleet);
    }

    fn publish(
        &mut self,
        store: &(impl SharedData + HttpCallouts),
        coordinator: &mut Coordinator,
        slot: &mut PoolSlot,
        now_ms: u64,
    ) -> Result<(), crate::host::HostError> {
        self.seq += 1;
        let pool = slot.data.pool();
        let scrapes = pool
            .endpoints
            .iter()
            .enumerate()
            // Alone, no one takes them: a peer that joins is sent them once it is live.
            .filter(|(index, _)| self.fleet > 1 && self.share.get(*index).copied().unwrap_or(false))
            .filter_map(|(index, e)| {
                let age_ms = match e.last_scrape_ok_ms {
                    Some(at) => now_ms.saturating_sub(at),
                    None if e.last_scrape_failed => 0,
                    None => return None,
                };
                (age_ms <= wire::MAX_SCRAPE_AGE_MS).then(|| SharedScrape {
                    pod: u32::try_from(index).unwrap_or(u32::MAX),
                    age_ms,
                    failed: e.last_scrape_failed,
                    metrics: e.metrics.clone(),
                    in_flight_at_scrape: (e.in_flight_at_scrape, e.in_flight_tokens_at_scrape),
                })
            })
            .collect();
        let state = ReplicaState {
            origin: self.origin,
            seq: self.seq,
            newest_batch: self.batch_seq,
            pods: pool.endpoints.iter().map(|e| e.address.clone()).collect(),
            in_flight: coordinator.envoy_in_flight().to_vec(),
            scrapes,
        };
        coordinator.store_replica_state(store, &wire::frame(&state, &[]))?;
        let mut sums = vec![(0u32, 0u64); pool.len()];
        for peer in self.peers.iter().filter(|p| p.live(now_ms)) {
            for (sum, &(requests, tokens)) in sums.iter_mut().zip(&peer.in_flight) {
                sum.0 = sum.0.saturating_add(requests);
                sum.1 = sum.1.saturating_add(tokens);
            }
        }
        let replicas = u32::try_from(self.live(now_ms) + 1).unwrap_or(u32::MAX);
        coordinator.relay_in_flight(store, sums, replicas, now_ms)?;
        let learned = std::mem::take(&mut self.learned);
        coordinator.relay_placements(store, &learned)
    }

    fn call_peers(&mut self, host: &impl HttpCallouts) {
        let timeout = u32::try_from(duration_ms(self.config.timeout)).unwrap_or(u32::MAX);
        for index in 0..self.peers.len() {
            let Some(peer) = self.peers.get_mut(index) else {
                continue;
            };
            if peer.is_self || peer.calling {
                continue;
            }
            let path = match peer.origin {
                Some(origin) => format!(
                    "{}?origin={origin:x}&since={}",
                    self.config.path, peer.since
                ),
                None => self.config.path.clone(),
            };
            let headers = [
                (":method", "GET"),
                (":path", path.as_str()),
                (":authority", peer.address.as_str()),
                (crate::protocol::DESTINATION_HEADER, peer.address.as_str()),
                (PEER_SECRET_HEADER, self.config.secret.as_str()),
            ];
            match host.dispatch(&self.config.cluster, &headers, timeout) {
                Ok(token) => {
                    peer.calling = true;
                    self.calls.push((token, index));
                }
                Err(error) => {
                    self.counts.failed += 1;
                    peer.live_until_ms = 0;
                    log::debug!("inference-picker: calling peer {}: {error}", peer.address);
                }
            }
        }
    }

    /// A peer's answer: merged into the pool when good, counted either way. Returns whether
    /// it brought scrapes.
    pub fn on_answer(
        &mut self,
        slot: &mut PoolSlot,
        token: u32,
        answer: &CalloutAnswer,
        now_ms: u64,
    ) -> bool {
        if self.discovery.owns(token) {
            self.on_discovered(answer);
            return false;
        }
        let Some(position) = self.calls.iter().position(|&(t, _)| t == token) else {
            return false;
        };
        let (_, index) = self.calls.swap_remove(position);
        let Some(parsed) = self.accept(index, answer, now_ms) else {
            return false;
        };
        let origin = parsed.state.origin;
        let local = local_indices(slot, &parsed.state.pods);
        if let Some(peer) = self.peers.get_mut(index) {
            // Replaced whole: a pod the peer no longer names counts nothing.
            peer.in_flight.clear();
            peer.in_flight.resize(slot.data.pool().len(), (0, 0));
            let pool = slot.data.pool();
            for (&at, &counts) in local.iter().zip(&parsed.state.in_flight) {
                let Some(at) = at else {
                    continue;
                };
                if let Some(own) = peer.in_flight.get_mut(at) {
                    *own = believable_claim(pool.get(at), counts);
                }
            }
        }
        let scraped = self.merge_scrapes(slot, &parsed.state, &local, origin, now_ms);
        for placement in parsed.placements {
            let Some(index) = local.get(placement.endpoint).copied().flatten() else {
                continue;
            };
            let placement = LearnedPrefix {
                endpoint: index,
                hashes: placement.hashes,
            };
            slot.merge_placement(&placement);
            self.learned.push(placement);
        }
        scraped
    }

    /// Peer `index`'s answer, read and validated: `None` (counted and logged) when the call
    /// failed or the answer is refused, late, repeated or this replica's own.
    fn accept(&mut self, index: usize, answer: &CalloutAnswer, now_ms: u64) -> Option<PeerAnswer> {
        let own_origin = self.origin;
        let live_for = self.interval_ms * LIVE_INTERVALS;
        let peer = self.peers.get_mut(index)?;
        peer.calling = false;
        let ok = answer.status.as_deref() == Some(b"200".as_slice());
        let body = match &answer.body {
            Ok(body) if ok && !body.is_empty() => body,
            _ if ok => {
                // A 200 whose body was not read: over `maxStateBytes`.
                self.counts.refused += 1;
                peer.live_until_ms = 0;
                log::warn!(
                    "inference-picker: refused peer {}'s state: {} bytes, over pool.peers.maxStateBytes",
                    peer.address, answer.body_size
                );
                return None;
            }
            _ => {
                self.counts.failed += 1;
                peer.live_until_ms = 0;
                let status = describe_status(answer.status.as_deref());
                log::debug!("inference-picker: peer {}: {status}", peer.address);
                return None;
            }
        };
        self.counts.bytes += body.len() as u64;
        let since = if peer.origin.is_some() { peer.since } else { 0 };
        let parsed = match wire::read(body, since) {
            Ok(parsed) => parsed,
            Err(refused) => {
                self.counts.refused += 1;
                peer.live_until_ms = 0;
                log::warn!(
                    "inference-picker: refused peer {}'s state: {}",
                    peer.address,
                    refused.0
                );
                return None;
            }
        };
        if parsed.state.origin == own_origin {
            peer.is_self = true;
            return None;
        }
        if peer.origin != Some(parsed.state.origin) {
            // A new replica at this address (or a restart): start over with it.
            peer.origin = Some(parsed.state.origin);
            peer.last_seq = 0;
            peer.since = 0;
        } else if parsed.state.seq <= peer.last_seq {
            // Late or repeated: what it says is already known or superseded.
            return None;
        }
        peer.last_seq = parsed.state.seq;
        peer.since = parsed.newest_batch.max(peer.since);
        peer.live_until_ms = now_ms.saturating_add(live_for);
        self.counts.synced += 1;
        Some(parsed)
    }

    /// The scrapes in a peer's state of the pods the rendezvous gives it: it cannot overwrite
    /// the others, and an older reading never replaces a newer one. Returns whether any was.
    fn merge_scrapes(
        &self,
        slot: &mut PoolSlot,
        state: &ReplicaState,
        local: &[Option<usize>],
        origin: u64,
        now_ms: u64,
    ) -> bool {
        let live: Vec<u64> = self
            .peers
            .iter()
            .filter(|p| p.live(now_ms))
            .filter_map(|p| p.origin)
            .chain(std::iter::once(self.origin))
            .collect();
        let mut merged = false;
        for scrape in &state.scrapes {
            let Some(index) = local.get(scrape.pod as usize).copied().flatten() else {
                continue;
            };
            let Some(address) = slot.data.address(index).map(str::to_owned) else {
                continue;
            };
            if owner(&live, &address) != origin {
                continue;
            }
            let ok_ms = (!scrape.failed).then(|| now_ms.saturating_sub(scrape.age_ms));
            let counts = Some(scrape.in_flight_at_scrape);
            slot.data
                .apply_shared_scrape(&address, ok_ms, scrape.failed, &scrape.metrics, counts);
            merged = true;
        }
        merged
    }
}

/// Requests a peer may have placed at a pod beyond what the pod itself reported at its last
/// scrape: a scrape is at most a few intervals old, and a fleet places a few requests a pod in
/// that time.
const CLAIM_BEYOND_REPORT: u32 = 16;

/// A peer's in-flight count at a pod, believed up to what the pod itself reports running and
/// waiting (our own observation, or a scrape shared by the replica the rendezvous trusts with
/// it) plus [`CLAIM_BEYOND_REPORT`]: a peer that claims more is wrong or hostile, and one
/// replica's claim must never steer the fleet off a pod. Tokens shrink in proportion.
fn believable_claim(endpoint: Option<&EndpointState>, (count, tokens): (u32, u64)) -> (u32, u64) {
    let reported = endpoint.map_or(0.0, |e| {
        e.metrics.running().unwrap_or(0.0) + e.metrics.waiting().unwrap_or(0.0)
    });
    // Saturating float-to-int conversion; a pod's report is non-negative and bounded.
    let bound = (reported.max(0.0) as u32).saturating_add(CLAIM_BEYOND_REPORT);
    if count <= bound {
        return (count, tokens);
    }
    let kept = tokens.saturating_mul(u64::from(bound)) / u64::from(count.max(1));
    (bound, kept)
}

/// The state's and the newest batch's sequences last stored (by whichever VM held the lease).
fn stored_seqs(store: &impl SharedData, key: &str) -> (u64, u64) {
    let Ok(Some((bytes, _))) = store.get(key) else {
        return (0, 0);
    };
    wire::split(&bytes)
        .and_then(|(json, _)| serde_json::from_slice::<wire::Sequences>(json).ok())
        .map_or((0, 0), |s| (s.seq, s.newest_batch))
}

/// The replica (by origin) that scrapes `address`: the highest hash of the two.
fn owner(origins: &[u64], address: &str) -> u64 {
    origins
        .iter()
        .copied()
        .max_by_key(|&origin| hash_bytes(origin, address.as_bytes()))
        .unwrap_or(0)
}

/// Each of a peer's pods at this pool's index; `None` for pods this replica does not have.
fn local_indices(slot: &PoolSlot, pods: &[String]) -> Vec<Option<usize>> {
    let pool = slot.data.pool();
    pods.iter().map(|address| pool.index_of(address)).collect()
}

#[cfg(test)]
mod tests;
