//! Replicas that act as one. Each Envoy replica in front of the same pods publishes what it
//! learned (the requests it has in flight per pod, the prefix placements it made, the scrapes
//! of its share of the pods) and, every sync interval, exchanges it through Envoy's callouts
//! by way of one of them, the hub ([`Peers::targets`]): the hub asks every other replica and
//! relays what each told it; the others ask the hub alone. 2(N - 1) calls an interval rather
//! than N(N - 1). Nothing runs on a request's path and nothing is fixed: the hub is whichever
//! replica is first in the shared order and up, one that dies is replaced by the next at once,
//! and a side cut off routes alone as a single Envoy would.
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
/// Another replica counts as live for this many sync intervals after its latest state.
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

/// A peer address this replica may call.
#[derive(Debug, Clone)]
struct Peer {
    address: String,
    /// The origin that last answered at this address.
    origin: Option<u64>,
    /// This replica's own address (its answer carried our origin): never called again.
    is_self: bool,
    /// The newest placement batch read from the origin.
    since: u64,
    /// A call here failed: the address does not count as up before then.
    failed_until_ms: u64,
    /// When a replica that is not the hub next checks whether this address, ahead of the hub
    /// in the order, came up.
    next_probe_ms: u64,
    calling: bool,
}

impl Peer {
    fn new(address: String) -> Self {
        Peer {
            address,
            origin: None,
            is_self: false,
            since: 0,
            failed_until_ms: 0,
            next_probe_ms: 0,
            calling: false,
        }
    }
}

/// Another replica's latest state, told by itself (the answer to a call) or relayed by the hub.
#[derive(Debug, Clone)]
struct Known {
    origin: u64,
    seq: u64,
    /// Its peer address, when it is one this replica has in its list.
    address: Option<String>,
    live_until_ms: u64,
    /// How old the state was when it arrived, and when that was (this replica's clock).
    age_ms: u64,
    received_ms: u64,
    /// Its in-flight counts and scrapes, by this pool's index.
    in_flight: Vec<InFlight>,
    scrapes: Vec<SharedScrape>,
}

impl Known {
    fn live(&self, now_ms: u64) -> bool {
        now_ms < self.live_until_ms
    }

    fn age_at(&self, now_ms: u64) -> u64 {
        self.age_ms
            .saturating_add(now_ms.saturating_sub(self.received_ms))
    }
}

/// A state this replica was told, by this pool's index, before it is believed.
struct Told<'a> {
    origin: u64,
    seq: u64,
    address: Option<String>,
    age_ms: u64,
    in_flight: &'a [(u32, u64)],
    scrapes: &'a [SharedScrape],
}

pub struct Peers {
    config: PeersConfig,
    interval_ms: u64,
    /// This replica's id, agreed by its VMs through shared data; 0 until then.
    origin: u64,
    /// Sorted by address: every replica sees the same order, so all agree on the hub.
    peers: Vec<Peer>,
    /// The other replicas, by origin.
    known: Vec<Known>,
    /// Calls in flight: token -> peer.
    calls: Vec<(u32, usize)>,
    next_sync_ms: u64,
    seq: u64,
    /// The newest placement batch stored (see [`KEPT_BATCHES`]).
    batch_seq: u64,
    /// Whether this replica is the fleet's hub as of its last sync (see [`Peers::targets`]).
    hub: bool,
    /// The hub called its peers and has not yet heard from all of them.
    round_open: bool,
    /// The hub's address as last logged.
    hub_address: Option<String>,
    /// Placements peers made themselves and told this replica, for the hub to pass on.
    to_relay: Vec<LearnedPrefix>,
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
        let mut peers: Vec<Peer> = config.addresses.iter().cloned().map(Peer::new).collect();
        peers.sort_by(|a, b| a.address.cmp(&b.address));
        peers.dedup_by(|a, b| a.address == b.address);
        Peers {
            config,
            interval_ms,
            origin: 0,
            peers,
            known: Vec::new(),
            calls: Vec::new(),
            next_sync_ms: 0,
            seq: 0,
            batch_seq: 0,
            hub: false,
            round_open: false,
            hub_address: None,
            to_relay: Vec::new(),
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

    /// Other replicas whose state is recent enough to count.
    pub fn live(&self, now_ms: u64) -> usize {
        self.known.iter().filter(|k| k.live(now_ms)).count()
    }

    /// Whether this replica relays the others' state, as of its last sync.
    pub fn is_hub(&self) -> bool {
        self.hub
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
        let relayed = std::mem::take(&mut self.to_relay);
        let stored = self
            .keep_batch(host, coordinator, placements, 0)
            .and_then(|()| self.keep_batch(host, coordinator, &relayed, wire::RELAYED_BATCH))
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
            self.call_peers(host, now_ms);
        }
    }

