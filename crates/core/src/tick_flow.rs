//! One VM's timer side, written against the host traits so it runs natively in tests: elect
//! the scraper, share state between the worker VMs, scrape every pod's `/metrics`, ask
//! Kubernetes for the pool, and publish what a scrape round learned. The request side is
//! [`crate::request_flow`]; the host edge (`filter/`) only forwards callbacks to both.

use crate::config;
use crate::director::{Director, TickReport};
use crate::duration::duration_ms;
use crate::endpoint::Health;
use crate::hash::hash_bytes;
use crate::host::{CalloutAnswer, Clock, HostError, HttpCallouts, SharedData};
use crate::picker::{stats_prefix, Picker, PoolSlot};
use crate::protocol::DESTINATION_HEADER;
use crate::shared_state::{Coordinator, Role};
use hashbrown::{HashMap, HashSet};
use models::ModelLists;

mod models;
use std::collections::VecDeque;

/// One VM's configuration, loaded: every pool's director (in the picker) and tick flow, in the
/// same order, and the tick period.
pub struct Configured {
    pub picker: Picker,
    pub ticks: Vec<PoolTicks>,
    pub tick_ms: u32,
}

/// One pool's timer side: its tick flow, the prefix of its stats, and how often it ticks.
pub struct PoolTicks {
    pub flow: TickFlow,
    pub stats_prefix: String,
    pub interval_ms: u64,
}

/// The version of what VMs share (values and block hashes): a VM of another version uses
/// other keys.
const SHARED_FORMAT: u32 = 2;

/// Loads the plugin configuration for one VM; `vm_seed` must differ between VMs, or every
/// worker breaks ties alike. Warnings go to the log; the error says what to fix.
pub fn configure(text: &[u8], vm_seed: u64) -> Result<Configured, String> {
    let text = std::str::from_utf8(text)
        .map_err(|_| "invalid configuration: it is not UTF-8 text".to_owned())?;
    let set = config::load_set(text, vm_seed, false).map_err(|error| error.to_string())?;
    // A config update starts a fresh namespace, so old VMs' leases do not interfere; so does
    // a build that shares data in another format (or hashes prompt blocks another way).
    let base = format!(
        "inference-picker/{SHARED_FORMAT}/{:x}",
        hash_bytes(0, text.as_bytes())
    );
    let many = set.listed;
    let mut slots = Vec::with_capacity(set.pools.len());
    let mut ticks = Vec::with_capacity(set.pools.len());
    for pool in set.pools {
        for warning in &pool.config.warnings {
            log::warn!("inference-picker: pool {}: {warning}", pool.name);
        }
        let interval_ms = duration_ms(pool.config.pool.refresh_metrics_interval);
        // Each pool elects its own scraper and keeps its own shared state.
        let namespace = if many {
            format!("{base}/{}", pool.name)
        } else {
            base.clone()
        };
        let coordinator = Coordinator::new(&namespace, vm_seed, interval_ms);
        let models = pool.router_models();
        let mut director = Director::new(pool.config);
        if let Some(flow) = director.flow_control_mut() {
            flow.attach(&namespace, vm_seed);
        }
        ticks.push(PoolTicks {
            flow: TickFlow::new(Some(coordinator)),
            stats_prefix: stats_prefix(many.then_some(pool.name.as_str())),
            interval_ms,
        });
        let slot = PoolSlot {
            name: pool.name,
            director,
        };
        slots.push((slot, models));
    }
    let tick_ms = ticks.iter().map(|t| t.interval_ms).min().unwrap_or(1000);
    Ok(Configured {
        picker: Picker::new(slots, set.pool_header),
        ticks,
        tick_ms: u32::try_from(tick_ms).unwrap_or(u32::MAX),
    })
}

/// What a tick did, for the host edge's stats.
#[derive(Debug, Clone, PartialEq)]
pub struct TickOutcome {
    pub role: Role,
    pub now_ms: u64,
    pub report: TickReport,
    /// Another VM changed the pool's members (the stats must cover the new ones).
    pub members_changed: bool,
    /// The pool's models (from `models-data-source`) changed: the picker re-reads them.
    pub models_changed: bool,
}

