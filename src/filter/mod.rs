//! The host edge: proxy-wasm root and HTTP contexts that feed the pure [`Director`] and
//! [`RequestFlow`] with ticks, scrape results and request events. Nothing here decides.

mod abi;
mod stats;

use crate::config;
use crate::director::Director;
use crate::duration::duration_ms;
use crate::request_flow::{
    Flow, HostError, HttpHost, Outcome, RequestFlow, DESTINATION_HEADER, FAIRNESS_ID_HEADER,
};
use crate::shared_state::{Coordinator, Role, SharedStore};
use hashbrown::HashMap;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, MapType};
use stats::Stats;
use std::cell::RefCell;
use std::rc::Rc;

proxy_wasm::main! {{
    let _ = log::set_logger(&abi::LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> { Box::new(PickerRoot::new(context_id)) });
}}

type SharedDirector = Rc<RefCell<Director>>;

/// Envoy's process-wide shared data, for the [`Coordinator`].
struct EnvoyShared;

impl SharedStore for EnvoyShared {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        abi::shared_data(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        abi::set_shared_data(key, value, cas.unwrap_or(0))
    }
}

struct PickerRoot {
    context_id: u32,
    director: Option<SharedDirector>,
    stats: Option<Rc<Stats>>,
    coordinator: Option<Coordinator>,
    /// Callout token -> endpoint index being scraped.
    scrapes: HashMap<u32, usize>,
    targets: Vec<usize>,
    last_tick_ms: u64,
    /// The Kubernetes pod-list callout in flight, and when the next one is due.
    discovery_call: Option<u32>,
    next_discovery_ms: u64,
    /// This VM's linear memory as last added to the shared `vm_memory_bytes` gauge.
    vm_memory_reported: u64,
}

impl PickerRoot {
    fn new(context_id: u32) -> Self {
        PickerRoot {
            context_id,
            director: None,
            stats: None,
            coordinator: None,
            scrapes: HashMap::new(),
            targets: Vec::new(),
            last_tick_ms: 0,
            discovery_call: None,
            next_discovery_ms: 0,
            vm_memory_reported: 0,
        }
    }

    /// Asks the Kubernetes API for the pool's pods, when due (scraping VM only).
    fn dispatch_discovery(&mut self, director: &Director) {
        let Some(discovery) = &director.settings().discovery else {
            return;
        };
        if self.discovery_call.is_some() || self.last_tick_ms < self.next_discovery_ms {
            return;
        }
        self.next_discovery_ms = self.last_tick_ms + duration_ms(discovery.interval);
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
        let timeout = u32::try_from(duration_ms(discovery.interval)).unwrap_or(u32::MAX);
        match abi::http_call(&discovery.cluster, &headers, timeout) {
            Ok(token) => self.discovery_call = Some(token),
            Err(error) => log::warn!("inference-picker: discovery call not sent: {error}"),
        }
    }

    /// The pod list arrived: apply it and tell the other workers. A failed call keeps the
    /// last known pool.
    fn on_discovery_response(&mut self, director: &mut Director, num_headers: usize, body_size: usize) {
        self.discovery_call = None;
        let status = (num_headers > 0)
            .then(|| {
                abi::header(MapType::HttpCallResponseHeaders, ":status")
                    .ok()
                    .flatten()
            })
            .flatten();
        if status.as_deref() != Some(b"200".as_slice()) {
            log::warn!(
                "inference-picker: discovery failed ({}); keeping the last known pool",
                status.map_or("no response".into(), |s| String::from_utf8_lossy(&s)
                    .into_owned())
            );
            return;
        }
        let Some(discovery) = director.settings().discovery.clone() else {
            return;
        };
        let found = abi::buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .map_err(|error| error.to_string())
            .and_then(|body| discovery.endpoints(&body));
        let found = match found {
            Ok(found) => found,
            Err(error) => {
                log::warn!("inference-picker: discovery: {error}; keeping the last known pool");
                return;
            }
        };
        let (added, removed) = director.set_discovered(&found);
        if added.is_empty() && removed.is_empty() {
            return;
        }
        log::info!("inference-picker: discovery: added {added:?}, removed {removed:?}");
        if let Some(stats) = &self.stats {
            stats.cover(director);
        }
        if let Some(coordinator) = self.coordinator.as_mut() {
            if let Err(error) = coordinator.publish_members(&EnvoyShared, director.members()) {
                log::warn!("inference-picker: sharing the pool: {error}");
            }
        }
    }