    /// Whether the hub's round of calls just ended (every call answered or failed): its state
    /// is then stored again with what it relays (see [`Peers::publish_round`]).
    pub fn round_done(&mut self) -> bool {
        let done = self.round_open && self.calls.is_empty();
        if done {
            self.round_open = false;
        }
        done
    }

    /// Stores the state with what this round taught the hub, so the replicas that call it
    /// next get the others' news one hop after the hub did, not a tick later.
    pub fn publish_round(
        &mut self,
        host: &(impl SharedData + HttpCallouts),
        coordinator: &mut Coordinator,
        slot: &mut PoolSlot,
        now_ms: u64,
    ) {
        let relayed = std::mem::take(&mut self.to_relay);
        let stored = self
            .keep_batch(host, coordinator, &relayed, wire::RELAYED_BATCH)
            .and_then(|()| self.publish(host, coordinator, slot, now_ms));
        if let Err(error) = stored {
            log::warn!("inference-picker: storing this replica's state for its peers: {error}");
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
        if added + removed > 0 {
            self.peers.sort_by(|a, b| a.address.cmp(&b.address));
            self.calls.clear();
            for peer in &mut self.peers {
                peer.calling = false;
            }
            log::info!(
                "inference-picker: peer discovery: {added} added, {removed} removed, {} peers",
                self.peers.len()
            );
        }
    }

    /// Stores `placements` as the next batch, over the oldest kept one; `mark` is 0 for this
    /// Envoy's own, [`wire::RELAYED_BATCH`] for those the hub passes on.
    fn keep_batch(
        &mut self,
        store: &impl SharedData,
        coordinator: &Coordinator,
        placements: &[LearnedPrefix],
        mark: u64,
    ) -> Result<(), crate::host::HostError> {
        if placements.is_empty() {
            return Ok(());
        }
        self.batch_seq += 1;
        let key = coordinator
            .keys()
            .replica_batch(self.batch_seq % KEPT_BATCHES);
        store
            .set(&key, &encode_batch(self.batch_seq | mark, placements), None)
            .map(|_| ())
    }

    /// The live replicas' origins, this one's included, sorted.
    fn live_origins(&self, now_ms: u64) -> Vec<u64> {
        let mut origins: Vec<u64> = self
            .known
            .iter()
            .filter(|k| k.live(now_ms))
            .map(|k| k.origin)
            .chain(std::iter::once(self.origin))
            .collect();
        origins.sort_unstable();
        origins.dedup();
        origins
    }

    /// Which pods this replica scrapes: each pod goes to the replica the rendezvous over the
    /// live replicas (this one included) picks, so the fleet scrapes each pod once per
    /// interval, and a dead peer's pods come back within [`LIVE_INTERVALS`] sync intervals.
    fn share_scrapes(&mut self, slot: &mut PoolSlot, now_ms: u64) {
        let origins = self.live_origins(now_ms);
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
            relayed: if self.hub {
                self.relayed_states(now_ms)
            } else {
                Vec::new()
            },
        };
        coordinator.store_replica_state(store, &wire::frame(&state, &[]))?;
        let mut sums = vec![(0u32, 0u64); pool.len()];
        for known in self.known.iter().filter(|k| k.live(now_ms)) {
            for (sum, &(requests, tokens)) in sums.iter_mut().zip(&known.in_flight) {
                sum.0 = sum.0.saturating_add(requests);
                sum.1 = sum.1.saturating_add(tokens);
            }
        }
        let replicas = u32::try_from(self.live(now_ms) + 1).unwrap_or(u32::MAX);
        coordinator.relay_in_flight(store, sums, replicas, now_ms)?;
        let learned = std::mem::take(&mut self.learned);
        coordinator.relay_placements(store, &learned)
    }

    /// What the hub passes on: every live replica's latest state, aged by how long it held it.
    fn relayed_states(&self, now_ms: u64) -> Vec<wire::RelayedState> {
        self.known
            .iter()
            .filter(|k| k.live(now_ms))
            .map(|k| {
                let held = now_ms.saturating_sub(k.received_ms);
                wire::RelayedState {
                    origin: k.origin,
                    seq: k.seq,
                    address: k.address.clone().unwrap_or_default(),
                    age_ms: k.age_at(now_ms),
                    in_flight: k.in_flight.clone(),
                    scrapes: k
                        .scrapes
                        .iter()
                        .map(|s| SharedScrape {
                            age_ms: s.age_ms.saturating_add(held),
                            ..s.clone()
                        })
                        .filter(|s| s.age_ms <= wire::MAX_SCRAPE_AGE_MS)
                        .collect(),
                }
            })
            .collect()
    }

