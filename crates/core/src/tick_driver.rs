//! One pool's tick in one VM, written against the host traits so it runs natively in tests:
//! elect the scraper, share state between the worker VMs, let the data layer call out (scrape
//! rounds, discovery, model lists) when this VM scrapes, and publish what a round learned.
//! The request side is [`crate::request_driver`]; the edges only forward callbacks to both.

use crate::datalayer::{CalloutOutcome, ToShare};
use crate::endpoint::{Health, HealthTransition};
use crate::host::{CalloutAnswer, Clock, HostError, HttpCallouts, SharedData};
use crate::learned::Learned;
use crate::peers::Peers;
use crate::router::PoolSlot;
use crate::shared_state::{Coordinator, Role};

/// What changed on a tick, for the log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickReport {
    pub transitions: Vec<HealthTransition>,
    /// The pool entered (true) or left (false) the "no fresh metrics anywhere" state.
    pub all_unfresh: Option<bool>,
    /// The pool became saturated (true) or not (false), per the saturation detector.
    pub saturated: Option<bool>,
}

/// What a tick did, for the host edge's stats.
#[derive(Debug, Clone, PartialEq)]
pub struct TickOutcome {
    pub role: Role,
    pub now_ms: u64,
    pub report: TickReport,
    /// Another VM changed the pool's members (the stats must cover the new ones).
    pub members_changed: bool,
    /// The pool's models (from `models-data-source`) changed: the router re-reads them.
    pub models_changed: bool,
    /// This VM speaks for the replica to its peers: its counts so far, and the live peers.
    pub peers: Option<(crate::peers::PeerCounts, usize)>,
}

/// Health transitions logged one line each in a tick; more make one summary line.
const DETAILED_TRANSITIONS: usize = 3;

pub struct TickDriver {
    /// `None`: this VM is alone (or shared data failed) and does everything itself.
    coordinator: Option<Coordinator>,
    /// The other Envoy replicas, when `pool.peers` names them: this VM speaks for the
    /// replica to them while it holds the scrape lease.
    peers: Option<Peers>,
    /// A peer's answer brought scrapes the other VMs have not been handed yet.
    peer_scrapes_unpublished: bool,
    last_tick_ms: u64,
}

impl TickDriver {
    pub fn new(coordinator: Option<Coordinator>, peers: Option<Peers>) -> Self {
        TickDriver {
            coordinator,
            peers,
            peer_scrapes_unpublished: false,
            last_tick_ms: 0,
        }
    }

    pub fn peers(&self) -> Option<&Peers> {
        self.peers.as_ref()
    }

    /// How much of the body of call `token`'s answer is read, when it is a call to a peer.
    pub fn peer_body_cap(&self, token: u32) -> Option<usize> {
        self.peers.as_ref()?.body_cap(token)
    }

    pub fn role(&self) -> Role {
        self.coordinator
            .as_ref()
            .map_or(Role::Scraper, Coordinator::role)
    }

    pub fn coordinator(&self) -> Option<&Coordinator> {
        self.coordinator.as_ref()
    }

    /// A follower that ticked slowly is about to route: it takes in the members, the snapshot,
    /// the other VMs' in-flight counts and placements and the pool's models now, rather than
    /// decide on what it read up to a slow tick ago. Shared data only: no callout leaves a
    /// request's callback. Returns whether the pool's models changed.
    pub fn catch_up(
        &mut self,
        host: &(impl SharedData + HttpCallouts + Clock),
        slot: &mut PoolSlot,
    ) -> bool {
        if self.role() != Role::Follower {
            return false;
        }
        let Some(coordinator) = self.coordinator.as_mut() else {
            return false;
        };
        let now = host.now_ms().unwrap_or(self.last_tick_ms);
        take_members(coordinator, host, slot);
        if let Err(error) = share_state(coordinator, host, slot, Role::Follower, None, now) {
            log::warn!("inference-picker: sharing state: {error}");
        }
        // The metrics' ages as of now (a follower logs no health change: the scraper does).
        slot.data.refresh_health(now);
        // Read whatever the last slow tick left (and for new members): its
        // once-per-`refreshInterval` pace would skip a list published since.
        self.read_models(host, slot, true)
    }

    /// This VM's configuration is gone: it leaves the pool's shared state (see
    /// [`Coordinator::retire`]). Returns the keys it emptied.
    pub fn retire(&mut self, store: &impl SharedData) -> Result<usize, HostError> {
        match &mut self.coordinator {
            Some(coordinator) => coordinator.retire(store),
            None => Ok(0),
        }
    }

