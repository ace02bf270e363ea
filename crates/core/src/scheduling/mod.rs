//! The scheduling core: filters -> weighted scorers -> picker, per profile, with GIE semantics.
//! Plugins are plain Rust objects over plain data; nothing here knows about the proxy.

pub mod flow_policy;
pub mod plugins;
pub mod prefix_home;
pub mod prefix_index;
pub mod rng;

use crate::endpoint::{EndpointState, Health, LoadView, Pool};
use crate::request::InferenceRequest;
use rng::Rng;
use std::fmt::Write;

/// Everything a plugin may read about one scheduling cycle.
pub struct SchedulingContext<'a> {
    pub request: &'a InferenceRequest,
    pub pool: &'a Pool,
    pub cycle: &'a CycleState,
}

impl<'a> SchedulingContext<'a> {
    /// A context with no per-cycle data (tests, and plugins that need none).
    pub fn new(request: &'a InferenceRequest, pool: &'a Pool) -> Self {
        static EMPTY: CycleState = CycleState {
            prefix: None,
            latency: None,
        };
        SchedulingContext {
            request,
            pool,
            cycle: &EMPTY,
        }
    }
}

/// Data computed once per request before any profile runs, shared by every plugin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleState {
    /// Filled by `prefix-cache-scorer`; plugins that read it treat `None` as "no hits".
    pub prefix: Option<PrefixMatches>,
    /// Filled by `predicted-latency-producer`; `None` without one.
    pub latency: Option<LatencyPredictions>,
}

/// What the request would see at each pool endpoint, and how that compares with its SLOs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencyPredictions {
    /// Per pool index; `None` where nothing is predicted (nothing learned yet, not routable).
    pub endpoints: Vec<Option<Prediction>>,
}

/// One endpoint's predicted latency for the request being scheduled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    /// The SLO less the prediction: negative when the SLO would be missed (and always without
    /// an SLO, as llm-d has it).
    pub ttft_headroom_ms: f64,
    /// 0 when TPOT does not count (not streaming).
    pub tpot_headroom_ms: f64,
    /// Nothing of this filter's is in flight there.
    pub idle: bool,
}

impl Prediction {
    /// Both predictions meet their SLOs.
    pub fn meets_slos(&self) -> bool {
        self.ttft_headroom_ms > 0.0 && self.tpot_headroom_ms >= 0.0
    }

    /// Both headrooms are at least zero (llm-d's positive tier).
    pub fn positive(&self) -> bool {
        self.ttft_headroom_ms >= 0.0 && self.tpot_headroom_ms >= 0.0
    }
}

impl LatencyPredictions {
    pub fn get(&self, endpoint: usize) -> Option<&Prediction> {
        self.endpoints.get(endpoint).and_then(Option::as_ref)
    }

    pub fn any(&self) -> bool {
        self.endpoints.iter().any(Option::is_some)
    }
}

/// How much of the request's prompt each pool endpoint probably holds in its KV cache.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefixMatches {
    /// Per pool index: leading prompt blocks the endpoint holds.
    pub matched_blocks: Vec<usize>,
    /// Full blocks in the prompt (after `maxPrefixBlocksToMatch`).
    pub total_blocks: usize,
    pub block_tokens: usize,
}

impl PrefixMatches {
    /// Share of the prompt's blocks `endpoint` holds, in [0, 1].
    pub fn hit_ratio(&self, endpoint: usize) -> f64 {
        if self.total_blocks == 0 {
            return 0.0;
        }
        self.matched_blocks.get(endpoint).copied().unwrap_or(0) as f64 / self.total_blocks as f64
    }

    pub fn cached_tokens(&self, endpoint: usize) -> u32 {
        let blocks = self.matched_blocks.get(endpoint).copied().unwrap_or(0);
        u32::try_from(blocks.saturating_mul(self.block_tokens)).unwrap_or(u32::MAX)
    }

    pub fn any_hit(&self, candidates: &[usize]) -> bool {
        candidates
            .iter()
            .any(|&c| self.matched_blocks.get(c).is_some_and(|&m| m > 0))
    }
}

impl CycleState {
    pub fn hit_ratio(&self, endpoint: usize) -> f64 {
        self.prefix.as_ref().map_or(0.0, |p| p.hit_ratio(endpoint))
    }

    pub fn cached_tokens(&self, endpoint: usize) -> u32 {
        self.prefix
            .as_ref()
            .map_or(0, |p| p.cached_tokens(endpoint))
    }

    /// Prompt tokens `endpoint` would have to prefill: those it does not probably cache.
    pub fn uncached_prompt_tokens(&self, request: &InferenceRequest, endpoint: usize) -> u32 {
        request
            .prompt_tokens
            .saturating_sub(self.cached_tokens(endpoint))
    }
}

