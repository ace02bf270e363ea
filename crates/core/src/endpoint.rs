//! Pool members: their identity, labels, latest metrics, health and the filter's own load.

use crate::latency::LatencyModel;
use crate::metrics::{EndpointMetrics, Engine};
use crate::pace::Pace;
use hashbrown::{HashMap, HashSet};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Label naming a pod's role in P/D disaggregation.
pub const ROLE_LABEL: &str = "llm-d.ai/role";
/// Label naming the engine whose metric names a pod exposes.
pub const ENGINE_TYPE_LABEL: &str = "inference.networking.k8s.io/engine-type";

/// A pod's engine: its engine-type label's, else the pool's default, else vLLM.
fn engine_of(labels: &BTreeMap<String, String>, default_engine: Option<&str>) -> Engine {
    Engine::from_label(
        labels
            .get(ENGINE_TYPE_LABEL)
            .map(String::as_str)
            .or(default_engine),
    )
}

/// Parses `ip:port` (IPv6 as `[addr]:port`) into the canonical text form used everywhere:
/// in the destination header, in logs and as the pool's key. Only addresses a pod can have
/// are accepted: see [`unroutable`].
pub fn canonical_address(text: &str) -> Result<String, String> {
    let address = text
        .trim()
        .parse::<SocketAddr>()
        .map_err(|_| format!("{text:?} is not an ip:port address (IPv6 as [addr]:port)"))?;
    if let Some(reason) = unroutable(&address) {
        return Err(format!("{address} is not a routable pod address: {reason}"));
    }
    Ok(address.to_string())
}

/// Why `address` cannot be a pod's: port 0, an unspecified address (`0.0.0.0`, `::`, which
/// connect to the proxy's own host), the rest of `0.0.0.0/8`, broadcast or multicast.
pub fn unroutable(address: &SocketAddr) -> Option<&'static str> {
    if address.port() == 0 {
        return Some("port 0");
    }
    let ip = match address.ip() {
        // `::ffff:a.b.c.d` is the IPv4 address a.b.c.d.
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some("unspecified address (0.0.0.0)"),
        IpAddr::V4(v4) if v4.octets().first() == Some(&0) => {
            Some("0.0.0.0/8 is \"this network\", never a destination")
        }
        IpAddr::V4(v4) if v4 == Ipv4Addr::BROADCAST => Some("broadcast address"),
        IpAddr::V4(v4) if v4.is_multicast() => Some("multicast address"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("unspecified address (::)"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("multicast address"),
        _ => None,
    }
}

/// How fresh an endpoint's metrics are, recomputed on every tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Never scraped yet.
    Unknown,
    /// Last successful scrape within the staleness threshold.
    Fresh,
    /// The scrape answers, but the last good metrics are older than the threshold.
    Stale,
    /// The last scrape failed (connection refused, 5xx, timeout, not a model server).
    Unreachable,
}

