//! One picker per Envoy rather than one per worker VM. Every VM ticks; through the host's
//! shared data (process-wide, compare-and-swap) they agree that one of them, the lease holder,
//! scrapes the pods and publishes the metrics snapshot, and each publishes its own in-flight
//! counts so every VM schedules with the whole Envoy's load. All of it happens on ticks: the
//! request path makes no shared-data calls of this module's (with flow control on, admitting
//! and releasing a held request read and write its Envoy-wide ledger, `flow_control::ledger`).

use crate::datalayer::{DataLayer, Members};
use crate::endpoint::Pool;
use crate::hash::hash_bytes;
use crate::host::{HostError, SharedData};
use crate::learned::Learned;
use crate::metrics::EndpointMetrics;
use crate::placement_batches::{batch_seq, decode_batches, encode_batch_into};
use crate::scheduling::LearnedPrefix;
use crate::shared_keys::SharedKeys;
use serde::{Deserialize, Serialize};

/// What this VM does this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Holds the lease: scrapes every pod and publishes the snapshot.
    Scraper,
    /// Reads the snapshot another VM published.
    Follower,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Lease {
    owner: u64,
    expires_ms: u64,
}

/// One endpoint's latest scrape result, as published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SharedEndpoint {
    address: String,
    ok_ms: Option<u64>,
    failed: bool,
    metrics: EndpointMetrics,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Snapshot {
    seq: u64,
    endpoints: Vec<SharedEndpoint>,
}

/// One VM's in-flight counts per endpoint, stamped so a VM that went away stops counting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Load {
    stamp_ms: u64,
    /// `(requests, tokens)` per pool index.
    counts: Vec<(u32, u64)>,
    /// In the peers' relay: the live replicas, this one included (0 in a VM's own).
    #[serde(default)]
    replicas: u32,
    /// Requests the VM placed since it started: when it grows, the pool is in use, even if
    /// each of them ended between two ticks.
    #[serde(default)]
    placed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Membership {
    seq: u64,
    members: Members,
}

/// Batches a VM keeps published, each under a key of its own, so a reader that missed a few
/// ticks still catches up and one that did not copies only the new ones.
pub(crate) const BATCH_SLOTS: u64 = 64;
/// Block hashes per batch at most (256 KiB): a busy tick's placements are split into several,
/// so no buffer on either side follows the load up to megabytes, leaving gaps that a VM's
/// linear memory never gives back.
const BATCH_HASHES: usize = 1 << 15;

/// The pseudo-VM under whose keys the lease holder hands the other VMs what the Envoy's peers
/// (other replicas) taught it: their in-flight counts and placements (see [`crate::peers`]).
pub const PEERS_RELAY: u64 = u64::MAX;

pub struct Coordinator {
    vm_id: u64,
    keys: SharedKeys,
    lease_key: String,
    snapshot_key: String,
    vms_key: String,
    load_key: String,
    /// See [`LEASE_INTERVALS`].
    lease_ms: u64,
    /// Another VM's published load counts while it is younger than this (six intervals).
    load_fresh_ms: u64,
    role: Role,
    published_seq: u64,
    applied_seq: u64,
    /// The CAS token of the snapshot value last read: unchanged means nothing to decode.
    applied_cas: Option<u32>,
    snapshot_decodes: u64,
    others: Vec<u64>,
    /// The batch being published (see [`encode_batch_into`]).
    batch: Vec<u8>,
    prefix_seq: u64,
    /// Per other VM: the last prefix batch replayed from it.
    prefix_seen: Vec<(u64, u64)>,
    members_key: String,
    /// Where the scraping VM shares the pods' model lists (`models-data-source`).
    models_key: String,
    members_seq: u64,
    /// This Envoy's in-flight counts (every VM's own), as of the last exchange.
    envoy_in_flight: Vec<(u32, u64)>,
    /// The relay's latest placement batch (see [`PEERS_RELAY`]).
    relay_seq: Option<u64>,
    /// See [`Coordinator::peer_replicas`].
    peer_replicas: Option<u32>,
    /// Per other VM: its `placed` count at the last exchange.
    placed_seen: Vec<(u64, u64)>,
}

/// A lease lasts this many scrape intervals, and at least [`MIN_LEASE_MS`]: its holder renews
/// it on every tick, so only a VM that stops ticking for that long loses it. Under CPU pressure
/// ticks come late; a lease of two short intervals changed hands tens of times a run.
pub const LEASE_INTERVALS: u64 = 4;
pub const MIN_LEASE_MS: u64 = 500;

