//! Flow control (feature gate `flowControl`), as llm-d's EPP has it but inside Envoy: while
//! the pool is saturated a request is held (its stream paused, its body parsed) in a priority
//! band, in a flow per fairness id, and dispatched when the saturation detector says the pool
//! has room: highest band first, then the band's fairness policy across flows, then the
//! flow's ordering policy. Limits and TTLs refuse what cannot wait.
//!
//! Each worker VM holds its own paused streams; what every VM holds (per band and flow: how
//! many, how many bytes, the head's ordering key) is published in shared data, so limits
//! count the whole Envoy (the ledger) and every VM computes the same next request
//! Envoy-wide. When another VM holds it, this one serves its own best request of that band
//! rather than leave the slot idle, and the other VM takes the next one on its next callback
//! or tick. This module is the pure part: plain data in and out; the host edge moves the
//! summaries and resumes the streams.

pub mod ledger;
pub mod queue;
pub mod reserve;

pub use crate::config::flow_control::{BandConfig, FlowControlConfig};

use crate::error_response::Dropped;
use crate::host::{HostError, SharedData};
use crate::scheduling::flow_policy::{Fairness, OrderFacts};
use crate::scheduling::flow_policy_plugins::ordering_key;
use crate::scheduling::plugins::flow_control::{
    global_strict_fairness_policy, round_robin_fairness_policy,
};
use crate::shared_keys::SharedKeys;
use reserve::Demand;
use serde::{Deserialize, Serialize};

/// The flow of requests that name no fairness id (llm-d's name for it).
pub const DEFAULT_FAIRNESS_ID: &str = "default-flow";

/// A request asking to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The HTTP context holding the stream (unique within the VM).
    pub id: u32,
    /// For the log line when it leaves the queue.
    pub request_id: String,
    pub priority: i32,
    pub fairness_id: String,
    pub bytes: u64,
    /// `x-llm-d-slo-ttft-ms`, for `slo-deadline-ordering-policy`.
    pub slo_ttft_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiting {
    id: u32,
    /// The band it waits in (its priority, or 0 when no band has it).
    band: i32,
    fairness_id: String,
    bytes: u64,
    arrived_ms: u64,
    slo_deadline_ms: Option<u64>,
}

/// One flow's waiting requests in one VM, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowHead {
    pub band: i32,
    pub fairness_id: String,
    pub count: u32,
    pub bytes: u64,
    /// The ordering policy's key of the flow's first request.
    pub head: (u64, u64),
}

/// The fairness id a band served last, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub band: i32,
    pub fairness_id: String,
    pub at_ms: u64,
}

/// What one VM holds, as it published it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Published {
    pub vm: u64,
    pub stamp_ms: u64,
    pub flows: Vec<FlowHead>,
    pub cursors: Vec<Cursor>,
}

/// Where the next dispatch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// A request this VM holds (its context id).
    Local(u32),
    /// Another VM holds it.
    Remote(u64),
}

/// A request that left the queue, and how long it waited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    pub id: u32,
    pub band: i32,
    pub waited_ms: u64,
}

/// Another VM's summary counts while younger than this (it republishes on every tick
/// while it holds anything, so only a VM that went away goes stale).
pub const PUBLISHED_FRESH_MS: u64 = 5_000;

pub struct FlowControl {
    config: FlowControlConfig,
    vm: u64,
    /// This configuration's shared-data keys, and the other VMs of this Envoy.
    keys: SharedKeys,
    peers: Vec<u64>,
    /// Something changed since the last summary was published.
    unpublished: bool,
    /// The Envoy-wide ledger exists (see [`ledger::init`]).
    ledger_ready: bool,
    waiting: Vec<Waiting>,
    /// Per band: the flow this VM served last.
    cursors: Vec<Cursor>,
    others: Vec<Published>,
    /// Whether the pool had an endpoint at the last look, and since when (TTLs restart
    /// when that changes, as llm-d's do).
    has_endpoints: bool,
    endpoints_changed_ms: u64,
    /// Arrivals per band and dispatches, for `priority-reserve-policy`.
    demand: Demand,
}

/// Local counts per band, for the gauges: `(band, requests, bytes)`.
pub type BandLoad = (i32, u64, u64);

impl FlowControl {
    pub fn new(config: FlowControlConfig, vm: u64) -> Self {
        FlowControl {
            config,
            vm,
            keys: SharedKeys::default(),
            peers: Vec::new(),
            unpublished: false,
            ledger_ready: false,
            waiting: Vec::new(),
            cursors: Vec::new(),
            others: Vec::new(),
            has_endpoints: true,
            endpoints_changed_ms: 0,
            demand: Demand::default(),
        }
    }