// Plugins are `Send` so that a native host (the ext_proc baseline, the benchmarks) can share
// one scheduler between threads; inside Envoy each VM is single-threaded anyway.

/// Removes candidates (endpoint indices into the pool). Order of the survivors is kept.
pub trait Filter: Send {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>);
}

/// Scores each candidate in [0, 1]; `scores[i]` belongs to `candidates[i]` and starts at 0.
pub trait Scorer: Send {
    /// Runs once per request before any profile, to fill the shared cycle state.
    fn prepare(&mut self, _request: &InferenceRequest, _pool: &Pool, _cycle: &mut CycleState) {}

    /// Runs once per request after every `prepare`, for data computed from theirs (latency
    /// predictions read the prefix matches).
    fn predict(&mut self, _request: &InferenceRequest, _pool: &Pool, _cycle: &mut CycleState) {}

    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]);

    /// Scorers that can also filter (`context-length-aware` with `enableFiltering`) say so
    /// here; the loader then runs them in the profile's filter phase as well.
    fn filters(&self) -> bool {
        false
    }

    fn filter(&mut self, _ctx: &SchedulingContext<'_>, _candidates: &mut Vec<usize>) {}

    /// Picks this VM learned since the last call, to share with the other workers.
    fn take_learned(&mut self, _out: &mut Vec<LearnedPrefix>) {}

    /// The prompt blocks of the last request it prepared (the prefix index's hashes).
    fn last_prompt_blocks(&self) -> Option<&[u64]> {
        None
    }

    /// Characters of the prompt's text it reads (the rest is never copied out of the body).
    fn prompt_chars_needed(&self) -> usize {
        0
    }

    /// A request picked for one endpoint was served by another (Envoy retried it there):
    /// learn that, and share it like an own pick.
    fn learn_served(&mut self, learned: &LearnedPrefix) {
        self.learn_remote(learned);
    }

    /// A pick another worker learned.
    fn learn_remote(&mut self, _learned: &LearnedPrefix) {}

    /// Called once by the loader with the wired metric extractors (`metric-scorer` finds its
    /// series here).
    fn resolve(&mut self, _wiring: &Wiring) -> Result<(), String> {
        Ok(())
    }

    /// Called with the profile's primary pick, so stateful scorers (the prefix index) learn.
    fn on_picked(&mut self, _ctx: &SchedulingContext<'_>, _endpoint: usize) {}

    /// Running totals the scorer keeps about its own decisions, as `(name, total)`: the stats
    /// publish each as a counter under the plugin's name, so a user can see why picks went
    /// where they did.
    fn counters(&self, _out: &mut dyn FnMut(&'static str, u64)) {}
}

/// "Endpoint `endpoint` now holds these prompt blocks": what one worker's prefix index learned
/// from a pick, replayed by the others. Indices match because every worker runs the same
/// configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedPrefix {
    pub endpoint: usize,
    pub hashes: Vec<u64>,
}

/// What the loader wired up that plugins may refer to by name.
#[derive(Debug, Clone, Default)]
pub struct Wiring {
    /// `(extractor plugin name, selector)` in `EndpointMetrics::custom` slot order.
    pub extractors: Vec<(String, crate::metrics::MetricSelector)>,
}

/// Orders the chosen endpoints, primary first, into `picked`.
pub trait Picker: Send {
    fn pick(&self, candidates: &[usize], totals: &[f64], rng: &mut Rng, picked: &mut Vec<usize>);
}

/// An admission plugin's decision, from the request and the filled cycle state.
pub type Admission = fn(&InferenceRequest, &Pool, &CycleState) -> bool;

/// Decides which profiles run, in which order, and whose result routes the request.
pub trait ProfileHandler: Send {
    /// Called once by the loader: resolve profile and plugin names, or say what is wrong.
    fn resolve(&mut self, profiles: &[Profile], plugins: &[PluginSummary]) -> Result<(), String>;

    /// The next profile to run given the results so far, or `None` when done.
    fn next_profile(
        &self,
        ctx: &SchedulingContext<'_>,
        plugins: &[PluginInstance],
        results: &[ProfileResult],
    ) -> Option<usize>;

    /// Index into `results` of the result that routes the request.
    fn primary_result(&self, results: &[ProfileResult]) -> usize;

    /// Index into `results` of the prefill pick, for P/D disaggregation.
    fn prefill_result(&self, _results: &[ProfileResult]) -> Option<usize> {
        None
    }
}

/// Decides, once the decode endpoint is known, whether a separate prefill endpoint is used.
pub trait PdDecider: Send {
    fn disaggregate(&self, ctx: &SchedulingContext<'_>, decode_endpoint: usize) -> bool;
}

/// How loaded an endpoint is against its limit: 0 idle, 1 or more saturated. With `live`,
/// the load includes what the filter placed since the last scrape.
pub trait SaturationDetector: Send {
    fn saturation(&self, endpoint: &EndpointState, view: LoadView, now_ms: u64) -> f64;

    /// Saturated by its last scrape alone.
    fn saturated(&self, endpoint: &EndpointState, now_ms: u64) -> bool {
        self.saturation(endpoint, LoadView::SCRAPED, now_ms) >= 1.0
    }

    /// Each pod's metrics are refreshed once per `interval_ms` by this replica (longer than
    /// the configured refresh with `pool.replicas`): a detector that judges metrics stale
    /// stretches its threshold to fit, and says so.
    fn fit_scrape_interval(&mut self, _interval_ms: u64) -> Option<String> {
        None
    }
}

/// Plugins that only exist so that configs written for GIE/llm-d load unchanged; the
/// behaviour they stand for is built into the filter (e.g. `disagg-headers-handler`).
pub struct BuiltIn;

pub enum Plugin {
    Filter(Box<dyn Filter>),
    Scorer(Box<dyn Scorer>),
    Picker(Box<dyn Picker>),
    ProfileHandler(Box<dyn ProfileHandler>),
    PdDecider(Box<dyn PdDecider>),
    SaturationDetector(Box<dyn SaturationDetector>),
    FlowPolicy(flow_policy::FlowPolicy),
    /// A metrics data source or extractor: wired through `dataLayer`, not into profiles.
    DataLayer(DataLayerPlugin),
    BuiltIn(BuiltIn),
}

/// `metrics-data-source` and `prometheus-metric` as plain data; the loader wires them.
#[derive(Debug, Clone, PartialEq)]
pub enum DataLayerPlugin {
    Source {
        path: String,
        scheme: String,
    },
    Extractor(crate::metrics::MetricSelector),
    /// `models-data-source`: each pod's model list, asked every `refresh_interval`.
    Models(ModelsSource),
}

/// `models-data-source`'s settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelsSource {
    pub path: String,
    pub refresh_interval: std::time::Duration,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl Plugin {
    pub fn kind(&self) -> &'static str {
        match self {
            Plugin::Filter(_) => "filter",
            Plugin::Scorer(_) => "scorer",
            Plugin::Picker(_) => "picker",
            Plugin::ProfileHandler(_) => "profile handler",
            Plugin::PdDecider(_) => "P/D decider",
            Plugin::SaturationDetector(_) => "saturation detector",
            Plugin::FlowPolicy(_) => "flow-control policy",
            Plugin::DataLayer(DataLayerPlugin::Source { .. }) => "data source",
            Plugin::DataLayer(DataLayerPlugin::Extractor(_)) => "metric extractor",
            Plugin::DataLayer(DataLayerPlugin::Models(_)) => "models data source",
            Plugin::BuiltIn(_) => "built-in handler",
        }
    }
}

pub struct PluginInstance {
    pub name: String,
    pub type_name: &'static str,
    pub plugin: Plugin,
}

/// A plugin as other plugins see it while the config loads; index = index in the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSummary {
    pub name: String,
    pub type_name: &'static str,
    pub is_pd_decider: bool,
}

impl PluginSummary {
    pub fn of(instance: &PluginInstance) -> Self {
        PluginSummary {
            name: instance.name.clone(),
            type_name: instance.type_name,
            is_pd_decider: matches!(instance.plugin, Plugin::PdDecider(_)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightedScorer {
    pub plugin: usize,
    pub weight: f64,
}

/// A scheduling profile, its plugins given as indices into the scheduler's plugin list.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub filters: Vec<usize>,
    pub scorers: Vec<WeightedScorer>,
    pub picker: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileResult {
    pub profile: usize,
    /// Primary first, then fallbacks.
    pub targets: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub results: Vec<ProfileResult>,
    /// Index into `results` of the result that routes the request.
    pub primary: usize,
    /// Index into `results` of the prefill pick when the request is disaggregated.
    pub prefill: Option<usize>,
    /// True when no endpoint had fresh metrics and the least-loaded reachable one was taken.
    pub degraded: bool,
}

impl Decision {
    pub fn targets(&self) -> &[usize] {
        self.results
            .get(self.primary)
            .map_or(&[], |result| result.targets.as_slice())
    }

    pub fn prefill_endpoint(&self) -> Option<usize> {
        self.results
            .get(self.prefill?)
            .and_then(|result| result.targets.first().copied())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    /// Every endpoint failed its last scrape (503).
    NoReachableEndpoint,
    /// A profile's filters removed every candidate (429).
    FilteredOut { profile: String },
    /// `latency-slo-admitter`: a sheddable request no endpoint can serve within its SLOs
    /// (429).
    NotAdmitted,
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::NoReachableEndpoint => {
                write!(f, "no model server endpoint is reachable")
            }
            ScheduleError::FilteredOut { profile } => {
                write!(
                    f,
                    "no endpoint passed the filters of scheduling profile {profile:?}"
                )
            }
            ScheduleError::NotAdmitted => write!(
                f,
                "the request is sheddable and no endpoint is predicted to meet its latency SLOs"
            ),
        }
    }
}

/// What one profile saw and scored, kept for the decision log.
#[derive(Debug, Clone, Default)]
struct ProfileTrace {
    profile: usize,
    candidates: Vec<usize>,
    /// Scorer-major: `scores[k * n + i]` is scorer k's score for candidate i.
    scores: Vec<f64>,
    totals: Vec<f64>,
}

pub struct Scheduler {
    plugins: Vec<PluginInstance>,
    profiles: Vec<Profile>,
    handler: usize,
    saturation_detector: Option<usize>,
    /// Whether a request is scheduled at all, once the cycle state is filled
    /// (`latency-slo-admitter`).
    admission: Option<Admission>,
    rng: Rng,
    base: Vec<usize>,
    cycle: CycleState,
    traces: Vec<ProfileTrace>,
    traces_used: usize,
}

impl Scheduler {
    /// Built by the config loader, which has already checked every index.
    pub fn new(
        plugins: Vec<PluginInstance>,
        profiles: Vec<Profile>,
        handler: usize,
        seed: u64,
    ) -> Self {
        Scheduler {
            plugins,
            profiles,
            handler,
            saturation_detector: None,
            admission: None,
            rng: Rng::new(seed),
            base: Vec::new(),
            cycle: CycleState::default(),
            traces: Vec::new(),
            traces_used: 0,
        }
    }

    /// Set by the loader: the plugin `saturationDetector.pluginRef` names.
    /// Requests `admits` refuses are not scheduled (429).
    pub fn set_admission(&mut self, admits: Admission) {
        self.admission = Some(admits);
    }

    pub fn set_saturation_detector(&mut self, index: usize) {
        self.saturation_detector = Some(index);
    }

    fn detector(&self) -> Option<&dyn SaturationDetector> {
        match self
            .saturation_detector
            .and_then(|i| self.plugins.get(i))
            .map(|p| &p.plugin)
        {
            Some(Plugin::SaturationDetector(detector)) => Some(detector.as_ref()),
            _ => None,
        }
    }

    /// True when no endpoint can take more work (per the configured detector).
    pub fn pool_saturated(&self, pool: &Pool, now_ms: u64) -> bool {
        let Some(detector) = self.detector() else {
            return false;
        };
        pool.endpoints
            .iter()
            .filter(|endpoint| !endpoint.removed)
            .all(|endpoint| detector.saturation(endpoint, pool.load_view(), now_ms) >= 1.0)
    }

    /// Marks in `room` the endpoints below saturation (per the configured detector), and says
    /// whether any is; without a detector nothing is marked and it says false.
    pub fn endpoints_with_room(&self, pool: &Pool, now_ms: u64, room: &mut Vec<bool>) -> bool {
        room.clear();
        let Some(detector) = self.detector() else {
            return false;
        };
        let view = LoadView {
            live: true,
            ..pool.load_view()
        };
        room.extend(pool.endpoints.iter().map(|endpoint| {
            endpoint.routable(now_ms) && detector.saturation(endpoint, view, now_ms) < 1.0
        }));
        room.contains(&true)
    }

    /// The pool's saturation as flow control gates on it (llm-d's): the mean of every
    /// routable endpoint's, always with what was placed since the scrapes (a gate that only moved on
    /// scrapes would let a whole queue out at once); `None` when no endpoint is routable
    /// (none has fresh metrics, or all are backed off). Each endpoint counts at most 1 (full),
    /// so the mean is below 1 exactly when some endpoint can take a request: a pod queued past
    /// its limit never holds back a request another pod has room for.
    pub fn pool_saturation(&self, pool: &Pool, now_ms: u64) -> Option<f64> {
        if !pool
            .endpoints
            .iter()
            .any(|endpoint| endpoint.routable(now_ms))
        {
            return None;
        }
        // A dead or backed-off pod takes nothing: it must not dilute the others' load.
        let members = pool
            .endpoints
            .iter()
            .filter(|endpoint| endpoint.routable(now_ms));
        let Some(detector) = self.detector() else {
            return members.count().gt(&0).then_some(0.0);
        };
        let view = LoadView {
            live: true,
            ..pool.load_view()
        };
        let (sum, count) = members.fold((0.0, 0u32), |(sum, count), endpoint| {
            let saturation = detector.saturation(endpoint, view, now_ms);
            (sum + saturation.clamp(0.0, 1.0), count + 1)
        });
        (count > 0).then(|| sum / f64::from(count))
    }

    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    pub fn plugins(&self) -> &[PluginInstance] {
        &self.plugins
    }

    /// Every scorer's [`Scorer::counters`], with the plugin's name.
    pub fn plugin_counters(&self, out: &mut dyn FnMut(&str, &'static str, u64)) {
        for instance in &self.plugins {
            if let Plugin::Scorer(scorer) = &instance.plugin {
                scorer.counters(&mut |name, total| out(&instance.name, name, total));
            }
        }
    }

    pub fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    /// Prefix-index entries learned here since the last call (for the other workers).
    pub fn take_learned(&mut self, out: &mut Vec<LearnedPrefix>) {
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.take_learned(out);
            }
        }
    }

    /// Replays what another worker learned.
    pub fn learn_remote(&mut self, learned: &LearnedPrefix) {
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.learn_remote(learned);
            }
        }
    }

    /// Characters of the prompt's text any scorer reads: the parser keeps no more.
    pub fn prompt_chars_needed(&self) -> usize {
        self.plugins
            .iter()
            .map(|instance| match &instance.plugin {
                Plugin::Scorer(scorer) => scorer.prompt_chars_needed(),
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// The prompt blocks the prefix index hashed for the last request, if any scorer did.
    pub fn last_prompt_blocks(&self) -> Option<&[u64]> {
        self.plugins
            .iter()
            .find_map(|instance| match &instance.plugin {
                Plugin::Scorer(scorer) => scorer.last_prompt_blocks(),
                _ => None,
            })
    }

    /// See [`Scorer::learn_served`].
    pub fn learn_served(&mut self, learned: &LearnedPrefix) {
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.learn_served(learned);
            }
        }
    }

    /// The first profile's weighted totals in the last decision, as a JSON object
    /// `{"ip:port": total, ...}` over every endpoint it scored.
    pub fn scores_json(&self, pool: &Pool) -> String {
        use std::fmt::Write;
        let mut json = String::from("{");
        if let Some(trace) = self.traces.iter().take(self.traces_used).next() {
            for (i, &endpoint) in trace.candidates.iter().enumerate() {
                let (Some(address), Some(total)) = (pool.get(endpoint), trace.totals.get(i)) else {
                    continue;
                };
                if json.len() > 1 {
                    json.push(',');
                }
                let total = if total.is_finite() { *total } else { 0.0 };
                let _ = write!(json, "\"{}\":{total:.4}", address.address);
            }
        }
        json.push('}');
        json
    }

    /// Randomness for callers outside a scheduling cycle (request ids).
    pub fn random_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Per-cycle data of the last decision (prefix matches), for callers that account it.
    pub fn last_cycle(&self) -> &CycleState {
        &self.cycle
    }

    /// Picks the endpoints for one request.
    pub fn schedule(
        &mut self,
        request: &InferenceRequest,
        pool: &Pool,
    ) -> Result<Decision, ScheduleError> {
        self.schedule_where(request, pool, |_| true)
    }

    /// [`Scheduler::schedule`] among the endpoints `eligible` accepts only (the protocol's
    /// subset hint, the pods that serve the model): none eligible is no endpoint.
    pub fn schedule_where(
        &mut self,
        request: &InferenceRequest,
        pool: &Pool,
        eligible: impl Fn(usize) -> bool,
    ) -> Result<Decision, ScheduleError> {
        self.traces_used = 0;
        self.base.clear();
        self.base.extend(
            pool.endpoints
                .iter()
                .enumerate()
                .filter(|(index, endpoint)| endpoint.routable(pool.now_ms()) && eligible(*index))
                .map(|(index, _)| index),
        );
        self.cycle.prefix = None;
        if self.base.is_empty() {
            return least_in_flight_reachable(pool, eligible);
        }
        let mut cycle = std::mem::take(&mut self.cycle);
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.prepare(request, pool, &mut cycle);
            }
        }
        for instance in &mut self.plugins {
            if let Plugin::Scorer(scorer) = &mut instance.plugin {
                scorer.predict(request, pool, &mut cycle);
            }
        }
        if self
            .admission
            .is_some_and(|admits| !admits(request, pool, &cycle))
        {
            self.cycle = cycle;
            return Err(ScheduleError::NotAdmitted);
        }
        let ctx = SchedulingContext {
            request,
            pool,
            cycle: &cycle,
        };
        let outcome = self.run_profiles(&ctx);
        self.cycle = cycle;
        outcome
    }

    fn run_profiles(&mut self, ctx: &SchedulingContext<'_>) -> Result<Decision, ScheduleError> {
        let mut results: Vec<ProfileResult> = Vec::with_capacity(self.profiles.len());
        while results.len() < self.profiles.len() {
            let Some(profile) = self.next_profile(ctx, &results) else {
                break;
            };
            match self.run_profile(ctx, profile) {
                Ok(targets) => results.push(ProfileResult { profile, targets }),
                // Only the first profile decides whether the request can be served; a later
                // one (prefill) that finds nobody leaves the request to the first one alone.
                Err(error) if results.is_empty() => return Err(error),
                Err(_) => break,
            }
        }
        let handler = match self.plugins.get(self.handler).map(|p| &p.plugin) {
            Some(Plugin::ProfileHandler(handler)) => Some(handler),
            _ => None,
        };
        let primary = handler.map_or(0, |h| h.primary_result(&results));
        let prefill = handler.and_then(|h| h.prefill_result(&results));
        self.learn(ctx, &results);
        Ok(Decision {
            results,
            primary,
            prefill,
            degraded: false,
        })
    }

    fn next_profile(
        &self,
        ctx: &SchedulingContext<'_>,
        results: &[ProfileResult],
    ) -> Option<usize> {
        match self.plugins.get(self.handler).map(|p| &p.plugin) {
            Some(Plugin::ProfileHandler(handler)) => handler
                .next_profile(ctx, &self.plugins, results)
                .filter(|&profile| profile < self.profiles.len()),
            _ => None,
        }
    }

    fn run_profile(
        &mut self,
        ctx: &SchedulingContext<'_>,
        profile_index: usize,
    ) -> Result<Vec<usize>, ScheduleError> {
        let Scheduler {
            plugins,
            profiles,
            rng,
            base,
            traces,
            traces_used,
            ..
        } = self;
        let Some(profile) = profiles.get(profile_index) else {
            return Ok(Vec::new());
        };
        if *traces_used == traces.len() {
            traces.push(ProfileTrace::default());
        }
        let Some(trace) = traces.get_mut(*traces_used) else {
            return Ok(Vec::new());
        };
        *traces_used += 1;
        trace.profile = profile_index;
        trace.candidates.clear();
        trace.candidates.extend_from_slice(base);
        for &filter in &profile.filters {
            match plugins.get_mut(filter).map(|p| &mut p.plugin) {
                Some(Plugin::Filter(filter)) => filter.filter(ctx, &mut trace.candidates),
                Some(Plugin::Scorer(scorer)) => scorer.filter(ctx, &mut trace.candidates),
                _ => {}
            }
        }
        let filtered_out = || ScheduleError::FilteredOut {
            profile: profile.name.clone(),
        };
        if trace.candidates.is_empty() {
            return Err(filtered_out());
        }
        score_candidates(plugins, profile, trace, ctx);
        let mut picked = Vec::with_capacity(1);
        if let Some(PluginInstance {
            plugin: Plugin::Picker(picker),
            ..
        }) = plugins.get(profile.picker)
        {
            picker.pick(&trace.candidates, &trace.totals, rng, &mut picked);
        }
        if picked.is_empty() {
            return Err(filtered_out());
        }
        Ok(picked)
    }

    /// Every stateful scorer learns every profile's pick, whether or not its own profile
    /// ran: the prefill and the decode pod both end up holding the prompt's KV blocks.
    fn learn(&mut self, ctx: &SchedulingContext<'_>, results: &[ProfileResult]) {
        for endpoint in results.iter().filter_map(|r| r.targets.first().copied()) {
            for instance in &mut self.plugins {
                if let Plugin::Scorer(scorer) = &mut instance.plugin {
                    scorer.on_picked(ctx, endpoint);
                }
            }
        }
    }

    /// One line describing the last decision: per profile, every candidate's total and every
    /// scorer's score. Only built when someone will read it.
    pub fn explain(&self, pool: &Pool) -> String {
        let mut line = String::new();
        let mut profile = "";
        for row in self.explain_rows(pool) {
            if row.profile != profile {
                if !profile.is_empty() {
                    line.push_str("] ");
                }
                profile = row.profile;
                let _ = write!(line, "profile={profile} candidates=[");
            } else {
                line.push_str(", ");
            }
            let _ = write!(line, "{} total={:.3} (", row.address, row.total);
            for (k, (name, score, weight)) in row.scores.iter().enumerate() {
                let _ = write!(
                    line,
                    "{}{name}={score:.3}x{weight}",
                    if k > 0 { " " } else { "" }
                );
            }
            line.push(')');
            if let Some(ttft) = row.predicted_ttft_ms {
                let _ = write!(line, " predicted_ttft_ms={ttft:.0}");
            }
        }
        if !profile.is_empty() {
            line.push(']');
        }
        line
    }

    /// The last decision, one row per profile and candidate, in the order they ran.
    pub fn explain_rows<'a>(&'a self, pool: &'a Pool) -> Vec<ExplainRow<'a>> {
        let mut rows = Vec::new();
        for trace in self.traces.iter().take(self.traces_used) {
            let Some(profile) = self.profiles.get(trace.profile) else {
                continue;
            };
            let n = trace.candidates.len();
            for (i, &endpoint) in trace.candidates.iter().enumerate() {
                let scores = profile
                    .scorers
                    .iter()
                    .enumerate()
                    .map(|(k, scorer)| {
                        let name = self
                            .plugins
                            .get(scorer.plugin)
                            .map_or("?", |p| p.name.as_str());
                        let score = trace.scores.get(k * n + i).copied().unwrap_or(0.0);
                        (name, score, scorer.weight)
                    })
                    .collect();
                let predicted = self.cycle.latency.as_ref().and_then(|l| l.get(endpoint));
                rows.push(ExplainRow {
                    profile: profile.name.as_str(),
                    address: pool.get(endpoint).map_or("?", |e| e.address.as_str()),
                    total: trace.totals.get(i).copied().unwrap_or(0.0),
                    scores,
                    predicted_ttft_ms: predicted.map(|p| p.ttft_ms),
                });
            }
        }
        rows
    }
}

