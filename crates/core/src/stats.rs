//! The filter's Envoy stats, through the host's [`Metrics`]. Names carry their tags in dotted
//! segments that the shipped Envoy config's `stats_tags` turn into labels, so
//! `/stats/prometheus` shows, for example, `inference_picker_endpoint_picks{endpoint="..."}`.

use crate::datalayer::{CalloutOutcome, Scraped};
use crate::endpoint::Health;
use crate::error_response::{Dropped, RequestError};
use crate::host::{HostCall, MemoryReported, MetricKind, Metrics};
use crate::peers::PeerCounts;
use crate::router::{PoolSlot, STATS_PREFIX};
use crate::shared_state::Role;
use crate::tick_driver::TickOutcome;
use std::cell::{Cell, RefCell};

/// How often the scraper sets the per-endpoint gauges, and each VM reports its memory and
/// host-call counts (at most; each tick if longer): every report is a host call of its own.
pub const GAUGE_PERIOD_MS: u64 = 1000;

/// Endpoints whose stats are defined per call of [`Stats::cover`].
pub const COVER_BATCH: usize = 1024;

/// Outcomes of a request as the `decisions` counter tags them.
const OUTCOMES: [&str; 5] = ["routed", "400", "413", "429", "503"];

struct PeerStats {
    synced: Option<u32>,
    failed: Option<u32>,
    refused: Option<u32>,
    bytes: Option<u32>,
    callers_refused: Option<u32>,
    live: Option<u32>,
    /// The counts last added to Envoy's counters.
    reported: Cell<PeerCounts>,
}

struct EndpointStats {
    picks: u32,
    scrape_success: u32,
    scrape_failure: u32,
    metrics_age_ms: u32,
    in_flight: u32,
}

pub struct Stats<H: Metrics> {
    host: H,
    prefix: String,
    /// Per pool index; grows when discovery adds endpoints.
    endpoints: RefCell<Vec<Option<EndpointStats>>>,
    decisions: [Option<u32>; 5],
    shed: Option<u32>,
    /// Scrapes the host refused to send (each also a failure in its endpoint's counter).
    scrapes_unsent: Option<u32>,
    /// How long the last complete scrape round took; endpoints with fresh metrics.
    scrape_round_ms: Option<u32>,
    endpoints_fresh: Option<u32>,
    scheduling_us: Option<u32>,
    /// Linear memory of every VM of the plugin, summed; and how many VMs report into it.
    vm_memory_bytes: Option<u32>,
    vms: Option<u32>,
    /// Panics the edge caught (the native module; a wasm VM that panics is gone).
    panics: Option<u32>,
    /// When the scraper last set the per-endpoint gauges.
    gauges_set_ms: Cell<u64>,
    /// Flow control's stats, when its gate is on.
    flow: Option<FlowStats>,
    /// The peer replicas' stats, with `pool.peers`.
    peers: Option<PeerStats>,
    /// `host_calls.<kind>` counters, defined on the first report.
    host_calls: RefCell<Option<Vec<Option<u32>>>>,
    /// Per-request counts (decisions, picks, shed) not yet added to Envoy's counters: one host
    /// call per stat per tick instead of two or three per request.
    pending: RefCell<hashbrown::HashMap<u32, i64>>,
    /// Decisions seen, for timing one in [`TIMED_DECISION_EVERY`].
    decisions_seen: Cell<u32>,
    /// The plugins' own counters ([`crate::scheduling::Scorer::counters`]), defined when first
    /// reported, with the total already added to Envoy's counter.
    plugin_counters: RefCell<Vec<PluginCounter>>,
}

struct PluginCounter {
    plugin: String,
    name: &'static str,
    id: Option<u32>,
    reported: u64,
}

/// One decision in this many is timed for `scheduling_time_us`: a histogram of a steady sample
/// without two clock reads on every request.
pub const TIMED_DECISION_EVERY: u32 = 16;

/// How a request left flow control's queue.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueExit {
    /// Picked for and resumed, to the pool index `primary`.
    Dispatched { primary: usize },
    /// Refused on the way out (TTL, or no endpoint left after filters).
    Refused(RequestError),
    /// Its client went away while it was held.
    Abandoned,
}

/// One band's queue gauges, and the requests and bytes this VM last added to them (every
/// VM adds its own share).
struct BandGauges {
    size: Option<u32>,
    bytes: Option<u32>,
    size_added: u64,
    bytes_added: u64,
}