    /// Names this VM and the shared-data keys its summaries go under.
    pub fn attach(&mut self, keys: SharedKeys, vm: u64) {
        self.keys = keys;
        self.vm = vm;
    }

    /// The other VMs of this Envoy (from the coordinator's registry, on ticks).
    pub fn set_peers(&mut self, peers: &[u64]) {
        self.peers.clear();
        self.peers.extend_from_slice(peers);
    }

    pub fn vm(&self) -> u64 {
        self.vm
    }

    fn summary_key(&self, vm: u64) -> String {
        self.keys.flow_summary(vm)
    }

    /// Publishes what this VM holds and whom it served last (skipped when nothing is held
    /// and nothing changed; while something is held, every call refreshes its stamp).
    pub fn publish(&mut self, store: &dyn SharedData, now_ms: u64) -> Result<(), HostError> {
        if self.settled() {
            return Ok(());
        }
        let summary = self.published(now_ms);
        let bytes = serde_json::to_vec(&summary).unwrap_or_default();
        store.set(&self.summary_key(self.vm), &bytes, None)?;
        self.unpublished = false;
        Ok(())
    }

    /// Reads what the other VMs hold.
    pub fn refresh(&mut self, store: &dyn SharedData) -> Result<(), HostError> {
        if !self.ledger_ready {
            ledger::init(store, &self.ledger_key())?;
            self.ledger_ready = true;
        }
        let mut others = Vec::with_capacity(self.peers.len());
        for &vm in &self.peers {
            let summary = store
                .get(&self.summary_key(vm))?
                .and_then(|(bytes, _)| serde_json::from_slice::<Published>(&bytes).ok());
            if let Some(summary) = summary {
                others.push(summary);
            }
        }
        self.others = others;
        Ok(())
    }

    pub fn config(&self) -> &FlowControlConfig {
        &self.config
    }

    /// A request of `priority` arrived (every one, held or not).
    pub fn arrived(&mut self, priority: i32, now_ms: u64) {
        if let Some(reserve) = self.config.reserve {
            let band = self.config.band(priority).map_or(0, |b| b.priority);
            self.demand.arrived(band, reserve.window_ms, now_ms);
        }
    }

    /// A request went to an endpoint (straight away or out of the queue).
    pub fn dispatched(&mut self, now_ms: u64) {
        if let Some(reserve) = self.config.reserve {
            self.demand.dispatched(reserve.window_ms, now_ms);
        }
    }

    /// The slots `band` leaves free for higher bands, of a pool of `slots`.
    pub fn kept_for_higher(&mut self, band: i32, slots: f64, now_ms: u64) -> u32 {
        match self.config.reserve {
            Some(reserve) => self.demand.kept_for_higher(&reserve, band, slots, now_ms),
            None => 0,
        }
    }

    /// Whether any band orders by the TTFT objective header (so it is worth reading).
    pub fn reads_slo_header(&self) -> bool {
        self.config.orders_by_slo()
    }

    pub fn holds(&self, id: u32) -> bool {
        self.waiting.iter().any(|w| w.id == id)
    }

    /// The band (priority) the request `id` waits in here, if it does.
    pub fn band_of(&self, id: u32) -> Option<i32> {
        self.waiting.iter().find(|w| w.id == id).map(|w| w.band)
    }

    pub fn local_len(&self) -> usize {
        self.waiting.len()
    }

    /// True when nothing waits in this VM nor (as last published) in any other: a request
    /// may then go straight to the scheduler when the pool has room.
    pub fn idle(&self, now_ms: u64) -> bool {
        self.waiting.is_empty() && self.fresh_others(now_ms).all(|p| p.flows.is_empty())
    }

    /// True when nothing waits, here or (as last published) in another VM, in the band of
    /// `priority` or a higher one: a request of that priority may then pass the queue when
    /// its band has room (lower bands never come first).
    pub fn clear_for(&self, priority: i32, now_ms: u64) -> bool {
        let band = self.config.band(priority).map_or(0, |b| b.priority);
        !self.waiting.iter().any(|w| w.band >= band)
            && !self
                .fresh_others(now_ms)
                .flat_map(|p| &p.flows)
                .any(|f| f.band >= band && f.count > 0)
    }

    /// Nothing held here and the other VMs already know it: nothing to publish.
    pub fn settled(&self) -> bool {
        self.waiting.is_empty() && !self.unpublished
    }

    /// Notes whether the pool has an endpoint; a change restarts every TTL.
    pub fn set_has_endpoints(&mut self, has_endpoints: bool, now_ms: u64) {
        if has_endpoints != self.has_endpoints {
            self.has_endpoints = has_endpoints;
            self.endpoints_changed_ms = now_ms;
        }
    }

