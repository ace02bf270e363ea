//! One pool's data layer: its members and what calling them taught this VM. It owns the
//! pool's endpoints and every callout round (`/metrics` scrapes, Kubernetes discovery,
//! `models-data-source`'s model lists): their schedule, their answers and their back-off, and
//! it is the one writer of scraped state (`tests/architecture.rs` holds every other room to
//! reading it). The director reads the pool to pick and counts what it placed; the tick
//! hands in what the other VMs shared.

pub mod discovery_calls;
mod models;
mod scrapes;

pub use models::{ModelLists, ModelsChange, MAX_MODELS_BYTES};
pub use scrapes::{describe_status, Scraped, MAX_PROBE_BACKOFF_MS};

use crate::config::{FilterConfig, LoadSignals, PoolConfig};
use crate::discovery::Discovered;
use crate::duration::duration_ms;
use crate::endpoint::{EndpointState, Health, HealthTransition, Pool};
use crate::host::{CalloutAnswer, HttpCallouts, SharedData};
use crate::metrics::{EndpointMetrics, ExtractError};
use discovery_calls::DiscoveryCalls;
use scrapes::Scrapes;
use std::collections::BTreeMap;

/// A pool with no request placed or in flight for this long is idle: its pods are scraped every
/// `pool.idleRefreshMetricsInterval` until the next request.
pub const IDLE_AFTER_MS: u64 = 10_000;

/// The pool's members in index order, as VMs share them: `(address, labels, removed)`.
pub type Members = Vec<(String, BTreeMap<String, String>, bool)>;

/// What a callout's answer was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalloutOutcome {
    /// A `/metrics` scrape of endpoint `index`, and how it went.
    Scraped { index: usize, scraped: Scraped },
    /// The Kubernetes pod list; `changed` when members were added or removed.
    Discovered { changed: bool },
    /// A pod's model list; `changed` when the pool's models changed.
    Models { changed: bool },
    /// A peer replica's state (see [`crate::peers`]).
    Peer,
    /// Not a call of ours (e.g. one sent before a reconfiguration).
    Unknown,
}

/// What an answer asks of the VMs' shared state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToShare {
    /// The scrape snapshot (a round completed with results the others have not seen).
    pub snapshot: bool,
    /// The members (discovery changed them).
    pub members: bool,
}

pub struct DataLayer {
    pool: Pool,
    settings: PoolConfig,
    /// The first endpoints come from `pool.endpoints` and are never removed by discovery.
    static_count: usize,
    scrapes: Scrapes,
    discovery: DiscoveryCalls,
    models: ModelLists,
    /// No endpoint has fresh metrics (announced once per change).
    all_unfresh: bool,
    /// A request was placed here since the last call-out (the request path reads no clock).
    placed_since_call_out: bool,
    /// Requests this VM placed here since it started (the other VMs see it grow).
    placed: u64,
    /// Until when the pool counts as in use; set at the first call-out.
    in_use_until_ms: Option<u64>,
    /// The pods are scraped at the idle pace.
    idle: bool,
}

impl DataLayer {
    /// The pool's configured members, not scraped yet; `config`'s extractors and model source.
    pub fn new(config: &mut FilterConfig) -> Self {
        let endpoints: Vec<EndpointState> = config
            .pool
            .canonical_endpoints()
            .into_iter()
            .map(|(address, labels)| EndpointState::new(address, labels))
            .collect();
        let static_count = endpoints.len();
        DataLayer {
            pool: Pool::new(endpoints)
                .with_default_engine(config.default_engine.clone())
                .with_live_load(config.pool.load_signals == LoadSignals::Live)
                .with_replicas(config.pool.replicas),
            settings: config.pool.clone(),
            static_count,
            scrapes: Scrapes::new(std::mem::take(&mut config.metric_selectors)),
            discovery: DiscoveryCalls::default(),
            models: ModelLists::new(config.models_source.take()),
            // Nothing is scraped yet: not worth a warning until metrics were fresh once.
            all_unfresh: true,
            placed_since_call_out: false,
            placed: 0,
            in_use_until_ms: None,
            idle: false,
        }
    }