/// What a callout's answer was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalloutOutcome {
    /// A `/metrics` scrape of endpoint `index`; `ok` when it gave usable metrics.
    Scraped { index: usize, ok: bool },
    /// The Kubernetes pod list; `changed` when members were added or removed.
    Discovered { changed: bool },
    /// A pod's model list; `changed` when the pool's models changed.
    Models { changed: bool },
    /// Not a call of ours (e.g. one sent before a reconfiguration).
    Unknown,
}

/// A scrape in flight: which endpoint, and which round sent it.
#[derive(Debug, Clone, Copy)]
struct Scrape {
    index: usize,
    round: u64,
}

/// Health transitions logged one line each in a tick; more make one summary line.
const DETAILED_TRANSITIONS: usize = 3;

/// Scrapes the host refused in the current interval: one summary line at the next tick.
#[derive(Debug, Default)]
struct UnsentLog {
    count: usize,
    first: Option<String>,
}

pub struct TickFlow {
    /// `None`: this VM is alone (or shared data failed) and does everything itself.
    coordinator: Option<Coordinator>,
    scrapes: HashMap<u32, Scrape>,
    targets: Vec<usize>,
    /// The current round's endpoints not sent yet, in order: sent as others answer, at most
    /// `window` in flight.
    queue: VecDeque<usize>,
    /// Scrapes in flight allowed now: `pool.maxScrapesInFlight`, lowered for the rest of a round
    /// to what the host accepted when it refused one.
    window: usize,
    /// Scrapes the host refused, by endpoint, until the host edge takes them for its stats.
    unsent: Vec<usize>,
    unsent_log: UnsentLog,
    last_tick_ms: u64,
    /// The current scrape round, when it started, whether it is still open, and how many of its
    /// scrapes are out.
    round: u64,
    round_started_ms: u64,
    round_open: bool,
    round_outstanding: usize,
    /// How long the last complete round took, from its tick to its last answer.
    last_round_ms: Option<u64>,
    /// The last round took longer than `metricsStalenessThreshold` (warned once per change).
    rounds_too_slow: bool,
    /// A scrape result arrived since the snapshot was last published.
    unpublished: bool,
    discovery_call: Option<u32>,
    next_discovery_ms: u64,
    /// Endpoints warned about for a `/metrics` page over `pool.maxMetricsBytes`; warned again
    /// only after a good scrape.
    oversized: HashSet<usize>,
    oversize_warnings: usize,
    /// `models-data-source`'s calls and sharing.
    models: ModelLists,
}

impl TickFlow {
    pub fn new(coordinator: Option<Coordinator>) -> Self {
        TickFlow {
            coordinator,
            scrapes: HashMap::new(),
            targets: Vec::new(),
            queue: VecDeque::new(),
            window: 0,
            unsent: Vec::new(),
            unsent_log: UnsentLog::default(),
            last_tick_ms: 0,
            round: 0,
            round_started_ms: 0,
            round_open: false,
            round_outstanding: 0,
            last_round_ms: None,
            rounds_too_slow: false,
            unpublished: false,
            discovery_call: None,
            next_discovery_ms: 0,
            oversized: HashSet::new(),
            oversize_warnings: 0,
            models: ModelLists::default(),
        }
    }

    /// How long the last complete scrape round took (ms), from its tick to its last answer.
    pub fn last_round_ms(&self) -> Option<u64> {
        self.last_round_ms
    }

