//! `/metrics` scrapes: which endpoints a round takes, how many are out at once, what each
//! answer means for its endpoint, and how long a failing endpoint waits before the next probe.
//! A round is every member without a scrape in flight, sent in order through
//! `pool.metricsCluster`, at most `pool.maxScrapesInFlight` at a time: each answer sends the
//! next, and a round longer than the interval carries on at the next tick rather than
//! restarting.

use crate::config::PoolConfig;
use crate::duration::duration_ms;
use crate::endpoint::Pool;
use crate::host::{CalloutAnswer, HttpCallouts};
use crate::metrics::{self, ExtractError, MetricSelector};
use crate::protocol::DESTINATION_HEADER;
use hashbrown::{HashMap, HashSet};
use std::collections::VecDeque;

/// The longest wait between probes of a failing endpoint.
pub const MAX_PROBE_BACKOFF_MS: u64 = 5_000;

/// How one `/metrics` answer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scraped {
    /// Usable metrics.
    Ok,
    /// Over `pool.maxMetricsBytes`: failed, and the body was never read.
    Oversized,
    /// Any other failure.
    Failed,
    /// Envoy gave up waiting (504, or no answer): the metrics age, several in a row fail.
    TimedOut,
}

/// A scrape in flight: which endpoint, and which round sent it.
#[derive(Debug, Clone, Copy)]
struct Scrape {
    index: usize,
    round: u64,
}

/// Scrapes the host refused in the current interval: one summary line at the next tick.
#[derive(Debug, Default)]
struct UnsentLog {
    count: usize,
    first: Option<String>,
}

#[derive(Debug, Default)]
pub struct Scrapes {
    /// The custom metrics the configuration extracts, and whether each one's label mismatch
    /// was already reported.
    selectors: Vec<MetricSelector>,
    selector_warned: Vec<bool>,
    in_flight: HashMap<u32, Scrape>,
    /// Per endpoint: taken by a round and not answered yet (queued or in flight).
    pending: Vec<bool>,
    /// The current round's endpoints not sent yet, in order: sent as others answer, at most
    /// `window` in flight.
    queue: VecDeque<usize>,
    /// Scrapes in flight allowed now: `pool.maxScrapesInFlight`, lowered for the rest of a round
    /// to what the host accepted when it refused one.
    window: usize,
    /// Scrapes the host refused, by endpoint, until the stats take them (each is a failed
    /// scrape there).
    unsent: Vec<usize>,
    unsent_log: UnsentLog,
    /// The current scrape round, when it started, whether it is still open, its size and how
    /// many of its scrapes are out.
    round: u64,
    round_started_ms: u64,
    round_open: bool,
    round_size: usize,
    round_outstanding: usize,
    /// How long the last complete round took, from its tick to its last answer.
    last_round_ms: Option<u64>,
    /// The last round took longer than `metricsStalenessThreshold` (warned once per change).
    rounds_too_slow: bool,
    /// A scrape result arrived since the snapshot was last published.
    unpublished: bool,
    /// Endpoints warned about for a `/metrics` page over `pool.maxMetricsBytes`; warned again
    /// only after a good scrape.
    oversized: HashSet<usize>,
    oversize_warnings: usize,
    /// Per endpoint: this replica scrapes it (see [`Scrapes::set_share`]); empty: all.
    share: Vec<bool>,
}

impl Scrapes {
    pub fn new(selectors: Vec<MetricSelector>) -> Self {
        Scrapes {
            selector_warned: vec![false; selectors.len()],
            selectors,
            ..Scrapes::default()
        }
    }

    pub fn owns(&self, token: u32) -> bool {
        self.in_flight.contains_key(&token)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn last_round_ms(&self) -> Option<u64> {
        self.last_round_ms
    }

    pub fn oversize_warnings(&self) -> usize {
        self.oversize_warnings
    }

    pub fn take_unsent(&mut self) -> std::vec::Drain<'_, usize> {
        self.unsent.drain(..)
    }

    pub fn mark_published(&mut self) {
        self.unpublished = false;
    }