struct FlowStats {
    held: Option<u32>,
    dispatched: Option<u32>,
    expired: Option<u32>,
    rejected: Option<u32>,
    abandoned: Option<u32>,
    queue_time_ms: Option<u32>,
    pool_saturation_pct: Option<u32>,
    bands: RefCell<Vec<BandGauges>>,
    saturation_set: Cell<Option<u64>>,
}

impl<H: Metrics> Stats<H> {
    /// `prefix` starts every pool-scoped name: [`crate::router::STATS_PREFIX`] for a single pool, with
    /// `.pool.<name>` for each of many (the VM-wide stats are never prefixed further).
    pub fn define(host: H, slot: &PoolSlot, prefix: &str) -> Self {
        let define = |kind, name: &str| define(&host, kind, name);
        let stats = Stats {
            prefix: prefix.to_owned(),
            endpoints: RefCell::new(Vec::new()),
            decisions: OUTCOMES.map(|outcome| {
                define(
                    MetricKind::Counter,
                    &format!("{prefix}.decisions.{outcome}"),
                )
            }),
            shed: define(MetricKind::Counter, &format!("{prefix}.shed")),
            scrapes_unsent: define(MetricKind::Counter, &format!("{prefix}.scrapes_unsent")),
            scrape_round_ms: define(MetricKind::Gauge, &format!("{prefix}.scrape_round_ms")),
            endpoints_fresh: define(MetricKind::Gauge, &format!("{prefix}.endpoints_fresh")),
            scheduling_us: define(
                MetricKind::Histogram,
                &format!("{prefix}.scheduling_time_us"),
            ),
            vm_memory_bytes: define(MetricKind::Gauge, "inference_picker.vm_memory_bytes"),
            vms: define(MetricKind::Gauge, "inference_picker.vms"),
            panics: define(MetricKind::Counter, "inference_picker.panics"),
            gauges_set_ms: Cell::new(0),
            host_calls: RefCell::new(None),
            pending: RefCell::new(hashbrown::HashMap::new()),
            decisions_seen: Cell::new(0),
            plugin_counters: RefCell::new(Vec::new()),
            peers: slot.data.settings().peers.as_ref().map(|_| PeerStats {
                synced: define(MetricKind::Counter, &format!("{prefix}.peers.synced")),
                failed: define(MetricKind::Counter, &format!("{prefix}.peers.failed")),
                refused: define(MetricKind::Counter, &format!("{prefix}.peers.refused")),
                bytes: define(MetricKind::Counter, &format!("{prefix}.peers.bytes")),
                callers_refused: define(
                    MetricKind::Counter,
                    &format!("{prefix}.peers.callers_refused"),
                ),
                live: define(MetricKind::Gauge, &format!("{prefix}.peers.live")),
                reported: Cell::new(PeerCounts::default()),
            }),
            flow: slot
                .queue
                .as_ref()
                .map(|queue| queue.control())
                .map(|flow| {
                    let counter = |what: &str| {
                        define(
                            MetricKind::Counter,
                            &format!("{prefix}.flow_control.{what}"),
                        )
                    };
                    let band_gauge = |priority: i32, what: &str| {
                        define(
                            MetricKind::Gauge,
                            &format!("{prefix}.flow_control.band.{priority}.{what}"),
                        )
                    };
                    FlowStats {
                        held: counter("held"),
                        dispatched: counter("dispatched"),
                        expired: counter("expired"),
                        rejected: counter("rejected"),
                        abandoned: counter("abandoned"),
                        queue_time_ms: define(
                            MetricKind::Histogram,
                            &format!("{prefix}.flow_control.queue_time_ms"),
                        ),
                        pool_saturation_pct: define(
                            MetricKind::Gauge,
                            &format!("{prefix}.flow_control.pool_saturation_percent"),
                        ),
                        bands: RefCell::new(
                            flow.config()
                                .bands
                                .iter()
                                .map(|band| BandGauges {
                                    size: band_gauge(band.priority, "queue_size"),
                                    bytes: band_gauge(band.priority, "queue_bytes"),
                                    size_added: 0,
                                    bytes_added: 0,
                                })
                                .collect(),
                        ),
                        saturation_set: Cell::new(None),
                    }
                }),
            host,
        };
        stats.cover(slot);
        stats
    }

