//! Per-decision state: what every plugin may read about the request being scheduled, filled
//! once per request before any profile runs, and what the plugins learn from a pick.

use crate::endpoint::Pool;
use crate::metrics::MetricSelector;
use crate::request::InferenceRequest;

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
    pub extractors: Vec<(String, MetricSelector)>,
}