    /// The scraper's tick: starts a round when the last one was all sent, or carries on with
    /// the last one. Returns true when a round outlasting the interval should publish what it
    /// learned so far (once per interval).
    pub fn start_or_continue_round(
        &mut self,
        host: &impl HttpCallouts,
        pool: &mut Pool,
        settings: &PoolConfig,
        now: u64,
        idle: bool,
    ) -> bool {
        let carry_on = !self.queue.is_empty();
        if !carry_on {
            self.start_round(pool, settings, now, idle);
        }
        self.send(host, pool, settings);
        carry_on && self.unpublished
    }

    /// The pods this replica scrapes (index order; one not listed is scraped): the rest are
    /// its peers' to scrape.
    pub fn set_share(&mut self, share: &[bool]) {
        self.share.clear();
        self.share.extend_from_slice(share);
    }

    /// Another VM took the lease: it scrapes what this one had not sent yet.
    pub fn hand_over(&mut self) {
        for index in self.queue.drain(..) {
            if let Some(pending) = self.pending.get_mut(index) {
                *pending = false;
            }
        }
    }

    /// An idle pool is in use again: every pod is due at the next round, not at the end of
    /// its idle rest (a failing pod keeps its probe back-off).
    pub fn wake(&mut self, pool: &mut Pool) {
        for endpoint in &mut pool.endpoints {
            endpoint.next_scrape_ms = 0;
        }
    }

    /// Endpoints due now (members without a scrape pending), marked pending.
    fn start_round(&mut self, pool: &mut Pool, settings: &PoolConfig, now: u64, idle: bool) {
        self.pending.resize(pool.len(), false);
        // With several replicas, or while the pool is idle, each pod rests longer than a tick
        // between scrapes (see `PoolConfig::replicas`); the ticks themselves keep the
        // configured interval, so the workers still share their load and picks that often.
        // Half a tick of slack: a tick may come a little early.
        let interval = if idle {
            settings.idle_scrape_interval()
        } else {
            settings.scrape_interval()
        };
        let rest_ms = if interval > settings.refresh_metrics_interval {
            duration_ms(interval).saturating_sub(duration_ms(settings.refresh_metrics_interval) / 2)
        } else {
            0
        };
        let now_ms = pool.now_ms();
        let next_ms = now_ms.saturating_add(rest_ms);
        for (index, pending) in self.pending.iter_mut().enumerate() {
            let Some(endpoint) = pool.endpoints.get_mut(index) else {
                continue;
            };
            let due = endpoint.next_probe_ms.max(endpoint.next_scrape_ms) <= now_ms;
            let ours = self.share.get(index).copied().unwrap_or(true);
            if !*pending && !endpoint.removed && due && ours {
                *pending = true;
                endpoint.next_scrape_ms = next_ms;
                self.queue.push_back(index);
            }
        }
        for &index in &self.queue {
            pool.mark_scrape_sent(index);
        }
        self.round += 1;
        self.round_started_ms = now;
        self.round_open = true;
        self.round_size = self.queue.len();
        self.round_outstanding = 0;
        self.window = settings.max_scrapes_in_flight;
    }

    /// Sends the round's next scrapes while fewer than `window` are in flight. A call the host
    /// refuses counts as a failed scrape in the stats; with none of ours in flight the call
    /// cannot be made at all (e.g. no such cluster) and the endpoint's scrape failed, otherwise
    /// the host is full: the endpoint is retried first, once another scrape answers.
    fn send(&mut self, host: &impl HttpCallouts, pool: &mut Pool, settings: &PoolConfig) {
        let timeout = u32::try_from(duration_ms(settings.metrics_timeout)).unwrap_or(u32::MAX);
        while self.in_flight.len() < self.window {
            let Some(index) = self.queue.pop_front() else {
                break;
            };
            let Some(endpoint) = pool.get(index) else {
                continue;
            };
            if endpoint.removed {
                self.clear_pending(index);
                continue;
            }
            let address = endpoint.address.as_str();
            let headers = pod_get(&settings.metrics_path, address, "text/plain");
            match host.dispatch(&settings.metrics_cluster, &headers, timeout) {
                Ok(token) => {
                    let round = self.round;
                    self.in_flight.insert(token, Scrape { index, round });
                    self.round_outstanding += 1;
                }
                Err(error) => {
                    if self.unsent_log.count == 0 {
                        self.unsent_log.first = Some(format!("{address}: {error}"));
                    }
                    self.unsent_log.count += 1;
                    self.unsent.push(index);
                    if self.in_flight.is_empty() {
                        self.failed(pool, settings, index);
                        self.unpublished = true;
                    } else {
                        self.queue.push_front(index);
                        self.window = self.in_flight.len();
                        break;
                    }
                }
            }
        }
    }