    /// What a tick changed: stats for endpoints that have none yet (a large pool is covered in
    /// batches, new members as they come), refused scrapes, and the scraper's gauges.
    pub fn after_tick(&self, slot: &mut PoolSlot, outcome: &TickOutcome) {
        self.cover(slot);
        self.count_unsent(slot);
        self.plugin_counters(slot);
        if outcome.role != Role::Scraper {
            return;
        }
        if let (Some(stats), Some((counts, live))) = (&self.peers, outcome.peers) {
            self.peer_counts(stats, counts, live);
        }
        self.pool_gauges(slot, slot.data.last_round_ms());
        // Two host calls per endpoint: at most once a second, however short the interval.
        if outcome.now_ms.saturating_sub(self.gauges_set_ms.get()) >= GAUGE_PERIOD_MS {
            self.gauges_set_ms.set(outcome.now_ms);
            self.endpoint_gauges(slot, outcome.now_ms);
        }
    }

    /// What a callout's answer changed.
    pub fn after_callout(&self, slot: &mut PoolSlot, outcome: CalloutOutcome) {
        self.count_unsent(slot);
        match outcome {
            CalloutOutcome::Scraped { index, scraped } => {
                self.scrape(index, scraped == Scraped::Ok)
            }
            CalloutOutcome::Discovered { changed: true } => self.cover(slot),
            CalloutOutcome::Discovered { changed: false }
            | CalloutOutcome::Models { .. }
            | CalloutOutcome::Peer
            | CalloutOutcome::Unknown => {}
        }
    }

    /// Adds what each plugin counted since the last tick to its counter,
    /// `<prefix>.plugin.<plugin name>.<counter>` (every VM adds its own).
    fn plugin_counters(&self, slot: &PoolSlot) {
        let Ok(mut counters) = self.plugin_counters.try_borrow_mut() else {
            return;
        };
        slot.director
            .scheduler()
            .plugin_counters(&mut |plugin, name, total| {
                let known = counters
                    .iter()
                    .position(|c| c.name == name && c.plugin == plugin);
                let index = known.unwrap_or_else(|| {
                    let stat = format!("{}.plugin.{}.{name}", self.prefix, stat_segment(plugin));
                    counters.push(PluginCounter {
                        plugin: plugin.to_owned(),
                        name,
                        id: define(&self.host, MetricKind::Counter, &stat),
                        reported: 0,
                    });
                    counters.len() - 1
                });
                if let Some(counter) = counters.get_mut(index) {
                    let added = total.saturating_sub(counter.reported);
                    if let (Some(id), true) = (counter.id, added > 0) {
                        let _ = self
                            .host
                            .increment(id, i64::try_from(added).unwrap_or(i64::MAX));
                    }
                    counter.reported = total;
                }
            });
    }

    fn count_unsent(&self, slot: &mut PoolSlot) {
        for index in slot.data.take_unsent() {
            self.scrape_unsent(index);
        }
    }

    /// Defines the per-endpoint stats of up to [`COVER_BATCH`] endpoints that have none yet (at
    /// configuration, then on every tick, and when discovery adds endpoints). Envoy creates each
    /// new stat name on its main thread (matching the `stats_tags` rules): a large pool's five
    /// per endpoint are spread over ticks rather than stall the configuration.
    pub fn cover(&self, slot: &PoolSlot) {
        let Ok(mut endpoints) = self.endpoints.try_borrow_mut() else {
            return;
        };
        let known = endpoints.len();
        for endpoint in slot
            .data
            .pool()
            .endpoints
            .iter()
            .skip(known)
            .take(COVER_BATCH)
        {
            endpoints.push(endpoint_stats(&self.host, &self.prefix, &endpoint.address));
        }
    }

    /// Defines now every stat this pool's stats would define later (the endpoint stats'
    /// families for endpoints to come, each listed endpoint's, the plugins' counters, and with
    /// `host_calls` the host-call counters), for a host that creates stats only while it loads
    /// the configuration (Envoy's dynamic modules).
    pub fn define_all(&self, slot: &PoolSlot, host_calls: bool) {
        endpoint_families(&self.host, &self.prefix);
        while self
            .endpoints
            .try_borrow()
            .is_ok_and(|known| known.len() < slot.data.pool().endpoints.len())
        {
            self.cover(slot);
        }
        self.plugin_counters(slot);
        if host_calls {
            self.host_calls(&[0; HostCall::ALL.len()]);
        }
    }