    fn dispatch_scrapes(&mut self, director: &mut Director) {
        director.take_scrape_targets(&mut self.targets);
        let settings = director.settings();
        let timeout = u32::try_from(duration_ms(settings.metrics_timeout)).unwrap_or(u32::MAX);
        let mut unsent = Vec::new();
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
            match abi::http_call(&settings.metrics_cluster, &headers, timeout) {
                Ok(token) => {
                    self.scrapes.insert(token, index);
                }
                Err(error) => {
                    log::warn!("inference-picker: scrape of {address} not sent: {error}");
                    unsent.push(index);
                }
            }
        }
        for index in unsent {
            director.on_scrape_failed(index);
        }
    }
}

impl PickerRoot {
    /// Elects the scraper, shares scrape results and in-flight counts between the VMs.
    fn coordinate(&mut self, director: &mut Director) -> Role {
        let Some(coordinator) = self.coordinator.as_mut() else {
            return Role::Scraper;
        };
        let now = self.last_tick_ms;
        let role = match coordinator.elect(&EnvoyShared, now) {
            Ok((role, true)) => {
                log::debug!(
                    "inference-picker: context {} is now the {role:?}",
                    self.context_id
                );
                role
            }
            Ok((role, false)) => role,
            Err(error) => {
                // Without shared data every VM scrapes for itself, as if alone.
                log::warn!("inference-picker: shared data unavailable: {error}");
                return Role::Scraper;
            }
        };
        match coordinator.take_members(&EnvoyShared) {
            Ok(Some(members)) => {
                director.apply_members(&members);
                if let Some(stats) = &self.stats {
                    stats.cover(director);
                }
            }
            Ok(_) => {}
            Err(error) => log::warn!("inference-picker: reading the pool: {error}"),
        }
        let shared = match role {
            Role::Scraper => coordinator.publish_snapshot(&EnvoyShared, director.pool()),
            Role::Follower => coordinator
                .apply_snapshot(&EnvoyShared, director.pool_mut())
                .map(|_| ()),
        }
        .and_then(|()| coordinator.exchange_load(&EnvoyShared, director.pool_mut(), now))
        .and_then(|()| {
            let mut own = Vec::new();
            director.take_learned(&mut own);
            coordinator.exchange_prefixes(&EnvoyShared, &own)
        });
        match shared {
            Ok(remote) => remote
                .iter()
                .for_each(|learned| director.learn_remote(learned)),
            Err(error) => log::warn!("inference-picker: sharing state: {error}"),
        }
        role
    }
}

fn log_health(report: &crate::director::TickReport) {
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

impl Context for PickerRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if self.discovery_call == Some(token) {
            if let Some(shared) = self.picker.clone() {
                if let Ok(mut director) = shared.try_borrow_mut() {
                    self.on_discovery_response(&mut director, num_headers, body_size);
                }
            }
            return;
        }
        let Some(index) = self.scrapes.remove(&token) else {
            return;
        };
        let Some(director) = &self.picker else {
            return;
        };
        let Ok(mut director) = director.try_borrow_mut() else {
            return;
        };
        // Stamped on arrival, so the age other workers see is the real one.
        let now = abi::current_time_ms().unwrap_or(self.last_tick_ms);
        let ok = record_scrape(&mut director, index, num_headers, body_size, now);
        if let Some(stats) = &self.stats {
            stats.scrape(index, ok);
        }
        // The round is complete: publish it now rather than at the next tick.
        if self.scrapes.is_empty() {
            if let Some(coordinator) = self.coordinator.as_mut() {
                if coordinator.role() == Role::Scraper {
                    if let Err(error) = coordinator.publish_snapshot(&EnvoyShared, director.pool()) {
                        log::warn!("inference-picker: sharing state: {error}");
                    }
                }
            }
        }
    }
}