    pub fn on_tick(
        &mut self,
        host: &(impl SharedData + HttpCallouts + Clock),
        slot: &mut PoolSlot,
    ) -> TickOutcome {
        let now = host.now_ms().unwrap_or(self.last_tick_ms);
        self.last_tick_ms = now;
        let (role, members_changed) = self.coordinate(host, slot);
        if let (Some(coordinator), Some(queue)) = (&self.coordinator, &mut slot.queue) {
            queue.control_mut().set_peers(coordinator.others());
        }
        let (transitions, all_unfresh) = slot.data.refresh_health(now);
        let report = TickReport {
            transitions,
            all_unfresh,
            saturated: slot.director.saturation_change(&slot.data, now),
        };
        let mut models_changed = false;
        if role == Role::Scraper {
            // Every VM sees the same transitions; only the scraper logs them.
            log_health(&report);
            let from_peers = std::mem::take(&mut self.peer_scrapes_unpublished);
            if slot.data.call_out(host, now) || from_peers {
                self.publish_snapshot(host, slot);
            }
        } else {
            slot.data.hand_over();
            models_changed = self.read_models(host, slot, members_changed);
        }
        let peers = self
            .peers
            .as_ref()
            .filter(|_| role == Role::Scraper)
            .map(|peers| (peers.counts(), peers.live(now)));
        TickOutcome {
            role,
            now_ms: now,
            report,
            members_changed,
            models_changed,
            peers,
        }
    }

    /// Reads the pool's models the scraping VM published; returns whether they changed.
    fn read_models(
        &mut self,
        store: &impl SharedData,
        slot: &mut PoolSlot,
        members_changed: bool,
    ) -> bool {
        let Some(coordinator) = &self.coordinator else {
            return false;
        };
        let key = coordinator.models_key();
        slot.data
            .apply_shared_models(store, key, self.last_tick_ms, members_changed)
    }

    /// Publishes this VM's in-flight counts and reads the other VMs' (flow control's fast
    /// ticks, between full ones).
    pub fn exchange_load(&mut self, store: &impl SharedData, slot: &mut PoolSlot, now_ms: u64) {
        if let Some(coordinator) = &mut self.coordinator {
            if let Err(error) = coordinator.exchange_load(store, slot, now_ms) {
                log::debug!("inference-picker: exchanging in-flight counts: {error}");
            }
        }
    }

    /// A callout's answer, fed to the data layer; what it learned is shared as it asks.
    pub fn on_callout_response(
        &mut self,
        host: &(impl SharedData + HttpCallouts + Clock),
        slot: &mut PoolSlot,
        token: u32,
        answer: &CalloutAnswer,
    ) -> CalloutOutcome {
        // Stamped on arrival, so the age other workers see is the real one.
        let now = host.now_ms().unwrap_or(self.last_tick_ms);
        if let Some(peers) = self.peers.as_mut().filter(|p| p.owns(token)) {
            // What the peer scraped reaches this Envoy's other VMs with the next tick's
            // snapshot: one a tick, not one per peer's answer.
            self.peer_scrapes_unpublished |= peers.on_answer(slot, token, answer, now);
            let round_done = peers.round_done();
            // A VM that lost the lease since it called stores nothing: the replica's state is
            // its new holder's to store, with sequence numbers only it moves on.
            let speaks = self
                .coordinator
                .as_mut()
                .filter(|c| c.role() == Role::Scraper);
            if let (true, Some(coordinator)) = (round_done, speaks) {
                // The hub heard from every peer: what it relays is served from now, not from
                // its next tick.
                peers.publish_round(host, coordinator, slot, now);
            }
            return CalloutOutcome::Peer;
        }
        let scraping = self.role() == Role::Scraper;
        let models_key = self.coordinator.as_ref().map(Coordinator::models_key);
        let (outcome, share) =
            slot.data
                .on_answer((host, host), token, answer, now, scraping, models_key);
        let ToShare { snapshot, members } = share;
        if snapshot {
            self.publish_snapshot(host, slot);
        }
        if members {
            if let Some(coordinator) = self.coordinator.as_mut() {
                if let Err(error) = coordinator.publish_members(host, slot.data.members()) {
                    log::warn!("inference-picker: sharing the pool: {error}");
                }
            }
        }
        outcome
    }

    /// Elects the scraper, then shares the pool, the snapshot, in-flight counts and prefix
    /// picks between the VMs. Returns the role and whether another VM changed the members.
    fn coordinate(
        &mut self,
        store: &(impl SharedData + HttpCallouts),
        slot: &mut PoolSlot,
    ) -> (Role, bool) {
        let now = self.last_tick_ms;
        let Some(coordinator) = self.coordinator.as_mut() else {
            return (Role::Scraper, false);
        };
        let role = match coordinator.elect(store, now) {
            Ok((role, changed)) => {
                if changed {
                    log::debug!("inference-picker: this VM is now the {role:?}");
                    if let Some(peers) = self.peers.as_mut() {
                        peers.lease_changed();
                    }
                }
                role
            }
            Err(error) => {
                // Without shared data every VM scrapes for itself, as if alone.
                log::warn!("inference-picker: shared data unavailable: {error}");
                return (Role::Scraper, false);
            }
        };
        let members_changed = take_members(coordinator, store, slot);
        let peers = self.peers.as_mut().filter(|_| role == Role::Scraper);
        if let Err(error) = share_state(coordinator, store, slot, role, peers, now) {
            log::warn!("inference-picker: sharing state: {error}");
        }
        (role, members_changed)
    }

