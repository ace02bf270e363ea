//! One worker VM, whole: its pool router, every pool's ticks and how often they run, flow control's
//! releases of held requests, and the stats of all of it. The host edge makes one [`WorkerVm`]
//! per VM and forwards each proxy-wasm callback to it; what the VM decides is carried out
//! through [`VmHost`], so every path (request, tick, release, callout answer) runs natively in
//! tests against the in-memory host (`host::fake::FakeVm`).

use crate::datalayer::CalloutOutcome;
use crate::error_response::RequestError;
use crate::hash::hash_bytes;
use crate::host::{CalloutAnswer, HttpHost, VmHost};
use crate::request::ApiKind;
use crate::request_driver::{Next, Outcome, RequestDriver};
use crate::router::PoolRouter;
use crate::shared_state::Role;
use crate::stats::{QueueExit, Stats, GAUGE_PERIOD_MS};
use crate::vm::releases::{release_held, ticks_fast, Callback, FLOW_TICK_MS};
use configure::PoolTicks;

pub mod configure;
pub mod releases;
#[cfg(test)]
mod tests;

/// A VM that routes nothing ticks this often while another VM holds every pool's lease: Envoy's
/// main thread never sees a request, and a worker may sit without one for hours.
pub const IDLE_TICK_MS: u32 = 1000;
/// A VM counts as routing for this long after its last request (and while any of its requests
/// is in flight): a lull between requests is not idleness.
pub const ROUTING_MS: u64 = 10_000;

/// How often the VM ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// At the configured period: the shortest pool interval.
    Configured,
    /// Every [`FLOW_TICK_MS`]: requests wait somewhere in this Envoy.
    Flow,
    /// Every [`IDLE_TICK_MS`]: this VM routes nothing and scrapes for no pool.
    Idle,
}

/// One pool's timer side and when its next full tick is due.
struct PoolClock {
    ticks: PoolTicks,
    next_full_tick_ms: u64,
}

pub struct WorkerVm<H: VmHost> {
    host: H,
    router: PoolRouter,
    /// Every pool's stats, in pool order.
    stats: Vec<Stats<H>>,
    /// Every pool's ticks, in pool order.
    pools: Vec<PoolClock>,
    /// The configured period: the shortest pool interval.
    tick_ms: u32,
    pace: Pace,
    /// Client requests this VM has seen (counted on the request path, which reads no clock),
    /// and how many of them the last tick had seen.
    requests_seen: u64,
    requests_seen_at_tick: u64,
    /// Client requests of this VM whose streams have not ended.
    requests_open: u64,
    /// Until when this VM counts as routing (see [`ROUTING_MS`]).
    routing_until_ms: u64,
    /// When this VM last reported its memory and host calls and read Envoy's log level
    /// (`None`: not yet).
    vm_reported_ms: Option<u64>,
}

impl<H: VmHost> WorkerVm<H> {
    /// Loads the plugin configuration, defines the stats and starts the tick. The error says
    /// what to fix (and a VM this one was to replace stays).
    pub fn configure(host: H, root_id: u32, text: &[u8]) -> Result<Self, String> {
        let started_ns = host.now_ns().unwrap_or(0);
        // Each VM needs its own tie-breaking sequence and its own id in the shared state, or
        // all workers pick alike and count as one.
        let seed = hash_bytes(started_ns ^ host.entropy(), &root_id.to_le_bytes());
        let configured = configure::configure(text, seed)?;
        host.set_tick_period_ms(configured.tick_ms)
            .map_err(|error| format!("cannot start the metrics tick: {error}"))?;
        let loaded_ns = host.now_ns().unwrap_or(started_ns);
        let router = configured.router;
        let stats: Vec<Stats<H>> = router
            .slots()
            .iter()
            .zip(&configured.ticks)
            .map(|(slot, ticks)| Stats::define(host.clone(), slot, &ticks.stats_prefix))
            .collect();
        let defined_ns = host.now_ns().unwrap_or(loaded_ns);
        let endpoints: usize = router.slots().iter().map(|s| s.data.pool().len()).sum();
        log::info!(
            "inference-picker: configured with {endpoints} endpoints in {}ms (stats {}ms), scraping every {}ms, {} pool(s), VM id {seed:016x}",
            defined_ns.saturating_sub(started_ns) / 1_000_000,
            defined_ns.saturating_sub(loaded_ns) / 1_000_000,
            configured.tick_ms,
            router.len(),
        );
        let pools = configured
            .ticks
            .into_iter()
            .map(|ticks| PoolClock {
                ticks,
                next_full_tick_ms: 0,
            })
            .collect();
        Ok(WorkerVm {
            host,
            router,
            stats,
            pools,
            tick_ms: configured.tick_ms,
            pace: Pace::Configured,
            requests_seen: 0,
            requests_seen_at_tick: 0,
            requests_open: 0,
            routing_until_ms: 0,
            vm_reported_ms: None,
        })
    }

