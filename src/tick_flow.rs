//! One VM's timer side, written against the host traits so it runs natively in tests: elect
//! the scraper, share state between the worker VMs, scrape every pod's `/metrics`, ask
//! Kubernetes for the pool, and publish what a scrape round learned. The request side is
//! [`crate::request_flow`]; the host edge (`filter/`) only forwards callbacks to both.

use crate::config;
use crate::director::{Director, TickReport};
use crate::duration::duration_ms;
use crate::hash::hash_bytes;
use crate::host::{Clock, HostError, HttpCallouts, SharedData};
use crate::protocol::DESTINATION_HEADER;
use crate::shared_state::{Coordinator, Role};
use hashbrown::{HashMap, HashSet};

/// One VM's configuration, loaded: its director, its tick flow and the tick period.
pub struct Configured {
    pub director: Director,
    pub ticks: TickFlow,
    pub tick_ms: u32,
}

/// Loads the plugin configuration for one VM; `vm_seed` must differ between VMs, or every
/// worker breaks ties alike. Warnings go to the log; the error says what to fix.
pub fn configure(text: &[u8], vm_seed: u64) -> Result<Configured, String> {
    let text = std::str::from_utf8(text)
        .map_err(|_| "invalid configuration: it is not UTF-8 text".to_owned())?;
    let loaded = config::load(text, vm_seed).map_err(|error| error.to_string())?;
    for warning in &loaded.warnings {
        log::warn!("inference-picker: {warning}");
    }
    let tick_ms = duration_ms(loaded.pool.refresh_metrics_interval);
    // A config update starts a fresh namespace, so old VMs' leases do not interfere.
    let namespace = format!("inference-picker/{:x}", hash_bytes(0, text.as_bytes()));
    let coordinator = Coordinator::new(&namespace, vm_seed, tick_ms);
    Ok(Configured {
        director: Director::new(loaded),
        ticks: TickFlow::new(Some(coordinator)),
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
}

/// What a callout's answer was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalloutOutcome {
    /// A `/metrics` scrape of endpoint `index`; `ok` when it gave usable metrics.
    Scraped { index: usize, ok: bool },
    /// The Kubernetes pod list; `changed` when members were added or removed.
    Discovered { changed: bool },
    /// Not a call of ours (e.g. one sent before a reconfiguration).
    Unknown,
}

/// A scrape in flight: which endpoint, and which round sent it.
#[derive(Debug, Clone, Copy)]
struct Scrape {
    index: usize,
    round: u64,
}

pub struct TickFlow {
    /// `None`: this VM is alone (or shared data failed) and does everything itself.
    coordinator: Option<Coordinator>,
    scrapes: HashMap<u32, Scrape>,
    targets: Vec<usize>,
    unsent: Vec<usize>,
    last_tick_ms: u64,
    /// The current scrape round and how many of its scrapes are still out.
    round: u64,
    round_outstanding: usize,
    /// A scrape result arrived since the snapshot was last published.
    unpublished: bool,
    discovery_call: Option<u32>,
    next_discovery_ms: u64,
    /// Endpoints warned about for a `/metrics` page over `pool.maxMetricsBytes`; warned again
    /// only after a good scrape.
    oversized: HashSet<usize>,
    oversize_warnings: usize,
}

impl TickFlow {
    pub fn new(coordinator: Option<Coordinator>) -> Self {
        TickFlow {
            coordinator,
            scrapes: HashMap::new(),
            targets: Vec::new(),
            unsent: Vec::new(),
            last_tick_ms: 0,
            round: 0,
            round_outstanding: 0,
            unpublished: false,
            discovery_call: None,
            next_discovery_ms: 0,
            oversized: HashSet::new(),
            oversize_warnings: 0,
        }
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
        let report = director.on_tick(self.last_tick_ms);
        if role == Role::Scraper {
            // Every VM sees the same transitions; only the scraper logs them.
            log_health(&report);
            self.dispatch_discovery(host, director);
            self.dispatch_scrapes(host, director);
        }
        TickOutcome {
            role,
            now_ms: self.last_tick_ms,
            report,
            members_changed,
        }
    }

    pub fn on_callout_response(
        &mut self,
        host: &(impl SharedData + HttpCallouts + Clock),
        director: &mut Director,
        token: u32,
        body_size: usize,
    ) -> CalloutOutcome {
        if self.discovery_call == Some(token) {
            self.discovery_call = None;
            let changed = self.on_discovery_response(host, director, body_size);
            return CalloutOutcome::Discovered { changed };
        }
        let Some(scrape) = self.scrapes.remove(&token) else {
            return CalloutOutcome::Unknown;
        };
        // Stamped on arrival, so the age other workers see is the real one.
        let now = host.now_ms().unwrap_or(self.last_tick_ms);
        let ok = record_scrape(host, director, scrape.index, body_size, now);
        match ok {
            Scraped::Ok => {
                self.oversized.remove(&scrape.index);
            }
            Scraped::Oversized => {
                if self.oversized.insert(scrape.index) {
                    self.oversize_warnings += 1;
                    log::warn!(
                        "inference-picker: /metrics of {} is {body_size} bytes, over pool.maxMetricsBytes ({}): not read, counted as a failed scrape (said once until it scrapes within the cap)",
                        director.address(scrape.index).unwrap_or("?"),
                        director.settings().max_metrics_bytes
                    );
                }
            }
            Scraped::Failed => {}
        }
        let ok = ok == Scraped::Ok;
        self.unpublished = true;
        if scrape.round == self.round {
            self.round_outstanding = self.round_outstanding.saturating_sub(1);
        }
        self.publish_when_round_done(host, director);
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
        host: &(impl SharedData + HttpCallouts),
        director: &mut Director,
        body_size: usize,
    ) -> bool {
        let Some(discovery) = director.settings().discovery.clone() else {
            return false;
        };
        let status = host.response_status();
        if status.as_deref() != Some(b"200".as_slice()) {
            log::warn!(
                "inference-picker: discovery failed ({}); keeping the last known pool",
                describe_status(status.as_deref())
            );
            return false;
        }
        let found = host
            .response_body(body_size)
            .map_err(|error| error.to_string())
            .and_then(|body| discovery.endpoints(&body));
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
            if let Err(error) = coordinator.publish_members(host, director.members()) {
                log::warn!("inference-picker: sharing the pool: {error}");
            }
        }
        true
    }

    /// Starts a scrape round: one `/metrics` call per member without one in flight. Calls
    /// the host refuses to send count as failed scrapes.
    fn dispatch_scrapes(
        &mut self,
        host: &(impl SharedData + HttpCallouts),
        director: &mut Director,
    ) {
        director.take_scrape_targets(&mut self.targets);
        self.round += 1;
        self.round_outstanding = 0;
        self.unsent.clear();
        let settings = director.settings();
        let timeout = u32::try_from(duration_ms(settings.metrics_timeout)).unwrap_or(u32::MAX);
        for &index in &self.targets {
            let Some(address) = director.address(index) else {
                continue;
            };
            let headers = [
                (":method", "GET"),
                (":path", settings.metrics_path.as_str()),
                (":authority", address),
                (DESTINATION_HEADER, address),
                ("accept", "text/plain"),
            ];
            match host.dispatch(&settings.metrics_cluster, &headers, timeout) {
                Ok(token) => {
                    let round = self.round;
                    self.scrapes.insert(token, Scrape { index, round });
                    self.round_outstanding += 1;
                }
                Err(error) => {
                    if self.unsent.is_empty() {
                        log::warn!("inference-picker: scrape of {address} not sent: {error}");
                    }
                    self.unsent.push(index);
                }
            }
        }
        if self.unsent.len() > 1 {
            log::warn!(
                "inference-picker: {} scrapes not sent this round",
                self.unsent.len()
            );
        }
        for &index in &self.unsent {
            director.on_scrape_failed(index);
            self.unpublished = true;
        }
        self.publish_when_round_done(host, director);
    }

    /// The one place the scraper publishes the snapshot: when every scrape of the current
    /// round has answered (or none could be sent), and only if something new arrived.
    fn publish_when_round_done(&mut self, store: &impl SharedData, director: &Director) {
        if self.round_outstanding > 0 || !self.unpublished {
            return;
        }
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
}

/// Feeds one `/metrics` answer to the director. The body's size is known before it is
/// copied into the VM: one over `pool.maxMetricsBytes` is never read.
fn record_scrape(
    host: &impl HttpCallouts,
    director: &mut Director,
    index: usize,
    body_size: usize,
    now: u64,
) -> Scraped {
    let status = host.response_status();
    let address = director.address(index).unwrap_or("?").to_owned();
    if status.as_deref() != Some(b"200".as_slice()) {
        log::debug!(
            "inference-picker: scrape of {address} failed: {}",
            describe_status(status.as_deref())
        );
        director.on_scrape_failed(index);
        return Scraped::Failed;
    }
    if body_size > director.settings().max_metrics_bytes {
        director.on_scrape_failed(index);
        return Scraped::Oversized;
    }
    let body = match host.response_body(body_size) {
        Ok(body) => body,
        Err(error) => {
            log::warn!("inference-picker: reading scrape of {address}: {error}");
            director.on_scrape_failed(index);
            return Scraped::Failed;
        }
    };
    match director.on_scrape_ok(index, now, &String::from_utf8_lossy(&body)) {
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
    for transition in &report.transitions {
        log::warn!(
            "inference-picker: endpoint {} is now {:?} (was {:?})",
            transition.address,
            transition.to,
            transition.from
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
