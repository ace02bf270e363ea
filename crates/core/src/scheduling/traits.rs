//! The plugin traits, one per kind a profile or the scheduler calls, and [`Plugin`], which
//! holds a plugin of any kind. They share a file because a profile handler is handed the
//! plugin list it is itself part of.

use super::cycle::{CycleState, LearnedPrefix, SchedulingContext, Wiring};
use super::profile::{Profile, ProfileResult};
use super::rng::Rng;
use crate::endpoint::{EndpointState, LoadView, Pool};
use crate::metrics::MetricSelector;
use crate::request::InferenceRequest;
use crate::scheduling::flow_policy::FlowPolicy;

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

/// One plugin of any kind, as the loader built it.
pub enum Plugin {
    Filter(Box<dyn Filter>),
    Scorer(Box<dyn Scorer>),
    Picker(Box<dyn Picker>),
    ProfileHandler(Box<dyn ProfileHandler>),
    PdDecider(Box<dyn PdDecider>),
    SaturationDetector(Box<dyn SaturationDetector>),
    FlowPolicy(FlowPolicy),
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
    Extractor(MetricSelector),
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

/// A plugin with the name and type it was declared under.
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
