//! `prefix-cache-affinity-filter` (llm-d-router): when some candidates probably hold at least
//! `affinityThreshold` of the prompt's prefix blocks, keeps only those (the sticky set);
//! otherwise keeps all. The matches come from the prefix index through the cycle state.
//!
//! Two ways out of stickiness, as llm-d has them:
//! - exploration: with `explorationProbability`, a request skips the filter;
//! - the TTFT gate: when the best sticky endpoint's expected TTFT is more than
//!   `maxTTFTPenaltyMs` above the best other endpoint's, every candidate is kept. The TTFT is
//!   the endpoint's in-flight tokens over `peakPrefillThroughput`. Here those tokens are the
//!   filter's own count (uncached prompt plus `max_tokens`, until the response ends), where
//!   llm-d counts the uncached prompt until the first chunk. With `ttftSource:
//!   latencyPredictor` it is `predicted-latency-producer`'s prediction instead.

use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::rng::Rng;
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "prefix-cache-affinity-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<Parameters>)
    .consuming(&[Data::PrefixMatches, Data::InFlight])
    .ignoring(&[
        Ignored::PREFIX_PRODUCER,
        Ignored::producer("inFlightLoadProducerName", "inflight-load-producer"),
    ]);

/// The TTFT gate's sources: the in-flight tokens over the peak prefill throughput, or
/// `predicted-latency-producer`'s predictions.
pub const PREFILL_THROUGHPUT: &str = "prefillThroughput";
pub const LATENCY_PREDICTOR: &str = "latencyPredictor";

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// 0 or below switches the filter off.
    pub affinity_threshold: f64,
    pub exploration_probability: f64,
    /// 0 switches the TTFT gate off.
    #[serde(rename = "maxTTFTPenaltyMs")]
    pub max_ttft_penalty_ms: f64,
    pub ttft_source: String,
    /// Prompt tokens a second an endpoint prefills at its peak (llm-d's default is tuned for
    /// Qwen3-32B on two H100s).
    pub peak_prefill_throughput: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub latency_prediction_info_producer_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub in_flight_load_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            affinity_threshold: 0.80,
            exploration_probability: 0.0,
            max_ttft_penalty_ms: 18_000.0,
            ttft_source: PREFILL_THROUGHPUT.to_owned(),
            peak_prefill_throughput: 15_928.0,
            prefix_match_info_producer_name: String::new(),
            latency_prediction_info_producer_name: String::new(),
            in_flight_load_producer_name: String::new(),
        }
    }
}

pub struct PrefixCacheAffinityFilter {
    parameters: Parameters,
    rng: Rng,
    sticky: Vec<usize>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    let p = &parameters;
    if p.affinity_threshold.is_nan() || p.affinity_threshold > 1.0 {
        return Err(format!(
            "affinityThreshold {} must be at most 1 (0 or below switches the filter off)",
            p.affinity_threshold
        ));
    }
    if !(0.0..=1.0).contains(&p.exploration_probability) {
        return Err(format!(
            "explorationProbability {} must be from 0 to 1",
            p.exploration_probability
        ));
    }
    if !(p.max_ttft_penalty_ms >= 0.0 && p.max_ttft_penalty_ms.is_finite()) {
        return Err(format!(
            "maxTTFTPenaltyMs {} must be a number of at least 0",
            p.max_ttft_penalty_ms
        ));
    }
    let throughput = match p.ttft_source.as_str() {
        PREFILL_THROUGHPUT => true,
        LATENCY_PREDICTOR => false,
        other => {
            return Err(format!(
                "ttftSource {other:?} must be {PREFILL_THROUGHPUT:?} or {LATENCY_PREDICTOR:?}"
            ))
        }
    };
    let gated = p.max_ttft_penalty_ms > 0.0;
    if throughput
        && gated
        && !(p.peak_prefill_throughput > 0.0 && p.peak_prefill_throughput.is_finite())
    {
        return Err(format!(
            "peakPrefillThroughput {} must be above 0 while maxTTFTPenaltyMs is set",
            p.peak_prefill_throughput
        ));
    }
    Ok(Plugin::Filter(Box::new(PrefixCacheAffinityFilter {
        parameters,
        rng: Rng::new(0x5eed_a77f),
        sticky: Vec::new(),
    })))
}

impl PrefixCacheAffinityFilter {
    /// Expected TTFT at `endpoint` in ms: its in-flight tokens at the peak prefill rate, or
    /// the predictor's (no prediction: never faster than one).
    fn ttft_ms(&self, ctx: &SchedulingContext<'_>, endpoint: usize) -> f64 {
        if self.parameters.ttft_source == LATENCY_PREDICTOR {
            return ctx
                .cycle
                .latency
                .as_ref()
                .and_then(|p| p.get(endpoint))
                .map_or(f64::INFINITY, |p| p.ttft_ms);
        }
        let tokens = ctx
            .pool
            .get(endpoint)
            .map_or(0, |e| e.total_in_flight_tokens());
        tokens as f64 / self.parameters.peak_prefill_throughput * 1000.0
    }