/// Attempts at a contended compare-and-swap before giving up until the next tick.
const CAS_ATTEMPTS: usize = 8;

impl Coordinator {
    /// `keys` name the pool's namespace (see [`SharedKeys`]); `vm_id` must differ between VMs.
    pub fn new(keys: SharedKeys, vm_id: u64, interval_ms: u64) -> Self {
        Coordinator {
            vm_id,
            lease_key: keys.lease(),
            snapshot_key: keys.snapshot(),
            vms_key: keys.vms(),
            load_key: keys.load(vm_id),
            batch: Vec::new(),
            prefix_seq: 0,
            prefix_seen: Vec::new(),
            members_key: keys.members(),
            models_key: keys.models(),
            members_seq: 0,
            envoy_in_flight: Vec::new(),
            relay_seq: None,
            peer_replicas: None,
            placed_seen: Vec::new(),
            keys,
            lease_ms: interval_ms
                .saturating_mul(LEASE_INTERVALS)
                .max(MIN_LEASE_MS),
            load_fresh_ms: interval_ms.saturating_mul(6).max(1),
            role: Role::Follower,
            published_seq: 0,
            applied_seq: 0,
            applied_cas: None,
            snapshot_decodes: 0,
            others: Vec::new(),
        }
    }

    /// The other VMs of this Envoy, as of the last registration (every tick).
    pub fn others(&self) -> &[u64] {
        &self.others
    }

    /// The pool's shared-data keys.
    /// The key of the pool's shared model lists, built once.
    pub fn models_key(&self) -> &str {
        &self.models_key
    }