    /// Whether the replica at `peer` counts as up: this one, or one whose state is live and
    /// whose address did not just fail.
    fn up(&self, peer: &Peer, now_ms: u64) -> bool {
        if peer.is_self {
            return true;
        }
        now_ms >= peer.failed_until_ms
            && self
                .known
                .iter()
                .any(|k| k.live(now_ms) && k.address.as_deref() == Some(peer.address.as_str()))
    }

    /// The peers to call this sync. The hub is the first address (in the order every replica
    /// shares) whose replica is up: the hub calls every other replica and relays what each
    /// told it; the others call only the hub, and check the addresses ahead of it now and then
    /// (one that comes up becomes the hub). N - 1 calls an interval for N replicas rather
    /// than N(N - 1), every replica's state at most two hops from every other. Until this
    /// replica has found its own address (its first calls), it calls every peer.
    fn targets(&mut self, now_ms: u64) -> Vec<usize> {
        let knows_itself = self.peers.iter().any(|p| p.is_self);
        let hub = self.peers.iter().position(|p| self.up(p, now_ms));
        let hub = match hub {
            Some(hub) if knows_itself => hub,
            _ => {
                self.hub = true;
                return (0..self.peers.len()).collect();
            }
        };
        self.hub = self.peers.get(hub).is_some_and(|p| p.is_self);
        self.note_hub(hub);
        if self.hub {
            return (0..self.peers.len()).collect();
        }
        let probe_every = self.interval_ms * LIVE_INTERVALS;
        let mut targets = vec![hub];
        for (index, peer) in self.peers.iter_mut().enumerate().take(hub) {
            if now_ms >= peer.next_probe_ms {
                peer.next_probe_ms = now_ms.saturating_add(probe_every);
                targets.push(index);
            }
        }
        targets
    }

    /// Logs the hub when it changes, so a user can see who relays for whom.
    fn note_hub(&mut self, hub: usize) {
        let Some(address) = self.peers.get(hub).map(|p| p.address.as_str()) else {
            return;
        };
        if self.hub_address.as_deref() == Some(address) {
            return;
        }
        if self.hub {
            log::info!("inference-picker: this replica ({address}) is the peers' hub: it calls the others and relays what each told it");
        } else {
            log::info!(
                "inference-picker: the peers' hub is {address}: this replica calls it alone"
            );
        }
        self.hub_address = Some(address.to_owned());
    }

