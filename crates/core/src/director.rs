//! The director: one VM's picker state: the pool, the scheduler and the scrape bookkeeping.
//! Plain data in, plain data out; the host edge feeds it ticks, scrape bodies and requests.

use crate::config::{FilterConfig, LoadSignals, PoolConfig};
use crate::duration::duration_ms;
use crate::endpoint::{EndpointState, Health, HealthTransition, Pool};
use crate::error_response::RequestError;
use crate::flow_control::{Arrival, FlowControl, Pick};
use crate::host::SharedData;
use crate::metrics::{self, ExtractError, MetricSelector};
use crate::protocol::{
    PROFILE_HEADER, SESSION_TOKEN_HEADER, SLO_TTFT_HEADER, TEST_SELECTION_HEADER,
};
use crate::request::{
    parse_body_keeping, rewrite_model, ApiKind, InferenceRequest, RequestHeaders,
};
use crate::scheduling::plugins::{self, scorer::session_affinity_scorer, Data};
use crate::scheduling::{ScheduleError, Scheduler};
use hashbrown::HashMap;

/// Which optional protocol headers the configuration reads: each is a host call per request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderUse {
    /// `x-session-token`, for `session-affinity-scorer` (which also returns it).
    pub session_token: bool,
    /// `test-epp-endpoint-selection`, for `header-based-testing-filter`.
    pub test_selection: bool,
    /// `x-gateway-inference-objective`, when `pool.objectives` declares any.
    pub objective: bool,
    /// `epp-profile`, for `header-profile-handler`.
    pub profile: bool,
    /// The SLO headers, for `predicted-latency-producer` and flow control's SLO ordering.
    pub slo: bool,
}

impl HeaderUse {
    /// Headers either reads (a request's pool is known only after its body).
    pub fn union(self, other: HeaderUse) -> HeaderUse {
        HeaderUse {
            session_token: self.session_token || other.session_token,
            test_selection: self.test_selection || other.test_selection,
            objective: self.objective || other.objective,
            profile: self.profile || other.profile,
            slo: self.slo || other.slo,
        }
    }
}

/// Ticks a saturation change must hold before it is announced.
pub const SATURATION_TICKS_TO_ANNOUNCE: u32 = 2;

/// The longest wait between probes of a failing endpoint.
pub const MAX_PROBE_BACKOFF_MS: u64 = 5_000;

/// What changed on a tick, for the log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickReport {
    pub transitions: Vec<HealthTransition>,
    /// The pool entered (true) or left (false) the "no fresh metrics anywhere" state.
    pub all_unfresh: Option<bool>,
    /// The pool became saturated (true) or not (false), per the saturation detector.
    pub saturated: Option<bool>,
}

/// A parsed request, ready to be picked for (now, or when flow control releases it).
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub request: InferenceRequest,
    /// The body to forward instead of the client's (after a model rewrite).
    pub rewritten_body: Option<Vec<u8>>,
    /// The client's body size, which a rewrite replaces.
    pub body_size: usize,
}

/// What flow control says about a request that is ready to be picked for.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Pick now.
    Now(Box<Prepared>),
    /// Held: its stream stays paused until a [`Release`] names it.
    Held,
    /// Refused without waiting (the queue is full).
    Refused(RequestError),
}

/// A held request's way out of the queue, for the host edge to carry out.
#[derive(Debug, PartialEq)]
pub enum Release {
    /// Picked: write the decision into the held stream and resume it.
    Routed {
        id: u32,
        request_id: String,
        routed: Box<Routed>,
        body_size: usize,
        waited_ms: u64,
    },
    /// Refused (TTL, no endpoint after filters): answer the held stream with the error.
    Refused {
        id: u32,
        request_id: String,
        error: RequestError,
        waited_ms: u64,
    },
}

/// What a model list changed: one pod's list, and the pool's models as a whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelsChange {
    pub pod: bool,
    pub pool: bool,
}

/// The routing outcome handed back to the host edge.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// The primary's `ip:port`: the destination header and metadata value.
    pub destination: String,
    /// The other picks, best first, comma-separated (`maxNumOfEndpoints > 1`); may be empty.
    pub fallbacks: String,
    /// The destination header's value: the primary, or with `pool.destinationList` the
    /// primary and the fallbacks.
    pub header: String,
    /// Pool index of the primary endpoint, whose in-flight count was raised.
    pub primary: usize,
    /// Tokens accounted to the primary until the request ends.
    pub tokens: u64,
    /// `ip:port` of the prefill endpoint when the request is disaggregated.
    pub prefill: Option<String>,
    /// The value for the response's `x-session-token`, when session affinity is configured.
    pub session_token: Option<String>,
    /// The body to forward instead of the client's (after a model rewrite).
    pub rewritten_body: Option<Vec<u8>>,
    pub model: String,
    pub priority: i32,
    /// Set when no endpoint had fresh metrics.
    pub degraded: bool,
    /// The prompt's blocks, kept while Envoy may retry on a fallback: the pod that serves it
    /// learns them.
    pub prompt_blocks: Option<Vec<u64>>,
    /// `x-gateway-destination-endpoint-scores`, with `pool.emitEndpointScores`.
    pub scores: Option<String>,
}

pub struct Director {
    pool: Pool,
    scheduler: Scheduler,
    settings: PoolConfig,
    selectors: Vec<MetricSelector>,
    /// Per endpoint: a scrape is in flight, so the next tick does not pile another on.
    scrape_pending: Vec<bool>,
    all_unfresh: bool,
    /// The saturation last announced, and ticks in a row that disagreed with it.
    saturated: bool,
    saturation_streak: u32,
    /// The optional protocol headers this configuration uses; the others are never read.
    header_use: HeaderUse,
    /// Per custom selector: its label mismatch was already reported.
    selector_warned: Vec<bool>,
    /// The first endpoints come from `pool.endpoints` and are never removed by discovery.
    static_count: usize,
    /// Flow control, when the `flowControl` gate is on; the requests it holds, and those it
    /// released whose streams have not yet taken their decision back.
    flow: Option<FlowControl>,
    held: HashMap<u32, (Prepared, String)>,
    dispatched: HashMap<u32, Routed>,
    /// Refusals of held requests waiting for a root callback to send them.
    deferred: Vec<Release>,
    /// With `models-data-source`: where each pod's model list is read, what each pod last
    /// reported (by pool index), and the pool's union of them.
    models_source: Option<crate::config::ModelsSource>,
    endpoint_models: Vec<Option<Vec<String>>>,
    /// With flow control, which endpoints have room now (reused per request).
    room: Vec<bool>,
    served_models: Vec<String>,
}