/// Feeds one `/metrics` callout's answer to the director; true when it gave usable metrics.
fn record_scrape(
    director: &mut Director,
    index: usize,
    num_headers: usize,
    body_size: usize,
    now: u64,
) -> bool {
    let status = if num_headers == 0 {
        None
    } else {
        abi::header(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
    };
    let address = director.address(index).unwrap_or("?").to_owned();
    if status.as_deref() != Some(b"200".as_slice()) {
        let shown = status.map_or("no response (timeout or reset)".to_owned(), |s| {
            format!("status {}", String::from_utf8_lossy(&s))
        });
        log::debug!("inference-picker: scrape of {address} failed: {shown}");
        director.on_scrape_failed(index);
        return false;
    }
    match abi::buffer(BufferType::HttpCallResponseBody, 0, body_size) {
        Ok(body) => {
            let text = String::from_utf8_lossy(&body);
            match director.on_scrape_ok(index, now, &text) {
                Ok(None) => true,
                Ok(Some(warning)) => {
                    log::warn!("inference-picker: {warning}");
                    true
                }
                Err(error) => {
                    log::debug!("inference-picker: scrape of {address}: {error}");
                    false
                }
            }
        }
        Err(error) => {
            log::warn!("inference-picker: reading scrape of {address}: {error}");
            director.on_scrape_failed(index);
            false
        }
    }
}

impl RootContext for PickerRoot {
    fn on_configure(&mut self, configuration_size: usize) -> bool {
        abi::sync_log_level();
        let text = match abi::buffer(BufferType::PluginConfiguration, 0, configuration_size) {
            Ok(bytes) => bytes,
            Err(error) => {
                log::error!("inference-picker: reading the configuration: {error}");
                return false;
            }
        };
        let Ok(text) = std::str::from_utf8(&text) else {
            log::error!("inference-picker: invalid configuration: it is not UTF-8 text");
            return false;
        };
        // Each VM needs its own tie-breaking sequence, or all workers pick alike.
        let now_ns = abi::current_time_ns().unwrap_or(0);
        let seed = crate::hash::hash_bytes(now_ns, &self.context_id.to_le_bytes());
        log::debug!(
            "inference-picker: context {} seeded with {seed:#x} (time {now_ns})",
            self.context_id
        );
        let loaded = match config::load(text, seed) {
            Ok(loaded) => loaded,
            Err(error) => {
                log::error!("inference-picker: {error}");
                return false;
            }
        };
        for warning in &loaded.warnings {
            log::warn!("inference-picker: {warning}");
        }
        let interval =
            u32::try_from(duration_ms(loaded.pool.refresh_metrics_interval)).unwrap_or(u32::MAX);
        if let Err(error) = abi::set_tick_period_ms(interval) {
            log::error!("inference-picker: cannot start the metrics tick: {error}");
            return false;
        }
        let endpoints = loaded.pool.endpoints.len();
        // A config update starts a fresh namespace, so old VMs' leases do not interfere.
        let namespace = format!(
            "inference-picker/{:x}",
            crate::hash::hash_bytes(0, text.as_bytes())
        );
        self.coordinator = Some(Coordinator::new(&namespace, seed, u64::from(interval)));
        let director = Director::new(loaded);
        self.stats = Some(Rc::new(Stats::define(&director)));
        self.picker = Some(Rc::new(RefCell::new(director)));
        self.scrapes.clear();
        log::info!(
            "inference-picker: configured with {endpoints} endpoints, scraping every {interval}ms"
        );
        true
    }

    fn on_tick(&mut self) {
        abi::sync_log_level();
        self.last_tick_ms = abi::current_time_ms().unwrap_or(self.last_tick_ms);
        if let Some(stats) = &self.stats {
            stats.vm_memory(&mut self.vm_memory_reported);
        }
        let Some(shared) = self.picker.clone() else {
            return;
        };
        let Ok(mut director) = shared.try_borrow_mut() else {
            return;
        };
        let role = self.coordinate(&mut director);
        let report = director.on_tick(self.last_tick_ms);
        if role == Role::Scraper {
            // Every VM sees the same transitions; only the scraper logs them.
            log_health(&report);
            if let Some(stats) = &self.stats {
                stats.endpoint_gauges(&director, self.last_tick_ms);
            }
            self.dispatch_discovery(&director);
            self.dispatch_scrapes(&mut director);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(PickerHttp {
            director: self.picker.clone(),
            stats: self.stats.clone(),
            flow: RequestFlow::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The request-side host calls, for [`RequestFlow`].
struct EnvoyRequest;

impl HttpHost for EnvoyRequest {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        abi::header(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
    }

    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        abi::replace_header(MapType::HttpRequestHeaders, name, value)
    }

    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        abi::remove_header(MapType::HttpRequestHeaders, name)
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        abi::buffer(BufferType::HttpRequestBody, 0, size)
    }

    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError> {
        abi::set_buffer(BufferType::HttpRequestBody, 0, size, body)
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        abi::header(MapType::HttpResponseHeaders, name)
            .ok()
            .flatten()
    }

    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        abi::replace_header(MapType::HttpResponseHeaders, name, value)
    }

    fn send_local_reply(&self, status: u16, json_body: &[u8]) -> Result<(), HostError> {
        abi::send_local_response(status, &[("content-type", "application/json")], json_body)
    }
}

struct PickerHttp {
    director: Option<SharedDirector>,
    stats: Option<Rc<Stats>>,
    flow: RequestFlow,
}

impl PickerHttp {
    /// Runs one request callback. `last` says the stream's end was reached, so the decision
    /// (parse + schedule) happens in this callback and is timed; a paused headers callback of
    /// an inference request costs no clock read.
    fn run(
        &mut self,
        last: bool,
        step: impl FnOnce(&mut RequestFlow, &mut Director) -> Flow,
    ) -> Action {
        let Some(shared) = &self.picker else {
            return self.unavailable();
        };
        let Ok(mut director) = shared.try_borrow_mut() else {
            return self.unavailable();
        };
        let was_pending = self.flow.outcome == Outcome::Pending;
        let started_ns = (was_pending && last)
            .then(abi::current_time_ns)
            .and_then(Result::ok);
        let flow = step(&mut self.flow, &mut director);
        if was_pending {
            log_decision(&self.flow, &director);
            self.count_decision(started_ns);
        }
        match flow {
            Flow::Continue => Action::Continue,
            Flow::Pause => Action::Pause,
        }
    }

    fn count_decision(&self, started_ns: Option<u64>) {
        let Some(stats) = &self.stats else {
            return;
        };
        match &self.flow.outcome {
            Outcome::Pending => {}
            Outcome::Routed(routed) => {
                let elapsed_us = started_ns.and_then(|started| {
                    let now = abi::current_time_ns().ok()?;
                    Some(now.saturating_sub(started) / 1000)
                });
                stats.routed(routed.primary, elapsed_us);
            }
            Outcome::Rejected(error) => stats.rejected(error),
        }
    }

    fn unavailable(&self) -> Action {
        let error = crate::error_response::RequestError::NoEndpoint(
            "the endpoint picker is not configured".into(),
        );
        let _ = EnvoyRequest.send_local_reply(error.status(), &error.to_json());
        Action::Pause
    }
}

fn log_decision(flow: &RequestFlow, director: &Director) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    match &flow.outcome {
        Outcome::Pending => {}
        Outcome::Routed(routed) => log::debug!(
            "inference-picker: decision request_id={} model={:?} priority={} fairness_id={} picked={} fallbacks={} prefill={} degraded={} {}",
            flow.request_id,
            routed.model,
            routed.priority,
            EnvoyRequest
                .request_header(FAIRNESS_ID_HEADER)
                .map_or("-".into(), |id| String::from_utf8_lossy(&id).into_owned()),
            routed.destination,
            if routed.fallbacks.is_empty() { "-" } else { &routed.fallbacks },
            routed.prefill.as_deref().unwrap_or("-"),
            routed.degraded,
            if routed.degraded {
                String::new()
            } else {
                director.explain_last()
            }
        ),
        Outcome::Rejected(error) => log::debug!(
            "inference-picker: rejected request_id={} {error}",
            flow.request_id
        ),
    }
}

impl Context for PickerHttp {}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.run(end_of_stream, |flow, director| {
            flow.on_headers(&EnvoyRequest, director, end_of_stream)
        })
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.run(end_of_stream, |flow, director| {
            flow.on_body(&EnvoyRequest, director, body_size, end_of_stream)
        })
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(shared) = &self.picker {
            if let Ok(mut director) = shared.try_borrow_mut() {
                self.flow.on_response_headers(&EnvoyRequest, &mut director);
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Some(shared) = &self.picker {
            if let Ok(mut director) = shared.try_borrow_mut() {
                self.flow.on_done(&mut director);
            }
        }
    }
}