    fn call_peers(&mut self, host: &impl HttpCallouts, now_ms: u64) {
        let timeout = u32::try_from(duration_ms(self.config.timeout)).unwrap_or(u32::MAX);
        let targets = self.targets(now_ms);
        self.round_open = self.hub;
        for index in targets {
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
                    peer.failed_until_ms = now_ms.saturating_add(self.interval_ms);
                    log::debug!("inference-picker: calling peer {}: {error}", peer.address);
                }
            }
        }
        // Nothing to wait for (no call made): the tick's own publish covers it.
        self.round_open &= !self.calls.is_empty();
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
        let local = local_indices(slot, &parsed.state.pods);
        let address = self.peers.get(index).map(|p| p.address.clone());
        let direct = Told {
            origin: parsed.state.origin,
            seq: parsed.state.seq,
            address,
            age_ms: 0,
            in_flight: &parsed.state.in_flight,
            scrapes: &parsed.state.scrapes,
        };
        if !self.believe(slot, &direct, &local, now_ms) {
            // Late or repeated: what it says is already known or superseded.
            return false;
        }
        let mut believed = vec![parsed.state.origin];
        for relayed in &parsed.state.relayed {
            let address = self
                .peers
                .iter()
                .find(|p| p.address == relayed.address)
                .map(|p| p.address.clone());
            let told = Told {
                origin: relayed.origin,
                seq: relayed.seq,
                address,
                age_ms: relayed.age_ms,
                in_flight: &relayed.in_flight,
                scrapes: &relayed.scrapes,
            };
            if self.believe(slot, &told, &local, now_ms) {
                believed.push(relayed.origin);
            }
        }
        let mut scraped = false;
        for origin in believed {
            scraped |= self.merge_scrapes(slot, origin, now_ms);
        }
        let relay = self.hub;
        self.merge_placements(slot, &parsed.placements, &local, relay);
        self.merge_placements(slot, &parsed.relayed_placements, &local, false);
        scraped
    }

    /// Takes what a replica was told about `told.origin` when it is newer than what is known,
    /// by this pool's indices; returns whether it was.
    fn believe(
        &mut self,
        slot: &PoolSlot,
        told: &Told,
        local: &[Option<usize>],
        now_ms: u64,
    ) -> bool {
        let live_for = self.interval_ms * LIVE_INTERVALS;
        if told.origin == self.origin || told.age_ms >= live_for {
            return false;
        }
        let position = self.known.iter().position(|k| k.origin == told.origin);
        if position
            .and_then(|at| self.known.get(at))
            .is_some_and(|k| told.seq <= k.seq)
        {
            return false;
        }
        let pool = slot.data.pool();
        let mut in_flight = vec![(0, 0); pool.len()];
        for (&at, &counts) in local.iter().zip(told.in_flight) {
            if let Some(own) = at.and_then(|at| in_flight.get_mut(at)) {
                *own = believable_claim(at.and_then(|at| pool.get(at)), counts);
            }
        }
        let scrapes = told
            .scrapes
            .iter()
            .filter_map(|s| {
                let at = local.get(s.pod as usize).copied().flatten()?;
                Some(SharedScrape {
                    pod: u32::try_from(at).ok()?,
                    ..s.clone()
                })
            })
            .collect();
        let known = Known {
            origin: told.origin,
            seq: told.seq,
            address: told.address.clone(),
            live_until_ms: now_ms.saturating_add(live_for - told.age_ms),
            age_ms: told.age_ms,
            received_ms: now_ms,
            in_flight,
            scrapes,
        };
        match position {
            Some(at) => {
                if let Some(slot) = self.known.get_mut(at) {
                    *slot = known;
                }
            }
            None if self.known.len() < crate::limits::PEERS.max as usize => self.known.push(known),
            None => {
                // Full of replicas: the stalest one makes room.
                self.known.retain(|k| k.live(now_ms));
                if self.known.len() < crate::limits::PEERS.max as usize {
                    self.known.push(known);
                }
            }
        }
        true
    }

    /// A peer's placements, by this pool's indices: merged here and handed to the other VMs;
    /// with `relay`, kept for the hub's next relayed batch too.
    fn merge_placements(
        &mut self,
        slot: &mut PoolSlot,
        placements: &[LearnedPrefix],
        local: &[Option<usize>],
        relay: bool,
    ) {
        for placement in placements {
            let Some(index) = local.get(placement.endpoint).copied().flatten() else {
                continue;
            };
            let placement = LearnedPrefix {
                endpoint: index,
                hashes: placement.hashes.clone(),
            };
            slot.merge_placement(&placement);
            if relay {
                self.to_relay.push(placement.clone());
            }
            self.learned.push(placement);
        }
    }

    /// Peer `index`'s answer, read and validated: `None` (counted and logged) when the call
    /// failed or the answer is refused or this replica's own.
    fn accept(&mut self, index: usize, answer: &CalloutAnswer, now_ms: u64) -> Option<PeerAnswer> {
        let own_origin = self.origin;
        let failed_until = now_ms.saturating_add(self.interval_ms);
        let peer = self.peers.get_mut(index)?;
        peer.calling = false;
        let ok = answer.status.as_deref() == Some(b"200".as_slice());
        let body = match &answer.body {
            Ok(body) if ok && !body.is_empty() => body,
            _ if ok => {
                // A 200 whose body was not read: over `maxStateBytes`.
                self.counts.refused += 1;
                peer.failed_until_ms = failed_until;
                log::warn!(
                    "inference-picker: refused peer {}'s state: {} bytes, over pool.peers.maxStateBytes",
                    peer.address, answer.body_size
                );
                return None;
            }
            _ => {
                self.counts.failed += 1;
                peer.failed_until_ms = failed_until;
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
                peer.failed_until_ms = failed_until;
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
            peer.since = 0;
        }
        peer.since = parsed.newest_batch.max(peer.since);
        peer.failed_until_ms = 0;
        self.counts.synced += 1;
        Some(parsed)
    }

    /// The scrapes `origin`'s state, just believed, carries of the pods the rendezvous gives
    /// it: it cannot overwrite the others, and an older reading never replaces a newer one.
    /// Returns whether any was.
    fn merge_scrapes(&self, slot: &mut PoolSlot, origin: u64, now_ms: u64) -> bool {
        let Some(known) = self.known.iter().find(|k| k.origin == origin) else {
            return false;
        };
        let live = self.live_origins(now_ms);
        let mut merged = false;
        for scrape in &known.scrapes {
            let Some(address) = slot.data.address(scrape.pod as usize).map(str::to_owned) else {
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