    /// Endpoints whose scrape the host refused since the last call, for the stats (each is a
    /// failed scrape there).
    pub fn take_unsent(&mut self) -> std::vec::Drain<'_, usize> {
        self.unsent.drain(..)
    }

    pub fn role(&self) -> Role {
        self.coordinator
            .as_ref()
            .map_or(Role::Scraper, Coordinator::role)
    }

    pub fn coordinator(&self) -> Option<&Coordinator> {
        self.coordinator.as_ref()
    }

    /// Warnings logged so far about pages over `pool.maxMetricsBytes` (one per endpoint until
    /// it scrapes within the cap again).
    pub fn oversize_warnings(&self) -> usize {
        self.oversize_warnings
    }

    /// Scrapes sent and not answered yet (answers arrive or time out).
    pub fn scrapes_in_flight(&self) -> usize {
        self.scrapes.len()
    }

    pub fn on_tick(
        &mut self,
        host: &(impl SharedData + HttpCallouts + Clock),
        director: &mut Director,
    ) -> TickOutcome {
        self.last_tick_ms = host.now_ms().unwrap_or(self.last_tick_ms);
        let (role, members_changed) = self.coordinate(host, director);
        if let (Some(coordinator), Some(flow)) = (&self.coordinator, director.flow_control_mut()) {
            flow.set_peers(coordinator.others());
        }
        let report = director.on_tick(self.last_tick_ms);
        self.log_unsent();
        let mut models_changed = false;
        if role == Role::Scraper {
            // Every VM sees the same transitions; only the scraper logs them.
            log_health(&report);
            self.dispatch_discovery(host, director);
            self.scrape(host, director);
            self.models.send_when_due(host, director, self.last_tick_ms);
        } else {
            // Another VM holds the lease: it scrapes what this one had not sent yet.
            for index in self.queue.drain(..) {
                director.cancel_scrape(index);
            }
            models_changed = self.read_models(host, director, members_changed);
        }
        TickOutcome {
            role,
            now_ms: self.last_tick_ms,
            report,
            members_changed,
            models_changed,
        }
    }

    /// Reads the pool's models the scraping VM published; returns whether they changed.
    fn read_models(
        &mut self,
        store: &impl SharedData,
        director: &mut Director,
        members_changed: bool,
    ) -> bool {
        let Some(coordinator) = &self.coordinator else {
            return false;
        };
        let (now, namespace) = (self.last_tick_ms, coordinator.namespace());
        match self
            .models
            .apply_shared(store, namespace, director, now, members_changed)
        {
            Ok(changed) => changed,
            Err(error) => {
                log::debug!("inference-picker: reading the pool's models: {error}");
                false
            }
        }
    }

    /// Publishes this VM's in-flight counts and reads the other VMs' (flow control's fast
    /// ticks, between full ones).
    pub fn exchange_load(&mut self, store: &impl SharedData, director: &mut Director, now_ms: u64) {
        if let Some(coordinator) = &mut self.coordinator {
            if let Err(error) = coordinator.exchange_load(store, director.pool_mut(), now_ms) {
                log::debug!("inference-picker: exchanging in-flight counts: {error}");
            }
        }
    }

    /// Whether `token` is one of this flow's callouts (a scrape, a discovery call, or a
    /// `/v1/models` call).
    pub fn owns(&self, token: u32) -> bool {
        self.discovery_call == Some(token)
            || self.scrapes.contains_key(&token)
            || self.models.owns(token)
    }

    /// How much of the body of call `token`'s answer the core reads (the edge copies no more):
    /// `pool.maxMetricsBytes` of a scrape, a model list's limit, all of a discovery answer;
    /// `None` when the call is not this flow's.
    pub fn body_cap(&self, director: &Director, token: u32) -> Option<usize> {
        if self.discovery_call == Some(token) {
            Some(usize::MAX)
        } else if self.models.owns(token) {
            Some(models::MAX_MODELS_BYTES)
        } else if self.scrapes.contains_key(&token) {
            Some(director.settings().max_metrics_bytes)
        } else {
            None
        }
    }

    pub fn on_callout_response(
        &mut self,
        host: &(impl SharedData + HttpCallouts + Clock),
        director: &mut Director,
        token: u32,
        answer: &CalloutAnswer,
    ) -> CalloutOutcome {
        if self.discovery_call == Some(token) {
            self.discovery_call = None;
            let changed = self.on_discovery_response(host, director, answer);
            return CalloutOutcome::Discovered { changed };
        }
        if self.models.owns(token) {
            let namespace = self.coordinator.as_ref().map(Coordinator::namespace);
            let changed = self
                .models
                .on_answer(host, director, namespace, token, answer);
            return CalloutOutcome::Models { changed };
        }
        let Some(scrape) = self.scrapes.remove(&token) else {
            return CalloutOutcome::Unknown;
        };
        // Stamped on arrival, so the age other workers see is the real one.
        let now = host.now_ms().unwrap_or(self.last_tick_ms);
        let ok = record_scrape(answer, director, scrape.index, now);
        match ok {
            Scraped::Ok => {
                self.oversized.remove(&scrape.index);
            }
            Scraped::Oversized => {
                if self.oversized.insert(scrape.index) {
                    self.oversize_warnings += 1;
                    log::warn!(
                        "inference-picker: /metrics of {} is {} bytes, over pool.maxMetricsBytes ({}): not read, counted as a failed scrape (said once until it scrapes within the cap)",
                        director.address(scrape.index).unwrap_or("?"),
                        answer.body_size,
                        director.settings().max_metrics_bytes
                    );
                }
            }
            Scraped::Failed | Scraped::TimedOut => {}
        }
        let ok = ok == Scraped::Ok;
        self.unpublished = true;
        if scrape.round == self.round {
            self.round_outstanding = self.round_outstanding.saturating_sub(1);
        }
        if self.role() == Role::Scraper {
            self.send_scrapes(host, director);
        }
        self.close_round_when_done(host, director, now);
        CalloutOutcome::Scraped {
            index: scrape.index,
            ok,
        }
    }

    /// Elects the scraper, then shares the pool, the snapshot, in-flight counts and prefix
    /// picks between the VMs. Returns the role and whether another VM changed the members.
    fn coordinate(&mut self, store: &impl SharedData, director: &mut Director) -> (Role, bool) {
        let now = self.last_tick_ms;
        let Some(coordinator) = self.coordinator.as_mut() else {
            return (Role::Scraper, false);
        };
        let role = match coordinator.elect(store, now) {
            Ok((role, changed)) => {
                if changed {
                    log::debug!("inference-picker: this VM is now the {role:?}");
                }
                role
            }
            Err(error) => {
                // Without shared data every VM scrapes for itself, as if alone.
                log::warn!("inference-picker: shared data unavailable: {error}");
                return (Role::Scraper, false);
            }
        };
        let members_changed = match coordinator.take_members(store) {
            Ok(Some(members)) => {
                director.apply_members(&members);
                true
            }
            Ok(None) => false,
            Err(error) => {
                log::warn!("inference-picker: reading the pool: {error}");
                false
            }
        };
        if let Err(error) = share_state(coordinator, store, director, role, now) {
            log::warn!("inference-picker: sharing state: {error}");
        }
        (role, members_changed)
    }

    /// Asks the Kubernetes API for the pool's members, when due.
    fn dispatch_discovery(&mut self, host: &impl HttpCallouts, director: &Director) {
        let Some(discovery) = &director.settings().discovery else {
            return;
        };
        if self.discovery_call.is_some() || self.last_tick_ms < self.next_discovery_ms {
            return;
        }
        let interval_ms = duration_ms(discovery.interval);
        self.next_discovery_ms = self.last_tick_ms.saturating_add(interval_ms);
        let path = discovery.list_path();
        let authority = discovery.authority.as_deref().unwrap_or(&discovery.cluster);
        let bearer = discovery
            .bearer_token
            .as_ref()
            .map(|token| format!("Bearer {token}"));
        let mut headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", authority),
            ("accept", "application/json"),
        ];
        if let Some(bearer) = &bearer {
            headers.push(("authorization", bearer.as_str()));
        }
        let timeout = u32::try_from(interval_ms).unwrap_or(u32::MAX);
        match host.dispatch(&discovery.cluster, &headers, timeout) {
            Ok(token) => self.discovery_call = Some(token),
            Err(error) => log::warn!("inference-picker: discovery call not sent: {error}"),
        }
    }

    /// Applies the pod list and tells the other VMs; a failed call keeps the last known pool.
    fn on_discovery_response(
        &mut self,
        store: &impl SharedData,
        director: &mut Director,
        answer: &CalloutAnswer,
    ) -> bool {
        let Some(discovery) = director.settings().discovery.clone() else {
            return false;
        };
        let status = answer.status.as_deref();
        if status != Some(b"200".as_slice()) {
            log::warn!(
                "inference-picker: discovery failed ({}); keeping the last known pool",
                describe_status(status)
            );
            return false;
        }
        let found = answer
            .body
            .as_ref()
            .map_err(|error| error.to_string())
            .and_then(|body| discovery.endpoints(body));
        let found = match found {
            Ok(found) => found,
            Err(error) => {
                log::warn!("inference-picker: discovery: {error}; keeping the last known pool");
                return false;
            }
        };
        let (added, removed) = director.set_discovered(&found);
        if added.is_empty() && removed.is_empty() {
            return false;
        }
        log::info!("inference-picker: discovery: added {added:?}, removed {removed:?}");
        if let Some(coordinator) = self.coordinator.as_mut() {
            if let Err(error) = coordinator.publish_members(store, director.members()) {
                log::warn!("inference-picker: sharing the pool: {error}");
            }
        }
        true
    }

    /// On the scraper's tick: starts a round (every member without a scrape in flight) when the
    /// last one was all sent, or carries on with the last one when it outlasted the interval.
    fn scrape(&mut self, host: &(impl SharedData + HttpCallouts), director: &mut Director) {
        if self.queue.is_empty() {
            director.take_scrape_targets(&mut self.targets);
            self.round += 1;
            self.round_started_ms = self.last_tick_ms;
            self.round_open = true;
            self.round_outstanding = 0;
            self.window = director.settings().max_scrapes_in_flight;
            self.queue.extend(self.targets.iter().copied());
        } else if self.unpublished {
            // A round longer than the interval: the others get what it learned so far, once
            // per interval.
            self.publish(host, director);
        }
        self.send_scrapes(host, director);
        self.close_round_when_done(host, director, self.last_tick_ms);
    }

    /// Sends the round's next scrapes while fewer than `window` are in flight. A call the host
    /// refuses counts as a failed scrape in the stats; with none of ours in flight the call
    /// cannot be made at all (e.g. no such cluster) and the endpoint's scrape failed, otherwise
    /// the host is full: the endpoint is retried first, once another scrape answers.
    fn send_scrapes(&mut self, host: &impl HttpCallouts, director: &mut Director) {
        let settings = director.settings();
        let cluster = settings.metrics_cluster.clone();
        let path = settings.metrics_path.clone();
        let timeout = u32::try_from(duration_ms(settings.metrics_timeout)).unwrap_or(u32::MAX);
        while self.scrapes.len() < self.window {
            let Some(index) = self.queue.pop_front() else {
                break;
            };
            let Some(endpoint) = director.pool().get(index) else {
                continue;
            };
            if endpoint.removed {
                director.cancel_scrape(index);
                continue;
            }
            let address = endpoint.address.as_str();
            let headers = [
                (":method", "GET"),
                (":path", path.as_str()),
                (":authority", address),
                (DESTINATION_HEADER, address),
                ("accept", "text/plain"),
            ];
            match host.dispatch(&cluster, &headers, timeout) {
                Ok(token) => {
                    let round = self.round;
                    self.scrapes.insert(token, Scrape { index, round });
                    self.round_outstanding += 1;
                }
                Err(error) => {
                    if self.unsent_log.count == 0 {
                        self.unsent_log.first = Some(format!("{address}: {error}"));
                    }
                    self.unsent_log.count += 1;
                    self.unsent.push(index);
                    if self.scrapes.is_empty() {
                        director.on_scrape_failed(index);
                        self.unpublished = true;
                    } else {
                        self.queue.push_front(index);
                        self.window = self.scrapes.len();
                        break;
                    }
                }
            }
        }
    }

    /// When every scrape of the round was sent and has answered (or timed out): the round's
    /// duration, and the snapshot published (also for a late answer of an earlier round).
    fn close_round_when_done(&mut self, store: &impl SharedData, director: &Director, now: u64) {
        if self.round_outstanding > 0 || !self.queue.is_empty() {
            return;
        }
        if self.round_open {
            self.round_open = false;
            self.round_took(now.saturating_sub(self.round_started_ms), director);
        }
        if self.unpublished {
            self.publish(store, director);
        }
    }

    /// Notes a complete round's duration; warns when rounds start or stop outlasting the
    /// staleness threshold.
    fn round_took(&mut self, took: u64, director: &Director) {
        self.last_round_ms = Some(took);
        let settings = director.settings();
        let staleness = duration_ms(settings.metrics_staleness_threshold);
        let too_slow = took > staleness;
        if too_slow == self.rounds_too_slow {
            return;
        }
        self.rounds_too_slow = too_slow;
        if too_slow {
            log::warn!(
                "inference-picker: a scrape round of {} endpoints took {took}ms, longer than \
                 metricsStalenessThreshold ({staleness}ms): metrics go stale between scrapes; \
                 raise pool.maxScrapesInFlight ({}) or the threshold",
                self.targets.len(),
                settings.max_scrapes_in_flight
            );
        } else {
            log::info!(
                "inference-picker: scrape rounds are within metricsStalenessThreshold again"
            );
        }
    }

    /// Publishes the snapshot (the one place the scraper does): when a round completes, and
    /// once per interval during a round that outlasts it.
    fn publish(&mut self, store: &impl SharedData, director: &Director) {
        let Some(coordinator) = self.coordinator.as_mut() else {
            self.unpublished = false;
            return;
        };
        if coordinator.role() != Role::Scraper {
            return;
        }
        match coordinator.publish_snapshot(store, director.pool()) {
            Ok(()) => self.unpublished = false,
            Err(error) => log::warn!("inference-picker: sharing state: {error}"),
        }
    }

    /// One line for the scrapes the host refused since the last tick.
    fn log_unsent(&mut self) {
        let UnsentLog { count, first } = std::mem::take(&mut self.unsent_log);
        let first = first.unwrap_or_default();
        match count {
            0 => {}
            1 => log::warn!("inference-picker: scrape not sent: {first}"),
            _ => log::warn!(
                "inference-picker: {count} scrapes not sent in the last interval (first: \
                 {first}); each counts as a failed scrape"
            ),
        }
    }
}