    pub fn keys(&self) -> &SharedKeys {
        &self.keys
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Snapshots this VM decoded: a follower decodes one only when its CAS token moved.
    pub fn snapshot_decodes(&self) -> u64 {
        self.snapshot_decodes
    }

    /// Takes or renews the lease when it is free, expired or ours. Returns the role for this
    /// tick and whether it changed.
    pub fn elect(
        &mut self,
        store: &impl SharedData,
        now_ms: u64,
    ) -> Result<(Role, bool), HostError> {
        let current = store.get(&self.lease_key)?;
        let held = current
            .as_ref()
            .and_then(|(bytes, _)| serde_json::from_slice::<Lease>(bytes).ok());
        let free = held
            .as_ref()
            .is_none_or(|lease| lease.owner == self.vm_id || lease.expires_ms <= now_ms);
        let mut role = Role::Follower;
        if free {
            let lease = Lease {
                owner: self.vm_id,
                expires_ms: now_ms.saturating_add(self.lease_ms),
            };
            let bytes = serde_json::to_vec(&lease).unwrap_or_default();
            if store.set(&self.lease_key, &bytes, current.map(|(_, cas)| cas))? {
                role = Role::Scraper;
            }
        }
        let changed = role != self.role;
        self.role = role;
        Ok((role, changed))
    }

    /// The scraper publishes every endpoint's latest result.
    pub fn publish_snapshot(
        &mut self,
        store: &impl SharedData,
        pool: &Pool,
    ) -> Result<(), HostError> {
        self.published_seq = self.published_seq.max(self.applied_seq) + 1;
        let snapshot = Snapshot {
            seq: self.published_seq,
            endpoints: pool
                .endpoints
                .iter()
                .map(|e| SharedEndpoint {
                    address: e.address.clone(),
                    ok_ms: e.last_scrape_ok_ms,
                    failed: e.last_scrape_failed,
                    metrics: e.metrics.clone(),
                })
                .collect(),
        };
        publish(store, &self.snapshot_key, &snapshot)
    }

    /// A follower takes in the snapshot if it is newer than the last one it applied. Returns
    /// whether anything was applied.
    pub fn apply_snapshot(
        &mut self,
        store: &impl SharedData,
        data: &mut DataLayer,
    ) -> Result<bool, HostError> {
        let Some((bytes, cas)) = store.get(&self.snapshot_key)? else {
            return Ok(false);
        };
        if self.applied_cas == Some(cas) {
            return Ok(false);
        }
        self.applied_cas = Some(cas);
        self.snapshot_decodes += 1;
        let Ok(snapshot) = serde_json::from_slice::<Snapshot>(&bytes) else {
            return Ok(false);
        };
        if snapshot.seq <= self.applied_seq {
            return Ok(false);
        }
        self.applied_seq = snapshot.seq;
        for shared in &snapshot.endpoints {
            data.apply_shared_scrape(
                &shared.address,
                shared.ok_ms,
                shared.failed,
                &shared.metrics,
                None,
            );
        }
        Ok(true)
    }

    /// Publishes this VM's in-flight counts and sums the other VMs' into the pool.
    pub fn exchange_load(
        &mut self,
        store: &impl SharedData,
        learned: &mut impl Learned,
        now_ms: u64,
    ) -> Result<(), HostError> {
        self.register(store)?;
        let mut counts = Vec::with_capacity(learned.endpoints());
        learned.own_in_flight(&mut counts);
        let own = Load {
            stamp_ms: now_ms,
            counts,
            replicas: 0,
            placed: learned.placed(),
        };
        publish(store, &self.load_key, &own)?;
        let mut sums = vec![(0u32, 0u64); own.counts.len()];
        let fresh_after = now_ms.saturating_sub(self.load_fresh_ms);
        let mut grew = false;
        for &vm in &self.others {
            if let Some(load) = read::<Load>(store, &self.keys.load(vm))? {
                if load.stamp_ms >= fresh_after {
                    add_counts(&mut sums, &load.counts);
                }
                grew |= placed_grew(&mut self.placed_seen, vm, load.placed);
            }
        }
        // VMs gone from the registry are forgotten.
        let others = &self.others;
        self.placed_seen.retain(|(vm, _)| others.contains(vm));
        if grew {
            learned.note_use();
        }
        // The Envoy's own total (what its peers are told) before the peers' counts join it.
        self.envoy_in_flight.clone_from(&sums);
        add_counts(&mut self.envoy_in_flight, &own.counts);
        self.peer_replicas = None;
        if let Some(load) = read::<Load>(store, &self.keys.load(PEERS_RELAY))? {
            if load.stamp_ms >= fresh_after {
                add_counts(&mut sums, &load.counts);
                self.peer_replicas = Some(load.replicas);
            }
        }
        learned.merge_in_flight(&sums);
        Ok(())
    }

    /// The live replicas (this one included) as the VM that speaks to the peers counted them
    /// at its last tick; `None` without a fresh count.
    pub fn peer_replicas(&self) -> Option<u32> {
        self.peer_replicas
    }

    /// Every VM's own in-flight counts of this Envoy, summed at the last exchange.
    pub fn envoy_in_flight(&self) -> &[(u32, u64)] {
        &self.envoy_in_flight
    }

    /// This replica's id among its peers: the one stored in shared data, or a new one stored
    /// now (the VMs converge on whichever value stands). `None` when shared data fails.
    pub fn replica_origin(&self, store: &impl SharedData, now_ms: u64) -> Option<u64> {
        let key = self.keys.replica_origin();
        let stored = |store: &dyn SharedData| {
            store
                .get(&key)
                .ok()
                .flatten()
                .and_then(|(bytes, _)| bytes.try_into().ok().map(u64::from_le_bytes))
                .filter(|&origin| origin != 0)
        };
        if let Some(origin) = stored(store) {
            return Some(origin);
        }
        let candidate = hash_bytes(self.vm_id, &now_ms.to_le_bytes()) | 1;
        store.set(&key, &candidate.to_le_bytes(), Some(0)).ok()?;
        stored(store)
    }

    /// Stores the replica's state for peers to read (see [`crate::peers::serve`]).
    pub fn store_replica_state(
        &self,
        store: &impl SharedData,
        bytes: &[u8],
    ) -> Result<(), HostError> {
        store
            .set(&self.keys.replica_state(), bytes, None)
            .map(|_| ())
    }

    /// The peers' in-flight counts, summed per endpoint, for every VM of this Envoy.
    pub fn relay_in_flight(
        &mut self,
        store: &impl SharedData,
        counts: Vec<(u32, u64)>,
        replicas: u32,
        now_ms: u64,
    ) -> Result<(), HostError> {
        let load = Load {
            stamp_ms: now_ms,
            counts,
            replicas,
            // Peers' placements reach this Envoy's VMs as placements and in-flight counts.
            placed: 0,
        };
        publish(store, &self.keys.load(PEERS_RELAY), &load)
    }

    /// Placements peers made, for the other VMs of this Envoy (this one merged them already).
    pub fn relay_placements(
        &mut self,
        store: &impl SharedData,
        placements: &[LearnedPrefix],
    ) -> Result<(), HostError> {
        if placements.is_empty() {
            return Ok(());
        }
        let last = match self.relay_seq {
            Some(seq) => seq,
            // A lease that moved: go on from the relay's last batch, or readers skip ours.
            None => self.newest_published(store, PEERS_RELAY)?,
        };
        let seq = self.publish_batches(store, PEERS_RELAY, last, placements)?;
        self.relay_seq = Some(seq);
        self.note_seen(PEERS_RELAY, seq);
        Ok(())
    }

    /// Stores `placements` as `vm`'s batches after sequence `last`, each under the slot of its
    /// sequence and at most [`BATCH_HASHES`] hashes; returns the last sequence used.
    fn publish_batches(
        &mut self,
        store: &impl SharedData,
        vm: u64,
        mut last: u64,
        mut placements: &[LearnedPrefix],
    ) -> Result<u64, HostError> {
        while !placements.is_empty() {
            let part = batch_length(placements);
            let (batch, rest) = placements.split_at(part);
            last += 1;
            encode_batch_into(&mut self.batch, last, batch);
            store.set(&self.keys.prefix(vm, last % BATCH_SLOTS), &self.batch, None)?;
            placements = rest;
        }
        Ok(last)
    }

    /// The newest sequence among `vm`'s kept batches (0 for none).
    fn newest_published(&self, store: &impl SharedData, vm: u64) -> Result<u64, HostError> {
        let mut newest = 0;
        for slot in 0..BATCH_SLOTS {
            if let Some((bytes, _)) = store.get(&self.keys.prefix(vm, slot))? {
                newest = newest.max(batch_seq(&bytes).unwrap_or(0));
            }
        }
        Ok(newest)
    }

    /// Appends `vm`'s batches newer than `seen` to `into`, one slot at a time in sequence
    /// order; returns the newest read. A reader lapped by the writer goes on from the oldest
    /// batch still kept.
    fn read_batches(
        &self,
        store: &impl SharedData,
        vm: u64,
        seen: u64,
        into: &mut Vec<LearnedPrefix>,
    ) -> Result<u64, HostError> {
        let (mut newest, mut lapped) = (seen, false);
        // One more than the slots: finding out it was lapped takes one reading.
        for _ in 0..=BATCH_SLOTS {
            let next = newest + 1;
            let Some((bytes, _)) = store.get(&self.keys.prefix(vm, next % BATCH_SLOTS))? else {
                break;
            };
            match batch_seq(&bytes) {
                Some(seq) if seq == next => newest = decode_batches(&bytes, newest, into),
                Some(seq) if seq > next && !lapped => {
                    lapped = true;
                    let oldest_kept = self
                        .newest_published(store, vm)?
                        .saturating_sub(BATCH_SLOTS);
                    newest = newest.max(oldest_kept);
                }
                // Not written since the last reading.
                _ => break,
            }
        }
        Ok(newest)
    }

    fn note_seen(&mut self, vm: u64, seq: u64) {
        match self.prefix_seen.iter_mut().find(|(v, _)| *v == vm) {
            Some(entry) => entry.1 = entry.1.max(seq),
            None => self.prefix_seen.push((vm, seq)),
        }
    }

    /// The VM that runs discovery publishes the pool's members after a change.
    pub fn publish_members(
        &mut self,
        store: &impl SharedData,
        members: Members,
    ) -> Result<(), HostError> {
        self.members_seq += 1;
        let membership = Membership {
            seq: self.members_seq,
            members,
        };
        publish(store, &self.members_key, &membership)
    }

    /// A membership list newer than the last one seen, if another VM published one.
    pub fn take_members(&mut self, store: &impl SharedData) -> Result<Option<Members>, HostError> {
        let Some(membership) = read::<Membership>(store, &self.members_key)? else {
            return Ok(None);
        };
        if membership.seq <= self.members_seq {
            return Ok(None);
        }
        self.members_seq = membership.seq;
        Ok(Some(membership.members))
    }

    /// Publishes this VM's new prefix-index picks and returns the other VMs' new ones, so a
    /// prompt served through one worker is a hit for all of them. Call after
    /// [`Coordinator::exchange_load`], which refreshes the list of VMs.
    pub fn exchange_prefixes(
        &mut self,
        store: &impl SharedData,
        own: &[LearnedPrefix],
    ) -> Result<Exchanged, HostError> {
        self.prefix_seq = self.publish_batches(store, self.vm_id, self.prefix_seq, own)?;
        let mut exchanged = Exchanged::default();
        let others = std::mem::take(&mut self.others);
        for &vm in others.iter().chain(std::iter::once(&PEERS_RELAY)) {
            let seen = self
                .prefix_seen
                .iter()
                .find(|(v, _)| *v == vm)
                .map_or(0, |(_, seq)| *seq);
            let into = if vm == PEERS_RELAY {
                &mut exchanged.from_peers
            } else {
                &mut exchanged.from_vms
            };
            let newest = self.read_batches(store, vm, seen, into)?;
            self.note_seen(vm, newest);
        }
        self.others = others;
        Ok(exchanged)
    }

    /// This VM leaves the pool's shared state for good (its configuration is gone): it leaves
    /// the registry, so no VM reads its keys again; hands back the lease if it holds it, so a
    /// VM of the configuration that follows scrapes at once; and empties its own keys (its
    /// placement batches are the largest values a pool shares). Each step is tried whatever
    /// the others did. Returns the keys emptied, or the first error.
    pub fn retire(&mut self, store: &impl SharedData) -> Result<usize, HostError> {
        let left = self.unregister(store);
        let released = self.release_lease(store);
        let mut emptied = 0;
        let mut first_error = None;
        let own = (0..BATCH_SLOTS)
            .map(|slot| self.keys.prefix(self.vm_id, slot))
            .chain([self.load_key.clone(), self.keys.flow_summary(self.vm_id)]);
        for key in own {
            match empty(store, &key) {
                Ok(true) => emptied += 1,
                Ok(false) => {}
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        left.and(released)?;
        first_error.map_or(Ok(emptied), Err)
    }

    fn unregister(&mut self, store: &impl SharedData) -> Result<(), HostError> {
        for _ in 0..CAS_ATTEMPTS {
            let Some((bytes, cas)) = store.get(&self.vms_key)? else {
                return Ok(());
            };
            let mut vms: Vec<u64> = serde_json::from_slice(&bytes).unwrap_or_default();
            if !vms.contains(&self.vm_id) {
                return Ok(());
            }
            vms.retain(|&vm| vm != self.vm_id);
            let bytes = serde_json::to_vec(&vms).unwrap_or_default();
            if store.set(&self.vms_key, &bytes, Some(cas))? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// An expired lease in place of ours (only if it is still ours).
    fn release_lease(&mut self, store: &impl SharedData) -> Result<(), HostError> {
        let Some((bytes, cas)) = store.get(&self.lease_key)? else {
            return Ok(());
        };
        let ours = serde_json::from_slice::<Lease>(&bytes).is_ok_and(|l| l.owner == self.vm_id);
        if ours {
            let expired = Lease {
                owner: self.vm_id,
                expires_ms: 0,
            };
            let bytes = serde_json::to_vec(&expired).unwrap_or_default();
            store.set(&self.lease_key, &bytes, Some(cas))?;
        }
        self.role = Role::Follower;
        Ok(())
    }

    /// Makes sure this VM is in the shared list of VMs and refreshes the list of the others.
    /// A racing writer that overwrote our entry is caught by reading back on the next attempt
    /// (create-if-absent cannot be a CAS: a CAS of `None` overwrites).
    fn register(&mut self, store: &impl SharedData) -> Result<(), HostError> {
        for _ in 0..CAS_ATTEMPTS {
            let current = store.get(&self.vms_key)?;
            let mut vms: Vec<u64> = current
                .as_ref()
                .and_then(|(bytes, _)| serde_json::from_slice(bytes).ok())
                .unwrap_or_default();
            if vms.contains(&self.vm_id) {
                vms.retain(|&vm| vm != self.vm_id);
                self.others = vms;
                return Ok(());
            }
            vms.push(self.vm_id);
            let bytes = serde_json::to_vec(&vms).unwrap_or_default();
            store.set(&self.vms_key, &bytes, current.map(|(_, cas)| cas))?;
        }
        Ok(())
    }
}

/// Placements other VMs of this Envoy made, and those its peers made (relayed by the lease
/// holder), new since the last exchange.
#[derive(Debug, Default, PartialEq)]
pub struct Exchanged {
    pub from_vms: Vec<LearnedPrefix>,
    pub from_peers: Vec<LearnedPrefix>,
}

/// How many of `placements` (at least one) go in the next batch: as many as fit in
/// [`BATCH_HASHES`].
fn batch_length(placements: &[LearnedPrefix]) -> usize {
    let mut hashes = 0;
    let fitting = placements
        .iter()
        .take_while(|p| {
            hashes += p.hashes.len();
            hashes <= BATCH_HASHES
        })
        .count();
    fitting.max(1)
}

/// Whether `vm`'s count of placed requests grew since the last exchange (a VM seen for the
/// first time only sets the mark).
fn placed_grew(seen: &mut Vec<(u64, u64)>, vm: u64, placed: u64) -> bool {
    match seen.iter_mut().find(|(known, _)| *known == vm) {
        Some((_, last)) => {
            let grew = placed > *last;
            *last = placed;
            grew
        }
        None => {
            seen.push((vm, placed));
            false
        }
    }
}

fn add_counts(sums: &mut [(u32, u64)], counts: &[(u32, u64)]) {
    for (sum, &(requests, tokens)) in sums.iter_mut().zip(counts) {
        sum.0 = sum.0.saturating_add(requests);
        sum.1 = sum.1.saturating_add(tokens);
    }
}

/// A value a VM published, or `None` if absent or unreadable (another version's format).
fn read<T: serde::de::DeserializeOwned>(
    store: &impl SharedData,
    key: &str,
) -> Result<Option<T>, HostError> {
    Ok(store
        .get(key)?
        .and_then(|(bytes, _)| serde_json::from_slice(&bytes).ok()))
}

/// Empties `key` if it holds anything: whether it did.
fn empty(store: &impl SharedData, key: &str) -> Result<bool, HostError> {
    if store.get(key)?.is_some_and(|(bytes, _)| !bytes.is_empty()) {
        store.set(key, &[], None)?;
        return Ok(true);
    }
    Ok(false)
}

/// Publishes a value, overwriting whatever is there: only its owner writes the key.
fn publish<T: Serialize>(store: &impl SharedData, key: &str, value: &T) -> Result<(), HostError> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    store.set(key, &bytes, None).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::{EndpointState, Health};
    use crate::harness::test;
    use crate::host::fake::FakeShared;
    use std::collections::BTreeMap;

    fn pool() -> Pool {
        Pool::new(
            (1..=2)
                .map(|i| EndpointState::new(format!("10.0.0.{i}:8000"), BTreeMap::new()))
                .collect(),
        )
    }

    fn data() -> DataLayer {
        DataLayer::from_pool(pool(), crate::config::PoolConfig::default())
    }

    fn slot() -> crate::router::PoolSlot {
        let config = "pool: {endpoints: [{address: '10.0.0.1:8000'}, {address: '10.0.0.2:8000'}]}";
        crate::router::PoolSlot::new("p".into(), crate::config::load(config, 1).unwrap())
    }

    #[test]
    fn one_scraper_and_takeover_within_two_intervals() {
        let store = FakeShared::default();
        let mut a = Coordinator::new(SharedKeys::under("ns"), 1, 50);
        let mut b = Coordinator::new(SharedKeys::under("ns"), 2, 50);
        assert_eq!(a.elect(&store, 1000).unwrap(), (Role::Scraper, true));
        assert_eq!(b.elect(&store, 1000).unwrap(), (Role::Follower, false));
        assert_eq!(
            a.elect(&store, 1050).unwrap(),
            (Role::Scraper, false),
            "renewed"
        );
        // a stops ticking; its lease (renewed at 1050) ends MIN_LEASE_MS later.
        let ends = 1050 + a.lease_ms();
        assert_eq!(
            a.lease_ms(),
            MIN_LEASE_MS,
            "4 intervals of 50 ms are below the minimum"
        );
        assert_eq!(b.elect(&store, ends - 1).unwrap().0, Role::Follower);
        assert_eq!(b.elect(&store, ends).unwrap(), (Role::Scraper, true));
        assert_eq!(a.elect(&store, ends + 10).unwrap(), (Role::Follower, true));
    }

    #[test]
    fn a_retired_vm_hands_back_the_lease_leaves_the_registry_and_empties_its_keys() {
        let store = FakeShared::default();
        let mut old = Coordinator::new(SharedKeys::under("ns"), 1, 50);
        let mut new = Coordinator::new(SharedKeys::under("ns"), 2, 50);
        let (mut pool_old, mut pool_new) = (slot(), slot());
        pool_old.data.add_in_flight(0, 100);
        old.exchange_load(&store, &mut pool_old, 1000).unwrap();
        new.exchange_load(&store, &mut pool_new, 1000).unwrap();
        let learned = LearnedPrefix {
            endpoint: 1,
            hashes: vec![7, 8, 9],
        };
        old.exchange_prefixes(&store, &[learned]).unwrap();
        assert_eq!(old.elect(&store, 1000).unwrap(), (Role::Scraper, true));
        assert_eq!(new.elect(&store, 1000).unwrap().0, Role::Follower);

        // Its batch and its in-flight counts.
        assert_eq!(old.retire(&store).unwrap(), 2);
        assert_eq!(old.role(), Role::Follower);
        // The lease is free at once, not after MIN_LEASE_MS.
        assert_eq!(new.elect(&store, 1001).unwrap(), (Role::Scraper, true));
        new.exchange_load(&store, &mut pool_new, 1001).unwrap();
        assert!(new.others().is_empty(), "{:?}", new.others());
        assert_eq!(pool_new.data.pool().endpoints[0].total_in_flight(), 0);
        assert!(store
            .get(&SharedKeys::under("ns").prefix(1, 1))
            .unwrap()
            .is_some_and(|(bytes, _)| bytes.is_empty()));
        assert_eq!(old.retire(&store).unwrap(), 0, "nothing left to empty");
    }

    #[test]
    fn followers_apply_newer_snapshots_only() {
        let store = FakeShared::default();
        let mut scraper = Coordinator::new(SharedKeys::under("ns"), 1, 50);
        let mut follower = Coordinator::new(SharedKeys::under("ns"), 2, 50);
        let mut source = pool();
        source.record_scrape_ok(
            0,
            900,
            EndpointMetrics {
                waiting_queue: Some(3.0),
                ..EndpointMetrics::default()
            },
        );
        source.record_scrape_failure(1);
        scraper.publish_snapshot(&store, &source).unwrap();
        let mut local = data();
        assert!(follower.apply_snapshot(&store, &mut local).unwrap());
        assert!(
            !follower.apply_snapshot(&store, &mut local).unwrap(),
            "same seq"
        );
        let endpoints = &local.pool().endpoints;
        assert_eq!(endpoints[0].metrics.waiting_queue, Some(3.0));
        assert_eq!(endpoints[0].last_scrape_ok_ms, Some(900));
        local.refresh_health(1000);
        let endpoints = &local.pool().endpoints;
        assert_eq!(endpoints[0].health, Health::Fresh);
        assert_eq!(endpoints[1].health, Health::Unreachable);
    }

    #[test]
    fn in_flight_counts_are_summed_across_vms() {
        let store = FakeShared::default();
        let mut a = Coordinator::new(SharedKeys::under("ns"), 1, 50);
        let mut b = Coordinator::new(SharedKeys::under("ns"), 2, 50);
        let (mut pool_a, mut pool_b) = (slot(), slot());
        pool_a.data.add_in_flight(0, 100);
        pool_b.data.add_in_flight(0, 10);
        pool_b.data.add_in_flight(1, 5);
        a.exchange_load(&store, &mut pool_a, 1000).unwrap();
        b.exchange_load(&store, &mut pool_b, 1000).unwrap();
        a.exchange_load(&store, &mut pool_a, 1050).unwrap();
        assert_eq!(pool_a.data.pool().endpoints[0].total_in_flight(), 2);
        assert_eq!(
            pool_a.data.pool().endpoints[0].total_in_flight_tokens(),
            110
        );
        assert_eq!(pool_a.data.pool().endpoints[1].total_in_flight(), 1);
        assert_eq!(pool_b.data.pool().endpoints[0].remote_in_flight, 1);
        // b goes away: after six intervals its counts stop counting.
        a.exchange_load(&store, &mut pool_a, 1000 + 301).unwrap();
        assert_eq!(pool_a.data.pool().endpoints[1].total_in_flight(), 0);
    }

    #[test]
    fn prefix_picks_reach_every_other_vm_once() {
        let store = FakeShared::default();
        let mut a = Coordinator::new(SharedKeys::under("ns"), 1, 50);
        let mut b = Coordinator::new(SharedKeys::under("ns"), 2, 50);
        let (mut pool_a, mut pool_b) = (slot(), slot());
        a.exchange_load(&store, &mut pool_a, 0).unwrap();
        b.exchange_load(&store, &mut pool_b, 0).unwrap();
        a.exchange_load(&store, &mut pool_a, 0).unwrap();
        let learned = LearnedPrefix {
            endpoint: 1,
            hashes: vec![0, u64::MAX, 0x1234_5678_9abc_def0],
        };
        assert!(a
            .exchange_prefixes(&store, std::slice::from_ref(&learned))
            .unwrap()
            .from_vms
            .is_empty());
        assert_eq!(
            b.exchange_prefixes(&store, &[]).unwrap().from_vms,
            vec![learned.clone()]
        );
        assert!(
            b.exchange_prefixes(&store, &[])
                .unwrap()
                .from_vms
                .is_empty(),
            "replayed once"
        );
        // A value cut short yields what was whole before the cut, and no panic.
        let bytes = crate::placement_batches::encode_batch(7, &[learned.clone(), learned.clone()]);
        let mut out = Vec::new();
        assert_eq!(decode_batches(&bytes[..bytes.len() - 3], 0, &mut out), 0);
        assert_eq!(out, std::slice::from_ref(&learned));
        out.clear();
        assert_eq!(decode_batches(&bytes, 0, &mut out), 7);
        assert_eq!(out.len(), 2);
        out.clear();
        assert_eq!(decode_batches(&bytes, 7, &mut out), 7);
        assert!(out.is_empty(), "already seen");
    }

    #[test]
    fn a_vm_that_missed_more_ticks_than_are_kept_reads_the_kept_batches_in_order() {
        let store = FakeShared::default();
        let mut a = Coordinator::new(SharedKeys::under("ns"), 1, 50);
        let mut b = Coordinator::new(SharedKeys::under("ns"), 2, 50);
        let (mut pool_a, mut pool_b) = (slot(), slot());
        a.exchange_load(&store, &mut pool_a, 0).unwrap();
        b.exchange_load(&store, &mut pool_b, 0).unwrap();
        let pick = |n: u64| LearnedPrefix {
            endpoint: 0,
            hashes: vec![n],
        };
        b.exchange_prefixes(&store, &[]).unwrap();
        let published = BATCH_SLOTS + 3;
        for n in 1..=published {
            a.exchange_prefixes(&store, &[pick(n)]).unwrap();
        }
        // Each batch sits under its own key: one tick's publishing copies one batch.
        assert_eq!(
            store
                .get(&SharedKeys::under("ns").prefix(1, published % BATCH_SLOTS))
                .unwrap()
                .map(|(bytes, _)| bytes.len()),
            Some(12 + 8 + 8)
        );
        let read: Vec<u64> = b
            .exchange_prefixes(&store, &[])
            .unwrap()
            .from_vms
            .iter()
            .flat_map(|p| p.hashes.clone())
            .collect();
        // The overwritten ones are gone; every kept one comes, in order and once.
        assert_eq!(
            read,
            (published - BATCH_SLOTS + 1..=published).collect::<Vec<_>>()
        );
        a.exchange_prefixes(&store, &[pick(99)]).unwrap();
        assert_eq!(
            b.exchange_prefixes(&store, &[]).unwrap().from_vms,
            vec![pick(99)]
        );
        // A busy tick is split into batches of at most BATCH_HASHES, all read.
        let big = |n: u64| LearnedPrefix {
            endpoint: 1,
            hashes: vec![n; BATCH_HASHES / 2 + 1],
        };
        let busy = [big(1), big(2), pick(3)];
        a.exchange_prefixes(&store, &busy).unwrap();
        for slot in 0..BATCH_SLOTS {
            let stored = store.get(&SharedKeys::under("ns").prefix(1, slot)).unwrap();
            assert!(stored.is_none_or(|(bytes, _)| bytes.len() <= 12 + 8 + 8 * BATCH_HASHES));
        }
        assert_eq!(b.exchange_prefixes(&store, &[]).unwrap().from_vms, busy);
    }

    #[test]
    fn membership_reaches_the_others_once() {
        let store = FakeShared::default();
        let mut a = Coordinator::new(SharedKeys::under("ns"), 1, 50);
        let mut b = Coordinator::new(SharedKeys::under("ns"), 2, 50);
        let members = vec![("10.0.0.9:8000".to_string(), Default::default(), false)];
        a.publish_members(&store, members.clone()).unwrap();
        assert_eq!(b.take_members(&store).unwrap(), Some(members));
        assert_eq!(b.take_members(&store).unwrap(), None);
        // b takes over discovery: its next list is newer than what it saw.
        b.publish_members(&store, vec![]).unwrap();
        assert_eq!(a.take_members(&store).unwrap(), Some(vec![]));
    }
}