/// One candidate of one profile in the last decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplainRow<'a> {
    pub profile: &'a str,
    pub address: &'a str,
    pub total: f64,
    /// `(scorer name, clamped score, weight)`.
    pub scores: Vec<(&'a str, f64, f64)>,
    /// `predicted-latency-producer`'s TTFT for the request there, ms.
    pub predicted_ttft_ms: Option<f64>,
}

/// Runs a profile's scorers over the trace's candidates: clamped scores, weighted totals.
fn score_candidates(
    plugins: &mut [PluginInstance],
    profile: &Profile,
    trace: &mut ProfileTrace,
    ctx: &SchedulingContext<'_>,
) {
    let n = trace.candidates.len();
    trace.scores.clear();
    trace.scores.resize(n * profile.scorers.len(), 0.0);
    trace.totals.clear();
    trace.totals.resize(n, 0.0);
    for (scorer, scores) in profile.scorers.iter().zip(trace.scores.chunks_mut(n)) {
        if let Some(PluginInstance {
            plugin: Plugin::Scorer(plugin),
            ..
        }) = plugins.get_mut(scorer.plugin)
        {
            plugin.score(ctx, &trace.candidates, scores);
        }
        for (total, score) in trace.totals.iter_mut().zip(scores.iter_mut()) {
            *score = clamp_score(*score);
            *total += scorer.weight * *score;
        }
    }
}