    /// Publishes the snapshot (the one place the scraper does): when a round completes, and
    /// once per interval during a round that outlasts it.
    fn publish_snapshot(&mut self, store: &impl SharedData, slot: &mut PoolSlot) {
        let Some(coordinator) = self.coordinator.as_mut() else {
            slot.data.mark_published();
            return;
        };
        if coordinator.role() != Role::Scraper {
            return;
        }
        match coordinator.publish_snapshot(store, slot.data.pool()) {
            Ok(()) => slot.data.mark_published(),
            Err(error) => log::warn!("inference-picker: sharing state: {error}"),
        }
    }
}

/// Followers take in the scraper's snapshot; every VM exchanges in-flight counts and prefix
/// picks; the scraper then speaks for the Envoy to its peers, when it has any.
fn share_state(
    coordinator: &mut Coordinator,
    store: &(impl SharedData + HttpCallouts),
    slot: &mut PoolSlot,
    role: Role,
    peers: Option<&mut Peers>,
    now: u64,
) -> Result<(), HostError> {
    if role == Role::Follower {
        coordinator.apply_snapshot(store, &mut slot.data)?;
    }
    coordinator.exchange_load(store, slot, now)?;
    if let (Role::Follower, Some(replicas)) = (role, coordinator.peer_replicas()) {
        slot.data.set_peer_replicas(replicas);
    }
    let mut own = Vec::new();
    slot.take_placements(&mut own);
    let exchanged = coordinator.exchange_prefixes(store, &own)?;
    for placement in exchanged.from_vms.iter().chain(&exchanged.from_peers) {
        slot.merge_placement(placement);
    }
    if let Some(peers) = peers {
        // The Envoy's placements: this VM's and its other VMs'.
        own.extend(exchanged.from_vms);
        peers.on_tick(store, coordinator, slot, &own, now);
        if peers.live(now) > 0 {
            // The peers' counts it just relayed count here now, not a tick later.
            coordinator.exchange_load(store, slot, now)?;
        }
    }
    Ok(())
}

/// Applies the members another VM discovered, if they changed; returns whether they did.
fn take_members(
    coordinator: &mut Coordinator,
    store: &impl SharedData,
    slot: &mut PoolSlot,
) -> bool {
    match coordinator.take_members(store) {
        Ok(Some(members)) => {
            slot.data.apply_members(&members);
            true
        }
        Ok(None) => false,
        Err(error) => {
            log::warn!("inference-picker: reading the pool: {error}");
            false
        }
    }
}

fn log_health(report: &TickReport) {
    let transitions = &report.transitions;
    if transitions.len() <= DETAILED_TRANSITIONS {
        for transition in transitions {
            log::warn!(
                "inference-picker: endpoint {} is now {:?} (was {:?})",
                transition.address,
                transition.to,
                transition.from
            );
        }
    } else {
        // Many at once (a first round, an outage): one line, not one per endpoint.
        let mut counts: Vec<(Health, usize)> = Vec::new();
        for transition in transitions {
            match counts
                .iter_mut()
                .find(|(health, _)| *health == transition.to)
            {
                Some((_, count)) => *count += 1,
                None => counts.push((transition.to, 1)),
            }
        }
        let counts: Vec<String> = counts
            .iter()
            .map(|(health, count)| format!("{count} now {health:?}"))
            .collect();
        let examples: Vec<String> = transitions
            .iter()
            .take(DETAILED_TRANSITIONS)
            .map(|t| format!("{} {:?} -> {:?}", t.address, t.from, t.to))
            .collect();
        log::warn!(
            "inference-picker: {} endpoints changed health: {} (e.g. {}, ...)",
            transitions.len(),
            counts.join(", "),
            examples.join(", ")
        );
    }
    match report.saturated {
        Some(true) => {
            log::warn!("inference-picker: the pool is saturated; shedding sheddable requests")
        }
        Some(false) => log::info!("inference-picker: the pool is no longer saturated"),
        None => {}
    }
    match report.all_unfresh {
        Some(true) => log::warn!(
            "inference-picker: no endpoint has fresh metrics; scoring on the last ones plus the requests placed since"
        ),
        Some(false) => {
            log::info!("inference-picker: endpoints have fresh metrics; scoring on them")
        }
        None => {}
    }
}

#[cfg(test)]
mod tests;