impl Director {
    pub fn new(config: FilterConfig) -> Self {
        let endpoints: Vec<EndpointState> = config
            .pool
            .canonical_endpoints()
            .into_iter()
            .map(|(address, labels)| EndpointState::new(address, labels))
            .collect();
        let count = endpoints.len();
        let reads_header = |name: &'static str| {
            config.scheduler.plugins().iter().any(|p| {
                plugins::spec(p.type_name)
                    .is_some_and(|spec| spec.consumes(Data::RequestHeader(name)))
            })
        };
        let header_use = HeaderUse {
            session_token: reads_header(SESSION_TOKEN_HEADER),
            test_selection: reads_header(TEST_SELECTION_HEADER),
            profile: reads_header(PROFILE_HEADER),
            // The latency plugins and flow control's SLO ordering read the same header once.
            slo: reads_header(SLO_TTFT_HEADER)
                || config
                    .flow_control
                    .as_ref()
                    .is_some_and(|flow| flow.orders_by_slo()),
            objective: !config.pool.objectives.is_empty(),
        };
        Director {
            static_count: count,
            header_use,
            selector_warned: vec![false; config.metric_selectors.len()],
            pool: Pool::new(endpoints)
                .with_default_engine(config.default_engine.clone())
                .with_live_load(config.pool.load_signals == LoadSignals::Live)
                .with_replicas(config.pool.replicas),
            scheduler: config.scheduler,
            settings: config.pool,
            selectors: config.metric_selectors,
            scrape_pending: vec![false; count],
            // Nothing is scraped yet: not worth a warning until metrics were fresh once.
            all_unfresh: true,
            saturated: false,
            saturation_streak: 0,
            flow: config.flow_control.map(|flow| FlowControl::new(flow, 0)),
            held: HashMap::new(),
            dispatched: HashMap::new(),
            deferred: Vec::new(),
            models_source: config.models_source,
            endpoint_models: Vec::new(),
            room: Vec::new(),
            served_models: Vec::new(),
        }
    }

    /// Characters of a prompt's text this pool's plugins read.
    pub fn prompt_chars_needed(&self) -> usize {
        self.scheduler.prompt_chars_needed()
    }

    pub fn models_source(&self) -> Option<&crate::config::ModelsSource> {
        self.models_source.as_ref()
    }

    /// The models the pool's pods report (sorted), with `models-data-source`.
    pub fn served_models(&self) -> &[String] {
        &self.served_models
    }

    /// What endpoint `index` reported at its model list. A removed endpoint's models no
    /// longer count.
    pub fn set_endpoint_models(&mut self, index: usize, models: Vec<String>) -> ModelsChange {
        if self.endpoint_models.len() < self.pool.len() {
            self.endpoint_models.resize(self.pool.len(), None);
        }
        let pod = match self.endpoint_models.get_mut(index) {
            Some(slot) if slot.as_ref() != Some(&models) => {
                *slot = Some(models);
                true
            }
            _ => false,
        };
        ModelsChange {
            pod,
            pool: self.recompute_served_models(),
        }
    }

    /// Endpoint `index` gave no usable model list: it keeps what it reported last, or serves
    /// nothing if it never reported (so a pod that never answers cannot hold the pool's list).
    pub fn mark_unanswered(&mut self, index: usize) -> ModelsChange {
        let reported = self.endpoint_models.get(index).is_some_and(Option::is_some);
        if reported {
            return ModelsChange::default();
        }
        self.set_endpoint_models(index, Vec::new())
    }

    /// Each endpoint's reported models, `(address, models)`, for the other VMs.
    pub fn reported_models(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.endpoint_models
            .iter()
            .zip(&self.pool.endpoints)
            .filter_map(|(models, endpoint)| Some((endpoint.address.as_str(), models.as_deref()?)))
    }

    /// The scraping VM's [`Director::reported_models`] (published after whole rounds: a pod it
    /// does not list serves nothing).
    pub fn apply_reported_models(&mut self, reported: &[(String, Vec<String>)]) -> ModelsChange {
        let before = std::mem::take(&mut self.endpoint_models);
        self.endpoint_models
            .resize(self.pool.len(), Some(Vec::new()));
        for (address, models) in reported {
            if let Some(slot) = self
                .pool
                .index_of(address)
                .and_then(|index| self.endpoint_models.get_mut(index))
            {
                *slot = Some(models.clone());
            }
        }
        ModelsChange {
            pod: before != self.endpoint_models,
            pool: self.recompute_served_models(),
        }
    }

    /// Whether the pods' model lists narrow the candidates for `model`: only when the pool
    /// learns its models and some pod reports it (a name only the configuration lists is
    /// served by every pod).
    fn narrowed_by_model(&self, model: &str) -> bool {
        self.models_source.is_some()
            && (0..self.pool.len()).any(|index| reports(&self.endpoint_models, index, model))
    }

    /// The pool members a subset hint names (addresses outside the pool name none).
    fn subset_mask(&self, addresses: &[String]) -> Vec<bool> {
        let mut mask = vec![false; self.pool.len()];
        for address in addresses {
            let canonical = crate::endpoint::canonical_address(address).ok();
            let index = canonical.and_then(|address| self.pool.index_of(&address));
            if let Some(slot) = index.and_then(|index| mask.get_mut(index)) {
                *slot = true;
            }
        }
        mask
    }

    fn recompute_served_models(&mut self) -> bool {
        let reported = self.endpoint_models.iter().zip(&self.pool.endpoints);
        let mut union: Vec<String> = Vec::new();
        let mut all_reported = true;
        for (models, _) in reported.filter(|(_, endpoint)| !endpoint.removed) {
            match models {
                Some(models) => union.extend(models.iter().cloned()),
                None => all_reported = false,
            }
        }
        // Until every pod has answered once (a VM taking over the scraping), the models the
        // pool served so far stay: a partial round must not make models vanish.
        if !all_reported {
            union.extend(self.served_models.iter().cloned());
        }
        union.sort();
        union.dedup();
        self.set_served_models(union)
    }

    fn set_served_models(&mut self, models: Vec<String>) -> bool {
        if models == self.served_models {
            return false;
        }
        self.served_models = models;
        true
    }

    pub fn flow_control(&self) -> Option<&FlowControl> {
        self.flow.as_ref()
    }

    pub fn flow_control_mut(&mut self) -> Option<&mut FlowControl> {
        self.flow.as_mut()
    }

    /// Flow control's gate for a band: the pool's saturation is below the band's ceiling (the
    /// usage limit). Also tells the queue whether the pool has an endpoint at all (which TTL
    /// applies).
    fn has_room(&mut self, band_priority: i32, now_ms: u64) -> bool {
        let saturation = self.scheduler.pool_saturation(&self.pool, now_ms);
        let Some(flow) = self.flow.as_mut() else {
            return true;
        };
        flow.set_has_endpoints(saturation.is_some(), now_ms);
        let ceiling = flow.config().band(band_priority).map_or(1.0, |b| b.ceiling);
        saturation.is_some_and(|s| s < ceiling)
    }

    /// The pool's saturation as flow control sees it (for the gauge and `explain`).
    pub fn pool_saturation(&self, now_ms: u64) -> Option<f64> {
        self.scheduler.pool_saturation(&self.pool, now_ms)
    }

    /// Flow control's say on a parsed request: pick now (gate off, or room in its band and
    /// nothing waiting in it or a higher band anywhere), hold it as `id`, or refuse it (queue
    /// full).
    pub fn admit(
        &mut self,
        prepared: Prepared,
        arrival: Arrival,
        now_ms: u64,
        store: &dyn SharedData,
    ) -> Admission {
        let priority = arrival.priority;
        let room = self.has_room(priority, now_ms);
        let Some(flow) = self.flow.as_mut() else {
            return Admission::Now(Box::new(prepared));
        };
        if room && flow.clear_for(priority, now_ms) {
            return Admission::Now(Box::new(prepared));
        }
        // Engaged: what the other VMs hold decides whether this one may pass them.
        if let Err(error) = flow.refresh(store) {
            log::debug!("inference-picker: flow control: reading the other VMs' queues: {error}");
        }
        if room && flow.clear_for(priority, now_ms) {
            return Admission::Now(Box::new(prepared));
        }
        let (id, request_id) = (arrival.id, arrival.request_id.clone());
        match flow.admit(arrival, now_ms, store) {
            Ok(()) => {
                self.held.insert(id, (prepared, request_id));
                Admission::Held
            }
            Err(dropped) => Admission::Refused(RequestError::Dropped(dropped)),
        }
    }

    /// Held requests that leave the queue now: those whose TTL ran out, then, while the pool
    /// has room, the next by priority, fairness and order (each picked for at once, so the
    /// next look at the room counts it).
    ///
    /// When the next request Envoy-wide is held by another VM, this VM serves its own best
    /// request of the same band instead (a free slot never idles for want of the right
    /// worker; the order across VMs bends a little, priority never); with nothing of that
    /// band here it leaves the slot to the other VM, which takes it on its next callback or
    /// tick.
    pub fn releases(&mut self, now_ms: u64, store: &dyn SharedData, out: &mut Vec<Release>) {
        // Whether the pool has an endpoint decides which TTL applies.
        self.has_room(0, now_ms);
        let Some(flow) = self.flow.as_mut() else {
            return;
        };
        for (left, dropped) in flow.expire(now_ms, store) {
            let request_id = self.held.remove(&left.id).map(|h| h.1).unwrap_or_default();
            out.push(Release::Refused {
                id: left.id,
                request_id,
                error: RequestError::Dropped(dropped),
                waited_ms: left.waited_ms,
            });
        }
        let bound = self.held.len() + 1;
        for _ in 0..bound {
            let Some((band, pick)) = self.flow.as_ref().and_then(|flow| flow.pick(now_ms)) else {
                return;
            };
            // The first band over its ceiling stops the round: lower bands never pass it.
            if !self.has_room(band, now_ms) {
                return;
            }
            let Some(flow) = self.flow.as_mut() else {
                return;
            };
            let id = match pick {
                Pick::Local(id) => id,
                Pick::Remote(_) => match flow.pick_local(band, now_ms) {
                    Some(id) => id,
                    None => return,
                },
            };
            let left = flow.dispatch(id, now_ms, store);
            let Some(left) = left else {
                return;
            };
            let Some((prepared, request_id)) = self.held.remove(&left.id) else {
                continue;
            };
            let body_size = prepared.body_size;
            out.push(match self.route_prepared(prepared) {
                Ok(routed) => Release::Routed {
                    id: left.id,
                    request_id,
                    routed: Box::new(routed),
                    body_size,
                    waited_ms: left.waited_ms,
                },
                Err(error) => Release::Refused {
                    id: left.id,
                    request_id,
                    error,
                    waited_ms: left.waited_ms,
                },
            });
        }
    }

    /// A held request's client went away: it leaves the queue; returns how long it waited.
    pub fn abandon(&mut self, id: u32, now_ms: u64, store: &dyn SharedData) -> Option<u64> {
        self.held.remove(&id);
        let left = self.flow.as_mut()?.remove(id, now_ms, store)?;
        Some(left.waited_ms)
    }

    /// A refusal to send from the next root callback.
    pub fn defer(&mut self, release: Release) {
        self.deferred.push(release);
    }

    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// The refusals deferred so far, to send now.
    pub fn take_deferred(&mut self, out: &mut Vec<Release>) {
        out.append(&mut self.deferred);
    }

    /// The host edge resumed a released request; its stream takes the decision back later.
    pub fn record_dispatched(&mut self, id: u32, routed: Routed) {
        self.dispatched.insert(id, routed);
    }

    pub fn take_dispatched(&mut self, id: u32) -> Option<Routed> {
        self.dispatched.remove(&id)
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// For the shared-state exchange on ticks.
    pub fn pool_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }

    pub fn settings(&self) -> &PoolConfig {
        &self.settings
    }

    pub fn header_use(&self) -> HeaderUse {
        self.header_use
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Recomputes health; reports the changes worth a log line.
    pub fn on_tick(&mut self, now_ms: u64) -> TickReport {
        let staleness = duration_ms(self.settings.metrics_staleness_threshold);
        let transitions = self.pool.refresh_health(now_ms, staleness);
        let all_unfresh = !self
            .pool
            .endpoints
            .iter()
            .any(|e| e.health == Health::Fresh);
        let unfresh_changed = (all_unfresh != self.all_unfresh).then_some(all_unfresh);
        self.all_unfresh = all_unfresh;
        let saturated = self.scheduler.pool_saturated(&self.pool, now_ms);
        let saturation_changed = self.announce_saturation(saturated);
        TickReport {
            transitions,
            all_unfresh: unfresh_changed,
            saturated: saturation_changed,
        }
    }

    /// A change of the pool's saturation is announced once it held for
    /// [`SATURATION_TICKS_TO_ANNOUNCE`] ticks in a row: one scrape round on the edge would
    /// otherwise flap the warning on and off.
    fn announce_saturation(&mut self, saturated: bool) -> Option<bool> {
        if saturated == self.saturated {
            self.saturation_streak = 0;
            return None;
        }
        self.saturation_streak += 1;
        if self.saturation_streak < SATURATION_TICKS_TO_ANNOUNCE {
            return None;
        }
        self.saturation_streak = 0;
        self.saturated = saturated;
        Some(saturated)
    }

    /// A request routed to `routed.primary` failed at the pod (5xx or no connection): avoid
    /// the pod for `pool.passiveHealthBackoff`. Returns true when that starts a back-off.
    pub fn report_upstream_failure(&mut self, routed: &Routed) -> bool {
        let until = self
            .pool
            .now_ms()
            .saturating_add(duration_ms(self.settings.passive_health_backoff));
        self.pool.back_off(routed.primary, until)
    }

    /// The response to a routed request arrived; `served` is where its last upstream attempt
    /// went (Envoy's `upstream.address`) and `failed` says the response is a 5xx. Envoy's
    /// override_host policy gives attempt n the n-th address of the destination list, so every
    /// listed endpoint before `served` failed to take the request (refused, reset, 503), and
    /// `served` too when the answer is a 5xx (the primary when `served` is unknown). Each is
    /// avoided for `pool.passiveHealthBackoff`; the addresses whose back-off this starts are
    /// returned. A request served by a fallback moves its in-flight count there.
    pub fn report_response(
        &mut self,
        routed: &mut Routed,
        served: Option<&str>,
        failed: bool,
    ) -> Vec<String> {
        // The usual answer: the first pick served it. Nothing to avoid or move, nothing to
        // allocate.
        if !failed && served.is_none_or(|served| served == routed.destination) {
            return Vec::new();
        }
        let listed: Vec<&str> = std::iter::once(routed.destination.as_str())
            .chain(routed.fallbacks.split(',').filter(|a| !a.is_empty()))
            .collect();
        let position = served.and_then(|served| listed.iter().position(|a| *a == served));
        let mut unreachable: Vec<&str> =
            listed.iter().take(position.unwrap_or(0)).copied().collect();
        if failed {
            let answered = position.and_then(|p| listed.get(p)).copied();
            unreachable.push(answered.unwrap_or(routed.destination.as_str()));
        }
        let until = self
            .pool
            .now_ms()
            .saturating_add(duration_ms(self.settings.passive_health_backoff));
        let mut started = Vec::new();
        for address in unreachable {
            if let Some(index) = self.pool.index_of(address) {
                if self.pool.back_off(index, until) {
                    started.push(address.to_owned());
                }
            }
        }
        let moved = position
            .filter(|p| *p > 0)
            .and(served)
            .and_then(|served| self.pool.index_of(served));
        if let Some(index) = moved {
            self.pool.release_in_flight(routed.primary, routed.tokens);
            self.pool.add_in_flight(index, routed.tokens);
            routed.primary = index;
            if let Some(hashes) = routed.prompt_blocks.take() {
                let learned = crate::scheduling::LearnedPrefix {
                    endpoint: index,
                    hashes,
                };
                self.scheduler.learn_served(&learned);
            }
        }
        started
    }

    /// Endpoints to scrape now (members without a scrape already in flight), marked pending.
    pub fn take_scrape_targets(&mut self, out: &mut Vec<usize>) {
        out.clear();
        self.scrape_pending.resize(self.pool.len(), false);
        for ((index, pending), endpoint) in self
            .scrape_pending
            .iter_mut()
            .enumerate()
            .zip(&self.pool.endpoints)
        {
            let due = endpoint.next_probe_ms.max(endpoint.next_scrape_ms) <= self.pool.now_ms();
            if !*pending && !endpoint.removed && due {
                *pending = true;
                out.push(index);
            }
        }
        // With several replicas each scrapes a pod once per `replicas` ticks (see
        // `PoolConfig::replicas`); the ticks themselves keep the configured interval, so the
        // workers still share their load and picks that often. Half a tick of slack: a tick
        // may come a little early.
        let rest_ms = if self.settings.replicas > 1 {
            duration_ms(self.settings.scrape_interval())
                .saturating_sub(duration_ms(self.settings.refresh_metrics_interval) / 2)
        } else {
            0
        };
        let next_ms = self.pool.now_ms().saturating_add(rest_ms);
        for &index in out.iter() {
            self.pool.mark_scrape_sent(index);
            if let Some(endpoint) = self.pool.endpoints.get_mut(index) {
                endpoint.next_scrape_ms = next_ms;
            }
        }
    }

    /// Applies what discovery found (or what the scraping worker published): the configured
    /// static endpoints always stay. Returns the addresses added and removed.
    pub fn set_discovered(
        &mut self,
        discovered: &[crate::discovery::Discovered],
    ) -> (Vec<String>, Vec<String>) {
        let changes = self.pool.set_members(discovered, self.static_count);
        self.scrape_pending.resize(self.pool.len(), false);
        changes
    }

    /// The pool's members in index order, for the other workers: `(address, labels, removed)`.
    pub fn members(&self) -> Vec<(String, std::collections::BTreeMap<String, String>, bool)> {
        self.pool
            .endpoints
            .iter()
            .map(|e| (e.address.clone(), e.labels.clone(), e.removed))
            .collect()
    }

    /// Applies another worker's membership list, keeping the same index order.
    pub fn apply_members(
        &mut self,
        members: &[(String, std::collections::BTreeMap<String, String>, bool)],
    ) {
        let listed: Vec<crate::discovery::Discovered> = members
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
        self.scrape_pending.resize(self.pool.len(), false);
    }

    pub fn address(&self, index: usize) -> Option<&str> {
        self.pool.get(index).map(|e| e.address.as_str())
    }

    /// A scrape answered 200 with `body`. Returns a warning, once per extractor, when an
    /// extractor's metric is there but its label filter matches none of its series.
    pub fn on_scrape_ok(
        &mut self,
        index: usize,
        now_ms: u64,
        body: &str,
    ) -> Result<Option<String>, ExtractError> {
        self.clear_pending(index);
        let Some(endpoint) = self.pool.get(index) else {
            return Ok(None);
        };
        let cap = self.settings.max_metrics_bytes;
        match metrics::extract_within(endpoint.engine, body, &self.selectors, cap) {
            Ok((snapshot, _, unmatched)) => {
                let warning = self.label_mismatch_warning(&unmatched, index);
                self.pool.record_scrape_ok(index, now_ms, snapshot);
                Ok(warning)
            }
            Err(error) => {
                self.pool.record_scrape_failure(index);
                Err(error)
            }
        }
    }

    fn label_mismatch_warning(&mut self, unmatched: &[usize], index: usize) -> Option<String> {
        let mut warning = String::new();
        for &slot in unmatched {
            let (Some(warned), Some(selector)) =
                (self.selector_warned.get_mut(slot), self.selectors.get(slot))
            else {
                continue;
            };
            if !*warned {
                *warned = true;
                let address = self.pool.get(index).map_or("?", |e| e.address.as_str());
                warning.push_str(&format!(
                    "{} has series on {address} but none with labels {:?}; metric scorers treat it as missing (worst score). ",
                    selector.metric_name, selector.labels
                ));
            }
        }
        (!warning.is_empty()).then(|| warning.trim_end().to_owned())
    }

    /// A scrape could not be sent, timed out, or answered non-200.
    pub fn on_scrape_failed(&mut self, index: usize) {
        self.clear_pending(index);
        self.pool.record_scrape_failure(index);
        self.back_off_probes(index);
    }

    /// A scrape timed out (Envoy's 504, or no answer): the endpoint's metrics age; repeated
    /// timeouts count as a failure. Returns true when this one did.
    pub fn on_scrape_timed_out(&mut self, index: usize) -> bool {
        self.clear_pending(index);
        let failed = self.pool.record_scrape_timeout(index);
        if failed {
            self.back_off_probes(index);
        }
        failed
    }

    /// A failing endpoint is probed again after one interval, then two, four... up to
    /// [`MAX_PROBE_BACKOFF_MS`]: a dead pod costs a scrape every few seconds, not every tick.
    fn back_off_probes(&mut self, index: usize) {
        let interval = duration_ms(self.settings.scrape_interval()).max(1);
        let now = self.pool.now_ms();
        if let Some(endpoint) = self.pool.endpoints.get_mut(index) {
            let doublings = endpoint.scrape_failures_in_a_row.saturating_sub(1).min(16);
            let backoff = interval
                .saturating_mul(1 << doublings)
                .min(MAX_PROBE_BACKOFF_MS);
            endpoint.next_probe_ms = now.saturating_add(backoff);
        }
    }

    /// A target taken for a round that will not be sent after all (the VM lost the lease):
    /// nothing is recorded, and it is a target again.
    pub fn cancel_scrape(&mut self, index: usize) {
        self.clear_pending(index);
    }

    fn clear_pending(&mut self, index: usize) {
        if let Some(pending) = self.scrape_pending.get_mut(index) {
            *pending = false;
        }
    }

    /// Parses the body (if the API has one) and picks the endpoints. On success the primary's
    /// in-flight count is raised; the caller must `release` it when the request ends.
    pub fn route(
        &mut self,
        api: ApiKind,
        body: Option<&[u8]>,
        headers: RequestHeaders,
    ) -> Result<Routed, RequestError> {
        let prepared = self.prepare(api, body, headers)?;
        self.route_prepared(prepared)
    }

    /// Parses the body and resolves the model rewrite and priority: everything but the pick.
    pub fn prepare(
        &mut self,
        api: ApiKind,
        body: Option<&[u8]>,
        headers: RequestHeaders,
    ) -> Result<Prepared, RequestError> {
        let limit = self.settings.max_request_body_bytes;
        // Before parsing: an oversized body is never read (`complete_prepared` checks again
        // for the pool chosen after a parse).
        if body.is_some_and(|body| api.is_inference() && body.len() > limit) {
            return Err(RequestError::BodyTooLarge { limit });
        }
        let keep = self.prompt_chars_needed();
        let mut prepared = parse_prepared(api, body, headers, keep)?;
        self.complete_prepared(&mut prepared)?;
        Ok(prepared)
    }

    /// This pool's part of preparing a parsed request: its body limit and the objective's
    /// priority.
    pub fn complete_prepared(&self, prepared: &mut Prepared) -> Result<(), RequestError> {
        let limit = self.settings.max_request_body_bytes;
        if prepared.body_size > limit {
            return Err(RequestError::BodyTooLarge { limit });
        }
        let objective = prepared.request.headers.objective.as_deref();
        prepared.request.priority = self.settings.priority_of(objective);
        Ok(())
    }

    pub fn route_prepared(&mut self, prepared: Prepared) -> Result<Routed, RequestError> {
        let mut routed = self.route_parsed(&prepared.request)?;
        routed.rewritten_body = prepared.rewritten_body;
        Ok(routed)
    }

    pub fn route_parsed(&mut self, request: &InferenceRequest) -> Result<Routed, RequestError> {
        // With flow control on, sheddable requests wait in their band like the others.
        if request.priority < 0
            && self.flow.is_none()
            && self
                .scheduler
                .pool_saturated(&self.pool, self.pool.now_ms())
        {
            return Err(RequestError::Shed(format!(
                "the pool is saturated and the request is sheddable (priority {})",
                request.priority
            )));
        }
        // The candidates, narrowed by the proxy's subset hint and, with `models-data-source`,
        // to the pods that report serving the model; nothing is allocated without a hint.
        let subset = request
            .headers
            .subset_hint
            .as_deref()
            .map(|a| self.subset_mask(a));
        let by_model = self.narrowed_by_model(&request.model);
        // Flow control let the request go because some pod has room: it goes to one of those,
        // not behind a full pod's queue, which would hold up a high-priority request.
        let mut room = std::mem::take(&mut self.room);
        let by_room = self.flow.is_some()
            && self
                .scheduler
                .endpoints_with_room(&self.pool, self.pool.now_ms(), &mut room);
        let (reported, model) = (&self.endpoint_models, request.model.as_str());
        let eligible = |index: usize| {
            subset
                .as_ref()
                .is_none_or(|mask| mask.get(index) == Some(&true))
                && (!by_model || reports(reported, index, model))
                && (!by_room || room.get(index) == Some(&true))
        };
        let scheduled = self.scheduler.schedule_where(request, &self.pool, eligible);
        self.room = room;
        let decision = scheduled.map_err(|error| match error {
            ScheduleError::NoReachableEndpoint => RequestError::NoEndpoint(error.to_string()),
            ScheduleError::FilteredOut { .. } => RequestError::TooManyRequests(error.to_string()),
            ScheduleError::NotAdmitted => RequestError::Shed(error.to_string()),
        })?;
        let targets = decision.targets();
        let primary = *targets
            .first()
            .ok_or_else(|| RequestError::NoEndpoint("the scheduler picked no endpoint".into()))?;
        let destination = self.address(primary).unwrap_or_default().to_owned();
        let mut fallbacks = String::new();
        for address in targets.iter().skip(1).filter_map(|&t| self.address(t)) {
            if !fallbacks.is_empty() {
                fallbacks.push(',');
            }
            fallbacks.push_str(address);
        }
        // Cached prompt blocks take no new KV space on the pod.
        let cached = u64::from(self.scheduler.last_cycle().cached_tokens(primary));
        let tokens = request.total_tokens().saturating_sub(cached);
        self.pool.add_in_flight(primary, tokens);
        let prefill = decision
            .prefill_endpoint()
            .and_then(|index| self.address(index))
            .map(str::to_owned);
        let session_token = self
            .header_use
            .session_token
            .then(|| session_affinity_scorer::token_for(self.address(primary).unwrap_or("")));
        let prompt_blocks = (!fallbacks.is_empty())
            .then(|| self.scheduler.last_prompt_blocks().map(<[u64]>::to_vec))
            .flatten();
        let scores = self
            .settings
            .emit_endpoint_scores
            .then(|| self.scheduler.scores_json(&self.pool));
        let header = if self.settings.destination_list && !fallbacks.is_empty() {
            format!("{destination},{fallbacks}")
        } else {
            destination.clone()
        };
        Ok(Routed {
            destination,
            fallbacks,
            header,
            primary,
            tokens,
            prefill,
            session_token,
            rewritten_body: None,
            model: request.model.clone(),
            priority: request.priority,
            degraded: decision.degraded,
            prompt_blocks,
            scores,
        })
    }

    /// The request routed to `routed.primary` ended (completed, reset or failed).
    pub fn release(&mut self, routed: &Routed) {
        self.pool.release_in_flight(routed.primary, routed.tokens);
    }

    /// A random RFC 4122 version-4 UUID, for requests that arrive without `x-request-id`.
    pub fn new_request_id(&mut self) -> String {
        let high = self.scheduler.random_u64();
        let low = self.scheduler.random_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0x0fff,
            ((low >> 48) & 0x3fff) | 0x8000,
            low & 0xffff_ffff_ffff
        )
    }

    /// Prefix-index entries learned here since the last call.
    pub fn take_learned(&mut self, out: &mut Vec<crate::scheduling::LearnedPrefix>) {
        self.scheduler.take_learned(out);
    }

    /// Replays prefix-index entries another worker learned.
    pub fn learn_remote(&mut self, learned: &crate::scheduling::LearnedPrefix) {
        if learned.endpoint < self.pool.len() {
            self.scheduler.learn_remote(learned);
        }
    }

    /// The last decision, row by row (the config checker prints these).
    pub fn explain_rows(&self) -> Vec<crate::scheduling::ExplainRow<'_>> {
        self.scheduler.explain_rows(&self.pool)
    }

    /// Every scorer's score for the last decision, for the debug log.
    pub fn explain_last(&self) -> String {
        self.scheduler.explain(&self.pool)
    }
}