    /// A data layer over `pool` as it is, for tests that build pools by hand.
    #[cfg(test)]
    pub fn from_pool(pool: Pool, settings: PoolConfig) -> Self {
        DataLayer {
            static_count: pool.len(),
            pool,
            settings,
            scrapes: Scrapes::default(),
            discovery: DiscoveryCalls::default(),
            models: ModelLists::default(),
            all_unfresh: true,
            placed_since_call_out: false,
            placed: 0,
            in_use_until_ms: None,
            idle: false,
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn settings(&self) -> &PoolConfig {
        &self.settings
    }

    pub fn address(&self, index: usize) -> Option<&str> {
        self.pool.get(index).map(|e| e.address.as_str())
    }

    pub fn models(&self) -> &ModelLists {
        &self.models
    }

    /// Scrapes sent and not answered yet (answers arrive or time out).
    pub fn scrapes_in_flight(&self) -> usize {
        self.scrapes.in_flight()
    }

    /// How long the last complete scrape round took (ms), from its tick to its last answer.
    pub fn last_round_ms(&self) -> Option<u64> {
        self.scrapes.last_round_ms()
    }

    /// Warnings logged so far about pages over `pool.maxMetricsBytes`.
    pub fn oversize_warnings(&self) -> usize {
        self.scrapes.oversize_warnings()
    }

    /// Endpoints whose scrape the host refused since the last call, for the stats.
    pub fn take_unsent(&mut self) -> std::vec::Drain<'_, usize> {
        self.scrapes.take_unsent()
    }

    /// Ages every endpoint's metrics at the tick; the health changes, and whether the pool
    /// entered (true) or left (false) the "no fresh metrics anywhere" state.
    pub fn refresh_health(&mut self, now_ms: u64) -> (Vec<HealthTransition>, Option<bool>) {
        let staleness = duration_ms(self.settings.metrics_staleness_threshold);
        let transitions = self.pool.refresh_health(now_ms, staleness);
        let all_unfresh = !self
            .pool
            .endpoints
            .iter()
            .any(|e| e.health == Health::Fresh);
        let changed = (all_unfresh != self.all_unfresh).then_some(all_unfresh);
        self.all_unfresh = all_unfresh;
        self.scrapes.log_unsent();
        (transitions, changed)
    }

    /// The scraping VM's tick: discovery, a scrape round and a model-list round when due.
    /// Returns whether a round outlasting the interval, or one just complete, should publish
    /// its snapshot now.
    pub fn call_out(&mut self, host: &impl HttpCallouts, now_ms: u64) -> bool {
        if let Some(discovery) = &self.settings.discovery {
            self.discovery.send_when_due(host, discovery, now_ms);
        }
        self.pace_scrapes(now_ms);
        let mid_round = self.scrapes.start_or_continue_round(
            host,
            &mut self.pool,
            &self.settings,
            now_ms,
            self.idle,
        );
        self.models
            .send_when_due(host, &self.pool, &self.settings, now_ms);
        mid_round || self.scrapes.round_done(&self.settings, now_ms)
    }

    /// Whether this pool is idle: no request placed here since the last call-out, none in
    /// flight anywhere this VM knows of (its own, the other VMs', the peers'), and none shared
    /// with it (see [`DataLayer::note_use`]) for [`IDLE_AFTER_MS`]. An idle pool's pods are
    /// scraped at the idle pace; the first sign of use brings every pod's next scrape forward
    /// to this round.
    fn pace_scrapes(&mut self, now_ms: u64) {
        let used = std::mem::take(&mut self.placed_since_call_out)
            || self.pool.endpoints.iter().any(|e| e.total_in_flight() > 0);
        let in_use_until = self
            .in_use_until_ms
            .get_or_insert(now_ms.saturating_add(IDLE_AFTER_MS));
        if used {
            *in_use_until = now_ms.saturating_add(IDLE_AFTER_MS);
        }
        let slower = self.settings.idle_scrape_interval() > self.settings.scrape_interval();
        let idle = slower && now_ms >= *in_use_until;
        if idle == self.idle {
            return;
        }
        self.idle = idle;
        if idle {
            log::info!(
                "inference-picker: no request for {}s: scraping every {}ms until the next one",
                IDLE_AFTER_MS / 1000,
                duration_ms(self.settings.idle_scrape_interval())
            );
        } else {
            self.scrapes.wake(&mut self.pool);
            log::info!(
                "inference-picker: requests again: scraping every {}ms",
                duration_ms(self.settings.scrape_interval())
            );
        }
    }

    /// Requests this VM placed here since it started.
    pub fn placed(&self) -> u64 {
        self.placed
    }

    /// Another VM or a peer placed requests on this pool (their placements reached this VM):
    /// it is in use, even if those requests ended before any tick saw them in flight.
    pub fn note_use(&mut self) {
        self.placed_since_call_out = true;
    }

    /// Which pods this replica scrapes (the others' metrics come from its peers), and how
    /// many replicas share the pods, this one included (see [`crate::peers`]).
    pub fn set_scrape_share(&mut self, share: &[bool], replicas: u32) {
        self.scrapes.set_share(share);
        self.pool.set_peer_replicas(replicas);
    }

    /// How many replicas share the pods (a VM that does not speak to the peers hears it from
    /// the one that does).
    pub fn set_peer_replicas(&mut self, replicas: u32) {
        self.pool.set_peer_replicas(replicas);
    }

    /// Another VM holds the lease: the scrapes this one had not sent are its to send.
    pub fn hand_over(&mut self) {
        self.scrapes.hand_over();
    }

    pub fn owns(&self, token: u32) -> bool {
        self.body_cap(token).is_some()
    }

    /// How much of the body of call `token`'s answer is read (the edge copies no more):
    /// `pool.maxMetricsBytes` of a scrape, a model list's limit, all of a discovery answer;
    /// `None` when the call is not this pool's.
    pub fn body_cap(&self, token: u32) -> Option<usize> {
        if self.discovery.owns(token) {
            Some(usize::MAX)
        } else if self.models.owns(token) {
            Some(models::MAX_MODELS_BYTES)
        } else if self.scrapes.owns(token) {
            Some(self.settings.max_metrics_bytes)
        } else {
            None
        }
    }

    /// A callout's answer: applied to the pool, and what it asks to share. `models_key` is
    /// where the model lists are shared (none when this VM is alone).
    pub fn on_answer(
        &mut self,
        (callouts, store): (&impl HttpCallouts, &impl SharedData),
        token: u32,
        answer: &CalloutAnswer,
        now_ms: u64,
        scraping: bool,
        models_key: Option<&str>,
    ) -> (CalloutOutcome, ToShare) {
        if self.discovery.owns(token) {
            let changed = self.on_discovery_answer(answer);
            let share = ToShare {
                members: changed,
                ..ToShare::default()
            };
            return (CalloutOutcome::Discovered { changed }, share);
        }
        if self.models.owns(token) {
            let rooms = (&self.pool, &self.settings);
            let changed =
                self.models
                    .on_answer((callouts, store), rooms, models_key, token, answer);
            return (CalloutOutcome::Models { changed }, ToShare::default());
        }
        let answer = self.scrapes.on_answer(
            callouts,
            &mut self.pool,
            &self.settings,
            token,
            answer,
            now_ms,
            scraping,
        );
        match answer {
            Some((index, scraped, snapshot)) => (
                CalloutOutcome::Scraped { index, scraped },
                ToShare {
                    snapshot,
                    ..ToShare::default()
                },
            ),
            None => (CalloutOutcome::Unknown, ToShare::default()),
        }
    }

    pub fn mark_published(&mut self) {
        self.scrapes.mark_published();
    }

    fn on_discovery_answer(&mut self, answer: &CalloutAnswer) -> bool {
        let Some(discovery) = &self.settings.discovery else {
            return false;
        };
        let Some(found) = self.discovery.on_answer(answer, discovery) else {
            return false;
        };
        let (added, removed) = self.set_discovered(&found);
        if added.is_empty() && removed.is_empty() {
            return false;
        }
        log::info!("inference-picker: discovery: added {added:?}, removed {removed:?}");
        true
    }

    /// Applies what discovery found: the configured static endpoints always stay. Returns the
    /// addresses added and removed.
    pub fn set_discovered(&mut self, discovered: &[Discovered]) -> (Vec<String>, Vec<String>) {
        self.pool.set_members(discovered, self.static_count)
    }

    /// The pool's members in index order, for the other VMs.
    pub fn members(&self) -> Members {
        self.pool
            .endpoints
            .iter()
            .map(|e| (e.address.clone(), e.labels.clone(), e.removed))
            .collect()
    }

    /// Applies another VM's membership list, keeping the same index order.
    pub fn apply_members(&mut self, members: &Members) {
        let listed: Vec<Discovered> = members
            .iter()
            .map(|(address, labels, _)| (address.clone(), labels.clone()))
            .collect();
        self.pool.set_members(&listed, self.static_count);
        for (address, _, removed) in members {
            if let Some(index) = self.pool.index_of(address) {
                if let Some(endpoint) = self.pool.endpoints.get_mut(index) {
                    endpoint.removed = *removed && index >= self.static_count;
                }
            }
        }
    }

    /// The model lists the scraping VM shared; returns whether the pool's models changed.
    pub fn apply_shared_models(
        &mut self,
        store: &impl SharedData,
        key: &str,
        now_ms: u64,
        members_changed: bool,
    ) -> bool {
        match self
            .models
            .apply_shared(store, key, &self.pool, now_ms, members_changed)
        {
            Ok(changed) => changed,
            Err(error) => {
                log::debug!("inference-picker: reading the pool's models: {error}");
                false
            }
        }
    }

    /// A scrape result the scraping VM or a peer replica shared: metrics taken at `ok_ms`, or a
    /// failure. Older results than the ones already held are ignored. A peer's carries the
    /// fleet's in-flight counts when it sent the scrape (`at_scrape`), so what was placed since
    /// is counted from then, not from when it arrived.
    pub fn apply_shared_scrape(
        &mut self,
        address: &str,
        ok_ms: Option<u64>,
        failed: bool,
        metrics: &EndpointMetrics,
        at_scrape: Option<(u32, u64)>,
    ) {
        if let Some(index) = self.pool.index_of(address) {
            self.pool
                .apply_shared(index, ok_ms, failed, metrics, at_scrape);
        }
    }

    /// The other VMs' in-flight counts, summed per endpoint (index order).
    pub fn set_remote_in_flight(&mut self, sums: &[(u32, u64)]) {
        for (index, endpoint) in self.pool.endpoints.iter_mut().enumerate() {
            let (requests, tokens) = sums.get(index).copied().unwrap_or((0, 0));
            endpoint.remote_in_flight = requests;
            endpoint.remote_in_flight_tokens = tokens;
        }
    }

    /// A request of `tokens` was placed on `index`.
    pub fn add_in_flight(&mut self, index: usize, tokens: u64) {
        self.placed_since_call_out = true;
        self.placed += 1;
        self.pool.add_in_flight(index, tokens);
    }

    /// That request ended, however it ended.
    pub fn end_in_flight(&mut self, index: usize, tokens: u64) {
        self.pool.end_in_flight(index, tokens);
    }

    /// A request routed to `index` failed at the pod: avoid it until `until_ms`. Returns true
    /// if it was not already avoided.
    pub fn avoid(&mut self, index: usize, until_ms: u64) -> bool {
        self.pool.back_off(index, until_ms)
    }

    /// `index` answered one of this worker's requests now (see `EndpointState::routable`).
    pub fn answered(&mut self, index: usize) {
        self.pool.answered(index);
    }

    /// A `/metrics` body for endpoint `index`, as if a scrape had answered it now (the CLI's
    /// `explain`, the benches and tests feed metrics this way).
    pub fn scrape_answered(
        &mut self,
        index: usize,
        now_ms: u64,
        body: &str,
    ) -> Result<(), ExtractError> {
        self.scrapes
            .ok(&mut self.pool, &self.settings, index, now_ms, body)
    }

    /// What endpoint `index` reported at its model list, as if its `/v1/models` had answered
    /// so now.
    #[cfg(test)]
    pub fn models_answered(&mut self, index: usize, models: Vec<String>) -> ModelsChange {
        self.models.set_endpoint_models(&self.pool, index, models)
    }

    /// Every pod's reported model list, as another VM would apply it.
    #[cfg(test)]
    pub fn apply_reported_models(&mut self, reported: &[(String, Vec<String>)]) -> ModelsChange {
        self.models.apply_reported(&self.pool, reported)
    }

    /// A scrape of endpoint `index` failed, as if a scrape had answered so now.
    #[cfg(test)]
    pub fn scrape_failed(&mut self, index: usize) {
        self.scrapes.failed(&mut self.pool, &self.settings, index);
    }
}