    /// Queues a request, or says why it cannot wait: the queue is full, Envoy-wide (the
    /// ledger in `store` counts every VM's). A ledger that cannot be updated fails open.
    pub fn admit(
        &mut self,
        arrival: Arrival,
        now_ms: u64,
        store: &dyn SharedData,
    ) -> Result<(), Dropped> {
        let full = if self.has_endpoints {
            Dropped::QueueFull
        } else {
            Dropped::QueueFullNoEndpoints
        };
        let band = self.config.band(arrival.priority).ok_or(full)?.priority;
        match ledger::reserve(store, &self.ledger_key(), &self.config, band, arrival.bytes) {
            Ok(true) => {}
            Ok(false) => return Err(full),
            Err(error) => {
                log::warn!("inference-picker: flow control: counting a held request: {error}")
            }
        }
        self.unpublished = true;
        self.waiting.push(Waiting {
            id: arrival.id,
            band,
            fairness_id: arrival.fairness_id,
            bytes: arrival.bytes,
            arrived_ms: now_ms,
            slo_deadline_ms: arrival.slo_ttft_ms.map(|ms| now_ms.saturating_add(ms)),
        });
        Ok(())
    }

    fn ledger_key(&self) -> String {
        self.keys.flow_ledger()
    }

    fn fresh_others(&self, now_ms: u64) -> impl Iterator<Item = &Published> {
        self.others.iter().filter(move |p| {
            p.vm != self.vm && now_ms.saturating_sub(p.stamp_ms) <= PUBLISHED_FRESH_MS
        })
    }

    fn facts(&self, waiting: &Waiting) -> OrderFacts {
        let ttl = if self.has_endpoints {
            self.config.request_ttl
        } else {
            self.config.no_endpoint_ttl
        };
        let started = waiting.arrived_ms.max(self.endpoints_changed_ms);
        OrderFacts {
            arrived_ms: waiting.arrived_ms,
            expires_ms: ttl.map_or(u64::MAX, |ttl| {
                started.saturating_add(crate::duration::duration_ms(ttl))
            }),
            slo_deadline_ms: waiting.slo_deadline_ms,
        }
    }

    fn key(&self, waiting: &Waiting) -> (u64, u64) {
        let ordering = self
            .config
            .band(waiting.band)
            .map(|b| b.ordering)
            .unwrap_or_default();
        ordering_key(ordering, &self.facts(waiting))
    }

    /// The request that goes next, Envoy-wide: highest band with anything waiting, the
    /// band's fairness policy across flows, the flow's ordering policy within it.
    /// Returns the band it waits in too.
    pub fn pick(&self, now_ms: u64) -> Option<(i32, Pick)> {
        self.config.bands.iter().find_map(|band| {
            self.pick_in_band(band.priority, band.fairness, now_ms)
                .map(|pick| (band.priority, pick))
        })
    }

    fn pick_in_band(&self, band: i32, fairness: Fairness, now_ms: u64) -> Option<Pick> {
        // Every request here and every other VM's flow heads: the best head Envoy-wide per
        // fairness id, and who holds it.
        let local = self
            .waiting
            .iter()
            .filter(|w| w.band == band)
            .map(|w| (w.fairness_id.as_str(), self.key(w), Pick::Local(w.id)));
        let remote = self.fresh_others(now_ms).flat_map(|published| {
            published
                .flows
                .iter()
                .filter(|f| f.band == band && f.count > 0)
                .map(|f| (f.fairness_id.as_str(), f.head, Pick::Remote(published.vm)))
        });
        self.choose(band, fairness, local.chain(remote), now_ms)
    }

    /// Of `(fairness id, ordering key, what)` candidates in `band`, the flows' heads (each
    /// flow's smallest key), then the one the band's fairness policy picks.
    fn choose<'a, T: Copy>(
        &self,
        band: i32,
        fairness: Fairness,
        candidates: impl Iterator<Item = (&'a str, (u64, u64), T)>,
        now_ms: u64,
    ) -> Option<T> {
        let mut flows: Vec<(&str, (u64, u64), T)> = Vec::new();
        for (id, key, what) in candidates {
            match flows.iter_mut().find(|f| f.0 == id) {
                Some(flow) if key < flow.1 => *flow = (id, key, what),
                Some(_) => {}
                None => flows.push((id, key, what)),
            }
        }
        let heads: Vec<(&str, (u64, u64))> = flows.iter().map(|f| (f.0, f.1)).collect();
        let chosen = match fairness {
            Fairness::GlobalStrict => global_strict_fairness_policy::pick(&heads),
            Fairness::RoundRobin => {
                round_robin_fairness_policy::pick(&heads, self.cursor(band, now_ms))
            }
        }?;
        flows.get(chosen).map(|f| f.2)
    }

