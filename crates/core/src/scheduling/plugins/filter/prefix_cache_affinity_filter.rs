//! `prefix-cache-affinity-filter`: when some candidates probably hold at least
//! `affinityThreshold` of the prompt's prefix blocks, keeps only those; otherwise keeps all.
//! The matches come from `prefix-cache-scorer` through the cycle state.

use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "prefix-cache-affinity-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<Parameters>)
    .consuming(&[Data::PrefixMatches]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub affinity_threshold: f64,
    /// llm-d-router's exploration and TTFT load gate, accepted only switched off (0): random
    /// exploration and the gate's TTFT estimates are not implemented, and silently ignoring a
    /// value that was set would keep requests sticky where the config says they should not be.
    pub exploration_probability: f64,
    #[serde(rename = "maxTTFTPenaltyMs")]
    pub max_ttft_penalty_ms: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ttft_source: String,
    pub peak_prefill_throughput: f64,
    /// llm-d-router's producer instances; accepted, since the filter keeps one of each.
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
            max_ttft_penalty_ms: 0.0,
            ttft_source: String::new(),
            peak_prefill_throughput: 0.0,
            prefix_match_info_producer_name: String::new(),
            latency_prediction_info_producer_name: String::new(),
            in_flight_load_producer_name: String::new(),
        }
    }
}

pub struct PrefixCacheAffinityFilter {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    let t = parameters.affinity_threshold;
    if !(t > 0.0 && t <= 1.0) {
        return Err(format!("affinityThreshold {t} must be within (0, 1]"));
    }
    let switched_on = [
        ("explorationProbability", parameters.exploration_probability),
        ("maxTTFTPenaltyMs", parameters.max_ttft_penalty_ms),
        ("peakPrefillThroughput", parameters.peak_prefill_throughput),
    ];
    if let Some((key, value)) = switched_on.iter().find(|(_, value)| *value != 0.0) {
        return Err(format!(
            "{key} {value}: exploration and the TTFT load gate are not implemented (only 0, off); use weighted-random-picker over the sticky set, or prefix-cache-scorer's affinityQueueLimit to break stickiness under load"
        ));
    }
    if !parameters.ttft_source.is_empty() {
        return Err(format!(
            "ttftSource {:?}: the TTFT load gate is not implemented; remove it",
            parameters.ttft_source
        ));
    }
    Ok(Plugin::Filter(Box::new(PrefixCacheAffinityFilter {
        parameters,
    })))
}

impl Filter for PrefixCacheAffinityFilter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        let threshold = self.parameters.affinity_threshold;
        let warm = |&i: &usize| ctx.cycle.hit_ratio(i) >= threshold;
        if candidates.iter().any(warm) {
            candidates.retain(warm);
        }
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

    #[test]
    fn llm_d_router_parameters_load_switched_off_and_are_refused_on() {
        let off: Value = serde_yaml::from_str(
            "{affinityThreshold: 0.9, explorationProbability: 0, maxTTFTPenaltyMs: 0, prefixMatchInfoProducerName: approx-prefix-cache-producer}",
        )
        .unwrap();
        assert!(build(&off).is_ok());
        for on in [
            "{explorationProbability: 0.05}",
            "{maxTTFTPenaltyMs: 500}",
            "{ttftSource: predicted}",
        ] {
            let value: Value = serde_yaml::from_str(on).unwrap();
            let error = build(&value).err().unwrap();
            let key = on.trim_start_matches('{').split(':').next().unwrap();
            assert!(error.contains(key), "{on}: {error}");
        }
    }
}