    /// Defines every stat at once, for a host that creates stats only while it loads the
    /// configuration (Envoy's dynamic modules); endpoints discovered later label the families
    /// defined now.
    pub fn define_all_stats(&self) {
        for (index, stats) in self.stats.iter().enumerate() {
            if let Some(slot) = self.router.slot(index) {
                stats.define_all(slot, index == 0);
            }
        }
    }

    /// The edge caught a panic in one of this VM's hooks: counted in `panics`.
    pub fn count_panic(&self) {
        if let Some(stats) = self.stats.first() {
            stats.panicked();
        }
    }

    pub fn router(&self) -> &PoolRouter {
        &self.router
    }

    /// How often pool `pool` ticks in full (scrapes, sharing).
    pub fn interval_ms(&self, pool: usize) -> Option<u64> {
        self.pools.get(pool).map(|clock| clock.ticks.interval_ms)
    }

    /// The tick period now.
    pub fn period_ms(&self) -> u32 {
        match self.pace {
            Pace::Configured => self.tick_ms,
            Pace::Flow => FLOW_TICK_MS,
            Pace::Idle => IDLE_TICK_MS.max(self.tick_ms),
        }
    }

    /// The configuration is gone (the edge drops this VM): each pool's coordinator leaves the
    /// shared state, so the pool's other VMs stop reading this one's keys, a VM of the next
    /// configuration takes the scrape lease at once, and what this one published is freed.
    pub fn retire(&mut self) {
        for (index, pool) in self.pools.iter_mut().enumerate() {
            let name = self
                .router
                .slot(index)
                .map_or("-", |slot| slot.name.as_str());
            match pool.ticks.driver.retire(&self.host) {
                Ok(emptied) => log::info!(
                    "inference-picker: pool {name}: configuration retired; this VM left the shared state ({emptied} keys emptied)"
                ),
                Err(error) => {
                    log::warn!("inference-picker: pool {name}: leaving the shared state: {error}")
                }
            }
        }
    }

    /// The timer: each pool's full tick (scrapes, shared state, stats) when it is due, and
    /// flow control's exchange and releases in pools where requests wait.
    pub fn on_tick(&mut self) {
        let now_ms = self.host.now_ms().unwrap_or(0);
        self.report_vm(now_ms);
        let routing = self.routing(now_ms);
        // A tick that arrives a little early must not skip a whole interval.
        let slack = u64::from(self.period_ms() / 2);
        let mut models_changed = false;
        for (index, pool) in self.pools.iter_mut().enumerate() {
            let Some(slot) = self.router.slot_mut(index) else {
                continue;
            };
            let stats = self.stats.get(index);
            if let Some(stats) = stats {
                stats.flush();
            }
            let full = now_ms.saturating_add(slack) >= pool.next_full_tick_ms;
            // Flow control's fast ticks serve the pools with requests waiting; the others
            // catch up on their full tick.
            let waiting = slot.flow_waiting(now_ms);
            if full {
                let outcome = pool.ticks.driver.on_tick(&self.host, slot);
                if let Some(stats) = stats {
                    stats.after_tick(slot, &outcome);
                }
                models_changed |= outcome.models_changed;
                pool.next_full_tick_ms = now_ms.saturating_add(pool.ticks.interval_ms);
            } else if waiting {
                // A flow-control tick: the whole Envoy's in-flight counts, then what may go.
                pool.ticks.driver.exchange_load(&self.host, slot, now_ms);
            }
            if let Some(queue) = slot.queue.as_mut().filter(|_| full || waiting) {
                queue.refresh(&self.host);
                release_held(&self.host, slot, stats, Callback::Root);
            }
        }
        if models_changed {
            self.router.refresh_learned_models();
        }
        self.pace_ticks(now_ms, routing);
    }

    /// Whether this VM routes requests: it saw one within [`ROUTING_MS`], or one of its
    /// requests is still in flight.
    fn routing(&mut self, now_ms: u64) -> bool {
        if self.requests_seen != self.requests_seen_at_tick {
            self.requests_seen_at_tick = self.requests_seen;
            self.routing_until_ms = now_ms.saturating_add(ROUTING_MS);
        }
        self.requests_open > 0 || now_ms < self.routing_until_ms
    }

    /// A client request's headers arrived: an idle VM catches up with the shared state before
    /// the request is decided on its body (one decided on its headers alone went on what the
    /// VM had), and ticks at the configured period again.
    fn on_client_request(&mut self, request: &mut RequestDriver) {
        self.requests_seen += 1;
        if !request.counted_open {
            request.counted_open = true;
            self.requests_open += 1;
        }
        if self.pace != Pace::Idle {
            return;
        }
        let mut models_changed = false;
        for (index, pool) in self.pools.iter_mut().enumerate() {
            if let Some(slot) = self.router.slot_mut(index) {
                models_changed |= pool.ticks.driver.catch_up(&self.host, slot);
            }
        }
        if models_changed {
            self.router.refresh_learned_models();
        }
        self.set_pace(Pace::Configured);
    }