/// GIE clamps every score to [0, 1]; a NaN from a broken scorer counts as 0.
pub fn clamp_score(score: f64) -> f64 {
    if score.is_nan() {
        0.0
    } else {
        score.clamp(0.0, 1.0)
    }
}

/// With no fresh metrics anywhere, route by the filter's own load so traffic keeps flowing.
fn least_in_flight_reachable(
    pool: &Pool,
    eligible: impl Fn(usize) -> bool,
) -> Result<Decision, ScheduleError> {
    let target = pool
        .endpoints
        .iter()
        .enumerate()
        .filter(|(index, endpoint)| {
            !endpoint.removed && endpoint.health != Health::Unreachable && eligible(*index)
        })
        .min_by_key(|(_, endpoint)| endpoint.total_in_flight())
        .map(|(index, _)| index)
        .ok_or(ScheduleError::NoReachableEndpoint)?;
    Ok(Decision {
        results: vec![ProfileResult {
            profile: 0,
            targets: vec![target],
        }],
        primary: 0,
        prefill: None,
        degraded: true,
    })
}

/// Min-max normalisation shared by the queue and running-requests scorers:
/// `(max - v) / (max - min)` over the known values, 1.0 for everyone when they are all equal.
/// An unknown value (`None`, or not finite) scores 0, the worst, and is left out of the
/// range, so it cannot change how the others compare.
pub fn score_lower_is_better(
    values: impl Iterator<Item = Option<f64>> + Clone,
    scores: &mut [f64],
) {
    let known = |value: Option<f64>| value.filter(|v| v.is_finite());
    let (min, max) = values
        .clone()
        .filter_map(known)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    // Finite values can still be too far apart to subtract (-1e308 and 1e308).
    let range = max - min;
    for (score, value) in scores.iter_mut().zip(values) {
        *score = match known(value) {
            None => 0.0,
            Some(_) if range <= 0.0 => 1.0,
            Some(v) if range.is_finite() => (max - v) / range,
            // Halve everything first: the same order, and no overflow.
            Some(v) => (max / 2.0 - v / 2.0) / (max / 2.0 - min / 2.0),
        };
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::{CycleState, PrefixMatches};
    use crate::endpoint::{EndpointState, Health, Pool};
    use crate::metrics::EndpointMetrics;
    use std::collections::BTreeMap;

    /// A pool of fresh endpoints `10.0.0.{i}:8000` with the given metrics.
    pub fn pool_with(metrics: Vec<EndpointMetrics>) -> Pool {
        Pool::new(
            metrics
                .into_iter()
                .enumerate()
                .map(|(i, metrics)| {
                    let mut endpoint =
                        EndpointState::new(format!("10.0.0.{i}:8000"), BTreeMap::new());
                    endpoint.metrics = metrics;
                    endpoint.health = Health::Fresh;
                    endpoint
                })
                .collect(),
        )
    }

    /// A cycle in which endpoint i holds `matched[i]` of `total` prompt blocks.
    pub fn prefix_cycle(matched: Vec<usize>, total: usize, block_tokens: usize) -> CycleState {
        CycleState {
            prefix: Some(PrefixMatches {
                matched_blocks: matched,
                total_blocks: total,
                block_tokens,
            }),
            latency: None,
        }
    }

    pub fn queues(values: &[f64]) -> Pool {
        pool_with(
            values
                .iter()
                .map(|&q| EndpointMetrics {
                    waiting_queue: Some(q),
                    ..EndpointMetrics::idle()
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn clamping() {
        assert_eq!(clamp_score(f64::NAN), 0.0);
        assert_eq!(clamp_score(1.5), 1.0);
        assert_eq!(clamp_score(-0.5), 0.0);
        assert_eq!(clamp_score(0.25), 0.25);
    }

    #[test]
    fn lower_is_better_normalisation() {
        let mut scores = [0.0; 3];
        score_lower_is_better([Some(0.0), Some(5.0), Some(10.0)].into_iter(), &mut scores);
        assert_eq!(scores, [1.0, 0.5, 0.0]);
        score_lower_is_better([Some(3.0), Some(3.0), Some(3.0)].into_iter(), &mut scores);
        assert_eq!(scores, [1.0, 1.0, 1.0]);
    }

    #[test]
    fn unknown_values_score_worst_and_leave_the_range_alone() {
        let mut scores = [0.0; 4];
        for unknown in [
            None,
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
        ] {
            score_lower_is_better(
                [Some(0.0), unknown, Some(5.0), Some(10.0)].into_iter(),
                &mut scores,
            );
            assert_eq!(scores, [1.0, 0.0, 0.5, 0.0], "{unknown:?}");
        }
        score_lower_is_better([None, Some(4.0), None, Some(4.0)].into_iter(), &mut scores);
        assert_eq!(scores, [0.0, 1.0, 0.0, 1.0]);
        let mut scores = [0.0; 3];
        score_lower_is_better(
            [Some(-1e308), Some(0.0), Some(1e308)].into_iter(),
            &mut scores,
        );
        assert_eq!(scores, [1.0, 0.5, 0.0], "a range too wide to subtract");
    }

    #[test]
    fn all_stale_routes_to_least_in_flight_reachable() {
        let mut pool = test_support::queues(&[0.0, 0.0, 0.0]);
        pool.endpoints[0].health = Health::Stale;
        pool.endpoints[0].in_flight = 3;
        pool.endpoints[1].health = Health::Unreachable;
        pool.endpoints[2].health = Health::Unknown;
        pool.endpoints[2].in_flight = 5;
        let decision = least_in_flight_reachable(&pool, |_| true).unwrap();
        assert!(decision.degraded);
        assert_eq!(decision.targets(), [0]);
        for endpoint in &mut pool.endpoints {
            endpoint.health = Health::Unreachable;
        }
        assert_eq!(
            least_in_flight_reachable(&pool, |_| true),
            Err(ScheduleError::NoReachableEndpoint)
        );
    }
}