    /// The answer to scrape `token`: its endpoint, and how it went. The edge copied no body
    /// over `pool.maxMetricsBytes` ([`Scrapes::owns`] calls get that cap). Sends
    /// the round's next scrapes when `scraping`; returns true when the round is complete and
    /// the snapshot should be published.
    #[allow(clippy::too_many_arguments)]
    pub fn on_answer(
        &mut self,
        host: &impl HttpCallouts,
        pool: &mut Pool,
        settings: &PoolConfig,
        token: u32,
        answer: &CalloutAnswer,
        now: u64,
        scraping: bool,
    ) -> Option<(usize, Scraped, bool)> {
        let scrape = self.in_flight.remove(&token)?;
        let scraped = self.read_answer(answer, pool, settings, scrape.index, now);
        self.note_oversize(pool, settings, scrape.index, scraped, answer.body_size);
        self.unpublished = true;
        if scrape.round == self.round {
            self.round_outstanding = self.round_outstanding.saturating_sub(1);
        }
        if scraping {
            self.send(host, pool, settings);
        }
        let publish = self.round_done(settings, now);
        Some((scrape.index, scraped, publish))
    }

    /// After the tick's sends: whether the round is complete and its snapshot unpublished.
    pub fn round_done(&mut self, settings: &PoolConfig, now: u64) -> bool {
        if self.round_outstanding > 0 || !self.queue.is_empty() {
            return false;
        }
        if self.round_open {
            self.round_open = false;
            self.round_took(now.saturating_sub(self.round_started_ms), settings);
        }
        self.unpublished
    }

    fn read_answer(
        &mut self,
        answer: &CalloutAnswer,
        pool: &mut Pool,
        settings: &PoolConfig,
        index: usize,
        now: u64,
    ) -> Scraped {
        let status = answer.status.as_deref();
        let address = pool
            .get(index)
            .map_or("?", |e| e.address.as_str())
            .to_owned();
        if status != Some(b"200".as_slice()) {
            log::debug!(
                "inference-picker: scrape of {address} failed: {}",
                describe_status(status)
            );
            // A refused connection is Envoy's 503 and leaves at once; a slow pod is not dead.
            if matches!(status, None | Some(b"504")) {
                self.timed_out(index);
                return Scraped::TimedOut;
            }
            self.failed(pool, settings, index);
            return Scraped::Failed;
        }
        if answer.body_size > settings.max_metrics_bytes {
            self.failed(pool, settings, index);
            return Scraped::Oversized;
        }
        let body = match &answer.body {
            Ok(body) => body,
            Err(error) => {
                log::warn!("inference-picker: reading scrape of {address}: {error}");
                self.failed(pool, settings, index);
                return Scraped::Failed;
            }
        };
        match self.ok(pool, settings, index, now, &String::from_utf8_lossy(body)) {
            Ok(()) => Scraped::Ok,
            Err(_) => Scraped::Failed,
        }
    }

    /// A scrape answered 200 with `body`: parsed into the endpoint's metrics, or a failure.
    pub fn ok(
        &mut self,
        pool: &mut Pool,
        settings: &PoolConfig,
        index: usize,
        now: u64,
        body: &str,
    ) -> Result<(), ExtractError> {
        self.clear_pending(index);
        let Some(endpoint) = pool.get(index) else {
            return Ok(());
        };
        let cap = settings.max_metrics_bytes;
        match metrics::extract_within(endpoint.engine, body, &self.selectors, cap) {
            Ok((snapshot, _, unmatched)) => {
                if let Some(warning) = self.label_mismatch_warning(pool, &unmatched, index) {
                    log::warn!("inference-picker: {warning}");
                }
                pool.record_scrape_ok(index, now, snapshot);
                Ok(())
            }
            Err(error) => {
                log::debug!(
                    "inference-picker: scrape of {}: {error}",
                    pool.get(index).map_or("?", |e| e.address.as_str())
                );
                pool.record_scrape_failure(index);
                Err(error)
            }
        }
    }