    fn bump(&self, id: Option<u32>) {
        if let Some(id) = id {
            let _ = self.host.increment(id, 1);
        }
    }

    /// The id of one per-endpoint stat.
    fn endpoint(&self, index: usize, which: fn(&EndpointStats) -> u32) -> Option<u32> {
        let endpoints = self.endpoints.try_borrow().ok()?;
        endpoints.get(index).and_then(Option::as_ref).map(which)
    }

    /// A routed request; `scheduling_us` when its decision was timed.
    pub fn routed(&self, primary: usize, scheduling_us: Option<u64>) {
        self.routed_count();
        self.bump_later(self.endpoint(primary, |e| e.picks));
        if let (Some(id), Some(us)) = (self.scheduling_us, scheduling_us) {
            let _ = self.host.record(id, us);
        }
    }

    pub fn rejected(&self, error: &RequestError) {
        let status = error.status().to_string();
        let slot = OUTCOMES.iter().position(|o| *o == status);
        self.bump_later(slot.and_then(|i| self.decisions.get(i).copied().flatten()));
        if let RequestError::Dropped(Dropped::QueueFull | Dropped::QueueFullNoEndpoints) = error {
            self.bump(self.flow.as_ref().and_then(|f| f.rejected));
        }
        if matches!(error, RequestError::Shed(_)) {
            self.bump_later(self.shed);
        }
    }

    fn routed_count(&self) {
        self.bump_later(self.decisions.first().copied().flatten());
    }

    /// Whether the decision about to be made is one to time (see [`TIMED_DECISION_EVERY`]).
    pub fn time_this_decision(&self) -> bool {
        let seen = self.decisions_seen.get().wrapping_add(1);
        self.decisions_seen.set(seen);
        seen % TIMED_DECISION_EVERY == 1
    }

    /// Adds the per-request counts gathered since the last flush to Envoy's counters (on every
    /// tick).
    pub fn flush(&self) {
        let Ok(mut pending) = self.pending.try_borrow_mut() else {
            return;
        };
        for (&id, &count) in pending.iter() {
            let _ = self.host.increment(id, count);
        }
        pending.clear();
    }

    fn bump_later(&self, id: Option<u32>) {
        if let (Some(id), Ok(mut pending)) = (id, self.pending.try_borrow_mut()) {
            *pending.entry(id).or_insert(0) += 1;
        }
    }

    /// A request flow control held.
    pub fn held(&self) {
        self.bump(self.flow.as_ref().and_then(|f| f.held));
    }

    /// A held request left the queue after `waited_ms`.
    pub fn flow_left(&self, exit: QueueExit, waited_ms: u64) {
        let Some(flow) = &self.flow else {
            return;
        };
        match &exit {
            QueueExit::Dispatched { primary } => {
                self.bump(flow.dispatched);
                self.routed_count();
                self.bump(self.endpoint(*primary, |e| e.picks));
            }
            QueueExit::Abandoned => self.bump(flow.abandoned),
            QueueExit::Refused(error) => {
                if let RequestError::Dropped(Dropped::TtlExpired | Dropped::NoEndpointTtlExpired) =
                    error
                {
                    self.bump(flow.expired);
                }
                self.rejected(error);
            }
        }
        if let Some(id) = flow.queue_time_ms {
            let _ = self.host.record(id, waited_ms);
        }
    }

    /// This VM's share of the per-band queue gauges (added as a difference, so the gauges
    /// sum every VM's), and the pool's saturation.
    pub fn flow_gauges(&self, slot: &PoolSlot, now_ms: u64) {
        let (Some(flow), Some(queue)) = (&self.flow, &slot.queue) else {
            return;
        };
        if let Ok(mut bands) = flow.bands.try_borrow_mut() {
            for ((_, size, bytes), gauges) in queue
                .control()
                .band_load()
                .into_iter()
                .zip(bands.iter_mut())
            {
                self.add_difference(gauges.size, &mut gauges.size_added, size);
                self.add_difference(gauges.bytes, &mut gauges.bytes_added, bytes);
            }
        }
        let percent = slot
            .director
            .pool_saturation(&slot.data, now_ms)
            .map_or(0, |s| (s * 100.0).round().clamp(0.0, 1e9) as u64);
        if flow.saturation_set.get() != Some(percent) {
            flow.saturation_set.set(Some(percent));
            if let Some(id) = flow.pool_saturation_pct {
                let _ = self.host.record(id, percent);
            }
        }
    }

