//! The host edge: proxy-wasm root and HTTP contexts. They forward ticks and callout answers to
//! the pure [`TickFlow`] and request events to the pure [`RequestFlow`], through the host
//! traits implemented here with `abi` calls, and count what happened in [`Stats`].

mod abi;

use crate::director::Director;
use crate::director::Release;
use crate::error_response::{ErrorShape, RequestError};
use crate::host::{
    Clock, HeaderPairs, HostError, HttpCallouts, HttpHost, MetricKind, Metrics, SharedData,
    LOG_CRITICAL,
};
use crate::picker::Picker;
use crate::protocol::{DROPPED_REASON_HEADER, SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE};
use crate::request::ApiKind;
use crate::request_flow::{self, Carried, Flow, Outcome, RequestFlow};
use crate::stats::FlowExit;
use crate::stats::Stats;
use crate::tick_flow::{self, CalloutOutcome, PoolTicks};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, MapType};
use std::cell::RefCell;
use std::rc::Rc;

proxy_wasm::main! {{
    let _ = log::set_logger(&abi::LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    // A panic aborts the VM; say why first, at the host's critical level.
    std::panic::set_hook(Box::new(|info| {
        abi::log(LOG_CRITICAL, &format!("inference-picker: panic, the VM aborts: {info}"));
    }));
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> { Box::new(PickerRoot::new(context_id)) });
}}

type SharedPicker = Rc<RefCell<Picker>>;
/// Every pool's stats, in pool order.
type SharedStats = Rc<Vec<Stats<EnvoyHost>>>;

/// The root context's host: Envoy's shared data, HTTP callouts and clock.
struct EnvoyHost;

impl SharedData for EnvoyHost {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        abi::shared_data(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        abi::set_shared_data(key, value, cas.unwrap_or(0))
    }
}

impl HttpCallouts for EnvoyHost {
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        abi::http_call(cluster, headers, timeout_ms)
    }

    fn response_status(&self) -> Option<Vec<u8>> {
        abi::header(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
    }

    fn response_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        abi::buffer(BufferType::HttpCallResponseBody, 0, size)
    }
}

impl Metrics for EnvoyHost {
    fn define(&self, kind: MetricKind, name: &str) -> Result<u32, HostError> {
        abi::define_metric(kind, name)
    }

    fn increment(&self, id: u32, offset: i64) -> Result<(), HostError> {
        abi::increment_metric(id, offset)
    }

    fn record(&self, id: u32, value: u64) -> Result<(), HostError> {
        abi::record_metric(id, value)
    }
}

impl Clock for EnvoyHost {
    fn now_ms(&self) -> Result<u64, HostError> {
        abi::current_time_ms()
    }
}

struct PickerRoot {
    context_id: u32,
    picker: Option<SharedPicker>,
    stats: Option<SharedStats>,
    /// Per pool, in pool order: its tick flow and when its next full tick is due.
    pools: Vec<RootPool>,
    /// This VM's linear memory as last added to the shared `vm_memory_bytes` gauge.
    vm_memory_reported: u64,
    /// The timer period: the shortest pool interval; while flow control holds requests
    /// anywhere the VM ticks every [`FLOW_TICK_MS`] instead, doing each pool's full tick
    /// (scrapes, sharing) when it is due.
    tick_ms: u32,
    flow_ticking: bool,
}

struct RootPool {
    ticks: PoolTicks,
    next_full_tick_ms: u64,
}

/// The tick period while requests wait: another VM's freed slot (seen in its in-flight
/// counts) reaches this VM's held requests within this long.
const FLOW_TICK_MS: u32 = 5;

impl PickerRoot {
    fn new(context_id: u32) -> Self {
        PickerRoot {
            context_id,
            picker: None,
            stats: None,
            pools: Vec::new(),
            vm_memory_reported: 0,
            tick_ms: 0,
            flow_ticking: false,
        }
    }