    /// Whether the best sticky endpoint is so much slower to start than the best other one
    /// that stickiness costs more than `maxTTFTPenaltyMs`.
    fn stickiness_too_costly(&self, ctx: &SchedulingContext<'_>, candidates: &[usize]) -> bool {
        if self.parameters.max_ttft_penalty_ms <= 0.0 || self.sticky.len() == candidates.len() {
            return false;
        }
        let best = |sticky: bool| {
            candidates
                .iter()
                .filter(|c| self.sticky.contains(c) == sticky)
                .map(|&c| self.ttft_ms(ctx, c))
                .fold(f64::INFINITY, f64::min)
        };
        let (sticky, other) = (best(true), best(false));
        // Neither side predicted: nothing says stickiness costs anything.
        if sticky.is_infinite() && other.is_infinite() {
            return false;
        }
        sticky - other > self.parameters.max_ttft_penalty_ms
    }
}

impl Filter for PrefixCacheAffinityFilter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        let threshold = self.parameters.affinity_threshold;
        if candidates.len() <= 1 || threshold <= 0.0 {
            return;
        }
        let exploration = self.parameters.exploration_probability;
        if exploration > 0.0 && self.rng.unit() < exploration {
            return;
        }
        self.sticky.clear();
        self.sticky.extend(
            candidates
                .iter()
                .copied()
                .filter(|&c| ctx.cycle.hit_ratio(c) >= threshold),
        );
        if self.sticky.is_empty() || self.stickiness_too_costly(ctx, candidates) {
            return;
        }
        candidates.retain(|c| self.sticky.contains(c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::prefix_cycle;
    use crate::scheduling::test_support::queues;

    fn survivors(matched: Vec<usize>) -> Vec<usize> {
        let pool = queues(&[0.0; 3]);
        let request = InferenceRequest::empty();
        let cycle = prefix_cycle(matched, 10, 16);
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let Ok(Plugin::Filter(mut filter)) = build(&Value::Null) else {
            panic!("not a filter");
        };
        let mut candidates = vec![0, 1, 2];
        filter.filter(&ctx, &mut candidates);
        candidates
    }

    #[test]
    fn keeps_only_the_warm_when_any_is_warm() {
        assert_eq!(survivors(vec![8, 9, 2]), [0, 1]);
        assert_eq!(survivors(vec![7, 0, 2]), [0, 1, 2], "nobody reaches 0.8");
        assert!(build(&serde_yaml::from_str("{affinityThreshold: 1.5}").unwrap()).is_err());
    }

    fn filter_with(parameters: &str, matched: Vec<usize>, in_flight_tokens: &[u64]) -> Vec<usize> {
        let mut pool = queues(&vec![0.0; matched.len()]);
        for (endpoint, &tokens) in pool.endpoints.iter_mut().zip(in_flight_tokens) {
            endpoint.in_flight_tokens = tokens;
        }
        let request = InferenceRequest::empty();
        let cycle = prefix_cycle(matched.clone(), 10, 16);
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let value: Value = serde_yaml::from_str(parameters).unwrap();
        let Ok(Plugin::Filter(mut filter)) = build(&value) else {
            panic!("not a filter");
        };
        let mut candidates: Vec<usize> = (0..matched.len()).collect();
        filter.filter(&ctx, &mut candidates);
        candidates
    }

    #[test]
    fn the_ttft_gate_breaks_stickiness_only_beyond_the_penalty() {
        let gate = "{maxTTFTPenaltyMs: 1000, peakPrefillThroughput: 1000}";
        // The sticky pod's 1,500 tokens are 1.5 s of prefill against 0 s elsewhere.
        assert_eq!(filter_with(gate, vec![9, 0, 0], &[1500, 0, 0]), [0, 1, 2]);
        // 0.9 s above the best other pod is within the penalty.
        assert_eq!(filter_with(gate, vec![9, 0, 0], &[1000, 100, 300]), [0]);
        // The best sticky pod counts, not the worst.
        assert_eq!(filter_with(gate, vec![9, 9, 0], &[5000, 200, 0]), [0, 1]);
        let off = "{maxTTFTPenaltyMs: 0, peakPrefillThroughput: 1000}";
        assert_eq!(filter_with(off, vec![9, 0, 0], &[90_000, 0, 0]), [0]);
    }

    #[test]
    fn a_threshold_of_zero_or_full_exploration_keeps_everyone() {
        assert_eq!(
            filter_with("{affinityThreshold: 0}", vec![9, 0], &[0, 0]),
            [0, 1]
        );
        assert_eq!(
            filter_with("{explorationProbability: 1}", vec![9, 0], &[0, 0]),
            [0, 1]
        );
    }

    #[test]
    fn llm_d_router_parameters_are_checked() {
        let defaults: Value = serde_yaml::from_str("{}").unwrap();
        assert!(
            build(&defaults).is_ok(),
            "llm-d's defaults switch the gate on"
        );
        for (given, key) in [
            ("{explorationProbability: 1.5}", "explorationProbability"),
            ("{maxTTFTPenaltyMs: -1}", "maxTTFTPenaltyMs"),
            ("{peakPrefillThroughput: 0}", "peakPrefillThroughput"),
            ("{ttftSource: exact}", "ttftSource"),
        ] {
            let value: Value = serde_yaml::from_str(given).unwrap();
            let error = build(&value).err().unwrap();
            assert!(error.contains(key), "{given}: {error}");
        }
        let off: Value =
            serde_yaml::from_str("{maxTTFTPenaltyMs: 0, peakPrefillThroughput: 0}").unwrap();
        assert!(
            build(&off).is_ok(),
            "no throughput is needed with the gate off"
        );
    }
}