    fn add_difference(&self, id: Option<u32>, reported: &mut u64, now: u64) {
        let (Some(id), Ok(now_i), Ok(reported_i)) =
            (id, i64::try_from(now), i64::try_from(*reported))
        else {
            return;
        };
        if now_i != reported_i && self.host.increment(id, now_i - reported_i).is_ok() {
            *reported = now;
        }
    }

    pub fn scrape(&self, index: usize, ok: bool) {
        let which: fn(&EndpointStats) -> u32 = if ok {
            |e| e.scrape_success
        } else {
            |e| e.scrape_failure
        };
        self.bump(self.endpoint(index, which));
    }

    /// What this VM's peer sync counted since it last reported.
    fn peer_counts(&self, stats: &PeerStats, counts: PeerCounts, live: usize) {
        let last = stats.reported.replace(counts);
        for (id, now, before) in [
            (stats.synced, counts.synced, last.synced),
            (stats.failed, counts.failed, last.failed),
            (stats.refused, counts.refused, last.refused),
            (stats.bytes, counts.bytes, last.bytes),
        ] {
            if let (Some(id), Some(delta)) = (id, now.checked_sub(before).filter(|&d| d > 0)) {
                let _ = self
                    .host
                    .increment(id, i64::try_from(delta).unwrap_or(i64::MAX));
            }
        }
        if let Some(id) = stats.live {
            let _ = self
                .host
                .record(id, u64::try_from(live).unwrap_or(u64::MAX));
        }
    }

    /// The edge caught a panic in a hook (it cost that request or tick).
    pub fn panicked(&self) {
        self.bump(self.panics);
    }

    /// A caller refused at the peer path (the clients' port, or no or a wrong secret).
    pub fn peer_caller_refused(&self) {
        self.bump(self.peers.as_ref().and_then(|p| p.callers_refused));
    }

    /// A scrape the host refused to send: a failed scrape of that endpoint.
    pub fn scrape_unsent(&self, index: usize) {
        self.bump(self.scrapes_unsent);
        self.scrape(index, false);
    }

    /// Adds the change in this address space's memory since it last reported (`reported`,
    /// the host's, which outlives configurations) to the gauge all VMs share.
    pub fn vm_memory(&self, bytes: u64, reported: &MemoryReported) {
        let Some(id) = self.vm_memory_bytes else {
            return;
        };
        let first = reported.report(bytes, |change| self.host.increment(id, change).is_ok());
        if first {
            self.bump(self.vms);
        }
    }