    /// The timer period now.
    fn period_ms(&self) -> u32 {
        if self.flow_ticking {
            FLOW_TICK_MS
        } else {
            self.tick_ms
        }
    }

    /// Ticks every [`FLOW_TICK_MS`] while requests wait anywhere in this Envoy, at the
    /// configured period otherwise.
    fn pace_ticks(&mut self, picker: &Picker, now_ms: u64) {
        let waiting = picker
            .slots()
            .iter()
            .any(|slot| flow_waiting(&slot.director, now_ms));
        let fast = waiting && FLOW_TICK_MS < self.tick_ms;
        if fast == self.flow_ticking {
            return;
        }
        let period = if fast { FLOW_TICK_MS } else { self.tick_ms };
        match abi::set_tick_period_ms(period) {
            Ok(()) => self.flow_ticking = fast,
            Err(error) => log::warn!("inference-picker: setting the tick period: {error}"),
        }
    }
}

/// Requests wait in this pool, here or (as last seen) in another VM, or refusals wait to be
/// sent.
fn flow_waiting(director: &Director, now_ms: u64) -> bool {
    director
        .flow_control()
        .is_some_and(|flow| !(flow.idle(now_ms) && flow.settled()))
        || director.has_deferred()
}

/// A pool's configured tick: scrapes, shared state, stats. Returns whether the pool's
/// models (as its pods report them) changed.
fn full_tick(
    pool: &mut RootPool,
    director: &mut Director,
    stats: Option<&Stats<EnvoyHost>>,
) -> bool {
    let outcome = pool.ticks.flow.on_tick(&EnvoyHost, director);
    if let Some(stats) = stats {
        stats.after_tick(director, &mut pool.ticks.flow, &outcome);
    }
    outcome.models_changed
}