    /// The VM's memory and host calls to the stats, and Envoy's log level (a user may raise
    /// it at run time), on the first tick and then on the first tick of each clock period of
    /// [`GAUGE_PERIOD_MS`]: each is a host call, and a replica ticks tens of times a second.
    /// On the clock's periods, every VM of the Envoy reports within one tick of the others,
    /// so counters read just after cover the same whole periods for all.
    fn report_vm(&mut self, now_ms: u64) {
        let period = |ms: u64| ms / GAUGE_PERIOD_MS;
        let due = self
            .vm_reported_ms
            .is_none_or(|at| period(now_ms) != period(at));
        if !due {
            return;
        }
        self.vm_reported_ms = Some(now_ms);
        self.host.sync_log_level();
        if let Some(stats) = self.stats.first() {
            stats.vm_memory(self.host.memory_bytes(), self.host.memory_reported());
            stats.host_calls(&self.host.take_host_calls());
        }
    }

    /// The pool that sent call `token` (its data layer, or its tick driver to a peer).
    fn pool_of_call(&self, token: u32) -> Option<usize> {
        (0..self.router.len()).find(|&index| self.callout_cap_in(index, token).is_some())
    }

    /// The body cap of call `token` if pool `index` sent it.
    fn callout_cap_in(&self, index: usize, token: u32) -> Option<usize> {
        let peers = self.pools.get(index)?.ticks.driver.peer_body_cap(token);
        peers.or_else(|| self.router.slot(index)?.data.body_cap(token))
    }

    /// How many bytes of call `token`'s body the VM reads: the edge reads the answer
    /// ([`CalloutAnswer::read`]) with this cap before handing it over, so an oversized page is
    /// never copied. `None` when the call is not this VM's (its answer is ignored).
    pub fn callout_body_cap(&self, token: u32) -> Option<usize> {
        self.callout_cap_in(self.pool_of_call(token)?, token)
    }

    /// A callout's answer, as the edge read it. A scrape that shows room lets held requests go
    /// at once, not at the next tick.
    pub fn on_callout_response(&mut self, token: u32, answer: CalloutAnswer) {
        let Some(index) = self.pool_of_call(token) else {
            return;
        };
        let (Some(pool), Some(slot)) = (self.pools.get_mut(index), self.router.slot_mut(index))
        else {
            return;
        };
        let stats = self.stats.get(index);
        let outcome = pool
            .ticks
            .driver
            .on_callout_response(&self.host, slot, token, &answer);
        if let Some(stats) = stats {
            stats.after_callout(slot, outcome);
        }
        release_held(&self.host, slot, stats, Callback::Root);
        if let CalloutOutcome::Models { changed: true } = outcome {
            self.router.refresh_learned_models();
        }
    }

    pub fn on_request_headers(&mut self, request: &mut RequestDriver, end_of_stream: bool) -> Next {
        let next = self.request_step(request, end_of_stream, |request, stream, router| {
            request.on_headers(stream, router, end_of_stream)
        });
        match request.peer_reply {
            Some(true) => {
                if let Some(stats) = self.stats.first() {
                    stats.peer_caller_refused();
                }
            }
            // A peer's call is answered from the shared state: it is not routing.
            Some(false) => {}
            None => self.on_client_request(request),
        }
        next
    }

    pub fn on_request_body(
        &mut self,
        request: &mut RequestDriver,
        body_size: usize,
        end_of_stream: bool,
    ) -> Next {
        self.request_step(request, end_of_stream, |request, stream, router| {
            request.on_body(stream, router, body_size, end_of_stream)
        })
    }

    pub fn on_request_trailers(&mut self, request: &mut RequestDriver) -> Next {
        self.request_step(request, true, |request, stream, router| {
            request.on_trailers(stream, router)
        })
    }

    pub fn on_response_headers(&mut self, request: &mut RequestDriver) {
        if let Some(stream) = self.host.stream(request.id()) {
            request.on_response_headers(&stream, &mut self.router);
        }
    }