    /// Adds the host calls made since the last report (`counts` in [`HostCall::ALL`] order) to
    /// the VM-wide `host_calls.<kind>` counters.
    pub fn host_calls(&self, counts: &[u64]) {
        let Ok(mut defined) = self.host_calls.try_borrow_mut() else {
            return;
        };
        let ids = defined.get_or_insert_with(|| {
            HostCall::ALL
                .iter()
                .map(|call| {
                    let name = format!("{STATS_PREFIX}.host_calls.{}", call.name());
                    define(&self.host, MetricKind::Counter, &name)
                })
                .collect()
        });
        for (id, &count) in ids.iter().zip(counts) {
            if let (Some(id), true) = (id, count > 0) {
                let _ = self
                    .host
                    .increment(*id, i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
    }

    /// The pool's gauges (the last round's duration, endpoints fresh), set by the VM that
    /// scrapes.
    pub fn pool_gauges(&self, slot: &PoolSlot, round_ms: Option<u64>) {
        if let (Some(id), Some(ms)) = (self.scrape_round_ms, round_ms) {
            let _ = self.host.record(id, ms);
        }
        if let Some(id) = self.endpoints_fresh {
            let pool = &slot.data.pool().endpoints;
            let fresh = pool.iter().filter(|e| e.health == Health::Fresh).count();
            let _ = self
                .host
                .record(id, u64::try_from(fresh).unwrap_or(u64::MAX));
        }
    }

    /// Per-endpoint gauges (metrics age, the whole Envoy's requests in flight), set by the
    /// VM that scrapes.
    pub fn endpoint_gauges(&self, slot: &PoolSlot, now_ms: u64) {
        for (index, endpoint) in slot.data.pool().endpoints.iter().enumerate() {
            if let (Some(id), Some(at)) = (
                self.endpoint(index, |e| e.metrics_age_ms),
                endpoint.last_scrape_ok_ms,
            ) {
                let _ = self.host.record(id, now_ms.saturating_sub(at));
            }
            if let Some(id) = self.endpoint(index, |e| e.in_flight) {
                let _ = self.host.record(id, u64::from(endpoint.total_in_flight()));
            }
        }
    }
}

fn define(host: &impl Metrics, kind: MetricKind, name: &str) -> Option<u32> {
    match host.define(kind, name) {
        Ok(id) => Some(id),
        Err(error) => {
            log::warn!("inference-picker: defining stat {name}: {error}");
            None
        }
    }
}

/// `name` as one dotted segment of a stat name: a plugin's name may hold dots or spaces, which
/// would split or break the segment the `stats_tags` rules read.
fn stat_segment(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Each endpoint's stats, in [`EndpointStats`]' order.
const ENDPOINT_STATS: [(&str, MetricKind); 5] = [
    ("picks", MetricKind::Counter),
    ("scrape_success", MetricKind::Counter),
    ("scrape_failure", MetricKind::Counter),
    ("metrics_age_ms", MetricKind::Gauge),
    ("in_flight", MetricKind::Gauge),
];

fn endpoint_stats(host: &impl Metrics, prefix: &str, address: &str) -> Option<EndpointStats> {
    let [picks, scrape_success, scrape_failure, metrics_age_ms, in_flight] =
        ENDPOINT_STATS.map(|(what, kind)| {
            match host.define_endpoint(kind, prefix, what, address) {
                Ok(id) => Some(id),
                Err(error) => {
                    log::warn!("inference-picker: defining {address}'s stat {what}: {error}");
                    None
                }
            }
        });
    Some(EndpointStats {
        picks: picks?,
        scrape_success: scrape_success?,
        scrape_failure: scrape_failure?,
        metrics_age_ms: metrics_age_ms?,
        in_flight: in_flight?,
    })
}

/// Readies every endpoint stat's family, for endpoints discovered after the configuration
/// loaded on a host that defines stats only while it loads.
fn endpoint_families(host: &impl Metrics, prefix: &str) {
    for (what, kind) in ENDPOINT_STATS {
        if let Err(error) = host.define_endpoint_family(kind, prefix, what) {
            log::warn!("inference-picker: defining the endpoint stat {what}: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;
    use crate::harness::test;
    use crate::host::HostError;
    use std::cell::Cell;

    /// Counts the stats defined.
    #[derive(Default)]
    struct Defined(Cell<u32>);

    impl Metrics for &Defined {
        fn define(&self, _kind: MetricKind, _name: &str) -> Result<u32, HostError> {
            self.0.set(self.0.get() + 1);
            Ok(self.0.get())
        }
        fn increment(&self, _id: u32, _offset: i64) -> Result<(), HostError> {
            Ok(())
        }
        fn record(&self, _id: u32, _value: u64) -> Result<(), HostError> {
            Ok(())
        }
    }

    #[test]
    fn a_large_pool_gets_its_endpoint_stats_in_batches() {
        let mut config = String::from("pool:\n  endpoints:\n");
        for i in 0..2500 {
            config.push_str(&format!("  - address: 10.0.{}.{}:8000\n", i / 256, i % 256));
        }
        let director = PoolSlot::new("p".into(), load(&config, 1).unwrap());
        let defined = Defined::default();
        let stats = Stats::define(&defined, &director, crate::router::STATS_PREFIX);
        let pool_wide = defined.0.get() - 5 * COVER_BATCH as u32;
        assert!(pool_wide < 20, "five per endpoint of the first batch only");
        stats.cover(&director);
        stats.cover(&director);
        assert_eq!(defined.0.get(), pool_wide + 5 * 2500);
        stats.cover(&director);
        assert_eq!(
            defined.0.get(),
            pool_wide + 5 * 2500,
            "nothing left to define"
        );
        assert!(stats.endpoint(2499, |e| e.picks).is_some());
    }
}