#[derive(Debug, Clone)]
pub struct EndpointState {
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub engine: Engine,
    pub metrics: EndpointMetrics,
    pub health: Health,
    /// Host time (ms) of the last scrape that produced metrics.
    pub last_scrape_ok_ms: Option<u64>,
    /// Scrapes in a row that failed, and the host time before which it is not probed again:
    /// a dead pod is re-probed with back-off, not every interval.
    pub scrape_failures_in_a_row: u32,
    pub next_probe_ms: u64,
    /// Host time before which this replica does not scrape it again, with several replicas
    /// sharing the pods' refresh (see `PoolConfig::replicas`).
    pub next_scrape_ms: u64,
    pub last_scrape_failed: bool,
    /// Requests this filter routed there that have not ended yet.
    pub in_flight: u32,
    /// Their tokens (prompt plus expected output).
    pub in_flight_tokens: u64,
    /// Tokens of the requests routed there since its last scrape: work the scraped metrics
    /// cannot show yet, which the cost model assumes is running.
    pub placed_tokens_since_scrape: u64,
    /// The same two counts from the other Envoy workers, as of their last tick.
    pub remote_in_flight: u32,
    pub remote_in_flight_tokens: u64,
    /// Both totals when the current metrics were taken: what was placed since, less what
    /// ended, is load the scrape cannot show yet (see [`EndpointState::waiting`]).
    pub in_flight_at_scrape: u32,
    pub in_flight_tokens_at_scrape: u64,
    /// Both totals when the scrape in flight was sent: its metrics describe the pod from about
    /// then, so what was placed while it travelled still counts once it lands.
    pub in_flight_at_scrape_sent: Option<(u32, u64)>,
    /// Requests the pod ran at the last scrape that showed a queue: an engine queues only
    /// when its sequence slots (or its KV cache) are full, so that is how many it runs at once.
    pub running_capacity: Option<f64>,
    /// How fast the pod works, learned from its counters (vLLM only).
    pub pace: Pace,
    /// Its TTFT and TPOT, learned from what it reports (see [`LatencyModel`]).
    pub latency: LatencyModel,
    /// Host time (ms) until which the endpoint is avoided after answering a request with 5xx
    /// or refusing the connection (passive health).
    pub backoff_until_ms: u64,
    /// This worker sent it requests it has not answered yet (cleared by an answer to the last
    /// one it held, or a good scrape): one that ended unanswered, because the client gave up
    /// on a hung pod, stays owed.
    pub owes_answer: bool,
    /// Host time (ms) until which its last answer to this worker vouches for it: the staleness
    /// threshold after that answer. A pod whose metrics are late stays routable while it owes
    /// nothing or answers: one that answers keeps its share, one that hangs costs one request.
    pub answered_until_ms: u64,
    /// Discovery no longer lists it. Kept (not deleted) so every index stays valid and the same
    /// across workers; it is neither scraped nor routed to.
    pub removed: bool,
}

impl EndpointState {
    pub fn new(address: String, labels: BTreeMap<String, String>) -> Self {
        let engine = engine_of(&labels, None);
        EndpointState {
            address,
            labels,
            engine,
            metrics: EndpointMetrics::default(),
            health: Health::Unknown,
            last_scrape_ok_ms: None,
            last_scrape_failed: false,
            scrape_failures_in_a_row: 0,
            next_probe_ms: 0,
            next_scrape_ms: 0,
            in_flight: 0,
            in_flight_tokens: 0,
            placed_tokens_since_scrape: 0,
            remote_in_flight: 0,
            remote_in_flight_tokens: 0,
            in_flight_at_scrape: 0,
            in_flight_tokens_at_scrape: 0,
            in_flight_at_scrape_sent: None,
            running_capacity: None,
            pace: Pace::default(),
            latency: LatencyModel::default(),
            backoff_until_ms: 0,
            owes_answer: false,
            answered_until_ms: 0,
            removed: false,
        }
    }

    /// New labels from discovery; the engine follows the engine-type label.
    /// New labels; the engine follows the engine-type label, else `default_engine`.
    pub fn set_labels(&mut self, labels: BTreeMap<String, String>, default_engine: Option<&str>) {
        if labels != self.labels {
            self.engine = engine_of(&labels, default_engine);
            self.labels = labels;
        }
    }

    /// In the pool, scraped and not failing its scrapes, and not backing off after a failed
    /// request. Metrics that are late (a busy pod's `/metrics` answers slowly) are a missing
    /// reading, not a verdict: the pod stays a candidate, read from its last metrics plus what
    /// was placed there since (see [`Self::waiting`]), unless it owes this worker answers and
    /// has given none lately (it looks hung); only failed connections or requests take it out
    /// for longer.
    pub fn routable(&self, now_ms: u64) -> bool {
        let live = match self.health {
            Health::Fresh => true,
            Health::Stale => !self.owes_answer || now_ms <= self.answered_until_ms,
            Health::Unknown | Health::Unreachable => false,
        };
        live && !self.removed && self.backoff_until_ms <= now_ms
    }

    /// Requests in flight there from the whole Envoy: this worker's exact count plus the
    /// others' as of their last tick.
    pub fn total_in_flight(&self) -> u32 {
        self.in_flight.saturating_add(self.remote_in_flight)
    }