impl Context for PickerRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(shared) = self.picker.clone() else {
            return;
        };
        let Ok(mut picker) = shared.try_borrow_mut() else {
            return;
        };
        let Some(index) = self.pools.iter().position(|p| p.ticks.flow.owns(token)) else {
            return;
        };
        let (Some(pool), Some(director)) = (self.pools.get_mut(index), picker.director_mut(index))
        else {
            return;
        };
        let stats = self.stats.as_deref().and_then(|stats| stats.get(index));
        // No headers: the call timed out or was reset; the flow sees no status.
        let body_size = if num_headers == 0 { 0 } else { body_size };
        let outcome = pool
            .ticks
            .flow
            .on_callout_response(&EnvoyHost, director, token, body_size);
        if let Some(stats) = stats {
            stats.after_callout(director, &mut pool.ticks.flow, outcome);
        }
        // A scrape that shows room lets held requests go at once, not at the next tick.
        release_held(director, stats, self.context_id, Callback::Root);
        if let CalloutOutcome::Models { changed: true } = outcome {
            picker.refresh_learned_models();
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
        // Each VM needs its own tie-breaking sequence, or all workers pick alike.
        let now_ns = abi::current_time_ns().unwrap_or(0);
        let started_ns = now_ns;
        let seed = crate::hash::hash_bytes(now_ns, &self.context_id.to_le_bytes());
        let configured = match tick_flow::configure(&text, seed) {
            Ok(configured) => configured,
            Err(error) => {
                log::error!("inference-picker: {error}");
                return false;
            }
        };
        self.tick_ms = configured.tick_ms;
        self.flow_ticking = false;
        if let Err(error) = abi::set_tick_period_ms(configured.tick_ms) {
            log::error!("inference-picker: cannot start the metrics tick: {error}");
            return false;
        }
        let loaded_ns = abi::current_time_ns().unwrap_or(started_ns);
        let picker = configured.picker;
        let stats: Vec<Stats<EnvoyHost>> = picker
            .slots()
            .iter()
            .zip(&configured.ticks)
            .map(|(slot, ticks)| Stats::define(EnvoyHost, &slot.director, &ticks.stats_prefix))
            .collect();
        let defined_ns = abi::current_time_ns().unwrap_or(loaded_ns);
        let endpoints: usize = picker.slots().iter().map(|s| s.director.pool().len()).sum();
        log::info!(
            "inference-picker: configured with {endpoints} endpoints in {}ms (stats {}ms), scraping every {}ms, {} pool(s)",
            defined_ns.saturating_sub(started_ns) / 1_000_000,
            defined_ns.saturating_sub(loaded_ns) / 1_000_000,
            configured.tick_ms,
            picker.len(),
        );
        self.pools = configured
            .ticks
            .into_iter()
            .map(|ticks| RootPool {
                ticks,
                next_full_tick_ms: 0,
            })
            .collect();
        self.stats = Some(Rc::new(stats));
        self.picker = Some(Rc::new(RefCell::new(picker)));
        true
    }

    fn on_tick(&mut self) {
        let now_ms = EnvoyRequest.now_ms();
        let Some(shared) = self.picker.clone() else {
            return;
        };
        let Ok(mut picker) = shared.try_borrow_mut() else {
            return;
        };
        let all_stats = self.stats.clone();
        let stats_of = |index: usize| all_stats.as_deref().and_then(|stats| stats.get(index));
        if let Some(stats) = stats_of(0) {
            stats.vm_memory(abi::memory_bytes(), &mut self.vm_memory_reported);
            stats.host_calls(&abi::take_call_counts());
        }
        // A tick that arrives a little early must not skip a whole interval.
        let slack = u64::from(self.period_ms() / 2);
        let mut models_changed = false;
        let mut log_level_synced = false;
        for (index, pool) in self.pools.iter_mut().enumerate() {
            let Some(director) = picker.director_mut(index) else {
                continue;
            };
            let stats = stats_of(index);
            if let Some(stats) = stats {
                stats.flush();
            }
            let full = now_ms.saturating_add(slack) >= pool.next_full_tick_ms;
            // Flow control's fast ticks serve the pools with requests waiting; the others
            // catch up on their full tick.
            let waiting = flow_waiting(director, now_ms);
            if full {
                if !log_level_synced {
                    abi::sync_log_level();
                    log_level_synced = true;
                }
                models_changed |= full_tick(pool, director, stats);
                pool.next_full_tick_ms = now_ms.saturating_add(pool.ticks.interval_ms);
            } else if waiting {
                // A flow-control tick: the whole Envoy's in-flight counts, then what may go.
                pool.ticks.flow.exchange_load(&EnvoyHost, director, now_ms);
            }
            if director.flow_control().is_some() && (full || waiting) {
                refresh_flow(director);
                release_held(director, stats, self.context_id, Callback::Root);
            }
        }
        if models_changed {
            picker.refresh_learned_models();
        }
        self.pace_ticks(&picker, now_ms);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(PickerHttp {
            context_id,
            picker: self.picker.clone(),
            stats: self.stats.clone(),
            flow: RequestFlow::new(context_id),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Reads what the other VMs hold.
fn refresh_flow(director: &mut Director) {
    if let Some(flow) = director.flow_control_mut() {
        if let Err(error) = flow.refresh(&EnvoyHost) {
            log::debug!("inference-picker: flow control: reading the other VMs' queues: {error}");
        }
    }
}

/// Flow control's part of a callback: lets out what may go (resuming or answering this VM's
/// held streams) and publishes what this VM holds. Only a clock read while nothing waits
/// anywhere. `current` is the callback's own context, made effective again after acting on
/// held streams.
fn release_held(
    director: &mut Director,
    stats: Option<&Stats<EnvoyHost>>,
    current: u32,
    callback: Callback,
) {
    let root = callback == Callback::Root;
    if director.flow_control().is_none() && !director.has_deferred() {
        return;
    }
    let now_ms = EnvoyRequest.now_ms();
    let quiet = director
        .flow_control()
        .is_none_or(|flow| flow.idle(now_ms) && flow.settled());
    if quiet && !(root && director.has_deferred()) {
        return;
    }
    let mut releases = Vec::new();
    if root {
        director.take_deferred(&mut releases);
    }
    director.releases(now_ms, &EnvoyHost, &mut releases);
    let switched = !releases.is_empty();
    for release in releases {
        carry_out_on_stream(director, stats, release, root);
    }
    if switched {
        let _ = abi::set_effective_context(current);
    }
    if let Some(flow) = director.flow_control_mut() {
        if let Err(error) = flow.publish(&EnvoyHost, now_ms) {
            log::debug!("inference-picker: flow control: publishing this VM's queue: {error}");
        }
    }
    if let Some(stats) = stats {
        stats.flow_gauges(director, now_ms);
    }
}

/// Which kind of callback flow control acts from: only a root context's (a tick, a callout
/// answer) may send local replies to held streams.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Callback {
    Root,
    Stream,
}

/// Resumes (or answers) one released request on its own stream.
fn carry_out_on_stream(
    director: &mut Director,
    stats: Option<&Stats<EnvoyHost>>,
    release: Release,
    may_answer: bool,
) {
    let (id, exit, waited_ms) = match &release {
        Release::Routed {
            id,
            waited_ms,
            routed,
            ..
        } => (
            *id,
            FlowExit::Dispatched {
                primary: routed.primary,
            },
            *waited_ms,
        ),
        Release::Refused {
            id,
            error,
            waited_ms,
            ..
        } => (*id, FlowExit::Refused(error.clone()), *waited_ms),
    };
    if abi::set_effective_context(id).is_err() {
        // The stream is gone (its on_log already ran); give back what the pick took.
        if let Release::Routed { routed, .. } = &release {
            director.release(routed);
        }
        return;
    }
    let exit = match request_flow::carry_out(&EnvoyRequest, director, release, may_answer) {
        Carried::Resume => match abi::resume_request() {
            Ok(()) => exit,
            Err(error) => {
                log::warn!("inference-picker: resuming a released request: {error}");
                return;
            }
        },
        Carried::Answered => match exit {
            FlowExit::Dispatched { .. } => FlowExit::Refused(RequestError::NoEndpoint(
                "the destination could not be set".into(),
            )),
            refused => refused,
        },
        Carried::Deferred(refusal) => {
            director.defer(refusal);
            return;
        }
    };
    if let Some(stats) = stats {
        stats.flow_left(exit, waited_ms);
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

    fn request_headers(&self) -> Option<HeaderPairs> {
        let bytes = abi::header_pairs(MapType::HttpRequestHeaders).ok()?;
        HeaderPairs::decode(bytes)
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

    fn upstream_address(&self) -> Option<String> {
        let bytes = abi::property(&["upstream", "address"]).ok().flatten()?;
        String::from_utf8(bytes)
            .ok()
            .filter(|address| !address.is_empty())
    }

    fn subset_hint(&self) -> Option<Vec<u8>> {
        let path = [
            "metadata",
            "filter_metadata",
            SUBSET_HINT_NAMESPACE,
            SUBSET_HINT_KEY,
        ];
        abi::property(&path).ok().flatten()
    }

    fn now_ms(&self) -> u64 {
        abi::current_time_ms().unwrap_or(0)
    }

    fn shared_data(&self) -> &dyn SharedData {
        &EnvoyHost
    }

    fn send_error(&self, error: &RequestError, shape: ErrorShape) -> Result<(), HostError> {
        let content_type = ("content-type", "application/json");
        let body = error.to_json_for(shape);
        match error.dropped_reason() {
            Some(reason) => abi::send_local_response(
                error.status(),
                &[content_type, (DROPPED_REASON_HEADER, reason)],
                &body,
            ),
            None => abi::send_local_response(error.status(), &[content_type], &body),
        }
    }
}

struct PickerHttp {
    context_id: u32,
    picker: Option<SharedPicker>,
    stats: Option<SharedStats>,
    flow: RequestFlow,
}

impl PickerHttp {
    /// The stats of the request's pool.
    fn pool_stats(&self) -> Option<&Stats<EnvoyHost>> {
        self.stats.as_deref()?.get(self.flow.pool())
    }

    /// Runs one request callback. `last` says the stream's end was reached, so the decision
    /// (parse + schedule) happens in this callback and is timed; a paused headers callback of
    /// an inference request costs no clock read.
    fn run(
        &mut self,
        last: bool,
        step: impl FnOnce(&mut RequestFlow, &mut Picker) -> Flow,
    ) -> Action {
        let Some(shared) = self.picker.clone() else {
            return self.unavailable();
        };
        let Ok(mut picker) = shared.try_borrow_mut() else {
            return self.unavailable();
        };
        let was_pending = self.flow.outcome == Outcome::Pending;
        // The pool is known only after the decision: the first pool's stats pace the sample.
        let timed = was_pending
            && last
            && self
                .stats
                .as_deref()
                .and_then(|stats| stats.first())
                .is_some_and(Stats::time_this_decision);
        let started_ns = timed.then(abi::current_time_ns).and_then(Result::ok);
        let flow = step(&mut self.flow, &mut picker);
        if was_pending {
            self.flow.log_decision(&EnvoyRequest, &picker);
            self.count_decision(started_ns);
        }
        if self.flow.outcome == Outcome::Held {
            // Held behind others while the pool may have room: let the right one go.
            self.release_held_in_pool(&mut picker);
        }
        match flow {
            Flow::Continue => Action::Continue,
            Flow::Pause => Action::Pause,
        }
    }

    /// Flow control's part of this stream's callback, in the request's pool.
    fn release_held_in_pool(&self, picker: &mut Picker) {
        if let Some(director) = picker.director_mut(self.flow.pool()) {
            release_held(
                director,
                self.pool_stats(),
                self.context_id,
                Callback::Stream,
            );
        }
    }

    fn count_decision(&self, started_ns: Option<u64>) {
        let Some(stats) = self.pool_stats() else {
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
            Outcome::Held => stats.held(),
        }
    }

    fn unavailable(&self) -> Action {
        let error = RequestError::NoEndpoint("the endpoint picker is not configured".into());
        let path = EnvoyRequest.request_header(":path").unwrap_or_default();
        let _ = EnvoyRequest.send_error(&error, ApiKind::from_path(&path).error_shape());
        Action::Pause
    }
}

impl Context for PickerHttp {}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.run(end_of_stream, |flow, picker| {
            flow.on_headers(&EnvoyRequest, picker, end_of_stream)
        })
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.run(end_of_stream, |flow, picker| {
            flow.on_body(&EnvoyRequest, picker, body_size, end_of_stream)
        })
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.run(true, |flow, picker| flow.on_trailers(&EnvoyRequest, picker))
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(shared) = &self.picker {
            if let Ok(mut picker) = shared.try_borrow_mut() {
                self.flow.on_response_headers(&EnvoyRequest, &mut picker);
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        let Some(shared) = self.picker.clone() else {
            return;
        };
        let Ok(mut picker) = shared.try_borrow_mut() else {
            return;
        };
        // Only a request still held needs the time (it leaves the queue): no clock read for
        // the others.
        let now_ms = if self.flow.outcome == Outcome::Held {
            EnvoyRequest.now_ms()
        } else {
            0
        };
        if let Some(waited_ms) = self.flow.on_done(&mut picker, now_ms, &EnvoyHost) {
            log::debug!(
                "inference-picker: flow control dropped request_id={} waited_ms={waited_ms} reason=client-disconnected",
                self.flow.request_id
            );
            if let Some(stats) = self.pool_stats() {
                stats.flow_left(FlowExit::Abandoned, waited_ms);
            }
        }
        // The slot this request held is free: let the next held request go now.
        self.release_held_in_pool(&mut picker);
    }
}