    /// The request this VM would serve first from its own holdings in `band` (the band's
    /// fairness among its local flows, then their ordering).
    pub fn pick_local(&self, band: i32, now_ms: u64) -> Option<u32> {
        let fairness = self
            .config
            .band(band)
            .map(|b| b.fairness)
            .unwrap_or_default();
        let local = self
            .waiting
            .iter()
            .filter(|w| w.band == band)
            .map(|w| (w.fairness_id.as_str(), self.key(w), w.id));
        self.choose(band, fairness, local, now_ms)
    }

    /// The fairness id a band served last, Envoy-wide.
    fn cursor(&self, band: i32, now_ms: u64) -> Option<&str> {
        self.cursors
            .iter()
            .chain(self.fresh_others(now_ms).flat_map(|p| &p.cursors))
            .filter(|c| c.band == band)
            .max_by_key(|c| c.at_ms)
            .map(|c| c.fairness_id.as_str())
    }

    /// Takes a request out to dispatch it, moving its band's round-robin cursor.
    pub fn dispatch(&mut self, id: u32, now_ms: u64, store: &dyn SharedData) -> Option<Left> {
        let fairness_id = self
            .waiting
            .iter()
            .find(|w| w.id == id)?
            .fairness_id
            .clone();
        let left = self.remove(id, now_ms, store)?;
        let cursor = Cursor {
            band: left.band,
            fairness_id,
            at_ms: now_ms,
        };
        match self.cursors.iter_mut().find(|c| c.band == left.band) {
            Some(existing) => *existing = cursor,
            None => self.cursors.push(cursor),
        }
        Some(left)
    }

    /// Takes a request out without dispatching it (its client went away, or it was refused).
    pub fn remove(&mut self, id: u32, now_ms: u64, store: &dyn SharedData) -> Option<Left> {
        let index = self.waiting.iter().position(|w| w.id == id)?;
        let waiting = self.waiting.remove(index);
        self.unpublished = true;
        if let Err(error) =
            ledger::unreserve(store, &self.ledger_key(), waiting.band, waiting.bytes)
        {
            log::warn!("inference-picker: flow control: uncounting a held request: {error}");
        }
        Some(Left {
            id,
            band: waiting.band,
            waited_ms: now_ms.saturating_sub(waiting.arrived_ms),
        })
    }

    /// Requests whose TTL ran out, taken out, with the refusal each gets.
    pub fn expire(&mut self, now_ms: u64, store: &dyn SharedData) -> Vec<(Left, Dropped)> {
        let reason = if self.has_endpoints {
            Dropped::TtlExpired
        } else {
            Dropped::NoEndpointTtlExpired
        };
        let expired: Vec<u32> = self
            .waiting
            .iter()
            .filter(|w| self.facts(w).expires_ms <= now_ms)
            .map(|w| w.id)
            .collect();
        expired
            .into_iter()
            .filter_map(|id| self.remove(id, now_ms, store))
            .map(|left| (left, reason))
            .collect()
    }

    /// This VM's summary, for the other VMs.
    pub fn published(&self, now_ms: u64) -> Published {
        let mut flows: Vec<FlowHead> = Vec::new();
        for waiting in &self.waiting {
            let key = self.key(waiting);
            match flows
                .iter_mut()
                .find(|f| f.band == waiting.band && f.fairness_id == waiting.fairness_id)
            {
                Some(flow) => {
                    flow.count += 1;
                    flow.bytes = flow.bytes.saturating_add(waiting.bytes);
                    flow.head = flow.head.min(key);
                }
                None => flows.push(FlowHead {
                    band: waiting.band,
                    fairness_id: waiting.fairness_id.clone(),
                    count: 1,
                    bytes: waiting.bytes,
                    head: key,
                }),
            }
        }
        Published {
            vm: self.vm,
            stamp_ms: now_ms,
            flows,
            cursors: self.cursors.clone(),
        }
    }

    /// Requests and bytes this VM holds per band, every configured band listed.
    pub fn band_load(&self) -> Vec<BandLoad> {
        self.config
            .bands
            .iter()
            .map(|band| {
                self.waiting
                    .iter()
                    .filter(|w| w.band == band.priority)
                    .fold((band.priority, 0, 0), |(b, c, bytes), w| {
                        (b, c + 1, bytes + w.bytes)
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