    pub fn total_in_flight_tokens(&self) -> u64 {
        self.in_flight_tokens
            .saturating_add(self.remote_in_flight_tokens)
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// Requests this Envoy placed there since the metrics were taken, less those that ended
    /// since: negative when the pod has drained. Between two scrapes every pick reads the
    /// same metrics, so without this a burst herds onto whichever pod scraped best.
    pub fn placed_since_scrape(&self) -> f64 {
        f64::from(self.total_in_flight()) - f64::from(self.in_flight_at_scrape)
    }

    fn placed_tokens_since_metrics(&self) -> f64 {
        self.total_in_flight_tokens() as f64 - self.in_flight_tokens_at_scrape as f64
    }

    /// What `view` counts as placed there since the scrape: nothing when it reads the scrape
    /// alone; with several replicas, this one's placements stand for each replica's (a
    /// balancer spreads requests evenly, and prefix homes send a prefix to the same pod from
    /// every replica).
    fn placed_in_view(&self, view: LoadView) -> (f64, f64) {
        if !view.live {
            return (0.0, 0.0);
        }
        (
            self.placed_since_scrape() * view.replicas,
            self.placed_tokens_since_metrics() * view.replicas,
        )
    }

    /// Requests running and waiting there now, as far as the filter can tell: with a live
    /// `view`, the scraped counts plus what was placed since the scrape, the total split at the
    /// pod's [`Self::running_capacity`] (a request placed at a pod with a free slot runs; one
    /// placed at a full pod waits). A pod never seen full keeps its scraped queue: what was
    /// placed since is taken to run. `None` when the pod reports neither count.
    fn load_now(&self, view: LoadView) -> (Option<f64>, Option<f64>) {
        let (running, waiting) = (self.metrics.running(), self.metrics.waiting());
        if !view.live {
            return (running, waiting);
        }
        let (placed, _) = self.placed_in_view(view);
        let (Some(running), Some(waiting)) = (running, waiting) else {
            return (running.map(|r| (r + placed).max(0.0)), waiting);
        };
        let total = (running + waiting + placed).max(0.0);
        match self.running_capacity {
            Some(slots) => (Some(total.min(slots)), Some((total - slots).max(0.0))),
            None => (Some((running + placed).max(0.0)), Some(waiting)),
        }
    }

    /// Waiting requests (see [`Self::load_now`]); `None` when the pod reports no queue.
    pub fn waiting(&self, view: LoadView) -> Option<f64> {
        self.load_now(view).1
    }

    /// Running requests (see [`Self::load_now`]).
    pub fn running(&self, view: LoadView) -> Option<f64> {
        self.load_now(view).0
    }

    /// KV-cache utilisation in 0..1; with a live `view` and a pod that reports its cache size
    /// (`vllm:cache_config_info`), plus the tokens placed since the scrape less those ended.
    pub fn kv_usage(&self, view: LoadView) -> Option<f64> {
        let usage = self.metrics.kv_usage()?;
        let capacity = self
            .metrics
            .cache_config
            .map(|c| c.num_gpu_blocks.saturating_mul(u64::from(c.block_size)))
            .filter(|&tokens| tokens > 0);
        match capacity {
            Some(tokens) if view.live => {
                let (_, placed_tokens) = self.placed_in_view(view);
                Some((usage + placed_tokens / tokens as f64).clamp(0.0, 1.0))
            }
            _ => Some(usage),
        }
    }

    fn health_at(&self, now_ms: u64, staleness_ms: u64) -> Health {
        if self.last_scrape_failed {
            return Health::Unreachable;
        }
        match self.last_scrape_ok_ms {
            None => Health::Unknown,
            Some(at) if now_ms.saturating_sub(at) <= staleness_ms => Health::Fresh,
            Some(_) => Health::Stale,
        }
    }
}

/// A health change worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthTransition {
    pub address: String,
    pub from: Health,
    pub to: Health,
}

/// How load-reading code sees a pod between two scrapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadView {
    /// Add what was placed since the scrape, less what ended (see [`Pool::live_load`]).
    pub live: bool,
    /// Envoy replicas placing requests on the pods, this one included (see [`Pool::replicas`]).
    pub replicas: f64,
}