/// Followers take in the scraper's snapshot; every VM exchanges in-flight counts and prefix
/// picks.
fn share_state(
    coordinator: &mut Coordinator,
    store: &impl SharedData,
    director: &mut Director,
    role: Role,
    now: u64,
) -> Result<(), HostError> {
    if role == Role::Follower {
        coordinator.apply_snapshot(store, director.pool_mut())?;
    }
    coordinator.exchange_load(store, director.pool_mut(), now)?;
    let mut own = Vec::new();
    director.take_learned(&mut own);
    for learned in coordinator.exchange_prefixes(store, &own)? {
        director.learn_remote(&learned);
    }
    Ok(())
}

/// How one `/metrics` answer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scraped {
    /// Usable metrics.
    Ok,
    /// Over `pool.maxMetricsBytes`: failed, and the body was never read.
    Oversized,
    /// Any other failure.
    Failed,
    /// Envoy gave up waiting (504, or no answer): the metrics age, several in a row fail.
    TimedOut,
}

/// Feeds one `/metrics` answer to the director. The body's size is known before it is
/// copied: one over `pool.maxMetricsBytes` ([`TickFlow::body_cap`]) is never read.
fn record_scrape(
    answer: &CalloutAnswer,
    director: &mut Director,
    index: usize,
    now: u64,
) -> Scraped {
    let status = answer.status.as_deref();
    let address = director.address(index).unwrap_or("?").to_owned();
    if status != Some(b"200".as_slice()) {
        log::debug!(
            "inference-picker: scrape of {address} failed: {}",
            describe_status(status)
        );
        // A refused connection is Envoy's 503 and leaves at once; a slow pod is not dead.
        if matches!(status, None | Some(b"504")) {
            director.on_scrape_timed_out(index);
            return Scraped::TimedOut;
        }
        director.on_scrape_failed(index);
        return Scraped::Failed;
    }
    if answer.body_size > director.settings().max_metrics_bytes {
        director.on_scrape_failed(index);
        return Scraped::Oversized;
    }
    let body = match &answer.body {
        Ok(body) => body,
        Err(error) => {
            log::warn!("inference-picker: reading scrape of {address}: {error}");
            director.on_scrape_failed(index);
            return Scraped::Failed;
        }
    };
    match director.on_scrape_ok(index, now, &String::from_utf8_lossy(body)) {
        Ok(None) => Scraped::Ok,
        Ok(Some(warning)) => {
            log::warn!("inference-picker: {warning}");
            Scraped::Ok
        }
        Err(error) => {
            log::debug!("inference-picker: scrape of {address}: {error}");
            Scraped::Failed
        }
    }
}

fn describe_status(status: Option<&[u8]>) -> String {
    status.map_or("no response (timeout or reset)".to_owned(), |s| {
        format!("status {}", String::from_utf8_lossy(s))
    })
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
            "inference-picker: no endpoint has fresh metrics; routing by in-flight requests"
        ),
        Some(false) => {
            log::info!("inference-picker: endpoints have fresh metrics; scoring on them")
        }
        None => {}
    }
}

#[cfg(test)]
mod tests;