    /// A scrape could not be sent, timed out, or answered non-200.
    pub fn failed(&mut self, pool: &mut Pool, settings: &PoolConfig, index: usize) {
        self.clear_pending(index);
        pool.record_scrape_failure(index);
        back_off_probes(pool, settings, index);
    }

    /// A scrape timed out (Envoy's 504, or no answer): a busy pod answers `/metrics` late
    /// while it serves requests, so its metrics only age (it goes stale and stays routable);
    /// a pod that is really gone refuses connections or fails requests, which take it out.
    fn timed_out(&mut self, index: usize) {
        self.clear_pending(index);
    }

    fn clear_pending(&mut self, index: usize) {
        if let Some(pending) = self.pending.get_mut(index) {
            *pending = false;
        }
    }

    fn note_oversize(
        &mut self,
        pool: &Pool,
        settings: &PoolConfig,
        index: usize,
        scraped: Scraped,
        body_size: usize,
    ) {
        match scraped {
            Scraped::Ok => {
                self.oversized.remove(&index);
            }
            Scraped::Oversized if self.oversized.insert(index) => {
                self.oversize_warnings += 1;
                log::warn!(
                    "inference-picker: /metrics of {} is {body_size} bytes, over pool.maxMetricsBytes ({}): not read, counted as a failed scrape (said once until it scrapes within the cap)",
                    pool.get(index).map_or("?", |e| e.address.as_str()),
                    settings.max_metrics_bytes
                );
            }
            _ => {}
        }
    }

    /// A warning, once per extractor, when an extractor's metric is there but its label filter
    /// matches none of its series.
    fn label_mismatch_warning(
        &mut self,
        pool: &Pool,
        unmatched: &[usize],
        index: usize,
    ) -> Option<String> {
        let mut warning = String::new();
        for &slot in unmatched {
            let (Some(warned), Some(selector)) =
                (self.selector_warned.get_mut(slot), self.selectors.get(slot))
            else {
                continue;
            };
            if !*warned {
                *warned = true;
                let address = pool.get(index).map_or("?", |e| e.address.as_str());
                warning.push_str(&format!(
                    "{} has series on {address} but none with labels {:?}; metric scorers treat it as missing (worst score). ",
                    selector.metric_name, selector.labels
                ));
            }
        }
        (!warning.is_empty()).then(|| warning.trim_end().to_owned())
    }

    /// Notes a complete round's duration; warns when rounds start or stop outlasting the
    /// staleness threshold.
    fn round_took(&mut self, took: u64, settings: &PoolConfig) {
        self.last_round_ms = Some(took);
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
                self.round_size,
                settings.max_scrapes_in_flight
            );
        } else {
            log::info!(
                "inference-picker: scrape rounds are within metricsStalenessThreshold again"
            );
        }
    }

    /// One line for the scrapes the host refused since the last tick.
    pub fn log_unsent(&mut self) {
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

/// A failing endpoint is probed again after one interval, then two, four... up to
/// [`MAX_PROBE_BACKOFF_MS`]: a dead pod costs a scrape every few seconds, not every tick.
fn back_off_probes(pool: &mut Pool, settings: &PoolConfig, index: usize) {
    let interval = duration_ms(settings.scrape_interval()).max(1);
    let now = pool.now_ms();
    if let Some(endpoint) = pool.endpoints.get_mut(index) {
        let doublings = endpoint.scrape_failures_in_a_row.saturating_sub(1).min(16);
        let backoff = interval
            .saturating_mul(1 << doublings)
            .min(MAX_PROBE_BACKOFF_MS);
        endpoint.next_probe_ms = now.saturating_add(backoff);
    }
}

/// A GET of `path` on the pod at `address`, through the metrics cluster (ORIGINAL_DST keyed on
/// the destination header).
pub fn pod_get<'a>(path: &'a str, address: &'a str, accept: &'a str) -> [(&'a str, &'a str); 5] {
    [
        (":method", "GET"),
        (":path", path),
        (":authority", address),
        (DESTINATION_HEADER, address),
        ("accept", accept),
    ]
}

pub fn describe_status(status: Option<&[u8]>) -> String {
    status.map_or("no response (timeout or reset)".to_owned(), |s| {
        format!("status {}", String::from_utf8_lossy(s))
    })
}