impl LoadView {
    /// The last scrape as it was.
    pub const SCRAPED: LoadView = LoadView {
        live: false,
        replicas: 1.0,
    };
}

/// The endpoints the filter may route to, in configuration order.
#[derive(Debug, Clone)]
pub struct Pool {
    pub endpoints: Vec<EndpointState>,
    /// Load signals include what was placed since each scrape (`pool.loadSignals: live`);
    /// false reads the scraped metrics only, as GIE's picker does.
    pub live_load: bool,
    /// Envoy replicas placing requests on these pods (`pool.replicas`, or the live peers),
    /// this one included.
    pub replicas: f64,
    /// The replicas share their in-flight counts (`pool.peers`): the load view counts them as
    /// they are instead of multiplying this replica's by [`Pool::replicas`].
    pub peers_share_load: bool,
    /// Address -> index, so lookups by address (snapshots, membership lists) stay linear in
    /// the pool rather than quadratic. Endpoints are only ever appended, by `set_members`.
    /// The engine a pod without the engine-type label is read as; vLLM when `None`.
    default_engine: Option<String>,
    by_address: HashMap<String, usize>,
    /// Host time of the last tick.
    now_ms: u64,
    /// The metrics staleness threshold, as of the last tick: also how long a pod has to answer
    /// a request before its late metrics no longer keep it routable.
    staleness_ms: u64,
    /// Health changes since the last `refresh_health`, for the log.
    transitions: Vec<HealthTransition>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new(Vec::new())
    }
}

impl Pool {
    pub fn new(endpoints: Vec<EndpointState>) -> Self {
        let by_address = endpoints
            .iter()
            .enumerate()
            .map(|(index, endpoint)| (endpoint.address.clone(), index))
            .collect();
        Pool {
            endpoints,
            live_load: true,
            replicas: 1.0,
            peers_share_load: false,
            default_engine: None,
            by_address,
            now_ms: 0,
            staleness_ms: 0,
            transitions: Vec::new(),
        }
    }

    /// Pods without the engine-type label are read as `engine` (`core-metrics-extractor`'s
    /// `defaultEngine`).
    pub fn with_default_engine(mut self, engine: Option<String>) -> Self {
        for endpoint in &mut self.endpoints {
            endpoint.engine = engine_of(&endpoint.labels, engine.as_deref());
        }
        self.default_engine = engine;
        self
    }

    /// See [`Pool::live_load`].
    pub fn with_live_load(mut self, live: bool) -> Self {
        self.live_load = live;
        self
    }

    /// See [`Pool::replicas`].
    pub fn with_replicas(mut self, replicas: u32) -> Self {
        self.replicas = f64::from(replicas.max(1));
        self
    }