/// Whether endpoint `index` reported serving `model` (each list is sorted).
fn reports(reported: &[Option<Vec<String>>], index: usize, model: &str) -> bool {
    reported
        .get(index)
        .and_then(Option::as_ref)
        .is_some_and(|models| models.binary_search_by(|m| m.as_str().cmp(model)).is_ok())
}

/// Parses the body (if the API has one) and applies the model rewrite: the part of preparing
/// a request that needs no pool.
/// Only the first `keep_chars` characters of the prompt's text are kept (see
/// [`parse_body_keeping`]).
pub fn parse_prepared(
    api: ApiKind,
    body: Option<&[u8]>,
    headers: RequestHeaders,
    keep_chars: usize,
) -> Result<Prepared, RequestError> {
    let mut request = match (api.is_inference(), body) {
        (true, Some(body)) => parse_body_keeping(api, body, keep_chars)?,
        (true, None) => parse_body_keeping(api, &[], keep_chars)?,
        (false, _) => InferenceRequest::empty(),
    };
    let rewritten_body = match (&headers.model_rewrite, body) {
        (Some(model), Some(body)) if api.is_inference() && *model != request.model => {
            request.model.clone_from(model);
            Some(rewrite_model(body, model)?)
        }
        _ => None,
    };
    request.headers = headers;
    Ok(Prepared {
        request,
        rewritten_body,
        body_size: body.map_or(0, <[u8]>::len),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;
    use crate::harness::test;

    const CONFIG: &str = "
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
pool:
  endpoints:
  - address: 10.0.0.1:8000
  - address: 10.0.0.2:8000
  - address: 10.0.0.3:8000
";

    fn director() -> Director {
        Director::new(load(CONFIG, 7).unwrap())
    }

    fn scrape(director: &mut Director, index: usize, queue: u32, kv: f64) {
        let body = format!("vllm:num_requests_waiting {queue}\nvllm:kv_cache_usage_perc {kv}\n");
        director.on_scrape_ok(index, 1000, &body).unwrap();
    }

    const BODY: &[u8] = br#"{"model":"m","prompt":"hi"}"#;

    fn route(
        director: &mut Director,
        api: ApiKind,
        body: Option<&[u8]>,
    ) -> Result<Routed, RequestError> {
        director.route(api, body, RequestHeaders::default())
    }

    #[test]
    fn routes_to_shortest_queue_with_fallback_list() {
        let mut director = director();
        scrape(&mut director, 0, 5, 0.1);
        scrape(&mut director, 1, 0, 0.9);
        scrape(&mut director, 2, 2, 0.1);
        director.on_tick(1000);
        let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
        // queue: 0.0, 1.0, 0.6; kv: 0.9, 0.1, 0.9 -> totals 0.9, 1.1, 1.5
        assert_eq!(routed.destination, "10.0.0.3:8000");
        assert_eq!(routed.fallbacks, "10.0.0.2:8000");
        assert_eq!(routed.primary, 2);
        assert_eq!(director.pool().endpoints[2].in_flight, 1);
        assert_eq!(director.pool().endpoints[2].in_flight_tokens, 1 + 256);
        director.release(&routed);
        assert_eq!(director.pool().endpoints[2].in_flight, 0);
    }

    fn with_subset(subset: &[&str]) -> RequestHeaders {
        RequestHeaders {
            subset_hint: Some(subset.iter().map(|a| a.to_string()).collect()),
            ..RequestHeaders::default()
        }
    }

    #[test]
    fn the_subset_hint_narrows_the_pick_and_an_empty_one_is_503() {
        let mut director = director();
        for index in 0..3 {
            scrape(&mut director, index, index as u32, 0.1);
        }
        director.on_tick(1000);
        let api = ApiKind::Completions;
        // The best (shortest queue) is 10.0.0.1; the hint leaves only 10.0.0.3 and an address
        // outside the pool, which never becomes a candidate.
        let hint = with_subset(&["10.0.0.3:8000", "10.9.9.9:8000"]);
        let routed = director.route(api, Some(BODY), hint).unwrap();
        assert_eq!(routed.destination, "10.0.0.3:8000");
        assert_eq!(routed.fallbacks, "", "no fallback outside the subset");
        director.release(&routed);
        let error = director
            .route(api, Some(BODY), with_subset(&[]))
            .unwrap_err();
        assert_eq!(error.status(), 503);
        let outside = director.route(api, Some(BODY), with_subset(&["10.9.9.9:8000"]));
        assert_eq!(outside.unwrap_err().status(), 503);
        assert!(director.pool().endpoints.iter().all(|e| e.in_flight == 0));
        // Unreachable metrics everywhere: the degraded pick still stays within the hint.
        director.on_tick(1_000_000);
        let routed = director
            .route(api, Some(BODY), with_subset(&["10.0.0.2:8000"]))
            .unwrap();
        assert!(routed.degraded);
        assert_eq!(routed.destination, "10.0.0.2:8000");
    }

    #[test]
    fn with_a_models_source_only_pods_reporting_the_model_are_candidates() {
        let config = "featureGates: [dataLayer]\nplugins: [{type: queue-scorer}, {type: max-score-picker}, {type: models-data-source}]\npool: {endpoints: [{address: 10.0.0.1:8000}, {address: 10.0.0.2:8000}]}";
        let mut director = Director::new(load(config, 1).unwrap());
        scrape(&mut director, 0, 0, 0.1);
        scrape(&mut director, 1, 5, 0.1);
        director.on_tick(1000);
        director.set_endpoint_models(0, vec!["base".into()]);
        let change = director.set_endpoint_models(1, vec!["base".into(), "lora-x".into()]);
        assert_eq!(
            change,
            ModelsChange {
                pod: true,
                pool: true
            }
        );
        let same = director.set_endpoint_models(1, vec!["base".into(), "lora-x".into()]);
        assert_eq!(same, ModelsChange::default());
        assert_eq!(director.served_models(), ["base", "lora-x"]);
        let body = |model: &str| format!(r#"{{"model":"{model}","prompt":"hi"}}"#);
        let route = |director: &mut Director, model: &str| {
            let routed = director
                .route(
                    ApiKind::Completions,
                    Some(body(model).as_bytes()),
                    RequestHeaders::default(),
                )
                .unwrap();
            director.release(&routed);
            routed.destination
        };
        assert_eq!(
            route(&mut director, "base"),
            "10.0.0.1:8000",
            "shortest queue"
        );
        assert_eq!(
            route(&mut director, "lora-x"),
            "10.0.0.2:8000",
            "the only pod with it"
        );
        // Another VM applies what this one learned, pod by pod.
        let reported: Vec<(String, Vec<String>)> = director
            .reported_models()
            .map(|(a, m)| (a.to_owned(), m.to_vec()))
            .collect();
        let mut follower = Director::new(load(config, 2).unwrap());
        assert!(follower.apply_reported_models(&reported).pool);
        assert_eq!(follower.served_models(), ["base", "lora-x"]);
        assert!(follower.narrowed_by_model("lora-x"));
        let serving: Vec<bool> = (0..2)
            .map(|i| reports(&follower.endpoint_models, i, "lora-x"))
            .collect();
        assert_eq!(serving, [false, true]);
        assert!(
            !follower.narrowed_by_model("unlisted"),
            "no pod reports it: no restriction"
        );
    }

    #[test]
    fn a_request_served_by_a_fallback_teaches_the_prefix_to_the_server() {
        let config = "plugins: [{type: prefix-cache-scorer}, {type: queue-scorer}, {type: max-score-picker, parameters: {maxNumOfEndpoints: 2}}]\npool: {emitEndpointScores: true, endpoints: [{address: 10.0.0.1:8000}, {address: 10.0.0.2:8000}]}";
        let mut director = Director::new(load(config, 1).unwrap());
        scrape(&mut director, 0, 0, 0.1);
        scrape(&mut director, 1, 3, 0.1);
        director.on_tick(1000);
        let prompt = "a long shared system prompt ".repeat(40);
        let body = format!(r#"{{"model":"m","prompt":"{prompt}"}}"#);
        let mut routed = director
            .route(
                ApiKind::Completions,
                Some(body.as_bytes()),
                RequestHeaders::default(),
            )
            .unwrap();
        assert_eq!(
            (routed.primary, routed.fallbacks.as_str()),
            (0, "10.0.0.2:8000")
        );
        let scores: serde_json::Value =
            serde_json::from_str(routed.scores.as_deref().unwrap()).unwrap();
        assert!(
            scores["10.0.0.1:8000"].as_f64().unwrap() > scores["10.0.0.2:8000"].as_f64().unwrap()
        );
        let mut learned = Vec::new();
        director.take_learned(&mut learned);
        assert!(
            learned.iter().all(|l| l.endpoint == 0),
            "the pick taught the primary"
        );
        // Envoy retried it on the fallback, which answered.
        director.report_response(&mut routed, Some("10.0.0.2:8000"), false);
        assert_eq!(routed.primary, 1);
        director.take_learned(&mut learned);
        let served = learned
            .iter()
            .find(|l| l.endpoint == 1)
            .expect("the server learned it");
        assert!(!served.hashes.is_empty());
        assert_eq!(
            director.pool().endpoints[1].in_flight,
            1,
            "in flight where it is served"
        );
        assert_eq!(director.pool().endpoints[0].in_flight, 0);
    }

    #[test]
    fn scrape_failures_and_staleness_remove_endpoints() {
        let mut director = director();
        scrape(&mut director, 0, 0, 0.0);
        scrape(&mut director, 1, 9, 0.9);
        director.on_scrape_failed(2);
        director.on_tick(1000);
        for _ in 0..20 {
            let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
            assert!(
                !routed.destination.contains("10.0.0.3"),
                "{}",
                routed.destination
            );
        }
        // All metrics stale: still routed, to a reachable endpoint, flagged degraded.
        let report = director.on_tick(10_000);
        assert_eq!(report.all_unfresh, Some(true));
        let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
        assert!(routed.degraded);
        assert_ne!(routed.primary, 2);
        director.on_scrape_failed(0);
        director.on_scrape_failed(1);
        director.on_tick(10_000);
        let error = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap_err();
        assert_eq!(error.status(), 503);
    }

    #[test]
    fn bad_bodies_are_client_errors_and_take_no_slot() {
        let mut director = director();
        scrape(&mut director, 0, 0, 0.0);
        director.on_tick(1000);
        assert_eq!(
            route(&mut director, ApiKind::ChatCompletions, Some(b"{"))
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            route(&mut director, ApiKind::ChatCompletions, None)
                .unwrap_err()
                .status(),
            400
        );
        assert!(director.pool().endpoints.iter().all(|e| e.in_flight == 0));
        assert!(
            route(&mut director, ApiKind::Other, None).is_ok(),
            "GET /v1/models is routed"
        );
    }

    #[test]
    fn non_model_server_scrape_counts_as_failure() {
        let mut director = director();
        assert!(director.on_scrape_ok(0, 1000, "up 1\n").is_err());
        director.on_tick(1000);
        assert_eq!(director.pool().endpoints[0].health, Health::Unreachable);
    }

    #[test]
    fn an_infinite_queue_on_one_pod_leaves_the_queue_scorer_working_for_the_others() {
        let mut director = director();
        // Two 1e308 series: the sum overflows to +Inf.
        let hostile = "vllm:num_requests_waiting{m=\"a\"} 1e308\nvllm:num_requests_waiting{m=\"b\"} 1e308\nvllm:kv_cache_usage_perc 0.5\n";
        director.on_scrape_ok(0, 1000, hostile).unwrap();
        scrape(&mut director, 1, 7, 0.1);
        scrape(&mut director, 2, 1, 0.1);
        director.on_tick(1000);
        let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
        assert_eq!(routed.destination, "10.0.0.3:8000");
        assert_eq!(
            routed.fallbacks, "10.0.0.2:8000",
            "the unknown queue ranks last"
        );
        let queue_scores: Vec<(&str, f64)> = director
            .explain_rows()
            .iter()
            .map(|row| (row.address, row.scores[0].1))
            .collect();
        assert_eq!(
            queue_scores,
            [
                ("10.0.0.1:8000", 0.0),
                ("10.0.0.2:8000", 0.0),
                ("10.0.0.3:8000", 1.0)
            ]
        );
    }

    #[test]
    fn a_body_over_max_metrics_bytes_is_not_parsed_past_the_cap() {
        let mut director =
            Director::new(load(&format!("{CONFIG}  maxMetricsBytes: 4096\n"), 7).unwrap());
        let mut body = String::from("vllm:num_requests_waiting 0\n");
        body.push_str(&"# padding\n".repeat(410));
        assert!(body.len() > 4096);
        assert_eq!(
            director.on_scrape_ok(0, 1000, &body).unwrap_err(),
            ExtractError::TooLarge { limit: 4096 }
        );
        director.on_tick(1000);
        assert_eq!(director.pool().endpoints[0].health, Health::Unreachable);
    }

    #[test]
    fn scrape_targets_skip_pending_ones() {
        let mut director = director();
        let mut targets = Vec::new();
        director.take_scrape_targets(&mut targets);
        assert_eq!(targets, [0, 1, 2]);
        scrape(&mut director, 1, 0, 0.0);
        director.take_scrape_targets(&mut targets);
        assert_eq!(targets, [1]);
    }

    #[test]
    fn with_replicas_each_pod_is_scraped_once_per_replicas_ticks() {
        let config = CONFIG.replace("pool:\n", "pool:\n  replicas: 4\n");
        let mut director = Director::new(load(&config, 7).unwrap());
        let mut targets = Vec::new();
        director.on_tick(1000);
        director.take_scrape_targets(&mut targets);
        assert_eq!(targets, [0, 1, 2]);
        for index in 0..3 {
            scrape(&mut director, index, 0, 0.0);
        }
        // Ticks every 50ms; each pod is due again 4 x 50ms after its scrape was sent.
        for now in [1050, 1100, 1150] {
            director.on_tick(now);
            director.take_scrape_targets(&mut targets);
            assert!(targets.is_empty(), "{now}: {targets:?}");
        }
        director.on_tick(1200);
        director.take_scrape_targets(&mut targets);
        assert_eq!(targets, [0, 1, 2]);
    }

    #[test]
    fn discovery_adds_and_removes_but_keeps_static_endpoints() {
        let mut director = director();
        let labels = std::collections::BTreeMap::new;
        let found = vec![
            ("10.0.0.9:8000".to_string(), labels()),
            ("10.0.0.8:8000".to_string(), labels()),
        ];
        let (added, removed) = director.set_discovered(&found);
        assert_eq!(added, ["10.0.0.9:8000", "10.0.0.8:8000"]);
        assert!(removed.is_empty());
        assert_eq!(director.pool().len(), 5);
        for index in 0..4 {
            scrape(&mut director, index, 5, 0.5);
        }
        scrape(&mut director, 4, 0, 0.0);
        director.on_tick(1000);
        assert_eq!(
            route(&mut director, ApiKind::Completions, Some(BODY))
                .unwrap()
                .destination,
            "10.0.0.8:8000",
            "the idle discovered endpoint wins while it is listed"
        );
        let (added, removed) = director.set_discovered(&found[..1]);
        assert!(added.is_empty());
        assert_eq!(
            removed,
            ["10.0.0.8:8000"],
            "the three static endpoints stay"
        );
        let mut targets = Vec::new();
        director.take_scrape_targets(&mut targets);
        assert_eq!(targets, [0, 1, 2, 3], "removed endpoints are not scraped");
        // Another worker applies the list and ends up with the same indices.
        let mut other = self::director();
        other.apply_members(&director.members());
        assert_eq!(other.members(), director.members());
        director.on_tick(1000);
        for _ in 0..10 {
            let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
            assert_ne!(routed.destination, "10.0.0.8:8000");
        }
    }

    #[test]
    fn a_saturation_change_is_announced_once_it_holds_for_two_ticks() {
        let mut director = director();
        let load_all = |director: &mut Director, queue: u32, now: u64| {
            for index in 0..3 {
                director
                    .on_scrape_ok(
                        index,
                        now,
                        &format!(
                            "vllm:num_requests_waiting {queue}\nvllm:kv_cache_usage_perc 0.1\n"
                        ),
                    )
                    .unwrap();
            }
            director.on_tick(now).saturated
        };
        assert_eq!(load_all(&mut director, 0, 1000), None);
        assert_eq!(
            load_all(&mut director, 9, 1010),
            None,
            "one tick saturated: not yet"
        );
        assert_eq!(
            load_all(&mut director, 0, 1020),
            None,
            "and it passed: nothing said"
        );
        assert_eq!(load_all(&mut director, 9, 1030), None);
        assert_eq!(
            load_all(&mut director, 9, 1040),
            Some(true),
            "held two ticks"
        );
        assert_eq!(load_all(&mut director, 9, 1050), None);
        assert_eq!(load_all(&mut director, 0, 1060), None);
        assert_eq!(load_all(&mut director, 0, 1070), Some(false));
    }

    const FLOW: &str = "
featureGates: [flowControl]
plugins:
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
- {type: round-robin-fairness-policy, name: rr}
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
  defaultRequestTTL: 1s
  priorityBands: [{priority: 5, fairnessPolicyRef: rr}]
pool:
  objectives: [{name: batch, priority: -1}]
  endpoints:
  - address: 10.0.0.1:8000
";

    fn flow_arrival(id: u32) -> Arrival {
        Arrival {
            id,
            request_id: format!("r{id}"),
            priority: 0,
            fairness_id: "t".into(),
            bytes: BODY.len() as u64,
            slo_ttft_ms: None,
        }
    }

    #[test]
    fn flow_control_holds_while_saturated_and_releases_as_requests_end() {
        let store = crate::host::fake::FakeShared::default();
        let mut director = Director::new(load(FLOW, 7).unwrap());
        scrape(&mut director, 0, 0, 0.0);
        director.on_tick(1000);
        let prepare = |director: &mut Director| {
            let headers = RequestHeaders {
                objective: Some("batch".into()),
                ..RequestHeaders::default()
            };
            director
                .prepare(ApiKind::Completions, Some(BODY), headers)
                .unwrap()
        };
        let prepared = prepare(&mut director);
        let first = match director.admit(prepared, flow_arrival(1), 1000, &store) {
            Admission::Now(prepared) => director.route_prepared(*prepared).unwrap(),
            other => panic!("room: routed at once, got {other:?}"),
        };
        assert_eq!(
            first.priority, -1,
            "sheddable, yet not refused with flow control on"
        );
        for id in [2, 3] {
            let prepared = prepare(&mut director);
            let admitted = director.admit(prepared, flow_arrival(id), 1010, &store);
            assert_eq!(admitted, Admission::Held, "saturated: held");
        }
        let mut out = Vec::new();
        director.releases(1020, &store, &mut out);
        assert!(out.is_empty(), "still saturated: nothing leaves");
        director.release(&first);
        director.releases(1030, &store, &mut out);
        let [Release::Routed {
            id: 2,
            waited_ms: 20,
            routed,
            ..
        }] = &out[..]
        else {
            panic!("the first held goes when the slot frees: {out:?}");
        };
        director.record_dispatched(2, (**routed).clone());
        out.clear();
        director.releases(2011, &store, &mut out);
        let [Release::Refused { id: 3, error, .. }] = &out[..] else {
            panic!("the other expires after its TTL: {out:?}");
        };
        assert_eq!(error.status(), 429);
        assert!(director.take_dispatched(2).is_some());
        assert_eq!(director.abandon(3, 2100, &store), None, "already gone");
    }

    #[test]
    fn holdback_keeps_the_last_capacity_for_the_higher_band() {
        let store = crate::host::fake::FakeShared::default();
        let config = FLOW
            .replace("maxConcurrency: 1", "maxConcurrency: 4")
            .replace(
                "- {type: round-robin-fairness-policy, name: rr}",
                "- {type: round-robin-fairness-policy, name: rr}\n- type: priority-holdback-policy\n  parameters: {minCeiling: 0.5}",
            )
            .replace(
                "  defaultRequestTTL: 1s",
                "  defaultRequestTTL: 1s\n  usageLimitPolicyPluginRef: priority-holdback-policy",
            );
        let mut director = Director::new(load(&config, 7).unwrap());
        scrape(&mut director, 0, 0, 0.0);
        director.on_tick(1000);
        let ceilings: Vec<(i32, f64)> = director
            .flow_control()
            .unwrap()
            .config()
            .bands
            .iter()
            .map(|b| (b.priority, b.ceiling))
            .collect();
        assert_eq!(ceilings, vec![(5, 1.0), (0, 0.75), (-1, 0.5)]);
        let admit = |director: &mut Director, id: u32, priority: i32| {
            let prepared = director
                .prepare(ApiKind::Completions, Some(BODY), RequestHeaders::default())
                .unwrap();
            let arrival = Arrival {
                priority,
                ..flow_arrival(id)
            };
            match director.admit(prepared, arrival, 1000, &store) {
                Admission::Now(prepared) => Some(director.route_prepared(*prepared).unwrap()),
                _ => None,
            }
        };
        // Band 0 stops at 3 of 4 slots (0.75); band 5 may take the fourth.
        for id in 1..=3 {
            assert!(
                admit(&mut director, id, 0).is_some(),
                "band 0 under its ceiling"
            );
        }
        assert!(
            admit(&mut director, 4, 0).is_none(),
            "band 0 at its ceiling waits"
        );
        assert!(
            admit(&mut director, 5, 5).is_some(),
            "band 5 takes the held-back slot"
        );
    }
}
