//! `slo-headroom-tier-filter` (llm-d-router): keeps the candidates predicted to meet the
//! request's SLOs (both headrooms at least 0), or, with `epsilonExploreNeg`'s probability, the
//! others instead, so that pods predicted too slow still get a request now and then and
//! their predictions stay current. A candidate without a prediction counts as not meeting
//! them; with no predictions at all every candidate stays.

use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::rng::Rng;
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "slo-headroom-tier-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<Parameters>)
    .consuming(&[Data::LatencyPredictions])
    .ignoring(&[Ignored::producer(
        "latencyPredictionInfoProducerName",
        "predicted-latency-producer",
    )]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub epsilon_explore_neg: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub latency_prediction_info_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            epsilon_explore_neg: 0.01,
            latency_prediction_info_producer_name: String::new(),
        }
    }
}

pub struct SloHeadroomTierFilter {
    epsilon: f64,
    rng: Rng,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    let epsilon = parameters.epsilon_explore_neg;
    if !(0.0..=1.0).contains(&epsilon) {
        return Err(format!("epsilonExploreNeg {epsilon} must be from 0 to 1"));
    }
    Ok(Plugin::Filter(Box::new(SloHeadroomTierFilter {
        epsilon,
        rng: Rng::new(0x510_7ee5),
    })))
}

impl Filter for SloHeadroomTierFilter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        let Some(predictions) = ctx.cycle.latency.as_ref() else {
            return;
        };
        if candidates.len() <= 1 || !candidates.iter().any(|&c| predictions.get(c).is_some()) {
            return;
        }
        let positive = |c: &usize| predictions.get(*c).is_some_and(|p| p.positive());
        let positives = candidates.iter().filter(|c| positive(c)).count();
        if positives == 0 || positives == candidates.len() {
            return;
        }
        let keep_negative = self.epsilon > 0.0 && self.rng.unit() < self.epsilon;
        candidates.retain(|c| positive(c) != keep_negative);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::queues;
    use crate::scheduling::{CycleState, LatencyPredictions, Prediction};

    fn survivors(parameters: &str, headrooms: &[Option<f64>]) -> Vec<usize> {
        let pool = queues(&vec![0.0; headrooms.len()]);
        let request = InferenceRequest::empty();
        let cycle = CycleState {
            latency: Some(LatencyPredictions {
                endpoints: headrooms
                    .iter()
                    .map(|h| {
                        h.map(|ttft_headroom_ms| Prediction {
                            ttft_ms: 100.0,
                            tpot_ms: 10.0,
                            ttft_headroom_ms,
                            tpot_headroom_ms: 0.0,
                            idle: false,
                        })
                    })
                    .collect(),
            }),
            ..CycleState::default()
        };
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let Ok(Plugin::Filter(mut filter)) = build(&serde_yaml::from_str(parameters).unwrap())
        else {
            panic!("not a filter");
        };
        let mut candidates: Vec<usize> = (0..headrooms.len()).collect();
        filter.filter(&ctx, &mut candidates);
        candidates
    }

    #[test]
    fn keeps_the_tier_that_meets_the_slos_or_explores_the_other() {
        let tiers = [Some(10.0), Some(-5.0), None, Some(0.0)];
        assert_eq!(survivors("{epsilonExploreNeg: 0}", &tiers), [0, 3]);
        assert_eq!(survivors("{epsilonExploreNeg: 1}", &tiers), [1, 2]);
        assert_eq!(
            survivors("{}", &[Some(-1.0), Some(-2.0)]),
            [0, 1],
            "one tier: kept"
        );
        assert_eq!(survivors("{}", &[None, None]), [0, 1], "no predictions");
        assert!(build(&serde_yaml::from_str("{epsilonExploreNeg: 2}").unwrap()).is_err());
    }
}