    /// The stream ended, however it ended: its slot (or its place in the queue) is given back,
    /// and the next held request may go.
    pub fn on_stream_done(&mut self, request: &mut RequestDriver) {
        if std::mem::take(&mut request.counted_open) {
            self.requests_open = self.requests_open.saturating_sub(1);
        }
        // Only a request still held needs the time (it leaves the queue).
        let now_ms = if request.outcome == Outcome::Held {
            self.host.now_ms().unwrap_or(0)
        } else {
            0
        };
        if let Some(waited_ms) = request.on_done(&mut self.router, now_ms, &self.host) {
            log::debug!(
                "inference-picker: flow control dropped request_id={} waited_ms={waited_ms} reason=client-disconnected",
                request.request_id
            );
            if let Some(stats) = self.stats.get(request.pool()) {
                stats.flow_left(QueueExit::Abandoned, waited_ms);
            }
        }
        self.release_held_in_pool(request);
    }

    /// Runs one request callback. `last` says the stream's end was reached, so the decision
    /// (parse + schedule) happens in this callback and may be timed; a paused headers callback
    /// of an inference request reads no clock.
    fn request_step(
        &mut self,
        request: &mut RequestDriver,
        last: bool,
        step: impl FnOnce(&mut RequestDriver, &H::Stream, &mut PoolRouter) -> Next,
    ) -> Next {
        let Some(stream) = self.host.stream(request.id()) else {
            // The callback's own stream is always there; a host that says otherwise has
            // nothing left to act on.
            log::warn!(
                "inference-picker: stream {} is gone in its own callback",
                request.id()
            );
            return Next::Continue;
        };
        let was_pending = request.outcome == Outcome::Pending;
        // The pool is known only after the decision: the first pool's stats pace the sample.
        let timed =
            was_pending && last && self.stats.first().is_some_and(Stats::time_this_decision);
        let started_ns = timed.then(|| self.host.now_ns().ok()).flatten();
        let next = step(request, &stream, &mut self.router);
        if was_pending {
            request.log_decision(&stream, &self.router);
            self.count_decision(request, started_ns);
        }
        if request.outcome == Outcome::Held {
            // Held behind others while the pool may have room: let the right one go.
            self.release_held_in_pool(request);
        }
        next
    }

    /// Flow control's part of a stream callback, in the request's pool.
    fn release_held_in_pool(&mut self, request: &RequestDriver) {
        let pool = request.pool();
        if let Some(slot) = self.router.slot_mut(pool) {
            let stats = self.stats.get(pool);
            release_held(&self.host, slot, stats, Callback::Stream);
        }
    }

    fn count_decision(&self, request: &RequestDriver, started_ns: Option<u64>) {
        let Some(stats) = self.stats.get(request.pool()) else {
            return;
        };
        match &request.outcome {
            Outcome::Pending => {}
            Outcome::Routed(routed) => {
                let elapsed_us = started_ns.and_then(|started| {
                    let now = self.host.now_ns().ok()?;
                    Some(now.saturating_sub(started) / 1000)
                });
                stats.routed(routed.primary, elapsed_us);
            }
            Outcome::Rejected(error) => stats.rejected(error),
            Outcome::Held => stats.held(),
        }
    }

    /// Ticks every [`FLOW_TICK_MS`] while requests wait anywhere in this Envoy, every
    /// [`IDLE_TICK_MS`] while this VM routes nothing and another VM holds every pool's lease
    /// (it has nothing to release, scrape or publish), at the configured period otherwise.
    fn pace_ticks(&mut self, now_ms: u64, routing: bool) {
        let follows_everywhere = self
            .pools
            .iter()
            .all(|pool| pool.ticks.driver.role() == Role::Follower);
        let pace = if !routing && follows_everywhere {
            Pace::Idle
        } else if ticks_fast(self.router.slots(), now_ms, self.tick_ms) {
            Pace::Flow
        } else {
            Pace::Configured
        };
        self.set_pace(pace);
    }

    fn set_pace(&mut self, pace: Pace) {
        if pace == self.pace {
            return;
        }
        let previous = self.pace;
        self.pace = pace;
        match self.host.set_tick_period_ms(self.period_ms()) {
            Ok(()) => log::debug!(
                "inference-picker: ticking every {}ms ({pace:?})",
                self.period_ms()
            ),
            Err(error) => {
                self.pace = previous;
                log::warn!("inference-picker: setting the tick period: {error}");
            }
        }
    }
}

/// Answers a request that arrived before the VM was configured (or while it is busy in a
/// callback that cannot be re-entered): 503, in the shape its API expects.
pub fn answer_unavailable(stream: &impl HttpHost) {
    answer_no_endpoint(stream, "the endpoint router is not configured");
}

/// Answers a request the edge cannot carry through (503, `why`, in the shape its API expects).
pub fn answer_no_endpoint(stream: &impl HttpHost, why: &str) {
    let error = RequestError::NoEndpoint(why.into());
    let path = stream.request_header(":path").unwrap_or_default();
    if let Err(host_error) = stream.send_error(&error, ApiKind::from_path(&path).error_shape()) {
        log::error!("inference-picker: sending the 503 reply: {host_error}");
    }
}