    /// The replicas that share their in-flight counts with this one (`pool.peers`), this one
    /// included: what they placed is counted as it is, no longer extrapolated from ours.
    pub fn set_peer_replicas(&mut self, replicas: u32) {
        self.replicas = f64::from(replicas.max(1));
        self.peers_share_load = true;
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// A request routed to `index` failed at the pod (5xx, refused, reset): avoid it until
    /// `until_ms` even if its metrics look fine. Returns true if it was not already avoided.
    pub fn back_off(&mut self, index: usize, until_ms: u64) -> bool {
        let now = self.now_ms;
        self.endpoints.get_mut(index).is_some_and(|endpoint| {
            let fresh = endpoint.backoff_until_ms <= now;
            endpoint.backoff_until_ms = endpoint.backoff_until_ms.max(until_ms);
            fresh
        })
    }

    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&EndpointState> {
        self.endpoints.get(index)
    }

    /// `index`'s waiting queue as scorers should see it (see [`EndpointState::waiting`]).
    pub fn waiting(&self, index: usize) -> Option<f64> {
        self.get(index)?.waiting(self.load_view())
    }

    pub fn running(&self, index: usize) -> Option<f64> {
        self.get(index)?.running(self.load_view())
    }

    pub fn kv_usage(&self, index: usize) -> Option<f64> {
        self.get(index)?.kv_usage(self.load_view())
    }

    /// How scorers see the pods: see [`Pool::live_load`] and [`Pool::replicas`].
    pub fn load_view(&self) -> LoadView {
        LoadView {
            live: self.live_load,
            replicas: if self.peers_share_load {
                1.0
            } else {
                self.replicas
            },
        }
    }

    /// Applies a membership list: listed addresses are (re)joined with their labels, new ones
    /// appended; unlisted ones at index `keep_from` or later are marked removed. Returns the
    /// addresses added and removed.
    pub fn set_members(
        &mut self,
        members: &[(String, BTreeMap<String, String>)],
        keep_from: usize,
    ) -> (Vec<String>, Vec<String>) {
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        for (address, labels) in members {
            match self.index_of(address) {
                Some(index) => {
                    if let Some(endpoint) = self.endpoints.get_mut(index) {
                        if endpoint.removed {
                            endpoint.removed = false;
                            added.push(address.clone());
                        }
                        endpoint.set_labels(labels.clone(), self.default_engine.as_deref());
                    }
                }
                None => {
                    self.by_address
                        .insert(address.clone(), self.endpoints.len());
                    let mut endpoint = EndpointState::new(address.clone(), labels.clone());
                    endpoint.engine = engine_of(labels, self.default_engine.as_deref());
                    self.endpoints.push(endpoint);
                    added.push(address.clone());
                }
            }
        }
        let listed: HashSet<&str> = members
            .iter()
            .map(|(address, _)| address.as_str())
            .collect();
        for endpoint in self.endpoints.iter_mut().skip(keep_from) {
            if !listed.contains(endpoint.address.as_str()) && !endpoint.removed {
                endpoint.removed = true;
                removed.push(endpoint.address.clone());
            }
        }
        (added, removed)
    }

    pub fn index_of(&self, address: &str) -> Option<usize> {
        let index = *self.by_address.get(address)?;
        let endpoint = self.endpoints.get(index)?;
        (endpoint.address == address).then_some(index)
    }

    /// A scrape of `index` is being sent now (see [`EndpointState::in_flight_at_scrape_sent`]).
    pub fn mark_scrape_sent(&mut self, index: usize) {
        if let Some(endpoint) = self.endpoints.get_mut(index) {
            endpoint.in_flight_at_scrape_sent = Some((
                endpoint.total_in_flight(),
                endpoint.total_in_flight_tokens(),
            ));
        }
    }

    /// Fresh metrics: the endpoint is routable at once, not only after the next tick.
    pub fn record_scrape_ok(&mut self, index: usize, now_ms: u64, metrics: EndpointMetrics) {
        if let Some(endpoint) = self.endpoints.get_mut(index) {
            if let (Some(waiting), Some(running)) = (metrics.waiting(), metrics.running()) {
                if waiting > 0.0 && running > 0.0 {
                    endpoint.running_capacity = Some(running);
                }
            }
            if let (Some(work), Some(running)) = (metrics.work, metrics.running()) {
                endpoint.pace.observe(now_ms, work, running);
            }
            if let (Some(latency), Some(waiting), Some(running)) =
                (metrics.latency, metrics.waiting(), metrics.running())
            {
                let computed = metrics.work.map(|w| w.computed_prompt_tokens);
                endpoint.latency.observe(
                    now_ms,
                    latency,
                    (waiting, running),
                    computed,
                    &endpoint.pace,
                );
            }
            endpoint.metrics = metrics;
            endpoint.placed_tokens_since_scrape = 0;
            // It answers: only what it holds now is owed (one a client gave up on is not).
            endpoint.owes_answer = endpoint.in_flight > 0;
            let (count, tokens) = endpoint.in_flight_at_scrape_sent.take().unwrap_or((
                endpoint.total_in_flight(),
                endpoint.total_in_flight_tokens(),
            ));
            endpoint.in_flight_at_scrape = count;
            endpoint.in_flight_tokens_at_scrape = tokens;
            endpoint.last_scrape_ok_ms = Some(now_ms);
            endpoint.last_scrape_failed = false;
            endpoint.scrape_failures_in_a_row = 0;
            endpoint.next_probe_ms = 0;
            set_health(endpoint, Health::Fresh, &mut self.transitions);
        }
    }

    /// Applies a scrape result another worker or replica published: metrics taken at `ok_ms`,
    /// or a failure. Older results than the ones already held are ignored. `at_scrape`: the
    /// fleet's in-flight counts there when the scrape was sent, as its sender counted them
    /// (see [`EndpointState::in_flight_at_scrape_sent`]); `None` takes this VM's now.
    pub fn apply_shared(
        &mut self,
        index: usize,
        ok_ms: Option<u64>,
        failed: bool,
        metrics: &EndpointMetrics,
        at_scrape: Option<(u32, u64)>,
    ) {
        let Some(endpoint) = self.endpoints.get(index) else {
            return;
        };
        if failed {
            if !endpoint.last_scrape_failed {
                self.record_scrape_failure(index);
            }
            return;
        }
        match (ok_ms, endpoint.last_scrape_ok_ms) {
            (Some(at), Some(held)) if at <= held && !endpoint.last_scrape_failed => {}
            (Some(at), _) => {
                if let (Some(counts), Some(endpoint)) = (at_scrape, self.endpoints.get_mut(index)) {
                    endpoint.in_flight_at_scrape_sent = Some(counts);
                }
                self.record_scrape_ok(index, at, metrics.clone());
            }
            (None, _) => {}
        }
    }

    /// A failed scrape takes the endpoint out of rotation at once.
    pub fn record_scrape_failure(&mut self, index: usize) {
        if let Some(endpoint) = self.endpoints.get_mut(index) {
            endpoint.last_scrape_failed = true;
            endpoint.scrape_failures_in_a_row = endpoint.scrape_failures_in_a_row.saturating_add(1);
            set_health(endpoint, Health::Unreachable, &mut self.transitions);
        }
    }

    /// Ages every endpoint's metrics so the request path only reads a flag; returns the health
    /// changes since the last call.
    pub fn refresh_health(&mut self, now_ms: u64, staleness_ms: u64) -> Vec<HealthTransition> {
        self.now_ms = now_ms;
        self.staleness_ms = staleness_ms;
        for endpoint in &mut self.endpoints {
            let health = endpoint.health_at(now_ms, staleness_ms);
            set_health(endpoint, health, &mut self.transitions);
        }
        std::mem::take(&mut self.transitions)
    }

    /// `index` answered one of this worker's requests (still counted in flight): it vouches
    /// for the pod for a staleness threshold (see [`EndpointState::answered_until_ms`]).
    pub fn answered(&mut self, index: usize) {
        let until = self.now_ms.saturating_add(self.staleness_ms);
        if let Some(endpoint) = self.endpoints.get_mut(index) {
            endpoint.answered_until_ms = until;
            endpoint.owes_answer &= endpoint.in_flight > 1;
        }
    }

    /// A request of `tokens` was routed to `index`.
    pub fn add_in_flight(&mut self, index: usize, tokens: u64) {
        if let Some(endpoint) = self.endpoints.get_mut(index) {
            endpoint.owes_answer = true;
            endpoint.in_flight = endpoint.in_flight.saturating_add(1);
            endpoint.in_flight_tokens = endpoint.in_flight_tokens.saturating_add(tokens);
            endpoint.placed_tokens_since_scrape =
                endpoint.placed_tokens_since_scrape.saturating_add(tokens);
        }
    }

    /// That request ended, however it ended.
    pub fn end_in_flight(&mut self, index: usize, tokens: u64) {
        if let Some(endpoint) = self.endpoints.get_mut(index) {
            endpoint.in_flight = endpoint.in_flight.saturating_sub(1);
            endpoint.in_flight_tokens = endpoint.in_flight_tokens.saturating_sub(tokens);
        }
    }
}

fn set_health(
    endpoint: &mut EndpointState,
    health: Health,
    transitions: &mut Vec<HealthTransition>,
) {
    if health != endpoint.health {
        transitions.push(HealthTransition {
            address: endpoint.address.clone(),
            from: endpoint.health,
            to: health,
        });
        endpoint.health = health;
    }
}

#[cfg(test)]
mod tests;
